//! What pooling buys, measured: `gpufleet-agent replay` drives the control plane's own
//! admission with a demand trace on a clock it controls, once with the fleet pooled (the
//! teams' quotas over one pool) and once cut into fixed per-team partitions (each team's
//! guarantee as its own pool: [`partitions`]), and reports utilisation (held and used),
//! waits, on-demand hours, cost and each team's share of borrowed capacity against its
//! weighted fair share beside each other ([`measures`], [`render`]). The teams' weights
//! and lending limits act through the control plane's fair-sharing code
//! (`scheduling::sharing`): [`admission`], [`replay`].
//!
//! Architecture invariant: admission is the control plane's (`gpufleet-control`'s
//! scheduling over its store); this crate repeats none of its rules. It depends on the
//! control plane, never on the node agent, and the control plane knows nothing of it.

pub mod admission;
pub mod csv;
pub mod fleet;
pub mod located;
pub mod measures;
pub mod mig;
pub mod partitions;
pub mod prices;
pub mod render;
pub mod replay;
pub mod synthetic;
pub mod trace;

use std::path::PathBuf;
use std::time::Instant;

use crate::admission::Admission;
use crate::measures::Scenario;

/// What a replay reads.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub trace: PathBuf,
    pub fleet: PathBuf,
    pub prices: Option<PathBuf>,
}

/// A replay's result: both scenarios over the same horizon.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub trace: PathBuf,
    pub fleet: PathBuf,
    pub prices: Option<PathBuf>,
    pub summary: trace::Trace,
    pub models: Vec<fleet::Model>,
    pub horizon_seconds: i64,
    pub pooled: Scenario,
    pub partitions: Scenario,
    /// Wall time of both replays (seconds), and jobs replayed per second (both
    /// scenarios count each job once).
    pub replay_seconds: f64,
    pub rows_per_second: f64,
}

/// Reads and checks every input (a refusal names file, line and column) before anything
/// runs, then replays the trace pooled and partitioned.
pub fn run(inputs: &Inputs) -> anyhow::Result<Report> {
    let fleet = fleet::load(&inputs.fleet)?;
    let trace = trace::load(&inputs.trace, &fleet)?;
    let prices = match &inputs.prices {
        Some(p) => prices::load(p, &fleet)?,
        None => prices::Prices::default(),
    };
    let began = Instant::now();
    let all: Vec<usize> = (0..trace.jobs.len()).collect();
    let mut pooled_store = Admission::open(&fleet, replay::EPOCH)?;
    let pooled = replay::run(&mut pooled_store, &trace.jobs, &all)?;
    drop(pooled_store);
    let mut partitioned = vec![replay::Outcome::default(); trace.jobs.len()];
    for team in 0..fleet.teams.len() {
        let mine: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&j| trace.jobs[j].team == team)
            .collect();
        if mine.is_empty() {
            continue;
        }
        // One team's partition is a fleet of one team: its jobs are team 0 there.
        let jobs: Vec<trace::Job> = mine
            .iter()
            .map(|&j| trace::Job {
                team: 0,
                ..trace.jobs[j].clone()
            })
            .collect();
        let own: Vec<usize> = (0..jobs.len()).collect();
        let mut store = Admission::open(&partitions::of(&fleet, team), replay::EPOCH)?;
        for (k, outcome) in replay::run(&mut store, &jobs, &own)?
            .into_iter()
            .enumerate()
        {
            partitioned[mine[k]] = outcome;
        }
    }
    let replay_seconds = began.elapsed().as_secs_f64();
    let horizon = measures::horizon(&trace.jobs, &[&pooled, &partitioned]);
    Ok(Report {
        trace: inputs.trace.clone(),
        fleet: inputs.fleet.clone(),
        prices: inputs.prices.clone(),
        models: fleet.models.clone(),
        horizon_seconds: horizon,
        pooled: measures::measure(&fleet, &trace.jobs, &pooled, horizon, &prices),
        partitions: measures::measure(&fleet, &trace.jobs, &partitioned, horizon, &prices),
        rows_per_second: if replay_seconds > 0.0 {
            trace.jobs.len() as f64 / replay_seconds
        } else {
            0.0
        },
        replay_seconds,
        summary: trace,
    })
}

#[cfg(test)]
mod tests {
    /// MIG slices through the whole replay (files, both scenarios, measures). Two 8-GPU
    /// H100 pool nodes; a is guaranteed 8 with 8 burst, b 8. a asks at 0 for ten 1g.10gb
    /// (7 fit a GPU: 2 GPUs, so one whole node, as the control plane holds a MIG
    /// cluster) and for 8 whole GPUs, each for an hour; b at 30 minutes for three
    /// 3g.40gb (2 fit a GPU: 2 GPUs, one node) for an hour.
    /// Pooled: a's two jobs take both nodes at 0 (the second borrows b's idle guarantee)
    /// and b waits until 1 h. Partitioned: a's node runs its first job (the slices, line 2)
    /// and its second waits until 1 h; b's own node runs b's job at 30 minutes.
    /// Either way each job holds 8 GPUs for an hour (24 GPU-hours held) and the jobs ask
    /// for 10/7 + 8 + 3/2 = 10.93 GPU-hours, of which 13 instance-hours are MIG, 10/7 +
    /// 3/2 = 2.93 GPU-equivalent hours; waits: pooled 0, 0, 30 m (p95 30 m),
    /// partitioned 0, 1 h, 0 (p95 1 h).
    #[test]
    fn mig_slices_are_held_as_whole_nodes_pooled_and_partitioned() {
        let dir = tempfile::tempdir().unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(
            &fleet,
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 2\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 8, burst_gpus = 8 }]\n\
             [[team]]\nname = \"b\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 8 }]\n",
        )
        .unwrap();
        let trace = dir.path().join("trace.csv");
        std::fs::write(
            &trace,
            "team,gpu_type,gpus,submit,duration,mig_profile\n\
             a,H100-80GB,10,0,1h,1g.10gb\n\
             a,H100-80GB,8,0,1h,\n\
             b,H100-80GB,3,30m,1h,3g.40gb\n",
        )
        .unwrap();
        let report = crate::run(&crate::Inputs {
            trace,
            fleet,
            prices: None,
        })
        .unwrap();
        assert_eq!(report.summary.mig_jobs, 2);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        for (name, s, waits) in [
            ("pooled", &report.pooled, (Some(0), Some(1800))),
            ("partitions", &report.partitions, (Some(0), Some(3600))),
        ] {
            assert!(close(s.held_gpu_hours, 24.0), "{name}: {s:?}");
            assert!(
                close(s.asked_gpu_hours, 10.0 / 7.0 + 8.0 + 1.5),
                "{name}: {s:?}"
            );
            assert!(close(s.used_gpu_hours, s.asked_gpu_hours), "{name}: {s:?}");
            assert!(close(s.mig_slice_hours, 13.0), "{name}: {s:?}");
            assert!(
                close(s.mig_gpu_equivalent_hours, 10.0 / 7.0 + 1.5),
                "{name}: {s:?}"
            );
            assert_eq!(
                (s.admitted, s.wait_p50_seconds, s.wait_p95_seconds),
                (3, waits.0, waits.1),
                "{name}"
            );
        }
        let table = crate::render::table(&report);
        assert!(
            table.contains(
                "| MIG instance-hours asked (GPU-equivalent hours) | 13.0 (2.9) | 13.0 (2.9) |"
            ),
            "{table}"
        );
        assert!(table.contains("2 asking for MIG instances"), "{table}");
    }
}
