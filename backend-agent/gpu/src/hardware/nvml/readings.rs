//! The health checks' readings through NVML: nvml-wrapper's calls where it has them
//! (ECC, retirement, temperature and its slowdown threshold, power and its limit,
//! throttle reasons, PCIe link, NVLink counters), and XID events through the raw event-set
//! symbols (nvml-wrapper's `EventSet` borrows the `Nvml`, which the backend owns, so the
//! backend keeps the raw set instead). A query that fails leaves its reason in the reading.

use super::{nvml_error, NvmlBackend};
use crate::hardware::{EccCounts, GpuReadings, HwError, NvlinkErrors, PcieLink, Reading};
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings as sys;
use std::collections::BTreeMap;
use std::os::raw::c_uint;

/// The raw event set XIDs arrive on, and what arrived and was not read yet.
#[derive(Default)]
pub(super) struct XidWatch {
    set: Option<EventSet>,
    /// Why XIDs cannot be watched at all (no event symbols, creating the set failed).
    broken: Option<String>,
    /// Per GPU index: why its XIDs cannot be watched (registration refused).
    unwatched: BTreeMap<u32, String>,
    /// Per GPU index: XIDs received and not yet reported.
    pending: BTreeMap<u32, Vec<u64>>,
}

/// An NVML event set handle. NVML's handles may be used from any thread.
struct EventSet(sys::nvmlEventSet_t);
// SAFETY: the handle is an opaque token NVML accepts from any thread; the backend only
// uses it under the `XidWatch` mutex.
unsafe impl Send for EventSet {}

fn read<T>(what: &str, r: Result<T, NvmlError>) -> Reading<T> {
    r.map_err(|e| match e {
        NvmlError::NotSupported => format!("{what}: not supported on this GPU"),
        NvmlError::FailedToLoadSymbol(s) => format!("{what}: this NVML library lacks it ({s})"),
        other => nvml_error(what, other).to_string(),
    })
}

impl NvmlBackend {
    /// Creates the event set and registers every GPU for critical XID events. Failures
    /// are kept: the XID check then says why it did not run.
    pub(super) fn start_xid_watch(&self) {
        let mut watch = self.xids.lock().unwrap_or_else(|p| p.into_inner());
        if watch.set.is_some() || watch.broken.is_some() {
            return;
        }
        let lib = self.nvml.lib();
        let syms = nvml_sym(lib.nvmlEventSetCreate.as_ref())
            .and_then(|c| Ok((c, nvml_sym(lib.nvmlDeviceRegisterEvents.as_ref())?)));
        let (create, register) = match syms {
            Ok(s) => s,
            Err(e) => {
                watch.broken = Some(format!("XID events cannot be watched: {e}"));
                return;
            }
        };
        let mut set: sys::nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: NVML writes the new set's handle into `set`.
        if let Err(e) = nvml_try(unsafe { create(&mut set) }) {
            watch.broken = Some(nvml_error("creating the XID event set", e).to_string());
            return;
        }
        let count = self.count().unwrap_or(0);
        for index in 0..count {
            let registered = self.nvml.device_by_index(index).and_then(|d| {
                // SAFETY: live device handle and the set created above.
                nvml_try(unsafe {
                    register(d.handle(), sys::nvmlEventTypeXidCriticalError as u64, set)
                })
            });
            if let Err(e) = registered {
                let why = read::<()>(&format!("gpu {index}: watching XID events"), Err(e));
                watch.unwatched.insert(index, why.unwrap_err());
            }
        }
        watch.set = Some(EventSet(set));
    }

    /// Moves every XID event waiting on the set into `pending`.
    fn drain_xids(&self, watch: &mut XidWatch) {
        let Some(set) = watch.set.as_ref().map(|s| s.0) else {
            return;
        };
        let lib = self.nvml.lib();
        let (Ok(wait), Ok(index_of)) = (
            nvml_sym(lib.nvmlEventSetWait_v2.as_ref()),
            nvml_sym(lib.nvmlDeviceGetIndex.as_ref()),
        ) else {
            watch.broken = Some("XID events cannot be read: this NVML library lacks nvmlEventSetWait_v2 or nvmlDeviceGetIndex".into());
            return;
        };
        // Bounded: a storm of events is read in one go up to this many.
        for _ in 0..4096 {
            // SAFETY: plain C struct NVML fills in; zeroed is a valid bit pattern.
            let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
            // SAFETY: the set is live; timeout 0 returns at once.
            match nvml_try(unsafe { wait(set, &mut data, 0) }) {
                Ok(()) => {}
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    watch.broken = Some(nvml_error("reading XID events", e).to_string());
                    break;
                }
            }
            if data.eventType & sys::nvmlEventTypeXidCriticalError as u64 == 0 {
                continue;
            }
            let mut index: c_uint = 0;
            // SAFETY: the event names a device handle NVML gave out.
            if nvml_try(unsafe { index_of(data.device, &mut index) }).is_ok() {
                watch.pending.entry(index).or_default().push(data.eventData);
            }
        }
    }

    /// The XIDs of `gpu` since the previous call.
    fn xids_of(&self, gpu: u32) -> Reading<Vec<u64>> {
        let mut watch = self.xids.lock().unwrap_or_else(|p| p.into_inner());
        self.drain_xids(&mut watch);
        if let Some(why) = &watch.broken {
            return Err(why.clone());
        }
        if let Some(why) = watch.unwatched.get(&gpu) {
            return Err(why.clone());
        }
        Ok(watch.pending.remove(&gpu).unwrap_or_default())
    }

    /// Frees the event set (before NVML shuts down).
    pub(super) fn stop_xid_watch(&self) {
        let mut watch = self.xids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = watch.set.take() {
            if let Ok(free) = nvml_sym(self.nvml.lib().nvmlEventSetFree.as_ref()) {
                // SAFETY: the set is live and no longer used after this.
                let _ = unsafe { free(set.0) };
            }
        }
    }

    pub(super) fn read_readings(&self, gpu: u32) -> Result<GpuReadings, HwError> {
        let device = self.device(gpu)?;
        let uuid = device
            .uuid()
            .map_err(|e| nvml_error(&format!("gpu {gpu}: UUID"), e))?;
        let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        let count_ecc = |kind, counter| device.total_ecc_errors(kind, counter);
        let ecc = (|| {
            Ok(EccCounts {
                volatile_corrected: count_ecc(MemoryError::Corrected, EccCounter::Volatile)?,
                volatile_uncorrected: count_ecc(MemoryError::Uncorrected, EccCounter::Volatile)?,
                aggregate_corrected: count_ecc(MemoryError::Corrected, EccCounter::Aggregate)?,
                aggregate_uncorrected: count_ecc(MemoryError::Uncorrected, EccCounter::Aggregate)?,
            })
        })();
        let retired = (|| {
            let sbe = device.retired_pages(RetirementCause::MultipleSingleBitEccErrors)?;
            let dbe = device.retired_pages(RetirementCause::DoubleBitEccError)?;
            Ok((sbe.len() + dbe.len()) as u64)
        })();
        let pcie = (|| {
            Ok(PcieLink {
                gen: device.current_pcie_link_gen()?,
                width: device.current_pcie_link_width()?,
                max_gen: device.max_pcie_link_gen()?,
                max_width: device.max_pcie_link_width()?,
            })
        })();
        Ok(GpuReadings {
            index: gpu,
            uuid,
            ecc: read(&format!("gpu {gpu}: ECC counters"), ecc),
            retired_pages_pending: read(
                &format!("gpu {gpu}: pending page retirement"),
                device.are_pages_pending_retired(),
            ),
            retired_pages: read(&format!("gpu {gpu}: retired pages"), retired),
            remapped_rows: self.remapped_rows(&device, mig_enabled),
            xids: self.xids_of(gpu),
            temperature_c: read(
                &format!("gpu {gpu}: temperature"),
                device.temperature(TemperatureSensor::Gpu),
            ),
            slowdown_c: read(
                &format!("gpu {gpu}: slowdown temperature"),
                device.temperature_threshold(TemperatureThreshold::Slowdown),
            ),
            power_mw: read(&format!("gpu {gpu}: power draw"), device.power_usage()),
            power_limit_mw: read(
                &format!("gpu {gpu}: power limit"),
                device.enforced_power_limit(),
            ),
            sm_clock_mhz: read(
                &format!("gpu {gpu}: SM clock"),
                device.clock_info(Clock::SM),
            ),
            max_sm_clock_mhz: read(
                &format!("gpu {gpu}: maximum SM clock"),
                device.max_clock_info(Clock::SM),
            ),
            throttle_reasons: read(
                &format!("gpu {gpu}: throttle reasons"),
                device.current_throttle_reasons().map(|r| r.bits()),
            ),
            pcie: read(&format!("gpu {gpu}: PCIe link"), pcie),
            nvlink: nvlink_errors(gpu, &device),
        })
    }
}

/// NVLink counters summed over the links NVML knows for the GPU; links are probed from 0
/// until NVML refuses the index.
fn nvlink_errors(gpu: u32, device: &Device<'_>) -> Reading<NvlinkErrors> {
    let mut out = NvlinkErrors::default();
    for link in 0..sys::NVML_NVLINK_MAX_LINKS {
        let l = device.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => {}
            Ok(false) => {
                out.links += 1;
                out.down.push(link);
                continue;
            }
            Err(NvmlError::NotSupported) | Err(NvmlError::InvalidArg) => continue,
            Err(e) => return read(&format!("gpu {gpu}: NVLink {link} state"), Err(e)),
        }
        out.links += 1;
        let count = |c| {
            read(
                &format!("gpu {gpu}: NVLink {link} error counters"),
                l.error_counter(c),
            )
        };
        out.replay += count(ErrorCounter::DlReplay)?;
        out.recovery += count(ErrorCounter::DlRecovery)?;
        out.crc_flit += count(ErrorCounter::DlCrcFlit)?;
        out.crc_data += count(ErrorCounter::DlCrcData)?;
    }
    if out.links == 0 {
        return Err(format!("gpu {gpu}: no NVLink (NVML reports no link)"));
    }
    Ok(out)
}
