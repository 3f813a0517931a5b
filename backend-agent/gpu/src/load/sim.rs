//! The load tests on simulated GPUs. They run the real algorithms on small host buffers
//! (the same patterns written and verified, mismatches counted; real GEMMs repeated and
//! compared bit for bit) and report the figures a healthy GPU of the model delivers
//! (`crate::figures`), scaled by a MIG slice's share and by the faults injected. So the
//! judging, quarantine and acceptance paths see exactly what a sick GPU would show.
//!
//! Time is scaled (`time_scale`, 1/1000 by default): a 10 s burn runs 10 ms, so CI can
//! check whole fleets at the medium level.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    patterns, AllReduceResult, BurnResult, LoadPlan, LoadRunner, MemoryResult, Outcome, Target,
};
use crate::figures::{self, Dtype, ModelFigures};
pub use crate::hardware::LoadFaults;
use crate::hardware::{GpuBackend, SimulatedNode};

/// Words of host memory the simulated memory test writes per pattern: enough to place
/// injected bit flips apart, few enough that a fleet of simulated nodes checking every
/// MIG slice at once (150 nodes of 56 slices in one test) does not starve the machine.
const SIM_WORDS: usize = 1 << 10;
/// Matrix size of the simulated burn's GEMMs.
const SIM_N: usize = 24;

/// Load tests on a [`SimulatedNode`]'s GPUs.
pub struct SimRunner {
    node: Arc<SimulatedNode>,
    figures: Option<ModelFigures>,
    /// Real seconds per simulated second.
    pub time_scale: f64,
}

impl SimRunner {
    pub fn new(node: Arc<SimulatedNode>) -> Self {
        let figures = figures::for_model(&node.model().name);
        Self {
            node,
            figures,
            time_scale: 0.001,
        }
    }

    fn figures(&self) -> Outcome<&ModelFigures> {
        self.figures
            .as_ref()
            .ok_or_else(|| format!("no figures for {}", self.node.model().name))
    }

    /// (compute share, memory share) of the target: 1 for a whole GPU.
    fn share(&self, target: &Target) -> (f64, f64) {
        target
            .profile
            .as_deref()
            .and_then(|p| self.node.model().profile(p))
            .map(figures::slice_share)
            .unwrap_or((1.0, 1.0))
    }

    fn scaled(&self, d: Duration) -> Duration {
        d.mul_f64(self.time_scale.clamp(0.0, 1.0))
    }
}

/// A small real GEMM (row-major, f32 accumulate) on the host.
fn gemm(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let mut c = vec![0f32; n * n];
    for i in 0..n {
        for k in 0..n {
            let x = a[i * n + k];
            for j in 0..n {
                c[i * n + j] += x * b[k * n + j];
            }
        }
    }
    c
}

fn random_matrix(seed: u64, n: usize) -> Vec<f32> {
    let p = super::Pattern::Random(seed);
    (0..(n * n) as u64)
        .map(|i| (p.word(i) >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0)
        .collect()
}

impl LoadRunner for SimRunner {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn unavailable(&self) -> Option<String> {
        self.node
            .load_unavailable()
            .or_else(|| self.figures().err())
    }

    fn memory(&self, target: &Target, plan: &LoadPlan) -> Outcome<MemoryResult> {
        let faults = self.node.load_faults(target.gpu);
        let mut words = vec![0u32; SIM_WORDS];
        let mut mismatches = 0;
        let mut checked = 0;
        let mut names = Vec::new();
        for pattern in patterns(plan) {
            for (i, w) in words.iter_mut().enumerate() {
                *w = pattern.word(i as u64);
            }
            for f in 0..faults.flipped_bits.min(SIM_WORDS as u64) {
                let at = (f as usize * 7919) % SIM_WORDS;
                words[at] ^= 1 << (f % 32);
            }
            mismatches += words
                .iter()
                .enumerate()
                .filter(|(i, w)| **w != pattern.word(*i as u64))
                .count() as u64;
            checked += SIM_WORDS as u64;
            names.push(pattern.describe());
        }
        Ok(MemoryResult {
            bytes: (SIM_WORDS * 4) as u64,
            words_checked: checked,
            mismatches,
            patterns: names,
        })
    }

    fn burn(
        &self,
        target: &Target,
        dtype: Dtype,
        plan: &LoadPlan,
        during: &mut dyn FnMut(),
    ) -> Outcome<BurnResult> {
        let figures = self.figures()?;
        let expected = figures
            .tflops(dtype)
            .ok_or_else(|| format!("{} has no {} GEMM", figures.model, dtype.as_str()))?;
        let faults = self.node.load_faults(target.gpu);
        let a = random_matrix(plan.seed, SIM_N);
        let b = random_matrix(plan.seed ^ 1, SIM_N);
        self.node.set_loaded(target.gpu, true);
        let start = Instant::now();
        let until = self.scaled(plan.burn);
        let first = gemm(&a, &b, SIM_N);
        let (mut gemms, mut compared, mut corrupted) = (1u64, 0u64, 0u64);
        loop {
            let mut c = gemm(&a, &b, SIM_N);
            if compared < faults.corrupt_gemms {
                let at = (compared as usize * 31) % c.len();
                c[at] = f32::from_bits(c[at].to_bits() ^ 0x400);
            }
            gemms += 1;
            compared += 1;
            if c.iter()
                .zip(&first)
                .any(|(x, y)| x.to_bits() != y.to_bits())
            {
                corrupted += 1;
            }
            during();
            let elapsed = start.elapsed();
            if elapsed >= until {
                break;
            }
            // Rounds a millisecond apart: the simulated burn takes its time without
            // spinning a core (a fleet of simulated nodes shares one machine).
            std::thread::sleep((until - elapsed).min(Duration::from_millis(1)));
        }
        self.node.set_loaded(target.gpu, false);
        let mut speed = faults.compute_speed.unwrap_or(1.0);
        if faults.throttle_under_load != 0 && faults.compute_speed.is_none() {
            speed = 0.6;
        }
        Ok(BurnResult {
            dtype,
            n: super::burn_size(target.memory_mib),
            gemms,
            compared,
            corrupted,
            tflops: expected.expected * self.share(target).0 * speed,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    fn memory_copy(&self, target: &Target, _plan: &LoadPlan) -> Outcome<f64> {
        let f = self.figures()?;
        let speed = self
            .node
            .load_faults(target.gpu)
            .memory_speed
            .unwrap_or(1.0);
        Ok(f.memory_copy_gbps.expected * self.share(target).1 * speed)
    }

    fn host_link(&self, target: &Target, _plan: &LoadPlan) -> Outcome<(f64, f64)> {
        let f = self.figures()?;
        let speed = self.node.load_faults(target.gpu).host_speed.unwrap_or(1.0);
        let g = f.host_link_gbps.expected * speed;
        Ok((g, g))
    }

    fn all_reduce(&self, targets: &[Target], plan: &LoadPlan) -> Outcome<AllReduceResult> {
        if targets.len() < 2 {
            return Err("an all-reduce needs two or more whole GPUs".into());
        }
        let f = self.figures()?;
        let nvlink = self
            .node
            .readings(targets[0].gpu)
            .map(|r| r.nvlink.map(|l| l.links > 0).unwrap_or(false))
            .unwrap_or(false);
        let expected = figures::all_reduce_gbps(f, nvlink).expected;
        let speed = targets
            .iter()
            .filter_map(|t| self.node.load_faults(t.gpu).nccl_speed)
            .fold(1.0f64, f64::min);
        std::thread::sleep(self.scaled(Duration::from_millis(500)));
        Ok(AllReduceResult {
            gpus: targets.len() as u32,
            bytes: plan.bandwidth_bytes,
            bus_gbps: expected * speed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    fn runner() -> (Arc<SimulatedNode>, SimRunner) {
        let m = catalog::model("H200-141GB").unwrap();
        let n = Arc::new(SimulatedNode::new("n", m, 2, "580.159.04"));
        let r = SimRunner::new(n.clone());
        (n, r)
    }

    fn plan() -> LoadPlan {
        LoadPlan {
            memory_fraction: 0.5,
            memory_passes: 2,
            burn: Duration::from_secs(2),
            bandwidth_bytes: 1 << 30,
            seed: 42,
        }
    }

    fn gpu(i: u32) -> Target {
        Target {
            gpu: i,
            uuid: format!("GPU-{i}"),
            profile: None,
            memory_mib: 143_771,
        }
    }

    #[test]
    fn a_healthy_simulated_gpu_delivers_its_models_figures() {
        let (_, r) = runner();
        let m = r.memory(&gpu(0), &plan()).unwrap();
        assert_eq!((m.mismatches, m.patterns.len()), (0, 4));
        let mut samples = 0;
        let b = r
            .burn(&gpu(0), Dtype::Bf16, &plan(), &mut || samples += 1)
            .unwrap();
        assert_eq!((b.corrupted, b.tflops), (0, 760.0));
        assert!(b.compared >= 1 && samples >= 1);
        assert_eq!(r.memory_copy(&gpu(0), &plan()).unwrap(), 4301.0);
        assert_eq!(r.host_link(&gpu(0), &plan()).unwrap(), (55.3, 55.3));
        assert!(r.all_reduce(&[gpu(0), gpu(1)], &plan()).unwrap().bus_gbps > 0.0);
        assert!(r.all_reduce(&[gpu(0)], &plan()).is_err());
    }

    #[test]
    fn injected_faults_show_in_the_measurements() {
        let (n, r) = runner();
        n.set_load_faults(
            1,
            LoadFaults {
                flipped_bits: 3,
                memory_speed: Some(0.5),
                corrupt_gemms: 2,
                throttle_under_load: 0x8,
                xid_under_load: Some(79),
                ..LoadFaults::default()
            },
        );
        let m = r.memory(&gpu(1), &plan()).unwrap();
        assert_eq!(m.mismatches, 3 * 4, "three words in each of four patterns");
        let mut throttle = Vec::new();
        let b = r
            .burn(&gpu(1), Dtype::Bf16, &plan(), &mut || {
                throttle.push(n.readings(1).unwrap().throttle_reasons.unwrap())
            })
            .unwrap();
        assert_eq!(b.corrupted, 2.min(b.compared));
        assert_eq!(b.tflops, 760.0 * 0.6);
        assert!(throttle.iter().all(|t| *t == 0x8));
        assert_eq!(n.readings(1).unwrap().throttle_reasons, Ok(0), "idle again");
        assert_eq!(r.memory_copy(&gpu(1), &plan()).unwrap(), 4301.0 * 0.5);
        assert_eq!(r.memory(&gpu(0), &plan()).unwrap().mismatches, 0);
        assert_eq!(r.unavailable(), None);
        n.set_load_unavailable(Some("no CUDA library".into()));
        assert_eq!(r.unavailable().as_deref(), Some("no CUDA library"));
    }
}
