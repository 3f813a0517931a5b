//! What a replay's outcomes come to: GPU-hours held by class, the pool's utilisation,
//! idle-but-guaranteed GPU-hours, waits, on-demand hours, cost and each team's share.
//! Pure arithmetic over the jobs and their outcomes; every scenario (pooled, partitions)
//! is measured over the same horizon and against the same fleet.
//!
//! At each instant, a team's pool GPUs of a model count as `guaranteed` up to its
//! guarantee and `burst` beyond it; on-demand GPUs are `on-demand`. Idle-but-guaranteed
//! GPUs are the pool's idle GPUs that some team is guaranteed and not using:
//! `min(sum over teams of max(0, guarantee - held), pool GPUs - held)`.
//!
//! GPUs *used* are what the trace says its jobs keep busy ([`Job::busy_gpus`]: the asked
//! GPUs times the job's `used` fraction, all asked GPUs when it does not say); a job's
//! busy GPUs are on the pool in proportion to its pool nodes among all its nodes.
//!
//! A job of MIG instances asks for their GPU-equivalent ([`Job::demand_gpus`]: the part
//! of GPUs they fill, `crate::mig`), in *asked* and *used* alike; what it holds is the
//! whole nodes the control plane gave it, as for any job. Every scenario counts them the
//! same way, so the pooled and partitioned columns compare.
//!
//! Each team's *weighted fair share of borrowing*: each model's borrowed GPU-hours (pool
//! GPUs held beyond a guarantee: the `burst` class) divided among the teams whose quota of
//! it lets them borrow (`burst_gpus` above 0) in proportion to their `weight`, summed
//! over models, over all borrowed GPU-hours; beside it, the team's actual share of them.

use std::collections::BTreeMap;

use crate::fleet::Fleet;
use crate::prices::{Class, Prices};
use crate::replay::Outcome;
use crate::trace::Job;

const HOUR: f64 = 3_600.0;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Scenario {
    /// Pool GPU-hours held over the pool's GPU-hours in the horizon (0 to 1).
    pub pool_utilisation: f64,
    /// Pool GPU-hours used (busy) over the pool's GPU-hours in the horizon (0 to 1).
    pub pool_used_utilisation: f64,
    pub held_gpu_hours: f64,
    /// GPU-hours the admitted jobs kept busy, pool and on-demand.
    pub used_gpu_hours: f64,
    /// Pool GPU-hours held beyond the teams' guarantees (every team's burst).
    pub borrowed_gpu_hours: f64,
    /// What the admitted jobs asked for (a job holds whole nodes), MIG instances in
    /// GPU-equivalents.
    pub asked_gpu_hours: f64,
    /// Of those, what the admitted jobs of MIG instances asked for: instance-hours, and
    /// their GPU-equivalent hours.
    pub mig_slice_hours: f64,
    pub mig_gpu_equivalent_hours: f64,
    pub idle_guaranteed_gpu_hours: f64,
    pub on_demand_gpu_hours: f64,
    pub cost: f64,
    /// Held GPU-hours of a (model, class) the price list has no row for.
    pub unpriced_gpu_hours: f64,
    pub jobs: usize,
    pub admitted: usize,
    pub never_admitted: usize,
    pub wait_p50_seconds: Option<i64>,
    pub wait_p95_seconds: Option<i64>,
    pub teams: Vec<TeamMeasures>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TeamMeasures {
    pub team: String,
    /// Guaranteed GPUs over every model.
    pub guaranteed_gpus: i64,
    pub jobs: usize,
    pub never_admitted: usize,
    pub wait_p50_seconds: Option<i64>,
    pub wait_p95_seconds: Option<i64>,
    pub guaranteed_gpu_hours: f64,
    pub burst_gpu_hours: f64,
    pub on_demand_gpu_hours: f64,
    /// Its share of every GPU-hour held (0 to 1).
    pub share: f64,
    /// Its share of every guaranteed GPU (0 to 1).
    pub guaranteed_share: f64,
    /// Its share of the borrowed GPU-hours, and its weighted fair share of them (0 to 1;
    /// None when no one borrowed).
    pub borrowed_share: Option<f64>,
    pub weighted_fair_share: Option<f64>,
    pub cost: f64,
}

/// The horizon both scenarios are measured over: from the trace's start to the last end.
pub fn horizon(jobs: &[Job], scenarios: &[&[Outcome]]) -> i64 {
    let ends = scenarios.iter().flat_map(|outcomes| {
        outcomes
            .iter()
            .zip(jobs)
            .filter_map(|(o, j)| o.start.map(|s| s + j.duration))
    });
    ends.chain(jobs.iter().map(|j| j.submit)).max().unwrap_or(0)
}

/// Nearest rank: the smallest value at least `p` percent of `sorted` are at or below.
pub fn percentile(sorted: &[i64], p: usize) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    Some(sorted[rank - 1])
}

/// Per team and class, GPU-seconds (guaranteed and burst from the sweep).
#[derive(Default, Clone)]
struct Held {
    seconds: [f64; 3],
}

pub fn measure(
    fleet: &Fleet,
    jobs: &[Job],
    outcomes: &[Outcome],
    horizon: i64,
    prices: &Prices,
) -> Scenario {
    let teams = fleet.teams.len();
    // held[team][model] by class; costs per team.
    let mut held: Vec<BTreeMap<&str, Held>> = vec![BTreeMap::new(); teams];
    let mut idle_guaranteed = 0.0;
    let mut pool_seconds = 0.0;
    for model in &fleet.models {
        let gpn = model.gpus_per_node;
        // (time, team, change of pool GPUs held).
        let mut changes: Vec<(i64, usize, i64)> = Vec::new();
        for (job, o) in jobs.iter().zip(outcomes) {
            let Some(start) = o.start.filter(|_| job.gpu_type == model.gpu_type) else {
                continue;
            };
            let gpus = o.pool_nodes * gpn;
            if gpus > 0 {
                changes.push((start, job.team, gpus));
                changes.push((start + job.duration, job.team, -gpus));
            }
            let od = (o.on_demand_nodes * gpn * job.duration) as f64;
            held[job.team].entry(&model.gpu_type).or_default().seconds[2] += od;
        }
        changes.sort_unstable();
        let g: Vec<i64> = fleet
            .teams
            .iter()
            .map(|t| t.guaranteed(&model.gpu_type))
            .collect();
        let mut h = vec![0i64; teams];
        let mut since = vec![0i64; teams];
        let (mut total, mut unused) = (0i64, g.iter().sum::<i64>());
        let mut last = 0i64;
        for (t, team, delta) in changes.into_iter().chain([(horizon, usize::MAX, 0)]) {
            let t = t.min(horizon);
            let dt = (t - last) as f64;
            idle_guaranteed += unused.min(model.pool_gpus() - total).max(0) as f64 * dt;
            pool_seconds += total as f64 * dt;
            last = t;
            if team == usize::MAX {
                break;
            }
            let span = (t - since[team]) as f64;
            let entry = held[team].entry(&model.gpu_type).or_default();
            entry.seconds[0] += h[team].min(g[team]) as f64 * span;
            entry.seconds[1] += (h[team] - g[team]).max(0) as f64 * span;
            since[team] = t;
            unused -= (g[team] - h[team]).max(0);
            h[team] += delta;
            total += delta;
            unused += (g[team] - h[team]).max(0);
        }
    }
    let pool_gpus: i64 = fleet.models.iter().map(|m| m.pool_gpus()).sum();
    let (borrowed, fair) = borrowing(fleet, &held);
    let mut unpriced = 0.0;
    let mut team_cost = vec![0.0; teams];
    let mut team_class = vec![[0.0f64; 3]; teams];
    for (team, models) in held.iter().enumerate() {
        for (gpu_type, h) in models {
            for (c, class) in Class::ALL.into_iter().enumerate() {
                let hours = h.seconds[c] / HOUR;
                team_class[team][c] += hours;
                match prices.per_gpu_hour(gpu_type, class) {
                    Some(p) => team_cost[team] += hours * p,
                    None => unpriced += hours,
                }
            }
        }
    }
    let held_hours: f64 = team_class.iter().flatten().sum();
    let guaranteed_total: i64 = fleet
        .teams
        .iter()
        .flat_map(|t| &t.quotas)
        .map(|q| q.gpus)
        .sum();
    let waits = |team: Option<usize>| {
        let mut w: Vec<i64> = jobs
            .iter()
            .zip(outcomes)
            .filter(|(j, _)| team.is_none_or(|t| j.team == t))
            .filter_map(|(j, o)| o.start.map(|s| s - j.submit))
            .collect();
        w.sort_unstable();
        w
    };
    let never = |team: Option<usize>| {
        jobs.iter()
            .zip(outcomes)
            .filter(|(j, o)| team.is_none_or(|t| j.team == t) && o.start.is_none())
            .count()
    };
    let team_measures = fleet
        .teams
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let w = waits(Some(i));
            let guaranteed_gpus: i64 = t.quotas.iter().map(|q| q.gpus).sum();
            TeamMeasures {
                team: t.name.clone(),
                guaranteed_gpus,
                jobs: jobs.iter().filter(|j| j.team == i).count(),
                never_admitted: never(Some(i)),
                wait_p50_seconds: percentile(&w, 50),
                wait_p95_seconds: percentile(&w, 95),
                guaranteed_gpu_hours: team_class[i][0],
                burst_gpu_hours: team_class[i][1],
                on_demand_gpu_hours: team_class[i][2],
                share: ratio(team_class[i].iter().sum(), held_hours),
                guaranteed_share: ratio(guaranteed_gpus as f64, guaranteed_total as f64),
                borrowed_share: (borrowed > 0.0).then(|| team_class[i][1] * HOUR / borrowed),
                weighted_fair_share: (borrowed > 0.0).then(|| fair[i] / borrowed),
                cost: team_cost[i],
            }
        })
        .collect();
    let all = waits(None);
    let admitted = || {
        jobs.iter()
            .zip(outcomes)
            .filter(|(_, o)| o.start.is_some())
            .map(|(j, _)| j)
    };
    let asked: f64 = admitted()
        .map(|j| j.demand_gpus() * j.duration as f64 / HOUR)
        .sum();
    let (mut mig_slices, mut mig_equivalent) = (0.0, 0.0);
    for (j, mig) in admitted().filter_map(|j| j.mig.as_ref().map(|m| (j, m))) {
        mig_slices += (mig.count * j.duration) as f64 / HOUR;
        mig_equivalent += mig.gpu_equivalent() * j.duration as f64 / HOUR;
    }
    let (mut used, mut pool_used) = (0.0, 0.0);
    for (job, o) in jobs.iter().zip(outcomes).filter(|(_, o)| o.start.is_some()) {
        let busy = job.busy_gpus() * job.duration as f64;
        used += busy;
        pool_used += busy
            * ratio(
                o.pool_nodes as f64,
                (o.pool_nodes + o.on_demand_nodes) as f64,
            );
    }
    let pool_seconds_in_horizon = pool_gpus as f64 * horizon as f64;
    Scenario {
        pool_utilisation: ratio(pool_seconds, pool_seconds_in_horizon),
        pool_used_utilisation: ratio(pool_used, pool_seconds_in_horizon),
        held_gpu_hours: held_hours,
        used_gpu_hours: used / HOUR,
        borrowed_gpu_hours: borrowed / HOUR,
        asked_gpu_hours: asked,
        mig_slice_hours: mig_slices,
        mig_gpu_equivalent_hours: mig_equivalent,
        idle_guaranteed_gpu_hours: idle_guaranteed / HOUR,
        on_demand_gpu_hours: team_class.iter().map(|c| c[2]).sum(),
        cost: team_cost.iter().sum(),
        unpriced_gpu_hours: unpriced,
        jobs: jobs.len(),
        admitted: all.len(),
        never_admitted: never(None),
        wait_p50_seconds: percentile(&all, 50),
        wait_p95_seconds: percentile(&all, 95),
        teams: team_measures,
    }
}

/// All borrowed GPU-seconds, and each team's weighted fair share of them in GPU-seconds
/// (see the module's doc).
fn borrowing(fleet: &Fleet, held: &[BTreeMap<&str, Held>]) -> (f64, Vec<f64>) {
    let mut fair = vec![0.0; fleet.teams.len()];
    let mut all = 0.0;
    for model in &fleet.models {
        let m = model.gpu_type.as_str();
        let borrowed: f64 = held
            .iter()
            .filter_map(|h| h.get(m))
            .map(|h| h.seconds[1])
            .sum();
        let weights: Vec<i64> = fleet
            .teams
            .iter()
            .map(|t| {
                t.quota(m)
                    .filter(|q| q.burst_gpus > 0)
                    .map_or(0, |q| q.weight)
            })
            .collect();
        let total: i64 = weights.iter().sum();
        all += borrowed;
        for (f, w) in fair.iter_mut().zip(&weights) {
            *f += borrowed * ratio(*w as f64, total as f64);
        }
    }
    (all, fair)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(percentile(&[0, 0, 3600, 3600], 50), Some(0));
        assert_eq!(percentile(&[0, 0, 3600, 3600], 95), Some(3600));
        assert_eq!(percentile(&[7], 95), Some(7));
    }

    /// The replay's weighted contest (`replay::tests::contest_*`), b weighing 3.
    #[test]
    fn borrowed_shares_against_weighted_fair_shares_by_hand() {
        use crate::replay::tests::{contest_fleet, contest_trace};
        // Borrowed: a 8 GPUs for 2 h; b 8 for 1 h, then 16 for 1 h: 16 of 40 GPU-hours
        // and 24. c cannot borrow (no burst): the fair shares are 1 : 3.
        let fleet = crate::fleet::parse(Path::new("fleet.toml"), &contest_fleet(3)).unwrap();
        let jobs = crate::trace::parse(Path::new("t.csv"), &contest_trace(), &fleet)
            .unwrap()
            .jobs;
        let all: Vec<usize> = (0..jobs.len()).collect();
        let mut store = crate::admission::Admission::open(&fleet, crate::replay::EPOCH).unwrap();
        let out = crate::replay::run(&mut store, &jobs, &all).unwrap();
        let s = measure(
            &fleet,
            &jobs,
            &out,
            horizon(&jobs, &[&out]),
            &Default::default(),
        );
        assert_eq!(s.borrowed_gpu_hours, 40.0);
        let shares: Vec<(Option<f64>, Option<f64>)> = s
            .teams
            .iter()
            .map(|t| (t.borrowed_share, t.weighted_fair_share))
            .collect();
        assert_eq!(
            shares,
            [
                (Some(0.4), Some(0.25)),
                (Some(0.6), Some(0.75)),
                (Some(0.0), Some(0.0))
            ]
        );
    }

    /// Two teams of 16 guaranteed H100s on 4 nodes; a borrows 8 of b's for an hour.
    #[test]
    fn classes_idle_guarantees_and_cost_by_hand() {
        let fleet = crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 4\n[[on_demand]]\ngpu_type = \"H100-80GB\"\nnodes = 1\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16, burst_gpus = 16 }]\n\
             [[team]]\nname = \"b\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16 }]\n",
        )
        .unwrap();
        let job = |team, gpus, submit, duration| Job {
            line: 0,
            team,
            gpu_type: "H100-80GB".into(),
            gpus,
            submit,
            duration,
            used: None,
            mig: None,
        };
        let jobs = [
            Job {
                used: Some(0.5),
                ..job(0, 24, 0, 3600)
            },
            job(1, 8, 0, 7200),
            job(1, 8, 1800, 3600),
        ];
        let outcomes = [
            Outcome {
                start: Some(0),
                pool_nodes: 3,
                on_demand_nodes: 0,
            },
            Outcome {
                start: Some(0),
                pool_nodes: 0,
                on_demand_nodes: 1,
            },
            Outcome {
                start: Some(3600),
                pool_nodes: 1,
                on_demand_nodes: 0,
            },
        ];
        let prices = crate::prices::parse(
            Path::new("p.csv"),
            "gpu_type,class,per_gpu_hour\nH100-80GB,guaranteed,2\nH100-80GB,burst,3\nH100-80GB,on-demand,6\n",
            &fleet,
        )
        .unwrap();
        let h = horizon(&jobs, &[&outcomes]);
        assert_eq!(h, 7200);
        let s = measure(&fleet, &jobs, &outcomes, h, &prices);
        // Pool: 24 GPUs for the first hour, 8 for the second, of 32 over 2 h.
        assert!((s.pool_utilisation - 32.0 / 64.0).abs() < 1e-9);
        // Hour 1: a holds 24 (16 guaranteed + 8 burst), b 0: unused guarantee 16, idle 8.
        // Hour 2: a 0, b 8: unused 16 + 8, idle 24.
        assert!((s.idle_guaranteed_gpu_hours - 32.0).abs() < 1e-9);
        assert_eq!(
            (s.teams[0].guaranteed_gpu_hours, s.teams[0].burst_gpu_hours),
            (16.0, 8.0)
        );
        assert_eq!(
            (
                s.teams[1].guaranteed_gpu_hours,
                s.teams[1].on_demand_gpu_hours
            ),
            (8.0, 16.0)
        );
        assert_eq!(s.cost, 16.0 * 2.0 + 8.0 * 3.0 + 8.0 * 2.0 + 16.0 * 6.0);
        assert_eq!(
            (s.teams[1].wait_p50_seconds, s.teams[1].wait_p95_seconds),
            (Some(0), Some(1800))
        );
        assert!((s.teams[0].share - 24.0 / 48.0).abs() < 1e-9);
        assert_eq!(s.asked_gpu_hours, 24.0 + 16.0 + 8.0);
        // Used: a's 24 GPUs half busy for 1 h, b's asked GPUs busy (not reported).
        assert_eq!(s.used_gpu_hours, 12.0 + 16.0 + 8.0);
        // On the pool: a's 12 and b's second job's 8 (its first is on demand), of 64.
        assert_eq!(s.pool_used_utilisation, 20.0 / 64.0);
        // Only a borrowed (8 GPU-hours), and only a may (b has no burst).
        assert_eq!(s.borrowed_gpu_hours, 8.0);
        assert_eq!(
            (s.teams[0].borrowed_share, s.teams[0].weighted_fair_share),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(
            (s.teams[1].borrowed_share, s.teams[1].weighted_fair_share),
            (Some(0.0), Some(0.0))
        );
    }
}
