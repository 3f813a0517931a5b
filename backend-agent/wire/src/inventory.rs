//! A node's inventory on the wire (`NodeInventory`, `Gpu`, `MigPlacement`) and in the
//! hardware crate's types (`GpuInfo`, `Placement`): the conversions both ends of the node
//! agent protocol use, and the catalog model a host's GPUs make it.

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, GpuInfo, HwError, MigInstance};
use gpufleet_gpu::mig::Placement;
use gpufleet_proto::v1;

pub fn gpu_message(g: &GpuInfo) -> v1::Gpu {
    v1::Gpu {
        index: g.index as i32,
        uuid: g.uuid.clone(),
        model: g.model.clone(),
        memory_mib: g.memory_mib as i64,
        mig_enabled: g.mig_enabled,
        mig_devices: g
            .instances
            .iter()
            .map(|i| v1::MigDevice {
                profile: i.profile.clone(),
                profile_id: i.profile_id as i32,
                start: i.start as i32,
                size: i.size as i32,
                memory_mib: i.memory_mib as i64,
                uuid: i.uuid.clone(),
            })
            .collect(),
    }
}

/// A GPU from the wire, with every number checked against its type's range.
pub fn gpu_info(g: &v1::Gpu) -> Result<GpuInfo, String> {
    let small = |field: &str, v: i32| -> Result<u8, String> {
        u8::try_from(v).map_err(|_| format!("gpus[{}].{field}: out of range ({v})", g.index))
    };
    let unsigned = |field: &str, v: i64| -> Result<u64, String> {
        u64::try_from(v)
            .map_err(|_| format!("gpus[{}].{field}: must not be negative ({v})", g.index))
    };
    let mut instances = Vec::with_capacity(g.mig_devices.len());
    for d in &g.mig_devices {
        instances.push(MigInstance {
            profile_id: u32::try_from(d.profile_id)
                .map_err(|_| format!("gpus[{}].profile_id: out of range", g.index))?,
            profile: d.profile.clone(),
            start: small("start", d.start)?,
            size: small("size", d.size)?,
            memory_mib: unsigned("memory_mib", d.memory_mib)?,
            uuid: d.uuid.clone(),
        });
    }
    Ok(GpuInfo {
        index: u32::try_from(g.index).map_err(|_| format!("gpus: bad index {}", g.index))?,
        uuid: g.uuid.clone(),
        model: g.model.clone(),
        memory_mib: unsigned("memory_mib", g.memory_mib)?,
        mig_enabled: g.mig_enabled,
        instances,
    })
}

/// What the backend reports now: model, versions and every GPU.
pub fn read(backend: &dyn GpuBackend, gpu_type: &str) -> Result<v1::NodeInventory, HwError> {
    Ok(v1::NodeInventory {
        gpu_type: gpu_type.to_string(),
        driver_version: backend.driver_version()?,
        cuda_version: backend.cuda_version()?,
        gpus: backend.gpus()?.iter().map(gpu_message).collect(),
    })
}

pub fn placement_message(p: &Placement) -> v1::MigPlacement {
    v1::MigPlacement {
        profile: p.profile.clone(),
        profile_id: p.profile_id as i32,
        start: p.start as i32,
        size: p.size as i32,
    }
}

pub fn placement(p: &v1::MigPlacement) -> Result<Placement, String> {
    let bad = |f: &str| format!("placements.{f}: out of range");
    Ok(Placement {
        profile: p.profile.clone(),
        profile_id: u32::try_from(p.profile_id).map_err(|_| bad("profile_id"))?,
        start: u8::try_from(p.start).map_err(|_| bad("start"))?,
        size: u8::try_from(p.size).map_err(|_| bad("size"))?,
    })
}

/// A GPU's instances as placements in creation order (larger first), to restore it.
pub fn placements_of(info: &GpuInfo) -> Vec<Placement> {
    let mut p: Vec<Placement> = info
        .instances
        .iter()
        .map(|i| Placement {
            profile: i.profile.clone(),
            profile_id: i.profile_id,
            start: i.start,
            size: i.size,
        })
        .collect();
    p.sort_by_key(|p| (std::cmp::Reverse(p.size), p.start));
    p
}

/// Whether a GPU is exactly at `target` (None: whole GPU, MIG off).
pub fn gpu_matches(gpu: &GpuInfo, target: Option<&[Placement]>) -> bool {
    match target {
        None => !gpu.mig_enabled && gpu.instances.is_empty(),
        Some(wanted) => {
            let mut have: Vec<(u32, u8)> = gpu
                .instances
                .iter()
                .map(|i| (i.profile_id, i.start))
                .collect();
            let mut want: Vec<(u32, u8)> = wanted.iter().map(|p| (p.profile_id, p.start)).collect();
            have.sort_unstable();
            want.sort_unstable();
            gpu.mig_enabled && have == want
        }
    }
}

/// The catalog model of the host's GPUs: every GPU must map to the same one.
pub fn host_model(gpus: &[GpuInfo]) -> anyhow::Result<&'static gpufleet_gpu::catalog::GpuModel> {
    let Some(first) = gpus.first() else {
        anyhow::bail!("--hardware nvml: this host reports no GPUs");
    };
    let mut model: Option<&'static gpufleet_gpu::catalog::GpuModel> = None;
    for g in gpus {
        // NvmlBackend already reports catalog names where it can; otherwise NVML's name.
        let m = gpufleet_gpu::catalog::model(&g.model)
            .or_else(|| gpufleet_gpu::catalog::model_for_nvml(&g.model, g.memory_mib))
            .with_context(|| {
                format!(
                    "--hardware nvml: GPU {} is \"{}\" ({} MiB), which is not a catalog model (known: {})",
                    g.index,
                    g.model,
                    g.memory_mib,
                    gpufleet_gpu::catalog::model_names().join(", ")
                )
            })?;
        match model {
            Some(seen) if seen.name != m.name => anyhow::bail!(
                "--hardware nvml: GPU {} is {} but GPU {} is {}: a node holds one GPU model",
                g.index,
                m.name,
                first.index,
                seen.name
            ),
            _ => model = Some(m),
        }
    }
    Ok(model.expect("at least one GPU"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_round_trips_through_the_wire() {
        let g = GpuInfo {
            index: 3,
            uuid: "GPU-x".into(),
            model: "H100-80GB".into(),
            memory_mib: 81559,
            mig_enabled: true,
            instances: vec![MigInstance {
                profile_id: 9,
                profile: "3g.40gb".into(),
                start: 4,
                size: 4,
                memory_mib: 40448,
                uuid: "MIG-y".into(),
            }],
        };
        assert_eq!(gpu_info(&gpu_message(&g)).unwrap(), g);
        let mut bad = gpu_message(&g);
        bad.mig_devices[0].start = 300;
        assert!(gpu_info(&bad).unwrap_err().contains("start"));
    }

    #[test]
    fn matching_compares_placements_not_order() {
        let g = GpuInfo {
            index: 0,
            uuid: "GPU-x".into(),
            model: "H100-80GB".into(),
            memory_mib: 81559,
            mig_enabled: false,
            instances: vec![],
        };
        assert!(gpu_matches(&g, None));
        assert!(!gpu_matches(&g, Some(&[])));
    }
}
