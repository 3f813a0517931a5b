//! The replay's clock and queue: jobs arrive at their submit times, each team's waiting
//! jobs of a model are asked for in submit order (a team's job waits behind its own older
//! ones, never behind another team's), teams that compete for a model in weighted
//! fair-share order (the lowest borrowed GPUs per weight first, then the oldest), and the
//! control plane decides each ask ([`Admission`]). Time jumps from one arrival or end to the next: nothing else can
//! change what fits.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use gpufleet_control::scheduling::sharing::compare_shares;

use crate::admission::{Admission, Batch};
use crate::trace::Job;

/// Where the replay's clock starts (2026-01-01T00:00:00Z): trace times are offsets.
pub const EPOCH: i64 = 1_767_225_600;

/// What became of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Seconds since the trace's start when it was admitted; None: never.
    pub start: Option<i64>,
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
}

/// Instants replayed per transaction: one commit for many admissions, as group commit
/// does for a burst of creates (the replay's store needs no durability).
const INSTANTS_PER_COMMIT: usize = 1_024;

/// Replays `jobs` (indices `which` of them) through `admission`; an outcome for each of
/// `which`, in its order.
pub fn run(
    admission: &mut Admission,
    jobs: &[Job],
    which: &[usize],
) -> anyhow::Result<Vec<Outcome>> {
    let mut order: Vec<usize> = (0..which.len()).collect();
    order.sort_by_key(|&k| (jobs[which[k]].submit, jobs[which[k]].line));
    let mut clock = Clock {
        jobs,
        which,
        order,
        next: 0,
        outcomes: vec![Outcome::default(); which.len()],
        queues: BTreeMap::new(),
        ends: BinaryHeap::new(),
        last_end: 0,
        admissible: vec![false; which.len()],
    };
    let mut more = true;
    while more {
        admission.batch(|batch| {
            for _ in 0..INSTANTS_PER_COMMIT {
                more = clock.step(batch)?;
                if !more {
                    break;
                }
            }
            Ok(())
        })?;
    }
    Ok(clock.outcomes)
}

/// The replay's state between instants.
struct Clock<'a> {
    jobs: &'a [Job],
    which: &'a [usize],
    /// Indices into `which`, by submit time.
    order: Vec<usize>,
    /// The next of `order` to arrive.
    next: usize,
    outcomes: Vec<Outcome>,
    /// Each (team, model)'s waiting jobs, oldest first.
    queues: BTreeMap<(usize, &'a str), VecDeque<usize>>,
    /// When the admitted jobs end, and the last of them.
    ends: BinaryHeap<Reverse<i64>>,
    last_end: i64,
    /// Jobs the control plane admits on the fleet with nothing else held.
    admissible: Vec<bool>,
}

impl<'a> Clock<'a> {
    fn job(&self, k: usize) -> &'a Job {
        &self.jobs[self.which[k]]
    }

    /// Moves to the next arrival or end and asks for what waits; false when nothing is
    /// left to happen.
    fn step(&mut self, batch: &mut Batch) -> anyhow::Result<bool> {
        let arrival = self.order.get(self.next).map(|&k| self.job(k).submit);
        let t = match (arrival, self.ends.peek()) {
            (Some(a), Some(Reverse(e))) => a.min(*e),
            (Some(a), None) => a,
            (None, Some(Reverse(e))) => *e,
            (None, None) => return Ok(false),
        };
        while self.ends.peek().is_some_and(|Reverse(e)| *e <= t) {
            self.ends.pop();
        }
        while let Some(&k) = self.order.get(self.next) {
            let job = self.job(k);
            if job.submit > t {
                break;
            }
            self.queues
                .entry((job.team, job.gpu_type.as_str()))
                .or_default()
                .push_back(k);
            self.next += 1;
        }
        // The queues' heads; a refused head closes its queue until the next instant.
        let mut open: Vec<(usize, &'a str)> = self.queues.keys().copied().collect();
        let mut shares = Shares::new();
        while !open.is_empty() {
            let pick = self.pick(&open, &mut shares, batch, t)?;
            let key = open[pick];
            let queue = self.queues.get_mut(&key).expect("an open queue has a head");
            let k = *queue.front().expect("an open queue has a head");
            let job: &'a Job = &self.jobs[self.which[k]];
            let end = t + job.duration;
            let Some(split) =
                batch.admit(job.team, &job.gpu_type, job.gpus, EPOCH + t, EPOCH + end)?
            else {
                // A job that can never run is never admitted, and holds up no other. It is
                // asked about once, from when everything admitted so far has ended.
                if !self.admissible[k] {
                    let empty = EPOCH + self.last_end.max(t);
                    self.admissible[k] = batch.ever_admits(
                        job.team,
                        &job.gpu_type,
                        job.gpus,
                        empty,
                        job.duration,
                    )?;
                }
                if self.admissible[k] {
                    open.swap_remove(pick);
                } else {
                    queue.pop_front();
                    if queue.is_empty() {
                        open.swap_remove(pick);
                    }
                }
                continue;
            };
            self.outcomes[k] = Outcome {
                start: Some(t),
                pool_nodes: split.pool,
                on_demand_nodes: split.on_demand,
            };
            shares.remove(key.1);
            self.ends.push(Reverse(end));
            self.last_end = self.last_end.max(end);
            queue.pop_front();
            if queue.is_empty() {
                open.swap_remove(pick);
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
        Ok(true)
    }

    /// Which of the `open` queues asks next: of the heads that compete for one model (more
    /// than one team's), the team with the lowest weighted share of it (pool GPUs
    /// borrowed beyond its guarantee per weight, as the control plane's fair sharing
    /// reads them from the store: `sharing::shares`, `sharing::compare_shares`); then the
    /// oldest head (submit time, then trace line).
    fn pick(
        &self,
        open: &[(usize, &'a str)],
        shares: &mut Shares<'a>,
        batch: &mut Batch,
        t: i64,
    ) -> anyhow::Result<usize> {
        // (index in open, share, age) of the first so far.
        let mut best: Option<(usize, Share, (i64, usize))> = None;
        for (i, &(team, model)) in open.iter().enumerate() {
            let contested = open.iter().any(|&(o, m)| m == model && o != team);
            let share = if contested {
                if !shares.contains_key(model) {
                    shares.insert(model, batch.shares(model, EPOCH + t)?);
                }
                shares[model][team].unwrap_or((0, 1))
            } else {
                (0, 1)
            };
            let k = *self.queues[&(team, model)]
                .front()
                .expect("an open queue has a head");
            let age = (self.job(k).submit, self.job(k).line);
            let first = best.is_none_or(|(_, s, a)| match compare_shares(share, s) {
                Ordering::Less => true,
                Ordering::Equal => age < a,
                Ordering::Greater => false,
            });
            if first {
                best = Some((i, share, age));
            }
        }
        Ok(best.expect("open is not empty").0)
    }
}

/// A team's (pool GPUs borrowed beyond its guarantee, weight) of a model.
type Share = (i64, i64);

/// Each contested model's shares at this instant, by team; dropped when one of its jobs
/// is admitted.
type Shares<'a> = BTreeMap<&'a str, Vec<Option<Share>>>;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    /// Through the control plane's admission: team a asks for five 8-GPU jobs at once on 4
    /// pool nodes and 1 on-demand node, b for one half an hour later. Pooled, a's burst
    /// takes b's idle guarantee and the on-demand node, and b waits for a's jobs to end
    /// (nothing takes lent capacity back); in partitions a waits for its own two nodes.
    #[test]
    fn pooled_and_partitioned_through_the_real_admission() {
        let fleet = crate::fleet::parse(Path::new("fleet.toml"), crate::fleet::TWO_TEAMS).unwrap();
        let mut text = String::from("team,gpu_type,gpus,submit,duration\n");
        for _ in 0..5 {
            text.push_str("a,H100-80GB,8,0,1h\n");
        }
        text.push_str("b,H100-80GB,8,30m,1h\n");
        let trace = crate::trace::parse(Path::new("t.csv"), &text, &fleet).unwrap();
        let all: Vec<usize> = (0..6).collect();
        let mut pooled = Admission::open(&fleet, EPOCH).unwrap();
        let out = run(&mut pooled, &trace.jobs, &all).unwrap();
        let starts: Vec<Option<i64>> = out.iter().map(|o| o.start).collect();
        assert_eq!(
            starts,
            [Some(0), Some(0), Some(0), Some(0), Some(0), Some(3600)]
        );
        // Pool first, then the on-demand node.
        assert_eq!((out[3].pool_nodes, out[4].on_demand_nodes), (1, 1));

        let a_jobs: Vec<usize> = (0..5).collect();
        let mut partition = Admission::open(&crate::partitions::of(&fleet, 0), EPOCH).unwrap();
        let out = run(&mut partition, &trace.jobs, &a_jobs).unwrap();
        let starts: Vec<Option<i64>> = out.iter().map(|o| o.start).collect();
        // Two pool nodes and the one on-demand node now, the rest when two end.
        assert_eq!(starts, [Some(0), Some(0), Some(0), Some(3600), Some(3600)]);
    }

    /// A job the control plane refuses even on an empty fleet (24 GPUs on a quota of 16)
    /// is never admitted and does not hold up the team's later jobs.
    #[test]
    fn a_job_that_can_never_run_holds_up_no_other() {
        let fleet = crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 4\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16 }]\n",
        )
        .unwrap();
        let trace = crate::trace::parse(
            Path::new("t.csv"),
            "team,gpu_type,gpus,submit,duration\na,H100-80GB,8,0,1h\na,H100-80GB,24,0,1h\na,H100-80GB,16,0,1h\na,H100-80GB,8,10m,1h\n",
            &fleet,
        )
        .unwrap();
        let mut store = Admission::open(&fleet, EPOCH).unwrap();
        let out = run(&mut store, &trace.jobs, &[0, 1, 2, 3]).unwrap();
        let starts: Vec<Option<i64>> = out.iter().map(|o| o.start).collect();
        // The 16-GPU job waits for the first to end (quota 16), the 8 behind it after.
        assert_eq!(starts, [Some(0), None, Some(3600), Some(7200)]);
    }

    fn starts(fleet: &str, trace: &str) -> Vec<Option<i64>> {
        let fleet = crate::fleet::parse(Path::new("fleet.toml"), fleet).unwrap();
        let trace = crate::trace::parse(Path::new("t.csv"), trace, &fleet).unwrap();
        let all: Vec<usize> = (0..trace.jobs.len()).collect();
        let mut store = Admission::open(&fleet, EPOCH).unwrap();
        run(&mut store, &trace.jobs, &all)
            .unwrap()
            .iter()
            .map(|o| o.start)
            .collect()
    }

    const SIX_JOBS: &str = "team,gpu_type,gpus,submit,duration\n\
        a,H100-80GB,8,0,1h\na,H100-80GB,8,0,1h\na,H100-80GB,8,0,1h\na,H100-80GB,8,0,1h\na,H100-80GB,8,0,1h\n\
        b,H100-80GB,8,30m,1h\n";

    /// b lends none of its idle guarantee (`lending_limit_gpus = 0`): the control plane's
    /// lending check keeps a to 16 borrowed GPUs, so b starts at once at 30 minutes
    /// (without the limit it waits half an hour: the first test), and a's jobs wait for
    /// the GPUs b's guarantee does not keep.
    #[test]
    fn a_lending_limit_keeps_the_idle_guarantee_for_its_team() {
        assert_eq!(
            starts(crate::fleet::WEIGHTED, SIX_JOBS),
            [
                Some(0),
                Some(0),
                // b holds 8 from 30 minutes and keeps its other 8 idle: a gets 16 at 1 h.
                Some(3600),
                Some(3600),
                // b's 16 kept again from 1.5 h: a's last waits for its own to end.
                Some(7200),
                Some(1800),
            ]
        );
    }

    /// 7 pool nodes; a, b and c are guaranteed 16 each. At 0 a and b each take 24 (8
    /// borrowed of c's idle guarantee) and c 8 for an hour: the pool is full. a asks for
    /// 8 more at 10 minutes, b at 20. When c's job ends at 1 h, 8 GPUs are free for one of
    /// them: b, whose weight 3 puts it at 8 / 3 borrowed per weight against a's 8 / 1,
    /// asks first though a waited longer. With equal weights a, the older, goes first.
    /// Seven 8-GPU pool nodes; a and b are guaranteed 16 with 16 burst (b weighing
    /// `weight_b`), c 16 without burst.
    pub(crate) fn contest_fleet(weight_b: i64) -> String {
        format!(
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 7\n\
             [[team]]\nname = \"a\"\nquota = [{{ gpu_type = \"H100-80GB\", gpus = 16, burst_gpus = 16 }}]\n\
             [[team]]\nname = \"b\"\nquota = [{{ gpu_type = \"H100-80GB\", gpus = 16, burst_gpus = 16, weight = {weight_b} }}]\n\
             [[team]]\nname = \"c\"\nquota = [{{ gpu_type = \"H100-80GB\", gpus = 16 }}]\n"
        )
    }

    /// a and b each hold three nodes for 2 h and c one for 1 h; then a (at 10 minutes)
    /// and b (at 20) each ask for one more.
    pub(crate) fn contest_trace() -> String {
        let mut trace = String::from("team,gpu_type,gpus,submit,duration\n");
        for team in ["a", "b"] {
            for _ in 0..3 {
                trace.push_str(&format!("{team},H100-80GB,8,0,2h\n"));
            }
        }
        trace.push_str("c,H100-80GB,8,0,1h\na,H100-80GB,8,10m,1h\nb,H100-80GB,8,20m,1h\n");
        trace
    }

    #[test]
    fn teams_that_compete_for_idle_gpus_ask_in_weighted_fair_share_order() {
        let (fleet, trace) = (contest_fleet, contest_trace());
        let weighted = starts(&fleet(3), &trace);
        assert_eq!(&weighted[7..], [Some(7200), Some(3600)]);
        let equal = starts(&fleet(1), &trace);
        assert_eq!(&equal[7..], [Some(3600), Some(7200)]);
        assert!(weighted[..7].iter().all(|s| *s == Some(0)));
    }
}
