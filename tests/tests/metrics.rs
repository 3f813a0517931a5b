//! `--metrics-listen`: a real Prometheus (Debian's `prometheus`, installed by
//! scripts/bootstrap.sh) scrapes a control plane (with its metrics token, through
//! `authorization: credentials_file:`) and two node agents, and the values come back through
//! its HTTP API; `promtool check metrics` passes on both kinds of endpoint; every metric the
//! Grafana dashboard (examples/grafana/gpufleet.json) queries exists. The control plane's
//! endpoint answers a scrape without a token it takes with 401 and no data (a tenant's
//! token gets its own view, tests/tests/team_metrics.rs), and names no tenant unless
//! `--metrics-tenant-names` asks for it.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpufleet_e2e::fixtures::{
    create_pool_cluster, create_quota, create_reservation, create_tenant,
};
use gpufleet_e2e::prom::{self, Job, Prometheus};
use gpufleet_e2e::{eventually, Backend, Clients, NodeAgent};
use gpufleet_proto::v1::{CreateTenantClusterRequest, GetTenantRequest};

const LIMIT: Duration = Duration::from_secs(30);
const METRICS: &[&str] = &["--metrics-listen", "127.0.0.1:0"];

/// The token the control plane generated into its data dir for scrapes.
fn generated_token(backend: &Backend) -> String {
    let path = backend.data_dir().join("metrics.token");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// An external control plane with metrics (and `serve_args`), and agents (name, extra
/// flags) with metrics; returns them with the control plane's and each agent's metrics
/// address.
async fn fleet(
    agents: &[(&str, &[&str])],
    serve_args: &[&str],
) -> (Backend, String, Vec<(NodeAgent, String)>) {
    let args: Vec<&str> = [
        "--node-agents",
        "external",
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .into_iter()
    .chain(serve_args.iter().copied())
    .collect();
    let backend = Backend::start_with_args(&args);
    let control = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let started: Vec<NodeAgent> = agents
        .iter()
        .map(|(name, extra)| {
            let flags: Vec<&str> = extra.iter().chain(METRICS).copied().collect();
            NodeAgent::start(&backend, name, &flags)
        })
        .collect();
    let with_addr = started
        .into_iter()
        .map(|a| {
            let addr = prom::wait_for_metrics_addr(&a.name, || a.log());
            (a, addr)
        })
        .collect();
    let admin = backend.admin().await;
    let names: Vec<String> = agents.iter().map(|(n, _)| n.to_string()).collect();
    eventually(&format!("nodes {names:?} ready"), LIMIT, || {
        let mut admin = admin.clone();
        let names = names.clone();
        async move {
            let all = admin.nodes().await;
            names
                .iter()
                .all(|name| {
                    all.iter()
                        .any(|n| &n.hostname == name && n.state == "ready")
                })
                .then_some(())
        }
    })
    .await;
    (backend, control, with_addr)
}

fn gpu_uuid(agent: &NodeAgent, index: usize) -> String {
    agent.status().expect("the agent's status")["gpus"][index]["uuid"]
        .as_str()
        .expect("a GPU uuid")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_control_plane_and_two_agents() {
    // Fails first, and clearly, where prometheus is not installed.
    prom::tool("prometheus");
    prom::tool("promtool");
    // The operator's token file, shared by the control plane and Prometheus.
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("gpufleet-metrics.token");
    std::fs::write(&token_file, "gfm_the-operators-scrape-token\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let wrong_file = secrets.path().join("wrong.token");
    std::fs::write(&wrong_file, "gfm_not-the-token\n").unwrap();
    let (backend, control, agents) = fleet(
        &[
            ("metrics-a", &["--gpus", "2"]),
            ("metrics-b", &["--gpus", "1", "--gpu-type", "A100-80GB"]),
        ],
        &["--metrics-token-file", token_file.to_str().unwrap()],
    )
    .await;
    let mut admin: Clients = backend.admin().await;

    // A tenant with quotas, a future reservation, a MIG cluster, and a request that fails.
    let (tenant, _) = create_tenant(&mut admin, "metrics-team").await;
    // The pool has 2 H100 GPUs to guarantee; the rest is burst.
    create_quota(&mut admin, &tenant.id, "H100-80GB", 2, 4).await;
    create_quota(&mut admin, &tenant.id, "A100-80GB", 1, 0).await;
    create_reservation(&mut admin, &tenant.id, "A100-80GB", 1, 1, 2).await;
    admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: "metrics-cluster".into(),
            tenant_id: tenant.id.clone(),
            name: "sliced".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            storage_gib: 10,
            mig_layout: [("3g.40gb".to_string(), 2)].into_iter().collect(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTenantCluster: {s}"));
    let missing = admin
        .tenants
        .get_tenant(GetTenantRequest {
            id: "no-such-tenant".into(),
        })
        .await
        .expect_err("an unknown tenant");
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let job = |name, targets, credentials_file| Job {
        name,
        targets,
        credentials_file,
    };
    let prometheus = Prometheus::start(&[
        job(
            "control-plane",
            vec![control.clone()],
            Some(token_file.as_path()),
        ),
        job("no-token", vec![control.clone()], None),
        job(
            "wrong-token",
            vec![control.clone()],
            Some(wrong_file.as_path()),
        ),
        job(
            "node-agents",
            agents.iter().map(|(_, addr)| addr.clone()).collect(),
            None,
        ),
    ]);
    // Every target with the token scraped, none without it; then the values as
    // Prometheus stored them.
    prometheus.wait_for_value("count(up == 1)", 3.0);
    prometheus.wait_for_value(r#"up{job="no-token"}"#, 0.0);
    prometheus.wait_for_value(r#"up{job="wrong-token"}"#, 0.0);
    let q = |expr: &str, want: f64| prometheus.wait_for_value(expr, want);
    q(r#"gpufleet_nodes{state="ready"}"#, 2.0);
    q(r#"gpufleet_nodes{state="unreachable"}"#, 0.0);
    // Tenants by id; no series carries a tenant's name.
    let team = format!(r#"tenant_id="{}""#, tenant.id);
    q(r#"absent(gpufleet_tenant_gpus{tenant=~".+"})"#, 1.0);
    q(
        r#"count(gpufleet_nodes{job=~"no-token|wrong-token"}) or vector(0)"#,
        0.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="H100-80GB",kind="quota_guaranteed"}}"#),
        2.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="H100-80GB",kind="quota_burst"}}"#),
        4.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="H100-80GB",kind="used"}}"#),
        2.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="A100-80GB",kind="reserved"}}"#),
        1.0,
    );
    q(
        r#"gpufleet_gpus{gpu_type="H100-80GB",state="allocated"}"#,
        2.0,
    );
    q(r#"gpufleet_gpus{gpu_type="H100-80GB",state="free"}"#, 0.0);
    q(r#"gpufleet_gpus{gpu_type="A100-80GB",state="free"}"#, 1.0);
    q(r#"gpufleet_reservations{state="pending"}"#, 1.0);
    q(
        r#"gpufleet_mig_slices{gpu_type="H100-80GB",profile="3g.40gb",state="allocated"}"#,
        4.0,
    );
    q(
        r#"gpufleet_work_orders_total{kind="mig_layout",outcome="ok"}"#,
        1.0,
    );
    q(
        r#"gpufleet_api_requests_total{method="gpufleet.v1.TenantService/CreateTenant",code="OK"}"#,
        1.0,
    );
    q(
        r#"gpufleet_api_requests_total{method="gpufleet.v1.TenantService/GetTenant",code="NOT_FOUND"}"#,
        1.0,
    );
    q(
        r#"gpufleet_api_request_seconds_count{method="gpufleet.v1.TenantClusterService/CreateTenantCluster"}"#,
        1.0,
    );
    q("count(gpufleet_node_heartbeat_age_seconds < 30)", 2.0);
    // The agents' GPUs, per UUID, as the simulated hardware reports them.
    q("count(gpufleet_node_gpu_temperature_celsius)", 3.0);
    let (a, _) = &agents[0];
    let uuid = gpu_uuid(a, 1);
    q(
        &format!(r#"gpufleet_node_gpu_temperature_celsius{{node="metrics-a",uuid="{uuid}"}}"#),
        35.0,
    );
    q(
        &format!(r#"gpufleet_node_gpu_power_watts{{node="metrics-a",uuid="{uuid}"}}"#),
        70.0,
    );
    q(
        &format!(r#"gpufleet_node_gpu_ecc_uncorrected_errors{{uuid="{uuid}"}}"#),
        0.0,
    );
    q(
        &format!(r#"gpufleet_node_gpu_mig_instances{{uuid="{uuid}"}}"#),
        2.0,
    );
    q(r#"gpufleet_node_orders_queued{node="metrics-a"}"#, 0.0);
    q(
        r#"gpufleet_node_orders_total{node="metrics-a",kind="mig_layout",outcome="ok"}"#,
        1.0,
    );

    // Both kinds of endpoint pass promtool's checks.
    let text = prom::scrape_with(&control, "gfm_the-operators-scrape-token");
    assert!(!text.contains("metrics-team"), "{text}");
    prom::promtool_check("the control plane's /metrics", &text);
    for (agent, addr) in &agents {
        prom::promtool_check(&format!("{}'s /metrics", agent.name), &prom::scrape(addr));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_grafana_dashboard_exists() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/grafana/gpufleet.json");
    let dashboard = prom::read_dashboard(&path);
    let exprs = prom::dashboard_exprs(&dashboard);
    assert!(
        exprs.len() >= 10,
        "the dashboard has only {} queries",
        exprs.len()
    );

    let (backend, control, agents) = fleet(&[("dash-a", &["--gpus", "1"])], &[]).await;
    let mut admin = backend.admin().await;
    // Requests, so that the request metrics have series.
    let (tenant, _) = create_tenant(&mut admin, "dash-team").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 1, 0).await;
    // A cluster holding the node, so that its GPU-seconds held and used have series (used
    // once a utilisation reading after the assignment has been counted: every 5 s).
    create_pool_cluster(&mut admin, &tenant.id, "dash-train", "H100-80GB", 1).await;
    let token = generated_token(&backend);
    let operator = eventually("a usage series of GPU-seconds used", LIMIT, || {
        let text = prom::scrape_with(&control, &token);
        async move { prom::exposes(&text, "gpufleet_gpu_seconds_used_total").then_some(text) }
    })
    .await;
    let text = format!("{operator}\n{}", prom::scrape(&agents[0].1));

    let mut missing = BTreeSet::new();
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = prom::promql_metric_names(expr);
        assert!(!names.is_empty(), "no metric in the dashboard query {expr}");
        for name in names {
            if !prom::exposes(&text, &name) {
                missing.insert(format!("{name} (in {expr})"));
            }
            used.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics that /metrics does not have:\n{}\n--- /metrics ---\n{text}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
    // The panels the dashboard promises.
    for family in [
        "gpufleet_gpus",
        "gpufleet_tenant_gpus",
        "gpufleet_reservations",
        "gpufleet_nodes",
        "gpufleet_node_heartbeat_age_seconds",
        "gpufleet_api_requests_total",
        "gpufleet_api_request_seconds_bucket",
        "gpufleet_gpu_seconds_total",
        "gpufleet_gpu_seconds_used_total",
        "gpufleet_gpu_seconds_measured_total",
    ] {
        assert!(used.contains(family), "no dashboard panel uses {family}");
    }
}

/// A control plane with metrics (embedded agents), a tenant with a quota; returns it with
/// its metrics address and the tenant's id and token.
async fn team_and_metrics(name: &str, serve_args: &[&str]) -> (Backend, String, String, String) {
    let args: Vec<&str> = METRICS.iter().chain(serve_args).copied().collect();
    let backend = Backend::start_with_args(&args);
    let addr = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let mut admin = backend.admin().await;
    let (tenant, token) = create_tenant(&mut admin, name).await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    (backend, addr, tenant.id, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_without_the_metrics_token_gets_401_and_no_data() {
    let (backend, addr, tenant_id, tenant_token) = team_and_metrics("confidential-team", &[]).await;
    // Generated on first start, private to the control plane's user.
    let path = backend.data_dir().join("metrics.token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", path.display());
    let token = generated_token(&backend);

    // No token, a wrong one, a near miss: refused, no data. (A tenant's token is not
    // refused: it sees its own tenant's view, tests/tests/team_metrics.rs.)
    let near_miss = &token[..token.len() - 1];
    for (what, given) in [
        ("no token", None),
        ("a wrong token", Some("gfm_guess")),
        ("the token less its last character", Some(near_miss)),
        (
            "a tenant token less its last character",
            Some(&tenant_token[..tenant_token.len() - 1]),
        ),
    ] {
        let answer = prom::get(&addr, "/metrics", given).unwrap();
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
        assert!(
            answer
                .head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{what}: {answer:?}"
        );
        assert!(answer.body.contains("bearer token"), "{what}: {answer:?}");
        for secret in ["gpufleet_", "confidential-team", &tenant_id] {
            assert!(!answer.body.contains(secret), "{what}: {answer:?}");
        }
    }

    // The tenant's token: its own view, never the fleet's.
    let own = prom::scrape_with(&addr, &tenant_token);
    assert!(own.contains(&tenant_id), "{own}");
    for fleet_wide in [
        "gpufleet_gpus{",
        "gpufleet_nodes{",
        "gpufleet_api_requests_total",
    ] {
        assert!(!own.contains(fleet_wide), "{own}");
    }
    // The admin token sees what the operator's does.
    assert!(prom::scrape_with(&addr, backend.admin_token()).contains("gpufleet_gpus{"));

    // With the token: every tenant by its id only, no tenant's name anywhere.
    let text = prom::scrape_with(&addr, &token);
    assert!(
        text.contains(&format!(
            r#"gpufleet_tenant_gpus{{gpu_type="H100-80GB",kind="quota_guaranteed",tenant_id="{tenant_id}"}} 8"#
        )),
        "{text}"
    );
    assert!(!text.contains("confidential-team"), "{text}");
    assert!(!text.contains("tenant=\""), "{text}");

    // The token outlives a restart: Prometheus' credentials stay valid.
    let mut backend = backend;
    backend.restart();
    let addr = prom::wait_for_metrics_addr("the restarted control plane", || {
        let log = backend.log();
        let last = log.rfind("Prometheus metrics on").unwrap_or(0);
        log[last..].to_string()
    });
    assert_eq!(generated_token(&backend), token);
    assert!(prom::scrape_with(&addr, &token).contains("gpufleet_tenant_gpus"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_names_label_the_series_only_when_the_operator_asks() {
    let (backend, addr, tenant_id, _) =
        team_and_metrics("named-team", &["--metrics-tenant-names"]).await;
    let text = prom::scrape_with(&addr, &generated_token(&backend));
    assert!(
        text.contains(&format!(
            r#"gpufleet_tenant_gpus{{gpu_type="H100-80GB",kind="quota_guaranteed",tenant="named-team",tenant_id="{tenant_id}"}} 8"#
        )),
        "{text}"
    );
    prom::promtool_check("the control plane's /metrics with tenant names", &text);
}

/// `gpufleet-agent serve ARGS` in a fresh data dir, expected to fail at start: its stderr.
fn serve_fails(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .args(args)
        .env_remove("GPUFLEET_METRICS_LISTEN")
        .env_remove("GPUFLEET_METRICS_TOKEN_FILE")
        .env_remove("GPUFLEET_METRICS_TENANT_NAMES")
        .output()
        .expect("run gpufleet-agent serve");
    assert!(!out.status.success(), "serve {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_metrics_token_file_fails_at_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let empty = file("empty.token", "  \n");
    let spaced = file("spaced.token", "two words\n");
    let missing = dir.path().join("missing.token");
    for (path, says) in [
        (&empty, "is empty"),
        (&spaced, "printable ASCII"),
        (&missing, "cannot read"),
    ] {
        let p = path.to_str().unwrap();
        let err = serve_fails(&[METRICS[0], METRICS[1], "--metrics-token-file", p]);
        assert!(
            err.contains("--metrics-token-file") && err.contains(says),
            "{p}: {err}"
        );
    }
    // Without an endpoint to protect, the flag is a mistake said as one.
    let err = serve_fails(&["--metrics-token-file", empty.to_str().unwrap()]);
    assert!(err.contains("--metrics-listen"), "{err}");
}
