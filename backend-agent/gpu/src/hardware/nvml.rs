//! Real GPUs through NVML.
//!
//! Inventory, MIG mode, health and versions go through nvml-wrapper's API. GPU/compute
//! instance creation, destruction and placements go through the raw NVML symbol table
//! (`Nvml::lib()` + `Device::handle()`): nvml-wrapper 0.13 lacks them, and its
//! `possible_placements` returns an empty list. Raw values are decoded by the pure
//! functions in `nvml_decode`.

use super::nvml_decode::{
    compare_profile_tables, decode_cuda_version, decode_placement, decode_profile_info,
    throttle_findings, RawPlacement, RawProfileInfo,
};
use super::{BusyState, GpuBackend, GpuHealth, GpuInfo, GpuStatus, HwError, MigInstance, RowRemap};
use crate::catalog::{self, MigProfile};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use std::os::raw::c_uint;
use std::path::Path;
use std::sync::Mutex;

mod readings;

/// What `NvmlBackend::new` says where the driver library cannot be loaded.
pub const NO_DRIVER_MESSAGE: &str = "NVIDIA driver library libnvidia-ml.so.1 not found: this host has no NVIDIA driver; use --hardware sim";

/// Profile indices are enumerated until NVML answers INVALID_ARGUMENT (nvml.h's
/// forward-compatible way); this bounds the loop should a library never answer it.
const MAX_PROFILE_INDEX: u32 = 64;

/// NVML_ERROR_INSUFFICIENT_RESOURCES, which nvml-wrapper 0.13 does not name.
const INSUFFICIENT_RESOURCES: u32 = 23;

/// The node's real GPUs.
pub struct NvmlBackend {
    nvml: Nvml,
    hostname: String,
    /// XID events since the last health reading of each GPU.
    xids: Mutex<readings::XidWatch>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        // The event set must be freed while NVML is still initialised.
        self.stop_xid_watch();
    }
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("hostname", &self.hostname)
            .finish_non_exhaustive()
    }
}

/// One GPU instance as NVML reports it.
struct RawGpuInstance {
    handle: sys::nvmlGpuInstance_t,
    id: u32,
    profile: RawProfileInfo,
    start: u8,
    size: u8,
}

/// Maps an initialisation failure to the error a person can act on.
pub(crate) fn init_error(e: NvmlError) -> HwError {
    match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            HwError::NoDriver(NO_DRIVER_MESSAGE.to_string())
        }
        NvmlError::DriverNotLoaded => HwError::NoDriver(
            "NVIDIA driver library found but the kernel driver is not loaded (modprobe nvidia, or use --hardware sim)"
                .to_string(),
        ),
        NvmlError::NoPermission => HwError::Nvml(
            "no permission to talk to the NVIDIA driver: run the agent as root or in the video group"
                .to_string(),
        ),
        other => HwError::Nvml(format!("initialising NVML failed: {other}")),
    }
}

/// An NVML failure as a sentence: what was being done, and what NVML's code means here.
fn nvml_error(what: &str, e: NvmlError) -> HwError {
    match e {
        NvmlError::NoPermission => HwError::Nvml(format!(
            "{what}: no permission (NVML's MIG queries and changes need root; run the agent as root)"
        )),
        NvmlError::GpuLost => HwError::Nvml(format!(
            "{what}: the GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST); drain the node and reset or service the GPU"
        )),
        NvmlError::UnexpectedVariant(INSUFFICIENT_RESOURCES) => {
            HwError::Nvml(format!("{what}: insufficient resources"))
        }
        other => HwError::Nvml(format!("{what}: {other}")),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

fn describe(i: &MigInstance) -> String {
    format!(
        "{}@{} (slices {}-{})",
        i.profile,
        i.start,
        i.start,
        i.start + i.size.max(1) - 1
    )
}

impl NvmlBackend {
    /// Loads the system's libnvidia-ml.so.1 and initialises NVML.
    pub fn new() -> Result<Self, HwError> {
        Self::with_library(None)
    }

    /// Loads NVML from `library` (e.g. a test double), or the system's library when
    /// `None`, and initialises it.
    pub fn with_library(library: Option<&Path>) -> Result<Self, HwError> {
        let nvml = match library {
            None => Nvml::init().map_err(init_error)?,
            Some(path) => {
                Nvml::builder()
                    .lib_path(path.as_os_str())
                    .init()
                    .map_err(|e| match e {
                        NvmlError::LibloadingError(err) => HwError::NoDriver(format!(
                            "NVML library {} cannot be loaded: {err}",
                            path.display()
                        )),
                        other => init_error(other),
                    })?
            }
        };
        let backend = Self {
            nvml,
            hostname: hostname(),
            xids: Mutex::default(),
        };
        // From here on XIDs are caught; the first health reading reports those since now.
        backend.start_xid_watch();
        Ok(backend)
    }

    fn count(&self) -> Result<u32, HwError> {
        self.nvml
            .device_count()
            .map_err(|e| nvml_error("counting GPUs", e))
    }

    /// A fresh handle for `gpu` (handles are taken anew for every operation: a MIG mode
    /// change may reset the device and invalidate what was read before).
    fn device(&self, gpu: u32) -> Result<Device<'_>, HwError> {
        if gpu >= self.count()? {
            return Err(HwError::InvalidGpu(gpu));
        }
        self.nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_error(&format!("gpu {gpu}"), e))
    }

    /// Every GPU-instance profile this device supports: indices from 0 until NVML answers
    /// INVALID_ARGUMENT, skipping NOT_SUPPORTED; any other answer (no permission, GPU
    /// lost) is an error, never "no profiles".
    fn profile_infos(&self, gpu: u32, device: &Device<'_>) -> Result<Vec<RawProfileInfo>, HwError> {
        let lib = self.nvml.lib();
        let sym = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstanceProfileInfo", e))?;
        let mut out: Vec<RawProfileInfo> = Vec::new();
        for index in 0..MAX_PROFILE_INDEX {
            // SAFETY: the handle comes from a live Device; `info` is a plain C struct
            // NVML fills in; the zeroed value is a valid bit pattern for it.
            let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let ret = unsafe { sym(device.handle(), index, &mut info) };
            match nvml_try(ret) {
                Ok(()) => {
                    if !out.iter().any(|p| p.id == info.id) {
                        out.push(RawProfileInfo {
                            id: info.id,
                            slice_count: info.sliceCount,
                            instance_count: info.instanceCount,
                            memory_size_mb: info.memorySizeMB,
                        });
                    }
                }
                Err(NvmlError::InvalidArg) => break,
                Err(NvmlError::NotSupported) => continue,
                Err(e) => {
                    return Err(nvml_error(
                        &format!("gpu {gpu}: reading MIG profile {index}"),
                        e,
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Possible placements of one profile (what `possible_placements` should return).
    pub fn possible_placements(&self, gpu: u32, profile_id: u32) -> Result<Vec<(u8, u8)>, HwError> {
        let device = self.device(gpu)?;
        self.placements_of(gpu, &device, profile_id)
    }

    fn placements_of(
        &self,
        gpu: u32,
        device: &Device<'_>,
        profile_id: u32,
    ) -> Result<Vec<(u8, u8)>, HwError> {
        let lib = self.nvml.lib();
        let sym = nvml_sym(lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstancePossiblePlacements_v2", e))?;
        let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 8];
        // In/out: the buffer's length in, the number of placements out.
        let mut count: c_uint = buf.len() as c_uint;
        // SAFETY: `buf` holds `count` elements; NVML writes at most that many and sets count.
        let ret = unsafe { sym(device.handle(), profile_id, buf.as_mut_ptr(), &mut count) };
        nvml_try(ret).map_err(|e| {
            nvml_error(&format!("gpu {gpu}: placements of profile {profile_id}"), e)
        })?;
        buf[..(count as usize).min(buf.len())]
            .iter()
            .map(|p| {
                decode_placement(RawPlacement {
                    start: p.start,
                    size: p.size,
                })
            })
            .collect::<Result<_, _>>()
            .map_err(HwError::Nvml)
    }

    /// NVML's MIG profile table of `gpu`, catalog-shaped (names from the catalog model
    /// where it knows the id).
    pub fn profile_table(&self, gpu: u32) -> Result<Vec<MigProfile>, HwError> {
        let device = self.device(gpu)?;
        let model = self.catalog_model(&device);
        let mut out = Vec::new();
        for raw in self.profile_infos(gpu, &device)? {
            let placements: Vec<RawPlacement> = self
                .placements_of(gpu, &device, raw.id)?
                .into_iter()
                .map(|(start, size)| RawPlacement {
                    start: start as u32,
                    size: size as u32,
                })
                .collect();
            out.push(decode_profile_info(model, raw, &placements).map_err(HwError::Nvml)?);
        }
        Ok(out)
    }

    /// All GPU instances on the device, across profiles.
    fn gpu_instances(&self, gpu: u32, device: &Device<'_>) -> Result<Vec<RawGpuInstance>, HwError> {
        let lib = self.nvml.lib();
        let list = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstances", e))?;
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetInfo", e))?;
        let mut out = Vec::new();
        for profile in self.profile_infos(gpu, device)? {
            // The header: "the buffer must be large enough to accommodate the instances
            // supported by the profile"; the count goes in as the buffer's length.
            let mut handles: Vec<sys::nvmlGpuInstance_t> =
                vec![std::ptr::null_mut(); profile.instance_count.max(1) as usize];
            let mut count: c_uint = handles.len() as c_uint;
            // SAFETY: `handles` has room for `count` handles.
            let ret = unsafe {
                list(
                    device.handle(),
                    profile.id,
                    handles.as_mut_ptr(),
                    &mut count,
                )
            };
            nvml_try(ret).map_err(|e| {
                nvml_error(
                    &format!("gpu {gpu}: listing GPU instances of profile {}", profile.id),
                    e,
                )
            })?;
            for &handle in &handles[..(count as usize).min(handles.len())] {
                let (id, start, size) = self.gpu_instance_info(gpu, handle, info_sym)?;
                out.push(RawGpuInstance {
                    handle,
                    id,
                    profile,
                    start,
                    size,
                });
            }
        }
        out.sort_by_key(|g| g.start);
        Ok(out)
    }

    /// (id, start, size) of a GPU instance.
    fn gpu_instance_info(
        &self,
        gpu: u32,
        handle: sys::nvmlGpuInstance_t,
        info_sym: &unsafe extern "C" fn(
            sys::nvmlGpuInstance_t,
            *mut sys::nvmlGpuInstanceInfo_t,
        ) -> sys::nvmlReturn_t,
    ) -> Result<(u32, u8, u8), HwError> {
        // SAFETY: `handle` was just returned by NVML for this device; `info` is plain C data.
        let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        nvml_try(unsafe { info_sym(handle, &mut info) })
            .map_err(|e| nvml_error(&format!("gpu {gpu}: reading a GPU instance"), e))?;
        let (start, size) = decode_placement(RawPlacement {
            start: info.placement.start,
            size: info.placement.size,
        })
        .map_err(HwError::Nvml)?;
        Ok((info.id, start, size))
    }

    /// Every compute instance of a GPU instance, across compute-instance profiles
    /// (enumerated until INVALID_ARGUMENT, so profiles newer than nvml-wrapper's
    /// bindings, like 7-slice NVL, are found too).
    fn compute_instances(
        &self,
        gpu: u32,
        gi: sys::nvmlGpuInstance_t,
    ) -> Result<Vec<sys::nvmlComputeInstance_t>, HwError> {
        let lib = self.nvml.lib();
        let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetComputeInstances", e))?;
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetComputeInstanceProfileInfo", e))?;
        let mut out = Vec::new();
        for profile in 0..MAX_PROFILE_INDEX {
            // SAFETY: `gi` is a live GPU instance handle; `info` is plain C data.
            let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let ret = unsafe {
                info_sym(
                    gi,
                    profile,
                    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                )
            };
            match nvml_try(ret) {
                Ok(()) => {}
                Err(NvmlError::InvalidArg) => break,
                Err(NvmlError::NotSupported) => continue,
                Err(e) => {
                    return Err(nvml_error(
                        &format!("gpu {gpu}: reading compute-instance profile {profile}"),
                        e,
                    ))
                }
            }
            let mut cis: Vec<sys::nvmlComputeInstance_t> =
                vec![std::ptr::null_mut(); info.instanceCount.max(1) as usize];
            let mut count: c_uint = cis.len() as c_uint;
            // SAFETY: `cis` has room for `count` handles.
            nvml_try(unsafe { list(gi, info.id, cis.as_mut_ptr(), &mut count) })
                .map_err(|e| nvml_error(&format!("gpu {gpu}: listing compute instances"), e))?;
            out.extend_from_slice(&cis[..(count as usize).min(cis.len())]);
        }
        Ok(out)
    }

    /// UUIDs of MIG devices keyed by GPU-instance id.
    fn mig_uuids<'n>(
        &'n self,
        gpu: u32,
        device: &Device<'n>,
    ) -> Result<Vec<(u32, String, Device<'n>)>, HwError> {
        let lib = self.nvml.lib();
        let gi_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstanceId", e))?;
        let max = device
            .mig_device_count()
            .map_err(|e| nvml_error(&format!("gpu {gpu}: counting MIG devices"), e))?;
        let mut out = Vec::new();
        for i in 0..max {
            let mig = match device.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound) => continue,
                Err(e) => return Err(nvml_error(&format!("gpu {gpu}: MIG device {i}"), e)),
            };
            let mut id: c_uint = 0;
            // SAFETY: `mig` is a live MIG device handle from NVML.
            nvml_try(unsafe { gi_id(mig.handle(), &mut id) })
                .map_err(|e| nvml_error(&format!("gpu {gpu}: MIG device {i}"), e))?;
            let uuid = mig
                .uuid()
                .map_err(|e| nvml_error(&format!("gpu {gpu}: MIG device {i} UUID"), e))?;
            out.push((id, uuid, mig));
        }
        Ok(out)
    }

    /// The GPU's MIG instances, and the starts of those without a compute instance.
    fn instances(
        &self,
        gpu: u32,
        device: &Device<'_>,
    ) -> Result<(Vec<MigInstance>, Vec<u8>), HwError> {
        let model = self.catalog_model(device);
        let uuids = self.mig_uuids(gpu, device)?;
        let mut incomplete = Vec::new();
        let mut out = Vec::new();
        for g in self.gpu_instances(gpu, device)? {
            if self.compute_instances(gpu, g.handle)?.is_empty() {
                incomplete.push(g.start);
            }
            out.push(MigInstance {
                profile_id: g.profile.id,
                profile: model
                    .and_then(|m| m.profile_by_id(g.profile.id))
                    .map(|p| p.name.clone())
                    .unwrap_or_else(|| format!("profile {}", g.profile.id)),
                start: g.start,
                size: g.size,
                memory_mib: g.profile.memory_size_mb,
                uuid: uuids
                    .iter()
                    .find(|(id, _, _)| *id == g.id)
                    .map(|(_, u, _)| u.clone())
                    .unwrap_or_default(),
            });
        }
        Ok((out, incomplete))
    }

    fn catalog_model(&self, device: &Device<'_>) -> Option<&'static catalog::GpuModel> {
        let name = device.name().ok()?;
        match device.memory_info() {
            Ok(m) => catalog::model_for_nvml(&name, m.total / (1024 * 1024)),
            Err(_) => catalog::model_for_nvml_name(&name),
        }
    }

    /// Reads one GPU; failures land in the status, not in the result.
    fn read_gpu(&self, index: u32) -> GpuStatus {
        let mut status = GpuStatus {
            index,
            uuid: None,
            info: Err(HwError::InvalidGpu(index)),
            mig_pending: None,
            persistence_mode: None,
            memory_known: false,
            incomplete: Vec::new(),
        };
        let result = (|| {
            let device = self.device(index)?;
            let uuid = device
                .uuid()
                .map_err(|e| nvml_error(&format!("gpu {index}: UUID"), e))?;
            status.uuid = Some(uuid.clone());
            let name = device
                .name()
                .map_err(|e| nvml_error(&format!("gpu {index}: name"), e))?;
            // Without root NVML refuses a MIG-enabled GPU's total: unknown, not fatal.
            let memory = match device.memory_info() {
                Ok(m) => Some(m.total / (1024 * 1024)),
                Err(NvmlError::NoPermission) => None,
                Err(e) => return Err(nvml_error(&format!("gpu {index}: memory"), e)),
            };
            status.memory_known = memory.is_some();
            let (mig_enabled, pending) = match device.mig_mode() {
                Ok(m) => (m.current == 1, Some(m.pending == 1)),
                Err(NvmlError::NotSupported) => (false, None),
                Err(e) => return Err(nvml_error(&format!("gpu {index}: MIG mode"), e)),
            };
            status.mig_pending = pending;
            status.persistence_mode = device.is_in_persistent_mode().ok();
            let model = match memory {
                Some(mib) => catalog::model_for_nvml(&name, mib),
                None => catalog::model_for_nvml_name(&name),
            };
            let instances = if mig_enabled {
                let (instances, incomplete) = self.instances(index, &device)?;
                status.incomplete = incomplete;
                instances
            } else {
                Vec::new()
            };
            Ok(GpuInfo {
                index,
                uuid,
                model: model.map(|m| m.name.clone()).unwrap_or(name),
                memory_mib: memory.or(model.map(|m| m.memory_mib)).unwrap_or(0),
                mig_enabled,
                instances,
            })
        })();
        status.info = result;
        status
    }

    /// Creates the full-size compute instance inside a fresh GPU instance.
    fn create_compute_instance(
        &self,
        gpu: u32,
        gi: sys::nvmlGpuInstance_t,
        slices: u32,
    ) -> Result<(), HwError> {
        let lib = self.nvml.lib();
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetComputeInstanceProfileInfo", e))?;
        let create = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceCreateComputeInstance", e))?;
        for profile in 0..MAX_PROFILE_INDEX {
            // SAFETY: `gi` is a live GPU instance handle; `info` is plain C data.
            let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let ret = unsafe {
                info_sym(
                    gi,
                    profile,
                    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                )
            };
            match nvml_try(ret) {
                Ok(()) if info.sliceCount == slices => {}
                Ok(()) | Err(NvmlError::NotSupported) => continue,
                Err(NvmlError::InvalidArg) => break,
                Err(e) => {
                    return Err(nvml_error(
                        &format!("gpu {gpu}: reading compute-instance profile {profile}"),
                        e,
                    ))
                }
            }
            let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
            // SAFETY: as above; NVML writes the new handle into `ci`.
            return nvml_try(unsafe { create(gi, info.id, &mut ci) })
                .map_err(|e| nvml_error(&format!("gpu {gpu}: creating the compute instance"), e));
        }
        Err(HwError::Nvml(format!(
            "gpu {gpu}: no compute-instance profile with {slices} slice(s) in this GPU instance"
        )))
    }

    /// Destroys a GPU instance's compute instances, then the GPU instance.
    fn destroy_gpu_instance(
        &self,
        gpu: u32,
        handle: sys::nvmlGpuInstance_t,
        name: &str,
    ) -> Result<(), HwError> {
        let lib = self.nvml.lib();
        let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())
            .map_err(|e| nvml_error("nvmlComputeInstanceDestroy", e))?;
        let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceDestroy", e))?;
        let in_use = |e: NvmlError, what: &str| match e {
            NvmlError::InUse => HwError::InUse {
                gpu,
                instances: vec![name.to_string()],
            },
            other => nvml_error(&format!("gpu {gpu}: {what} of {name}"), other),
        };
        for ci in self.compute_instances(gpu, handle)? {
            // SAFETY: `ci` was just returned by NVML.
            nvml_try(unsafe { destroy_ci(ci) })
                .map_err(|e| in_use(e, "destroying a compute instance"))?;
        }
        // SAFETY: the GPU instance handle is live and now has no compute instances.
        nvml_try(unsafe { destroy_gi(handle) })
            .map_err(|e| in_use(e, "destroying the GPU instance"))
    }

    /// Problems with running as this process: not privileged enough for MIG, or a
    /// profile table that contradicts the catalog. Reads only.
    fn preflight_problems(&self) -> Vec<String> {
        let count = match self.count() {
            Ok(n) => n,
            Err(e) => return vec![e.to_string()],
        };
        let mut problems = Vec::new();
        let mut unprivileged: Vec<u32> = Vec::new();
        for index in 0..count {
            let status = self.read_gpu(index);
            let Ok(info) = &status.info else {
                if let Err(e) = &status.info {
                    if e.to_string().contains("no permission") {
                        unprivileged.push(index);
                    }
                }
                continue;
            };
            if !status.memory_known {
                unprivileged.push(index);
                continue;
            }
            let Some(model) = catalog::model(&info.model).filter(|m| m.mig_capable) else {
                continue;
            };
            match self.profile_table(index) {
                Ok(table) => {
                    if let Err(msg) = compare_profile_tables(model, &table) {
                        problems.push(format!("gpu {index}: {msg}"));
                    }
                }
                Err(e) if e.to_string().contains("no permission") => unprivileged.push(index),
                Err(e) => problems.push(e.to_string()),
            }
        }
        if !unprivileged.is_empty() {
            let list: Vec<String> = unprivileged.iter().map(|g| g.to_string()).collect();
            problems.insert(
                0,
                format!(
                    "not privileged: NVML answers NO_PERMISSION on GPU(s) {} (MIG profiles, placements, instances and a MIG-enabled GPU's memory total need root); run gpufleet-agent as root",
                    list.join(", ")
                ),
            );
        }
        problems
    }
}

impl GpuBackend for NvmlBackend {
    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn driver_version(&self) -> Result<String, HwError> {
        self.nvml
            .sys_driver_version()
            .map_err(|e| nvml_error("driver version", e))
    }

    fn cuda_version(&self) -> Result<String, HwError> {
        self.nvml
            .sys_cuda_driver_version()
            .map(decode_cuda_version)
            .map_err(|e| nvml_error("CUDA driver version", e))
    }

    /// Every GPU; fails naming each GPU that could not be read (`inventory` reports them
    /// one by one instead).
    fn gpus(&self) -> Result<Vec<GpuInfo>, HwError> {
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for status in self.inventory()? {
            match status.info {
                Ok(info) => ok.push(info),
                Err(e) => failed.push(match status.uuid {
                    Some(uuid) => format!("gpu {} ({uuid}): {e}", status.index),
                    None => e.to_string(),
                }),
            }
        }
        if failed.is_empty() {
            Ok(ok)
        } else {
            Err(HwError::Nvml(format!(
                "{} of {} GPU(s) cannot be read: {}",
                failed.len(),
                failed.len() + ok.len(),
                failed.join("; ")
            )))
        }
    }

    fn gpu(&self, gpu: u32) -> Result<GpuInfo, HwError> {
        if gpu >= self.count()? {
            return Err(HwError::InvalidGpu(gpu));
        }
        self.read_gpu(gpu).info
    }

    fn inventory(&self) -> Result<Vec<GpuStatus>, HwError> {
        Ok((0..self.count()?).map(|i| self.read_gpu(i)).collect())
    }

    fn preflight(&self) -> Vec<String> {
        self.preflight_problems()
    }

    /// Sets the mode and checks its activation status: IN_USE (work or another client
    /// holds the GPU) and RESET_REQUIRED are reported as such, and the pending mode the
    /// failed change left behind is put back, so the GPU does not switch at its next reset
    /// without the control plane knowing.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError> {
        let device = self.device(gpu)?;
        let before = device
            .mig_mode()
            .map_err(|e| nvml_error(&format!("gpu {gpu}: reading MIG mode"), e))?;
        let (current, pending) = (before.current == 1, before.pending == 1);
        if current == enabled && pending == enabled {
            return Ok(());
        }
        if enabled {
            let model = self.catalog_model(&device);
            let floor = model.and_then(|m| catalog::min_mig_driver(&m.name));
            if let (Some(m), Some(floor), Ok(driver)) = (model, floor, self.driver_version()) {
                if catalog::compare_driver_versions(&driver, floor).is_lt() {
                    return Err(HwError::Unsupported(format!(
                        "gpu {gpu}: MIG on {} needs driver {floor} or newer; this host runs {driver}",
                        m.name
                    )));
                }
            }
        }
        let uuid = device.uuid().unwrap_or_default();
        let status = device
            .set_mig_mode(enabled)
            .map_err(|e| nvml_error(&format!("gpu {gpu}: setting MIG mode"), e))?;
        if status != sys::nvmlReturn_enum_NVML_SUCCESS {
            // Put the pending mode back to what runs now (a fresh handle: the attempt may
            // have reset the device).
            let restored = self
                .device(gpu)
                .and_then(|d| {
                    d.set_mig_mode(current)
                        .map_err(|e| nvml_error("restoring the pending MIG mode", e))
                })
                .map(|_| ());
            let note = match &restored {
                Ok(()) => "the pending mode was put back".to_string(),
                Err(e) => format!(
                    "putting the pending mode back failed ({e}): MIG mode will change at the GPU's next reset"
                ),
            };
            let word = if enabled { "on" } else { "off" };
            return Err(match NvmlError::from(status) {
                NvmlError::InUse => HwError::InUse {
                    gpu,
                    instances: vec![format!(
                        "GPU {gpu} ({uuid}) as a whole (turning MIG {word} could not activate: a process or another client such as DCGM, a device plugin or a monitoring agent holds the GPU; {note})"
                    )],
                },
                NvmlError::ResetRequired => HwError::Unsupported(format!(
                    "gpu {gpu}: turning MIG {word} needs a GPU reset this platform does not do through NVML (e.g. pass-through: reboot the VM); {note}"
                )),
                other => nvml_error(
                    &format!("gpu {gpu}: activating MIG mode {word} ({note})"),
                    other,
                ),
            });
        }
        // The change may have reset the device: read through a fresh handle.
        let mode = self
            .device(gpu)?
            .mig_mode()
            .map_err(|e| nvml_error(&format!("gpu {gpu}: reading MIG mode"), e))?;
        if (mode.current == 1) != enabled {
            return Err(HwError::Unsupported(format!(
                "gpu {gpu}: the MIG mode change is pending; reset the GPU (nvidia-smi -r -i {gpu}) or reboot, then retry"
            )));
        }
        Ok(())
    }

    fn create_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, HwError> {
        let device = self.device(gpu)?;
        let model = self.catalog_model(&device);
        let profile = self
            .profile_infos(gpu, &device)?
            .into_iter()
            .find(|p| p.id == profile_id)
            .ok_or_else(|| {
                HwError::Rule(format!(
                    "gpu {gpu}: profile id {profile_id} is not supported"
                ))
            })?;
        let name = model
            .and_then(|m| m.profile_by_id(profile_id))
            .map(|p| p.name.clone())
            .unwrap_or_else(|| format!("profile {profile_id}"));
        let size = self
            .placements_of(gpu, &device, profile_id)?
            .first()
            .map(|&(_, size)| size)
            .ok_or_else(|| {
                HwError::Rule(format!("gpu {gpu}: profile {profile_id} has no placements"))
            })?;
        let lib = self.nvml.lib();
        let create = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceCreateGpuInstanceWithPlacement", e))?;
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetInfo", e))?;
        let placement = sys::nvmlGpuInstancePlacement_t {
            start: start as c_uint,
            size: size as c_uint,
        };
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: live device handle, placement passed by pointer to a local, NVML writes `gi`.
        let ret = unsafe { create(device.handle(), profile_id, &placement, &mut gi) };
        nvml_try(ret).map_err(|e| match e {
            NvmlError::UnexpectedVariant(INSUFFICIENT_RESOURCES) => {
                let occupied = self
                    .instances(gpu, &device)
                    .map(|(v, _)| {
                        if v.is_empty() {
                            "none".to_string()
                        } else {
                            v.iter().map(describe).collect::<Vec<_>>().join(", ")
                        }
                    })
                    .unwrap_or_else(|e| format!("unknown ({e})"));
                HwError::Rule(format!(
                    "gpu {gpu}: NVML cannot create {name}@{start} (slices {start}-{}): its slices overlap an instance, or the GPU's compute slices or {name} count are used up; occupied: {occupied}",
                    start + size - 1
                ))
            }
            other => nvml_error(&format!("gpu {gpu}: creating {name} at slice {start}"), other),
        })?;
        // From here on the GPU instance exists: hand it back, or destroy it before failing.
        let made = self
            .create_compute_instance(gpu, gi, profile.slice_count)
            .and_then(|()| {
                let (id, start, size) = self.gpu_instance_info(gpu, gi, info_sym)?;
                let uuid = self
                    .mig_uuids(gpu, &device)?
                    .into_iter()
                    .find(|(gi_id, _, _)| *gi_id == id)
                    .map(|(_, u, _)| u)
                    .ok_or_else(|| {
                        HwError::Nvml(format!(
                            "gpu {gpu}: the new {name}@{start} has no MIG device"
                        ))
                    })?;
                Ok(MigInstance {
                    profile_id,
                    profile: name.clone(),
                    start,
                    size,
                    memory_mib: profile.memory_size_mb,
                    uuid,
                })
            });
        made.map_err(|e| match self.destroy_gpu_instance(gpu, gi, &name) {
            Ok(()) => e,
            Err(d) => HwError::Nvml(format!(
                "{e}; destroying the half-made {name}@{start} failed too: {d}"
            )),
        })
    }

    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError> {
        let device = self.device(gpu)?;
        let model = self.catalog_model(&device);
        let g = self
            .gpu_instances(gpu, &device)?
            .into_iter()
            .find(|g| g.start == start)
            .ok_or_else(|| {
                HwError::Rule(format!(
                    "gpu {gpu}: no MIG instance starts at slice {start}"
                ))
            })?;
        let name = model
            .and_then(|m| m.profile_by_id(g.profile.id))
            .map(|p| format!("{}@{}", p.name, g.start))
            .unwrap_or_else(|| format!("profile {}@{}", g.profile.id, g.start));
        self.destroy_gpu_instance(gpu, g.handle, &name)
    }

    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError> {
        let device = self.device(gpu)?;
        let temperature_c = device.temperature(TemperatureSensor::Gpu).ok();
        let power_mw = device.power_usage().ok();
        let ecc_uncorrected = device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok();
        let retired_pages_pending = device.are_pages_pending_retired().ok();
        let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        let remapped_rows = self.remapped_rows(&device, mig_enabled);
        let mut findings = Vec::new();
        let mut healthy = true;
        if retired_pages_pending == Some(true) {
            healthy = false;
            findings.push(format!(
                "gpu {gpu}: retired pages are pending; reset the GPU (or reboot) before use"
            ));
        }
        if let RowRemap::Counts {
            uncorrectable,
            pending,
            failure,
            ..
        } = remapped_rows
        {
            if pending {
                healthy = false;
                findings.push(format!(
                    "gpu {gpu}: row remapping is pending ({uncorrectable} row(s) remapped for uncorrectable errors); reset the GPU before use"
                ));
            }
            if failure {
                healthy = false;
                findings.push(format!(
                    "gpu {gpu}: a row remapping failed; the GPU's memory cannot be repaired in the field: drain it and have it serviced"
                ));
            }
        }
        if let Some(n) = ecc_uncorrected.filter(|&n| n > 0) {
            healthy = false;
            findings.push(format!(
                "gpu {gpu}: {n} uncorrected ECC error(s) since the driver loaded; drain and reset the GPU"
            ));
        }
        if let Ok(reasons) = device.current_throttle_reasons() {
            findings.extend(
                throttle_findings(reasons.bits())
                    .into_iter()
                    .map(|f| format!("gpu {gpu}: {f}")),
            );
        }
        Ok(GpuHealth {
            index: gpu,
            temperature_c,
            power_mw,
            ecc_uncorrected,
            retired_pages_pending,
            remapped_rows,
            healthy,
            findings,
        })
    }

    fn readings(&self, gpu: u32) -> Result<super::GpuReadings, HwError> {
        self.read_readings(gpu)
    }

    fn usage(&self, gpu: u32) -> Result<super::GpuUsage, HwError> {
        let device = self.device(gpu)?;
        // Under MIG, NVML reports no whole-GPU utilisation (NOT_SUPPORTED): none is sent,
        // never a 0; the memory is still read.
        let utilization_percent = device.utilization_rates().ok().map(|r| r.gpu.min(100));
        let memory = device
            .memory_info()
            .map_err(|e| HwError::Unsupported(format!("gpu {gpu}: memory in use: {e}")))?;
        const MIB: u64 = 1024 * 1024;
        Ok(super::GpuUsage {
            utilization_percent,
            memory_used_mib: memory.used / MIB,
            memory_total_mib: memory.total / MIB,
        })
    }

    fn busy(&self, gpu: u32) -> Result<BusyState, HwError> {
        let device = self.device(gpu)?;
        let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        if !mig_enabled {
            let running = device
                .running_compute_processes()
                .map(|p| !p.is_empty())
                .map_err(|e| nvml_error(&format!("gpu {gpu}: listing processes"), e))?;
            return Ok(BusyState {
                whole_gpu: running,
                instance_starts: Vec::new(),
            });
        }
        let starts_by_gi: Vec<(u32, u8)> = self
            .gpu_instances(gpu, &device)?
            .iter()
            .map(|g| (g.id, g.start))
            .collect();
        let mut instance_starts = Vec::new();
        for (gi, _, mig) in self.mig_uuids(gpu, &device)? {
            let running = mig
                .running_compute_processes()
                .map_err(|e| nvml_error(&format!("gpu {gpu}: listing processes"), e))?;
            if running.is_empty() {
                continue;
            }
            if let Some((_, s)) = starts_by_gi.iter().find(|(id, _)| *id == gi) {
                instance_starts.push(*s);
            }
        }
        instance_starts.sort_unstable();
        instance_starts.dedup();
        Ok(BusyState {
            whole_gpu: false,
            instance_starts,
        })
    }
}

impl NvmlBackend {
    /// `nvmlDeviceGetRemappedRows` (nvml-wrapper 0.13 lacks it).
    fn remapped_rows(&self, device: &Device<'_>, mig_enabled: bool) -> RowRemap {
        let Ok(sym) = nvml_sym(self.nvml.lib().nvmlDeviceGetRemappedRows.as_ref()) else {
            return RowRemap::Unknown;
        };
        let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
            (0, 0, 0, 0);
        // SAFETY: live device handle; four out-pointers to locals.
        let ret = unsafe {
            sym(
                device.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failure,
            )
        };
        match nvml_try(ret) {
            Ok(()) => RowRemap::Counts {
                correctable: corr,
                uncorrectable: unc,
                pending: pending != 0,
                failure: failure != 0,
            },
            // nvml.h: "On MIG-enabled GPUs with active instances, querying the number of
            // remapped rows is not supported".
            Err(NvmlError::NotSupported) if mig_enabled => RowRemap::NotUnderMig,
            Err(NvmlError::NotSupported) => RowRemap::Unsupported,
            Err(_) => RowRemap::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_on_this_host_is_a_clear_error() {
        // This machine has no NVIDIA driver; the constructor must say so, not panic.
        if std::path::Path::new("/proc/driver/nvidia/version").exists() {
            return;
        }
        match NvmlBackend::new() {
            Err(HwError::NoDriver(msg)) => assert_eq!(msg, NO_DRIVER_MESSAGE),
            Err(other) => panic!("expected NoDriver, got {other}"),
            Ok(_) => panic!("NVML initialised on a host without a driver"),
        }
    }

    #[test]
    fn init_errors_map_to_actionable_messages() {
        assert_eq!(
            init_error(NvmlError::LibraryNotFound),
            HwError::NoDriver(NO_DRIVER_MESSAGE.to_string())
        );
        assert!(
            matches!(init_error(NvmlError::DriverNotLoaded), HwError::NoDriver(m) if m.contains("not loaded"))
        );
        assert!(
            matches!(init_error(NvmlError::NoPermission), HwError::Nvml(m) if m.contains("no permission"))
        );
    }
}
