//! What the agent tells the control plane about its GPUs on its heartbeats
//! (`Heartbeat.gpus`): utilisation, memory, temperature, power, uncorrected ECC errors and
//! the XIDs seen, per GPU. The control plane keeps the latest of each node for the metrics
//! its tenants scrape of their own clusters.
//!
//! XIDs are consumed by the reading that reports them (`GpuBackend::readings`), and the
//! health checks must still see every one. So the agent's backend is wrapped once
//! ([`XidTap`], in `assemble`): a telemetry reading keeps the XIDs it drained for the next
//! check's reading, and every XID is counted exactly once, whoever read it first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpufleet_gpu::hardware::{
    BusyState, GpuBackend, GpuHealth, GpuInfo, GpuReadings, GpuStatus, GpuUsage, HwError,
    MigInstance,
};
use gpufleet_proto::v1;

/// XIDs a telemetry reading drained and no check has read yet, per GPU, at most this many
/// (the oldest are dropped past it; the count keeps them all).
const MAX_PENDING_XIDS: usize = 256;

#[derive(Default)]
struct Xids {
    /// Per GPU index: every XID seen since the agent started.
    total: HashMap<u32, u64>,
    /// Per GPU index: drained by telemetry, not yet given to a check.
    pending: HashMap<u32, Vec<u64>>,
}

/// The agent's backend with the XIDs it reports counted (see the module doc).
pub struct XidTap {
    inner: Arc<dyn GpuBackend>,
    xids: Mutex<Xids>,
}

impl XidTap {
    pub fn wrap(inner: Arc<dyn GpuBackend>) -> Arc<XidTap> {
        Arc::new(XidTap {
            inner,
            xids: Mutex::new(Xids::default()),
        })
    }

    fn xids(&self) -> std::sync::MutexGuard<'_, Xids> {
        self.xids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The GPUs' readings for the control plane, read now (blocking: hardware calls).
    /// A GPU that cannot be read at all is left out; a value that cannot be read is sent
    /// as not read.
    pub fn sample(&self) -> Vec<v1::GpuTelemetry> {
        let gpus = match self.inner.gpus() {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(error = %e, "telemetry: cannot list the GPUs");
                return Vec::new();
            }
        };
        gpus.iter().map(|g| self.sample_one(g)).collect()
    }

    fn sample_one(&self, g: &GpuInfo) -> v1::GpuTelemetry {
        let mut t = v1::GpuTelemetry {
            index: g.index,
            uuid: g.uuid.clone(),
            ..Default::default()
        };
        if let Ok(u) = self.inner.usage(g.index) {
            if let Some(p) = u.utilization_percent {
                (t.has_utilization, t.utilization_percent) = (true, p.min(100));
            }
            t.has_memory = true;
            t.memory_used_mib = u.memory_used_mib;
            t.memory_total_mib = u.memory_total_mib;
        }
        if let Ok(r) = self.inner.readings(g.index) {
            if let Ok(c) = r.temperature_c {
                (t.has_temperature, t.temperature_c) = (true, c);
            }
            if let Ok(mw) = r.power_mw {
                (t.has_power, t.power_mw) = (true, mw);
            }
            if let Ok(ecc) = r.ecc {
                (t.has_ecc, t.ecc_uncorrected) = (true, ecc.volatile_uncorrected);
            }
            let mut xids = self.xids();
            if let Ok(new) = r.xids {
                *xids.total.entry(g.index).or_default() += new.len() as u64;
                let pending = xids.pending.entry(g.index).or_default();
                pending.extend(new);
                let over = pending.len().saturating_sub(MAX_PENDING_XIDS);
                pending.drain(..over);
            }
            t.xids_total = xids.total.get(&g.index).copied().unwrap_or(0);
        } else {
            t.xids_total = self.xids().total.get(&g.index).copied().unwrap_or(0);
        }
        t
    }
}

impl GpuBackend for XidTap {
    fn hostname(&self) -> String {
        self.inner.hostname()
    }
    fn driver_version(&self) -> Result<String, HwError> {
        self.inner.driver_version()
    }
    fn cuda_version(&self) -> Result<String, HwError> {
        self.inner.cuda_version()
    }
    fn gpus(&self) -> Result<Vec<GpuInfo>, HwError> {
        self.inner.gpus()
    }
    fn gpu(&self, gpu: u32) -> Result<GpuInfo, HwError> {
        self.inner.gpu(gpu)
    }
    fn inventory(&self) -> Result<Vec<GpuStatus>, HwError> {
        self.inner.inventory()
    }
    fn preflight(&self) -> Vec<String> {
        self.inner.preflight()
    }
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), HwError> {
        self.inner.set_mig_mode(gpu, enabled)
    }
    fn create_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, HwError> {
        self.inner.create_instance(gpu, profile_id, start)
    }
    fn destroy_instance(&self, gpu: u32, start: u8) -> Result<(), HwError> {
        self.inner.destroy_instance(gpu, start)
    }
    fn health(&self, gpu: u32) -> Result<GpuHealth, HwError> {
        self.inner.health(gpu)
    }
    /// The hardware's readings, with the XIDs telemetry drained first (oldest first).
    fn readings(&self, gpu: u32) -> Result<GpuReadings, HwError> {
        let mut r = self.inner.readings(gpu)?;
        let mut xids = self.xids();
        let pending = xids.pending.remove(&gpu).unwrap_or_default();
        if let Ok(new) = &r.xids {
            *xids.total.entry(gpu).or_default() += new.len() as u64;
        }
        if !pending.is_empty() {
            r.xids = Ok(match r.xids {
                Ok(new) => pending.into_iter().chain(new).collect(),
                // The checks still see what was drained, even when this reading failed.
                Err(_) => pending,
            });
        }
        Ok(r)
    }
    fn usage(&self, gpu: u32) -> Result<GpuUsage, HwError> {
        self.inner.usage(gpu)
    }
    fn busy(&self, gpu: u32) -> Result<BusyState, HwError> {
        self.inner.busy(gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_gpu::hardware::SimulatedNode;

    fn tapped() -> (Arc<SimulatedNode>, Arc<XidTap>) {
        let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let sim = Arc::new(SimulatedNode::new("n1", model, 2, "550.54.15"));
        let tap = XidTap::wrap(sim.clone());
        (sim, tap)
    }

    #[test]
    fn every_xid_is_counted_once_and_still_reaches_the_checks() {
        let (sim, tap) = tapped();
        sim.push_xid(1, 79);
        let first = tap.sample();
        assert_eq!(first.len(), 2);
        assert_eq!((first[0].xids_total, first[1].xids_total), (0, 1));
        // A check reads after telemetry drained it: it still sees the XID.
        assert_eq!(tap.readings(1).unwrap().xids, Ok(vec![79]));
        assert_eq!(tap.readings(1).unwrap().xids, Ok(vec![]));
        // One read by a check first is counted too, and not twice.
        sim.push_xid(1, 48);
        assert_eq!(tap.readings(1).unwrap().xids, Ok(vec![48]));
        assert_eq!(tap.sample()[1].xids_total, 2);
        assert_eq!(tap.sample()[1].xids_total, 2);
    }

    #[test]
    fn readings_carry_usage_and_health() {
        let (sim, tap) = tapped();
        sim.set_gpu_in_use(0, true);
        let t = tap.sample();
        assert!(t[0].has_utilization && t[0].has_memory && t[0].has_temperature);
        assert_eq!(t[0].utilization_percent, 100);
        assert_eq!(t[0].memory_used_mib, t[0].memory_total_mib);
        assert_eq!((t[1].utilization_percent, t[1].memory_used_mib), (0, 0));
        assert!(t[1].memory_total_mib > 0);
        assert_eq!(t[1].uuid, sim.gpus().unwrap()[1].uuid);
    }
}
