//! One node's GPUs: the backend trait, its data types, and the operations built on it.
//!
//! Backends: [`SimulatedNode`] (rule-enforcing, with fault injection) and [`NvmlBackend`]
//! (real hardware through NVML). [`apply_layout`] / [`clear_layout`] run the safe
//! re-partition sequence on any backend; [`check_report`] is the read-only report.

mod apply;
mod nvml;
mod nvml_decode;
mod report;
mod sim;

pub use apply::{apply_layout, clear_layout};
pub use nvml::NvmlBackend;
pub use nvml_decode::{
    decode_c_string, decode_cuda_version, decode_placement, decode_profile_info, throttle_findings,
    RawPlacement, RawProfileInfo,
};
pub use report::check_report;
pub use sim::SimulatedNode;

use serde::{Deserialize, Serialize};

/// One MIG device: a GPU instance with its (single, full-size) compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub profile_id: u32,
    pub profile: String,
    /// First memory slice of the placement.
    pub start: u8,
    /// Placement size in memory slices.
    pub size: u8,
    pub memory_mib: u64,
    /// "MIG-..." as CUDA_VISIBLE_DEVICES accepts it.
    pub uuid: String,
}

/// One physical GPU with its MIG state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    /// "GPU-...".
    pub uuid: String,
    /// Catalog model name (e.g. "H100-80GB"), or NVML's name when the catalog lacks it.
    pub model: String,
    pub memory_mib: u64,
    pub mig_enabled: bool,
    /// MIG instances in increasing start order.
    pub instances: Vec<MigInstance>,
}

/// Health counters of one GPU; `None` where the GPU does not report the counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    pub index: u32,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub ecc_uncorrected: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    /// False when any finding makes the GPU unfit for work.
    pub healthy: bool,
    /// Sentences about anything noteworthy (pending retirement, ECC errors, throttling).
    pub findings: Vec<String>,
}

/// What runs on a GPU right now, as far as re-partitioning cares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusyState {
    /// Processes use the GPU as a whole (MIG off).
    pub whole_gpu: bool,
    /// Starts of MIG instances with running processes.
    pub instance_starts: Vec<u8>,
}

/// Hardware errors; `Display` is a sentence a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HwError {
    #[error("{0}")]
    NoDriver(String),
    #[error("gpu: no GPU with index {0} on this node")]
    InvalidGpu(u32),
    #[error("{0}")]
    Rule(String),
    #[error("gpu {gpu}: work is running on {}; stop it before re-partitioning", instances.join(", "))]
    InUse { gpu: u32, instances: Vec<String> },
    #[error("injected fault: {0}")]
    Injected(String),
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// One node's GPUs. Implementations must be safe to share between threads.
pub trait GpuBackend: Send + Sync {
    fn hostname(&self) -> String;
    fn driver_version(&self) -> Result<String, HwError>;
    /// CUDA version the driver supports, e.g. "12.4".
    fn cuda_version(&self) -> Result<String, HwError>;
    /// Inventory including MIG state.
    fn gpus(&self) -> Result<Vec<GpuInfo>, HwError>;
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError>;
    /// Creates a GPU instance of `profile_id` at `start` and its full compute instance.
    fn create_instance(&self, gpu: u32, profile_id: u32, start: u8)
        -> Result<MigInstance, HwError>;
    /// Destroys the instance starting at `start` (compute instances first).
    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError>;
    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError>;
    /// What runs on the GPU now; backends that cannot tell report nothing running.
    fn busy(&self, gpu: u32) -> Result<BusyState, HwError> {
        let _ = gpu;
        Ok(BusyState::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_sentences() {
        let e = HwError::InUse {
            gpu: 1,
            instances: vec!["3g.40gb@0 (MIG-a)".into(), "1g.10gb@4 (MIG-b)".into()],
        };
        assert_eq!(
            e.to_string(),
            "gpu 1: work is running on 3g.40gb@0 (MIG-a), 1g.10gb@4 (MIG-b); stop it before re-partitioning"
        );
        assert_eq!(
            HwError::InvalidGpu(9).to_string(),
            "gpu: no GPU with index 9 on this node"
        );
    }
}
