//! How long each health level takes on simulated nodes, load tests included: the quick
//! level's reads, and the medium and long levels' memory patterns, GEMM burn (read under
//! load), bandwidths and (long) all-reduce, on an 8-GPU H100 node and on an H200 cut into
//! MIG slices. A benchmark, not a timed test: it prints a table and asserts only that a
//! healthy node passes.
//!
//! The simulator scales time (1/1000 by default: a 10 s burn runs 10 ms), so the
//! "simulated" column is what CI pays per node; the "planned" column is the burn the
//! level asks of a real GPU (every GPU and slice of a node burns at once).
//!
//! Run: `cargo bench -p gpufleet-node --bench load_levels`.

use std::sync::Arc;
use std::time::Instant;

use gpufleet_gpu::catalog;
use gpufleet_gpu::hardware::{GpuBackend, SimulatedNode};
use gpufleet_gpu::load::SimRunner;
use gpufleet_node::health::{self, load, Level, Plan};

fn node(model: &str, gpus: u32, mig: bool) -> Arc<SimulatedNode> {
    let m = catalog::model(model).expect("catalog model");
    let n = Arc::new(SimulatedNode::new("bench", m, gpus, "580.159.04"));
    if mig {
        for g in 0..gpus {
            n.set_mig_mode(g, true).expect("MIG on");
            for start in [0, 2, 4, 6] {
                n.create_instance(g, 15, start).expect("1g.35gb");
            }
        }
    }
    n
}

fn main() {
    let rounds = 5;
    println!(
        "{:<26} {:<7} {:>7} {:>14} {:>12} {:>8}",
        "node", "level", "checks", "simulated ms", "planned burn", "failed"
    );
    for (label, model, gpus, mig) in [
        ("H100-80GB x 8", "H100-80GB", 8, false),
        ("H200-141GB x 2, 4 slices", "H200-141GB", 2, true),
    ] {
        let n = node(model, gpus, mig);
        let runner = SimRunner::new(n.clone());
        for level in [Level::Quick, Level::Medium, Level::Long] {
            let plan = Plan {
                level,
                driver: Ok("580.159.04".into()),
                expected_driver: None,
                expected_layout: &[],
                simulated: true,
            };
            let settings = load::Settings::default();
            let mut best = f64::MAX;
            let mut checks = Vec::new();
            for _ in 0..rounds {
                let t = Instant::now();
                checks = health::run(&*n, model, &plan);
                checks.extend(load::run(
                    level,
                    &settings,
                    &runner,
                    &*n as &dyn GpuBackend,
                    catalog::model(model),
                    7,
                ));
                best = best.min(t.elapsed().as_secs_f64() * 1000.0);
            }
            let failed = checks.iter().filter(|c| c.verdict == "fail").count();
            let planned = load::plan(level, &settings, 7)
                .map(|p| format!("{} s", p.burn.as_secs()))
                .unwrap_or_else(|| "none".into());
            println!(
                "{label:<26} {:<7} {:>7} {best:>14.1} {planned:>12} {failed:>8}",
                level.as_str(),
                checks.len()
            );
            assert_eq!(failed, 0, "a healthy simulated node passes");
        }
    }
}
