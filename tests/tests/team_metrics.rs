//! A team's own observability, end to end: the platform creates two teams with real
//! Terraform (each a quota and a health-checked cluster, A's on MIG slices, and a `read`
//! `gpufleet_tenant_token` for A's dashboards); A's own workspace, with that token, reads
//! `gpufleet_cluster_dashboard` for its cluster; a real Prometheus runs the scrape job the
//! provider generated, verbatim, against the control plane's metrics endpoint with that
//! token. Prometheus then holds A's series only (no label value of B's, no fleet-wide
//! family), every query of the generated dashboard returns data, A's token cannot read
//! B's cluster's dashboard, B's token sees nothing of A's, and the read token, revoked by
//! destroying its resource, is refused at once. A Slurm team's running and pending jobs reach its view.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use gpufleet_e2e::prom::{self, Prometheus};
use gpufleet_e2e::{Backend, Terraform};
use serde_json::Value;

const PLATFORM: &str = r#"
resource "gpufleet_tenant" "a" {
  name = "observing-a"
}
resource "gpufleet_tenant" "b" {
  name = "observing-b"
}
resource "gpufleet_gpu_quota" "a" {
  tenant   = gpufleet_tenant.a.id
  gpu_type = "H100-80GB"
  gpus     = 8
}
resource "gpufleet_gpu_quota" "b" {
  tenant   = gpufleet_tenant.b.id
  gpu_type = "A100-80GB"
  gpus     = 8
}
resource "gpufleet_tenant_cluster" "a" {
  tenant       = gpufleet_tenant.a.id
  name         = "sliced"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
  storage_gib  = 10
  mig_layout   = { "3g.40gb" = 2 }
  depends_on   = [gpufleet_gpu_quota.a]
}
resource "gpufleet_tenant_cluster" "b" {
  tenant       = gpufleet_tenant.b.id
  name         = "whole"
  orchestrator = "kubernetes"
  gpu_type     = "A100-80GB"
  node_count   = 1
  storage_gib  = 10
  depends_on   = [gpufleet_gpu_quota.b]
}
resource "gpufleet_health_check" "a" {
  cluster_id = gpufleet_tenant_cluster.a.id
  level      = "quick"
}
resource "gpufleet_health_check" "b" {
  cluster_id = gpufleet_tenant_cluster.b.id
  level      = "quick"
}
# Team A's token for its dashboards: read only.
resource "gpufleet_tenant_token" "a_prometheus" {
  tenant = gpufleet_tenant.a.id
  name   = "prometheus"
  scope  = "read"
}
output "a" {
  value     = { id = gpufleet_tenant.a.id, token = gpufleet_tenant.a.token, read_token = gpufleet_tenant_token.a_prometheus.token, cluster = gpufleet_tenant_cluster.a.id }
  sensitive = true
}
output "b" {
  value     = { id = gpufleet_tenant.b.id, token = gpufleet_tenant.b.token, cluster = gpufleet_tenant_cluster.b.id }
  sensitive = true
}
"#;

fn team_config(cluster_id: &str, metrics: &str, token_file: &str) -> String {
    format!(
        r#"
data "gpufleet_cluster_dashboard" "mine" {{
  cluster_id      = "{cluster_id}"
  metrics_address = "{metrics}"
  token_file      = "{token_file}"
}}
output "dashboard_json" {{
  value = data.gpufleet_cluster_dashboard.mine.dashboard_json
}}
output "queries" {{
  value = data.gpufleet_cluster_dashboard.mine.queries
}}
output "scrape" {{
  value = data.gpufleet_cluster_dashboard.mine.prometheus_scrape_config
}}
"#
    )
}

fn s(v: &Value, key: &str) -> String {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
        .to_string()
}

/// The families a team's view may hold, and the series Prometheus adds of its own.
const TEAM_FAMILIES: &[&str] = &[
    "gpufleet_cluster_info",
    "gpufleet_cluster_nodes",
    "gpufleet_cluster_gpu_utilization_percent",
    "gpufleet_cluster_gpu_memory_used_bytes",
    "gpufleet_cluster_gpu_memory_total_bytes",
    "gpufleet_cluster_gpu_temperature_celsius",
    "gpufleet_cluster_gpu_power_watts",
    "gpufleet_cluster_gpu_ecc_uncorrected_errors",
    "gpufleet_cluster_gpu_xids_total",
    "gpufleet_cluster_mig_slice_memory_bytes",
    "gpufleet_cluster_node_heartbeat_age_seconds",
    "gpufleet_cluster_node_check_passed",
    "gpufleet_cluster_node_check_timestamp_seconds",
    "gpufleet_cluster_node_checks",
    "gpufleet_tenant_gpus",
    "gpufleet_gpu_seconds_total",
    "gpufleet_gpu_seconds_used_total",
    "gpufleet_gpu_seconds_measured_total",
    // A's cluster is cut into MIG instances: its slice-seconds.
    "gpufleet_mig_slice_seconds_total",
];
const PROMETHEUS_OWN: &[&str] = &[
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

/// Waits until `expr` returns at least one series; returns them.
fn has_data(prometheus: &Prometheus, expr: &str) -> Vec<(Value, f64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = prometheus.query(expr);
        if let Ok(series) = &got {
            if !series.is_empty() {
                return series.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard query {expr} has no data after 60s: {got:?}\n--- prometheus log ---\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_scrapes_its_own_clusters_only_and_every_dashboard_query_has_data() {
    // Fails first, and clearly, where prometheus is not installed.
    prom::tool("prometheus");
    let backend = Backend::start_with_args(&[
        "--metrics-listen",
        "127.0.0.1:0",
        "--bandwidth-duration",
        "200ms",
    ]);
    let metrics = prom::wait_for_metrics_addr("the control plane", || backend.log());

    let platform = Terraform::new(&backend, backend.admin_token());
    platform.keep_credentials_in_state(); // reads the deprecated attributes
    platform.write_main(PLATFORM);
    platform.init();
    platform.apply();
    let out = platform.outputs();
    let (a, b) = (&out["a"], &out["b"]);
    let (a_id, a_token, a_cluster) = (s(a, "id"), s(a, "token"), s(a, "cluster"));
    let (b_id, b_token, b_cluster) = (s(b, "id"), s(b, "token"), s(b, "cluster"));

    let read_token = s(a, "read_token");

    // Team A's workspace, with the read token: its cluster's dashboard and scrape job.
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("team-a.token");
    std::fs::write(&token_file, format!("{read_token}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let team = Terraform::new(&backend, &read_token);
    let file = token_file.to_str().unwrap();
    team.write_main(&team_config(&a_cluster, &metrics, file));
    team.init();
    team.apply();
    let mine = team.outputs();
    let board: Value = serde_json::from_str(&s(&mine, "dashboard_json")).unwrap();
    let queries = prom::dashboard_exprs(&board);
    let listed: Vec<String> = mine["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q.as_str().unwrap().to_string())
        .collect();
    assert_eq!(queries, listed, "`queries` lists the dashboard's queries");
    assert!(queries.len() >= 14, "{queries:?}");
    for q in &queries {
        assert!(
            q.contains(&a_cluster) || q.contains(&a_id),
            "a dashboard query without the cluster's or team's filter: {q}"
        );
    }

    // A's token does not reach B's cluster's dashboard.
    team.write_main(&team_config(&b_cluster, &metrics, file));
    let refused = team.plan_fails();
    assert!(
        gpufleet_e2e::terraform::says_not_found(&refused.output()),
        "{}",
        refused.output()
    );

    // A real Prometheus with the provider's job, verbatim.
    let prometheus = Prometheus::start_with_scrape_configs(&s(&mine, "scrape"));
    prometheus.wait_for_value("count(up == 1)", 1.0);

    // Every query of the dashboard returns data.
    for q in &queries {
        has_data(&prometheus, q);
    }
    // The cluster's one node: its 8 GPUs, 2 MIG slices each, checked and passed.
    prometheus.wait_for_value(
        &format!(r#"count(gpufleet_cluster_gpu_temperature_celsius{{cluster_id="{a_cluster}"}})"#),
        8.0,
    );
    prometheus.wait_for_value(
        &format!(r#"count(gpufleet_cluster_mig_slice_memory_bytes{{cluster_id="{a_cluster}",profile="3g.40gb"}})"#),
        16.0,
    );
    prometheus.wait_for_value(
        &format!(r#"gpufleet_cluster_node_check_passed{{cluster_id="{a_cluster}",level="quick"}}"#),
        1.0,
    );
    prometheus.wait_for_value(
        &format!(r#"gpufleet_tenant_gpus{{tenant_id="{a_id}",gpu_type="H100-80GB",kind="used"}}"#),
        8.0,
    );

    // A's series only: every series Prometheus holds is of A's families, and no label
    // value anywhere is B's (its id, its cluster, its name, its nodes).
    let mut admin = backend.admin().await;
    let b_nodes: Vec<String> = admin
        .nodes()
        .await
        .into_iter()
        .filter(|n| n.cluster_id == b_cluster)
        .map(|n| n.hostname)
        .collect();
    assert_eq!(b_nodes.len(), 1, "B's cluster has its node");
    let forbidden: BTreeSet<String> = [b_id.clone(), b_cluster.clone(), "observing-b".into()]
        .into_iter()
        .chain(b_nodes)
        .collect();
    let all = prometheus.query(r#"{__name__=~".+"}"#).unwrap();
    assert!(all.len() > 50, "{} series", all.len());
    let mut families = BTreeSet::new();
    for (labels, _) in &all {
        let name = labels["__name__"].as_str().unwrap().to_string();
        assert!(
            TEAM_FAMILIES.contains(&name.as_str()) || PROMETHEUS_OWN.contains(&name.as_str()),
            "a series of no team family: {labels}"
        );
        for (key, value) in labels.as_object().unwrap() {
            let value = value.as_str().unwrap();
            assert!(
                !forbidden.iter().any(|f| value.contains(f.as_str())),
                "B's {key}={value} in {labels}"
            );
            match key.as_str() {
                "tenant_id" => assert_eq!(value, a_id, "{labels}"),
                "cluster_id" => assert_eq!(value, a_cluster, "{labels}"),
                _ => {}
            }
        }
        families.insert(name);
    }
    for family in TEAM_FAMILIES {
        assert!(
            families.contains(*family),
            "no {family} series: {families:?}"
        );
    }

    // The same endpoint with B's token is B's view: nothing of A's.
    let b_view = prom::scrape_with(&metrics, &b_token);
    assert!(b_view.contains(&b_cluster), "{b_view}");
    for of_a in [&a_id, &a_cluster] {
        assert!(!b_view.contains(of_a.as_str()), "{b_view}");
    }
    prom::promtool_check("team B's view", &b_view);
    // A token of no one gets 401 and no data.
    let refused = prom::get(&metrics, "/metrics", Some("gft_not-a-token")).unwrap();
    assert_eq!(refused.status, 401, "{refused:?}");
    assert!(!refused.body.contains("gpufleet_"), "{refused:?}");

    // Revoked (its gpufleet_tenant_token destroyed), the read token scrapes nothing
    // more: 401, and Prometheus sees the target down.
    let without_token = PLATFORM
        .replace(
            r#"resource "gpufleet_tenant_token" "a_prometheus" {
  tenant = gpufleet_tenant.a.id
  name   = "prometheus"
  scope  = "read"
}"#,
            "",
        )
        .replace(
            ", read_token = gpufleet_tenant_token.a_prometheus.token",
            "",
        );
    assert!(!without_token.contains("a_prometheus"));
    platform.write_main(&without_token);
    platform.apply();
    let refused = prom::get(&metrics, "/metrics", Some(&read_token)).unwrap();
    assert_eq!(refused.status, 401, "{refused:?}");
    assert!(!refused.body.contains("gpufleet_"), "{refused:?}");
    prometheus.wait_for_value("up", 0.0);
    // The team's write token still sees its view.
    assert!(prom::scrape_with(&metrics, &a_token).contains(&a_cluster));
}

/// Runs `command` on a Slurm cluster's login with the team's key, as the cluster's user
/// (docs/guides/slurm.md): (success, stdout + stderr).
fn on_login(credentials: &Value, key: &std::path::Path, command: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let known = dir.path().join("known_hosts");
    std::fs::write(&known, format!("{}\n", s(credentials, "known_hosts"))).unwrap();
    let out = std::process::Command::new("ssh")
        .args(["-i", key.to_str().unwrap()])
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
        .args(["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known.display()))
        .args(["-p", &credentials["port"].as_u64().unwrap().to_string()])
        .arg(format!(
            "{}@{}",
            s(credentials, "user"),
            s(credentials, "host")
        ))
        .arg("--")
        .arg(command)
        .output()
        .expect("run ssh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The value of the one line of `text` that starts with `series` (a full series, labels
/// in the exposition's order).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A Slurm team's jobs reach its metrics: one running and one held (pending) job,
/// submitted through the cluster's login as the team does, are counted in its view, and
/// its dashboard has the jobs panel, whose query returns them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_teams_running_and_pending_jobs_are_in_its_view() {
    let backend = Backend::start_with_args(&[
        "--node-agents",
        "external",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let _agent = gpufleet_e2e::NodeAgent::start(&backend, "jobs1", &["--gpus", "1"]);
    let admin = backend.admin().await;
    gpufleet_e2e::eventually("the node ready", Duration::from_secs(60), || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == 1 && nodes[0].state == "ready").then_some(())
        }
    })
    .await;

    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("id_ed25519");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "team@jobs", "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen (Debian's openssh-client)");
    assert!(made.success());
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file(
        "team.pub",
        &std::fs::read_to_string(key.with_extension("pub")).unwrap(),
    );
    tf.write_main(
        r#"
resource "gpufleet_tenant" "jobs" {
  name = "jobs"
}
resource "gpufleet_gpu_quota" "jobs" {
  tenant   = gpufleet_tenant.jobs.id
  gpu_type = "H100-80GB"
  gpus     = 1
}
resource "gpufleet_tenant_cluster" "train" {
  tenant          = gpufleet_tenant.jobs.id
  name            = "train"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = 1
  ssh_public_keys = [file("${path.module}/team.pub")]
  depends_on      = [gpufleet_gpu_quota.jobs]
}
data "gpufleet_cluster_dashboard" "train" {
  cluster_id      = gpufleet_tenant_cluster.train.id
  metrics_address = "127.0.0.1:9464"
}
output "team" {
  value     = { id = gpufleet_tenant.jobs.id, token = gpufleet_tenant.jobs.token, cluster = gpufleet_tenant_cluster.train.id }
  sensitive = true
}
output "credentials" {
  value     = jsondecode(gpufleet_tenant_cluster.train.credentials)
  sensitive = true
}
output "queries" {
  value = data.gpufleet_cluster_dashboard.train.queries
}
"#,
    );
    tf.init();
    tf.apply();
    let out = tf.outputs();
    let (team, credentials) = (&out["team"], &out["credentials"]);
    let (tenant, token, cluster) = (s(team, "id"), s(team, "token"), s(team, "cluster"));
    let jobs_query = format!(r#"gpufleet_cluster_slurm_jobs{{cluster_id="{cluster}"}}"#);
    assert!(
        out["queries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q.as_str() == Some(jobs_query.as_str())),
        "{}",
        out["queries"]
    );

    // Before any job: both counts, at 0.
    let series = |state: &str| {
        format!(
            r#"gpufleet_cluster_slurm_jobs{{cluster_id="{cluster}",state="{state}",tenant_id="{tenant}"}}"#
        )
    };
    let counts = |want: (f64, f64)| {
        let (metrics, token) = (metrics.clone(), token.clone());
        let (running, pending) = (series("running"), series("pending"));
        move || {
            let text = prom::scrape_with(&metrics, &token);
            let got = (sample(&text, &running), sample(&text, &pending));
            async move { (got == (Some(want.0), Some(want.1))).then_some(()) }
        }
    };
    gpufleet_e2e::eventually(
        "no jobs counted",
        Duration::from_secs(60),
        counts((0.0, 0.0)),
    )
    .await;

    // One job that runs, one held: 1 running, 1 pending.
    for submit in [
        "sbatch -N1 --wrap 'sleep 600'",
        "sbatch -N1 --hold --wrap 'sleep 1'",
    ] {
        let (ok, text) = on_login(credentials, &key, submit);
        assert!(ok, "{submit}: {text}");
    }
    gpufleet_e2e::eventually(
        "one running and one pending job counted",
        Duration::from_secs(60),
        counts((1.0, 1.0)),
    )
    .await;
    let (ok, text) = on_login(credentials, &key, "scancel --user \"$(id -un)\"");
    assert!(ok, "scancel: {text}");
    tf.destroy();
}

/// A team need not know where the metrics are: with `metrics_address` left out, its
/// dashboard's scrape job targets what serve says it listens on (bound to every address,
/// the provider's endpoint's host with that port), and that target serves the team's view
/// to its token. Without `--metrics-listen` the plan fails naming `metrics_address`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_dashboard_learns_the_metrics_address_from_the_control_plane() {
    let backend = Backend::start_with_args(&["--metrics-listen", "0.0.0.0:0"]);
    let logged = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let port = logged.rsplit_once(':').unwrap().1;
    let host = backend.endpoint();
    let host = host
        .trim_start_matches("http://")
        .rsplit_once(':')
        .unwrap()
        .0;
    let expected = format!("{host}:{port}");
    let mut admin = backend.admin().await;
    let (tenant, token) = gpufleet_e2e::fixtures::create_tenant(&mut admin, "finds-metrics").await;
    gpufleet_e2e::fixtures::create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let cluster =
        gpufleet_e2e::fixtures::create_pool_cluster(&mut admin, &tenant.id, "seen", "H100-80GB", 1)
            .await;

    let team = Terraform::new(&backend, &token);
    team.write_main(&format!(
        r#"
data "gpufleet_cluster_dashboard" "mine" {{
  cluster_id = "{}"
}}
output "address" {{
  value = data.gpufleet_cluster_dashboard.mine.metrics_address
}}
output "scrape" {{
  value = data.gpufleet_cluster_dashboard.mine.prometheus_scrape_config
}}
"#,
        cluster.id
    ));
    team.init();
    team.apply();
    let out = team.outputs();
    assert_eq!(s(&out, "address"), expected, "{out}");
    let scrape = s(&out, "scrape");
    assert!(
        scrape.contains(&format!("- targets: ['{expected}']")),
        "{scrape}"
    );
    // The target is real: it serves the team's view to the team's token.
    assert!(prom::scrape_with(&expected, &token).contains(&cluster.id));

    // A control plane without metrics: the plan says so, naming the attribute.
    let bare = Backend::start();
    let tf = Terraform::new(&bare, bare.admin_token());
    tf.write_main(
        r#"
data "gpufleet_cluster_dashboard" "none" {
  cluster_id = "c-anything"
}
"#,
    );
    tf.init();
    let refused = tf.plan_fails().output();
    assert!(
        refused.contains("metrics_address") && refused.contains("--metrics-listen"),
        "{refused}"
    );
}
