//! The GPU backends behind `--hardware`, and the control plane's simulated fleet:
//! one `SimulatedNode` per node, rebuilt from the store's records on start.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuInfo, MigInstance, NvmlBackend, SimulatedNode};
use rusqlite::Connection;

use crate::cli::Hardware;
use crate::store;

/// Fails with a clear message where no NVIDIA driver is present.
pub fn require_nvml() -> anyhow::Result<NvmlBackend> {
    NvmlBackend::new().map_err(|e| anyhow::anyhow!("--hardware nvml: {e}"))
}

/// The read-only report of `hw-check`: a real host through NVML, or a sample simulated node.
pub fn check_report(hardware: Hardware) -> anyhow::Result<String> {
    let report = match hardware {
        Hardware::Nvml => gpufleet_gpu::hardware::check_report(&require_nvml()?),
        Hardware::Sim => {
            let model =
                gpufleet_gpu::catalog::model("H100-80GB").context("catalog lacks H100-80GB")?;
            let node = SimulatedNode::new("sim-node-01", model, 8, crate::fleet::DEFAULT_DRIVER);
            gpufleet_gpu::hardware::check_report(&node)
        }
    };
    report.map_err(|e| anyhow::anyhow!("{e}"))
}

/// The simulated hardware of every node, by node id.
pub struct SimFleet {
    nodes: HashMap<String, Arc<SimulatedNode>>,
}

impl SimFleet {
    /// Rebuilds every node's GPUs (MIG mode and instances) from the store.
    pub fn load(conn: &Connection) -> anyhow::Result<Self> {
        let mut nodes = HashMap::new();
        for n in store::nodes::list(conn, None, None)? {
            let model = gpufleet_gpu::catalog::model(&n.gpu_type).with_context(|| {
                format!("node {}: unknown GPU model {}", n.hostname, n.gpu_type)
            })?;
            let mut gpus = Vec::new();
            for g in store::nodes::gpus(conn, &n.id)? {
                let instances = store::nodes::mig_devices(conn, &n.id, g.index)?
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
            let sim = SimulatedNode::with_state(&n.hostname, model, &n.driver_version, gpus)
                .map_err(|e| {
                    anyhow::anyhow!("node {}: recorded MIG state is invalid: {e}", n.hostname)
                })?;
            nodes.insert(n.id, Arc::new(sim));
        }
        Ok(Self { nodes })
    }

    pub fn node(&self, id: &str) -> Option<Arc<SimulatedNode>> {
        self.nodes.get(id).cloned()
    }
}
