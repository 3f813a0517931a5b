//! Progress of a long cluster change, as events of the cluster: which node is getting a
//! driver, which is being partitioned. A caller whose deadline fires reads them to say
//! what the change is waiting on.

use crate::scheduling::drivers::event;
use crate::state::AppState;
use crate::store::{clusters::ClusterRow, nodes::NodeRow};

/// `driver_install_started` for each of `nodes` that runs another driver than `version`.
pub fn driver_installs(state: &AppState, cluster: &ClusterRow, nodes: &[NodeRow], version: &str) {
    for n in nodes.iter().filter(|n| n.driver_version != version) {
        let was = if n.driver_version.is_empty() {
            String::new()
        } else {
            format!(" (was {})", n.driver_version)
        };
        event(
            state,
            cluster,
            "driver_install_started",
            &n.hostname,
            &format!("driver install: installing {version}{was}"),
        );
    }
}

/// `partitioning` for each node whose GPUs `changes` reshape.
pub fn partitioning(state: &AppState, cluster: &ClusterRow, changes: &[crate::mig::Change]) {
    for c in changes.iter().filter(|c| c.needed()) {
        let what = match &c.target {
            Some(_) => format!(
                "MIG partitioning: every GPU to {}",
                gpufleet_gpu::mig::render_layout(&cluster.mig_layout)
            ),
            None => "MIG partitioning: back to whole GPUs".to_string(),
        };
        event(state, cluster, "partitioning", &c.node.hostname, &what);
    }
}
