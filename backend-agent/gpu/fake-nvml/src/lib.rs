//! A fake `libnvidia-ml.so` for tests: exports the NVML symbols gpufleet's NVML backend
//! (through nvml-wrapper) uses and emulates one configurable GPU host.
//!
//! Load it by path (`gpufleet-agent --nvml-lib target/debug/libfake_nvml.so`, or
//! `Nvml::builder().lib_path(..)`). With no scenario it is 8 x H100-80GB with MIG off, run as
//! root. A scenario file (`FAKE_NVML_SCENARIO`, else `fake-nvml.toml` beside the library;
//! see `scenario.rs`) changes the model, count, MIG state and instances, and injects a GPU
//! without permission, a lost GPU, a busy GPU, MIG activation failures (IN_USE,
//! RESET_REQUIRED), pending mode changes, remapped rows, a different profile table and
//! return codes on chosen calls.
//!
//! Behaviour follows the comments of NVIDIA's `nvml.h`: return codes are the ones it
//! documents for each call; queries marked "Requires privileged user" answer
//! NO_PERMISSION when the scenario is not privileged; GPU-instance profiles are enumerated
//! by index until INVALID_ARGUMENT; `nvmlDeviceSetMigMode` sets the pending mode and
//! reports activation failures in `activationStatus` while itself succeeding. In/out
//! counts are checked: a buffer smaller than the answer is INVALID_ARGUMENT (for the calls
//! whose header says the buffer "must be large enough") or INSUFFICIENT_SIZE (where it
//! documents that). State lives in this process's memory from `nvmlInit` to the last
//! `nvmlShutdown`.
//!
//! Handles are opaque integers (kind, generation, GPU, GPU-instance id, compute-instance
//! id) cast to pointers; they are never dereferenced, only decoded and checked.
//!
//! # Safety
//! Every exported function is `unsafe extern "C"`: callers must pass, as NVML requires,
//! pointers that are null or valid for writes of the documented type (and, for buffers,
//! of the documented length), and C strings that are NUL-terminated. Each write goes
//! through [`put`] or a bounds-checked slice; null pointers answer INVALID_ARGUMENT.
#![allow(clippy::missing_safety_doc)]

mod host;
mod scenario;

use host::*;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::Mutex;

type Handle = *mut c_void;

struct Loaded {
    refs: u32,
    host: Host,
}

static STATE: Mutex<Option<Loaded>> = Mutex::new(None);

// -- handles ---------------------------------------------------------------------------

const KIND_DEVICE: u64 = 1;
const KIND_MIG: u64 = 2;
const KIND_GI: u64 = 3;
const KIND_CI: u64 = 4;
const KIND_EVENT_SET: u64 = 5;

#[derive(Clone, Copy)]
struct Decoded {
    kind: u64,
    generation: u32,
    gpu: usize,
    gi: u32,
    ci: u32,
}

fn encode(kind: u64, generation: u32, gpu: usize, gi: u32, ci: u32) -> Handle {
    let v = (kind << 60)
        | ((generation as u64 & 0xf_ffff) << 40)
        | ((gpu as u64 & 0xffff) << 24)
        | ((gi as u64 & 0xfff) << 12)
        | (ci as u64 & 0xfff);
    v as usize as Handle
}

fn decode(h: Handle) -> Decoded {
    let v = h as usize as u64;
    Decoded {
        kind: v >> 60,
        generation: ((v >> 40) & 0xf_ffff) as u32,
        gpu: ((v >> 24) & 0xffff) as usize,
        gi: ((v >> 12) & 0xfff) as u32,
        ci: (v & 0xfff) as u32,
    }
}

fn device_handle(host: &Host, gpu: usize) -> Handle {
    encode(KIND_DEVICE, host.gpus[gpu].generation, gpu, 0, 0)
}

/// The GPU of a physical-device handle (not a MIG device handle).
fn device(host: &Host, h: Handle) -> R<usize> {
    let d = decode(h);
    let gpu = host.gpus.get(d.gpu).ok_or(ERROR_INVALID_ARGUMENT)?;
    if d.kind != KIND_DEVICE || d.generation != gpu.generation {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    Ok(d.gpu)
}

/// (gpu, gi, ci) of a MIG device handle.
fn mig_device(host: &Host, h: Handle) -> R<(usize, u32, u32)> {
    let d = decode(h);
    if d.kind != KIND_MIG {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let gpu = host.gpus.get(d.gpu).ok_or(ERROR_INVALID_ARGUMENT)?;
    let gi = gpu
        .gis
        .iter()
        .find(|g| g.id == d.gi)
        .ok_or(ERROR_INVALID_ARGUMENT)?;
    gi.cis
        .iter()
        .find(|c| c.id == d.ci)
        .ok_or(ERROR_INVALID_ARGUMENT)?;
    Ok((d.gpu, d.gi, d.ci))
}

/// (gpu, gi id) of a GPU-instance handle.
fn gpu_instance(host: &Host, h: Handle) -> R<(usize, u32)> {
    let d = decode(h);
    if d.kind != KIND_GI {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let gpu = host.gpus.get(d.gpu).ok_or(ERROR_INVALID_ARGUMENT)?;
    if !gpu.gis.iter().any(|g| g.id == d.gi) {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    Ok((d.gpu, d.gi))
}

// -- plumbing --------------------------------------------------------------------------

/// Runs `f` on the loaded host after counting the call and applying injected faults.
fn with_host(function: &'static str, f: impl FnOnce(&mut Host) -> R<()>) -> u32 {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(loaded) = guard.as_mut() else {
        return ERROR_UNINITIALIZED;
    };
    let host = &mut loaded.host;
    match host.fault(function).and_then(|()| f(host)) {
        Ok(()) => SUCCESS,
        Err(code) => code,
    }
}

/// Writes `v` through an out-pointer the caller supplied.
unsafe fn put<T>(p: *mut T, v: T) -> R<()> {
    if p.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for a write of T by the caller's NVML contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into the caller's `len`-byte buffer (INSUFFICIENT_SIZE if short).
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> R<()> {
    if buf.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `len` bytes (NVML contract), and we write
    // s.len() + 1 <= len of them.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), s.len() + 1) };
    out[..s.len()].copy_from_slice(s.as_bytes());
    out[s.len()] = 0;
    Ok(())
}

/// The caller's array of `len` elements, for writing.
unsafe fn out_slice<'a, T>(p: *mut T, len: usize) -> R<&'a mut [T]> {
    if p.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller's buffer holds `len` elements of T (NVML contract); T here is
    // always a handle or a plain C struct for which any bit pattern we write is valid.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

fn gpu_ok(host: &Host, gpu: usize) -> R<&Gpu> {
    let g = &host.gpus[gpu];
    match g.access {
        scenario::Access::Ok => Ok(g),
        scenario::Access::Lost => Err(ERROR_GPU_IS_LOST),
        scenario::Access::NoPermission => Err(ERROR_NO_PERMISSION),
    }
}

// -- C structs (nvml.h) ----------------------------------------------------------------

#[repr(C)]
pub struct Memory2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Placement {
    start: c_uint,
    size: c_uint,
}

#[repr(C)]
pub struct GpuInstanceProfileInfo {
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
}

#[repr(C)]
pub struct GpuInstanceInfo {
    device: Handle,
    id: c_uint,
    profile_id: c_uint,
    placement: Placement,
}

#[repr(C)]
pub struct ComputeInstanceProfileInfo {
    id: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

// -- init ------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> u32 {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(loaded) = guard.as_mut() {
        loaded.refs += 1;
        return SUCCESS;
    }
    let host = match scenario::load().and_then(|s| Host::new(&s)) {
        Ok(h) => h,
        Err(msg) => {
            eprintln!("{msg}");
            return ERROR_UNKNOWN;
        }
    };
    *guard = Some(Loaded { refs: 1, host });
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> u32 {
    unsafe { nvmlInit_v2() }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> u32 {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        None => ERROR_UNINITIALIZED,
        Some(loaded) => {
            loaded.refs -= 1;
            if loaded.refs == 0 {
                *guard = None;
            }
            SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: u32) -> *const c_char {
    let s: &'static [u8] = match result {
        SUCCESS => b"Success\0",
        ERROR_UNINITIALIZED => b"Uninitialized\0",
        ERROR_INVALID_ARGUMENT => b"Invalid Argument\0",
        ERROR_NOT_SUPPORTED => b"Not Supported\0",
        ERROR_NO_PERMISSION => b"Insufficient Permissions\0",
        ERROR_NOT_FOUND => b"Not Found\0",
        ERROR_INSUFFICIENT_SIZE => b"Insufficient Size\0",
        ERROR_GPU_IS_LOST => b"GPU is lost\0",
        ERROR_RESET_REQUIRED => b"GPU requires reset\0",
        ERROR_IN_USE => b"In use by another client\0",
        ERROR_INSUFFICIENT_RESOURCES => b"Insufficient resources\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

// -- system ----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> u32 {
    with_host("nvmlSystemGetDriverVersion", |h| unsafe {
        put_str(version, length, &h.driver_version)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> u32 {
    with_host("nvmlSystemGetNVMLVersion", |h| unsafe {
        let v = format!("12.{}", h.driver_version);
        put_str(version, length, &v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> u32 {
    with_host("nvmlSystemGetCudaDriverVersion", |h| unsafe {
        put(v, h.cuda_version)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> u32 {
    with_host("nvmlSystemGetCudaDriverVersion_v2", |h| unsafe {
        put(v, h.cuda_version)
    })
}

// -- devices ---------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetCount_v2", |h| unsafe {
        put(count, h.gpus.len() as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Handle) -> u32 {
    with_host("nvmlDeviceGetHandleByIndex_v2", |h| {
        let gpu = index as usize;
        if gpu >= h.gpus.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        gpu_ok(h, gpu)?;
        unsafe { put(out, device_handle(h, gpu)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, out: *mut Handle) -> u32 {
    with_host("nvmlDeviceGetHandleByUUID", |h| {
        if uuid.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: a NUL-terminated C string by the NVML contract.
        let wanted = unsafe { std::ffi::CStr::from_ptr(uuid) }
            .to_str()
            .map_err(|_| ERROR_INVALID_ARGUMENT)?;
        if h.gpus.iter().any(|g| g.access == scenario::Access::Lost) {
            return Err(ERROR_GPU_IS_LOST);
        }
        for (i, g) in h.gpus.iter().enumerate() {
            if g.uuid == wanted {
                gpu_ok(h, i)?;
                return unsafe { put(out, device_handle(h, i)) };
            }
            for gi in &g.gis {
                for ci in &gi.cis {
                    if mig_uuid(&g.uuid, gi.id, ci.id) == wanted {
                        return unsafe { put(out, encode(KIND_MIG, 0, i, gi.id, ci.id)) };
                    }
                }
            }
        }
        Err(ERROR_NOT_FOUND)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(dev: Handle, name: *mut c_char, length: c_uint) -> u32 {
    with_host("nvmlDeviceGetName", |h| {
        let gpu = device(h, dev)?;
        let _ = gpu;
        unsafe { put_str(name, length, h.model.nvml_name) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(dev: Handle, uuid: *mut c_char, length: c_uint) -> u32 {
    with_host("nvmlDeviceGetUUID", |h| {
        let text = match mig_device(h, dev) {
            Ok((gpu, gi, ci)) => mig_uuid(&h.gpus[gpu].uuid, gi, ci),
            Err(_) => h.gpus[device(h, dev)?].uuid.clone(),
        };
        unsafe { put_str(uuid, length, &text) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: Handle, index: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetIndex", |h| {
        let gpu = device(h, dev)?;
        unsafe { put(index, gpu as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(dev: Handle, memory: *mut Memory2) -> u32 {
    with_host("nvmlDeviceGetMemoryInfo_v2", |h| {
        let gpu = device(h, dev)?;
        if memory.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and pointing at an nvmlMemory_v2_t (NVML contract).
        let version = unsafe { (*memory).version };
        if version != (std::mem::size_of::<Memory2>() as u32 | (2 << 24)) {
            return Err(25); // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        }
        // "In MIG mode, if device handle is provided, the API returns aggregate
        // information, only if the caller has appropriate privileges."
        if h.gpus[gpu].mig_current {
            h.privileged()?;
        }
        let total = h.model.memory_mib * 1024 * 1024;
        let reserved = 512 * 1024 * 1024;
        unsafe {
            put(
                memory,
                Memory2 {
                    version,
                    total,
                    reserved,
                    free: total - reserved,
                    used: reserved,
                },
            )
        }
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// Whole-GPU utilisation: 100 while the GPU is busy, else 0. Under MIG NVML answers
/// NOT_SUPPORTED (per-instance activity takes DCGM).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    dev: Handle,
    rates: *mut Utilization,
) -> u32 {
    with_host("nvmlDeviceGetUtilizationRates", |h| {
        let gpu = device(h, dev)?;
        if h.gpus[gpu].mig_current {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let busy = if h.gpus[gpu].busy { 100 } else { 0 };
        unsafe {
            put(
                rates,
                Utilization {
                    gpu: busy,
                    memory: busy,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(dev: Handle, mode: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetPersistenceMode", |h| {
        let gpu = device(h, dev)?;
        unsafe { put(mode, h.gpus[gpu].persistence as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    dev: Handle,
    sensor: c_uint,
    temp: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetTemperature", |h| {
        let gpu = device(h, dev)?;
        if sensor != 0 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        unsafe { put(temp, h.gpus[gpu].temperature) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(dev: Handle, power: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetPowerUsage", |h| {
        let gpu = device(h, dev)?;
        unsafe { put(power, h.gpus[gpu].power_mw) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    dev: Handle,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> u32 {
    with_host("nvmlDeviceGetTotalEccErrors", |h| {
        let gpu = device(h, dev)?;
        if error_type > 1 || counter_type > 1 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // error_type 1 = uncorrected, 0 = corrected; volatile and aggregate alike.
        let n = if error_type == 1 {
            h.gpus[gpu].ecc_uncorrected
        } else {
            h.gpus[gpu].ecc_corrected
        };
        unsafe { put(count, n) }
    })
}

/// Thresholds: 0 shutdown, 1 slowdown; the others are not emulated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    dev: Handle,
    kind: c_uint,
    temp: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetTemperatureThreshold", |h| {
        device(h, dev)?;
        let t = match kind {
            0 => 92,
            1 => 87,
            _ => return Err(ERROR_NOT_SUPPORTED),
        };
        unsafe { put(temp, t) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(dev: Handle, limit: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetEnforcedPowerLimit", |h| {
        device(h, dev)?;
        unsafe { put(limit, 700_000) }
    })
}

/// (current?, generation?) of a PCIe query.
fn pcie_query(
    function: &'static str,
    dev: Handle,
    out: *mut c_uint,
    pick: fn(&Gpu) -> c_uint,
) -> u32 {
    with_host(function, |h| {
        let gpu = device(h, dev)?;
        let g = gpu_ok(h, gpu)?;
        unsafe { put(out, pick(g)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(dev: Handle, v: *mut c_uint) -> u32 {
    pcie_query("nvmlDeviceGetCurrPcieLinkGeneration", dev, v, |g| g.pcie.0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(dev: Handle, v: *mut c_uint) -> u32 {
    pcie_query("nvmlDeviceGetCurrPcieLinkWidth", dev, v, |g| g.pcie.1)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(dev: Handle, v: *mut c_uint) -> u32 {
    pcie_query("nvmlDeviceGetMaxPcieLinkGeneration", dev, v, |_| PCIE_MAX.0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(dev: Handle, v: *mut c_uint) -> u32 {
    pcie_query("nvmlDeviceGetMaxPcieLinkWidth", dev, v, |_| PCIE_MAX.1)
}

/// Links 0..18 exist (none on the L40S); past them INVALID_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    dev: Handle,
    link: c_uint,
    active: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetNvLinkState", |h| {
        let gpu = device(h, dev)?;
        if h.model.key == "L40S" {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if link >= NVLINKS {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let up = !h.gpus[gpu].nvlink_down.contains(&link);
        unsafe { put(active, up as c_uint) }
    })
}

/// Every counter is 0.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    dev: Handle,
    link: c_uint,
    counter: c_uint,
    value: *mut c_ulonglong,
) -> u32 {
    with_host("nvmlDeviceGetNvLinkErrorCounter", |h| {
        device(h, dev)?;
        if h.model.key == "L40S" {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if link >= NVLINKS || counter > 3 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        unsafe { put(value, 0) }
    })
}

// -- events ----------------------------------------------------------------------------

#[repr(C)]
pub struct EventData {
    device: Handle,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const EVENT_XID_CRITICAL: c_ulonglong = 0x8;
const ERROR_TIMEOUT: u32 = 10;

fn event_set(host: &Host, set: Handle) -> R<usize> {
    let d = decode(set);
    let id = d.gi as usize;
    if d.kind != KIND_EVENT_SET || id == 0 || !matches!(host.event_sets.get(id - 1), Some(Some(_)))
    {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    Ok(id - 1)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut Handle) -> u32 {
    with_host("nvmlEventSetCreate", |h| {
        h.event_sets.push(Some(Vec::new()));
        let id = h.event_sets.len() as u32;
        unsafe { put(set, encode(KIND_EVENT_SET, 0, 0, id, 0)) }
    })
}

/// Only critical XID events are emulated; other types are NOT_SUPPORTED.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    dev: Handle,
    types: c_ulonglong,
    set: Handle,
) -> u32 {
    with_host("nvmlDeviceRegisterEvents", |h| {
        let gpu = device(h, dev)?;
        gpu_ok(h, gpu)?;
        let id = event_set(h, set)?;
        if types & !EVENT_XID_CRITICAL != 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if let Some(Some(gpus)) = h.event_sets.get_mut(id) {
            if !gpus.contains(&gpu) {
                gpus.push(gpu);
            }
        }
        Ok(())
    })
}

/// Delivers the next undelivered XID of a registered GPU, else TIMEOUT at once.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: Handle,
    data: *mut EventData,
    _timeout_ms: c_uint,
) -> u32 {
    with_host("nvmlEventSetWait_v2", |h| {
        let id = event_set(h, set)?;
        let gpus = h.event_sets[id].clone().unwrap_or_default();
        for gpu in gpus {
            if h.gpus[gpu].xids.is_empty() {
                continue;
            }
            let code = h.gpus[gpu].xids.remove(0);
            let handle = device_handle(h, gpu);
            return unsafe {
                put(
                    data,
                    EventData {
                        device: handle,
                        event_type: EVENT_XID_CRITICAL,
                        event_data: code,
                        gpu_instance_id: u32::MAX,
                        compute_instance_id: u32::MAX,
                    },
                )
            };
        }
        Err(ERROR_TIMEOUT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: Handle) -> u32 {
    with_host("nvmlEventSetFree", |h| {
        let id = event_set(h, set)?;
        h.event_sets[id] = None;
        Ok(())
    })
}

/// Every emulated model (Ampere and newer) remaps rows instead of retiring pages; NVML
/// answers NOT_SUPPORTED for the retired-page list there.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    dev: Handle,
    _cause: c_uint,
    _count: *mut c_uint,
    _addresses: *mut c_ulonglong,
) -> u32 {
    with_host("nvmlDeviceGetRetiredPages", |h| {
        device(h, dev)?;
        Err(ERROR_NOT_SUPPORTED)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    dev: Handle,
    _cause: c_uint,
    _count: *mut c_uint,
    _addresses: *mut c_ulonglong,
    _timestamps: *mut c_ulonglong,
) -> u32 {
    with_host("nvmlDeviceGetRetiredPages_v2", |h| {
        device(h, dev)?;
        Err(ERROR_NOT_SUPPORTED)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    dev: Handle,
    pending: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetRetiredPagesPendingStatus", |h| {
        let gpu = device(h, dev)?;
        unsafe { put(pending, h.gpus[gpu].retired_pages_pending as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    dev: Handle,
    reasons: *mut c_ulonglong,
) -> u32 {
    with_host("nvmlDeviceGetCurrentClocksThrottleReasons", |h| {
        let gpu = device(h, dev)?;
        unsafe { put(reasons, h.gpus[gpu].throttle) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    dev: Handle,
    reasons: *mut c_ulonglong,
) -> u32 {
    with_host("nvmlDeviceGetCurrentClocksEventReasons", |h| {
        let gpu = device(h, dev)?;
        unsafe { put(reasons, h.gpus[gpu].throttle) }
    })
}

/// "On MIG-enabled GPUs with active instances, querying the number of remapped rows is
/// not supported"; the return list says NOT_SUPPORTED "If MIG is enabled".
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    dev: Handle,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetRemappedRows", |h| {
        let gpu = device(h, dev)?;
        let g = &h.gpus[gpu];
        if g.mig_current {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if corr.is_null() || unc.is_null() || pending.is_null() || failure.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        unsafe {
            put(corr, g.remapped.correctable)?;
            put(unc, g.remapped.uncorrectable)?;
            put(pending, g.remapped.pending as c_uint)?;
            put(failure, g.remapped.failure as c_uint)
        }
    })
}

/// Processes on a GPU (all of its instances) or on one MIG device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: Handle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> u32 {
    with_host("nvmlDeviceGetComputeRunningProcesses_v3", |h| {
        let procs: Vec<ProcessInfo> = match mig_device(h, dev) {
            Ok((gpu, gi, ci)) => h.gpus[gpu]
                .gis
                .iter()
                .filter(|g| g.id == gi && g.busy)
                .map(|g| process(gpu, g.id, ci))
                .collect(),
            Err(_) => {
                let gpu = device(h, dev)?;
                let g = &h.gpus[gpu];
                let mut v: Vec<ProcessInfo> = g
                    .gis
                    .iter()
                    .filter(|gi| gi.busy)
                    .map(|gi| process(gpu, gi.id, gi.cis.first().map_or(0, |c| c.id)))
                    .collect();
                if g.busy && !g.mig_current {
                    v.push(ProcessInfo {
                        pid: 4000 + gpu as c_uint * 100,
                        used_gpu_memory: 1 << 30,
                        gpu_instance_id: u32::MAX,
                        compute_instance_id: u32::MAX,
                    });
                }
                v
            }
        };
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null in/out count (NVML contract).
        let room = unsafe { *count } as usize;
        unsafe { put(count, procs.len() as c_uint)? };
        if procs.is_empty() {
            return Ok(());
        }
        if room < procs.len() {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        let out = unsafe { out_slice(infos, procs.len())? };
        out.copy_from_slice(&procs);
        Ok(())
    })
}

fn process(gpu: usize, gi: u32, ci: u32) -> ProcessInfo {
    ProcessInfo {
        pid: 4000 + gpu as c_uint * 100 + gi,
        used_gpu_memory: 1 << 30,
        gpu_instance_id: gi,
        compute_instance_id: ci,
    }
}

// -- MIG mode --------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: Handle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetMigMode", |h| {
        let gpu = device(h, dev)?;
        h.mig_capable()?;
        let g = &h.gpus[gpu];
        unsafe {
            put(current, g.mig_current as c_uint)?;
            put(pending, g.mig_pending as c_uint)
        }
    })
}

/// Sets the pending mode, then tries to activate it: the call itself succeeds and the
/// activation's outcome goes to `activationStatus` (IN_USE while work or another client
/// holds the GPU, or while GPU instances exist; RESET_REQUIRED where the scenario says a
/// reset is needed). The pending mode stays set when activation fails.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    dev: Handle,
    mode: c_uint,
    activation: *mut u32,
) -> u32 {
    with_host("nvmlDeviceSetMigMode", |h| {
        let gpu = device(h, dev)?;
        h.mig_capable()?;
        if mode > 1 || activation.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.privileged()?;
        let g = &mut h.gpus[gpu];
        g.mig_pending = mode == 1;
        let status = if g.mig_pending == g.mig_current {
            SUCCESS
        } else if g.busy || g.activation == scenario::Activation::InUse || !g.gis.is_empty() {
            ERROR_IN_USE
        } else if g.activation == scenario::Activation::ResetRequired {
            ERROR_RESET_REQUIRED
        } else {
            g.mig_current = g.mig_pending;
            g.generation += 1;
            SUCCESS
        };
        unsafe { put(activation, status) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(dev: Handle, count: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetMaxMigDeviceCount", |h| {
        let gpu = device(h, dev)?;
        let n = if h.gpus[gpu].mig_current { 7 } else { 0 };
        unsafe { put(count, n) }
    })
}

/// MIG devices are the compute instances, by (GPU instance id, compute instance id).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    dev: Handle,
    index: c_uint,
    out: *mut Handle,
) -> u32 {
    with_host("nvmlDeviceGetMigDeviceHandleByIndex", |h| {
        let gpu = device(h, dev)?;
        let g = &h.gpus[gpu];
        if !g.mig_current {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let mut all: Vec<(u32, u32)> = g
            .gis
            .iter()
            .flat_map(|gi| gi.cis.iter().map(move |ci| (gi.id, ci.id)))
            .collect();
        all.sort_unstable();
        let &(gi, ci) = all.get(index as usize).ok_or(ERROR_NOT_FOUND)?;
        unsafe { put(out, encode(KIND_MIG, 0, gpu, gi, ci)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(dev: Handle, is_mig: *mut c_uint) -> u32 {
    with_host("nvmlDeviceIsMigDeviceHandle", |h| {
        let mig = mig_device(h, dev).is_ok();
        if !mig {
            device(h, dev)?;
        }
        unsafe { put(is_mig, mig as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(dev: Handle, id: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetGpuInstanceId", |h| match mig_device(h, dev) {
        Ok((_, gi, _)) => unsafe { put(id, gi) },
        Err(_) => {
            device(h, dev)?;
            Err(ERROR_NOT_SUPPORTED)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(dev: Handle, id: *mut c_uint) -> u32 {
    with_host("nvmlDeviceGetComputeInstanceId", |h| {
        match mig_device(h, dev) {
            Ok((_, _, ci)) => unsafe { put(id, ci) },
            Err(_) => {
                device(h, dev)?;
                Err(ERROR_NOT_SUPPORTED)
            }
        }
    })
}

// -- GPU instances ---------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    dev: Handle,
    profile: c_uint,
    info: *mut GpuInstanceProfileInfo,
) -> u32 {
    with_host("nvmlDeviceGetGpuInstanceProfileInfo", |h| {
        device(h, dev)?;
        if profile >= GPU_INSTANCE_PROFILE_COUNT || info.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.mig_capable()?;
        h.privileged()?;
        let p = h
            .profiles
            .iter()
            .find(|p| p.index == profile)
            .ok_or(ERROR_NOT_SUPPORTED)?;
        unsafe {
            put(
                info,
                GpuInstanceProfileInfo {
                    id: p.id,
                    is_p2p_supported: 0,
                    slice_count: p.slice_count,
                    instance_count: p.instance_count,
                    multiprocessor_count: p.slice_count * 16,
                    copy_engine_count: p.slice_count,
                    decoder_count: p.slice_count.min(7),
                    encoder_count: 0,
                    jpeg_count: 1,
                    ofa_count: u32::from(p.slice_count == 7),
                    memory_size_mb: p.memory_mib,
                },
            )
        }
    })
}

/// "placements: ... Can be NULL to discover number of allowed placements for this
/// profile. If non-NULL must be large enough": a smaller `*count` is INVALID_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    dev: Handle,
    profile_id: c_uint,
    placements: *mut Placement,
    count: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetGpuInstancePossiblePlacements_v2", |h| {
        device(h, dev)?;
        h.mig_capable()?;
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.privileged()?;
        let p = h.profile_by_id(profile_id)?;
        let list: Vec<Placement> = p
            .starts
            .iter()
            .map(|&start| Placement {
                start,
                size: p.placement_size,
            })
            .collect();
        if placements.is_null() {
            return unsafe { put(count, list.len() as c_uint) };
        }
        // SAFETY: non-null in/out count (NVML contract).
        if (unsafe { *count } as usize) < list.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let out = unsafe { out_slice(placements, list.len())? };
        out.copy_from_slice(&list);
        unsafe { put(count, list.len() as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    dev: Handle,
    profile_id: c_uint,
    count: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetGpuInstanceRemainingCapacity", |h| {
        let gpu = device(h, dev)?;
        h.mig_capable()?;
        if !h.gpus[gpu].mig_current {
            return Err(ERROR_NOT_SUPPORTED);
        }
        h.privileged()?;
        let p = h.profile_by_id(profile_id)?.clone();
        let mut scratch = h.gpus[gpu].clone();
        let mut n = 0;
        for &start in &p.starts {
            if create_gi(&mut scratch, &p, start).is_ok() {
                n += 1;
            }
        }
        unsafe { put(count, n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    dev: Handle,
    profile_id: c_uint,
    placement: *const Placement,
    out: *mut Handle,
) -> u32 {
    with_host("nvmlDeviceCreateGpuInstanceWithPlacement", |h| {
        let gpu = device(h, dev)?;
        h.mig_capable()?;
        if placement.is_null() || out.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, pointing at an nvmlGpuInstancePlacement_t (NVML contract).
        let want = unsafe { *placement };
        if !h.gpus[gpu].mig_current {
            return Err(ERROR_NOT_SUPPORTED);
        }
        h.privileged()?;
        let p = h.profile_by_id(profile_id)?.clone();
        if want.size != p.placement_size {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let id = create_gi(&mut h.gpus[gpu], &p, want.start)?;
        unsafe { put(out, encode(KIND_GI, 0, gpu, id, 0)) }
    })
}

/// "gpuInstances: ... the buffer must be large enough to accommodate the instances
/// supported by the profile": `*count` in is the buffer's length; smaller than the
/// instances present is INVALID_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    dev: Handle,
    profile_id: c_uint,
    instances: *mut Handle,
    count: *mut c_uint,
) -> u32 {
    with_host("nvmlDeviceGetGpuInstances", |h| {
        let gpu = device(h, dev)?;
        if instances.is_null() || count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.mig_capable()?;
        if !h.gpus[gpu].mig_current {
            return Err(ERROR_NOT_SUPPORTED);
        }
        h.privileged()?;
        h.profile_by_id(profile_id)?;
        let mut found: Vec<&Gi> = h.gpus[gpu]
            .gis
            .iter()
            .filter(|g| g.profile_id == profile_id)
            .collect();
        found.sort_by_key(|g| g.id);
        // SAFETY: non-null in/out count (NVML contract).
        if (unsafe { *count } as usize) < found.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let handles: Vec<Handle> = found
            .iter()
            .map(|g| encode(KIND_GI, 0, gpu, g.id, 0))
            .collect();
        let out = unsafe { out_slice(instances, handles.len())? };
        out.copy_from_slice(&handles);
        unsafe { put(count, handles.len() as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(gi: Handle, info: *mut GpuInstanceInfo) -> u32 {
    with_host("nvmlGpuInstanceGetInfo", |h| {
        let (gpu, id) = gpu_instance(h, gi)?;
        let g = h.gpus[gpu]
            .gis
            .iter()
            .find(|g| g.id == id)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        let v = GpuInstanceInfo {
            device: device_handle(h, gpu),
            id,
            profile_id: g.profile_id,
            placement: Placement {
                start: g.start,
                size: g.size,
            },
        };
        unsafe { put(info, v) }
    })
}

/// IN_USE "if processes ... or compute instances are active on the GPU instance".
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: Handle) -> u32 {
    with_host("nvmlGpuInstanceDestroy", |h| {
        let (gpu, id) = gpu_instance(h, gi)?;
        h.privileged()?;
        let g = &mut h.gpus[gpu];
        let pos = g
            .gis
            .iter()
            .position(|g| g.id == id)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        if g.gis[pos].busy || !g.gis[pos].cis.is_empty() {
            return Err(ERROR_IN_USE);
        }
        g.gis.remove(pos);
        Ok(())
    })
}

// -- compute instances -----------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: Handle,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut ComputeInstanceProfileInfo,
) -> u32 {
    with_host("nvmlGpuInstanceGetComputeInstanceProfileInfo", |h| {
        let (gpu, id) = gpu_instance(h, gi)?;
        if eng_profile != 0 || info.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let g = h.gpus[gpu]
            .gis
            .iter()
            .find(|g| g.id == id)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        let slices = ci_supported(g, profile)?;
        unsafe {
            put(
                info,
                ComputeInstanceProfileInfo {
                    id: profile,
                    slice_count: slices,
                    instance_count: g.slices / slices,
                    multiprocessor_count: slices * 16,
                    shared_copy_engine_count: g.slices,
                    shared_decoder_count: 1,
                    shared_encoder_count: 0,
                    shared_jpeg_count: 1,
                    shared_ofa_count: 0,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: Handle,
    profile_id: c_uint,
    out: *mut Handle,
) -> u32 {
    with_host("nvmlGpuInstanceCreateComputeInstance", |h| {
        let (gpu, id) = gpu_instance(h, gi)?;
        if out.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.privileged()?;
        let ci = create_ci(&mut h.gpus[gpu], id, profile_id)?;
        unsafe { put(out, encode(KIND_CI, 0, gpu, id, ci)) }
    })
}

/// Like `nvmlDeviceGetGpuInstances`: `*count` in is the buffer's length.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: Handle,
    profile_id: c_uint,
    out: *mut Handle,
    count: *mut c_uint,
) -> u32 {
    with_host("nvmlGpuInstanceGetComputeInstances", |h| {
        let (gpu, id) = gpu_instance(h, gi)?;
        if out.is_null() || count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.privileged()?;
        let g = h.gpus[gpu]
            .gis
            .iter()
            .find(|g| g.id == id)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        ci_supported(g, profile_id)?;
        let handles: Vec<Handle> = g
            .cis
            .iter()
            .filter(|c| c.profile == profile_id)
            .map(|c| encode(KIND_CI, 0, gpu, id, c.id))
            .collect();
        // SAFETY: non-null in/out count (NVML contract).
        if (unsafe { *count } as usize) < handles.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let buf = unsafe { out_slice(out, handles.len())? };
        buf.copy_from_slice(&handles);
        unsafe { put(count, handles.len() as c_uint) }
    })
}

/// IN_USE "if processes (e.g. CUDA application) are active on the compute instance".
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: Handle) -> u32 {
    with_host("nvmlComputeInstanceDestroy", |h| {
        let d = decode(ci);
        if d.kind != KIND_CI {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        h.privileged()?;
        let g = h
            .gpus
            .get_mut(d.gpu)
            .and_then(|g| g.gis.iter_mut().find(|g| g.id == d.gi))
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        let pos = g
            .cis
            .iter()
            .position(|c| c.id == d.ci)
            .ok_or(ERROR_INVALID_ARGUMENT)?;
        if g.busy {
            return Err(ERROR_IN_USE);
        }
        g.cis.remove(pos);
        Ok(())
    })
}
