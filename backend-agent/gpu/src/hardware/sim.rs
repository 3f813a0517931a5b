//! A simulated node: MIG state per GPU held as the hardware holds it.
//!
//! It enforces the MIG rules with its own checks (not the planner's), so a planner bug
//! shows up as a failed create. Faults can be injected: a failing create or destroy, and
//! GPUs or instances marked busy.

use super::{
    BusyState, EccCounts, GpuBackend, GpuHealth, GpuInfo, GpuReadings, HwError, MigInstance,
    NvlinkErrors, PcieLink,
};
use crate::catalog::{self, GpuModel};
use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

const SIM_COMPUTE_SLICES: u32 = 7;
const SIM_MEMORY_SLICES: u32 = 8;

/// A node of identical simulated GPUs. See the module docs.
#[derive(Debug)]
pub struct SimulatedNode {
    hostname: String,
    driver_version: String,
    model: GpuModel,
    state: Mutex<SimState>,
}

#[derive(Debug, Default)]
struct SimState {
    gpus: Vec<SimGpu>,
    /// (creates still to pass before the failing one, message).
    failing_create: Option<(u32, String)>,
    failing_destroy: Option<(u32, String)>,
    /// Why the load tests cannot run on this node (a host without CUDA), if so.
    load_unavailable: Option<String>,
}

#[derive(Debug)]
struct SimGpu {
    info: GpuInfo,
    busy_starts: BTreeSet<u8>,
    whole_busy: bool,
    retired_pages_pending: bool,
    /// Injected health faults (healthy when default).
    faults: HealthFaults,
    /// A load test runs on it now.
    loaded: bool,
}

/// Health faults injected into one simulated GPU.
#[derive(Debug, Default, Clone)]
struct HealthFaults {
    /// Volatile (and so aggregate) uncorrected ECC errors: an ECC burst.
    ecc_uncorrected: u64,
    /// XIDs not yet read.
    xids: Vec<u64>,
    /// A degraded PCIe link: (generation, width) instead of the maximum.
    pcie: Option<(u32, u32)>,
    /// Faults that show only under load (the load tests' simulator reads them).
    load: LoadFaults,
}

/// Faults of one simulated GPU that show only under load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadFaults {
    /// Words of every memory-test pattern that read back with one bit flipped.
    pub flipped_bits: u64,
    /// Memory bandwidth as a share of the model's (slow memory), e.g. 0.5.
    pub memory_speed: Option<f64>,
    /// GEMM throughput as a share of the model's (throttled clocks), e.g. 0.4.
    pub compute_speed: Option<f64>,
    /// Host link as a share of the model's (a link that drops a generation under load).
    pub host_speed: Option<f64>,
    /// NVML throttle-reason bits the GPU reports while loaded (0x8 hardware slowdown,
    /// 0x40 hardware thermal, 0x80 power brake).
    pub throttle_under_load: u64,
    /// An XID the GPU logs when it is loaded.
    pub xid_under_load: Option<u64>,
    /// GEMM results (after the first) that come back with a flipped bit.
    pub corrupt_gemms: u64,
    /// All-reduce bus bandwidth as a share of the model's.
    pub nccl_speed: Option<f64>,
    /// The PCIe link (generation, width) while loaded: a link that drops under load.
    pub pcie_under_load: Option<(u32, u32)>,
}

/// What a healthy simulated GPU of `model` reports: typical figures of the model's board
/// (idle temperature and power; slowdown temperature, power limit, PCIe link and NVLink
/// count of its data-center form factor).
struct Nominal {
    slowdown_c: u32,
    power_limit_w: u32,
    pcie_gen: u32,
    nvlinks: u32,
    max_sm_clock_mhz: u32,
}

fn nominal(model: &GpuModel) -> Nominal {
    let (power_limit_w, nvlinks) = match model.name.as_str() {
        "L40S" => (350, 0),
        "A100-40GB" => (400, 12),
        "A100-80GB" => (400, 12),
        "H100-94GB" => (400, 3),
        "B200" => (1000, 18),
        n if n.starts_with("GH200") => (900, 18),
        _ => (700, 18),
    };
    let pcie_gen = match model.architecture.as_str() {
        "Ampere" | "Ada Lovelace" => 4,
        _ => 5,
    };
    // Maximum SM clocks of the boards' data sheets (H200 measured: 1,980 MHz).
    let max_sm_clock_mhz = match model.architecture.as_str() {
        "Ampere" => 1410,
        "Ada Lovelace" => 2520,
        "Blackwell" => 1965,
        _ => 1980,
    };
    Nominal {
        slowdown_c: 87,
        power_limit_w,
        pcie_gen,
        nvlinks,
        max_sm_clock_mhz,
    }
}

/// Idle temperature and power every simulated GPU reports.
const SIM_TEMPERATURE_C: u32 = 35;
const SIM_POWER_MW: u32 = 70_000;
/// An idle GPU's SM clock.
const SIM_IDLE_SM_CLOCK_MHZ: u32 = 345;
/// A healthy GPU's temperature under a burn, well below every model's slowdown.
const SIM_LOADED_TEMPERATURE_C: u32 = 62;
const SIM_PCIE_WIDTH: u32 = 16;

impl SimulatedNode {
    /// `gpu_count` GPUs of `model`, MIG off, nothing running.
    pub fn new(hostname: &str, model: &GpuModel, gpu_count: u32, driver_version: &str) -> Self {
        let gpus = (0..gpu_count)
            .map(|index| GpuInfo {
                index,
                uuid: gpu_uuid(hostname, index),
                model: model.name.clone(),
                memory_mib: model.memory_mib,
                mig_enabled: false,
                instances: Vec::new(),
            })
            .collect();
        Self::from_infos(hostname, model, driver_version, gpus)
    }

    /// Rebuilds a node from recorded GPU state (e.g. the control plane's database after
    /// a restart). Every record is checked against the MIG rules.
    pub fn with_state(
        hostname: &str,
        model: &GpuModel,
        driver_version: &str,
        gpus: Vec<GpuInfo>,
    ) -> Result<Self, HwError> {
        for (pos, gpu) in gpus.iter().enumerate() {
            if gpu.index as usize != pos {
                return Err(HwError::Rule(format!(
                    "gpus[{pos}].index: must be {pos} (GPUs are listed in index order), got {}",
                    gpu.index
                )));
            }
            if !gpu.instances.is_empty() && !gpu.mig_enabled {
                return Err(HwError::Rule(format!(
                    "gpus[{pos}].instances: MIG mode is off but {} instance(s) are recorded",
                    gpu.instances.len()
                )));
            }
            let mut placed: Vec<MigInstance> = Vec::new();
            for inst in &gpu.instances {
                check_create(model, gpu.index, &placed, inst.profile_id, inst.start)?;
                placed.push(inst.clone());
            }
        }
        let mut gpus = gpus;
        for g in &mut gpus {
            g.instances.sort_by_key(|i| i.start);
        }
        Ok(Self::from_infos(hostname, model, driver_version, gpus))
    }

    fn from_infos(
        hostname: &str,
        model: &GpuModel,
        driver_version: &str,
        gpus: Vec<GpuInfo>,
    ) -> Self {
        let gpus = gpus
            .into_iter()
            .map(|info| SimGpu {
                info,
                busy_starts: BTreeSet::new(),
                whole_busy: false,
                retired_pages_pending: false,
                faults: HealthFaults::default(),
                loaded: false,
            })
            .collect();
        Self {
            hostname: hostname.to_string(),
            driver_version: driver_version.to_string(),
            model: model.clone(),
            state: Mutex::new(SimState {
                gpus,
                ..SimState::default()
            }),
        }
    }

    /// The model every GPU of this node is.
    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    /// The next `create_instance` fails with `message` and changes nothing.
    pub fn fail_next_create(&self, message: &str) {
        self.fail_create_at(1, message);
    }

    /// The `n`-th `create_instance` from now (1 = the next) fails with `message`.
    pub fn fail_create_at(&self, n: u32, message: &str) {
        self.lock().failing_create = Some((n.max(1) - 1, message.to_string()));
    }

    /// The next `destroy_instance` fails with `message` and changes nothing.
    pub fn fail_next_destroy(&self, message: &str) {
        self.lock().failing_destroy = Some((0, message.to_string()));
    }

    /// Marks the instance starting at `start` on `gpu` as running work (or idle).
    pub fn set_in_use(&self, gpu: u32, start: u8, busy: bool) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            if busy {
                g.busy_starts.insert(start);
            } else {
                g.busy_starts.remove(&start);
            }
        }
    }

    /// Marks the whole GPU (MIG off) as running work, or every one of its instances
    /// when MIG is on; `false` clears both.
    pub fn set_gpu_in_use(&self, gpu: u32, busy: bool) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            g.whole_busy = busy && !g.info.mig_enabled;
            g.busy_starts = if busy {
                g.info.instances.iter().map(|i| i.start).collect()
            } else {
                BTreeSet::new()
            };
        }
    }

    /// Makes `health` report pending page retirement on `gpu` (a finding that fails it).
    pub fn set_retired_pages_pending(&self, gpu: u32, pending: bool) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            g.retired_pages_pending = pending;
        }
    }

    /// An ECC burst: `gpu` reports `count` uncorrected errors (0: none).
    pub fn set_ecc_uncorrected(&self, gpu: u32, count: u64) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            g.faults.ecc_uncorrected = count;
        }
    }

    /// `gpu` reports XID `code` at the next health reading.
    pub fn push_xid(&self, gpu: u32, code: u64) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            g.faults.xids.push(code);
        }
    }

    /// A degraded PCIe link on `gpu`: `Some((generation, width))`, or `None` for the full
    /// link.
    pub fn set_pcie_link(&self, gpu: u32, link: Option<(u32, u32)>) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            g.faults.pcie = link;
        }
    }

    /// Makes the node answer as a host that cannot run load tests (`Some(why)`), or as
    /// one that can.
    pub fn set_load_unavailable(&self, why: Option<String>) {
        self.lock().load_unavailable = why;
    }

    /// Why the load tests cannot run here, if so.
    pub fn load_unavailable(&self) -> Option<String> {
        self.lock().load_unavailable.clone()
    }

    /// Faults of `gpu` that show only under load (see [`LoadFaults`]).
    pub fn set_load_faults(&self, gpu: u32, faults: LoadFaults) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            g.faults.load = faults;
        }
    }

    /// The load faults injected into `gpu` (none for a GPU the node lacks).
    pub fn load_faults(&self, gpu: u32) -> LoadFaults {
        self.lock()
            .gpus
            .get(gpu as usize)
            .map(|g| g.faults.load.clone())
            .unwrap_or_default()
    }

    /// Marks `gpu` under load (a burn runs) or idle. Going under load logs the GPU's
    /// injected XID-under-load, as a GPU that fails only when worked would.
    pub fn set_loaded(&self, gpu: u32, loaded: bool) {
        if let Some(g) = self.lock().gpus.get_mut(gpu as usize) {
            if loaded && !g.loaded {
                if let Some(code) = g.faults.load.xid_under_load {
                    g.faults.xids.push(code);
                }
            }
            g.loaded = loaded;
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic while holding the lock cannot leave the state half-changed: every
        // mutation is a single push/remove after all checks.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SimState {
    fn gpu(&mut self, gpu: u32) -> Result<&mut SimGpu, HwError> {
        self.gpus
            .get_mut(gpu as usize)
            .ok_or(HwError::InvalidGpu(gpu))
    }

    /// Counts down an armed fault; true when this call is the one to fail.
    fn trips(slot: &mut Option<(u32, String)>) -> Option<String> {
        match slot.take() {
            Some((0, msg)) => Some(msg),
            Some((n, msg)) => {
                *slot = Some((n - 1, msg));
                None
            }
            None => None,
        }
    }
}

/// The simulator's own rule checks for creating `profile_id` at `start` next to `existing`.
fn check_create(
    model: &GpuModel,
    gpu: u32,
    existing: &[MigInstance],
    profile_id: u32,
    start: u8,
) -> Result<(), HwError> {
    let Some(profile) = model.profile_by_id(profile_id) else {
        let ids: Vec<String> = model
            .profiles
            .iter()
            .map(|p| format!("{} ({})", p.id, p.name))
            .collect();
        return Err(HwError::Rule(format!(
            "gpu {gpu}: profile id {profile_id} does not exist on {}; valid ids: {}",
            model.name,
            ids.join(", ")
        )));
    };
    if !profile.valid_starts.contains(&start) {
        let starts: Vec<String> = profile.valid_starts.iter().map(|s| s.to_string()).collect();
        return Err(HwError::Rule(format!(
            "gpu {gpu}: {} can only start at slice {}, not {start}",
            profile.name,
            starts.join(", ")
        )));
    }
    let end = start as u32 + profile.memory_slices as u32;
    if end > SIM_MEMORY_SLICES {
        return Err(HwError::Rule(format!(
            "gpu {gpu}: {}@{start} would end at slice {end}, past the last slice {}",
            profile.name,
            SIM_MEMORY_SLICES - 1
        )));
    }
    for other in existing {
        let other_end = other.start as u32 + other.size as u32;
        if (start as u32) < other_end && (other.start as u32) < end {
            return Err(HwError::Rule(format!(
                "gpu {gpu}: {}@{start} overlaps {}@{} (memory slices {}..{})",
                profile.name, other.profile, other.start, other.start, other_end
            )));
        }
    }
    let same = existing
        .iter()
        .filter(|i| i.profile_id == profile_id)
        .count();
    if same >= profile.max_per_gpu as usize {
        return Err(HwError::Rule(format!(
            "gpu {gpu}: {}: at most {} per GPU",
            profile.name, profile.max_per_gpu
        )));
    }
    let compute: u32 = existing
        .iter()
        .map(|i| {
            model
                .profile_by_id(i.profile_id)
                .map_or(0, |p| p.compute_slices as u32)
        })
        .sum();
    if compute + profile.compute_slices as u32 > SIM_COMPUTE_SLICES {
        return Err(HwError::Rule(format!(
            "gpu {gpu}: {} needs {} compute slice(s) but only {} of {SIM_COMPUTE_SLICES} are free",
            profile.name,
            profile.compute_slices,
            SIM_COMPUTE_SLICES - compute
        )));
    }
    Ok(())
}

impl GpuBackend for SimulatedNode {
    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn driver_version(&self) -> Result<String, HwError> {
        Ok(self.driver_version.clone())
    }

    fn cuda_version(&self) -> Result<String, HwError> {
        catalog::newest_cuda_for_driver(&self.driver_version)
            .map(str::to_string)
            .ok_or_else(|| {
                HwError::Unsupported(format!(
                    "driver {} predates every CUDA version the catalog knows (11.8 needs 520.61.05)",
                    self.driver_version
                ))
            })
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, HwError> {
        Ok(self.lock().gpus.iter().map(|g| g.info.clone()).collect())
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError> {
        let mut state = self.lock();
        let g = state.gpu(gpu)?;
        if !self.model.mig_capable {
            return Err(HwError::Unsupported(format!(
                "gpu {gpu}: {} does not support MIG",
                self.model.name
            )));
        }
        if g.info.mig_enabled == enabled {
            return Ok(());
        }
        if g.whole_busy {
            return Err(HwError::InUse {
                gpu,
                instances: vec![format!("GPU {gpu} ({})", g.info.uuid)],
            });
        }
        if !enabled && !g.info.instances.is_empty() {
            return Err(HwError::Rule(format!(
                "gpu {gpu}: cannot turn MIG off while {} instance(s) exist; destroy them first",
                g.info.instances.len()
            )));
        }
        g.info.mig_enabled = enabled;
        Ok(())
    }

    fn create_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, HwError> {
        let mut state = self.lock();
        state.gpu(gpu)?;
        if let Some(msg) = SimState::trips(&mut state.failing_create) {
            return Err(HwError::Injected(msg));
        }
        let g = state.gpu(gpu)?;
        if !g.info.mig_enabled {
            return Err(HwError::Rule(format!(
                "gpu {gpu}: MIG mode is off; enable it before creating instances"
            )));
        }
        check_create(&self.model, gpu, &g.info.instances, profile_id, start)?;
        let profile = self
            .model
            .profile_by_id(profile_id)
            .expect("check_create accepted the profile id");
        let instance = MigInstance {
            profile_id,
            profile: profile.name.clone(),
            start,
            size: profile.memory_slices,
            memory_mib: profile.memory_mib,
            uuid: mig_uuid(&self.hostname, gpu, profile_id, start),
        };
        g.info.instances.push(instance.clone());
        g.info.instances.sort_by_key(|i| i.start);
        Ok(instance)
    }

    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError> {
        let mut state = self.lock();
        state.gpu(gpu)?;
        if let Some(msg) = SimState::trips(&mut state.failing_destroy) {
            return Err(HwError::Injected(msg));
        }
        let g = state.gpu(gpu)?;
        let Some(pos) = g.info.instances.iter().position(|i| i.start == start) else {
            return Err(HwError::Rule(format!(
                "gpu {gpu}: no MIG instance starts at slice {start}"
            )));
        };
        if g.busy_starts.contains(&start) {
            let i = &g.info.instances[pos];
            return Err(HwError::InUse {
                gpu,
                instances: vec![format!("{}@{} ({})", i.profile, i.start, i.uuid)],
            });
        }
        g.info.instances.remove(pos);
        Ok(())
    }

    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError> {
        let mut state = self.lock();
        let g = state.gpu(gpu)?;
        let mut findings = Vec::new();
        if g.retired_pages_pending {
            findings.push(format!(
                "gpu {gpu}: retired pages are pending; reset the GPU (or reboot) before use"
            ));
        }
        let ecc = g.faults.ecc_uncorrected;
        if ecc > 0 {
            findings.push(format!(
                "gpu {gpu}: {ecc} uncorrected ECC error(s) since the driver loaded; drain and reset the GPU"
            ));
        }
        Ok(GpuHealth {
            index: gpu,
            temperature_c: Some(SIM_TEMPERATURE_C),
            power_mw: Some(SIM_POWER_MW),
            ecc_uncorrected: Some(ecc),
            retired_pages_pending: Some(g.retired_pages_pending),
            remapped_rows: if g.info.mig_enabled {
                super::RowRemap::NotUnderMig
            } else {
                super::RowRemap::Counts {
                    correctable: 0,
                    uncorrectable: 0,
                    pending: false,
                    failure: false,
                }
            },
            healthy: findings.is_empty(),
            findings,
        })
    }

    fn readings(&self, gpu: u32) -> Result<GpuReadings, HwError> {
        let health = self.health(gpu)?;
        let nominal = nominal(&self.model);
        let mut state = self.lock();
        let g = state.gpu(gpu)?;
        let loaded = g.loaded;
        let faults = &mut g.faults;
        let (gen, width) = match faults.load.pcie_under_load.filter(|_| loaded) {
            Some(link) => link,
            None => faults.pcie.unwrap_or((nominal.pcie_gen, SIM_PCIE_WIDTH)),
        };
        let nvlink = if nominal.nvlinks == 0 {
            Err(format!("{} has no NVLink", self.model.name))
        } else {
            Ok(NvlinkErrors {
                links: nominal.nvlinks,
                ..NvlinkErrors::default()
            })
        };
        Ok(GpuReadings {
            index: gpu,
            uuid: g.info.uuid.clone(),
            ecc: Ok(EccCounts {
                volatile_uncorrected: faults.ecc_uncorrected,
                aggregate_uncorrected: faults.ecc_uncorrected,
                ..EccCounts::default()
            }),
            retired_pages_pending: Ok(g.retired_pages_pending),
            retired_pages: Err(format!(
                "{} remaps rows instead of retiring pages",
                self.model.name
            )),
            remapped_rows: health.remapped_rows,
            xids: Ok(std::mem::take(&mut faults.xids)),
            temperature_c: Ok(if loaded {
                SIM_LOADED_TEMPERATURE_C
            } else {
                SIM_TEMPERATURE_C
            }),
            slowdown_c: Ok(nominal.slowdown_c),
            power_mw: Ok(if loaded {
                nominal.power_limit_w * 800
            } else {
                SIM_POWER_MW
            }),
            power_limit_mw: Ok(nominal.power_limit_w * 1000),
            throttle_reasons: Ok(if loaded {
                faults.load.throttle_under_load
            } else {
                0
            }),
            // Idle clocks drop; under load a throttled GPU runs at 60% of its maximum.
            sm_clock_mhz: Ok(match (loaded, faults.load.throttle_under_load) {
                (false, _) => SIM_IDLE_SM_CLOCK_MHZ,
                (true, 0) => nominal.max_sm_clock_mhz,
                (true, _) => nominal.max_sm_clock_mhz * 3 / 5,
            }),
            max_sm_clock_mhz: Ok(nominal.max_sm_clock_mhz),
            pcie: Ok(PcieLink {
                gen,
                width,
                max_gen: nominal.pcie_gen,
                max_width: SIM_PCIE_WIDTH,
            }),
            nvlink,
        })
    }

    /// A simulated GPU is fully busy while work runs on it (as a whole or on any of its
    /// MIG instances), else idle; its memory in use is that of its busy MIG instances, or
    /// all of it while it is busy as a whole.
    fn usage(&self, gpu: u32) -> Result<super::GpuUsage, HwError> {
        let mut state = self.lock();
        let g = state.gpu(gpu)?;
        let total = g.info.memory_mib;
        let busy_slices: u64 = g
            .info
            .instances
            .iter()
            .filter(|i| g.busy_starts.contains(&i.start))
            .map(|i| i.memory_mib)
            .sum();
        let used = if g.whole_busy { total } else { busy_slices };
        Ok(super::GpuUsage {
            utilization_percent: Some(if used > 0 { 100 } else { 0 }),
            memory_used_mib: used.min(total),
            memory_total_mib: total,
        })
    }

    fn busy(&self, gpu: u32) -> Result<BusyState, HwError> {
        let mut state = self.lock();
        let g = state.gpu(gpu)?;
        Ok(BusyState {
            whole_gpu: g.whole_busy,
            instance_starts: g
                .info
                .instances
                .iter()
                .map(|i| i.start)
                .filter(|s| g.busy_starts.contains(s))
                .collect(),
        })
    }
}

/// FNV-1a over 128 bits: a stable hash for deterministic UUIDs (std's hasher is not
/// guaranteed stable across Rust releases).
fn fnv1a_128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for part in parts {
        for &b in part.iter().chain(std::iter::once(&0xffu8)) {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

fn uuid_from_hash(h: u128) -> String {
    uuid::Builder::from_random_bytes(h.to_be_bytes())
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// "GPU-<uuid>" derived from hostname and index.
pub(crate) fn gpu_uuid(hostname: &str, index: u32) -> String {
    let h = fnv1a_128(&[b"gpu", hostname.as_bytes(), &index.to_be_bytes()]);
    format!("GPU-{}", uuid_from_hash(h))
}

/// "MIG-<uuid>" derived from hostname, GPU index, profile and start: the same instance
/// recreated after a rollback gets the same UUID.
pub(crate) fn mig_uuid(hostname: &str, gpu: u32, profile_id: u32, start: u8) -> String {
    let h = fnv1a_128(&[
        b"mig",
        hostname.as_bytes(),
        &gpu.to_be_bytes(),
        &profile_id.to_be_bytes(),
        &[start],
    ]);
    format!("MIG-{}", uuid_from_hash(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> SimulatedNode {
        SimulatedNode::new(
            "node-a",
            catalog::model("H100-80GB").unwrap(),
            2,
            "550.54.15",
        )
    }

    fn rule(r: Result<MigInstance, HwError>) -> String {
        match r {
            Err(HwError::Rule(m)) => m,
            other => panic!("expected a rule error, got {other:?}"),
        }
    }

    #[test]
    fn uuids_are_deterministic_and_distinct() {
        let a = node().gpus().unwrap();
        let b = node().gpus().unwrap();
        assert_eq!(a, b);
        assert_ne!(a[0].uuid, a[1].uuid);
        assert!(
            a[0].uuid.starts_with("GPU-") && a[0].uuid.len() == 40,
            "{}",
            a[0].uuid
        );
        let other = SimulatedNode::new(
            "node-b",
            catalog::model("H100-80GB").unwrap(),
            1,
            "550.54.15",
        );
        assert_ne!(other.gpus().unwrap()[0].uuid, a[0].uuid);
        assert!(mig_uuid("node-a", 0, 9, 0).starts_with("MIG-"));
        assert_ne!(mig_uuid("node-a", 0, 9, 0), mig_uuid("node-a", 0, 9, 4));
    }

    #[test]
    fn non_mig_model_reports_whole_gpus_and_refuses_mig_mode() {
        let n = SimulatedNode::new("l40s-a", catalog::model("L40S").unwrap(), 2, "550.54.15");
        let gpus = n.gpus().unwrap();
        assert_eq!(gpus.len(), 2);
        assert!(gpus.iter().all(|g| !g.mig_enabled && g.memory_mib == 46068));
        match n.set_mig_mode(0, true) {
            Err(HwError::Unsupported(m)) => assert_eq!(m, "gpu 0: L40S does not support MIG"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
        assert!(!n.gpus().unwrap()[0].mig_enabled);
    }

    #[test]
    fn create_needs_mig_mode() {
        let n = node();
        assert!(rule(n.create_instance(0, 9, 0)).contains("MIG mode is off"));
        n.set_mig_mode(0, true).unwrap();
        let i = n.create_instance(0, 9, 0).unwrap();
        assert_eq!(
            (i.profile.as_str(), i.start, i.size, i.memory_mib),
            ("3g.40gb", 0, 4, 40448)
        );
        assert!(!n.gpus().unwrap()[1].mig_enabled);
    }

    #[test]
    fn enforces_starts_overlap_counts_and_compute() {
        let n = node();
        n.set_mig_mode(0, true).unwrap();
        assert!(
            rule(n.create_instance(0, 5, 4)).contains("4g.40gb can only start at slice 0, not 4")
        );
        n.create_instance(0, 9, 0).unwrap();
        assert!(rule(n.create_instance(0, 5, 0)).contains("overlaps 3g.40gb@0"));
        assert!(rule(n.create_instance(0, 19, 3)).contains("overlaps"));
        n.create_instance(0, 9, 4).unwrap();
        assert!(rule(n.create_instance(0, 9, 4)).contains("overlaps"));
        // Memory full and compute at 6: a fresh GPU tests the count and compute rules.
        n.set_mig_mode(1, true).unwrap();
        n.create_instance(1, 20, 0).unwrap();
        assert!(rule(n.create_instance(1, 20, 1)).contains("1g.10gb+me: at most 1 per GPU"));
        assert!(rule(n.create_instance(1, 5, 0)).contains("overlaps 1g.10gb+me@0"));
        for s in [1, 2, 3, 4, 5, 6] {
            n.create_instance(1, 19, s).unwrap();
        }
        assert_eq!(n.gpus().unwrap()[1].instances.len(), 7);
        assert!(rule(n.create_instance(1, 999, 0)).contains("profile id 999 does not exist"));
    }

    #[test]
    fn compute_limit_without_memory_overlap() {
        let n = node();
        n.set_mig_mode(0, true).unwrap();
        // 4g@0 (4 compute) + 2g@4 (2) + 1g.20gb@6 (1) = 7 compute, 8 memory: full.
        n.create_instance(0, 5, 0).unwrap();
        n.create_instance(0, 14, 4).unwrap();
        n.create_instance(0, 15, 6).unwrap();
        let n2 = node();
        n2.set_mig_mode(0, true).unwrap();
        // 2g@0, 2g@2, 2g@4 = 6 compute; 1g.20gb@6 = 7; nothing more fits by compute.
        for s in [0, 2, 4] {
            n2.create_instance(0, 14, s).unwrap();
        }
        n2.create_instance(0, 19, 6).unwrap();
        assert!(rule(n2.create_instance(0, 19, 7)).contains("can only start"));
    }

    #[test]
    fn destroy_and_mig_off() {
        let n = node();
        n.set_mig_mode(0, true).unwrap();
        n.create_instance(0, 0, 0).unwrap();
        match n.set_mig_mode(0, false) {
            Err(HwError::Rule(m)) => {
                assert!(m.contains("cannot turn MIG off while 1 instance(s) exist"))
            }
            other => panic!("{other:?}"),
        }
        n.set_in_use(0, 0, true);
        assert!(matches!(
            n.destroy_instance(0, 0),
            Err(HwError::InUse { gpu: 0, .. })
        ));
        n.set_in_use(0, 0, false);
        n.destroy_instance(0, 0).unwrap();
        assert!(matches!(n.destroy_instance(0, 0), Err(HwError::Rule(_))));
        n.set_mig_mode(0, false).unwrap();
        assert!(!n.gpus().unwrap()[0].mig_enabled);
    }

    #[test]
    fn injected_create_failure_changes_nothing() {
        let n = node();
        n.set_mig_mode(0, true).unwrap();
        n.fail_create_at(2, "power glitch");
        n.create_instance(0, 19, 0).unwrap();
        assert_eq!(
            n.create_instance(0, 19, 1),
            Err(HwError::Injected("power glitch".into()))
        );
        assert_eq!(n.gpus().unwrap()[0].instances.len(), 1);
        n.create_instance(0, 19, 1).unwrap();
    }

    #[test]
    fn busy_reports_instances_and_whole_gpu() {
        let n = node();
        n.set_gpu_in_use(0, true);
        assert!(n.busy(0).unwrap().whole_gpu);
        assert!(matches!(
            n.set_mig_mode(0, true),
            Err(HwError::InUse { .. })
        ));
        n.set_gpu_in_use(0, false);
        n.set_mig_mode(0, true).unwrap();
        n.create_instance(0, 9, 4).unwrap();
        n.set_in_use(0, 4, true);
        assert_eq!(n.busy(0).unwrap().instance_starts, vec![4]);
        assert!(matches!(n.busy(5), Err(HwError::InvalidGpu(5))));
    }

    #[test]
    fn with_state_restores_and_validates() {
        let n = node();
        n.set_mig_mode(1, true).unwrap();
        n.create_instance(1, 9, 4).unwrap();
        n.create_instance(1, 14, 0).unwrap();
        let saved = n.gpus().unwrap();
        let m = catalog::model("H100-80GB").unwrap();
        let restored = SimulatedNode::with_state("node-a", m, "550.54.15", saved.clone()).unwrap();
        assert_eq!(restored.gpus().unwrap(), saved);
        let mut bad = saved.clone();
        bad[1].instances[0].start = 4; // 2g@4 overlaps the recorded 3g@4.
        assert!(SimulatedNode::with_state("node-a", m, "550.54.15", bad).is_err());
        let mut off = saved;
        off[1].mig_enabled = false;
        assert!(SimulatedNode::with_state("node-a", m, "550.54.15", off).is_err());
    }

    #[test]
    fn driver_and_cuda() {
        let n = node();
        assert_eq!(n.driver_version().unwrap(), "550.54.15");
        assert_eq!(n.cuda_version().unwrap(), "12.4");
        assert_eq!(n.hostname(), "node-a");
    }

    #[test]
    fn readings_are_healthy_until_faults_are_injected() {
        let n = node();
        let r = n.readings(1).unwrap();
        assert_eq!(r.uuid, n.gpus().unwrap()[1].uuid);
        assert_eq!(r.ecc, Ok(EccCounts::default()));
        assert_eq!(r.xids, Ok(vec![]));
        assert_eq!(
            r.pcie,
            Ok(PcieLink {
                gen: 5,
                width: 16,
                max_gen: 5,
                max_width: 16
            })
        );
        assert_eq!(r.nvlink.as_ref().unwrap().links, 18);
        n.set_ecc_uncorrected(1, 3);
        n.push_xid(1, 79);
        n.set_pcie_link(1, Some((3, 8)));
        let r = n.readings(1).unwrap();
        assert_eq!(r.ecc.unwrap().volatile_uncorrected, 3);
        assert_eq!(r.xids, Ok(vec![79]));
        let link = r.pcie.unwrap();
        assert_eq!((link.gen, link.width), (3, 8));
        assert!(!n.health(1).unwrap().healthy);
        // XIDs are consumed by the reading that reports them.
        assert_eq!(n.readings(1).unwrap().xids, Ok(vec![]));
        let l40s = SimulatedNode::new("l", catalog::model("L40S").unwrap(), 1, "550.54.15");
        assert!(l40s.readings(0).unwrap().nvlink.is_err());
    }

    #[test]
    fn health_findings() {
        let n = node();
        assert!(n.health(0).unwrap().healthy);
        n.set_retired_pages_pending(0, true);
        let h = n.health(0).unwrap();
        assert!(!h.healthy);
        assert_eq!(h.retired_pages_pending, Some(true));
        assert!(h.findings[0].contains("retired pages are pending"));
    }
}
