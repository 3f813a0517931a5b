//! What a healthy GPU of each catalog model delivers under load: dense GEMM TFLOP/s per
//! type, device memory copy bandwidth and the host link, each with where it comes from.
//! The node agent's load tests are judged against these (a result below a fraction of
//! the expected figure fails), never against one constant for every model.
//!
//! How the figures were made:
//! - **H200-141GB: measured.** PyTorch 2.11 on a real H200 (driver 580.159.04, CUDA
//!   13.0), one run: GEMM 8192³ bf16 760 TFLOP/s, fp16 725, fp32 51 (no TF32); device
//!   to device copy of 8 GiB 4,301 GB/s counting read + write; pinned host→device 55.4
//!   GB/s, device→host 55.3 (PCIe Gen5 x16).
//! - **Every other model: estimated** from NVIDIA's documented dense peaks (data sheets;
//!   sparsity not counted) times the efficiency the H200 measured against its own
//!   documented peaks (bf16 760 / 989 = 0.77, fp16 725 / 989 = 0.73, fp32 51 / 67 = 0.76,
//!   copy 4,301 / 4,800 = 0.90, PCIe Gen5 x16 55.4 / 64 = 0.87). The documented peak
//!   is kept beside each estimate so a measurement can replace it.
//!
//! A MIG slice gets the share of its GPU's streaming multiprocessors (GEMM) and memory
//! slices (copy), from the H200's measured SM counts per profile (16, 16, 26, 32, 60, 64,
//! 132 of 132); the host link is not divided. These shares are estimates on every model.

use crate::catalog::{MigProfile, Source};

/// Element type of a GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
        }
    }
}

/// One figure: what a healthy GPU delivers, NVIDIA's documented peak, and the source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// What the judging holds a measurement to (before the fraction).
    pub expected: f64,
    /// NVIDIA's documented peak (0 where none is published).
    pub documented_peak: f64,
    pub source: Source,
}

/// A model's expected figures under load.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFigures {
    pub model: &'static str,
    /// Dense GEMM TFLOP/s; `None` where the model has no such tensor type.
    pub bf16_tflops: Option<Figure>,
    pub fp16_tflops: Figure,
    pub fp32_tflops: Figure,
    /// Device-to-device copy, GB/s counting read + write.
    pub memory_copy_gbps: Figure,
    /// Pinned host→device (and device→host), GB/s, one direction.
    pub host_link_gbps: Figure,
    /// The host link as words ("PCIe Gen5 x16", "NVLink-C2C").
    pub host_link: &'static str,
}

impl ModelFigures {
    /// The GEMM type a burn uses on this model: bf16 where it has it, else fp16.
    pub fn burn_dtype(&self) -> Dtype {
        if self.bf16_tflops.is_some() {
            Dtype::Bf16
        } else {
            Dtype::Fp16
        }
    }

    pub fn tflops(&self, dtype: Dtype) -> Option<Figure> {
        match dtype {
            Dtype::Bf16 => self.bf16_tflops,
            Dtype::Fp16 => Some(self.fp16_tflops),
            Dtype::Fp32 => Some(self.fp32_tflops),
        }
    }
}

/// Efficiencies measured on the H200 against its documented peaks (see the module doc).
const EFF_BF16: f64 = 760.0 / 989.0;
const EFF_FP16: f64 = 725.0 / 989.0;
const EFF_FP32: f64 = 51.0 / 67.0;
const EFF_COPY: f64 = 4301.0 / 4800.0;
const EFF_HOST: f64 = 55.4 / 64.0;

fn measured(value: f64, peak: f64) -> Figure {
    Figure {
        expected: value,
        documented_peak: peak,
        source: Source::Measured,
    }
}

fn estimated(peak: f64, efficiency: f64) -> Figure {
    Figure {
        expected: (peak * efficiency * 10.0).round() / 10.0,
        documented_peak: peak,
        source: Source::Estimated,
    }
}

/// Documented dense peaks: (bf16, fp16, fp32 TFLOP/s; memory GB/s (the data sheet's
/// bandwidth, one direction: a copy's read + write reaches about it); host link GB/s
/// per direction; host link).
/// Sources: NVIDIA A100 data sheet (SXM: 312 / 312 / 19.5, 1,555 GB/s 40GB and 2,039
/// GB/s 80GB, PCIe Gen4); H100 data sheet (SXM 989 / 989 / 67, 3,350 GB/s; NVL 835 / 835
/// / 60, 3,900 GB/s; PCIe Gen5); H200 data sheet (989 / 989 / 67, 4,800 GB/s); HGX B200
/// (2,250 / 2,250 / 75, 8,000 GB/s, PCIe Gen5 to the host); GH200 (989 / 989 / 67,
/// 4,000 GB/s HBM3, NVLink-C2C 450 GB/s per direction); L40S (362 / 362 / 91.6, 864 GB/s,
/// PCIe Gen4).
type Peaks = (&'static str, f64, f64, f64, f64, f64, &'static str);
const PEAKS: [Peaks; 8] = [
    (
        "A100-40GB",
        312.0,
        312.0,
        19.5,
        1555.0,
        32.0,
        "PCIe Gen4 x16",
    ),
    (
        "A100-80GB",
        312.0,
        312.0,
        19.5,
        2039.0,
        32.0,
        "PCIe Gen4 x16",
    ),
    (
        "H100-80GB",
        989.0,
        989.0,
        67.0,
        3350.0,
        64.0,
        "PCIe Gen5 x16",
    ),
    (
        "H100-94GB",
        835.0,
        835.0,
        60.0,
        3900.0,
        64.0,
        "PCIe Gen5 x16",
    ),
    (
        "H200-141GB",
        989.0,
        989.0,
        67.0,
        4800.0,
        64.0,
        "PCIe Gen5 x16",
    ),
    ("B200", 2250.0, 2250.0, 75.0, 8000.0, 64.0, "PCIe Gen5 x16"),
    ("GH200", 989.0, 989.0, 67.0, 4000.0, 450.0, "NVLink-C2C"),
    ("L40S", 362.0, 362.0, 91.6, 864.0, 32.0, "PCIe Gen4 x16"),
];

/// The expected figures of a catalog model.
pub fn for_model(model: &str) -> Option<ModelFigures> {
    let &(name, bf16, fp16, fp32, mem, host, link) = PEAKS.iter().find(|p| p.0 == model)?;
    if name == "H200-141GB" {
        return Some(ModelFigures {
            model: name,
            bf16_tflops: Some(measured(760.0, bf16)),
            fp16_tflops: measured(725.0, fp16),
            fp32_tflops: measured(51.0, fp32),
            memory_copy_gbps: measured(4301.0, mem),
            host_link_gbps: measured(55.3, host),
            host_link: link,
        });
    }
    Some(ModelFigures {
        model: name,
        bf16_tflops: Some(estimated(bf16, EFF_BF16)),
        fp16_tflops: estimated(fp16, EFF_FP16),
        fp32_tflops: estimated(fp32, EFF_FP32),
        memory_copy_gbps: estimated(mem, EFF_COPY),
        host_link_gbps: estimated(host, EFF_HOST),
        host_link: link,
    })
}

/// NVLink all-reduce bus bandwidth within one node, GB/s (nccl-tests' busbw):
/// documented for 8-GPU H100/H200 NVLink 4 boards (about 450-480 GB/s in NVIDIA's and
/// nccl-tests' published runs; 450 taken); the rest estimated in proportion to the
/// NVLink bandwidth per GPU (A100 and H100 NVL bridges 600 GB/s of H100's 900, B200
/// 1,800). None where the model has no NVLink between GPUs of one node.
const NVLINK_ALL_REDUCE: [(&str, f64, Source); 6] = [
    ("A100-40GB", 300.0, Source::Estimated),
    ("A100-80GB", 300.0, Source::Estimated),
    ("H100-80GB", 450.0, Source::Documented),
    ("H100-94GB", 300.0, Source::Estimated),
    ("H200-141GB", 450.0, Source::Documented),
    ("B200", 900.0, Source::Estimated),
];

/// What an all-reduce across a node's whole GPUs should reach: the NVLink figure where
/// the GPUs report NVLink links, else half the host link (GPUs talking through PCIe and
/// host memory; an estimate).
pub fn all_reduce_gbps(f: &ModelFigures, nvlink: bool) -> Figure {
    let over_nvlink = NVLINK_ALL_REDUCE
        .iter()
        .find(|(m, _, _)| *m == f.model)
        .filter(|_| nvlink);
    match over_nvlink {
        Some(&(_, gbps, source)) => Figure {
            expected: gbps,
            documented_peak: gbps,
            source,
        },
        None => Figure {
            expected: f.host_link_gbps.expected / 2.0,
            documented_peak: f.host_link_gbps.documented_peak,
            source: Source::Estimated,
        },
    }
}

/// SMs per profile id on the H200 (measured), out of 132.
const H200_SMS: [(u32, f64); 7] = [
    (19, 16.0),
    (20, 16.0),
    (15, 26.0),
    (14, 32.0),
    (9, 60.0),
    (5, 64.0),
    (0, 132.0),
];

/// The share of a whole GPU's GEMM throughput and memory bandwidth one MIG slice of
/// `profile` has: (compute share, memory share). Estimates (see the module doc).
pub fn slice_share(profile: &MigProfile) -> (f64, f64) {
    let compute = H200_SMS
        .iter()
        .find(|(id, _)| *id == profile.id)
        .map(|(_, sms)| sms / 132.0)
        .unwrap_or(f64::from(profile.compute_slices) / 7.0);
    (compute, f64::from(profile.memory_slices) / 8.0)
}

/// The fraction of an expected figure below which a load test fails, when the fleet
/// group sets none: a healthy GPU measured 0.90x or better of PyTorch on the same H200
/// with gpufleet's own kernels, so 0.75 leaves room for run-to-run noise while a GPU
/// that runs its memory at half speed, or throttles its power to 300 W of 700, fails.
pub const DEFAULT_MIN_FRACTION: f64 = 0.75;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    #[test]
    fn every_catalog_model_has_figures_and_only_the_h200_is_measured() {
        for m in catalog::models() {
            let f = for_model(&m.name).unwrap_or_else(|| panic!("{}", m.name));
            let source = f.fp16_tflops.source;
            let want = if m.name == "H200-141GB" {
                Source::Measured
            } else {
                Source::Estimated
            };
            for fig in [
                f.bf16_tflops.unwrap(),
                f.fp16_tflops,
                f.fp32_tflops,
                f.memory_copy_gbps,
                f.host_link_gbps,
            ] {
                assert_eq!(fig.source, want, "{}", m.name);
                assert!(fig.expected > 0.0 && fig.expected <= fig.documented_peak);
            }
            assert_eq!(source, want);
        }
        assert!(for_model("V100").is_none());
    }

    #[test]
    fn the_h200_figures_are_the_measured_ones() {
        let f = for_model("H200-141GB").unwrap();
        assert_eq!(f.bf16_tflops.unwrap().expected, 760.0);
        assert_eq!(f.fp16_tflops.expected, 725.0);
        assert_eq!(f.fp32_tflops.expected, 51.0);
        assert_eq!(f.memory_copy_gbps.expected, 4301.0);
        assert_eq!(f.host_link_gbps.expected, 55.3);
        assert_eq!(f.burn_dtype(), Dtype::Bf16);
    }

    #[test]
    fn estimates_scale_the_documented_peak_by_the_h200_efficiency() {
        let f = for_model("H100-80GB").unwrap();
        assert_eq!(f.bf16_tflops.unwrap().expected, 760.0);
        assert_eq!(f.memory_copy_gbps.expected, 3001.7);
        let a = for_model("A100-40GB").unwrap();
        assert_eq!(a.host_link_gbps.expected, 27.7);
    }

    #[test]
    fn all_reduce_expects_nvlink_only_where_the_gpus_have_it() {
        let h200 = for_model("H200-141GB").unwrap();
        assert_eq!(all_reduce_gbps(&h200, true).expected, 450.0);
        assert_eq!(all_reduce_gbps(&h200, true).source, Source::Documented);
        assert_eq!(all_reduce_gbps(&h200, false).expected, 27.65);
        let l40s = for_model("L40S").unwrap();
        assert_eq!(all_reduce_gbps(&l40s, true).source, Source::Estimated);
    }

    #[test]
    fn slices_get_their_share() {
        let m = catalog::model("H200-141GB").unwrap();
        let (c, mem) = slice_share(m.profile("3g.71gb").unwrap());
        assert!((c - 60.0 / 132.0).abs() < 1e-9);
        assert_eq!(mem, 0.5);
        assert_eq!(slice_share(m.profile("7g.141gb").unwrap()), (1.0, 1.0));
    }
}
