//! This host's GPU backend: NVML (real GPUs) or a sample simulated node, for the agent and
//! for `hw-check`.

use std::path::Path;

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, NvmlBackend, SimulatedNode};

/// Which GPUs a command drives: simulated ones, or this host's through NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hardware {
    Sim,
    Nvml,
}

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
            let node = SimulatedNode::new(
                "sim-node-01",
                model,
                8,
                gpufleet_gpu::catalog::DEFAULT_DRIVER,
            );
            gpufleet_gpu::hardware::check_report(&node)
        }
    };
    report.map_err(|e| anyhow::anyhow!("{e}"))
}
