//! Real GPUs through NVML.
//!
//! Inventory, MIG mode, health and versions go through nvml-wrapper's API. GPU/compute
//! instance creation, destruction and placements go through the raw NVML symbol table
//! (`Nvml::lib()` + `Device::handle()`): nvml-wrapper 0.13 lacks them, and its
//! `possible_placements` returns an empty list. Raw values are decoded by the pure
//! functions in `nvml_decode`.

use super::nvml_decode::{
    decode_cuda_version, decode_placement, throttle_findings, RawPlacement, RawProfileInfo,
};
use super::{BusyState, GpuBackend, GpuHealth, GpuInfo, HwError, MigInstance};
use crate::catalog;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use std::os::raw::c_uint;

/// What `NvmlBackend::new` says where the driver library cannot be loaded.
pub const NO_DRIVER_MESSAGE: &str = "NVIDIA driver library libnvidia-ml.so.1 not found: this host has no NVIDIA driver; use --hardware sim";

/// Most GPU instances one profile can have on one GPU (7 x 1g).
const MAX_INSTANCES_PER_PROFILE: usize = 8;
/// Most compute instances one GPU instance can hold.
const MAX_COMPUTE_INSTANCES: usize = 8;

/// The node's real GPUs.
pub struct NvmlBackend {
    nvml: Nvml,
    hostname: String,
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

fn nvml_error(what: &str, e: NvmlError) -> HwError {
    HwError::Nvml(format!("{what}: {e}"))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

impl NvmlBackend {
    /// Loads libnvidia-ml.so.1 and initialises NVML.
    pub fn new() -> Result<Self, HwError> {
        let nvml = Nvml::init().map_err(init_error)?;
        Ok(Self {
            nvml,
            hostname: hostname(),
        })
    }

    fn device(&self, gpu: u32) -> Result<Device<'_>, HwError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_error("counting GPUs", e))?;
        if gpu >= count {
            return Err(HwError::InvalidGpu(gpu));
        }
        self.nvml
            .device_by_index(gpu)
            .map_err(|e| nvml_error(&format!("gpu {gpu}"), e))
    }

    /// Every GPU-instance profile this device supports, from NVML.
    fn profile_infos(&self, device: &Device<'_>) -> Result<Vec<RawProfileInfo>, HwError> {
        let lib = self.nvml.lib();
        let sym = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstanceProfileInfo", e))?;
        let mut out = Vec::new();
        for profile in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: the handle comes from a live Device; `info` is a plain C struct
            // NVML fills in; the zeroed value is a valid bit pattern for it.
            let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let ret = unsafe { sym(device.handle(), profile, &mut info) };
            if nvml_try(ret).is_ok() {
                out.push(RawProfileInfo {
                    id: info.id,
                    slice_count: info.sliceCount,
                    instance_count: info.instanceCount,
                    memory_size_mb: info.memorySizeMB,
                });
            }
        }
        Ok(out)
    }

    /// Possible placements of one profile (what `possible_placements` should return).
    pub fn possible_placements(&self, gpu: u32, profile_id: u32) -> Result<Vec<(u8, u8)>, HwError> {
        let device = self.device(gpu)?;
        let lib = self.nvml.lib();
        let sym = nvml_sym(lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstancePossiblePlacements_v2", e))?;
        let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 8];
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

    /// All GPU instances on the device, across profiles.
    fn gpu_instances(&self, device: &Device<'_>) -> Result<Vec<RawGpuInstance>, HwError> {
        let lib = self.nvml.lib();
        let list = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceGetGpuInstances", e))?;
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetInfo", e))?;
        let mut out = Vec::new();
        for profile in self.profile_infos(device)? {
            let mut handles: [sys::nvmlGpuInstance_t; MAX_INSTANCES_PER_PROFILE] =
                [std::ptr::null_mut(); MAX_INSTANCES_PER_PROFILE];
            let mut count: c_uint = 0;
            // SAFETY: `handles` has room for MAX_INSTANCES_PER_PROFILE (> any profile's max).
            let ret = unsafe {
                list(
                    device.handle(),
                    profile.id,
                    handles.as_mut_ptr(),
                    &mut count,
                )
            };
            nvml_try(ret).map_err(|e| nvml_error("listing GPU instances", e))?;
            for &handle in &handles[..(count as usize).min(MAX_INSTANCES_PER_PROFILE)] {
                // SAFETY: `handle` was just returned by NVML for this device.
                let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                nvml_try(unsafe { info_sym(handle, &mut info) })
                    .map_err(|e| nvml_error("reading a GPU instance", e))?;
                let (start, size) = decode_placement(RawPlacement {
                    start: info.placement.start,
                    size: info.placement.size,
                })
                .map_err(HwError::Nvml)?;
                out.push(RawGpuInstance {
                    handle,
                    id: info.id,
                    profile,
                    start,
                    size,
                });
            }
        }
        out.sort_by_key(|g| g.start);
        Ok(out)
    }

    /// UUIDs of MIG devices keyed by GPU-instance id.
    fn mig_uuids<'n>(&'n self, device: &Device<'n>) -> Vec<(u32, String, Option<Device<'n>>)> {
        let lib = self.nvml.lib();
        let Ok(gi_id) = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref()) else {
            return Vec::new();
        };
        let max = device.mig_device_count().unwrap_or(0);
        (0..max)
            .filter_map(|i| device.mig_device_by_index(i).ok())
            .filter_map(|mig| {
                let mut id: c_uint = 0;
                // SAFETY: `mig` is a live MIG device handle from NVML.
                nvml_try(unsafe { gi_id(mig.handle(), &mut id) }).ok()?;
                let uuid = mig.uuid().ok()?;
                Some((id, uuid, Some(mig)))
            })
            .collect()
    }

    fn instances(&self, device: &Device<'_>) -> Result<Vec<MigInstance>, HwError> {
        let model = self.catalog_model(device);
        let uuids = self.mig_uuids(device);
        Ok(self
            .gpu_instances(device)?
            .into_iter()
            .map(|g| MigInstance {
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
            })
            .collect())
    }

    fn catalog_model(&self, device: &Device<'_>) -> Option<&'static catalog::GpuModel> {
        let name = device.name().ok()?;
        let mib = device.memory_info().ok()?.total / (1024 * 1024);
        catalog::model_for_nvml(&name, mib)
    }

    /// Creates the full-size compute instance inside a fresh GPU instance.
    fn create_compute_instance(
        &self,
        gi: sys::nvmlGpuInstance_t,
        slices: u32,
    ) -> Result<(), HwError> {
        let lib = self.nvml.lib();
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetComputeInstanceProfileInfo", e))?;
        let create = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceCreateComputeInstance", e))?;
        for profile in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
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
            if nvml_try(ret).is_err() || info.sliceCount != slices {
                continue;
            }
            let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
            // SAFETY: as above; NVML writes the new handle into `ci`.
            return nvml_try(unsafe { create(gi, info.id, &mut ci) })
                .map_err(|e| nvml_error("creating the compute instance", e));
        }
        Err(HwError::Nvml(format!(
            "no compute-instance profile with {slices} slice(s) in this GPU instance"
        )))
    }

    fn destroy_gpu_instance(&self, gpu: u32, g: &RawGpuInstance) -> Result<(), HwError> {
        let lib = self.nvml.lib();
        let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetComputeInstances", e))?;
        let info_sym = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceGetComputeInstanceProfileInfo", e))?;
        let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())
            .map_err(|e| nvml_error("nvmlComputeInstanceDestroy", e))?;
        let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref())
            .map_err(|e| nvml_error("nvmlGpuInstanceDestroy", e))?;
        let in_use = |e: NvmlError, what: &str| match e {
            NvmlError::InUse => HwError::InUse {
                gpu,
                instances: vec![format!("profile {}@{}", g.profile.id, g.start)],
            },
            other => nvml_error(what, other),
        };
        for profile in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: `g.handle` is a live GPU instance handle; buffers are sized as passed.
            let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let ret = unsafe {
                info_sym(
                    g.handle,
                    profile,
                    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                )
            };
            if nvml_try(ret).is_err() {
                continue;
            }
            let mut cis: [sys::nvmlComputeInstance_t; MAX_COMPUTE_INSTANCES] =
                [std::ptr::null_mut(); MAX_COMPUTE_INSTANCES];
            let mut count: c_uint = 0;
            nvml_try(unsafe { list(g.handle, info.id, cis.as_mut_ptr(), &mut count) })
                .map_err(|e| nvml_error("listing compute instances", e))?;
            for &ci in &cis[..(count as usize).min(MAX_COMPUTE_INSTANCES)] {
                // SAFETY: `ci` was just returned by NVML.
                nvml_try(unsafe { destroy_ci(ci) })
                    .map_err(|e| in_use(e, "destroying a compute instance"))?;
            }
        }
        // SAFETY: the GPU instance handle is live and now has no compute instances.
        nvml_try(unsafe { destroy_gi(g.handle) })
            .map_err(|e| in_use(e, "destroying the GPU instance"))
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

    fn gpus(&self) -> Result<Vec<GpuInfo>, HwError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_error("counting GPUs", e))?;
        (0..count)
            .map(|index| {
                let device = self.device(index)?;
                let name = device.name().map_err(|e| nvml_error("GPU name", e))?;
                let memory_mib = device
                    .memory_info()
                    .map_err(|e| nvml_error("GPU memory", e))?
                    .total
                    / (1024 * 1024);
                let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
                Ok(GpuInfo {
                    index,
                    uuid: device.uuid().map_err(|e| nvml_error("GPU UUID", e))?,
                    model: catalog::model_for_nvml(&name, memory_mib)
                        .map(|m| m.name.clone())
                        .unwrap_or(name),
                    memory_mib,
                    mig_enabled,
                    instances: if mig_enabled {
                        self.instances(&device)?
                    } else {
                        Vec::new()
                    },
                })
            })
            .collect()
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError> {
        let device = self.device(gpu)?;
        device
            .set_mig_mode(enabled)
            .map_err(|e| nvml_error(&format!("gpu {gpu}: setting MIG mode"), e))?;
        let mode = device
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
        let profile = self
            .profile_infos(&device)?
            .into_iter()
            .find(|p| p.id == profile_id)
            .ok_or_else(|| {
                HwError::Rule(format!(
                    "gpu {gpu}: profile id {profile_id} is not supported"
                ))
            })?;
        let (size, _) = self
            .possible_placements(gpu, profile_id)?
            .iter()
            .map(|&(_, size)| (size, ()))
            .next()
            .ok_or_else(|| {
                HwError::Rule(format!("gpu {gpu}: profile {profile_id} has no placements"))
            })?;
        let lib = self.nvml.lib();
        let create = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())
            .map_err(|e| nvml_error("nvmlDeviceCreateGpuInstanceWithPlacement", e))?;
        let placement = sys::nvmlGpuInstancePlacement_t {
            start: start as c_uint,
            size: size as c_uint,
        };
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: live device handle, placement passed by pointer to a local, NVML writes `gi`.
        nvml_try(unsafe { create(device.handle(), profile_id, &placement, &mut gi) }).map_err(
            |e| {
                nvml_error(
                    &format!("gpu {gpu}: creating profile {profile_id} at slice {start}"),
                    e,
                )
            },
        )?;
        if let Err(e) = self.create_compute_instance(gi, profile.slice_count) {
            // Leave no half-made instance behind.
            if let Ok(destroy) = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref()) {
                // SAFETY: `gi` was created above and holds no compute instance.
                let _ = unsafe { destroy(gi) };
            }
            return Err(e);
        }
        self.instances(&device)?
            .into_iter()
            .find(|i| i.start == start)
            .ok_or_else(|| {
                HwError::Nvml(format!(
                    "gpu {gpu}: created instance at slice {start} is not listed"
                ))
            })
    }

    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError> {
        let device = self.device(gpu)?;
        let g = self
            .gpu_instances(&device)?
            .into_iter()
            .find(|g| g.start == start)
            .ok_or_else(|| {
                HwError::Rule(format!(
                    "gpu {gpu}: no MIG instance starts at slice {start}"
                ))
            })?;
        self.destroy_gpu_instance(gpu, &g)
    }

    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError> {
        let device = self.device(gpu)?;
        let temperature_c = device.temperature(TemperatureSensor::Gpu).ok();
        let power_mw = device.power_usage().ok();
        let ecc_uncorrected = device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok();
        let retired_pages_pending = device.are_pages_pending_retired().ok();
        let mut findings = Vec::new();
        let mut healthy = true;
        if retired_pages_pending == Some(true) {
            healthy = false;
            findings.push(format!(
                "gpu {gpu}: retired pages are pending; reset the GPU (or reboot) before use"
            ));
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
            healthy,
            findings,
        })
    }

    fn busy(&self, gpu: u32) -> Result<BusyState, HwError> {
        let device = self.device(gpu)?;
        let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        if !mig_enabled {
            let running = device
                .running_compute_processes()
                .map(|p| !p.is_empty())
                .map_err(|e| nvml_error("listing processes", e))?;
            return Ok(BusyState {
                whole_gpu: running,
                instance_starts: Vec::new(),
            });
        }
        let starts_by_gi: Vec<(u32, u8)> = self
            .gpu_instances(&device)?
            .iter()
            .map(|g| (g.id, g.start))
            .collect();
        let mut instance_starts: Vec<u8> = self
            .mig_uuids(&device)
            .into_iter()
            .filter_map(|(gi, _, mig)| {
                let running = mig?.running_compute_processes().ok()?;
                if running.is_empty() {
                    return None;
                }
                starts_by_gi
                    .iter()
                    .find(|(id, _)| *id == gi)
                    .map(|(_, s)| *s)
            })
            .collect();
        instance_starts.sort_unstable();
        instance_starts.dedup();
        Ok(BusyState {
            whole_gpu: false,
            instance_starts,
        })
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
