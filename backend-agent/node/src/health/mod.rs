//! The node's health checks at a level (DCGM's spirit: quick, medium, long, each
//! including the lower ones), run by the agent on its own GPUs:
//!
//! - quick: ECC counters, XIDs since the previous check, temperature against slowdown,
//!   the driver against the cluster's, MIG state against the recorded layout;
//! - medium: + PCIe link against its maximum, NVLink errors, retired pages and remapped
//!   rows, power against its limit, throttle reasons;
//! - long: the same GPU checks; DCGM's own diagnostic runs at every level at its matching
//!   depth (`dcgmi diag -r 1|2|3`), where the host has it.
//!
//! Medium and long also load the GPUs ([`load`]): memory patterns, a GEMM burn with the
//! GPU read during it, memory and host bandwidth, and at long an all-reduce, judged
//! against the model's own figures.
//!
//! Blocking (dcgmi runs for minutes at the long level): callers run it on a blocking
//! thread.

pub mod checks;
pub mod dcgm;
pub mod load;
pub mod nccl_tests;
pub mod xid;

use gpufleet_gpu::hardware::{GpuBackend, GpuReadings};
use gpufleet_gpu::mig::Placement;
use gpufleet_proto::v1::{CheckResult, HealthReport};

/// How deep the checks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Quick,
    Medium,
    Long,
}

impl Level {
    /// "quick", "medium" or "long".
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "quick" => Ok(Level::Quick),
            "medium" => Ok(Level::Medium),
            "long" => Ok(Level::Long),
            other => Err(format!(
                "level: must be quick, medium or long (got '{}')",
                other.chars().take(32).collect::<String>()
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Quick => "quick",
            Level::Medium => "medium",
            Level::Long => "long",
        }
    }

    /// `dcgmi diag -r N` for this level.
    pub fn dcgm_level(self) -> u32 {
        match self {
            Level::Quick => 1,
            Level::Medium => 2,
            Level::Long => 3,
        }
    }
}

/// What one run of the checks needs besides the hardware.
pub struct Plan<'a> {
    pub level: Level,
    /// The driver the node runs, or why it cannot be read.
    pub driver: Result<String, String>,
    /// The cluster's driver; None: held to the GPU model's minimum.
    pub expected_driver: Option<&'a str>,
    /// Recorded MIG layout per GPU index (None: whole GPU); GPUs not listed are not checked.
    pub expected_layout: &'a [(u32, Option<Vec<Placement>>)],
    /// Simulated hardware: DCGM (which diagnoses real GPUs) is not run.
    pub simulated: bool,
}

/// Runs every check of the plan's level on `backend`'s GPUs.
pub fn run(backend: &dyn GpuBackend, gpu_type: &str, plan: &Plan) -> Vec<CheckResult> {
    let model = gpufleet_gpu::catalog::model(gpu_type);
    let mut out = vec![checks::driver(
        &plan.driver,
        plan.expected_driver,
        model.map(|m| (m.name.as_str(), m.min_driver.as_str())),
    )];
    let gpus = match backend.inventory() {
        Ok(g) => g,
        Err(e) => {
            out.push(checks::result(
                "gpu_readable",
                "",
                checks::FAIL,
                "no GPU readable",
                "every GPU readable",
                format!("the node's GPUs cannot be counted: {e}"),
            ));
            return out;
        }
    };
    for (index, _) in plan.expected_layout {
        if !gpus.iter().any(|g| g.index == *index) {
            out.push(checks::result(
                "mig_layout",
                "",
                checks::FAIL,
                "no such GPU",
                format!("GPU {index}"),
                format!("GPU {index} is recorded for this node but the node has no such GPU"),
            ));
        }
    }
    for status in &gpus {
        let uuid = status.uuid.clone().unwrap_or_default();
        let readings = status
            .info
            .clone()
            .and_then(|info| Ok((backend.readings(info.index)?, info)));
        let (r, info) = match readings {
            Ok(r) => r,
            Err(e) => {
                out.push(checks::result(
                    "gpu_readable",
                    &uuid,
                    checks::FAIL,
                    "unreadable",
                    "readable",
                    format!("GPU {} cannot be read: {e}", status.index),
                ));
                continue;
            }
        };
        out.extend(gpu_checks(plan.level, &r));
        if let Some((_, layout)) = plan.expected_layout.iter().find(|(i, _)| *i == info.index) {
            out.push(checks::mig_layout(&info, layout.as_deref()));
        }
    }
    if plan.simulated {
        out.push(checks::result(
            "dcgm_diag",
            "",
            checks::NOT_RUN,
            "not run",
            "every DCGM test passes",
            "simulated hardware: DCGM's diagnostics run on real GPUs only",
        ));
    } else {
        out.extend(dcgm::run(plan.level));
    }
    out
}

/// The per-GPU checks of `level`.
pub fn gpu_checks(level: Level, r: &GpuReadings) -> Vec<CheckResult> {
    let mut out = checks::ecc(r);
    out.push(checks::xid(r));
    out.push(checks::temperature(r));
    if level >= Level::Medium {
        out.extend([
            checks::pcie_link(r),
            checks::nvlink(r),
            checks::retired_pages_pending(r),
            checks::retired_pages(r),
            checks::remapped_rows(r),
            checks::power(r),
            checks::throttle(r),
        ]);
    }
    out
}

/// The report the order answers with.
pub fn report(level: Level, checks: Vec<CheckResult>) -> HealthReport {
    HealthReport {
        level: level.as_str().to_string(),
        checks,
        finished_at: time::OffsetDateTime::now_utc().unix_timestamp(),
    }
}

/// The checks as text (`hw-check`): one line per check, worst verdicts first.
pub fn render(checks: &[CheckResult]) -> String {
    let rank = |v: &str| match v {
        checks::FAIL => 0,
        checks::WARN => 1,
        checks::NOT_RUN => 2,
        _ => 3,
    };
    let mut sorted: Vec<&CheckResult> = checks.iter().collect();
    sorted.sort_by_key(|c| rank(&c.verdict));
    let mut out = String::new();
    for c in sorted {
        let gpu = if c.gpu_uuid.is_empty() {
            String::new()
        } else {
            format!(" {}", c.gpu_uuid)
        };
        out.push_str(&format!(
            "  {:<7} {}{gpu}: {} (threshold {}) - {}\n",
            c.verdict.to_uppercase(),
            c.name,
            c.value,
            if c.threshold.is_empty() {
                "-"
            } else {
                &c.threshold
            },
            c.detail
        ));
    }
    out
}

/// `hw-check`: the checks of `level` on this host through NVML (from `library` when
/// given), or on the sample simulated node, as text. No driver or layout is expected: the
/// driver is held to the GPU model's minimum.
pub fn host_checks(
    hardware: crate::hardware::Hardware,
    library: Option<&std::path::Path>,
    level: &str,
) -> anyhow::Result<String> {
    let level = Level::parse(level).map_err(|e| anyhow::anyhow!("--{e}"))?;
    let (backend, runner): (
        std::sync::Arc<dyn GpuBackend>,
        Box<dyn gpufleet_gpu::load::LoadRunner>,
    ) = match hardware {
        crate::hardware::Hardware::Nvml => (
            std::sync::Arc::new(crate::hardware::open_nvml(library)?),
            Box::new(gpufleet_gpu::load::cuda::CudaRunner::new()),
        ),
        crate::hardware::Hardware::Sim => {
            let model = gpufleet_gpu::catalog::model("H100-80GB")
                .ok_or_else(|| anyhow::anyhow!("catalog lacks H100-80GB"))?;
            let sim = std::sync::Arc::new(gpufleet_gpu::hardware::SimulatedNode::new(
                "sim-node-01",
                model,
                8,
                gpufleet_gpu::catalog::DEFAULT_DRIVER,
            ));
            (
                sim.clone(),
                Box::new(gpufleet_gpu::load::SimRunner::new(sim)),
            )
        }
    };
    let gpu_type = backend
        .inventory()
        .ok()
        .and_then(|g| g.into_iter().find_map(|s| s.info.ok()))
        .map(|g| g.model)
        .unwrap_or_default();
    let plan = Plan {
        level,
        driver: backend.driver_version().map_err(|e| e.to_string()),
        expected_driver: None,
        expected_layout: &[],
        simulated: hardware == crate::hardware::Hardware::Sim,
    };
    let mut checks = run(&*backend, &gpu_type, &plan);
    checks.extend(load::run(
        level,
        &load::Settings::default(),
        &*runner,
        &*backend,
        gpufleet_gpu::catalog::model(&gpu_type),
        load::fresh_seed(),
    ));
    Ok(format!("checks ({}):\n{}", level.as_str(), render(&checks)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_gpu::hardware::SimulatedNode;

    fn plan(level: Level, driver: &str) -> Plan<'static> {
        Plan {
            level,
            driver: Ok(driver.to_string()),
            expected_driver: Some("550.54.15"),
            expected_layout: &[],
            simulated: true,
        }
    }

    #[test]
    fn a_healthy_simulated_node_passes_and_dcgm_is_not_run() {
        let m = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let n = SimulatedNode::new("n", m, 2, "550.54.15");
        let quick = run(&n, "H100-80GB", &plan(Level::Quick, "550.54.15"));
        let medium = run(&n, "H100-80GB", &plan(Level::Medium, "550.54.15"));
        assert!(medium.len() > quick.len());
        for c in &medium {
            if c.name == "dcgm_diag" {
                assert_eq!(c.verdict, checks::NOT_RUN);
            } else if c.name == "retired_pages" {
                assert_eq!(c.verdict, checks::NOT_RUN, "H100 remaps rows");
            } else {
                assert_eq!(c.verdict, checks::PASS, "{c:?}");
            }
        }
        assert!(quick.iter().all(|c| c.name != "pcie_link"));
        assert!(medium.iter().any(|c| c.name == "pcie_link"));
    }

    #[test]
    fn faults_fail_their_checks_with_value_and_threshold() {
        let m = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let n = SimulatedNode::new("n", m, 2, "550.54.15");
        n.set_ecc_uncorrected(1, 4);
        n.push_xid(0, 48);
        n.set_pcie_link(1, Some((3, 8)));
        let r = run(&n, "H100-80GB", &plan(Level::Medium, "535.54.03"));
        let failed: Vec<(&str, &str, &str)> = r
            .iter()
            .filter(|c| c.verdict == checks::FAIL)
            .map(|c| (c.name.as_str(), c.value.as_str(), c.threshold.as_str()))
            .collect();
        assert_eq!(
            failed,
            [
                ("driver", "535.54.03", "550.54.15"),
                ("xid", "48", "no XID that needs a GPU reset or service"),
                ("ecc_uncorrected_volatile", "4 uncorrected", "0"),
                ("pcie_link", "Gen3 x8", "Gen5 x16"),
            ]
        );
        let text = render(&r);
        assert!(
            text.starts_with("  FAIL    driver: 535.54.03 (threshold 550.54.15)"),
            "{text}"
        );
    }

    #[test]
    fn the_recorded_layout_is_checked_per_gpu() {
        let m = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let n = SimulatedNode::new("n", m, 1, "550.54.15");
        let l: gpufleet_gpu::mig::Layout = [("7g.80gb".to_string(), 1)].into_iter().collect();
        let layout = vec![
            (0, Some(gpufleet_gpu::mig::plan(m, &l).unwrap())),
            (3, None),
        ];
        let p = Plan {
            expected_layout: &layout,
            ..plan(Level::Quick, "550.54.15")
        };
        let r = run(&n, "H100-80GB", &p);
        let mig: Vec<(&str, &str)> = r
            .iter()
            .filter(|c| c.name == "mig_layout")
            .map(|c| (c.verdict.as_str(), c.value.as_str()))
            .collect();
        assert_eq!(
            mig,
            [("fail", "no such GPU"), ("fail", "whole GPU (MIG off)")]
        );
    }

    #[test]
    fn levels_parse_and_map_to_dcgm() {
        assert_eq!(Level::parse("medium"), Ok(Level::Medium));
        assert!(Level::parse("extreme")
            .unwrap_err()
            .contains("quick, medium or long"));
        assert_eq!(Level::Long.dcgm_level(), 3);
    }
}
