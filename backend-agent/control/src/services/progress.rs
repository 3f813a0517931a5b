//! Progress of a long cluster change, as events of the cluster: which node is getting a
//! driver, which is being partitioned. A caller whose deadline fires reads them to say
//! what the change is waiting on. A request's (a create, an update, a refill once it has
//! started): not fenced (`crate::lease::Fence`).

use crate::lease::Fence;
use crate::scheduling::drivers::{events, Event};
use crate::state::AppState;
use crate::store::{clusters::ClusterRow, nodes::NodeRow};

/// `driver_install_started` for each of `nodes` that runs another driver than `version`.
pub async fn driver_installs(
    state: &AppState,
    cluster: &ClusterRow,
    nodes: &[NodeRow],
    version: &str,
) {
    let started = nodes
        .iter()
        .filter(|n| n.driver_version != version)
        .map(|n| {
            let was = if n.driver_version.is_empty() {
                String::new()
            } else {
                format!(" (was {})", n.driver_version)
            };
            Event::new(
                "driver_install_started",
                &n.hostname,
                &format!("driver install: installing {version}{was}"),
            )
        })
        .collect();
    events(state, &Fence::request(), cluster, started).await;
}

/// `partitioning` for each node whose GPUs `changes` reshape.
pub async fn partitioning(state: &AppState, cluster: &ClusterRow, changes: &[crate::mig::Change]) {
    let reshaped = changes
        .iter()
        .filter(|c| c.needed())
        .map(|c| {
            let what = match &c.target {
                Some(_) => format!(
                    "MIG partitioning: every GPU to {}",
                    gpufleet_gpu::mig::render_layout(&cluster.mig_layout)
                ),
                None => "MIG partitioning: back to whole GPUs".to_string(),
            };
            Event::new("partitioning", &c.node.hostname, &what)
        })
        .collect();
    events(state, &Fence::request(), cluster, reshaped).await;
}
