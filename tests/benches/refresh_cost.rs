//! What refreshing costs a plan (issue 21): one real backend and the real provider, a
//! configuration of `RESOURCES` mixed resources (per team: a tenant, a quota, a
//! one-node Kubernetes cluster and reservations), applied once. Then `ROUNDS` alternating
//! rounds of `terraform plan` and `terraform plan -refresh=false` on the same state: the
//! second is the same run's baseline (everything but the reads). Alternating puts what
//! else the machine does on both sides alike. Prints the medians and their ratio, and the
//! backend's own latency per read method over the refreshing plans; nothing is asserted.
//!
//! `cargo build -p gpufleet-agent -p terraform-provider-gpufleet --bins && cargo bench -p gpufleet-e2e --bench refresh_cost`
//! (`GPUFLEET_AGENT_BIN`, `GPUFLEET_PROVIDER_BIN` and `TERRAFORM_BIN` as for the e2e tests.)
//! Environment: `RESOURCES` (default 200), `ROUNDS` (per side, default 5), `PARALLELISM`
//! (Terraform's `-parallelism`, default 10 as Terraform's).

use std::time::{Duration, Instant};

use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{prom, Backend, Terraform};

/// Teams the resources are spread over; each has one cluster on one node of its own.
const TEAMS: usize = 20;
const GPU_TYPE: &str = "H100-80GB";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `resources` blocks: per team a tenant, a quota and a cluster, then reservations
/// round-robin over the teams, each in a window of its own in the next years.
fn configuration(resources: usize) -> String {
    let mut blocks: Vec<Block> = Vec::new();
    for t in 0..TEAMS {
        let tenant = format!("gpufleet_tenant.t{t}.id");
        blocks.push(hcl::tenant(&format!("t{t}"), &format!("team-{t}")));
        blocks.push(hcl::quota(&format!("q{t}"), &tenant, GPU_TYPE, 16));
        blocks.push(
            hcl::pool_cluster(&format!("c{t}"), &tenant, "train", GPU_TYPE, 1)
                .depends_on(&[&format!("gpufleet_gpu_quota.q{t}")]),
        );
    }
    let reservations = resources.saturating_sub(blocks.len());
    for r in 0..reservations {
        let t = r % TEAMS;
        // One day each, a week apart per team: no two of a team's overlap.
        let day = 30 + (r / TEAMS) * 7;
        let hours = day as i64 * 24;
        let (start, end) = (rfc3339_in_hours(hours), rfc3339_in_hours(hours + 24));
        blocks.push(
            hcl::reservation(
                &format!("r{r}"),
                &format!("gpufleet_tenant.t{t}.id"),
                GPU_TYPE,
                1,
                &start,
                &end,
            )
            .depends_on(&[&format!("gpufleet_gpu_quota.q{t}")]),
        );
    }
    hcl::config(&blocks)
}

/// CPU seconds (user + system) from a /proc/PID/stat line: the process's own, and its
/// waited-for children's (Terraform and the provider it starts).
fn cpu_seconds(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime is field 14 of the line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let tick = 100.0; // USER_HZ on Linux
    let at = |i: usize| f.get(i - 3).copied().unwrap_or(0.0) / tick;
    (at(14) + at(15), at(16) + at(17))
}

/// The CPU the backend and this process's children spent while `run` ran.
struct Cpu {
    backend: f64,
    terraform_and_provider: f64,
}

fn cpu_of(backend_pid: &str, run: impl FnOnce()) -> Cpu {
    let (b0, _) = cpu_seconds(backend_pid);
    let (_, c0) = cpu_seconds("self");
    run();
    let (b1, _) = cpu_seconds(backend_pid);
    let (_, c1) = cpu_seconds("self");
    Cpu {
        backend: b1 - b0,
        terraform_and_provider: c1 - c0,
    }
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// The backend's request latency histogram: (method, count, sum in seconds) per read
/// method, from its /metrics.
fn read_latencies(metrics: &str) -> Vec<(String, f64, f64)> {
    let mut out: Vec<(String, f64, f64)> = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("gpufleet_api_request_seconds_") else {
            continue;
        };
        let (kind, rest) = match rest.split_once('{') {
            Some(x) => x,
            None => continue,
        };
        if kind != "sum" && kind != "count" {
            continue;
        }
        let Some(method) = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("method=\""))
            .and_then(|m| m.split('"').next())
        else {
            continue;
        };
        let short = method.rsplit('/').next().unwrap_or(method);
        if !(short.starts_with("Get") || short.starts_with("List")) {
            continue;
        }
        let value: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let entry = match out.iter_mut().find(|(m, _, _)| m == method) {
            Some(e) => e,
            None => {
                out.push((method.to_string(), 0.0, 0.0));
                out.last_mut().unwrap()
            }
        };
        if kind == "count" {
            entry.1 += value;
        } else {
            entry.2 += value;
        }
    }
    out
}

fn main() {
    let resources = env_usize("RESOURCES", 200);
    let rounds = env_usize("ROUNDS", 5);
    let backend = Backend::start_with_fleet_and_args(
        &format!(
            "[[pool]]\ngpu_type = \"{GPU_TYPE}\"\nnodes = {}\n",
            TEAMS * 2 + 4
        ),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = prom::wait_for_metrics_addr("the backend", || backend.log());
    let metrics_token = std::fs::read_to_string(backend.data_dir().join("metrics.token"))
        .expect("the backend's metrics token");
    let scrape = || prom::scrape_with(&metrics, metrics_token.trim());
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&configuration(resources));
    tf.init();
    let applied = Instant::now();
    tf.apply();
    eprintln!(
        "applied {resources} resources in {:.1} s",
        applied.elapsed().as_secs_f64()
    );
    tf.assert_no_changes();

    let before = scrape();
    let parallelism = format!("-parallelism={}", env_usize("PARALLELISM", 10));
    let plan = ["plan", "-input=false", "-detailed-exitcode", &parallelism];
    let pid = backend.pid().expect("the backend runs").to_string();
    let (mut refreshing, mut baseline) = (Vec::new(), Vec::new());
    let (mut cpu_refreshing, mut cpu_baseline) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        cpu_refreshing.push(cpu_of(&pid, || {
            tf.run_ok(&plan);
        }));
        refreshing.push(t.elapsed());
        let t = Instant::now();
        cpu_baseline.push(cpu_of(&pid, || {
            tf.run_ok(&[&plan[..], &["-refresh=false"]].concat());
        }));
        baseline.push(t.elapsed());
    }
    let after = scrape();

    let (r, b) = (median(refreshing), median(baseline));
    println!(
        "\nplan of {resources} resources ({parallelism}), median of {rounds} alternating rounds"
    );
    println!("| plan | median | vs -refresh=false |");
    println!("|---|---|---|");
    println!("| -refresh=false (baseline) | {} | 1.00x |", ms(b));
    println!(
        "| refreshing | {} | {:.2}x |",
        ms(r),
        r.as_secs_f64() / b.as_secs_f64()
    );
    println!(
        "\nBENCH refresh resources={resources} rounds={rounds} refresh_s={:.3} baseline_s={:.3}",
        r.as_secs_f64(),
        b.as_secs_f64()
    );
    let mean = |xs: &[Cpu], f: fn(&Cpu) -> f64| xs.iter().map(f).sum::<f64>() / xs.len() as f64;
    println!("\nCPU per plan (mean), seconds");
    println!("| plan | backend | terraform + provider |");
    println!("|---|---|---|");
    for (name, xs) in [
        ("-refresh=false", &cpu_baseline),
        ("refreshing", &cpu_refreshing),
    ] {
        println!(
            "| {name} | {:.3} | {:.3} |",
            mean(xs, |c| c.backend),
            mean(xs, |c| c.terraform_and_provider)
        );
    }
    println!("\nbackend latency per read over all {} plans", 2 * rounds);
    println!("| method | calls | mean |");
    println!("|---|---|---|");
    let old = read_latencies(&before);
    for (method, count, sum) in read_latencies(&after) {
        let (c0, s0) = old
            .iter()
            .find(|(m, _, _)| *m == method)
            .map(|(_, c, s)| (*c, *s))
            .unwrap_or((0.0, 0.0));
        let (calls, secs) = (count - c0, sum - s0);
        if calls > 0.0 {
            println!("| {method} | {calls:.0} | {:.2} ms |", secs / calls * 1e3);
        }
    }
}
