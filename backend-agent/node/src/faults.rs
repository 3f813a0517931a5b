//! Fault injection for simulated nodes (tests only): `sim-faults.toml`, read afresh
//! before every order. Only an agent with simulated hardware ever reads it, so it can
//! never act on real GPUs.
//!
//! ```toml
//! fail_create_after = 2              # the 3rd MIG instance create of an order fails
//! in_use = ["h100-80gb-pool-01:0"]   # "<node name>:<gpu index>": these GPUs report work running
//! driver_install_fails = ["h100-80gb-pool-02"]  # these nodes fail a driver install
//! driver_not_applied = ["h100-80gb-pool-03"]    # these nodes keep their old driver after one
//!
//! # Health faults, seen by the node's health checks (RunHealthCheck orders, hw-check):
//! [[ecc_burst]]            # GPU 0 reports 3 uncorrected (volatile and aggregate) ECC errors
//! node = "h100-80gb-pool-01"
//! gpu = 0
//! uncorrected = 3
//! [[xid]]                  # GPU 1 reports XID 79 (fallen off the bus) at every check
//! node = "h100-80gb-pool-01"
//! gpu = 1
//! code = 79
//! [[pcie_degraded]]        # GPU 2's link runs at Gen3 x8 instead of its maximum
//! node = "h100-80gb-pool-01"
//! gpu = 2
//! gen = 3
//! width = 8
//! [[slow_network]]         # this node's bandwidth-test sender and receiver run at 50 Mbit/s
//! node = "h100-80gb-pool-01"
//! mbps = 50
//! [[wrong_driver]]         # the health checks read this driver instead of the installed one
//! node = "h100-80gb-pool-01"
//! version = "535.54.03"
//!
//! no_cuda = ["h100-80gb-pool-02"]  # these nodes answer as hosts without CUDA: their
//!                                  # load tests cannot run
//!
//! # Load faults, seen by the medium and long levels' load tests (every key but node and
//! # gpu optional):
//! [[under_load]]
//! node = "h100-80gb-pool-01"
//! gpu = 0
//! flipped_bits = 3          # words of each memory pattern that read back wrong
//! memory_speed = 0.5        # memory copy at half the model's figure
//! compute_speed = 0.4       # GEMMs at 0.4 of it (clocks held down)
//! host_speed = 0.5          # the host link at half
//! throttle_under_load = 64  # NVML throttle bits while loaded (64: hardware thermal slowdown)
//! xid_under_load = 79       # an XID logged when the GPU is loaded
//! corrupt_gemms = 2         # GEMM results that differ from the first
//! nccl_speed = 0.2          # the node's all-reduce at 0.2 of the model's figure
//! pcie_gen_under_load = 3   # the PCIe link drops to Gen3 x8 while loaded
//! pcie_width_under_load = 8
//! ```
//!
//! The file is read at each use, so a test injects (or removes) a fault while the agent
//! runs; the health faults apply to the check that reads them.

use std::path::Path;

use gpufleet_gpu::hardware::{GpuBackend, SimulatedNode};
use gpufleet_gpu::load::LoadFaults;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    pub fail_create_after: Option<u32>,
    #[serde(default)]
    pub in_use: Vec<String>,
    #[serde(default)]
    pub driver_install_fails: Vec<String>,
    #[serde(default)]
    pub driver_not_applied: Vec<String>,
    #[serde(default)]
    pub ecc_burst: Vec<EccBurst>,
    #[serde(default)]
    pub xid: Vec<Xid>,
    #[serde(default)]
    pub pcie_degraded: Vec<PcieDegraded>,
    #[serde(default)]
    pub slow_network: Vec<SlowNetwork>,
    #[serde(default)]
    pub wrong_driver: Vec<WrongDriver>,
    #[serde(default)]
    pub under_load: Vec<UnderLoad>,
    #[serde(default)]
    pub no_cuda: Vec<String>,
}

/// Faults of one GPU that show only under load (see the module doc).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnderLoad {
    pub node: String,
    pub gpu: u32,
    #[serde(default)]
    pub flipped_bits: u64,
    pub memory_speed: Option<f64>,
    pub compute_speed: Option<f64>,
    pub host_speed: Option<f64>,
    #[serde(default)]
    pub throttle_under_load: u64,
    pub xid_under_load: Option<u64>,
    #[serde(default)]
    pub corrupt_gemms: u64,
    pub nccl_speed: Option<f64>,
    pub pcie_gen_under_load: Option<u32>,
    pub pcie_width_under_load: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EccBurst {
    pub node: String,
    pub gpu: u32,
    pub uncorrected: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Xid {
    pub node: String,
    pub gpu: u32,
    pub code: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieDegraded {
    pub node: String,
    pub gpu: u32,
    pub gen: u32,
    pub width: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowNetwork {
    pub node: String,
    /// Megabits per second (at least 1).
    pub mbps: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WrongDriver {
    pub node: String,
    pub version: String,
}

impl Faults {
    /// The file's faults, none when it does not exist; a malformed file is an error.
    pub fn read(path: &Path) -> Result<Self, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(_) => Ok(Self::default()),
        }
    }

    /// The bandwidth limit of `node`'s test streams, in Mbit/s, if it has a slow network.
    pub fn slow_network(&self, node: &str) -> Option<u64> {
        self.slow_network
            .iter()
            .filter(|s| s.node == node)
            .map(|s| s.mbps.max(1))
            .min()
    }

    /// The driver `node`'s health checks read instead of the installed one.
    pub fn wrong_driver(&self, node: &str) -> Option<&str> {
        self.wrong_driver
            .iter()
            .find(|w| w.node == node)
            .map(|w| w.version.as_str())
    }

    /// Sets `node`'s simulated GPUs to the health faults listed for it (clearing those no
    /// longer listed); XIDs are queued for the next reading.
    pub fn apply_health(&self, node: &str, sim: &SimulatedNode) {
        let gpus = sim.gpus().map(|g| g.len() as u32).unwrap_or(0);
        for gpu in 0..gpus {
            let ecc = self
                .ecc_burst
                .iter()
                .filter(|e| e.node == node && e.gpu == gpu)
                .map(|e| e.uncorrected)
                .sum();
            sim.set_ecc_uncorrected(gpu, ecc);
            let link = self
                .pcie_degraded
                .iter()
                .find(|p| p.node == node && p.gpu == gpu)
                .map(|p| (p.gen, p.width));
            sim.set_pcie_link(gpu, link);
            for x in self.xid.iter().filter(|x| x.node == node && x.gpu == gpu) {
                sim.push_xid(gpu, x.code);
            }
        }
    }

    /// Sets `node`'s simulated GPUs to the load faults listed for them (clearing the
    /// others).
    pub fn apply_load(&self, node: &str, sim: &SimulatedNode) {
        let max_gen = match sim.model().architecture.as_str() {
            "Ampere" | "Ada Lovelace" => 4,
            _ => 5,
        };
        sim.set_load_unavailable(
            self.no_cuda
                .iter()
                .any(|n| n == node)
                .then(|| "no CUDA library: libcuda not found (simulated: no_cuda)".to_string()),
        );
        let gpus = sim.gpus().map(|g| g.len() as u32).unwrap_or(0);
        for gpu in 0..gpus {
            let f = self
                .under_load
                .iter()
                .find(|u| u.node == node && u.gpu == gpu)
                .map(|u| LoadFaults {
                    flipped_bits: u.flipped_bits,
                    memory_speed: u.memory_speed,
                    compute_speed: u.compute_speed,
                    host_speed: u.host_speed,
                    throttle_under_load: u.throttle_under_load,
                    xid_under_load: u.xid_under_load,
                    corrupt_gemms: u.corrupt_gemms,
                    nccl_speed: u.nccl_speed,
                    pcie_under_load: match (u.pcie_gen_under_load, u.pcie_width_under_load) {
                        (None, None) => None,
                        // What is not given stays at the model's maximum.
                        (g, w) => Some((g.unwrap_or(max_gen), w.unwrap_or(16))),
                    },
                })
                .unwrap_or_default();
            sim.set_load_faults(gpu, f);
        }
    }

    /// Whether `node`'s GPU `gpu` is marked busy.
    pub fn in_use(&self, node: &str, gpu: u32) -> bool {
        self.in_use.contains(&format!("{node}:{gpu}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_and_a_missing_file_is_no_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim-faults.toml");
        assert!(Faults::read(&path).unwrap().in_use.is_empty());
        std::fs::write(&path, "in_use = [\"n1:2\"]\n").unwrap();
        let f = Faults::read(&path).unwrap();
        assert!(f.in_use("n1", 2) && !f.in_use("n1", 1) && !f.in_use("n2", 2));
        std::fs::write(&path, "typo = 1\n").unwrap();
        assert!(Faults::read(&path).unwrap_err().contains("typo"));
    }

    #[test]
    fn load_faults_reach_the_simulated_gpus_and_clear_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim-faults.toml");
        std::fs::write(
            &path,
            "[[under_load]]\nnode = \"n1\"\ngpu = 1\nflipped_bits = 2\nmemory_speed = 0.5\nxid_under_load = 79\npcie_width_under_load = 8\n",
        )
        .unwrap();
        let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let sim = SimulatedNode::new("n1", model, 2, "550.54.15");
        Faults::read(&path).unwrap().apply_load("n1", &sim);
        let f = sim.load_faults(1);
        assert_eq!(
            (f.flipped_bits, f.memory_speed, f.xid_under_load),
            (2, Some(0.5), Some(79))
        );
        assert_eq!(
            f.pcie_under_load,
            Some((5, 8)),
            "the width given, H100's Gen5 kept"
        );
        assert_eq!(sim.load_faults(0), LoadFaults::default());
        assert_eq!(sim.load_unavailable(), None);
        std::fs::write(&path, "no_cuda = [\"n1\"]\n").unwrap();
        Faults::read(&path).unwrap().apply_load("n1", &sim);
        assert!(sim.load_unavailable().unwrap().contains("no CUDA"));
        Faults::default().apply_load("n1", &sim);
        assert_eq!(sim.load_unavailable(), None);
        assert_eq!(sim.load_faults(1), LoadFaults::default());
        std::fs::write(&path, "[[under_load]]\nnode = \"n1\"\ngpu = 0\nspeed = 1\n").unwrap();
        assert!(Faults::read(&path).unwrap_err().contains("speed"));
    }

    #[test]
    fn health_faults_reach_the_simulated_gpus_and_clear_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim-faults.toml");
        std::fs::write(
            &path,
            "[[ecc_burst]]\nnode = \"n1\"\ngpu = 0\nuncorrected = 3\n\
             [[xid]]\nnode = \"n1\"\ngpu = 1\ncode = 79\n\
             [[pcie_degraded]]\nnode = \"n1\"\ngpu = 1\ngen = 3\nwidth = 8\n\
             [[slow_network]]\nnode = \"n1\"\nmbps = 50\n\
             [[wrong_driver]]\nnode = \"n2\"\nversion = \"535.54.03\"\n",
        )
        .unwrap();
        let f = Faults::read(&path).unwrap();
        assert_eq!(
            (f.slow_network("n1"), f.slow_network("n2")),
            (Some(50), None)
        );
        assert_eq!(
            (f.wrong_driver("n2"), f.wrong_driver("n1")),
            (Some("535.54.03"), None)
        );
        let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let sim = SimulatedNode::new("n1", model, 2, "550.54.15");
        f.apply_health("n1", &sim);
        let (g0, g1) = (sim.readings(0).unwrap(), sim.readings(1).unwrap());
        assert_eq!(g0.ecc.unwrap().volatile_uncorrected, 3);
        assert_eq!(g1.xids, Ok(vec![79]));
        assert_eq!(g1.pcie.unwrap().width, 8);
        Faults::default().apply_health("n1", &sim);
        let g1 = sim.readings(1).unwrap();
        assert_eq!((g1.pcie.unwrap().width, g1.xids), (16, Ok(vec![])));
        assert_eq!(
            sim.readings(0).unwrap().ecc.unwrap().volatile_uncorrected,
            0
        );
    }
}
