//! Pure decoding of raw NVML values, kept apart from the FFI so it can be unit-tested
//! on machines without a GPU.

use crate::catalog::{GpuModel, MigProfile};

/// The fields of `nvmlGpuInstanceProfileInfo_t` the fleet uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawProfileInfo {
    /// Profile id as `nvidia-smi mig -lgip` prints it (what create calls take).
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_size_mb: u64,
}

/// `nvmlGpuInstancePlacement_t`: a run of memory slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPlacement {
    pub start: u32,
    pub size: u32,
}

/// NVML's CUDA driver version integer (e.g. 12040) as "12.4".
pub fn decode_cuda_version(raw: i32) -> String {
    let major = raw / 1000;
    let minor = (raw % 1000) / 10;
    format!("{major}.{minor}")
}

/// Checks a raw placement against the 8-slice geometry: `(start, size)`.
pub fn decode_placement(raw: RawPlacement) -> Result<(u8, u8), String> {
    if raw.size == 0 || raw.start + raw.size > crate::mig::MEMORY_SLICES as u32 {
        return Err(format!(
            "placement {}:{} lies outside memory slices 0-7",
            raw.start, raw.size
        ));
    }
    Ok((raw.start as u8, raw.size as u8))
}

/// Turns NVML's profile info plus its possible placements into a catalog-shaped profile.
/// The name comes from the catalog model when it knows the id; otherwise it is built
/// from the slice count and memory ("3g.40gb"), as nvidia-smi does.
pub fn decode_profile_info(
    model: Option<&GpuModel>,
    raw: RawProfileInfo,
    placements: &[RawPlacement],
) -> Result<MigProfile, String> {
    let decoded: Vec<(u8, u8)> = placements
        .iter()
        .map(|p| decode_placement(*p))
        .collect::<Result<_, _>>()?;
    let size = decoded
        .first()
        .map(|&(_, s)| s)
        .ok_or_else(|| format!("profile {}: NVML reported no possible placements", raw.id))?;
    if decoded.iter().any(|&(_, s)| s != size) {
        return Err(format!(
            "profile {}: placements of different sizes {:?}",
            raw.id, decoded
        ));
    }
    let name = model
        .and_then(|m| m.profile_by_id(raw.id))
        .map(|p| p.name.clone())
        .unwrap_or_else(|| {
            let gb = (raw.memory_size_mb as f64 / 1024.0).ceil() as u64;
            format!("{}g.{}gb", raw.slice_count, gb)
        });
    Ok(MigProfile {
        id: raw.id,
        name,
        compute_slices: raw.slice_count as u8,
        memory_slices: size,
        valid_starts: decoded.iter().map(|&(s, _)| s).collect(),
        max_per_gpu: raw.instance_count as u8,
        memory_mib: raw.memory_size_mb,
    })
}

/// Checks NVML's GPU-instance profile table of a GPU against the catalog model's: every
/// catalog profile must be there with the same compute slices, placement size, valid
/// starts and maximum count (memory figures may differ; profiles the catalog lacks, as
/// newer drivers add, are ignored). The error names the differences and prints both
/// tables.
pub fn compare_profile_tables(model: &GpuModel, nvml: &[MigProfile]) -> Result<(), String> {
    let shape = |p: &MigProfile| {
        (
            p.compute_slices,
            p.memory_slices,
            p.valid_starts.clone(),
            p.max_per_gpu,
        )
    };
    let mut differences = Vec::new();
    for c in &model.profiles {
        match nvml.iter().find(|p| p.id == c.id) {
            None => differences.push(format!("profile {} ({}) is missing", c.id, c.name)),
            Some(p) if shape(p) != shape(c) => {
                differences.push(format!("profile {} ({}) differs", c.id, c.name))
            }
            Some(_) => {}
        }
    }
    if differences.is_empty() {
        return Ok(());
    }
    let table = |ps: &[&MigProfile]| {
        ps.iter()
            .map(|p| {
                format!(
                    "    {:>3}  {:<12} {} compute, {} memory slice(s), starts {:?}, max {}",
                    p.id, p.name, p.compute_slices, p.memory_slices, p.valid_starts, p.max_per_gpu
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut ours: Vec<&MigProfile> = model.profiles.iter().collect();
    let mut theirs: Vec<&MigProfile> = nvml.iter().collect();
    ours.sort_by_key(|p| p.id);
    theirs.sort_by_key(|p| p.id);
    Err(format!(
        "NVML's MIG profile table differs from the catalog's {} ({}):\n  catalog:\n{}\n  NVML:\n{}",
        model.name,
        differences.join("; "),
        table(&ours),
        table(&theirs)
    ))
}

/// Reads a NUL-terminated C char buffer (e.g. a v2 profile name "MIG 1g.10gb").
pub fn decode_c_string(buf: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// NVML clock-throttle reason bits that point at a hardware or cooling problem.
const THROTTLE_FINDINGS: [(u64, &str); 4] = [
    (
        0x8,
        "hardware slowdown (HW_SLOWDOWN): check power supply and cooling",
    ),
    (
        0x20,
        "software thermal slowdown: the GPU runs hotter than its target",
    ),
    (0x40, "hardware thermal slowdown: the GPU is overheating"),
    (
        0x80,
        "power brake slowdown: the system asserted the external power brake",
    ),
];

/// Findings for the throttle-reason bit mask (`nvmlDeviceGetCurrentClocksThrottleReasons`).
/// Idle, application clocks and the software power cap are normal and ignored.
pub fn throttle_findings(reasons: u64) -> Vec<String> {
    THROTTLE_FINDINGS
        .iter()
        .filter(|(bit, _)| reasons & bit != 0)
        .map(|(_, words)| format!("clocks throttled: {words}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    #[test]
    fn cuda_versions() {
        assert_eq!(decode_cuda_version(12040), "12.4");
        assert_eq!(decode_cuda_version(12080), "12.8");
        assert_eq!(decode_cuda_version(11080), "11.8");
        assert_eq!(decode_cuda_version(13000), "13.0");
        assert_eq!(decode_cuda_version(12020), "12.2");
    }

    #[test]
    fn placements() {
        assert_eq!(
            decode_placement(RawPlacement { start: 4, size: 4 }),
            Ok((4, 4))
        );
        assert!(decode_placement(RawPlacement { start: 6, size: 4 }).is_err());
        assert!(decode_placement(RawPlacement { start: 0, size: 0 }).is_err());
    }

    #[test]
    fn profile_info_with_catalog_name() {
        let m = catalog::model("H100-80GB").unwrap();
        let raw = RawProfileInfo {
            id: 9,
            slice_count: 3,
            instance_count: 2,
            memory_size_mb: 40320,
        };
        let places = [
            RawPlacement { start: 0, size: 4 },
            RawPlacement { start: 4, size: 4 },
        ];
        let p = decode_profile_info(Some(m), raw, &places).unwrap();
        assert_eq!(p.name, "3g.40gb");
        assert_eq!(
            (p.compute_slices, p.memory_slices, p.max_per_gpu),
            (3, 4, 2)
        );
        assert_eq!(p.valid_starts, vec![0, 4]);
        // NVML's memory figure wins over the catalog's.
        assert_eq!(p.memory_mib, 40320);
        // The catalog agrees on the geometry.
        let c = m.profile("3g.40gb").unwrap();
        assert_eq!(
            (c.valid_starts.clone(), c.memory_slices),
            (p.valid_starts.clone(), p.memory_slices)
        );
    }

    #[test]
    fn profile_info_without_catalog_gets_a_built_name() {
        let raw = RawProfileInfo {
            id: 14,
            slice_count: 2,
            instance_count: 3,
            memory_size_mb: 23552,
        };
        let places = [0, 2, 4].map(|s| RawPlacement { start: s, size: 2 });
        let p = decode_profile_info(None, raw, &places).unwrap();
        assert_eq!(p.name, "2g.23gb");
        assert!(decode_profile_info(None, raw, &[]).is_err());
        let mixed = [
            RawPlacement { start: 0, size: 2 },
            RawPlacement { start: 4, size: 4 },
        ];
        assert!(decode_profile_info(None, raw, &mixed).is_err());
    }

    #[test]
    fn profile_tables_compare_by_geometry() {
        let m = catalog::model("H100-80GB").unwrap();
        let mut nvml = m.profiles.clone();
        // Memory figures differ between drivers: not a mismatch.
        nvml[0].memory_mib += 128;
        // A profile the catalog does not know (a newer driver's) is ignored.
        nvml.push(MigProfile {
            id: 31,
            name: "1g.10gb+gfx".into(),
            compute_slices: 1,
            memory_slices: 1,
            valid_starts: vec![0],
            max_per_gpu: 1,
            memory_mib: 9984,
        });
        assert_eq!(compare_profile_tables(m, &nvml), Ok(()));
        // go-nvml's mock H100 gives 3g a placement size of 3.
        let three = nvml.iter_mut().find(|p| p.id == 9).unwrap();
        three.memory_slices = 3;
        let err = compare_profile_tables(m, &nvml).unwrap_err();
        assert!(err.contains("profile 9 (3g.40gb) differs"), "{err}");
        assert!(err.contains("catalog:") && err.contains("NVML:"), "{err}");
        assert!(
            err.contains("3 compute, 4 memory slice(s), starts [0, 4], max 2"),
            "{err}"
        );
        assert!(
            err.contains("3 compute, 3 memory slice(s), starts [0, 4], max 2"),
            "{err}"
        );
        nvml.retain(|p| p.id != 0);
        let err = compare_profile_tables(m, &nvml).unwrap_err();
        assert!(err.contains("profile 0 (7g.80gb) is missing"), "{err}");
    }

    #[test]
    fn c_strings() {
        let mut buf = [0 as std::os::raw::c_char; 16];
        for (i, b) in b"MIG 1g.10gb".iter().enumerate() {
            buf[i] = *b as std::os::raw::c_char;
        }
        assert_eq!(decode_c_string(&buf), "MIG 1g.10gb");
    }

    #[test]
    fn throttle_bits() {
        assert!(throttle_findings(0x1 | 0x4).is_empty());
        let f = throttle_findings(0x40 | 0x8);
        assert_eq!(f.len(), 2);
        assert!(f[0].contains("HW_SLOWDOWN"));
        assert!(f[1].contains("overheating"));
    }
}
