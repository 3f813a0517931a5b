//! The latest GPU readings each node's agent reported on its heartbeats
//! (`Heartbeat.gpus`), kept in memory for the metrics a tenant scrapes of its own
//! clusters (`metrics::team`). Nothing here is decided on: it is what the agent says.
//!
//! Bounded: only a node with a live session is recorded (the caller is that session), one
//! reading per GPU the node registered with and no more, each value within the hardware's
//! range; a report that breaks any of this is dropped whole (and counted). A node's
//! readings go with its session: they are shown only while that session is the node's.
//! Also each Slurm cluster's running and pending jobs, as its controller last said (one
//! entry per watched cluster), and the utilisation readings not yet counted as GPU-seconds
//! used (`metering` takes them every few seconds; at most [`MAX_UNCOUNTED`] per node).

use std::collections::HashMap;
use std::sync::Mutex;

use gpufleet_proto::v1;

use crate::store::usage::Reading;

/// The most a reading may say: beyond these a report is not a GPU's.
const MAX_MEMORY_MIB: u64 = 1 << 24; // 16 TiB
const MAX_TEMPERATURE_C: u32 = 250;
const MAX_POWER_MW: u32 = 10_000_000; // 10 kW
const MAX_COUNTER: u64 = 1 << 53; // exact as a Prometheus float

/// Readings of one node kept for usage between two flushes (a flush comes every few
/// seconds, a reading every 5 s); past it the oldest go, and the next reading counted
/// covers their time only up to the gap limit.
pub const MAX_UNCOUNTED: usize = 64;

/// One GPU's readings; `None` where the agent could not read the value.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub utilization_percent: Option<u32>,
    /// (used, total) MiB.
    pub memory_mib: Option<(u64, u64)>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub ecc_uncorrected: Option<u64>,
    pub xids_total: u64,
}

/// A node's latest readings and the session that sent them.
#[derive(Debug, Clone)]
pub struct NodeReadings {
    pub session: u64,
    pub gpus: Vec<GpuReading>,
}

#[derive(Default)]
pub struct Telemetry {
    nodes: Mutex<HashMap<String, NodeReadings>>,
    /// Per Slurm cluster: its controller's running and pending jobs at the supervisor's
    /// last look (`slurm_clusters`), only while the controller answers.
    jobs: Mutex<HashMap<String, gpufleet_slurm::status::JobCounts>>,
    /// Per node: utilisation readings not yet counted in the store's usage.
    uncounted: Mutex<HashMap<String, Vec<Reading>>>,
}

/// What usage counts of one node's readings at `t`: how many GPUs reported their
/// utilisation and its sum (a GPU that reports none is left out, never taken as idle).
pub fn usage_reading(t: i64, gpus: &[GpuReading]) -> Reading {
    let reported: Vec<u32> = gpus.iter().filter_map(|g| g.utilization_percent).collect();
    Reading {
        t,
        reported: reported.len() as u32,
        busy_percent: reported.iter().map(|p| (*p).min(100)).sum(),
    }
}

/// Checks one report against the GPUs the node registered with (index, UUID).
pub fn check(
    report: &[v1::GpuTelemetry],
    registered: &[(u32, String)],
) -> Result<Vec<GpuReading>, String> {
    if report.len() > registered.len() {
        return Err(format!(
            "{} GPU readings for a node of {} GPUs",
            report.len(),
            registered.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(report.len());
    for t in report {
        if !registered
            .iter()
            .any(|(i, u)| *i == t.index && *u == t.uuid)
        {
            return Err(format!(
                "a reading for GPU {} that is not one of the node's",
                t.index
            ));
        }
        if !seen.insert(t.index) {
            return Err(format!("two readings for GPU {}", t.index));
        }
        let within = t.utilization_percent <= 100
            && t.memory_total_mib <= MAX_MEMORY_MIB
            && t.memory_used_mib <= t.memory_total_mib
            && t.temperature_c <= MAX_TEMPERATURE_C
            && t.power_mw <= MAX_POWER_MW
            && t.ecc_uncorrected <= MAX_COUNTER
            && t.xids_total <= MAX_COUNTER;
        if !within {
            return Err(format!("GPU {}: a reading out of range", t.index));
        }
        out.push(GpuReading {
            index: t.index,
            uuid: t.uuid.clone(),
            utilization_percent: t.has_utilization.then_some(t.utilization_percent),
            memory_mib: t
                .has_memory
                .then_some((t.memory_used_mib, t.memory_total_mib)),
            temperature_c: t.has_temperature.then_some(t.temperature_c),
            power_mw: t.has_power.then_some(t.power_mw),
            ecc_uncorrected: t.has_ecc.then_some(t.ecc_uncorrected),
            xids_total: t.xids_total,
        });
    }
    Ok(out)
}

impl Telemetry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeReadings>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `gpus` as `node_id`'s latest readings, from its session `session`.
    pub fn record(&self, node_id: &str, session: u64, gpus: Vec<GpuReading>) {
        self.lock()
            .insert(node_id.to_string(), NodeReadings { session, gpus });
    }

    /// The readings of `node_id` if they came from `session`.
    pub fn of(&self, node_id: &str, session: u64) -> Option<Vec<GpuReading>> {
        self.lock()
            .get(node_id)
            .filter(|r| r.session == session)
            .map(|r| r.gpus.clone())
    }

    fn jobs_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, gpufleet_slurm::status::JobCounts>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the job counts of Slurm cluster `cluster_id` (`None`: not known now).
    pub fn record_jobs(&self, cluster_id: &str, counts: Option<gpufleet_slurm::status::JobCounts>) {
        let mut jobs = self.jobs_lock();
        match counts {
            Some(c) => {
                jobs.insert(cluster_id.to_string(), c);
            }
            None => {
                jobs.remove(cluster_id);
            }
        }
    }

    /// The job counts of a Slurm cluster, when known.
    pub fn jobs_of(&self, cluster_id: &str) -> Option<gpufleet_slurm::status::JobCounts> {
        self.jobs_lock().get(cluster_id).copied()
    }

    /// Forgets the job counts of every cluster not in `watched`.
    pub fn keep_jobs_of(&self, watched: &std::collections::BTreeSet<String>) {
        self.jobs_lock().retain(|c, _| watched.contains(c));
    }

    fn uncounted_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Reading>>> {
        self.uncounted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `node_id`'s readings at `t` to be counted as GPU-seconds used.
    pub fn note_usage(&self, node_id: &str, t: i64, gpus: &[GpuReading]) {
        let mut uncounted = self.uncounted_lock();
        let kept = uncounted.entry(node_id.to_string()).or_default();
        kept.push(usage_reading(t, gpus));
        let over = kept.len().saturating_sub(MAX_UNCOUNTED);
        kept.drain(..over);
    }

    /// Every node's readings not yet counted, taken (the next flush gets only newer ones).
    pub fn take_usage(&self) -> HashMap<String, Vec<Reading>> {
        std::mem::take(&mut *self.uncounted_lock())
    }

    /// Forgets a node's readings (its session ended).
    pub fn forget(&self, node_id: &str, session: u64) {
        let mut nodes = self.lock();
        if nodes.get(node_id).is_some_and(|r| r.session == session) {
            nodes.remove(node_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(index: u32, uuid: &str) -> v1::GpuTelemetry {
        v1::GpuTelemetry {
            index,
            uuid: uuid.into(),
            has_utilization: true,
            utilization_percent: 40,
            has_memory: true,
            memory_used_mib: 10,
            memory_total_mib: 80_000,
            has_temperature: true,
            temperature_c: 35,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_nodes_own_gpus_within_range_are_kept() {
        let node = vec![(0, "GPU-a".to_string()), (1, "GPU-b".to_string())];
        let ok = check(&[reading(0, "GPU-a"), reading(1, "GPU-b")], &node).unwrap();
        assert_eq!(ok[0].utilization_percent, Some(40));
        assert_eq!(ok[1].power_mw, None, "not read is not 0");
        for (what, report) in [
            ("another uuid", vec![reading(0, "GPU-x")]),
            ("another index", vec![reading(2, "GPU-b")]),
            ("twice", vec![reading(0, "GPU-a"), reading(0, "GPU-a")]),
            (
                "more than the node has",
                vec![
                    reading(0, "GPU-a"),
                    reading(1, "GPU-b"),
                    reading(1, "GPU-b"),
                ],
            ),
            (
                "utilisation over 100",
                vec![v1::GpuTelemetry {
                    utilization_percent: 101,
                    ..reading(0, "GPU-a")
                }],
            ),
            (
                "more memory used than there is",
                vec![v1::GpuTelemetry {
                    memory_used_mib: 80_001,
                    ..reading(0, "GPU-a")
                }],
            ),
        ] {
            assert!(check(&report, &node).is_err(), "{what}");
        }
    }

    /// A GPU without a utilisation reading is left out of usage, not counted as idle; the
    /// readings kept per node are bounded, the newest kept.
    #[test]
    fn usage_counts_only_reported_utilisation_and_keeps_a_bounded_backlog() {
        let node = vec![(0, "GPU-a".to_string()), (1, "GPU-b".to_string())];
        let mig = v1::GpuTelemetry {
            has_utilization: false,
            utilization_percent: 0,
            ..reading(1, "GPU-b")
        };
        let gpus = check(&[reading(0, "GPU-a"), mig], &node).unwrap();
        assert_eq!(
            usage_reading(10, &gpus),
            Reading {
                t: 10,
                reported: 1,
                busy_percent: 40
            }
        );
        let t = Telemetry::default();
        for i in 0..(MAX_UNCOUNTED as i64 + 3) {
            t.note_usage("n1", i, &gpus);
        }
        let taken = t.take_usage();
        let kept = &taken["n1"];
        assert_eq!(kept.len(), MAX_UNCOUNTED);
        assert_eq!(kept[0].t, 3);
        assert!(t.take_usage().is_empty(), "taken once");
    }

    #[test]
    fn readings_belong_to_their_session() {
        let t = Telemetry::default();
        let gpus = check(&[reading(0, "GPU-a")], &[(0, "GPU-a".into())]).unwrap();
        t.record("n1", 7, gpus.clone());
        assert_eq!(t.of("n1", 7), Some(gpus));
        assert_eq!(t.of("n1", 8), None);
        t.forget("n1", 8);
        assert!(t.of("n1", 7).is_some(), "a later session's end keeps them");
        t.forget("n1", 7);
        assert_eq!(t.of("n1", 7), None);
    }
}
