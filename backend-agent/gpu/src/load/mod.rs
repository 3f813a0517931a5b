//! Load tests: what the node agent runs on a GPU (or one MIG slice) to see it work, not
//! just read its counters. One trait, [`LoadRunner`], with two implementations:
//! [`SimRunner`] (simulated GPUs, with injectable faults) and `CudaRunner` (real GPUs
//! through CUDA loaded at run time, in [`cuda`]). Both return plain measurements; the
//! node agent judges them against the model's figures ([`crate::figures`]) with the same
//! code whichever ran them.
//!
//! - `memory`: a share of the free memory written and read back with walking ones,
//!   walking zeros and a seeded pseudo-random pattern; mismatching words counted.
//! - `burn`: repeated GEMMs for a duration on random operands (low-entropy operands draw
//!   less power and run faster), every result compared with the first, TFLOP/s measured;
//!   `during` is called between rounds so the caller can read temperature, power,
//!   clocks and throttle reasons under load.
//! - `memory_copy`: device-to-device copy, GB/s counting read + write.
//! - `host_link`: pinned host→device and device→host, GB/s each.
//! - `all_reduce`: an all-reduce across two or more whole GPUs, bus bandwidth.

pub mod cuda;
pub mod kernels;
pub mod probe;
mod sim;

pub use sim::{LoadFaults, SimRunner};

use std::time::Duration;

use crate::figures::Dtype;

/// What a load test runs on: a whole GPU or one MIG slice of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The physical GPU's index (NVML order).
    pub gpu: u32,
    /// "GPU-..." for a whole GPU, "MIG-..." for a slice.
    pub uuid: String,
    /// The MIG profile's name for a slice.
    pub profile: Option<String>,
    /// Memory of the GPU or slice, MiB.
    pub memory_mib: u64,
}

impl Target {
    /// "GPU 0" or "GPU 0 slice 3g.71gb (MIG-...)", for sentences.
    pub fn label(&self) -> String {
        match &self.profile {
            Some(p) => format!("GPU {} slice {p} ({})", self.gpu, self.uuid),
            None => format!("GPU {}", self.gpu),
        }
    }
}

/// How much a level's load tests do; every duration is bounded by [`LoadPlan::bounded`].
#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    /// Share of the free memory the memory test writes and verifies (0.05 to 0.95).
    pub memory_fraction: f64,
    /// Passes of the pseudo-random pattern (each with its own seed), after the walking bits.
    pub memory_passes: u32,
    /// How long the burn runs.
    pub burn: Duration,
    /// Bytes moved per bandwidth measurement (copy, host link, all-reduce).
    pub bandwidth_bytes: u64,
    /// Seed of the pseudo-random patterns and operands.
    pub seed: u64,
}

/// The longest a burn may run (a `long` level of several minutes stays bounded).
pub const MAX_BURN: Duration = Duration::from_secs(600);
/// Bounds of the bytes moved per bandwidth measurement.
pub const MIN_BANDWIDTH_BYTES: u64 = 1 << 20;
pub const MAX_BANDWIDTH_BYTES: u64 = 16 << 30;

impl LoadPlan {
    /// The plan held to its bounds.
    pub fn bounded(mut self) -> Self {
        self.memory_fraction = self.memory_fraction.clamp(0.05, 0.95);
        self.memory_passes = self.memory_passes.clamp(1, 64);
        self.burn = self.burn.min(MAX_BURN);
        self.bandwidth_bytes = self
            .bandwidth_bytes
            .clamp(MIN_BANDWIDTH_BYTES, MAX_BANDWIDTH_BYTES);
        self
    }
}

/// The memory test's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryResult {
    pub bytes: u64,
    /// Words written and read back, over every pattern.
    pub words_checked: u64,
    pub mismatches: u64,
    /// The patterns, in order ("walking ones", "walking zeros", "random seed N").
    pub patterns: Vec<String>,
}

/// The burn's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct BurnResult {
    pub dtype: Dtype,
    /// Matrix size (n x n x n).
    pub n: u32,
    pub gemms: u64,
    /// GEMM results compared with the first one.
    pub compared: u64,
    /// Results that differed from the first (silent corruption).
    pub corrupted: u64,
    pub tflops: f64,
    pub seconds: f64,
}

/// An all-reduce's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct AllReduceResult {
    pub gpus: u32,
    pub bytes: u64,
    /// nccl-tests' bus bandwidth, GB/s: algbw x 2(n-1)/n.
    pub bus_gbps: f64,
}

/// A load test's answer: a measurement, or why it could not run (a sentence).
pub type Outcome<T> = Result<T, String>;

/// Runs load tests on one node's GPUs. Blocking; callers run it on a blocking thread.
pub trait LoadRunner: Send + Sync {
    /// "simulated" or "cuda".
    fn kind(&self) -> &'static str;
    /// Why this host cannot run load tests at all (no CUDA library, a driver too old),
    /// or None when it can.
    fn unavailable(&self) -> Option<String>;
    fn memory(&self, target: &Target, plan: &LoadPlan) -> Outcome<MemoryResult>;
    /// Burns for `plan.burn`, calling `during` between rounds (at least once).
    fn burn(
        &self,
        target: &Target,
        dtype: Dtype,
        plan: &LoadPlan,
        during: &mut dyn FnMut(),
    ) -> Outcome<BurnResult>;
    /// Device-to-device copy, GB/s counting read + write.
    fn memory_copy(&self, target: &Target, plan: &LoadPlan) -> Outcome<f64>;
    /// Pinned host→device and device→host, GB/s.
    fn host_link(&self, target: &Target, plan: &LoadPlan) -> Outcome<(f64, f64)>;
    /// All-reduce across these whole GPUs (two or more).
    fn all_reduce(&self, targets: &[Target], plan: &LoadPlan) -> Outcome<AllReduceResult>;
}

/// A memory-test pattern; the CUDA kernels compute the same words (`kernels::SOURCE`'s
/// `gf_word`, checked against this by a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Word i is 1 << ((i + shift) mod 32).
    WalkingOnes(u32),
    /// The complement of walking ones.
    WalkingZeros(u32),
    /// A counter-based generator (splitmix64 of seed + i x golden ratio), so any word can
    /// be recomputed where it is checked.
    Random(u64),
}

impl Pattern {
    /// (kind, seed) as the kernels take them: 0 walking ones, 1 walking zeros, 2 random.
    pub fn code(self) -> (u32, u64) {
        match self {
            Pattern::WalkingOnes(s) => (0, u64::from(s)),
            Pattern::WalkingZeros(s) => (1, u64::from(s)),
            Pattern::Random(s) => (2, s),
        }
    }

    pub fn describe(self) -> String {
        match self {
            Pattern::WalkingOnes(_) => "walking ones".into(),
            Pattern::WalkingZeros(_) => "walking zeros".into(),
            Pattern::Random(s) => format!("random seed {s}"),
        }
    }

    /// Word `i` of the pattern.
    pub fn word(self, i: u64) -> u32 {
        let (kind, seed) = self.code();
        match kind {
            0 => 1u32 << ((i.wrapping_add(seed)) & 31),
            1 => !(1u32 << ((i.wrapping_add(seed)) & 31)),
            _ => {
                let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)) as u32
            }
        }
    }
}

/// The patterns of a memory test: one pass of walking ones and one of walking zeros (word
/// i holds bit i mod 32, or all but it: between the two passes every bit of every word
/// holds both 0 and 1, and neighbouring words differ), then `passes` random seeds.
pub fn patterns(plan: &LoadPlan) -> Vec<Pattern> {
    let mut out = vec![Pattern::WalkingOnes(0), Pattern::WalkingZeros(0)];
    out.extend((0..u64::from(plan.memory_passes)).map(|p| Pattern::Random(plan.seed ^ p)));
    out
}

/// The matrix size of a burn on `memory_mib` of memory: 8192 where three n x n matrices
/// of 4-byte results fit in a tenth of it, halved until they do (at least 512).
pub fn burn_size(memory_mib: u64) -> u32 {
    let mut n: u64 = 8192;
    while n > 512 && 3 * n * n * 4 > memory_mib * 1024 * 1024 / 10 {
        n /= 2;
    }
    n as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_walk_every_bit_and_random_words_depend_on_the_seed() {
        let ones: Vec<u32> = (0..33).map(|i| Pattern::WalkingOnes(0).word(i)).collect();
        assert_eq!(ones[0], 1);
        assert_eq!(ones[31], 1 << 31);
        assert_eq!(ones[32], 1);
        assert_eq!(Pattern::WalkingZeros(1).word(0), !2);
        let a = Pattern::Random(1).word(5);
        assert_eq!(a, Pattern::Random(1).word(5));
        assert_ne!(a, Pattern::Random(2).word(5));
        // splitmix64's first output for seed 0 (0xe220a8397b1dcdaf, low 32 bits).
        assert_eq!(Pattern::Random(0).word(1), 0x7b1d_cdaf_u32);
    }

    #[test]
    fn plans_are_bounded_and_burns_fit_small_slices() {
        let p = LoadPlan {
            memory_fraction: 2.0,
            memory_passes: 0,
            burn: Duration::from_secs(100_000),
            bandwidth_bytes: 1,
            seed: 7,
        }
        .bounded();
        assert_eq!(p.memory_fraction, 0.95);
        assert_eq!(p.memory_passes, 1);
        assert_eq!(p.burn, MAX_BURN);
        assert_eq!(p.bandwidth_bytes, MIN_BANDWIDTH_BYTES);
        assert_eq!(patterns(&p).len(), 3);
        assert_eq!(burn_size(143_771), 8192);
        assert_eq!(burn_size(16_384), 8192);
        assert_eq!(burn_size(2_048), 4096);
        assert_eq!(burn_size(100), 512);
    }
}
