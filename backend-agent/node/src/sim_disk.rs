//! A simulated node that outlives its agent: `<data-dir>/hardware.json` holds its GPUs
//! and is rewritten after every change, the way a real GPU keeps its MIG layout when the
//! agent restarts. Each change can also take a set time (`--sim-op-delay-ms`), to model
//! slow hardware in tests of orders cut short.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpufleet_gpu::catalog::GpuModel;
use gpufleet_gpu::hardware::{
    BusyState, GpuBackend, GpuHealth, GpuInfo, HwError, MigInstance, SimulatedNode,
};

pub struct DiskSim {
    pub node: Arc<SimulatedNode>,
    path: PathBuf,
    op_delay: Duration,
}

impl DiskSim {
    /// The node as `hardware.json` recorded it, or a new one (MIG off) when there is none.
    pub fn open(
        data_dir: &Path,
        name: &str,
        model: &GpuModel,
        gpus: u32,
        driver: &str,
        op_delay: Duration,
    ) -> anyhow::Result<Self> {
        let path = data_dir.join("hardware.json");
        let node = match std::fs::read_to_string(&path) {
            Ok(text) => {
                let recorded: Vec<GpuInfo> = serde_json::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                SimulatedNode::with_state(name, model, driver, recorded)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                SimulatedNode::new(name, model, gpus, driver)
            }
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        };
        let sim = Self {
            node: Arc::new(node),
            path,
            op_delay,
        };
        sim.save()?;
        Ok(sim)
    }

    fn save(&self) -> Result<(), HwError> {
        let gpus = self.node.gpus()?;
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(&gpus).expect("GPU state serializes"),
        )
        .and_then(|_| std::fs::rename(&tmp, &self.path))
        .map_err(|e| HwError::Nvml(format!("cannot record {}: {e}", self.path.display())))
    }

    /// One change: the modelled time, the change, then the record on disk.
    fn change<T>(&self, op: impl FnOnce() -> Result<T, HwError>) -> Result<T, HwError> {
        if !self.op_delay.is_zero() {
            std::thread::sleep(self.op_delay);
        }
        let out = op()?;
        self.save()?;
        Ok(out)
    }
}

impl GpuBackend for DiskSim {
    fn hostname(&self) -> String {
        self.node.hostname()
    }
    fn driver_version(&self) -> Result<String, HwError> {
        self.node.driver_version()
    }
    fn cuda_version(&self) -> Result<String, HwError> {
        self.node.cuda_version()
    }
    fn gpus(&self) -> Result<Vec<GpuInfo>, HwError> {
        self.node.gpus()
    }
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError> {
        self.change(|| self.node.set_mig_mode(gpu, enabled))
    }
    fn create_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, HwError> {
        self.change(|| self.node.create_instance(gpu, profile_id, start))
    }
    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError> {
        self.change(|| self.node.destroy_instance(gpu, start))
    }
    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError> {
        self.node.health(gpu)
    }
    fn readings(&self, gpu: u32) -> Result<gpufleet_gpu::hardware::GpuReadings, HwError> {
        self.node.readings(gpu)
    }
    fn usage(&self, gpu: u32) -> Result<gpufleet_gpu::hardware::GpuUsage, HwError> {
        self.node.usage(gpu)
    }
    fn busy(&self, gpu: u32) -> Result<BusyState, HwError> {
        self.node.busy(gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_survives_a_new_agent() {
        let dir = tempfile::tempdir().unwrap();
        let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let sim = DiskSim::open(dir.path(), "n1", model, 2, "550.54.15", Duration::ZERO).unwrap();
        sim.set_mig_mode(1, true).unwrap();
        let made = sim.create_instance(1, 9, 4).unwrap();
        drop(sim);
        let again = DiskSim::open(dir.path(), "n1", model, 2, "550.54.15", Duration::ZERO).unwrap();
        let gpus = again.gpus().unwrap();
        assert_eq!(gpus.len(), 2);
        assert!(gpus[1].mig_enabled);
        assert_eq!(gpus[1].instances, vec![made]);
    }
}
