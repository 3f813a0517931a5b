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
