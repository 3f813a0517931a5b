//! Runs work orders on the agent's own hardware, one at a time, and answers each with the
//! node's verified state. Blocking: callers run it on a blocking thread.
//!
//! An order puts every GPU of the node at one target (MIG placements, or whole GPUs)
//! through the safe re-partition sequence of `gpufleet-gpu`; when one GPU fails, the GPUs
//! this order already changed are put back, so a failed order leaves the node as it was.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gpufleet_gpu::hardware::{
    apply_layout, clear_layout, GpuBackend, GpuInfo, HwError, SimulatedNode,
};
use gpufleet_gpu::mig::Placement;
use gpufleet_proto::v1;

use super::faults::Faults;
use super::journal::{Answer, Journal, TargetPlacement};
use gpufleet_wire::inventory;

pub struct Executor {
    pub name: String,
    pub gpu_type: String,
    pub backend: Arc<dyn GpuBackend>,
    /// The simulated node, when the hardware is simulated (fault injection reaches it only).
    pub sim: Option<Arc<SimulatedNode>>,
    /// `sim-faults.toml` to read before each order; only used with simulated hardware.
    pub faults_file: Option<PathBuf>,
    pub journal: Mutex<Journal>,
    /// How this node's driver changes.
    pub installer: super::driver::Installer,
    /// Held while an order runs: one order at a time per node, even when an order from a
    /// lost connection is still finishing as the next one arrives.
    pub running: Mutex<()>,
    /// This node's Slurm daemons (per Slurm tenant cluster its node is in: munged and
    /// slurmd, and on the cluster's head or backup node its controller and login).
    pub slurm: super::slurm::Slurm,
    /// Where this host mounts the platform's shared storage (None: it mounts no team
    /// volume).
    pub shared_storage: Option<PathBuf>,
    /// This node's own team volumes, made when the control plane has no shared storage.
    pub local_volumes: super::local_volumes::LocalVolumes,
    /// This agent's bandwidth-test listener (None: it takes part in no bandwidth test).
    pub bandwidth: Option<Arc<super::bandwidth::Listener>>,
    /// Runs the medium and long levels' load tests (simulated GPUs, or CUDA).
    pub load: Arc<dyn gpufleet_gpu::load::LoadRunner>,
    /// The highest epoch of the control plane's lease seen: older orders are refused.
    pub fence: super::fence::Fence,
}

/// Why an order failed, in the protocol's classes.
fn kind(e: &HwError) -> &'static str {
    match e {
        HwError::InUse { .. } => "in_use",
        HwError::Rule(_) => "rule",
        _ => "hardware",
    }
}

fn to_target(p: &[Placement]) -> Vec<TargetPlacement> {
    p.iter()
        .map(|p| TargetPlacement {
            profile: p.profile.clone(),
            profile_id: p.profile_id,
            start: p.start,
            size: p.size,
        })
        .collect()
}

fn from_target(p: &[TargetPlacement]) -> Vec<Placement> {
    p.iter()
        .map(|p| Placement {
            profile: p.profile.clone(),
            profile_id: p.profile_id,
            start: p.start,
            size: p.size,
        })
        .collect()
}

impl Executor {
    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node's inventory now (empty GPUs if the hardware cannot be read).
    pub fn inventory(&self) -> Result<v1::NodeInventory, HwError> {
        let mut inv = inventory::read(&*self.backend, &self.gpu_type)?;
        if let super::driver::Installer::Sim(sim) = &self.installer {
            inv.driver_version = sim.version();
            inv.cuda_version = gpufleet_gpu::catalog::newest_cuda_for_driver(&inv.driver_version)
                .unwrap_or_default()
                .to_string();
        }
        Ok(inv)
    }

    fn answer(&self, order_id: &str, a: &Answer, replayed: bool) -> v1::OrderResult {
        v1::OrderResult {
            order_id: order_id.to_string(),
            ok: a.ok,
            error: a.error.clone(),
            error_kind: a.error_kind.clone(),
            inventory: self.inventory().ok(),
            replayed,
            health: a.health.as_ref().map(|h| h.to_report()),
            slurm: None,
        }
    }

    /// An order from a control-plane replica that lost its lease, refused unrun (see
    /// [`super::fence`]); None for one that may run.
    fn stale(&self, order: &v1::WorkOrder) -> Option<v1::OrderResult> {
        let why = self.fence.admit(&order.id, order.epoch).err()?;
        tracing::warn!(order = %order.id, epoch = order.epoch, %why, "refused an order of a stale epoch");
        Some(v1::OrderResult {
            order_id: order.id.clone(),
            ok: false,
            error: why,
            error_kind: gpufleet_wire::protocol_version::STALE_EPOCH.into(),
            inventory: self.inventory().ok(),
            replayed: false,
            health: None,
            slurm: None,
        })
    }

    /// Runs `order`, or replays its answer when this id was answered before; refuses it
    /// unrun when it comes from an older epoch of the control plane's lease than one seen.
    pub fn run(&self, order: &v1::WorkOrder) -> v1::OrderResult {
        let _one_at_a_time = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(refused) = self.stale(order) {
            return refused;
        }
        if let Some(a) = self.journal().get(&order.id).and_then(|e| e.answer.clone()) {
            tracing::info!(order = %order.id, "order already answered; replaying its answer");
            return self.answer(&order.id, &a, true);
        }
        let answer = match &order.kind {
            Some(v1::work_order::Kind::ApplyMigLayout(m)) => match targets(m) {
                Ok(targets) => self.apply(&order.id, &targets),
                Err(e) => refuse(e),
            },
            Some(v1::work_order::Kind::InstallDriver(d)) => {
                self.install_driver(&order.id, &d.version)
            }
            Some(v1::work_order::Kind::RunHealthCheck(h)) => self.health_check(h),
            // Idempotent by nature (started or stopped is checked each time): not journaled.
            Some(v1::work_order::Kind::StartSlurmd(_) | v1::work_order::Kind::StopSlurmd(_)) => {
                return self.slurm_order(order);
            }
            // A question that changes no hardware: see `runs_apart`.
            Some(v1::work_order::Kind::SlurmQuery(_)) => return self.run_apart(order),
            // Declarative like the Slurm orders: not journaled.
            Some(v1::work_order::Kind::SetVolumes(v)) => {
                let outcome =
                    super::volumes::apply(self.shared_storage.as_deref(), &self.local_volumes, v);
                if let Err(e) = &outcome {
                    tracing::warn!(order = %order.id, error = %e, "volume order failed");
                }
                return v1::OrderResult {
                    order_id: order.id.clone(),
                    ok: outcome.is_ok(),
                    error: outcome.err().unwrap_or_default(),
                    error_kind: String::new(),
                    inventory: self.inventory().ok(),
                    replayed: false,
                    health: None,
                    slurm: None,
                };
            }
            None => refuse("order has no kind this agent knows; upgrade the agent".into()),
        };
        let recorded = match &order.kind {
            Some(v1::work_order::Kind::RunHealthCheck(_)) if answer.ok => {
                self.journal().record_check(&order.id, answer.clone())
            }
            _ => self.journal().finish(&order.id, answer.clone()),
        };
        if let Err(e) = recorded {
            tracing::error!(order = %order.id, error = %e, "cannot record the order's answer");
        }
        self.answer(&order.id, &answer, false)
    }

    fn apply(&self, order_id: &str, targets: &[GpuTarget]) -> Answer {
        let fail = |e: String, kind: &str| Answer {
            ok: false,
            error: e,
            error_kind: kind.to_string(),
            health: None,
        };
        let before = match self.backend.gpus() {
            Ok(b) => b,
            Err(e) => return fail(format!("reading the GPUs: {e}"), kind(&e)),
        };
        if let Some((index, _)) = targets
            .iter()
            .find(|(i, _)| !before.iter().any(|g| g.index == *i))
        {
            return fail(format!("GPU {index}: this node has no such GPU"), "rule");
        }
        let journaled = targets
            .iter()
            .map(|(i, t)| (*i, t.as_deref().map(to_target)))
            .collect();
        if let Err(e) = self
            .journal()
            .start(order_id, before.clone(), journaled, None)
        {
            return fail(format!("cannot write the order journal: {e}"), "hardware");
        }
        let faults = match (&self.sim, &self.faults_file) {
            (Some(_), Some(path)) => match Faults::read(path) {
                Ok(f) => f,
                Err(e) => return fail(e, "hardware"),
            },
            _ => Faults::default(),
        };
        let outcome = self.apply_gpus(&before, targets, &faults);
        if let Some(sim) = &self.sim {
            for gpu in &before {
                if faults.in_use(&self.name, gpu.index) {
                    sim.set_gpu_in_use(gpu.index, false);
                }
            }
            // Disarm a create fault that did not fire in this order.
            sim.fail_create_at(u32::MAX, "disarmed");
        }
        match outcome {
            Ok(()) => Answer {
                ok: true,
                error: String::new(),
                error_kind: String::new(),
                health: None,
            },
            Err((gpu, e)) => fail(format!("GPU {gpu}: {e}"), kind(&e)),
        }
    }

    /// Runs the checks of the order's level (and its bandwidth test) and answers with
    /// their verdicts: ok when the checks ran, whatever they found.
    fn health_check(&self, order: &v1::RunHealthCheck) -> Answer {
        let level = match super::health::Level::parse(&order.level) {
            Ok(l) => l,
            Err(e) => return refuse(e),
        };
        if order.expected_driver.len() > 32 {
            return refuse("expected_driver: at most 32 characters".into());
        }
        let layout = match layouts(&order.expected_layout) {
            Ok(l) => l,
            Err(e) => return refuse(format!("expected_layout: {e}")),
        };
        let load = match super::health::load::Settings::from_order(
            order.load_min_fraction,
            order.load_skip_allowed,
            order.burn_seconds,
        ) {
            Ok(s) => s,
            Err(e) => return refuse(e),
        };
        if let Some(test) = &order.bandwidth {
            if let Err(e) = super::bandwidth::validate(test) {
                return refuse(e);
            }
            if self.bandwidth.is_none() && !test.peers.is_empty() {
                return refuse("this agent runs no bandwidth listener".into());
            }
        }
        let fail = |e: String| Answer {
            ok: false,
            error: e,
            error_kind: "hardware".into(),
            health: None,
        };
        let faults = match self.faults() {
            Ok(f) => f,
            Err(e) => return fail(e),
        };
        if let Some(sim) = &self.sim {
            faults.apply_health(&self.name, sim);
            faults.apply_load(&self.name, sim);
        }
        let driver = match faults.wrong_driver(&self.name) {
            Some(v) => Ok(v.to_string()),
            None => self
                .installer
                .reported(&*self.backend)
                .map_err(|e| e.to_string()),
        };
        let expected = Some(order.expected_driver.as_str()).filter(|d| !d.is_empty());
        let plan = super::health::Plan {
            level,
            driver,
            expected_driver: expected,
            expected_layout: &layout,
            simulated: self.sim.is_some(),
        };
        let mut checks = super::health::run(&*self.backend, &self.gpu_type, &plan);
        checks.extend(super::health::load::run(
            level,
            &load,
            &*self.load,
            &*self.backend,
            gpufleet_gpu::catalog::model(&self.gpu_type),
            super::health::load::fresh_seed(),
        ));
        if let Some(test) = &order.bandwidth {
            if let Some(listener) = &self.bandwidth {
                listener.arm(&test.token, super::bandwidth::arm_for(test));
            }
            checks.extend(super::bandwidth::run_test(
                test,
                faults.slow_network(&self.name),
            ));
        }
        Answer {
            ok: true,
            error: String::new(),
            error_kind: String::new(),
            health: Some((&super::health::report(level, checks)).into()),
        }
    }

    fn faults(&self) -> Result<Faults, String> {
        match (&self.sim, &self.faults_file) {
            (Some(_), Some(path)) => Faults::read(path),
            _ => Ok(Faults::default()),
        }
    }

    /// Installs a driver, verifies the version the node then reports, and runs the quick
    /// health check on every GPU.
    fn install_driver(&self, order_id: &str, version: &str) -> Answer {
        let fail = |e: String| Answer {
            ok: false,
            error: e,
            error_kind: "driver".into(),
            health: None,
        };
        if !super::driver::valid_version(version) {
            return refuse("driver version: dotted numbers, e.g. 550.54.15".into());
        }
        let before = match self.backend.gpus() {
            Ok(b) => b,
            Err(e) => return fail(format!("reading the GPUs: {e}")),
        };
        if let Err(e) =
            self.journal()
                .start(order_id, before, Vec::new(), Some(version.to_string()))
        {
            return fail(format!("cannot write the order journal: {e}"));
        }
        let faults = match self.faults() {
            Ok(f) => f,
            Err(e) => return fail(e),
        };
        if let Err(e) = self.installer.install(version, &faults, &self.name) {
            return fail(e);
        }
        match self.installer.reported(&*self.backend) {
            Ok(now) if now == version => {}
            Ok(now) => {
                return fail(format!(
                    "after installing driver {version} the node reports {now}"
                ))
            }
            Err(e) => return fail(format!("reading the driver version after the install: {e}")),
        }
        let gpus = match self.backend.gpus() {
            Ok(g) => g,
            Err(e) => return fail(format!("reading the GPUs after the install: {e}")),
        };
        for g in gpus {
            match self.backend.health(g.index) {
                Ok(h) if h.healthy => {}
                Ok(h) => {
                    return fail(format!(
                        "GPU {}: the quick health check failed after the install: {}",
                        g.index,
                        h.findings.join("; ")
                    ))
                }
                Err(e) => return fail(format!("GPU {}: health: {e}", g.index)),
            }
        }
        Answer {
            ok: true,
            error: String::new(),
            error_kind: String::new(),
            health: None,
        }
    }

    /// Every listed GPU to its target; on a failure the GPUs already changed are put back.
    fn apply_gpus(
        &self,
        before: &[GpuInfo],
        targets: &[GpuTarget],
        faults: &Faults,
    ) -> Result<(), (u32, HwError)> {
        let backend = &*self.backend;
        let mut creates = 0u32;
        let mut changed: Vec<&GpuInfo> = Vec::new();
        for gpu in before {
            let Some((_, target)) = targets.iter().find(|(i, _)| *i == gpu.index) else {
                continue;
            };
            if let Some(sim) = &self.sim {
                if faults.in_use(&self.name, gpu.index) {
                    sim.set_gpu_in_use(gpu.index, true);
                }
            }
            let result = match target {
                Some(p) => {
                    let new = p
                        .iter()
                        .filter(|pl| {
                            !gpu.instances
                                .iter()
                                .any(|i| (i.profile_id, i.start) == (pl.profile_id, pl.start))
                        })
                        .count() as u32;
                    if let (Some(limit), Some(sim)) = (faults.fail_create_after, &self.sim) {
                        if creates + new > limit {
                            sim.fail_create_at(
                                limit - creates + 1,
                                "sim-faults.toml: fail_create_after",
                            );
                        }
                    }
                    apply_layout(backend, gpu.index, p).map(|_| new)
                }
                None => clear_layout(backend, gpu.index).map(|_| 0),
            };
            match result {
                Ok(new) => {
                    creates += new;
                    changed.push(gpu);
                }
                Err(e) => {
                    for prior in changed.iter().rev() {
                        restore(backend, prior);
                    }
                    return Err((gpu.index, e));
                }
            }
        }
        Ok(())
    }

    /// Settles orders that a crash cut short: an order whose targets the hardware already
    /// shows succeeded; any other is rolled back to the GPUs before it and failed. Either
    /// way it is answered now, so a re-sent order is replayed, not run again.
    pub fn recover(&self) {
        let _one_at_a_time = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let open = self.journal().unanswered();
        for (id, entry) in open {
            if let Some(version) = &entry.driver {
                let reached = self
                    .installer
                    .reported(&*self.backend)
                    .is_ok_and(|now| &now == version);
                let answer = Answer {
                    ok: reached,
                    error: if reached {
                        String::new()
                    } else {
                        format!(
                            "the node agent stopped in the middle of installing driver {version}"
                        )
                    },
                    error_kind: if reached {
                        String::new()
                    } else {
                        "interrupted".into()
                    },
                    health: None,
                };
                if let Err(e) = self.journal().finish(&id, answer) {
                    tracing::error!(order = %id, error = %e, "cannot record the order's answer");
                }
                continue;
            }
            let reached = self.backend.gpus().is_ok_and(|gpus| {
                entry.target.iter().all(|(index, t)| {
                    let t = t.as_deref().map(from_target);
                    gpus.iter()
                        .find(|g| g.index == *index)
                        .is_some_and(|g| inventory::gpu_matches(g, t.as_deref()))
                })
            });
            let answer = if reached {
                Answer {
                    ok: true,
                    error: String::new(),
                    error_kind: String::new(),
                    health: None,
                }
            } else {
                for gpu in &entry.before {
                    restore(&*self.backend, gpu);
                }
                Answer {
                    ok: false,
                    error: "the node agent stopped in the middle of this order; its GPUs were put back as they were before it".into(),
                    error_kind: "interrupted".into(),
                    health: None,
                }
            };
            tracing::warn!(order = %id, ok = answer.ok, "settled an order interrupted by a restart");
            if let Err(e) = self.journal().finish(&id, answer) {
                tracing::error!(order = %id, error = %e, "cannot record the order's answer");
            }
        }
        // The Slurm daemons this node ran before the restart are not started again here:
        // the agent reports them at registration, and the control plane orders each one
        // started with its cluster's current config, or stopped and removed when the node
        // is no longer that cluster's (it was replaced meanwhile).
    }
}

fn refuse(e: String) -> Answer {
    Answer {
        ok: false,
        error: e,
        error_kind: "rule".into(),
        health: None,
    }
}

/// One GPU's target: placements, or None for a whole GPU.
type GpuTarget = (u32, Option<Vec<Placement>>);

/// Recorded layouts of a health check, every number checked.
fn layouts(l: &[v1::GpuLayout]) -> Result<Vec<GpuTarget>, String> {
    targets(&v1::ApplyMigLayout { gpus: l.to_vec() })
}

/// The order's per-GPU targets, every number checked.
fn targets(m: &v1::ApplyMigLayout) -> Result<Vec<GpuTarget>, String> {
    let mut out: Vec<GpuTarget> = Vec::with_capacity(m.gpus.len());
    for g in &m.gpus {
        if out.iter().any(|(i, _)| *i == g.index) {
            return Err(format!("GPU {} is listed twice in the order", g.index));
        }
        let target = if g.whole_gpu {
            None
        } else {
            Some(
                g.placements
                    .iter()
                    .map(inventory::placement)
                    .collect::<Result<Vec<_>, _>>()?,
            )
        };
        out.push((g.index, target));
    }
    Ok(out)
}

/// Puts one GPU back to a recorded state (best effort, logged).
fn restore(backend: &dyn GpuBackend, gpu: &GpuInfo) {
    let result = if gpu.mig_enabled {
        apply_layout(backend, gpu.index, &inventory::placements_of(gpu)).map(|_| ())
    } else {
        clear_layout(backend, gpu.index)
    };
    if let Err(e) = result {
        tracing::error!(gpu = gpu.index, error = %e, "rollback of a MIG change failed");
    }
}

impl Executor {
    /// Runs a StartSlurmd or StopSlurmd order and answers it with the node's state.
    fn slurm_order(&self, order: &v1::WorkOrder) -> v1::OrderResult {
        let outcome = match &order.kind {
            Some(v1::work_order::Kind::StartSlurmd(s)) => self
                .backend
                .gpus()
                .map_err(|e| format!("reading the GPUs: {e}"))
                .and_then(|gpus| self.slurm.start(s, &gpus)),
            Some(v1::work_order::Kind::StopSlurmd(s)) => {
                self.slurm.stop(&s.cluster).map(|()| String::new())
            }
            _ => Err("not a Slurm order".into()),
        };
        match &outcome {
            Ok(gres) if !gres.is_empty() => {
                tracing::info!(order = %order.id, %gres, "slurmd runs with these GRES")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(order = %order.id, error = %e, "Slurm order failed"),
        }
        v1::OrderResult {
            order_id: order.id.clone(),
            ok: outcome.is_ok(),
            error: outcome.clone().err().unwrap_or_default(),
            error_kind: if outcome.is_ok() { "" } else { "slurm" }.into(),
            inventory: self.inventory().ok(),
            replayed: false,
            health: None,
            slurm: None,
        }
    }

    /// Whether `order` runs at once, beside whatever order is in progress, rather than in
    /// turn: a question to a Slurm controller (it changes nothing on this node, and the
    /// control plane asks one every few seconds, which must not wait behind an hour-long
    /// health check).
    pub fn runs_apart(order: &v1::WorkOrder) -> bool {
        matches!(order.kind, Some(v1::work_order::Kind::SlurmQuery(_)))
    }

    /// Runs an order of [`Executor::runs_apart`] and answers it (not journaled: it is
    /// asked again rather than replayed).
    pub fn run_apart(&self, order: &v1::WorkOrder) -> v1::OrderResult {
        if let Some(refused) = self.stale(order) {
            return refused;
        }
        let outcome = match &order.kind {
            Some(v1::work_order::Kind::SlurmQuery(q)) => self.slurm.query(q),
            _ => Err("not an order that runs apart".into()),
        };
        if let Err(e) = &outcome {
            tracing::debug!(order = %order.id, error = %e, "Slurm query failed");
        }
        let (slurm, error) = match outcome {
            Ok(answer) => (Some(answer), String::new()),
            Err(e) => (None, e),
        };
        v1::OrderResult {
            order_id: order.id.clone(),
            ok: error.is_empty(),
            error_kind: if error.is_empty() { "" } else { "slurm" }.into(),
            error,
            inventory: None,
            replayed: false,
            health: None,
            slurm,
        }
    }
}
