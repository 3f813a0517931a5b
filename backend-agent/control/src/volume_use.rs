//! The use of node-local team volumes (no shared storage, external node agents) as each
//! node's agent last reported it on its heartbeats (`Heartbeat.volumes`), kept in memory
//! for the clusters' `storage_used_gib`: the fullest of a cluster's nodes' volumes, the
//! one that runs out first. Nothing is decided on it.
//!
//! Bounded: only a node with a live session is recorded (the caller is that session), at
//! most `MAX_VOLUMES` entries each under the volume mount root; a report that breaks
//! this is dropped whole. A node's report goes with its session.

use std::collections::HashMap;
use std::sync::Mutex;

use gpufleet_proto::v1;
use gpufleet_wire::volumes::VOLUME_MOUNTS;

/// The most volumes one node reports (it is in one cluster at a time).
const MAX_VOLUMES: usize = 16;
/// The longest mount point a report may name.
const MAX_TARGET: usize = 512;
/// What an empty ext4 uses (its root and lost+found, about 24 KiB) is no use of the team.
const EMPTY_BYTES: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Per node: the session that reported, and each (mount point, bytes used).
type Reports = HashMap<String, (u64, Vec<(String, u64)>)>;

/// Each live node's latest report.
#[derive(Default)]
pub struct VolumeUse {
    nodes: Mutex<Reports>,
}

/// Checks a heartbeat's report: at most [`MAX_VOLUMES`] entries, each a mount point
/// under the volume mount root.
pub fn check(report: &[v1::VolumeUse]) -> Result<Vec<(String, u64)>, String> {
    if report.len() > MAX_VOLUMES {
        return Err(format!(
            "{} volumes reported, at most {MAX_VOLUMES}",
            report.len()
        ));
    }
    report
        .iter()
        .map(|v| {
            let under = v.target.len() <= MAX_TARGET
                && v.target.starts_with(&format!("{VOLUME_MOUNTS}/"))
                && !v.target.contains("/../");
            match under {
                true => Ok((v.target.clone(), v.used_bytes)),
                false => Err(format!(
                    "a volume report for {:?}, not under {VOLUME_MOUNTS}",
                    v.target.chars().take(64).collect::<String>()
                )),
            }
        })
        .collect()
}

impl VolumeUse {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reports> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `volumes` as `node_id`'s latest report, from its session `session`.
    pub fn record(&self, node_id: &str, session: u64, volumes: Vec<(String, u64)>) {
        self.lock().insert(node_id.to_string(), (session, volumes));
    }

    /// Forgets a node's report (its session ended).
    pub fn forget(&self, node_id: &str, session: u64) {
        let mut nodes = self.lock();
        if nodes.get(node_id).is_some_and(|(s, _)| *s == session) {
            nodes.remove(node_id);
        }
    }

    /// GiB in use, rounded up, on the fullest node-local volume mounted at
    /// `storage_path` (0 when no node reports one).
    pub fn used_gib(&self, storage_path: &str) -> i64 {
        let most = self
            .lock()
            .values()
            .flat_map(|(_, volumes)| volumes.iter())
            .filter(|(target, _)| target == storage_path)
            .map(|(_, used)| *used)
            .max()
            .unwrap_or(0);
        most.saturating_sub(EMPTY_BYTES).div_ceil(GIB) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(target: &str, used_bytes: u64) -> v1::VolumeUse {
        v1::VolumeUse {
            target: target.into(),
            used_bytes,
        }
    }

    #[test]
    fn the_fullest_live_node_counts_rounded_up_and_an_empty_volume_is_zero() {
        let path = format!("{VOLUME_MOUNTS}/t/c");
        let use_ = VolumeUse::default();
        assert_eq!(use_.used_gib(&path), 0);
        use_.record("n1", 1, check(&[report(&path, 24 * 1024)]).unwrap());
        assert_eq!(use_.used_gib(&path), 0, "an empty file system");
        use_.record("n2", 7, check(&[report(&path, 3 * GIB / 2)]).unwrap());
        assert_eq!(use_.used_gib(&path), 2);
        assert_eq!(use_.used_gib(&format!("{VOLUME_MOUNTS}/t/other")), 0);
        use_.forget("n2", 6);
        assert_eq!(use_.used_gib(&path), 2, "another session's end");
        use_.forget("n2", 7);
        assert_eq!(use_.used_gib(&path), 0);
    }

    #[test]
    fn reports_outside_the_mount_root_or_too_many_are_dropped_whole() {
        for bad in [
            vec![report("/etc/passwd", 1)],
            vec![report(&format!("{VOLUME_MOUNTS}/../etc"), 1)],
            vec![report(VOLUME_MOUNTS, 1)],
            (0..=MAX_VOLUMES)
                .map(|i| report(&format!("{VOLUME_MOUNTS}/t/c{i}"), 1))
                .collect(),
        ] {
            assert!(check(&bad).is_err(), "{bad:?}");
        }
    }
}
