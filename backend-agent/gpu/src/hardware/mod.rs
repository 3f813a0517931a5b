//! One node's GPUs: the backend trait, its data types, and the operations built on it.
//!
//! Backends: [`SimulatedNode`] (rule-enforcing, with fault injection) and [`NvmlBackend`]
//! (real hardware through NVML). [`apply_layout`] / [`clear_layout`] run the safe
//! re-partition sequence on any backend; [`check_report`] is the read-only report.

mod apply;
mod nvml;
mod nvml_decode;
mod readings;
mod report;
mod sim;

pub use apply::{apply_layout, clear_layout};
pub use nvml::{NvmlBackend, NO_DRIVER_MESSAGE};
pub use nvml_decode::{
    compare_profile_tables, decode_c_string, decode_cuda_version, decode_placement,
    decode_profile_info, throttle_findings, RawPlacement, RawProfileInfo,
};
pub use readings::{EccCounts, GpuReadings, NvlinkErrors, PcieLink, Reading};
pub use report::check_report;
pub use sim::{LoadFaults, SimulatedNode};

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

/// How much of one GPU is in use now (what a team's dashboard shows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Percent of the last sample period the GPU was busy (NVML's `utilization.gpu`);
    /// `None` where it cannot be read while the memory can (NVML under MIG).
    pub utilization_percent: Option<u32>,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
}

/// Health counters of one GPU; `None` where the GPU does not report the counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    pub index: u32,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub ecc_uncorrected: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    /// Row remapping (A100/H100/H200 use it instead of page retirement).
    #[serde(default)]
    pub remapped_rows: RowRemap,
    /// False when any finding makes the GPU unfit for work.
    pub healthy: bool,
    /// Sentences about anything noteworthy (pending retirement, ECC errors, throttling).
    pub findings: Vec<String>,
}

/// Row-remapping counters (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowRemap {
    /// Not read, or the query failed.
    #[default]
    Unknown,
    /// The GPU does not remap rows (pre-Ampere, or a model without HBM remapping).
    Unsupported,
    /// NVML does not report remapped rows while MIG is enabled.
    NotUnderMig,
    Counts {
        correctable: u32,
        uncorrectable: u32,
        /// Remappings wait for a GPU reset.
        pending: bool,
        /// A remapping failed at some point: the GPU needs service.
        failure: bool,
    },
}

/// One GPU as the read-only inventory sees it: what could be read, and what could not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuStatus {
    pub index: u32,
    /// "GPU-..." where it could be read.
    pub uuid: Option<String>,
    /// The GPU, or why it could not be read (no permission, fallen off the bus, ...).
    pub info: Result<GpuInfo, HwError>,
    /// The MIG mode that takes effect at the next activation (GPU reset), where the
    /// hardware reports one; differs from `info.mig_enabled` while a change is pending.
    pub mig_pending: Option<bool>,
    /// Driver persistence mode, where reported.
    pub persistence_mode: Option<bool>,
    /// False when the memory total could not be read (e.g. NVML answers NO_PERMISSION for
    /// a MIG-enabled GPU's total without root); `memory_mib` is then the catalog's figure.
    pub memory_known: bool,
    /// Starts of GPU instances without a compute instance (unusable until recreated).
    pub incomplete: Vec<u8>,
}

impl GpuStatus {
    /// The status of a GPU read without trouble (what simple backends report).
    pub fn of(info: GpuInfo) -> Self {
        Self {
            index: info.index,
            uuid: Some(info.uuid.clone()),
            mig_pending: Some(info.mig_enabled),
            persistence_mode: None,
            memory_known: true,
            incomplete: Vec::new(),
            info: Ok(info),
        }
    }
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
    /// One GPU, read without depending on the others (a lost GPU elsewhere on the node
    /// does not stop work on this one).
    fn gpu(&self, gpu: u32) -> Result<GpuInfo, HwError> {
        self.gpus()?
            .into_iter()
            .find(|g| g.index == gpu)
            .ok_or(HwError::InvalidGpu(gpu))
    }
    /// Every GPU with what could not be read about it; fails only when the GPUs cannot be
    /// counted at all.
    fn inventory(&self) -> Result<Vec<GpuStatus>, HwError> {
        Ok(self.gpus()?.into_iter().map(GpuStatus::of).collect())
    }
    /// Problems that make this host unfit to be driven (not privileged enough, a profile
    /// table that contradicts the catalog); empty when none.
    fn preflight(&self) -> Vec<String> {
        Vec::new()
    }
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError>;
    /// Creates a GPU instance of `profile_id` at `start` and its full compute instance.
    fn create_instance(&self, gpu: u32, profile_id: u32, start: u8)
        -> Result<MigInstance, HwError>;
    /// Destroys the instance starting at `start` (compute instances first).
    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError>;
    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError>;
    /// Every counter the node's health checks read (ECC, retirement, XIDs since the
    /// previous call, temperature, power, throttling, PCIe, NVLink); what a backend
    /// cannot read carries the reason. XIDs are consumed: the next call reports new ones.
    fn readings(&self, gpu: u32) -> Result<GpuReadings, HwError> {
        let uuid = self.gpu(gpu)?.uuid;
        Ok(GpuReadings::from_health(&uuid, &self.health(gpu)?))
    }
    /// Utilisation and memory in use now; backends that cannot read them say so.
    fn usage(&self, gpu: u32) -> Result<GpuUsage, HwError> {
        let _ = gpu;
        Err(HwError::Unsupported(
            "this backend reads no utilisation or memory use".into(),
        ))
    }
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
