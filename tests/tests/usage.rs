//! Usage accounting (issue 42) through the real serve on its injected clock: a team's
//! cluster held for a known number of seconds gives exactly that many GPU-seconds (its 8
//! GPUs times the seconds) through `gpufleet-agent usage` and through Terraform's
//! `gpufleet_usage` with only the team's token, which sees no other team's (and whose
//! unknown `by` is refused at plan time naming it); the operator's
//! `gpufleet_gpu_seconds_total` says the same; `usage --prices` prices each row (and
//! refuses a row the price list does not price); after a serve restart the total is
//! unchanged, time held since then adds on exactly, and a delete stops the count. The
//! columns of time used (from the simulated GPUs' utilisation readings, which depend on
//! when readings come on this clock) are checked for their place and bounds
//! (used <= measured <= held); their exact arithmetic is the store's unit tests'.
//!
//! A team's MIG cluster, created through its own Terraform configuration, is counted per
//! MIG profile: its GPUs held whole under its profile, with the slices they are cut into,
//! through the data source, the CLI and the counters, unchanged by a restart.

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::{prom, Backend, Terraform};
use gpufleet_proto::v1::DeleteTenantClusterRequest;

const H100: &str = "H100-80GB";
/// GPUs of one simulated H100 node.
const GPUS: i64 = 8;

fn set_clock(clock: &std::path::Path, t: i64) {
    std::fs::write(clock, t.to_string()).expect("write the clock file");
}

fn rfc3339(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// `gpufleet-agent usage` with `token` and `args`: its stdout, or its stderr on failure.
fn usage(backend: &Backend, token: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .arg("usage")
        .args(args)
        .args(["--endpoint", &backend.endpoint(), "--token", token])
        .output()
        .expect("run gpufleet-agent usage");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The CSV's used columns, always `gpu_seconds_used,gpu_seconds_measured` before the last
/// two (`mig_profile,slice_seconds`), taken off each line after checking them: used
/// (empty: not reported) <= measured <= the row's `gpu_seconds` (held).
fn without_used(csv: &str) -> String {
    let mut lines = csv.lines();
    let header = lines.next().expect("a header");
    let mut out = header
        .strip_suffix(",gpu_seconds_used,gpu_seconds_measured,mig_profile,slice_seconds")
        .unwrap_or_else(|| panic!("the used and MIG columns come last: {header}"))
        .to_string();
    out.push_str(",mig_profile,slice_seconds\n");
    for line in lines {
        let mut cells: Vec<&str> = line.split(',').collect();
        let slice_seconds = cells.pop().unwrap();
        let mig_profile = cells.pop().unwrap();
        let measured: i64 = cells.pop().unwrap().parse().unwrap();
        let used = cells.pop().unwrap();
        let held: i64 = cells[6].parse().unwrap();
        if used.is_empty() {
            assert_eq!(measured, 0, "{line}");
        } else {
            let used: i64 = used.parse().unwrap();
            assert!(used <= measured && measured <= held, "{line}");
        }
        out.push_str(&cells.join(","));
        out.push_str(&format!(",{mig_profile},{slice_seconds}\n"));
    }
    out
}

/// The value of `gpufleet_gpu_seconds_total` for one tenant id and class.
fn counter(text: &str, tenant_id: &str, class: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.starts_with("gpufleet_gpu_seconds_total{"))
        .find(|l| {
            l.contains(&format!("tenant_id=\"{tenant_id}\""))
                && l.contains(&format!("class=\"{class}\""))
                && l.contains(&format!("gpu_type=\"{H100}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_seconds_held_are_exact_per_team_and_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    let t0 = time::OffsetDateTime::now_utc().unix_timestamp();
    set_clock(&clock, t0);
    let mut backend = Backend::start_with_args(&[
        "--clock-file",
        clock.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let mut admin = backend.admin().await;
    let (vision, vision_token) = create_tenant(&mut admin, "vision").await;
    let (speech, _) = create_tenant(&mut admin, "speech").await;
    create_quota(&mut admin, &vision.id, H100, GPUS, GPUS).await;
    create_quota(&mut admin, &speech.id, H100, GPUS, GPUS).await;
    // vision holds one node from t0, speech one from t0 + 400.
    let train = create_pool_cluster(&mut admin, &vision.id, "train", H100, 1).await;
    set_clock(&clock, t0 + 400);
    create_pool_cluster(&mut admin, &speech.id, "asr", H100, 1).await;
    set_clock(&clock, t0 + 1000);

    let (since, until) = (rfc3339(t0 - 3600), rfc3339(t0 + 86_400));
    let window = ["--since", since.as_str(), "--until", until.as_str()];
    let csv = |backend: &Backend, token: &str| {
        let mut args = window.to_vec();
        args.extend(["--by", "tenant,cluster,gpu_type,class", "--format", "csv"]);
        without_used(&usage(backend, token, &args).unwrap())
    };
    let vision_csv = |seconds: i64| {
        format!(
            "since,until,tenant,cluster,gpu_type,class,gpu_seconds,mig_profile,slice_seconds\n\
             {since},{until},vision,train,{H100},guaranteed,{seconds},,0\n"
        )
    };
    // The team's own token: its own cluster only, 8 GPUs x 1000 s.
    assert_eq!(csv(&backend, &vision_token), vision_csv(GPUS * 1000));
    // Another team's usage is not there for it.
    let mut args = window.to_vec();
    args.extend(["--tenant", "speech"]);
    let refused = usage(&backend, &vision_token, &args).unwrap_err();
    assert!(refused.contains("not found"), "{refused}");
    // The admin sees every team's.
    let mut args = window.to_vec();
    args.extend(["--by", "tenant", "--format", "json"]);
    let all: serde_json::Value =
        serde_json::from_str(&usage(&backend, backend.admin_token(), &args).unwrap()).unwrap();
    let per_team: Vec<(String, i64)> = all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["tenant"].as_str().unwrap().to_string(),
                r["gpu_seconds"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        per_team,
        [
            ("speech".to_string(), GPUS * 600),
            ("vision".to_string(), GPUS * 1000)
        ]
    );

    // Priced (the price list `replay --prices` reads): GPU-hours x the price of the model
    // and class, to hundredths; the CSV appends its cost columns after the existing ones.
    let prices = dir.path().join("prices.csv");
    std::fs::write(
        &prices,
        format!("gpu_type,class,per_gpu_hour\n{H100},guaranteed,2.5\n{H100},on-demand,6\n"),
    )
    .unwrap();
    let mut args = window.to_vec();
    args.extend(["--by", "tenant,gpu_type,class", "--format", "csv"]);
    args.extend(["--prices", prices.to_str().unwrap()]);
    assert_eq!(
        without_used(&usage(&backend, backend.admin_token(), &args).unwrap()),
        format!(
            "since,until,tenant,cluster,gpu_type,class,gpu_seconds,gpu_hours,price_per_gpu_hour,cost,mig_profile,slice_seconds\n\
             {since},{until},speech,,{H100},guaranteed,4800,1.333333,2.5,3.33,,0\n\
             {since},{until},vision,,{H100},guaranteed,8000,2.222222,2.5,5.56,,0\n"
        )
    );
    // A model and class the list does not price: refused, naming both and the file, and
    // nothing printed.
    std::fs::write(
        &prices,
        format!("gpu_type,class,per_gpu_hour\n{H100},on-demand,6\n"),
    )
    .unwrap();
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .arg("usage")
        .args(&args)
        .args(["--endpoint", &backend.endpoint(), "--token", &vision_token])
        .output()
        .expect("run gpufleet-agent usage");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--prices {}: no price for {H100} guaranteed",
            prices.display()
        )),
        "{stderr}"
    );

    // Terraform's data source with only the team's token.
    let tf = Terraform::new(&backend, &vision_token);
    tf.write_main(&format!(
        r#"
data "gpufleet_usage" "mine" {{
  since = "{since}"
  until = "{until}"
  by    = ["tenant", "class"]
}}
output "rows" {{ value = data.gpufleet_usage.mine.rows }}
"#
    ));
    tf.init();
    tf.apply();
    let mut rows = tf.outputs()["rows"].clone();
    for row in rows.as_array_mut().unwrap() {
        let row = row.as_object_mut().unwrap();
        let measured = row
            .remove("gpu_seconds_measured")
            .unwrap()
            .as_i64()
            .unwrap();
        match row.remove("gpu_seconds_used").unwrap().as_i64() {
            Some(used) => assert!(used <= measured && measured <= GPUS * 1000, "{row:?}"),
            None => assert_eq!(measured, 0, "not reported: {row:?}"),
        }
    }
    assert_eq!(
        rows,
        serde_json::json!([{
            "tenant": "vision", "cluster": "", "gpu_type": "", "class": "guaranteed",
            "gpu_seconds": GPUS * 1000, "mig_profile": "", "slice_seconds": 0,
            // This serve has no price list.
            "cost": null
        }])
    );

    // A grouping it does not know is refused at plan time, naming the attribute.
    tf.write_main(&format!(
        r#"
data "gpufleet_usage" "mine" {{
  since = "{since}"
  until = "{until}"
  by    = ["team"]
}}
"#
    ));
    tf.plan_fails()
        .assert_mentions(&["by: unknown grouping 'team'", "gpufleet_usage"]);

    // The operator's counter, from the same records.
    let metrics = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let token = std::fs::read_to_string(backend.data_dir().join("metrics.token")).unwrap();
    let text = prom::scrape_with(&metrics, token.trim());
    assert_eq!(
        counter(&text, &vision.id, "guaranteed").as_deref(),
        Some("8000"),
        "{text}"
    );

    // A restart changes nothing; time held after it adds on exactly.
    backend.restart();
    assert_eq!(csv(&backend, &vision_token), vision_csv(GPUS * 1000));
    set_clock(&clock, t0 + 1500);
    assert_eq!(csv(&backend, &vision_token), vision_csv(GPUS * 1500));
    // A delete stops the count.
    let mut admin = backend.admin().await;
    admin
        .clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest {
            id: train.id.clone(),
        })
        .await
        .expect("delete the team's cluster");
    set_clock(&clock, t0 + 5000);
    assert_eq!(csv(&backend, &vision_token), vision_csv(GPUS * 1500));
}

/// The value of the series of `name` for one tenant id and MIG profile.
fn series(text: &str, name: &str, tenant_id: &str, profile: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            l.contains(&format!("tenant_id=\"{tenant_id}\""))
                && l.contains(&format!("mig_profile=\"{profile}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

/// The team `vision` (16 guaranteed H100s) holds, from t0, a node of whole GPUs (`train`,
/// made by the admin) and, through its own Terraform configuration and token, a node cut
/// into 7 `1g.10gb` per GPU (`inference`). At t0 + 600 each node has held 8 GPUs for
/// 600 s: 4,800 GPU-seconds each, `inference`'s under `1g.10gb` with its 8 x 7 = 56
/// slices for 600 s, 33,600 slice-seconds; `train`'s under `none`, without slices. A
/// restart changes nothing; a layout change at t0 + 600 counts the GPUs under the new
/// profile from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_cluster_is_counted_per_profile_with_its_slices() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    let t0 = time::OffsetDateTime::now_utc().unix_timestamp();
    set_clock(&clock, t0);
    let mut backend = Backend::start_with_args(&[
        "--clock-file",
        clock.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let mut admin = backend.admin().await;
    let (vision, vision_token) = create_tenant(&mut admin, "vision").await;
    create_quota(&mut admin, &vision.id, H100, 2 * GPUS, 0).await;
    create_pool_cluster(&mut admin, &vision.id, "train", H100, 1).await;
    let inference = |layout: &str| {
        format!(
            r#"
resource "gpufleet_tenant_cluster" "inference" {{
  tenant       = "{tenant}"
  name         = "inference"
  orchestrator = "kubernetes"
  gpu_type     = "{H100}"
  node_count   = 1
  mig_layout   = {{ {layout} }}
}}
"#,
            tenant = vision.id
        )
    };
    let tf = Terraform::new(&backend, &vision_token);
    tf.write_main(&inference(r#""1g.10gb" = 7"#));
    tf.init();
    tf.apply();
    set_clock(&clock, t0 + 600);

    let (since, until) = (rfc3339(t0 - 3600), rfc3339(t0 + 86_400));
    let held = GPUS * 600;
    let slices = GPUS * 7 * 600;
    // The data source, with the team's token.
    let reader = Terraform::new(&backend, &vision_token);
    reader.write_main(&format!(
        r#"
data "gpufleet_usage" "mine" {{
  since = "{since}"
  until = "{until}"
  by    = ["cluster", "mig_profile"]
}}
output "rows" {{ value = data.gpufleet_usage.mine.rows }}
"#
    ));
    reader.init();
    reader.apply();
    let mut rows = reader.outputs()["rows"].clone();
    for row in rows.as_array_mut().unwrap() {
        let row = row.as_object_mut().unwrap();
        let measured = row
            .remove("gpu_seconds_measured")
            .unwrap()
            .as_i64()
            .unwrap();
        match row.remove("gpu_seconds_used").unwrap().as_i64() {
            Some(used) => assert!(used <= measured && measured <= held, "{row:?}"),
            None => assert_eq!(measured, 0, "not reported: {row:?}"),
        }
    }
    assert_eq!(
        rows,
        serde_json::json!([
            {
                "tenant": "vision", "cluster": "inference", "gpu_type": "", "class": "",
                "mig_profile": "1g.10gb", "gpu_seconds": held, "slice_seconds": slices,
                "cost": null
            },
            {
                "tenant": "vision", "cluster": "train", "gpu_type": "", "class": "",
                "mig_profile": "none", "gpu_seconds": held, "slice_seconds": 0, "cost": null
            }
        ])
    );

    // The CLI, by profile alone, before and after a restart.
    let window = ["--since", since.as_str(), "--until", until.as_str()];
    let csv = |backend: &Backend| {
        let mut args = window.to_vec();
        args.extend(["--by", "mig_profile", "--format", "csv"]);
        without_used(&usage(backend, &vision_token, &args).unwrap())
    };
    let expected = format!(
        "since,until,tenant,cluster,gpu_type,class,gpu_seconds,mig_profile,slice_seconds\n\
         {since},{until},,,,,{held},1g.10gb,{slices}\n\
         {since},{until},,,,,{held},none,0\n"
    );
    assert_eq!(csv(&backend), expected);
    // Not grouped by profile: the whole GPUs held, as before profiles were counted.
    let mut args = window.to_vec();
    args.extend(["--format", "json"]);
    let total: serde_json::Value =
        serde_json::from_str(&usage(&backend, &vision_token, &args).unwrap()).unwrap();
    assert_eq!(total["rows"][0]["gpu_seconds"], 2 * held);

    // The operator's counters carry the profile.
    let metrics = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let token = std::fs::read_to_string(backend.data_dir().join("metrics.token")).unwrap();
    let text = prom::scrape_with(&metrics, token.trim());
    let held_text = held.to_string();
    let slices_text = slices.to_string();
    for (name, profile, value) in [
        (
            "gpufleet_gpu_seconds_total",
            "1g.10gb",
            Some(held_text.as_str()),
        ),
        (
            "gpufleet_gpu_seconds_total",
            "none",
            Some(held_text.as_str()),
        ),
        (
            "gpufleet_mig_slice_seconds_total",
            "1g.10gb",
            Some(slices_text.as_str()),
        ),
        ("gpufleet_mig_slice_seconds_total", "none", None),
    ] {
        assert_eq!(
            series(&text, name, &vision.id, profile).as_deref(),
            value,
            "{name} {profile} in\n{text}"
        );
    }

    backend.restart();
    assert_eq!(csv(&backend), expected);

    // The team cuts its GPUs into 2 3g.40gb each at t0 + 600: from then on they count
    // there, 8 GPUs x 300 s and 16 instances x 300 s by t0 + 900.
    tf.write_main(&inference(r#""3g.40gb" = 2"#));
    tf.apply();
    set_clock(&clock, t0 + 900);
    assert_eq!(
        csv(&backend),
        format!(
            "since,until,tenant,cluster,gpu_type,class,gpu_seconds,mig_profile,slice_seconds\n\
             {since},{until},,,,,{held},1g.10gb,{slices}\n\
             {since},{until},,,,,{},3g.40gb,{}\n\
             {since},{until},,,,,{},none,0\n",
            GPUS * 300,
            GPUS * 2 * 300,
            GPUS * 900
        )
    );
}

/// The operator's price list on serve (`--prices`) prices a team's usage for the team
/// itself: through `gpufleet_usage` with only its token, grouped by model and class, each
/// row's cost is its GPU-hours times the price, to hundredths; grouped otherwise the rows
/// have none and the data source says why. A malformed list stops serve before it starts,
/// naming the file, line and column.
#[tokio::test]
async fn a_team_reads_its_cost_with_its_own_token() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad-prices.csv");
    std::fs::write(
        &bad,
        format!("gpu_type,class,per_gpu_hour\n{H100},guaranteed,cheap\n"),
    )
    .unwrap();
    let refused = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("never"))
        .arg("--prices")
        .arg(&bad)
        .output()
        .expect("run gpufleet-agent serve");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("--prices") && stderr.contains(&format!("{}:2:", bad.display())),
        "{stderr}"
    );
    assert!(
        !dir.path().join("never").exists(),
        "serve started: {stderr}"
    );

    let clock = dir.path().join("clock");
    let t0 = time::OffsetDateTime::now_utc().unix_timestamp();
    set_clock(&clock, t0);
    let prices = dir.path().join("prices.csv");
    std::fs::write(
        &prices,
        format!("gpu_type,class,per_gpu_hour\n{H100},guaranteed,2.5\n"),
    )
    .unwrap();
    let backend = Backend::start_with_args(&[
        "--clock-file",
        clock.to_str().unwrap(),
        "--prices",
        prices.to_str().unwrap(),
    ]);
    let mut admin = backend.admin().await;
    let (vision, vision_token) = create_tenant(&mut admin, "vision").await;
    create_quota(&mut admin, &vision.id, H100, GPUS, GPUS).await;
    create_pool_cluster(&mut admin, &vision.id, "train", H100, 1).await;
    set_clock(&clock, t0 + 1000);

    let (since, until) = (rfc3339(t0 - 3600), rfc3339(t0 + 86_400));
    let tf = Terraform::new(&backend, &vision_token);
    let read = |by: &str| {
        tf.write_main(&format!(
            r#"
data "gpufleet_usage" "mine" {{
  since = "{since}"
  until = "{until}"
  by    = {by}
}}
output "costs" {{ value = [for r in data.gpufleet_usage.mine.rows : [r.class, r.gpu_seconds, r.cost]] }}
output "why" {{ value = data.gpufleet_usage.mine.cost_unavailable }}
"#
        ));
        tf.apply();
        let out = tf.outputs();
        (out["costs"].clone(), out["why"].clone())
    };
    tf.init();
    // 8 GPUs for 1000 s at 2.5 an hour: 5.555..., 5.56.
    assert_eq!(
        read(r#"["gpu_type", "class"]"#),
        (
            serde_json::json!([["guaranteed", GPUS * 1000, "5.56"]]),
            serde_json::json!("")
        )
    );
    let (costs, why) = read(r#"["class"]"#);
    assert_eq!(
        costs,
        serde_json::json!([["guaranteed", GPUS * 1000, null]])
    );
    assert_eq!(
        why,
        serde_json::json!("a price is per GPU model and class: group by gpu_type and class")
    );
}
