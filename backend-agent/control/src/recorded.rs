//! The store's record of a node's GPUs, as the hardware crate's types: what its agent last
//! verified, and (in embedded mode with `--hardware sim`) the simulated nodes rebuilt from
//! it on start.

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuInfo, MigInstance, SimulatedNode};
use gpufleet_sql::AsConn;

use crate::store;

/// A node's GPUs as the store last recorded them (what its agent verified).
pub fn recorded_gpus(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<Vec<GpuInfo>> {
    let mut gpus = Vec::new();
    for g in store::nodes::gpus(conn, node_id)? {
        let instances = store::nodes::mig_devices(conn, node_id, g.index)?
            .into_iter()
            .map(|d| MigInstance {
                profile_id: d.profile_id as u32,
                profile: d.profile,
                start: d.start as u8,
                size: d.size as u8,
                memory_mib: d.memory_mib as u64,
                uuid: d.uuid,
            })
            .collect();
        gpus.push(GpuInfo {
            index: g.index as u32,
            uuid: g.uuid,
            model: g.model,
            memory_mib: g.memory_mib as u64,
            mig_enabled: g.mig_enabled,
            instances,
        });
    }
    Ok(gpus)
}

/// Every node of the store as a simulated node with its recorded MIG state (the
/// embedded agents' hardware).
pub fn simulated_nodes(
    conn: &impl AsConn,
) -> anyhow::Result<Vec<(store::nodes::NodeRow, SimulatedNode)>> {
    let mut out = Vec::new();
    for n in store::nodes::list(conn, None, None)? {
        let model = gpufleet_gpu::catalog::model(&n.gpu_type)
            .with_context(|| format!("node {}: unknown GPU model {}", n.hostname, n.gpu_type))?;
        let gpus = recorded_gpus(conn, &n.id)?;
        let sim = SimulatedNode::with_state(&n.hostname, model, &n.driver_version, gpus).map_err(
            |e| anyhow::anyhow!("node {}: recorded MIG state is invalid: {e}", n.hostname),
        )?;
        out.push((n, sim));
    }
    Ok(out)
}

/// A GPU's MIG instances as the store records them.
pub fn mig_device_rows(gpu: &GpuInfo) -> Vec<store::nodes::MigDeviceRow> {
    gpu.instances
        .iter()
        .map(|i| store::nodes::MigDeviceRow {
            profile: i.profile.clone(),
            profile_id: i.profile_id as i64,
            start: i.start as i64,
            size: i.size as i64,
            memory_mib: i.memory_mib as i64,
            uuid: i.uuid.clone(),
        })
        .collect()
}
