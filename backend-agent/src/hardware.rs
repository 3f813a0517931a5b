//! The GPU backends behind `--hardware`, and the store's record of a node's GPUs.
//!
//! - `--hardware sim` (default): every node of the fleet is a `SimulatedNode`, rebuilt
//!   from the store's records on start and driven by its embedded agent.
//! - `--hardware nvml`: the fleet is this host alone, one pool node whose embedded agent
//!   drives its real GPUs through NVML (seeded from its inventory by `crate::host`).

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, GpuInfo, MigInstance, NvmlBackend, SimulatedNode};
use rusqlite::Connection;
use std::path::Path;

use crate::cli::Hardware;
use crate::store;

/// NVML from `library` (`--nvml-lib`), or the system's libnvidia-ml.so.1 when `None`.
/// Fails with a clear message where no NVIDIA driver is present.
pub fn open_nvml(library: Option<&Path>) -> anyhow::Result<NvmlBackend> {
    NvmlBackend::with_library(library).map_err(|e| anyhow::anyhow!("--hardware nvml: {e}"))
}

/// NVML for an agent that will drive the GPUs: also refuses a host it cannot drive (not
/// root, or an NVML profile table that contradicts the catalog), saying why.
pub fn require_nvml(library: Option<&Path>) -> anyhow::Result<NvmlBackend> {
    let nvml = open_nvml(library)?;
    let problems = nvml.preflight();
    if !problems.is_empty() {
        anyhow::bail!("--hardware nvml: {}", problems.join("\n"));
    }
    Ok(nvml)
}

/// The read-only report of `hw-check`: a real host through NVML (from `library` when
/// given), or a sample simulated node.
pub fn check_report(hardware: Hardware, library: Option<&Path>) -> anyhow::Result<String> {
    let report = match hardware {
        Hardware::Nvml => gpufleet_gpu::hardware::check_report(&open_nvml(library)?),
        Hardware::Sim => {
            let model =
                gpufleet_gpu::catalog::model("H100-80GB").context("catalog lacks H100-80GB")?;
            let node = SimulatedNode::new("sim-node-01", model, 8, crate::fleet::DEFAULT_DRIVER);
            gpufleet_gpu::hardware::check_report(&node)
        }
    };
    report.map_err(|e| anyhow::anyhow!("{e}"))
}

/// A node's GPUs as the store last recorded them (what its agent verified).
pub fn recorded_gpus(conn: &Connection, node_id: &str) -> rusqlite::Result<Vec<GpuInfo>> {
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
    conn: &Connection,
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
