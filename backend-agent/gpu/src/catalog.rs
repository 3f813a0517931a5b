//! GPU models and their MIG profiles.
//!
//! Geometry (7 compute slices, 8 memory slices, placements, max counts) is the same on
//! every MIG-capable model here; names and memory sizes differ per model. Memory figures
//! are what `nvidia-smi mig -lgip` reports where the reference gives one; elsewhere they
//! are derived (see `MODELS`). On real hardware NVML's figure wins. One model (L40S) has
//! no MIG: it has no profiles and only whole GPUs. Every model says where its memory
//! figures come from ([`GpuModel::memory_source`]: measured on the GPU, documented by
//! NVIDIA, or estimated).

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// One MIG GPU-instance profile of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// Profile id as `nvidia-smi mig -lgip` prints it: 19, 20, 15, 14, 9, 5, 0.
    pub id: u32,
    /// Per-model name, e.g. "1g.10gb", "1g.10gb+me", "3g.40gb".
    pub name: String,
    pub compute_slices: u8,
    /// Placement size in memory slices.
    pub memory_slices: u8,
    /// Memory slices where an instance of this profile may start.
    pub valid_starts: Vec<u8>,
    pub max_per_gpu: u8,
    pub memory_mib: u64,
}

/// A GPU model the fleet knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuModel {
    /// "A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB", "B200", "GH200",
    /// "L40S".
    pub name: String,
    /// Architecture family: "Ampere", "Ada Lovelace", "Hopper" or "Blackwell".
    pub architecture: String,
    pub memory_mib: u64,
    pub mig_capable: bool,
    /// Minimum Linux driver for the architecture (e.g. Hopper "520.61.05").
    pub min_driver: String,
    /// MIG profiles, largest last in id order of the table; empty when `!mig_capable`.
    pub profiles: Vec<MigProfile>,
    /// Where `memory_mib` and the profiles' memory come from.
    #[serde(default)]
    pub memory_source: Source,
}

/// Where a catalog figure comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Read from a real GPU of the model (NVML, `nvidia-smi`, a benchmark run on it).
    Measured,
    /// Published by NVIDIA (data sheet, MIG user guide, `nvidia-smi` captures in its docs).
    Documented,
    /// Derived from other figures (scaled from a sibling model, or a documented peak times
    /// a measured efficiency): a guess until someone measures it.
    #[default]
    Estimated,
}

impl Source {
    /// "measured", "documented" or "estimated".
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Measured => "measured",
            Source::Documented => "documented",
            Source::Estimated => "estimated",
        }
    }
}

impl GpuModel {
    /// The profile with this exact name on this model.
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The profile with this NVML profile id on this model.
    pub fn profile_by_id(&self, id: u32) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// Profile names in catalog order (smallest first), for error messages.
    pub fn profile_names(&self) -> Vec<&str> {
        self.profiles.iter().map(|p| p.name.as_str()).collect()
    }
}

/// Shape of one profile: (id, compute slices, memory slices, valid starts, max per GPU).
/// Identical on every MIG-capable model (confirmed on A100-40GB, H100-80GB, H100 NVL).
const GEOMETRY: [(u32, u8, u8, &[u8], u8); 7] = [
    (19, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 7),
    (20, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 1),
    (15, 1, 2, &[0, 2, 4, 6], 4),
    (14, 2, 2, &[0, 2, 4], 3),
    (9, 3, 4, &[0, 4], 2),
    (5, 4, 4, &[0], 1),
    (0, 7, 8, &[0], 1),
];

/// One catalog entry: the model's name, architecture and memory, and its MIG profiles
/// (names and memory in GEOMETRY order) when it has MIG.
struct ModelSpec {
    name: &'static str,
    architecture: &'static str,
    memory_mib: u64,
    mig: Option<MigSpec>,
    memory_source: Source,
}

/// A MIG-capable model's profile names and memory per profile (MiB), in GEOMETRY order.
struct MigSpec {
    names: [&'static str; 7],
    memory_mib: [u64; 7],
}

/// Memory per profile, in MiB (GiB x 1024; the reference prints two decimals, so 19.62
/// is 19.625 GiB = 20096 MiB):
/// - H200-141GB: **measured** on a real H200 (driver 580.159.04): NVML's `memorySizeMB`
///   per profile (16,384 / 33,280 / 71,424 / 143,360; `nvidia-smi mig -lgip` prints
///   16.00, 32.50, 69.75 and 140.00 GiB) and NVML's total, 143,771 MiB. An earlier table
///   gave 33,024 and 71,168 (32.25 and 69.50 GiB): wrong, pinned by a test.
/// - A100-40GB, H100-80GB, H100-94GB: **documented**, from NVIDIA's `-lgip` captures in
///   the MIG user guide; the totals are GiB x 1024 (NVML reports a little less or more).
/// - A100-80GB: **estimated**: no figures given; taken equal to H100-80GB (same 80 GB and
///   slice count).
/// - B200 (180 GB) and GH200 (96 GB): **estimated**: H100-80GB figures scaled by 180/80
///   and 96/80 and rounded down to 1/8 GiB.
///
/// The +me profile has the memory of the plain 1g profile. L40S (Ada Lovelace) has no
/// MIG; its memory is what NVML reports for its 48 GB (documented).
const MODELS: [ModelSpec; 8] = [
    ModelSpec {
        name: "A100-40GB",
        architecture: "Ampere",
        memory_mib: 40 * 1024,
        mig: Some(MigSpec {
            names: [
                "1g.5gb",
                "1g.5gb+me",
                "1g.10gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb",
            ],
            memory_mib: [4864, 4864, 9984, 9984, 20096, 20096, 40448],
        }),
        memory_source: Source::Documented,
    },
    ModelSpec {
        name: "A100-80GB",
        architecture: "Ampere",
        memory_mib: 80 * 1024,
        mig: Some(MigSpec {
            names: [
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
            ],
            memory_mib: [9984, 9984, 20096, 20096, 40448, 40448, 81152],
        }),
        memory_source: Source::Estimated,
    },
    ModelSpec {
        name: "H100-80GB",
        architecture: "Hopper",
        memory_mib: 80 * 1024,
        mig: Some(MigSpec {
            names: [
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
            ],
            memory_mib: [9984, 9984, 20096, 20096, 40448, 40448, 81152],
        }),
        memory_source: Source::Documented,
    },
    ModelSpec {
        name: "H100-94GB",
        architecture: "Hopper",
        memory_mib: 94 * 1024,
        mig: Some(MigSpec {
            names: [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb",
            ],
            memory_mib: [11008, 11008, 22144, 22144, 47488, 47488, 95360],
        }),
        memory_source: Source::Documented,
    },
    ModelSpec {
        name: "H200-141GB",
        architecture: "Hopper",
        memory_mib: 143_771,
        mig: Some(MigSpec {
            names: [
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb",
            ],
            memory_mib: [16384, 16384, 33280, 33280, 71424, 71424, 143360],
        }),
        memory_source: Source::Measured,
    },
    ModelSpec {
        name: "B200",
        architecture: "Blackwell",
        memory_mib: 180 * 1024,
        mig: Some(MigSpec {
            names: [
                "1g.23gb",
                "1g.23gb+me",
                "1g.45gb",
                "2g.45gb",
                "3g.90gb",
                "4g.90gb",
                "7g.180gb",
            ],
            memory_mib: [22400, 22400, 45184, 45184, 91008, 91008, 182528],
        }),
        memory_source: Source::Estimated,
    },
    ModelSpec {
        name: "GH200",
        architecture: "Hopper",
        memory_mib: 96 * 1024,
        mig: Some(MigSpec {
            names: [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.48gb",
                "4g.48gb",
                "7g.96gb",
            ],
            memory_mib: [12032, 12032, 24064, 24064, 48512, 48512, 97408],
        }),
        memory_source: Source::Estimated,
    },
    ModelSpec {
        name: "L40S",
        architecture: "Ada Lovelace",
        memory_mib: 46068,
        mig: None,
        memory_source: Source::Documented,
    },
];

/// Minimum driver per architecture: Ampere from CUDA 11.0 (11.0 GA needs 450.51.06; the
/// reference only says ">= 450"), Ada Lovelace and Hopper from CUDA 11.8 (520.61.05),
/// Blackwell from CUDA 12.8 (570.26).
pub fn min_driver_for(architecture: &str) -> Option<&'static str> {
    match architecture {
        "Ampere" => Some("450.51.06"),
        "Ada Lovelace" | "Hopper" => Some("520.61.05"),
        "Blackwell" => Some("570.26"),
        _ => None,
    }
}

/// Minimum Linux driver for MIG on a model, from NVIDIA's MIG user guide (supported GPUs):
/// A100 450.80.02, H100 525.85.12, H200 550.90.07. The guide names no separate floor for
/// H100 NVL (taken as H100's) and GH200 (taken as H100's, same Hopper MIG); B200 (and
/// GB200) need R570 570.133.20. `None` for models without MIG.
pub fn min_mig_driver(model: &str) -> Option<&'static str> {
    match model {
        "A100-40GB" | "A100-80GB" => Some("450.80.02"),
        "H100-80GB" | "H100-94GB" | "GH200" => Some("525.85.12"),
        "H200-141GB" => Some("550.90.07"),
        "B200" => Some("570.133.20"),
        _ => None,
    }
}

/// The driver (and its CUDA version) a simulated node, and a fleet file's node group,
/// runs when none is named.
pub const DEFAULT_DRIVER: &str = "550.54.15";
pub const DEFAULT_CUDA: &str = "12.4";

/// CUDA toolkit -> minimum Linux driver (NVIDIA's CUDA release notes), oldest first.
pub const CUDA_MIN_DRIVER: [(&str, &str); 12] = [
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
    ("13.1", "590.44.01"),
];

/// Compares dotted driver versions numerically ("570.124.06" > "570.26").
pub fn compare_driver_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parse = |v: &str| -> Vec<u64> {
        v.split('.')
            .map(|x| x.trim().parse().unwrap_or(0))
            .collect()
    };
    parse(a).cmp(&parse(b))
}

/// The newest CUDA version in [`CUDA_MIN_DRIVER`] that `driver` runs, if any.
pub fn newest_cuda_for_driver(driver: &str) -> Option<&'static str> {
    CUDA_MIN_DRIVER
        .iter()
        .rev()
        .find(|(_, min)| compare_driver_versions(driver, min) != std::cmp::Ordering::Less)
        .map(|(cuda, _)| *cuda)
}

fn build_models() -> Vec<GpuModel> {
    MODELS
        .iter()
        .map(|spec| GpuModel {
            name: spec.name.to_string(),
            architecture: spec.architecture.to_string(),
            memory_mib: spec.memory_mib,
            mig_capable: spec.mig.is_some(),
            min_driver: min_driver_for(spec.architecture)
                .unwrap_or_default()
                .to_string(),
            profiles: spec.mig.as_ref().map(mig_profiles).unwrap_or_default(),
            memory_source: spec.memory_source,
        })
        .collect()
}

fn mig_profiles(mig: &MigSpec) -> Vec<MigProfile> {
    GEOMETRY
        .iter()
        .zip(mig.names.iter().zip(mig.memory_mib.iter()))
        .map(
            |(&(id, compute, memory, starts, max), (name, mib))| MigProfile {
                id,
                name: name.to_string(),
                compute_slices: compute,
                memory_slices: memory,
                valid_starts: starts.to_vec(),
                max_per_gpu: max,
                memory_mib: *mib,
            },
        )
        .collect()
}

/// All known GPU models.
pub fn models() -> &'static [GpuModel] {
    static MODELS_CELL: OnceLock<Vec<GpuModel>> = OnceLock::new();
    MODELS_CELL.get_or_init(build_models)
}

/// The models that support MIG (every one but L40S), in catalog order.
pub fn mig_models() -> Vec<&'static GpuModel> {
    models().iter().filter(|m| m.mig_capable).collect()
}

/// The model with exactly this name.
pub fn model(name: &str) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.name == name)
}

/// Names of all known models, in catalog order.
pub fn model_names() -> Vec<&'static str> {
    models().iter().map(|m| m.name.as_str()).collect()
}

/// How far NVML's memory total may lie from a catalog model's (ECC and reserved memory
/// take a few percent): farther is another product (GH200 144GB is not the 96GB entry).
const MEMORY_TOLERANCE: f64 = 0.08;

/// The model whose NVML name (e.g. "NVIDIA H100 80GB HBM3") matches, judged by the
/// family and the memory size NVML reports. Used by the NVML backend. A GPU whose memory
/// is more than 8% away from every model of its family maps to none.
pub fn model_for_nvml(nvml_name: &str, memory_mib: u64) -> Option<&'static GpuModel> {
    let m = nearest_in_family(nvml_name, memory_mib as f64 / 1024.0)?;
    let catalog_gib = m.memory_mib as f64 / 1024.0;
    let gib = memory_mib as f64 / 1024.0;
    ((gib - catalog_gib).abs() <= catalog_gib * MEMORY_TOLERANCE).then_some(m)
}

/// The model for an NVML name when the memory total is unknown (NVML refuses it without
/// privileges on a MIG-enabled GPU): the size printed in the name ("80GB", "144G") when
/// there is one, else the family's only model.
pub fn model_for_nvml_name(nvml_name: &str) -> Option<&'static GpuModel> {
    let upper = nvml_name.to_ascii_uppercase();
    let size = upper
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|w| {
            let digits = w.strip_suffix("GB").or_else(|| w.strip_suffix('G'))?;
            digits.parse::<u64>().ok()
        })
        .find(|&gb| (16..=1024).contains(&gb));
    let family_models: Vec<&GpuModel> = family_candidates(&upper);
    // A size over twice every model's memory is not the GPU's ("GH200 480GB" names the
    // superchip's CPU and GPU memory together).
    let size = size.filter(|&gb| {
        family_models
            .iter()
            .any(|m| (gb * 1024) as f64 <= 2.0 * m.memory_mib as f64)
    });
    match size {
        Some(gb) => model_for_nvml(nvml_name, gb * 1024),
        None if family_models.len() == 1 => Some(family_models[0]),
        None => None,
    }
}

/// The catalog models of the longest family name in `upper` ("GH200" contains "H200").
fn family_candidates(upper: &str) -> Vec<&'static GpuModel> {
    let candidates: Vec<&GpuModel> = models()
        .iter()
        .filter(|m| {
            let family = m.name.split('-').next().unwrap_or(&m.name);
            upper.contains(family)
        })
        .collect();
    let Some(best) = candidates
        .iter()
        .map(|m| m.name.split('-').next().unwrap_or(&m.name).len())
        .max()
    else {
        return Vec::new();
    };
    candidates
        .into_iter()
        .filter(|m| m.name.split('-').next().unwrap_or(&m.name).len() == best)
        .collect()
}

fn nearest_in_family(nvml_name: &str, gib: f64) -> Option<&'static GpuModel> {
    family_candidates(&nvml_name.to_ascii_uppercase())
        .into_iter()
        .min_by(|a, b| {
            let da = (a.memory_mib as f64 / 1024.0 - gib).abs();
            let db = (b.memory_mib as f64 / 1024.0 - gib).abs();
            da.total_cmp(&db)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seven_mig_models_with_seven_profiles_each_and_one_without_mig() {
        assert_eq!(
            model_names(),
            vec![
                "A100-40GB",
                "A100-80GB",
                "H100-80GB",
                "H100-94GB",
                "H200-141GB",
                "B200",
                "GH200",
                "L40S"
            ]
        );
        assert_eq!(mig_models().len(), 7);
        for m in mig_models() {
            let ids: Vec<u32> = m.profiles.iter().map(|p| p.id).collect();
            assert_eq!(ids, vec![19, 20, 15, 14, 9, 5, 0], "{}", m.name);
        }
        for m in models() {
            assert!(!m.min_driver.is_empty(), "{}", m.name);
        }
    }

    /// The H200 as a real one reports it (driver 580.159.04, NVML `memorySizeMB` per
    /// profile and the device's total): the table must not drift from the hardware.
    #[test]
    fn h200_memory_is_what_a_real_h200_reports() {
        let m = model("H200-141GB").unwrap();
        assert_eq!(m.memory_mib, 143_771);
        assert_eq!(m.memory_source, Source::Measured);
        let table: Vec<(u32, &str, u64)> = m
            .profiles
            .iter()
            .map(|p| (p.id, p.name.as_str(), p.memory_mib))
            .collect();
        assert_eq!(
            table,
            [
                (19, "1g.18gb", 16_384),
                (20, "1g.18gb+me", 16_384),
                (15, "1g.35gb", 33_280),
                (14, "2g.35gb", 33_280),
                (9, "3g.71gb", 71_424),
                (5, "4g.71gb", 71_424),
                (0, "7g.141gb", 143_360),
            ]
        );
        let geometry: Vec<(u8, u8, Vec<u8>, u8)> = m
            .profiles
            .iter()
            .map(|p| {
                (
                    p.compute_slices,
                    p.memory_slices,
                    p.valid_starts.clone(),
                    p.max_per_gpu,
                )
            })
            .collect();
        assert_eq!(geometry[4], (3, 4, vec![0, 4], 2));
        assert_eq!(geometry[6], (7, 8, vec![0], 1));
    }

    #[test]
    fn every_model_says_where_its_memory_figures_come_from() {
        let sources: Vec<(&str, &str)> = models()
            .iter()
            .map(|m| (m.name.as_str(), m.memory_source.as_str()))
            .collect();
        assert_eq!(
            sources,
            [
                ("A100-40GB", "documented"),
                ("A100-80GB", "estimated"),
                ("H100-80GB", "documented"),
                ("H100-94GB", "documented"),
                ("H200-141GB", "measured"),
                ("B200", "estimated"),
                ("GH200", "estimated"),
                ("L40S", "documented"),
            ]
        );
    }

    #[test]
    fn l40s_has_whole_gpus_only() {
        let m = model("L40S").unwrap();
        assert!(!m.mig_capable);
        assert!(m.profiles.is_empty());
        assert_eq!(m.memory_mib, 46068);
        assert_eq!(m.architecture, "Ada Lovelace");
        assert_eq!(m.min_driver, "520.61.05");
        assert!(!mig_models().contains(&m));
    }

    #[test]
    fn geometry_matches_the_reference_table() {
        let m = model("H100-80GB").unwrap();
        let p = m.profile("3g.40gb").unwrap();
        assert_eq!((p.id, p.compute_slices, p.memory_slices), (9, 3, 4));
        assert_eq!(p.valid_starts, vec![0, 4]);
        assert_eq!(p.max_per_gpu, 2);
        assert_eq!(m.profile("1g.10gb+me").unwrap().max_per_gpu, 1);
        assert_eq!(m.profile("4g.40gb").unwrap().valid_starts, vec![0]);
        assert_eq!(m.profile_by_id(0).unwrap().name, "7g.80gb");
        assert_eq!(m.profile("7g.80gb").unwrap().memory_mib, 81152);
    }

    #[test]
    fn every_placement_stays_inside_eight_memory_slices() {
        for m in models() {
            for p in &m.profiles {
                for s in &p.valid_starts {
                    assert!(s + p.memory_slices <= 8, "{} {}@{}", m.name, p.name, s);
                }
            }
        }
    }

    #[test]
    fn memory_grows_with_profile_size_and_fits_the_gpu() {
        for m in mig_models() {
            for p in &m.profiles {
                assert!(p.memory_mib <= m.memory_mib, "{} {}", m.name, p.name);
                assert!(p.memory_mib > 0);
            }
            let one = m.profile_by_id(19).unwrap().memory_mib;
            let seven = m.profile_by_id(0).unwrap().memory_mib;
            assert!(seven > 7 * one, "{}", m.name);
        }
    }

    #[test]
    fn min_driver_per_architecture() {
        assert_eq!(model("H100-80GB").unwrap().min_driver, "520.61.05");
        assert_eq!(model("GH200").unwrap().min_driver, "520.61.05");
        assert_eq!(model("B200").unwrap().min_driver, "570.26");
        assert_eq!(model("A100-40GB").unwrap().min_driver, "450.51.06");
    }

    #[test]
    fn cuda_for_driver() {
        assert_eq!(newest_cuda_for_driver("550.54.15"), Some("12.4"));
        assert_eq!(newest_cuda_for_driver("570.124.06"), Some("12.8"));
        assert_eq!(newest_cuda_for_driver("580.65.06"), Some("13.0"));
        assert_eq!(newest_cuda_for_driver("535.54.02"), Some("12.1"));
        assert_eq!(newest_cuda_for_driver("470.82.01"), None);
    }

    #[test]
    fn exact_name_lookup_only() {
        assert!(model("h100-80gb").is_none());
        assert!(model("H100").is_none());
    }

    #[test]
    fn nvml_names_map_to_models() {
        let m = |n: &str, mib: u64| model_for_nvml(n, mib).map(|m| m.name.as_str());
        assert_eq!(m("NVIDIA H100 80GB HBM3", 81559), Some("H100-80GB"));
        assert_eq!(m("NVIDIA H100 NVL", 95830), Some("H100-94GB"));
        assert_eq!(m("NVIDIA H200", 143771), Some("H200-141GB"));
        assert_eq!(m("NVIDIA GH200 480GB", 97871), Some("GH200"));
        assert_eq!(m("NVIDIA A100-SXM4-40GB", 40960), Some("A100-40GB"));
        assert_eq!(m("NVIDIA A100-SXM4-80GB", 81920), Some("A100-80GB"));
        assert_eq!(m("NVIDIA B200", 183359), Some("B200"));
        assert_eq!(m("NVIDIA L40S", 46068), Some("L40S"));
        assert_eq!(m("NVIDIA L40", 46068), None);
        assert_eq!(m("Tesla V100-SXM2-32GB", 32768), None);
        // GH200 with 144GB HBM3e is another product than the catalog's 96GB GH200.
        assert_eq!(m("NVIDIA GH200 144G HBM3e", 146831), None);
        assert_eq!(m("NVIDIA GH200 480GB", 146831), None);
    }

    #[test]
    fn nvml_names_without_memory() {
        let m = |n: &str| model_for_nvml_name(n).map(|m| m.name.as_str());
        assert_eq!(m("NVIDIA H100 80GB HBM3"), Some("H100-80GB"));
        assert_eq!(m("NVIDIA A100-SXM4-40GB"), Some("A100-40GB"));
        assert_eq!(m("NVIDIA H200"), Some("H200-141GB"));
        assert_eq!(m("NVIDIA GH200 480GB"), Some("GH200"));
        assert_eq!(m("NVIDIA GH200 144G HBM3e"), None);
        assert_eq!(m("NVIDIA H100 NVL"), None);
        assert_eq!(m("NVIDIA B200"), Some("B200"));
    }

    #[test]
    fn mig_driver_floors_per_model() {
        assert_eq!(min_mig_driver("A100-80GB"), Some("450.80.02"));
        assert_eq!(min_mig_driver("H100-80GB"), Some("525.85.12"));
        assert_eq!(min_mig_driver("H200-141GB"), Some("550.90.07"));
        assert_eq!(min_mig_driver("L40S"), None);
        for m in mig_models() {
            assert!(min_mig_driver(&m.name).is_some(), "{}", m.name);
        }
    }
}
