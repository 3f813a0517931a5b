//! The GPU backends behind `--hardware`, and the control plane's per-node hardware map.
//!
//! - `--hardware sim` (default): every node of the fleet is a `SimulatedNode`, rebuilt
//!   from the store's records on start; `sim-faults.toml` can inject faults into them.
//! - `--hardware nvml`: the fleet is this host alone, one pool node driven through NVML
//!   (seeded from its inventory by `crate::host`); MIG changes go to the real GPUs.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, GpuInfo, MigInstance, NvmlBackend, SimulatedNode};
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

/// One node's GPUs as the control plane drives them. Simulated nodes stay typed as such
/// so that fault injection (`sim-faults.toml`) reaches them and nothing else.
#[derive(Clone)]
pub enum NodeBackend {
    Simulated(Arc<SimulatedNode>),
    /// Real GPUs (this host through NVML).
    Real(Arc<dyn GpuBackend>),
}

impl NodeBackend {
    /// The backend every MIG operation goes through, whatever the kind.
    pub fn backend(&self) -> Arc<dyn GpuBackend> {
        match self {
            NodeBackend::Simulated(sim) => sim.clone(),
            NodeBackend::Real(real) => real.clone(),
        }
    }

    /// The simulated node, for fault injection; `None` for real hardware.
    pub fn simulated(&self) -> Option<&Arc<SimulatedNode>> {
        match self {
            NodeBackend::Simulated(sim) => Some(sim),
            NodeBackend::Real(_) => None,
        }
    }
}

/// The hardware of every node, by node id.
pub struct NodeHardware {
    nodes: HashMap<String, NodeBackend>,
}

impl NodeHardware {
    /// Rebuilds every node of the store as a simulated node (MIG mode and instances).
    pub fn simulated(conn: &Connection) -> anyhow::Result<Self> {
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
            nodes.insert(n.id, NodeBackend::Simulated(Arc::new(sim)));
        }
        Ok(Self { nodes })
    }

    /// One node, `node_id`, on real hardware (the host node of `--hardware nvml`).
    pub fn single(node_id: &str, backend: Arc<dyn GpuBackend>) -> Self {
        Self {
            nodes: HashMap::from([(node_id.to_string(), NodeBackend::Real(backend))]),
        }
    }

    pub fn node(&self, id: &str) -> Option<NodeBackend> {
        self.nodes.get(id).cloned()
    }
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
