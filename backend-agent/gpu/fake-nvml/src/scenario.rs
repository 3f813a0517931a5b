//! The scenario file: which host the fake emulates.
//!
//! Read once per NVML initialisation (`nvmlInit_v2` when no other init is open) from the
//! file named by `FAKE_NVML_SCENARIO`, else from `fake-nvml.toml` in the directory of the
//! loaded library, else the default host: 8 x H100-80GB, MIG off, root.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A model of [`crate::host::MODELS`]: "H100-80GB", "H100-94GB", "H200-141GB",
    /// "A100-40GB", "A100-80GB", "B200", "GH200", "GH200-144GB", "L40S".
    #[serde(default = "default_model")]
    pub model: String,
    #[serde(default = "default_count")]
    pub count: u32,
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// As NVML reports it: 12040 is CUDA 12.4.
    #[serde(default = "default_cuda")]
    pub cuda_version: i32,
    /// False: the caller is not root, so the queries nvml.h marks "Requires privileged
    /// user" answer NVML_ERROR_NO_PERMISSION.
    #[serde(default = "yes")]
    pub privileged: bool,
    /// MIG mode of every GPU not listed in `gpu`.
    #[serde(default)]
    pub mig: bool,
    /// NVML index i shows physical GPU `index_order[i]` (index order is not stable across
    /// reboots; UUIDs are).
    #[serde(default)]
    pub index_order: Vec<u32>,
    /// Varies the UUIDs (another host).
    #[serde(default)]
    pub uuid_seed: u32,
    #[serde(default)]
    pub gpu: Vec<GpuSpec>,
    #[serde(default)]
    pub profile_patch: Vec<ProfilePatch>,
    #[serde(default)]
    pub fault: Vec<Fault>,
}

/// One physical GPU's state and injected conditions.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Physical GPU number (before `index_order`).
    pub index: u32,
    pub mig: Option<bool>,
    /// The pending MIG mode, when it differs from the current one (left by an earlier
    /// change that did not activate).
    pub mig_pending: Option<bool>,
    /// "ok", "no_permission" (the device itself cannot be opened) or "lost" (fallen off
    /// the bus).
    #[serde(default)]
    pub access: Access,
    /// A compute process runs on the GPU (MIG off): MIG mode changes do not activate.
    #[serde(default)]
    pub busy: bool,
    /// Starts of GPU instances with a running process.
    #[serde(default)]
    pub busy_instances: Vec<u32>,
    /// What activating a MIG mode change answers: "ok", "in_use" (another client holds
    /// the GPU) or "reset_required".
    #[serde(default)]
    pub mig_activation: Activation,
    #[serde(default)]
    pub instances: Vec<InstanceSpec>,
    pub remapped_rows: Option<RemappedRows>,
    #[serde(default)]
    pub retired_pages_pending: bool,
    #[serde(default)]
    pub ecc_uncorrected: u64,
    pub persistence: Option<bool>,
    pub temperature: Option<u32>,
    pub power_mw: Option<u32>,
    #[serde(default)]
    pub throttle: u64,
    /// Corrected (single-bit) ECC errors, volatile and aggregate.
    #[serde(default)]
    pub ecc_corrected: u64,
    /// The PCIe link now, when degraded (the maximum is Gen5 x16).
    pub pcie: Option<PcieSpec>,
    /// XID codes delivered once each to an event set registered for critical XIDs.
    #[serde(default)]
    pub xids: Vec<u64>,
    /// NVLink links (of 18) reported down.
    #[serde(default)]
    pub nvlink_down: Vec<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieSpec {
    pub gen: u32,
    pub width: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    #[default]
    Ok,
    NoPermission,
    Lost,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    #[default]
    Ok,
    InUse,
    ResetRequired,
}

/// A GPU instance present at start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// GPU-instance profile id (19, 20, 15, 14, 9, 5, 0).
    pub profile: u32,
    pub start: u32,
    /// Its compute instance: "full" (the default), "none" (an incomplete instance) or
    /// "nvl" (the 7-slice NVL compute-instance profile, index 8, on a 7-slice instance).
    #[serde(default)]
    pub compute: Compute,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compute {
    #[default]
    Full,
    None,
    Nvl,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    #[serde(default)]
    pub correctable: u32,
    #[serde(default)]
    pub uncorrectable: u32,
    #[serde(default)]
    pub pending: bool,
    #[serde(default)]
    pub failure: bool,
}

/// Changes one GPU-instance profile of the table every GPU reports (to emulate a driver
/// whose table differs from the catalog).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilePatch {
    pub id: u32,
    pub slice_count: Option<u32>,
    pub instance_count: Option<u32>,
    pub placement_size: Option<u32>,
    pub starts: Option<Vec<u32>>,
}

/// The `call`-th call (from 1, counted since initialisation) of `function` returns `code`
/// instead of doing anything.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub function: String,
    pub call: u32,
    pub code: u32,
}

fn default_model() -> String {
    "H100-80GB".into()
}
fn default_count() -> u32 {
    8
}
fn default_driver() -> String {
    "550.54.15".into()
}
fn default_cuda() -> i32 {
    12040
}
fn yes() -> bool {
    true
}

impl Default for Scenario {
    fn default() -> Self {
        toml::from_str("").expect("the empty scenario is valid")
    }
}

/// The scenario to emulate, and where it came from (for error messages).
pub fn load() -> Result<Scenario, String> {
    let path = match std::env::var_os("FAKE_NVML_SCENARIO").filter(|p| !p.is_empty()) {
        Some(p) => Some(std::path::PathBuf::from(p)),
        None => own_dir()
            .map(|d| d.join("fake-nvml.toml"))
            .filter(|p| p.exists()),
    };
    let Some(path) = path else {
        return Ok(Scenario::default());
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("fake-nvml: cannot read {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("fake-nvml: {}: {e}", path.display()))
}

/// The directory of this loaded library (so each copy of it can carry its own scenario).
fn own_dir() -> Option<std::path::PathBuf> {
    let mut info: libc::Dl_info = unsafe {
        // SAFETY: Dl_info is plain C data (pointers and integers); all-zero is valid.
        std::mem::zeroed()
    };
    let addr = own_dir as *const libc::c_void;
    // SAFETY: `addr` is an address inside this library; dladdr only writes `info`.
    let found = unsafe { libc::dladdr(addr, &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated path that lives as long as the
    // library stays loaded; it is copied out at once.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::PathBuf::from(std::ffi::OsStr::new(
        std::str::from_utf8(name.to_bytes()).ok()?,
    ));
    path.parent().map(|p| p.to_path_buf())
}
