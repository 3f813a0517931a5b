//! Health readings of one GPU: every counter the node agent's checks hold to a threshold
//! (`gpufleet-agent`'s `node/health`), each one either read or with the reason it could
//! not be (an unsupported query, no permission, a symbol the library lacks), so a check
//! can say "not run" instead of guessing.

use super::{GpuHealth, RowRemap};

/// A value, or why it could not be read (a sentence).
pub type Reading<T> = Result<T, String>;

/// ECC error counts: volatile since the driver loaded, aggregate over the GPU's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccCounts {
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

/// The PCIe link now and the most the GPU and its slot can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieLink {
    pub gen: u32,
    pub width: u32,
    pub max_gen: u32,
    pub max_width: u32,
}

/// NVLink error counters summed over the GPU's links (cumulative since the driver loaded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvlinkErrors {
    /// Links the GPU has (0: no NVLink).
    pub links: u32,
    /// Links that are not up.
    pub down: Vec<u32>,
    pub replay: u64,
    pub recovery: u64,
    pub crc_flit: u64,
    pub crc_data: u64,
}

/// Everything the checks read from one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReadings {
    pub index: u32,
    pub uuid: String,
    pub ecc: Reading<EccCounts>,
    pub retired_pages_pending: Reading<bool>,
    /// Pages retired so far (single- and double-bit causes); GPUs that remap rows instead
    /// (Ampere and newer) answer "not supported".
    pub retired_pages: Reading<u64>,
    pub remapped_rows: RowRemap,
    /// XID codes reported since the previous reading of this GPU.
    pub xids: Reading<Vec<u64>>,
    pub temperature_c: Reading<u32>,
    /// Where the GPU starts slowing its clocks to cool down.
    pub slowdown_c: Reading<u32>,
    pub power_mw: Reading<u32>,
    /// The enforced power limit.
    pub power_limit_mw: Reading<u32>,
    /// NVML's clocks-event (throttle) reason bits.
    pub throttle_reasons: Reading<u64>,
    pub pcie: Reading<PcieLink>,
    pub nvlink: Reading<NvlinkErrors>,
    /// The SM clock now and its maximum, MHz (the load tests read it under load).
    pub sm_clock_mhz: Reading<u32>,
    pub max_sm_clock_mhz: Reading<u32>,
}

impl GpuReadings {
    /// A GPU whose readings are all missing for one reason.
    pub fn unread(index: u32, uuid: &str, why: &str) -> Self {
        fn no<T>(why: &str) -> Reading<T> {
            Err(why.to_string())
        }
        Self {
            index,
            uuid: uuid.to_string(),
            ecc: no(why),
            retired_pages_pending: no(why),
            retired_pages: no(why),
            remapped_rows: RowRemap::Unknown,
            xids: no(why),
            temperature_c: no(why),
            slowdown_c: no(why),
            power_mw: no(why),
            power_limit_mw: no(why),
            throttle_reasons: no(why),
            pcie: no(why),
            nvlink: no(why),
            sm_clock_mhz: no(why),
            max_sm_clock_mhz: no(why),
        }
    }

    /// What a backend that reads only `health` can offer; the rest is marked unread.
    pub fn from_health(uuid: &str, h: &GpuHealth) -> Self {
        let why = "this hardware backend does not read it";
        let or = |v: Option<u32>| v.ok_or_else(|| why.to_string());
        let mut r = Self::unread(h.index, uuid, why);
        r.temperature_c = or(h.temperature_c);
        r.power_mw = or(h.power_mw);
        r.retired_pages_pending = h.retired_pages_pending.ok_or_else(|| why.to_string());
        r.remapped_rows = h.remapped_rows.clone();
        r
    }
}
