//! The load tests of a level, and their judging: whatever ran them (simulated GPUs or
//! CUDA, [`LoadRunner`]), every figure is held to the model's own expected figure
//! ([`gpufleet_gpu::figures`]) times a fraction, and fails naming the figure, what was
//! measured and what was expected.
//!
//! - `quick`: no load test (reads only).
//! - `medium`: per GPU (or MIG slice): `gpu_memory` (half the free memory, walking ones
//!   and zeros and one random pattern), `gpu_burn` (10 s of GEMMs, bf16 where the model
//!   has it, every result compared with the first), `hbm_bandwidth`, `host_bandwidth`,
//!   and the GPU read during and after the burn (`under_load:*`: temperature, throttle
//!   reasons, XIDs, uncorrected ECC, remapped rows).
//! - `long`: the same for minutes (85% of the free memory, four random patterns, a
//!   120 s burn), and `nccl_all_reduce` across the node's whole GPUs when it has two or
//!   more.
//!
//! A test this host cannot run (no CUDA library, a driver too old, too little free
//! memory) is never a silent pass: it fails with "not run: <why>", unless
//! the order says the node's fleet group lets the host skip load tests
//! (`load_skip_allowed`); then it is "not_run" with the same reason. A test that does not
//! apply (an all-reduce on a node with one whole GPU) is "not_run" either way.

use std::time::Duration;

use gpufleet_gpu::catalog::GpuModel;
use gpufleet_gpu::figures::{self, Figure, ModelFigures};
use gpufleet_gpu::hardware::{GpuBackend, GpuInfo, GpuReadings};
use gpufleet_gpu::load::{LoadPlan, LoadRunner, Target};
use gpufleet_proto::v1::CheckResult;

use super::checks::{self, result, FAIL, NOT_RUN, PASS, WARN};
use super::Level;

/// How the load tests are judged and how long they run, from the order.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// A figure below this share of the expected one fails (0 < f <= 1).
    pub min_fraction: f64,
    /// Tests this host cannot run are "not_run" instead of failures.
    pub skip_allowed: bool,
    /// The burn's duration instead of the level's default.
    pub burn: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            min_fraction: figures::DEFAULT_MIN_FRACTION,
            skip_allowed: false,
            burn: None,
        }
    }
}

impl Settings {
    /// From the order's fields (0: the default), refused when out of bounds.
    pub fn from_order(
        min_fraction: f64,
        skip_allowed: bool,
        burn_seconds: u32,
    ) -> Result<Self, String> {
        if !min_fraction.is_finite() || !(0.0..=1.0).contains(&min_fraction) {
            return Err(format!(
                "load_min_fraction: must be between 0 and 1 (got {min_fraction})"
            ));
        }
        if Duration::from_secs(u64::from(burn_seconds)) > gpufleet_gpu::load::MAX_BURN {
            return Err(format!(
                "burn_seconds: at most {} (got {burn_seconds})",
                gpufleet_gpu::load::MAX_BURN.as_secs()
            ));
        }
        Ok(Self {
            min_fraction: if min_fraction == 0.0 {
                figures::DEFAULT_MIN_FRACTION
            } else {
                min_fraction
            },
            skip_allowed,
            burn: (burn_seconds > 0).then(|| Duration::from_secs(u64::from(burn_seconds))),
        })
    }
}

/// How often a GPU is read during its burn.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Default burn of each level.
pub const MEDIUM_BURN: Duration = Duration::from_secs(10);
pub const LONG_BURN: Duration = Duration::from_secs(120);

/// The level's load plan; None for `quick` (reads only).
pub fn plan(level: Level, settings: &Settings, seed: u64) -> Option<LoadPlan> {
    let p = match level {
        Level::Quick => return None,
        Level::Medium => LoadPlan {
            memory_fraction: 0.5,
            memory_passes: 1,
            burn: settings.burn.unwrap_or(MEDIUM_BURN),
            bandwidth_bytes: 2 << 30,
            seed,
        },
        Level::Long => LoadPlan {
            memory_fraction: 0.85,
            memory_passes: 4,
            burn: settings.burn.unwrap_or(LONG_BURN),
            bandwidth_bytes: 8 << 30,
            seed,
        },
    };
    Some(p.bounded())
}

/// The names of a level's load tests.
pub fn names(level: Level) -> &'static [&'static str] {
    match level {
        Level::Quick => &[],
        Level::Medium => &["gpu_memory", "gpu_burn", "hbm_bandwidth", "host_bandwidth"],
        Level::Long => &[
            "gpu_memory",
            "gpu_burn",
            "hbm_bandwidth",
            "host_bandwidth",
            "nccl_all_reduce",
        ],
    }
}

/// A test that could not run on this host: a failure unless the fleet group allows the
/// host to skip load tests. The value carries why (a quarantine reason quotes values).
fn cannot_run(name: &str, uuid: &str, why: &str, settings: &Settings) -> CheckResult {
    let why = why.strip_prefix("not run: ").unwrap_or(why);
    let short: String = why.chars().take(100).collect();
    let value = format!("not run: {short}");
    if settings.skip_allowed {
        result(
            name,
            uuid,
            NOT_RUN,
            value,
            "the test runs",
            format!("not run: {why} (the node's fleet group allows this host to skip load tests)"),
        )
    } else {
        result(
            name,
            uuid,
            FAIL,
            value,
            "the test runs",
            format!("not run: {why}; a level that needs load tests fails unless the node's fleet group sets load_test_skip = true"),
        )
    }
}

/// A test's error: "not run: ..." is a host that cannot run it; anything else is the GPU
/// failing under the test.
fn errored(name: &str, t: &Target, why: &str, settings: &Settings) -> CheckResult {
    if why.starts_with("not run: ") {
        cannot_run(name, &t.uuid, why, settings)
    } else {
        result(
            name,
            &t.uuid,
            FAIL,
            "error",
            "the test completes",
            format!("{}: {name} failed: {why}", t.label()),
        )
    }
}

/// `share` of a figure (a MIG slice's part of its GPU's).
fn share_of(f: Figure, share: f64) -> Figure {
    Figure {
        expected: f.expected * share,
        ..f
    }
}

/// A measured figure against the expected one: below the fraction fails, naming the
/// figure, the measured and the expected value.
pub fn judge(
    name: &str,
    t: &Target,
    what: &str,
    measured: f64,
    expected: Figure,
    unit: &str,
    settings: &Settings,
) -> CheckResult {
    let want = expected.expected;
    let min = want * settings.min_fraction;
    let threshold = format!(
        ">= {min:.1} {unit} ({:.2} of the expected {want:.1}, {})",
        settings.min_fraction,
        expected.source.as_str()
    );
    let ratio = if want > 0.0 { measured / want } else { 0.0 };
    if measured >= min {
        result(
            name,
            &t.uuid,
            PASS,
            format!("{measured:.1} {unit}"),
            threshold,
            format!(
                "{}: {what} {measured:.1} {unit}, {ratio:.2} of the expected {want:.1}",
                t.label()
            ),
        )
    } else {
        result(
            name,
            &t.uuid,
            FAIL,
            format!("{measured:.1} {unit}"),
            threshold,
            format!(
                "{}: {what} measured {measured:.1} {unit}, expected {want:.1} {unit} ({} figure); {ratio:.2} of it is below {:.2}: the GPU is slow (throttled, degraded memory or link)",
                t.label(),
                expected.source.as_str(),
                settings.min_fraction
            ),
        )
    }
}

/// The GPUs and MIG slices the load tests run on.
pub fn targets(gpus: &[GpuInfo]) -> Vec<Target> {
    let mut out = Vec::new();
    for g in gpus {
        if g.mig_enabled {
            out.extend(g.instances.iter().map(|i| Target {
                gpu: g.index,
                uuid: i.uuid.clone(),
                profile: Some(i.profile.clone()),
                memory_mib: i.memory_mib,
            }));
        } else {
            out.push(Target {
                gpu: g.index,
                uuid: g.uuid.clone(),
                profile: None,
                memory_mib: g.memory_mib,
            });
        }
    }
    out
}

/// What was read from a GPU while it burned: the worst of every sample.
#[derive(Debug, Default)]
struct UnderLoad {
    samples: u32,
    max_temperature: Option<u32>,
    max_power_mw: Option<u32>,
    /// The narrowest, then slowest, PCIe link read under load.
    worst_link: Option<gpufleet_gpu::hardware::PcieLink>,
    /// The lowest SM clock read under load, and the GPU's maximum.
    min_sm_clock: Option<u32>,
    max_sm_clock: Option<u32>,
    throttle: u64,
    xids: Vec<u64>,
}

impl UnderLoad {
    fn sample(&mut self, r: &GpuReadings) {
        self.samples += 1;
        if let Ok(t) = r.temperature_c {
            self.max_temperature = Some(self.max_temperature.unwrap_or(0).max(t));
        }
        if let Ok(p) = r.power_mw {
            self.max_power_mw = Some(self.max_power_mw.unwrap_or(0).max(p));
        }
        if let Ok(bits) = r.throttle_reasons {
            self.throttle |= bits;
        }
        if let Ok(l) = r.pcie {
            let worse = |a: &gpufleet_gpu::hardware::PcieLink| (a.width, a.gen);
            if self
                .worst_link
                .as_ref()
                .is_none_or(|w| worse(&l) < worse(w))
            {
                self.worst_link = Some(l);
            }
        }
        if let Ok(c) = r.sm_clock_mhz {
            self.min_sm_clock = Some(self.min_sm_clock.unwrap_or(u32::MAX).min(c));
        }
        if let Ok(m) = r.max_sm_clock_mhz {
            self.max_sm_clock = Some(m);
        }
        if let Ok(x) = &r.xids {
            self.xids.extend(x);
        }
    }

    /// The checks of the GPU under load: the readings after the burn with the worst
    /// temperature, throttle reasons and every XID seen during it; ECC errors and
    /// remapped rows count only when they grew during the load (a standing count is the
    /// read-only checks' to judge).
    fn checks(
        mut self,
        before: Option<&GpuReadings>,
        after: GpuReadings,
        t: &Target,
    ) -> Vec<CheckResult> {
        let mut r = after;
        if let Ok(x) = &r.xids {
            self.xids.extend(x);
        }
        if let Some(t) = self.max_temperature {
            r.temperature_c = Ok(t);
        }
        if self.samples > 0 {
            r.throttle_reasons = r.throttle_reasons.map(|b| b | self.throttle);
        }
        r.xids = Ok(std::mem::take(&mut self.xids));
        let mut out = vec![
            checks::temperature(&r),
            checks::throttle(&r),
            checks::xid(&r),
            grown_errors(before, &r),
            self.clocks(&r),
            self.link(before, &r),
        ];
        let power = self
            .max_power_mw
            .map(|p| format!("; peak power {:.0} W", f64::from(p) / 1000.0))
            .unwrap_or_default();
        for c in &mut out {
            c.name = format!("under_load:{}", c.name);
            c.gpu_uuid = t.uuid.clone();
            c.detail = format!(
                "{} ({} reading(s) during the burn{power})",
                c.detail, self.samples
            );
        }
        out
    }
}

impl UnderLoad {
    /// The worst PCIe link under load against the maximum: fewer lanes fail; a lower
    /// generation warns (a compute burn moves little over PCIe and the link may idle down;
    /// `host_bandwidth` judges the speed). A link already too narrow at rest, and no worse
    /// under load, is the read-only `pcie_link` check's to fail, not this one's again.
    fn link(&self, before: Option<&GpuReadings>, r: &GpuReadings) -> CheckResult {
        let Some(l) = self.worst_link.or_else(|| r.pcie.as_ref().ok().copied()) else {
            return result(
                "pcie_link",
                &r.uuid,
                NOT_RUN,
                "not read",
                "the maximum link",
                format!("GPU {}: the PCIe link was not read under load", r.index),
            );
        };
        let (value, threshold) = (
            format!("Gen{} x{}", l.gen, l.width),
            format!("Gen{} x{}", l.max_gen, l.max_width),
        );
        let failed_at_rest = before
            .and_then(|b| b.pcie.as_ref().ok())
            .is_some_and(|b| b.width < b.max_width && (b.width, b.gen) == (l.width, l.gen));
        if failed_at_rest {
            result(
                "pcie_link",
                &r.uuid,
                PASS,
                value,
                threshold,
                format!(
                    "GPU {}: the PCIe link under load is the one at rest (Gen{} x{}): the pcie_link check judges it",
                    r.index, l.gen, l.width
                ),
            )
        } else if l.width < l.max_width {
            result(
                "pcie_link",
                &r.uuid,
                FAIL,
                value,
                threshold,
                format!(
                    "GPU {}: under load the PCIe link dropped to x{} of x{} lanes: reseat the GPU or its riser, or service the slot",
                    r.index, l.width, l.max_width
                ),
            )
        } else if l.gen < l.max_gen {
            // A compute burn moves little over PCIe, and an idle link may lower its
            // generation; host_bandwidth is what judges the link's speed.
            result(
                "pcie_link",
                &r.uuid,
                WARN,
                value,
                threshold,
                format!(
                    "GPU {}: during the burn the PCIe link ran Gen{} of Gen{} (a link without traffic may lower it; host_bandwidth judges its speed)",
                    r.index, l.gen, l.max_gen
                ),
            )
        } else {
            result(
                "pcie_link",
                &r.uuid,
                PASS,
                value,
                threshold,
                format!("GPU {}: the PCIe link held its maximum under load", r.index),
            )
        }
    }

    /// The lowest SM clock under load against the maximum, reported (the throttle
    /// reasons and the burn's TFLOP/s are what fail a GPU held down).
    fn clocks(&self, r: &GpuReadings) -> CheckResult {
        match (self.min_sm_clock, self.max_sm_clock) {
            (Some(low), Some(max)) => result(
                "clocks",
                &r.uuid,
                PASS,
                format!("SM {low} MHz"),
                "reported only",
                format!(
                    "GPU {}: lowest SM clock under load {low} MHz of its maximum {max} MHz",
                    r.index
                ),
            ),
            _ => result(
                "clocks",
                &r.uuid,
                NOT_RUN,
                "not read",
                "reported only",
                format!(
                    "GPU {}: SM clocks not read under load: {}",
                    r.index,
                    r.sm_clock_mhz.as_ref().err().cloned().unwrap_or_default()
                ),
            ),
        }
    }
}

/// Uncorrected ECC errors and remapped rows that appeared while the GPU was loaded.
fn grown_errors(before: Option<&GpuReadings>, after: &GpuReadings) -> CheckResult {
    use gpufleet_gpu::hardware::RowRemap;
    let name = "memory_errors";
    let threshold = "no new uncorrected ECC error or remapped row";
    let (Some(before), Ok(now)) = (before, &after.ecc) else {
        return result(
            name,
            &after.uuid,
            NOT_RUN,
            "not read",
            threshold,
            format!(
                "GPU {}: ECC counters not read before and after the load",
                after.index
            ),
        );
    };
    let was = before
        .ecc
        .as_ref()
        .map(|e| e.volatile_uncorrected)
        .unwrap_or(0);
    let ecc = now.volatile_uncorrected.saturating_sub(was);
    let rows = |r: &RowRemap| match r {
        RowRemap::Counts {
            uncorrectable,
            pending,
            failure,
            ..
        } => (u64::from(*uncorrectable), *pending, *failure),
        _ => (0, false, false),
    };
    let (u0, p0, f0) = rows(&before.remapped_rows);
    let (u1, p1, f1) = rows(&after.remapped_rows);
    let new_rows = u1.saturating_sub(u0);
    let mut found = Vec::new();
    if ecc > 0 {
        found.push(format!("{ecc} new uncorrected ECC error(s)"));
    }
    if new_rows > 0 {
        found.push(format!(
            "{new_rows} row(s) remapped for uncorrectable errors"
        ));
    }
    if p1 && !p0 {
        found.push("a row remapping now waits for a GPU reset".into());
    }
    if f1 && !f0 {
        found.push("a row remapping failed".into());
    }
    if found.is_empty() {
        result(
            name,
            &after.uuid,
            PASS,
            "none new",
            threshold,
            format!("GPU {}: no memory error appeared under load", after.index),
        )
    } else {
        result(
            name,
            &after.uuid,
            FAIL,
            found.join(", "),
            threshold,
            format!(
                "GPU {}: under load: {}; drain the node and reset or service the GPU",
                after.index,
                found.join("; ")
            ),
        )
    }
}

/// A seed for this run's patterns and operands (reported in the results).
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// Runs and judges the level's load tests on the node's GPUs and MIG slices, all of
/// them at once (one thread each), so a node's long level takes what one GPU's takes;
/// only the host links are measured one at a time (they share PCIe switches).
pub fn run(
    level: Level,
    settings: &Settings,
    runner: &dyn LoadRunner,
    backend: &dyn GpuBackend,
    model: Option<&GpuModel>,
    seed: u64,
) -> Vec<CheckResult> {
    let Some(plan) = plan(level, settings, seed) else {
        return Vec::new();
    };
    let node_wide = |why: &str| -> Vec<CheckResult> {
        names(level)
            .iter()
            .map(|n| cannot_run(n, "", why, settings))
            .collect()
    };
    if let Some(why) = runner.unavailable() {
        return node_wide(&why);
    }
    let Some((model, figures)) = model.and_then(|m| Some((m, figures::for_model(&m.name)?))) else {
        return node_wide("the node's GPU model has no expected figures in the catalog");
    };
    let gpus = match backend.gpus() {
        Ok(g) => g,
        Err(e) => return node_wide(&format!("the GPUs cannot be listed: {e}")),
    };
    let targets = targets(&gpus);
    let shared = Shared {
        plan: &plan,
        settings,
        runner,
        backend,
        model,
        figures: &figures,
        host_link: std::sync::Mutex::new(()),
    };
    let mut out: Vec<CheckResult> = std::thread::scope(|scope| {
        let running: Vec<_> = targets
            .iter()
            .map(|t| {
                let shared = &shared;
                scope.spawn(move || one_target(t, shared))
            })
            .collect();
        running
            .into_iter()
            .zip(&targets)
            .flat_map(|(r, t)| {
                r.join().unwrap_or_else(|_| {
                    vec![result(
                        "gpu_burn",
                        &t.uuid,
                        FAIL,
                        "error",
                        "the test completes",
                        format!("{}: the load tests stopped unexpectedly", t.label()),
                    )]
                })
            })
            .collect()
    });
    if level >= Level::Long {
        out.push(all_reduce(
            &gpus, &targets, &plan, settings, runner, backend, &figures,
        ));
        // nccl-tests too, where installed, on real GPUs only (the simulator has no NCCL).
        let whole = targets.iter().filter(|t| t.profile.is_none()).count() as u32;
        if runner.kind() == "cuda" && whole >= 2 {
            let nvlink = backend
                .readings(0)
                .map(|r| r.nvlink.map(|l| l.links > 0).unwrap_or(false))
                .unwrap_or(false);
            out.push(all_reduce_perf(
                super::nccl_tests::run(whole),
                whole,
                figures::all_reduce_gbps(&figures, nvlink),
                settings,
            ));
        }
    }
    out
}

/// What every target's tests share.
struct Shared<'a> {
    plan: &'a LoadPlan,
    settings: &'a Settings,
    runner: &'a dyn LoadRunner,
    backend: &'a dyn GpuBackend,
    model: &'a GpuModel,
    figures: &'a ModelFigures,
    /// Held while a host link is measured: GPUs share PCIe switches and the root complex
    /// (two per switch on HGX boards), so measured together each would see a share.
    host_link: std::sync::Mutex<()>,
}

fn one_target(t: &Target, shared: &Shared) -> Vec<CheckResult> {
    let Shared {
        plan,
        settings,
        runner,
        backend,
        model,
        figures: f,
        ..
    } = *shared;
    let (compute, memory) = t
        .profile
        .as_deref()
        .and_then(|p| model.profile(p))
        .map(figures::slice_share)
        .unwrap_or((1.0, 1.0));
    let mut out = Vec::new();
    out.push(match runner.memory(t, plan) {
        Ok(m) if m.mismatches == 0 => result(
            "gpu_memory",
            &t.uuid,
            PASS,
            "0 mismatches",
            "0",
            format!(
                "{}: {:.1} GiB written and verified with {} ({} words checked)",
                t.label(),
                m.bytes as f64 / f64::from(1u32 << 30),
                m.patterns.join(", "),
                m.words_checked
            ),
        ),
        Ok(m) => result(
            "gpu_memory",
            &t.uuid,
            FAIL,
            format!("{} mismatches", m.mismatches),
            "0",
            format!(
                "{}: {} of {} words read back differently from what was written ({}): the GPU's memory corrupts data; take it out of service",
                t.label(),
                m.mismatches,
                m.words_checked,
                m.patterns.join(", ")
            ),
        ),
        Err(e) => errored("gpu_memory", t, &e, settings),
    });
    let dtype = f.burn_dtype();
    let before = backend.readings(t.gpu).ok();
    let mut under = UnderLoad::default();
    // Read at most every SAMPLE_EVERY (a burn round can be a few milliseconds; NVML
    // serialises its callers), the first round always.
    let mut last: Option<std::time::Instant> = None;
    let burn = runner.burn(t, dtype, plan, &mut || {
        if last.is_some_and(|l| l.elapsed() < SAMPLE_EVERY) {
            return;
        }
        last = Some(std::time::Instant::now());
        if let Ok(r) = backend.readings(t.gpu) {
            under.sample(&r);
        }
    });
    let expected = f.tflops(dtype).unwrap_or(f.fp16_tflops);
    match burn {
        Ok(b) if b.corrupted > 0 => out.push(result(
            "gpu_burn",
            &t.uuid,
            FAIL,
            format!("{} of {} results differ", b.corrupted, b.compared),
            "0 results differ",
            format!(
                "{}: {} of {} {} GEMM results ({}³) differed from the first on the same operands: silent corruption under load; take the GPU out of service",
                t.label(),
                b.corrupted,
                b.compared,
                b.dtype.as_str(),
                b.n
            ),
        )),
        Ok(b) => out.push(judge(
            "gpu_burn",
            t,
            &format!(
                "{} GEMM {}³ over {:.1} s ({} results identical)",
                b.dtype.as_str(),
                b.n,
                b.seconds,
                b.compared
            ),
            b.tflops,
            share_of(expected, compute),
            "TFLOP/s",
            settings,
        )),
        Err(e) => out.push(errored("gpu_burn", t, &e, settings)),
    }
    match backend.readings(t.gpu) {
        Ok(after) => out.extend(under.checks(before.as_ref(), after, t)),
        Err(e) => out.push(result(
            "under_load:gpu_readable",
            &t.uuid,
            FAIL,
            "unreadable",
            "readable",
            format!("{}: cannot be read after the burn: {e}", t.label()),
        )),
    }
    out.push(match runner.memory_copy(t, plan) {
        Ok(g) => judge(
            "hbm_bandwidth",
            t,
            "device memory copy (read + write)",
            g,
            share_of(f.memory_copy_gbps, memory),
            "GB/s",
            settings,
        ),
        Err(e) => errored("hbm_bandwidth", t, &e, settings),
    });
    let link = {
        let _alone = shared.host_link.lock().unwrap_or_else(|p| p.into_inner());
        runner.host_link(t, plan)
    };
    match link {
        Ok((h2d, d2h)) => {
            let mut up = judge(
                "host_bandwidth",
                t,
                &format!("pinned host→device over {}", f.host_link),
                h2d,
                f.host_link_gbps,
                "GB/s",
                settings,
            );
            let down = judge(
                "host_bandwidth",
                t,
                "device→host",
                d2h,
                f.host_link_gbps,
                "GB/s",
                settings,
            );
            if down.verdict == FAIL {
                up.verdict = FAIL.into();
            }
            up.value = format!("{h2d:.1} / {d2h:.1} GB/s");
            up.detail = format!("{}; {}", up.detail, down.detail);
            out.push(up);
        }
        Err(e) => out.push(errored("host_bandwidth", t, &e, settings)),
    }
    out
}

fn all_reduce(
    gpus: &[GpuInfo],
    targets: &[Target],
    plan: &LoadPlan,
    settings: &Settings,
    runner: &dyn LoadRunner,
    backend: &dyn GpuBackend,
    f: &ModelFigures,
) -> CheckResult {
    let whole: Vec<Target> = targets
        .iter()
        .filter(|t| t.profile.is_none())
        .cloned()
        .collect();
    if whole.len() < 2 {
        return result(
            "nccl_all_reduce",
            "",
            NOT_RUN,
            "not applicable",
            "two or more whole GPUs",
            format!(
                "not run: the node has {} whole GPU(s) of {}; an all-reduce within the node needs two",
                whole.len(),
                gpus.len()
            ),
        );
    }
    let nvlink = backend
        .readings(whole[0].gpu)
        .map(|r| r.nvlink.map(|l| l.links > 0).unwrap_or(false))
        .unwrap_or(false);
    let expected = figures::all_reduce_gbps(f, nvlink);
    let node = Target {
        gpu: whole[0].gpu,
        uuid: String::new(),
        profile: None,
        memory_mib: 0,
    };
    match runner.all_reduce(&whole, plan) {
        Ok(r) => {
            let mut c = judge(
                "nccl_all_reduce",
                &node,
                &format!(
                    "all-reduce bus bandwidth across {} GPUs ({} MiB, over {})",
                    r.gpus,
                    r.bytes >> 20,
                    if nvlink { "NVLink" } else { "PCIe" }
                ),
                r.bus_gbps,
                expected,
                "GB/s",
                settings,
            );
            c.detail = c
                .detail
                .replacen(&format!("GPU {}", node.gpu), "the node", 1);
            c
        }
        Err(e) => errored("nccl_all_reduce", &node, &e, settings),
    }
}

/// nccl-tests' run judged: not installed is "not run" (the agent's own all-reduce
/// measured the node); wrong values fail; the average bus bandwidth is held to the
/// model's all-reduce figure.
fn all_reduce_perf(
    run: super::nccl_tests::Run,
    gpus: u32,
    expected: Figure,
    settings: &Settings,
) -> CheckResult {
    use super::nccl_tests::Run;
    const NAME: &str = "all_reduce_perf";
    let s = match run {
        Run::NotInstalled => {
            return result(
                NAME,
                "",
                NOT_RUN,
                "not run",
                "installed",
                "not run: all_reduce_perf (nccl-tests) is not on this host's PATH; the agent's own nccl_all_reduce measured the node",
            )
        }
        Run::Failed(why) => return result(NAME, "", FAIL, "error", "the test completes", why),
        Run::Ran(s) => s,
    };
    if s.out_of_bounds > 0 {
        return result(
            NAME,
            "",
            FAIL,
            format!("{} wrong values", s.out_of_bounds),
            "0 wrong values",
            format!(
                "all_reduce_perf across {gpus} GPUs: {} values out of bounds (wrong results)",
                s.out_of_bounds
            ),
        );
    }
    let node = Target {
        gpu: 0,
        uuid: String::new(),
        profile: None,
        memory_mib: 0,
    };
    let mut c = judge(
        NAME,
        &node,
        &format!("nccl-tests average all-reduce bus bandwidth across {gpus} GPUs"),
        s.avg_bus_gbps,
        expected,
        "GB/s",
        settings,
    );
    c.detail = c.detail.replacen("GPU 0", "the node", 1);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_gpu::hardware::SimulatedNode;
    use gpufleet_gpu::load::{LoadFaults, SimRunner};
    use std::sync::Arc;

    fn node(model: &str, gpus: u32) -> (Arc<SimulatedNode>, SimRunner) {
        let m = gpufleet_gpu::catalog::model(model).unwrap();
        let n = Arc::new(SimulatedNode::new("n", m, gpus, "580.159.04"));
        let r = SimRunner::new(n.clone());
        (n, r)
    }

    fn failed(checks: &[CheckResult]) -> Vec<(String, String)> {
        checks
            .iter()
            .filter(|c| c.verdict == FAIL)
            .map(|c| (c.name.clone(), c.value.clone()))
            .collect()
    }

    fn m(name: &str) -> Option<&'static GpuModel> {
        gpufleet_gpu::catalog::model(name)
    }

    #[test]
    fn quick_runs_no_load_test_and_a_healthy_node_passes_medium_and_long() {
        let (n, r) = node("H200-141GB", 2);
        let s = Settings::default();
        assert!(run(Level::Quick, &s, &r, &*n, m("H200-141GB"), 1).is_empty());
        let medium = run(Level::Medium, &s, &r, &*n, m("H200-141GB"), 1);
        assert!(failed(&medium).is_empty(), "{medium:#?}");
        for name in names(Level::Medium) {
            assert_eq!(
                medium.iter().filter(|c| c.name == *name).count(),
                2,
                "{name}"
            );
        }
        assert!(medium.iter().any(|c| c.name == "under_load:throttle"));
        let clocks = medium
            .iter()
            .find(|c| c.name == "under_load:clocks")
            .unwrap();
        assert_eq!(
            (clocks.verdict.as_str(), clocks.value.as_str()),
            (PASS, "SM 1980 MHz")
        );
        let long = run(Level::Long, &s, &r, &*n, m("H200-141GB"), 1);
        let nccl = long.iter().find(|c| c.name == "nccl_all_reduce").unwrap();
        assert_eq!(nccl.verdict, PASS, "{nccl:?}");
    }

    #[test]
    fn each_fault_under_load_fails_its_test_naming_measured_and_expected() {
        let (n, r) = node("H200-141GB", 2);
        n.set_load_faults(
            0,
            LoadFaults {
                flipped_bits: 1,
                memory_speed: Some(0.5),
                ..LoadFaults::default()
            },
        );
        n.set_load_faults(
            1,
            LoadFaults {
                throttle_under_load: 0x40,
                xid_under_load: Some(79),
                corrupt_gemms: 1,
                ..LoadFaults::default()
            },
        );
        let c = run(
            Level::Medium,
            &Settings::default(),
            &r,
            &*n,
            m("H200-141GB"),
            1,
        );
        let uuid0 = n.gpus().unwrap()[0].uuid.clone();
        let f: Vec<(String, String)> = failed(&c);
        assert!(
            f.contains(&("gpu_memory".into(), "3 mismatches".into())),
            "{f:?}"
        );
        assert!(
            f.contains(&("hbm_bandwidth".into(), "2150.5 GB/s".into())),
            "{f:?}"
        );
        let hbm = c
            .iter()
            .find(|c| c.name == "hbm_bandwidth" && c.gpu_uuid == uuid0)
            .unwrap();
        assert!(
            hbm.detail
                .contains("measured 2150.5 GB/s, expected 4301.0 GB/s (measured figure)"),
            "{}",
            hbm.detail
        );
        assert_eq!(
            hbm.threshold,
            ">= 3225.8 GB/s (0.75 of the expected 4301.0, measured)"
        );
        assert!(
            f.iter()
                .any(|(n, v)| n == "gpu_burn" && v.starts_with("1 of")),
            "{f:?}"
        );
        assert!(
            f.contains(&(
                "under_load:throttle".into(),
                "hardware thermal slowdown".into()
            )),
            "{f:?}"
        );
        assert!(f.contains(&("under_load:xid".into(), "79".into())), "{f:?}");
        let uuid1 = n.gpus().unwrap()[1].uuid.clone();
        let clocks = c
            .iter()
            .find(|c| c.name == "under_load:clocks" && c.gpu_uuid == uuid1)
            .unwrap();
        assert_eq!(clocks.value, "SM 1188 MHz", "held down to 60% of 1,980");
        assert!(!f.iter().any(|(n, _)| n == "under_load:pcie_link"), "{f:?}");
    }

    #[test]
    fn a_pcie_link_that_drops_under_load_fails_though_it_is_whole_at_rest() {
        let (n, r) = node("H200-141GB", 1);
        n.set_load_faults(
            0,
            LoadFaults {
                pcie_under_load: Some((4, 8)),
                ..LoadFaults::default()
            },
        );
        let idle = n.readings(0).unwrap().pcie.unwrap();
        assert_eq!((idle.gen, idle.width), (5, 16));
        let c = run(
            Level::Medium,
            &Settings::default(),
            &r,
            &*n,
            m("H200-141GB"),
            1,
        );
        let link = c.iter().find(|c| c.name == "under_load:pcie_link").unwrap();
        assert_eq!(
            (
                link.verdict.as_str(),
                link.value.as_str(),
                link.threshold.as_str()
            ),
            (FAIL, "Gen4 x8", "Gen5 x16")
        );
    }

    #[test]
    fn a_slow_all_reduce_fails_the_long_level_against_the_models_nvlink_figure() {
        let (n, r) = node("H100-80GB", 2);
        n.set_load_faults(
            1,
            LoadFaults {
                nccl_speed: Some(0.2),
                ..LoadFaults::default()
            },
        );
        let c = run(
            Level::Long,
            &Settings::default(),
            &r,
            &*n,
            m("H100-80GB"),
            1,
        );
        let nccl = c.iter().find(|c| c.name == "nccl_all_reduce").unwrap();
        assert_eq!(
            (nccl.verdict.as_str(), nccl.value.as_str()),
            (FAIL, "90.0 GB/s")
        );
        assert!(
            nccl.detail
                .contains("expected 450.0 GB/s (documented figure)"),
            "{}",
            nccl.detail
        );
        assert!(
            nccl.detail
                .starts_with("the node: all-reduce bus bandwidth across 2 GPUs"),
            "{}",
            nccl.detail
        );
    }

    #[test]
    fn a_throttled_gpu_fails_the_burn_on_its_own_models_figure() {
        let (n, r) = node("H100-80GB", 1);
        n.set_load_faults(
            0,
            LoadFaults {
                compute_speed: Some(0.5),
                ..LoadFaults::default()
            },
        );
        let c = run(
            Level::Medium,
            &Settings::default(),
            &r,
            &*n,
            m("H100-80GB"),
            1,
        );
        let burn = c.iter().find(|c| c.name == "gpu_burn").unwrap();
        assert_eq!(
            (burn.verdict.as_str(), burn.value.as_str()),
            (FAIL, "380.0 TFLOP/s")
        );
        assert!(
            burn.detail
                .contains("expected 760.0 TFLOP/s (estimated figure)"),
            "{}",
            burn.detail
        );
        // A looser fleet group passes the same GPU.
        let loose = Settings {
            min_fraction: 0.4,
            ..Settings::default()
        };
        let c = run(Level::Medium, &loose, &r, &*n, m("H100-80GB"), 1);
        assert_eq!(
            c.iter().find(|c| c.name == "gpu_burn").unwrap().verdict,
            PASS
        );
    }

    struct NoCuda;
    impl LoadRunner for NoCuda {
        fn kind(&self) -> &'static str {
            "cuda"
        }
        fn unavailable(&self) -> Option<String> {
            Some("no CUDA library: libcuda not found".into())
        }
        fn memory(
            &self,
            _: &Target,
            _: &LoadPlan,
        ) -> gpufleet_gpu::load::Outcome<gpufleet_gpu::load::MemoryResult> {
            unreachable!()
        }
        fn burn(
            &self,
            _: &Target,
            _: figures::Dtype,
            _: &LoadPlan,
            _: &mut dyn FnMut(),
        ) -> gpufleet_gpu::load::Outcome<gpufleet_gpu::load::BurnResult> {
            unreachable!()
        }
        fn memory_copy(&self, _: &Target, _: &LoadPlan) -> gpufleet_gpu::load::Outcome<f64> {
            unreachable!()
        }
        fn host_link(&self, _: &Target, _: &LoadPlan) -> gpufleet_gpu::load::Outcome<(f64, f64)> {
            unreachable!()
        }
        fn all_reduce(
            &self,
            _: &[Target],
            _: &LoadPlan,
        ) -> gpufleet_gpu::load::Outcome<gpufleet_gpu::load::AllReduceResult> {
            unreachable!()
        }
    }

    #[test]
    fn tests_that_cannot_run_fail_unless_the_fleet_group_allows_skipping() {
        let (n, _) = node("H200-141GB", 1);
        let c = run(
            Level::Long,
            &Settings::default(),
            &NoCuda,
            &*n,
            m("H200-141GB"),
            1,
        );
        assert_eq!(c.len(), 5);
        for x in &c {
            assert_eq!(
                (x.verdict.as_str(), x.value.as_str()),
                (FAIL, "not run: no CUDA library: libcuda not found")
            );
            assert!(x.detail.starts_with("not run: no CUDA library: libcuda not found; a level that needs load tests fails unless"), "{}", x.detail);
        }
        let skip = Settings {
            skip_allowed: true,
            ..Settings::default()
        };
        let c = run(Level::Medium, &skip, &NoCuda, &*n, m("H200-141GB"), 1);
        assert!(c
            .iter()
            .all(|x| x.verdict == NOT_RUN && x.detail.contains("allows this host to skip")));
    }

    #[test]
    fn mig_slices_are_tested_each_against_their_share() {
        let (n, r) = node("H200-141GB", 1);
        n.set_mig_mode(0, true).unwrap();
        n.create_instance(0, 9, 0).unwrap();
        n.create_instance(0, 9, 4).unwrap();
        let c = run(
            Level::Long,
            &Settings::default(),
            &r,
            &*n,
            m("H200-141GB"),
            1,
        );
        assert!(failed(&c).is_empty(), "{c:#?}");
        let burns: Vec<&CheckResult> = c.iter().filter(|c| c.name == "gpu_burn").collect();
        assert_eq!(burns.len(), 2);
        assert!(
            burns[0].threshold.contains("expected 345.5"),
            "{}",
            burns[0].threshold
        );
        let nccl = c.iter().find(|c| c.name == "nccl_all_reduce").unwrap();
        assert_eq!(nccl.verdict, NOT_RUN);
    }

    #[test]
    fn nccl_tests_are_judged_against_the_models_all_reduce_figure() {
        use super::super::nccl_tests::{Run, Summary};
        let fig = Figure {
            expected: 450.0,
            documented_peak: 450.0,
            source: gpufleet_gpu::catalog::Source::Documented,
        };
        let s = Settings::default();
        let ran = |gbps: f64, oob: u64| {
            Run::Ran(Summary {
                avg_bus_gbps: gbps,
                out_of_bounds: oob,
            })
        };
        let ok = all_reduce_perf(ran(352.117, 0), 8, fig, &s);
        assert_eq!(
            (ok.verdict.as_str(), ok.value.as_str()),
            (PASS, "352.1 GB/s")
        );
        let slow = all_reduce_perf(ran(100.0, 0), 8, fig, &s);
        assert_eq!(slow.verdict, FAIL);
        assert!(
            slow.detail
                .contains("expected 450.0 GB/s (documented figure)"),
            "{}",
            slow.detail
        );
        assert_eq!(
            all_reduce_perf(ran(400.0, 3), 8, fig, &s).value,
            "3 wrong values"
        );
        assert_eq!(
            all_reduce_perf(Run::NotInstalled, 8, fig, &s).verdict,
            NOT_RUN
        );
        assert_eq!(
            all_reduce_perf(Run::Failed("x".into()), 8, fig, &s).verdict,
            FAIL
        );
    }

    #[test]
    fn order_settings_are_bounded() {
        assert_eq!(
            Settings::from_order(0.0, false, 0).unwrap(),
            Settings::default()
        );
        assert!(Settings::from_order(1.5, false, 0)
            .unwrap_err()
            .contains("load_min_fraction"));
        assert!(Settings::from_order(0.5, false, 601)
            .unwrap_err()
            .contains("burn_seconds"));
        let s = Settings::from_order(0.9, true, 30).unwrap();
        assert_eq!(s.burn, Some(Duration::from_secs(30)));
        assert_eq!(
            plan(Level::Medium, &s, 3).unwrap().burn,
            Duration::from_secs(30)
        );
        assert_eq!(
            plan(Level::Long, &Settings::default(), 3).unwrap().burn,
            LONG_BURN
        );
    }
}
