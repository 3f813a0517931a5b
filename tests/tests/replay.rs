//! `gpufleet-agent replay` as an operator runs it: the real binary on a small trace whose
//! outcome can be worked out by hand (docs/guides/replay.md), its table and its JSON, the
//! seeded synthetic trace, and malformed inputs refused with file, line and column before
//! anything runs.
//!
//! The fleet: 4 pool H100 nodes of 8 GPUs and 1 on-demand node; team a is guaranteed 16
//! GPUs with 24 burst and may use on-demand, team b is guaranteed 16. At 0 a asks for five
//! 8-GPU jobs of an hour; at 30 minutes b asks for one. Pooled, a's burst takes b's idle
//! guarantee and the on-demand node, so all five start at once, and b waits until they
//! end (nothing takes lent capacity back yet). In partitions a has 2 pool nodes and the
//! on-demand node: two of its jobs wait an hour, and b starts at once on its own nodes.

use std::path::Path;
use std::process::{Command, Output};

use gpufleet_e2e::binaries;
use serde_json::Value;

const FLEET: &str = r#"
[[pool]]
gpu_type = "H100-80GB"
nodes = 4

[[on_demand]]
gpu_type = "H100-80GB"
nodes = 1

[[team]]
name = "a"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 16, burst_gpus = 24 }]

[[team]]
name = "b"
quota = [{ gpu_type = "H100-80GB", gpus = 16 }]
"#;

const TRACE: &str = "team,gpu_type,gpus,submit,duration
a,H100-80GB,8,0,1h
a,H100-80GB,8,0,1h
a,H100-80GB,8,0,1h
a,H100-80GB,8,0,1h
a,H100-80GB,8,0,1h
b,H100-80GB,8,30m,1h
";

const PRICES: &str = "gpu_type,class,per_gpu_hour
H100-80GB,guaranteed,2
H100-80GB,burst,3
H100-80GB,on-demand,6
";

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn replay(args: &[&str]) -> Output {
    Command::new(binaries::agent())
        .arg("replay")
        .args(args)
        .output()
        .expect("gpufleet-agent runs")
}

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} in {v}"))
}

#[test]
fn pooling_lends_an_idle_guarantee_and_the_numbers_are_the_traces() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(dir.path(), "fleet.toml", FLEET);
    let trace = write(dir.path(), "trace.csv", TRACE);
    let prices = write(dir.path(), "prices.csv", PRICES);
    let out = replay(&[
        &trace, "--fleet", &fleet, "--prices", &prices, "--format", "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (p, b) = ("/pooled", "/partitions");
    assert_eq!(f(&r, "/horizon_seconds"), 7200.0);
    // Waits: pooled, a none and b 30 minutes; in partitions two of a's five wait an hour.
    for (path, want) in [
        ("/pooled/teams/0/wait_p95_seconds", 0.0),
        ("/pooled/teams/1/wait_p50_seconds", 1800.0),
        ("/partitions/teams/0/wait_p50_seconds", 0.0),
        ("/partitions/teams/0/wait_p95_seconds", 3600.0),
        ("/partitions/teams/1/wait_p50_seconds", 0.0),
        ("/pooled/wait_p95_seconds", 1800.0),
        ("/partitions/wait_p95_seconds", 3600.0),
    ] {
        assert_eq!(f(&r, path), want, "{path}");
    }
    for s in [p, b] {
        // 40 of the pool's 64 GPU-hours held; 8 on-demand GPU-hours; 48 held in all.
        assert_eq!(f(&r, &format!("{s}/pool_utilisation")), 40.0 / 64.0, "{s}");
        assert_eq!(f(&r, &format!("{s}/on_demand_gpu_hours")), 8.0, "{s}");
        assert_eq!(f(&r, &format!("{s}/held_gpu_hours")), 48.0, "{s}");
        assert_eq!(f(&r, &format!("{s}/admitted")), 6.0, "{s}");
        // Pooled: the second hour, 24 idle GPUs a and b are guaranteed. Partitions: b's 16
        // for half an hour on each side of its job, 8 while it runs.
        assert_eq!(
            f(&r, &format!("{s}/idle_guaranteed_gpu_hours")),
            24.0,
            "{s}"
        );
    }
    // Pooled, a held 16 guaranteed + 16 burst + 8 on-demand GPU-hours: 32 + 48 + 48.
    assert_eq!(f(&r, "/pooled/teams/0/burst_gpu_hours"), 16.0);
    assert_eq!(f(&r, "/pooled/teams/0/cost"), 128.0);
    assert_eq!(f(&r, "/partitions/teams/0/burst_gpu_hours"), 0.0);
    assert_eq!(f(&r, "/partitions/teams/0/cost"), 32.0 * 2.0 + 8.0 * 6.0);
    assert_eq!(f(&r, "/pooled/cost"), 128.0 + 16.0);
    assert_eq!(f(&r, "/pooled/teams/0/share"), 40.0 / 48.0);
    assert_eq!(f(&r, "/pooled/teams/1/guaranteed_share"), 0.5);

    // The table says the same.
    let out = replay(&[&trace, "--fleet", &fleet, "--prices", &prices]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for row in [
        "| measure | pooled | fixed partitions (baseline) |",
        "| pool GPU utilisation (held) | 62.5% | 62.5% |",
        "| wait p50 / p95 | 0s / 30m | 0s / 1.0h |",
        "| cost | 144.00 | 128.00 |",
        "| a | 16 (50.0%) | 5 | 0s / 0s | 0s / 1.0h |",
    ] {
        assert!(table.contains(row), "no `{row}` in:\n{table}");
    }
}

/// The guide's second example: b lends none of its idle guarantee
/// (`lending_limit_gpus = 0`, weight 3), and the trace says how busy a's jobs keep their
/// GPUs (half), b's job saying nothing (busy on all it asks for). Pooled, the control
/// plane's lending check holds a to the 16 GPUs b's guarantee does not keep: two of a's
/// jobs start at 0, two at 1 h, the last at 2 h, none on demand (a job that would borrow
/// pool GPUs is refused whole, as a cluster would be), and b starts at once.
#[test]
fn a_lending_limit_keeps_bs_guarantee_and_used_gpus_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(
        dir.path(),
        "fleet.toml",
        &FLEET.replace(
            "gpus = 16 }]",
            "gpus = 16, weight = 3, lending_limit_gpus = 0 }]",
        ),
    );
    assert!(std::fs::read_to_string(&fleet)
        .unwrap()
        .contains("lending_limit_gpus = 0"));
    let used = TRACE
        .replace("duration\n", "duration,used\n")
        .replace("1h\na", "1h,0.5\na")
        .replace("1h\nb", "1h,0.5\nb")
        .replace("30m,1h\n", "30m,1h,\n");
    let trace = write(dir.path(), "trace.csv", &used);
    let out = replay(&[&trace, "--fleet", &fleet, "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (path, want) in [
        ("/summary/used_reported", 5.0),
        ("/horizon_seconds", 10_800.0),
        ("/pooled/teams/1/wait_p95_seconds", 0.0),
        ("/pooled/teams/0/wait_p50_seconds", 3600.0),
        ("/pooled/teams/0/wait_p95_seconds", 7200.0),
        ("/pooled/on_demand_gpu_hours", 0.0),
        // a's 40 GPU-hours half busy, b's 8 busy; all on the pool's 32 GPUs for 3 h.
        ("/pooled/used_gpu_hours", 28.0),
        ("/pooled/pool_used_utilisation", 28.0 / 96.0),
        ("/pooled/pool_utilisation", 48.0 / 96.0),
        // Partitions: a's third job on its on-demand node at 0, so 16 of its 20 busy
        // GPU-hours are on the pool.
        ("/partitions/used_gpu_hours", 28.0),
        ("/partitions/pool_used_utilisation", 24.0 / 96.0),
        // No one held pool GPUs beyond a guarantee.
        ("/pooled/borrowed_gpu_hours", 0.0),
    ] {
        assert_eq!(f(&r, path), want, "{path}");
    }
    assert!(r
        .pointer("/pooled/teams/0/weighted_fair_share")
        .unwrap()
        .is_null());
    let table = replay(&[&trace, "--fleet", &fleet]);
    let table = String::from_utf8(table.stdout).unwrap();
    for row in [
        "| pool GPU utilisation (used) | 29.2% | 25.0% |",
        "| GPU-hours used | 28.0 | 28.0 |",
        "1 without a used fraction, busy on every GPU they ask for",
    ] {
        assert!(table.contains(row), "no `{row}` in:\n{table}");
    }
}

/// The fair-share example (`examples/replay/fair-share-*`, the guide's third table): a and
/// b each borrow 8 of c's idle guarantee; when c's job ends, b (weight 3, 8 / 3 borrowed
/// per weight) gets the freed node before a (8 / 1), though a asked first.
#[test]
fn the_fair_share_example_gives_the_freed_node_to_the_heavier_team() {
    let examples = binaries::workspace_root().join("examples/replay");
    let path = |name: &str| examples.join(name).to_string_lossy().into_owned();
    let out = replay(&[
        &path("fair-share-trace.csv"),
        "--fleet",
        &path("fair-share-fleet.toml"),
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (path, want) in [
        // a's fourth job (10 minutes) waits to 2 h, b's (20 minutes) to 1 h.
        ("/pooled/teams/0/wait_p95_seconds", 6600.0),
        ("/pooled/teams/1/wait_p95_seconds", 2400.0),
        ("/pooled/borrowed_gpu_hours", 40.0),
        ("/pooled/teams/0/borrowed_share", 0.4),
        ("/pooled/teams/0/weighted_fair_share", 0.25),
        ("/pooled/teams/1/borrowed_share", 0.6),
        ("/pooled/teams/1/weighted_fair_share", 0.75),
        // 0.9 of a's 56 GPU-hours, 0.6 of b's 56, c's 8: 50.4 + 33.6 + 8.
        ("/pooled/used_gpu_hours", 92.0),
    ] {
        let got = f(&r, path);
        assert!((got - want).abs() < 1e-9, "{path}: {got} != {want}");
    }
}

#[test]
fn a_synthetic_trace_replays_and_every_job_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(dir.path(), "fleet.toml", FLEET);
    let out = Command::new(binaries::agent())
        .args([
            "replay-synthetic",
            "--fleet",
            &fleet,
            "--rows",
            "300",
            "--seed",
            "42",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = write(
        dir.path(),
        "synthetic.csv",
        &String::from_utf8(out.stdout).unwrap(),
    );
    let out = replay(&[&trace, "--fleet", &fleet, "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every synthetic job fits its team's quota, so both scenarios admit all 300, and
    // the GPUs they hold are the same.
    for s in ["/pooled", "/partitions"] {
        assert_eq!(f(&r, &format!("{s}/admitted")), 300.0, "{s}");
    }
    assert_eq!(
        f(&r, "/pooled/held_gpu_hours"),
        f(&r, "/partitions/held_gpu_hours")
    );
}

/// The first rows of Alibaba's `openb_pod_list_default.csv`, with the example fleet
/// (`examples/replay`): a CPU-only pod and a pending one are left out, GPU-sharing pods
/// get a whole GPU, and every team the names hash to is one of the fleet's.
#[test]
fn an_alibaba_pod_list_replays_with_the_example_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let pods = write(
        dir.path(),
        "openb_pod_list_default.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061
openb-pod-0005,20000,65536,0,0,,LS,Running,2759674,12902960,2759676
openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497
openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,
",
    );
    let examples = binaries::workspace_root().join("examples/replay");
    let fleet = examples.join("alibaba-fleet.toml");
    let prices = examples.join("prices.csv");
    let out = replay(&[
        &pods,
        "--fleet",
        fleet.to_str().unwrap(),
        "--prices",
        prices.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r.pointer("/summary/layout").and_then(Value::as_str),
        Some("alibaba")
    );
    for (path, want) in [
        ("/summary/rows", 5.0),
        ("/summary/skipped_without_gpus", 1.0),
        ("/summary/skipped_never_ran", 1.0),
        ("/summary/shared_gpu_rounded_up", 1.0),
        ("/pooled/admitted", 3.0),
        ("/partitions/admitted", 3.0),
        // Pod 0000 from 0 to 12537496 s, 0001 from 427061 to 12902960 s, 0017's 8 GPUs
        // from 9437497 to 10769854 s: every GPU-second held, in hours.
        (
            "/pooled/held_gpu_hours",
            (12_537_496.0 + (12_902_960.0 - 427_061.0) + 8.0 * (10_769_854.0 - 9_437_497.0))
                / 3600.0,
        ),
    ] {
        let got = f(&r, path);
        assert!((got - want).abs() < 1e-6, "{path}: {got} != {want}");
    }
}

#[test]
fn malformed_inputs_are_refused_with_file_line_and_column_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(dir.path(), "fleet.toml", FLEET);
    let trace = write(dir.path(), "trace.csv", TRACE);
    let cases = [
        (
            write(
                dir.path(),
                "bad-fleet.toml",
                &FLEET.replace("nodes = 4", "nodes = -4"),
            ),
            trace.clone(),
            None,
            "bad-fleet.toml:4:9: pool.nodes: 1 to 100000 (got -4)",
        ),
        (
            fleet.clone(),
            write(
                dir.path(),
                "bad-trace.csv",
                &TRACE.replace("b,H100-80GB,8,30m", "b,H100-80GB,8,soon"),
            ),
            None,
            "bad-trace.csv:7:4: submit:",
        ),
        (
            fleet.clone(),
            trace.clone(),
            Some(write(
                dir.path(),
                "bad-prices.csv",
                &PRICES.replace("burst,3", "burst,three"),
            )),
            "bad-prices.csv:3:3: per_gpu_hour:",
        ),
        (
            write(
                dir.path(),
                "bad-weight.toml",
                &FLEET.replace("gpus = 16 }]", "gpus = 16, weight = 0 }]"),
            ),
            trace.clone(),
            None,
            "bad-weight.toml:17:56: team.quota.weight: 1 to 1000 (got 0)",
        ),
        (
            fleet.clone(),
            write(
                dir.path(),
                "bad-used.csv",
                &TRACE
                    .replace("duration\n", "duration,used\n")
                    .replace("1h\n", "1h,0.5\n")
                    .replace("30m,1h,0.5", "30m,1h,150%"),
            ),
            None,
            "bad-used.csv:7:6: used: the fraction of the job's GPUs it keeps busy, 0 to 1 (got '150%')",
        ),
    ];
    for (fleet, trace, prices, want) in cases {
        let mut args = vec![trace.as_str(), "--fleet", fleet.as_str()];
        if let Some(p) = &prices {
            args.extend(["--prices", p.as_str()]);
        }
        let out = replay(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{want}: it ran");
        assert!(
            out.stdout.is_empty(),
            "{want}: printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(stderr.contains(want), "{want} not in: {stderr}");
    }
}
