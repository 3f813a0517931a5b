//! The randomized concurrent checker (issue 41, `tests/src/checker.rs`) with a long
//! budget: clients of several tenants create, resize and delete reservations and clusters
//! over the gRPC API while `serve` is killed with `kill -9` every 1 to 4 s, then
//! `gpufleet-agent check` judges the store and every acknowledged answer; on SQLite (one
//! `serve`) and on PostgreSQL (three replicas, one of them killed at a time, the leader
//! as often as any, and every third fault the database server). The baseline of each, from the same run and seed: the same clients
//! without kills. Prints a table (operations,
//! acknowledged, refused, retried, kills, violations at the end and half-way while the
//! clients write, duration); nothing is asserted.
//!
//! `cargo bench -p gpufleet-e2e --bench invariants`; `BUDGET_S` (default 120) per row,
//! `TENANTS` (3) and `CLIENTS` (4 per tenant), `GPUFLEET_CHECKER_SEED` to rerun a seed
//! (binaries: `GPUFLEET_AGENT_BIN`, else `target/debug`).

use std::time::Duration;

use gpufleet_e2e::checker::{self, Engine, Outcome, Settings};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn row(name: &str, o: &Outcome) {
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
        o.operations,
        o.acknowledged,
        o.refused,
        o.retried,
        if o.database_kills > 0 {
            format!("{} ({} of the database)", o.kills, o.database_kills)
        } else {
            o.kills.to_string()
        },
        if !o.changing_left.is_empty() {
            format!("clusters left changing: {}", o.changing_left.join(", "))
        } else if o.check_passed {
            "0".to_string()
        } else if o.violations.is_empty() {
            format!("check failed: {}", o.check_output.trim())
        } else {
            o.violations.len().to_string()
        },
        if o.mid_run_passed { "0" } else { "see below" },
        o.duration.as_secs_f64()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; no other arguments are taken.
    let seed = checker::seed();
    let settings = Settings {
        seed,
        tenants: env_u64("TENANTS", 3) as usize,
        clients_per_tenant: env_u64("CLIENTS", 4) as usize,
        budget: Duration::from_secs(env_u64("BUDGET_S", 120)),
        kills_every: None,
        engine: Engine::Sqlite,
    };
    let kills = Some((Duration::from_secs(1), Duration::from_secs(4)));
    let postgres = Engine::Postgres { replicas: 3 };
    let mut rows = Vec::new();
    for (name, settings) in [
        ("SQLite, no kills (baseline)", settings),
        (
            "SQLite, kill -9 every 1-4 s",
            Settings {
                kills_every: kills,
                ..settings
            },
        ),
        (
            "PostgreSQL, 3 replicas, no kills",
            Settings {
                engine: postgres,
                ..settings
            },
        ),
        (
            "PostgreSQL, 3 replicas, kill -9 of one every 1-4 s (every third: the database server)",
            Settings {
                engine: postgres,
                kills_every: kills,
                ..settings
            },
        ),
    ] {
        rows.push((name, checker::run(settings).await));
    }
    println!();
    println!(
        "seed {seed}, {} tenants x {} clients, {} s per row",
        settings.tenants,
        settings.clients_per_tenant,
        settings.budget.as_secs()
    );
    println!();
    println!("| run | operations | acknowledged | refused | retried | kills | violations | half-way, while writing | duration (s) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, o) in &rows {
        row(name, o);
    }
    for (_, o) in &rows {
        for v in &o.violations {
            println!("{v}");
        }
        if !o.mid_run_passed {
            println!("half-way: {}", o.mid_run_output.trim());
        }
    }
}
