//! The replay of issue 42 measured: `gpufleet-agent replay` (release build:
//! `$GPUFLEET_AGENT_BIN`, else `target/release/gpufleet-agent`) on seeded synthetic traces
//! of 10,000 rows (the same run's baseline) and `ROWS` rows (default 100,000) against a
//! 64-node fleet of four teams (weights 3, 2, 1 and 1, one lending at most half its
//! guarantee, so the fair-share order and the lending check are in the measure), a
//! 10,000-row synthetic trace on the same fleet whose pool lists MIG profiles (a quarter
//! of its jobs ask for 1g.10gb or 3g.40gb instances), and on any trace given on the
//! command line. Prints each
//! replay's table (pooled beside fixed partitions) and the rows per second of each run,
//! wall clock of the whole command (reading, both replays, the measures); nothing is
//! asserted.
//!
//! `cargo build --release -p gpufleet-agent --bins && cargo bench -p gpufleet-e2e --bench replay [-- TRACE FLEET [PRICES]]`
//! Environment: `ROWS` (default 100000), `SEED` (default 1).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

const FLEET: &str = r#"
[[pool]]
gpu_type = "H100-80GB"
nodes = 64

[[on_demand]]
gpu_type = "H100-80GB"
nodes = 16

[[team]]
name = "vision"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 192, burst_gpus = 192, weight = 3 }]

[[team]]
name = "nlp"
allow_on_demand = true
quota = [{ gpu_type = "H100-80GB", gpus = 128, burst_gpus = 128, weight = 2 }]

[[team]]
name = "speech"
quota = [{ gpu_type = "H100-80GB", gpus = 128, burst_gpus = 64 }]

[[team]]
name = "research"
quota = [{ gpu_type = "H100-80GB", gpus = 64, burst_gpus = 128, lending_limit_gpus = 32 }]
"#;

const PRICES: &str = "gpu_type,class,per_gpu_hour
H100-80GB,guaranteed,2.00
H100-80GB,burst,2.00
H100-80GB,on-demand,6.50
";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn synthetic(agent: &Path, fleet: &Path, rows: u64, seed: u64, into: &Path) {
    let out = Command::new(agent)
        .args(["replay-synthetic", "--fleet"])
        .arg(fleet)
        .args(["--rows", &rows.to_string(), "--seed", &seed.to_string()])
        .output()
        .expect("gpufleet-agent runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(into, out.stdout).unwrap();
}

/// Runs one replay; prints its table; returns (rows, wall seconds).
fn replay(agent: &Path, trace: &Path, fleet: &Path, prices: Option<&Path>) -> (usize, f64) {
    let rows = std::fs::read_to_string(trace)
        .map(|t| t.lines().skip(1).filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);
    let mut command = Command::new(agent);
    command.arg("replay").arg(trace).arg("--fleet").arg(fleet);
    if let Some(p) = prices {
        command.arg("--prices").arg(p);
    }
    let began = Instant::now();
    let out = command.output().expect("gpufleet-agent runs");
    let wall = began.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", String::from_utf8_lossy(&out.stdout));
    (rows, wall)
}

fn main() {
    // `cargo bench` passes `--bench`; what follows `--` is TRACE FLEET [PRICES].
    let given: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let agent = gpufleet_e2e::binaries::release_agent();
    assert!(
        agent.is_file(),
        "build it first: cargo build --release -p gpufleet-agent --bins ({})",
        agent.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.toml");
    let prices = dir.path().join("prices.csv");
    std::fs::write(&fleet, FLEET).unwrap();
    std::fs::write(&prices, PRICES).unwrap();
    let rows = env_u64("ROWS", 100_000);
    let seed = env_u64("SEED", 1);
    let mut runs: Vec<(String, usize, f64)> = Vec::new();
    for n in [10_000, rows] {
        let trace = dir.path().join(format!("synthetic-{n}.csv"));
        synthetic(&agent, &fleet, n, seed, &trace);
        println!("### Synthetic trace, {n} rows, seed {seed} (64 pool + 16 on-demand H100 nodes, 4 teams)\n");
        let (r, wall) = replay(&agent, &trace, &fleet, Some(&prices));
        runs.push((format!("synthetic, seed {seed}"), r, wall));
    }
    // The same fleet whose pool may be cut into MIG instances.
    let mig_fleet = dir.path().join("fleet-mig.toml");
    std::fs::write(
        &mig_fleet,
        FLEET.replacen(
            "nodes = 64\n",
            "nodes = 64\nmig_profiles = [\"1g.10gb\", \"3g.40gb\"]\n",
            1,
        ),
    )
    .unwrap();
    let trace = dir.path().join("synthetic-mig.csv");
    synthetic(&agent, &mig_fleet, 10_000, seed, &trace);
    println!("### Synthetic trace with MIG rows, 10000 rows, seed {seed} (the same fleet, its pool's MIG profiles 1g.10gb and 3g.40gb)\n");
    let (r, wall) = replay(&agent, &trace, &mig_fleet, Some(&prices));
    runs.push((format!("synthetic with MIG rows, seed {seed}"), r, wall));
    if let [trace, fleet, rest @ ..] = given.as_slice() {
        println!("### {trace} on {fleet}\n");
        let (r, wall) = replay(
            &agent,
            Path::new(trace),
            Path::new(fleet),
            rest.first().map(Path::new),
        );
        runs.push((trace.clone(), r, wall));
    }
    let baseline = runs[0].1 as f64 / runs[0].2;
    // For scripts/bench.sh: the ROWS run against the 10,000-row run.
    let (r, wall) = (runs[1].1, runs[1].2);
    println!(
        "BENCH rows={r} rows_per_s={:.0} wall_s={wall:.1} baseline_rows={} baseline_rows_per_s={baseline:.0}\n",
        r as f64 / wall,
        runs[0].1
    );
    println!("Replay speed: wall clock of `gpufleet-agent replay` (read, replay pooled and partitioned, measure); baseline: the 10,000-row run\n");
    println!("| trace | rows | wall | rows/s | vs 10,000 rows |");
    println!("|---|---|---|---|---|");
    for (name, r, wall) in &runs {
        let per_second = *r as f64 / wall;
        println!(
            "| {name} | {r} | {wall:.1} s | {per_second:.0} | {:.2}x |",
            per_second / baseline
        );
    }
}
