//! The emulated host: GPUs, their MIG state and the rules NVML enforces, in safe Rust.
//! Every operation answers `Result<_, u32>` with the NVML return code nvml.h documents
//! for the failure.

use crate::scenario::{Access, Activation, Compute, Scenario};
use std::collections::HashMap;

pub const SUCCESS: u32 = 0;
pub const ERROR_INVALID_ARGUMENT: u32 = 2;
pub const ERROR_NOT_SUPPORTED: u32 = 3;
pub const ERROR_NO_PERMISSION: u32 = 4;
pub const ERROR_NOT_FOUND: u32 = 6;
pub const ERROR_INSUFFICIENT_SIZE: u32 = 7;
pub const ERROR_GPU_IS_LOST: u32 = 15;
pub const ERROR_RESET_REQUIRED: u32 = 16;
pub const ERROR_IN_USE: u32 = 19;
pub const ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
pub const ERROR_UNINITIALIZED: u32 = 1;
pub const ERROR_UNKNOWN: u32 = 999;

pub type R<T> = Result<T, u32>;

/// A model: NVML's name, total memory (MiB) and per-profile memory (MiB) in the order of
/// `PROFILES` below, or `None` without MIG.
pub struct ModelSpec {
    pub key: &'static str,
    pub nvml_name: &'static str,
    pub memory_mib: u64,
    pub profile_mib: Option<[u64; 7]>,
}

/// Figures as `nvidia-smi` / `nvidia-smi mig -lgip` print them (GiB x 1024 where only GiB
/// is published). H200: measured on a real one (driver 580.159.04): NVML's total 143,771
/// MiB and each profile's `memorySizeMB`.
pub const MODELS: [ModelSpec; 9] = [
    ModelSpec {
        key: "H100-80GB",
        nvml_name: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        profile_mib: Some([9984, 9984, 20096, 20096, 40448, 40448, 81152]),
    },
    ModelSpec {
        key: "H100-94GB",
        nvml_name: "NVIDIA H100 NVL",
        memory_mib: 95830,
        profile_mib: Some([11008, 11008, 22144, 22144, 47488, 47488, 95360]),
    },
    ModelSpec {
        key: "H200-141GB",
        nvml_name: "NVIDIA H200",
        memory_mib: 143771,
        profile_mib: Some([16384, 16384, 33280, 33280, 71424, 71424, 143360]),
    },
    ModelSpec {
        key: "A100-40GB",
        nvml_name: "NVIDIA A100-SXM4-40GB",
        memory_mib: 40960,
        profile_mib: Some([4864, 4864, 9984, 9984, 20096, 20096, 40448]),
    },
    ModelSpec {
        key: "A100-80GB",
        nvml_name: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        profile_mib: Some([9984, 9984, 20096, 20096, 40448, 40448, 81152]),
    },
    ModelSpec {
        key: "B200",
        nvml_name: "NVIDIA B200",
        memory_mib: 183359,
        profile_mib: Some([22400, 22400, 45184, 45184, 91008, 91008, 182528]),
    },
    ModelSpec {
        key: "GH200",
        nvml_name: "NVIDIA GH200 480GB",
        memory_mib: 97871,
        profile_mib: Some([12032, 12032, 24064, 24064, 48512, 48512, 97408]),
    },
    ModelSpec {
        key: "GH200-144GB",
        nvml_name: "NVIDIA GH200 144G HBM3e",
        memory_mib: 146831,
        profile_mib: Some([18048, 18048, 36096, 36096, 72704, 72704, 145920]),
    },
    ModelSpec {
        key: "L40S",
        nvml_name: "NVIDIA L40S",
        memory_mib: 46068,
        profile_mib: None,
    },
];

/// One GPU-instance profile as `nvmlDeviceGetGpuInstanceProfileInfo` reports it.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The NVML_GPU_INSTANCE_PROFILE_* index it answers to.
    pub index: u32,
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub placement_size: u32,
    pub starts: Vec<u32>,
    pub memory_mib: u64,
}

/// (profile index, id, compute slices, max instances, placement size, starts): the MIG
/// user guide's geometry of A100/H100/H200/B200/GH200. Index 7 is 1_SLICE_REV1 (+me),
/// index 9 is 1_SLICE_REV2 (1g with twice the memory).
/// (profile index, id, compute slices, max instances, placement size, starts).
type ProfileRow = (u32, u32, u32, u32, u32, &'static [u32]);

const PROFILES: [ProfileRow; 7] = [
    (0, 19, 1, 7, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (7, 20, 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (9, 15, 1, 4, 2, &[0, 2, 4, 6]),
    (1, 14, 2, 3, 2, &[0, 2, 4]),
    (2, 9, 3, 2, 4, &[0, 4]),
    (3, 5, 4, 1, 4, &[0]),
    (4, 0, 7, 1, 8, &[0]),
];

/// NVML_GPU_INSTANCE_PROFILE_COUNT of the header this fake follows (0x12): profile
/// indices from here on answer INVALID_ARGUMENT, which ends forward-compatible enumeration.
pub const GPU_INSTANCE_PROFILE_COUNT: u32 = 0x12;
/// NVML_COMPUTE_INSTANCE_PROFILE_COUNT (0x9, with 7_SLICE_NVL at 0x8).
pub const COMPUTE_INSTANCE_PROFILE_COUNT: u32 = 0x9;
pub const COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL: u32 = 0x8;

/// Compute slices of a compute-instance profile index, where the fake supports it.
pub fn ci_profile_slices(index: u32) -> Option<u32> {
    match index {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        3 => Some(4),
        4 | COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL => Some(7),
        _ => None,
    }
}

#[derive(Debug, Clone)]
pub struct Ci {
    pub id: u32,
    pub profile: u32,
    pub slices: u32,
}

#[derive(Debug, Clone)]
pub struct Gi {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub slices: u32,
    pub cis: Vec<Ci>,
    pub busy: bool,
}

#[derive(Debug, Clone)]
pub struct Gpu {
    pub uuid: String,
    pub mig_current: bool,
    pub mig_pending: bool,
    /// Bumped when a MIG mode change activates: handles taken before answer
    /// INVALID_ARGUMENT (stricter than real NVML, which only says the device's attributes
    /// may change and must be queried again).
    pub generation: u32,
    pub access: Access,
    pub busy: bool,
    pub activation: Activation,
    pub gis: Vec<Gi>,
    pub remapped: crate::scenario::RemappedRows,
    pub retired_pages_pending: bool,
    pub ecc_uncorrected: u64,
    pub persistence: bool,
    pub temperature: u32,
    pub power_mw: u32,
    pub throttle: u64,
    pub ecc_corrected: u64,
    /// (generation, width) now; the maximum is [`PCIE_MAX`].
    pub pcie: (u32, u32),
    /// XIDs not yet delivered to an event set.
    pub xids: Vec<u64>,
    pub nvlink_down: Vec<u32>,
}

/// The PCIe link every fake GPU could run: Gen5 x16.
pub const PCIE_MAX: (u32, u32) = (5, 16);
/// NVLink links of every fake GPU except the L40S (none).
pub const NVLINKS: u32 = 18;

pub struct Host {
    pub model: &'static ModelSpec,
    pub driver_version: String,
    pub cuda_version: i32,
    pub privileged: bool,
    /// By NVML index.
    pub gpus: Vec<Gpu>,
    pub profiles: Vec<Profile>,
    pub faults: Vec<crate::scenario::Fault>,
    pub calls: HashMap<&'static str, u32>,
    /// Event sets by id - 1: the GPUs registered for critical XIDs on each (None: freed).
    pub event_sets: Vec<Option<Vec<usize>>>,
}

fn uuid(seed: u32, physical: u32) -> String {
    format!(
        "GPU-{:08x}-{seed:04x}-4000-8000-{:012x}",
        0xfa4e_0000u32 + physical,
        physical
    )
}

pub fn mig_uuid(gpu_uuid: &str, gi: u32, ci: u32) -> String {
    let tail = &gpu_uuid[gpu_uuid.len() - 8..];
    format!("MIG-{tail}-{gi:04x}-4{ci:03x}-8000-{:012x}", gi * 16 + ci)
}

impl Host {
    pub fn new(s: &Scenario) -> Result<Host, String> {
        let model = MODELS.iter().find(|m| m.key == s.model).ok_or_else(|| {
            let known: Vec<&str> = MODELS.iter().map(|m| m.key).collect();
            format!(
                "fake-nvml: unknown model {} (known: {})",
                s.model,
                known.join(", ")
            )
        })?;
        let mut profiles: Vec<Profile> = match model.profile_mib {
            None => Vec::new(),
            Some(mib) => PROFILES
                .iter()
                .zip(mib)
                .map(
                    |(&(index, id, slices, max, size, starts), memory_mib)| Profile {
                        index,
                        id,
                        slice_count: slices,
                        instance_count: max,
                        placement_size: size,
                        starts: starts.to_vec(),
                        memory_mib,
                    },
                )
                .collect(),
        };
        for patch in &s.profile_patch {
            let p = profiles
                .iter_mut()
                .find(|p| p.id == patch.id)
                .ok_or_else(|| format!("fake-nvml: profile_patch: no profile id {}", patch.id))?;
            if let Some(v) = patch.slice_count {
                p.slice_count = v;
            }
            if let Some(v) = patch.instance_count {
                p.instance_count = v;
            }
            if let Some(v) = patch.placement_size {
                p.placement_size = v;
            }
            if let Some(v) = &patch.starts {
                p.starts = v.clone();
            }
        }
        let order: Vec<u32> = if s.index_order.is_empty() {
            (0..s.count).collect()
        } else {
            let mut sorted = s.index_order.clone();
            sorted.sort_unstable();
            if sorted != (0..s.count).collect::<Vec<_>>() {
                return Err(format!(
                    "fake-nvml: index_order {:?} is not a permutation of 0..{}",
                    s.index_order, s.count
                ));
            }
            s.index_order.clone()
        };
        let mut host = Host {
            model,
            driver_version: s.driver_version.clone(),
            cuda_version: s.cuda_version,
            privileged: s.privileged,
            gpus: Vec::new(),
            profiles,
            faults: s.fault.clone(),
            calls: HashMap::new(),
            event_sets: Vec::new(),
        };
        for physical in order {
            let spec = s.gpu.iter().find(|g| g.index == physical);
            let dflt = crate::scenario::GpuSpec::default();
            let spec = spec.unwrap_or(&dflt);
            let mig = spec.mig.unwrap_or(s.mig) && model.profile_mib.is_some();
            let mut gpu = Gpu {
                uuid: uuid(s.uuid_seed, physical),
                mig_current: mig,
                mig_pending: spec.mig_pending.unwrap_or(mig),
                generation: 0,
                access: spec.access,
                busy: spec.busy,
                activation: spec.mig_activation,
                gis: Vec::new(),
                remapped: spec.remapped_rows.unwrap_or_default(),
                retired_pages_pending: spec.retired_pages_pending,
                ecc_uncorrected: spec.ecc_uncorrected,
                persistence: spec.persistence.unwrap_or(true),
                temperature: spec.temperature.unwrap_or(35),
                power_mw: spec.power_mw.unwrap_or(70_000),
                throttle: spec.throttle,
                ecc_corrected: spec.ecc_corrected,
                pcie: spec.pcie.map_or(PCIE_MAX, |p| (p.gen, p.width)),
                xids: spec.xids.clone(),
                nvlink_down: spec.nvlink_down.clone(),
            };
            for inst in &spec.instances {
                let profile = host
                    .profiles
                    .iter()
                    .find(|p| p.id == inst.profile)
                    .cloned()
                    .ok_or_else(|| {
                        format!("fake-nvml: gpu {physical}: no profile {}", inst.profile)
                    })?;
                let gi = create_gi(&mut gpu, &profile, inst.start).map_err(|code| {
                    format!(
                        "fake-nvml: gpu {physical}: instance {}@{}: NVML error {code}",
                        inst.profile, inst.start
                    )
                })?;
                let ci_profile = match inst.compute {
                    Compute::None => None,
                    Compute::Full => Some(full_ci_profile(profile.slice_count)),
                    Compute::Nvl => Some(COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL),
                };
                if let Some(ci) = ci_profile {
                    create_ci(&mut gpu, gi, ci).map_err(|code| {
                        format!("fake-nvml: gpu {physical}: compute instance: NVML error {code}")
                    })?;
                }
                if spec.busy_instances.contains(&inst.start) {
                    if let Some(g) = gpu.gis.iter_mut().find(|g| g.id == gi) {
                        g.busy = true;
                    }
                }
            }
            host.gpus.push(gpu);
        }
        Ok(host)
    }

    /// Counts the call; the injected return code when a fault is due.
    pub fn fault(&mut self, function: &'static str) -> R<()> {
        let n = self.calls.entry(function).or_insert(0);
        *n += 1;
        let n = *n;
        match self
            .faults
            .iter()
            .find(|f| f.function == function && f.call == n)
        {
            Some(f) => Err(f.code),
            None => Ok(()),
        }
    }

    pub fn profile_by_id(&self, id: u32) -> R<&Profile> {
        self.profiles
            .iter()
            .find(|p| p.id == id)
            .ok_or(ERROR_INVALID_ARGUMENT)
    }

    pub fn privileged(&self) -> R<()> {
        if self.privileged {
            Ok(())
        } else {
            Err(ERROR_NO_PERMISSION)
        }
    }

    pub fn mig_capable(&self) -> R<()> {
        if self.model.profile_mib.is_some() {
            Ok(())
        } else {
            Err(ERROR_NOT_SUPPORTED)
        }
    }
}

/// The compute-instance profile index that spans a whole GPU instance of `slices`.
pub fn full_ci_profile(slices: u32) -> u32 {
    match slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        _ => 4,
    }
}

/// Creates a GPU instance after NVML's checks (placement valid for the profile:
/// INVALID_ARGUMENT; overlap, count or compute slices exhausted: INSUFFICIENT_RESOURCES).
pub fn create_gi(gpu: &mut Gpu, profile: &Profile, start: u32) -> R<u32> {
    if !profile.starts.contains(&start) {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let end = start + profile.placement_size;
    if end > 8 {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let overlaps = gpu
        .gis
        .iter()
        .any(|g| start < g.start + g.size && g.start < end);
    let same = gpu
        .gis
        .iter()
        .filter(|g| g.profile_id == profile.id)
        .count() as u32;
    let used: u32 = gpu.gis.iter().map(|g| g.slices).sum();
    if overlaps || same >= profile.instance_count || used + profile.slice_count > 7 {
        return Err(ERROR_INSUFFICIENT_RESOURCES);
    }
    let id = (1..)
        .find(|id| !gpu.gis.iter().any(|g| g.id == *id))
        .unwrap_or(1);
    gpu.gis.push(Gi {
        id,
        profile_id: profile.id,
        start,
        size: profile.placement_size,
        slices: profile.slice_count,
        cis: Vec::new(),
        busy: false,
    });
    Ok(id)
}

/// Creates a compute instance of profile index `ci_profile` in GPU instance `gi`.
pub fn create_ci(gpu: &mut Gpu, gi: u32, ci_profile: u32) -> R<u32> {
    let g = gpu
        .gis
        .iter_mut()
        .find(|g| g.id == gi)
        .ok_or(ERROR_INVALID_ARGUMENT)?;
    let slices = ci_supported(g, ci_profile)?;
    let used: u32 = g.cis.iter().map(|c| c.slices).sum();
    if used + slices > g.slices {
        return Err(ERROR_INSUFFICIENT_RESOURCES);
    }
    let id = (0..)
        .find(|id| !g.cis.iter().any(|c| c.id == *id))
        .unwrap_or(0);
    g.cis.push(Ci {
        id,
        profile: ci_profile,
        slices,
    });
    Ok(id)
}

/// Slices of compute-instance profile `index` inside `gi`; NOT_SUPPORTED when it does
/// not fit, INVALID_ARGUMENT past the profile count.
pub fn ci_supported(gi: &Gi, index: u32) -> R<u32> {
    if index >= COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let slices = ci_profile_slices(index).ok_or(ERROR_NOT_SUPPORTED)?;
    if slices > gi.slices || (slices == 7 && gi.slices != 7) {
        return Err(ERROR_NOT_SUPPORTED);
    }
    Ok(slices)
}
