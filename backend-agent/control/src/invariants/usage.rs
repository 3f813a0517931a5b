//! The usage records agree with the holdings (issue 42): a node a cluster holds has open
//! usage intervals counting exactly its GPUs, and a free node has none. Usage is written
//! in the transactions that assign and release nodes, so any difference means a holding
//! changed without its record: GPU-seconds counted that no one held, or held and not
//! counted. A node naming a cluster that does not exist is `membership`'s to name.

use super::snapshot::Snapshot;
use super::violation::{Concern, Violation};

pub fn check(s: &Snapshot) -> Vec<Violation> {
    let mut out = Vec::new();
    for n in &s.usage {
        let message = match &n.cluster_id {
            Some(cluster) if n.cluster_exists && n.open_gpus != n.gpu_count => format!(
                "node {} ({}) is held by cluster {cluster}, but its usage records count {} of its {} GPUs as held",
                n.node_id, n.hostname, n.open_gpus, n.gpu_count
            ),
            None if n.open_gpus != 0 => format!(
                "node {} ({}) is free, but its usage records count {} GPUs as still held",
                n.node_id, n.hostname, n.open_gpus
            ),
            _ => continue,
        };
        out.push(Violation::new(Concern::Usage, message));
    }
    out
}
