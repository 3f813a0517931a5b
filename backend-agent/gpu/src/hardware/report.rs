//! The read-only hardware check report (`gpufleet-agent hw-check`).

use super::{GpuBackend, GpuInfo, GpuStatus, HwError, RowRemap};
use crate::catalog;
use std::fmt::Write;

/// Inventory, MIG state (current and pending), driver/CUDA, persistence mode and health of
/// every GPU, as text, with the host's preflight problems (privileges, profile table) as
/// findings. Reads only. A GPU that cannot be read (no permission, lost) is reported as
/// such and the others still are; fails only when the GPUs cannot be counted.
pub fn check_report(backend: &dyn GpuBackend) -> Result<String, HwError> {
    let gpus = backend.inventory()?;
    let driver = backend.driver_version();
    let mut out = String::new();
    let line = |out: &mut String, s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(&mut out, format!("host:   {}", backend.hostname()));
    line(&mut out, format!("driver: {}", or_reason(&driver)));
    line(
        &mut out,
        format!("cuda:   {}", or_reason(&backend.cuda_version())),
    );
    line(&mut out, format!("gpus:   {}", gpus.len()));
    for problem in backend.preflight() {
        line(&mut out, format!("finding: {problem}"));
    }
    for status in &gpus {
        match &status.info {
            Ok(gpu) => write_gpu(&mut out, backend, status, gpu, driver.as_ref().ok()),
            Err(e) => {
                let _ = writeln!(
                    out,
                    "gpu {}: {}cannot be read: {e}",
                    status.index,
                    status
                        .uuid
                        .as_ref()
                        .map(|u| format!("{u} "))
                        .unwrap_or_default()
                );
                let _ = writeln!(out, "  health: NOT OK");
            }
        }
    }
    Ok(out)
}

fn or_reason(r: &Result<String, HwError>) -> String {
    match r {
        Ok(v) => v.clone(),
        Err(e) => format!("unavailable ({e})"),
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn write_gpu(
    out: &mut String,
    backend: &dyn GpuBackend,
    status: &GpuStatus,
    gpu: &GpuInfo,
    driver: Option<&String>,
) {
    let memory = if status.memory_known {
        format!("{} MiB", gpu.memory_mib)
    } else {
        "memory unknown (no permission)".to_string()
    };
    let pending = match status.mig_pending {
        Some(p) if p != gpu.mig_enabled => format!(
            " (pending {}: takes effect at the next GPU reset)",
            on_off(p)
        ),
        _ => String::new(),
    };
    let persistence = status
        .persistence_mode
        .map(|p| format!(", persistence {}", on_off(p)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "gpu {}: {} {} {}, MIG {}{pending}{persistence}",
        gpu.index,
        gpu.model,
        gpu.uuid,
        memory,
        on_off(gpu.mig_enabled),
    );
    let mut findings = Vec::new();
    for i in &gpu.instances {
        let incomplete = status.incomplete.contains(&i.start);
        let _ = writeln!(
            out,
            "  mig {}@{} (slices {}-{}) {} MiB {}{}",
            i.profile,
            i.start,
            i.start,
            i.start + i.size - 1,
            i.memory_mib,
            i.uuid,
            if incomplete {
                "INCOMPLETE (no compute instance)"
            } else {
                ""
            }
        );
        if incomplete {
            findings.push(format!(
                "gpu {}: the GPU instance {}@{} has no compute instance, so no MIG device: re-apply the layout (it is recreated) or destroy it",
                gpu.index, i.profile, i.start
            ));
        }
    }
    if let (Some(model), Some(driver)) = (catalog::model(&gpu.model), driver) {
        if catalog::compare_driver_versions(driver, &model.min_driver).is_lt() {
            findings.push(format!(
                "driver {driver} is older than {} needs ({} architecture: {} or newer)",
                model.name, model.architecture, model.min_driver
            ));
        } else if let Some(floor) = catalog::min_mig_driver(&model.name)
            .filter(|_| gpu.mig_enabled || status.mig_pending == Some(true))
        {
            if catalog::compare_driver_versions(driver, floor).is_lt() {
                findings.push(format!(
                    "driver {driver} is older than MIG on {} needs ({floor} or newer, MIG user guide)",
                    model.name
                ));
            }
        }
    }
    if status.mig_pending.is_some_and(|p| p != gpu.mig_enabled) {
        findings.push(format!(
            "gpu {}: a MIG mode change to {} is pending and takes effect at the next GPU reset",
            gpu.index,
            on_off(!gpu.mig_enabled)
        ));
    }
    match backend.health(gpu.index) {
        Ok(h) => {
            let opt = |v: Option<String>| v.unwrap_or_else(|| "n/a".to_string());
            let remap = match h.remapped_rows {
                RowRemap::Unknown | RowRemap::Unsupported => "n/a".to_string(),
                RowRemap::NotUnderMig => "n/a under MIG".to_string(),
                RowRemap::Counts {
                    correctable,
                    uncorrectable,
                    pending,
                    failure,
                } => format!(
                    "{correctable} correctable/{uncorrectable} uncorrectable{}{}",
                    if pending { ", pending" } else { "" },
                    if failure { ", FAILED" } else { "" }
                ),
            };
            let _ = writeln!(
                out,
                "  health: {}, temperature {} C, power {} W, uncorrected ECC {}, retired pages pending {}, remapped rows {remap}",
                if h.healthy && findings.is_empty() { "ok" } else { "NOT OK" },
                opt(h.temperature_c.map(|t| t.to_string())),
                opt(h.power_mw.map(|p| format!("{:.1}", p as f64 / 1000.0))),
                opt(h.ecc_uncorrected.map(|n| n.to_string())),
                opt(h.retired_pages_pending.map(|p| if p { "yes" } else { "no" }.to_string())),
            );
            findings.extend(h.findings);
        }
        Err(e) => findings.push(format!("health unavailable: {e}")),
    }
    for f in findings {
        let _ = writeln!(out, "  finding: {f}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{apply_layout, SimulatedNode};
    use crate::mig::{plan, Layout};

    #[test]
    fn report_on_a_simulated_node() {
        let m = catalog::model("H100-80GB").unwrap();
        let n = SimulatedNode::new("node-a", m, 2, "550.54.15");
        let l: Layout = [("3g.40gb".to_string(), 2)].into_iter().collect();
        apply_layout(&n, 1, &plan(m, &l).unwrap()).unwrap();
        n.set_retired_pages_pending(0, true);
        let before = n.gpus().unwrap();
        let r = check_report(&n).unwrap();
        assert_eq!(
            n.gpus().unwrap(),
            before,
            "the report must not change anything"
        );
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines[0], "host:   node-a");
        assert_eq!(lines[1], "driver: 550.54.15");
        assert_eq!(lines[2], "cuda:   12.4");
        assert_eq!(lines[3], "gpus:   2");
        let uuid0 = &before[0].uuid;
        assert_eq!(
            lines[4],
            format!("gpu 0: H100-80GB {uuid0} 81920 MiB, MIG off")
        );
        assert!(
            lines[5].starts_with("  health: NOT OK, temperature 35 C, power 70.0 W"),
            "{}",
            lines[5]
        );
        assert!(
            lines[6].contains("finding: gpu 0: retired pages are pending"),
            "{}",
            lines[6]
        );
        assert!(lines[7].ends_with("MIG on"), "{}", lines[7]);
        assert!(
            lines[8].starts_with("  mig 3g.40gb@0 (slices 0-3) 40448 MiB MIG-"),
            "{}",
            lines[8]
        );
        assert!(
            lines[9].starts_with("  mig 3g.40gb@4 (slices 4-7)"),
            "{}",
            lines[9]
        );
        assert!(lines[10].starts_with("  health: ok"), "{}", lines[10]);
    }

    #[test]
    fn old_driver_is_a_finding() {
        let m = catalog::model("B200").unwrap();
        let n = SimulatedNode::new("node-b", m, 1, "550.54.15");
        let r = check_report(&n).unwrap();
        assert!(r.contains("health: NOT OK"), "{r}");
        assert!(
            r.contains("finding: driver 550.54.15 is older than B200 needs (Blackwell architecture: 570.26 or newer)"),
            "{r}"
        );
    }
}
