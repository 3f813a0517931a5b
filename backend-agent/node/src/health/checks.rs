//! Each check's evaluation: a GPU's (or the node's) readings held to their thresholds,
//! giving a verdict with the measured value, the threshold and a sentence for a person.
//! Pure functions of the readings, so every verdict is testable without hardware.
//!
//! Thresholds follow DCGM's health watches where it has one (see
//! `/work/shared/reference/driver-xid.md` section 4a): uncorrected volatile ECC fails;
//! 63 retired pages fail; a row-remap failure fails; NVLink recoveries fail.

use gpufleet_gpu::hardware::{GpuInfo, GpuReadings, PcieLink, RowRemap};
use gpufleet_gpu::mig::Placement;
use gpufleet_proto::v1::CheckResult;

use super::xid::{self, Class};

pub const PASS: &str = "pass";
pub const WARN: &str = "warn";
pub const FAIL: &str = "fail";
pub const NOT_RUN: &str = "not_run";

/// Corrected (single-bit) volatile ECC errors from which a GPU is worth a look.
pub const CORRECTED_WARN: u64 = 1000;
/// Retired pages: DCGM's limit (fail) and its soft limit (warn).
pub const RETIRED_PAGES_FAIL: u64 = 63;
pub const RETIRED_PAGES_WARN: u64 = 15;
/// Rows remapped for uncorrectable errors from which DCGM warns.
pub const REMAPPED_UNCORRECTABLE_WARN: u32 = 512;
/// How close to the slowdown temperature warns.
pub const TEMPERATURE_MARGIN_C: u32 = 5;
/// The slowdown temperature assumed when the GPU does not report its own.
pub const DEFAULT_SLOWDOWN_C: u32 = 85;

/// Throttle reasons (NVML clocks-event bits) that mean a hardware problem.
const THROTTLE_FAIL: [(u64, &str); 3] = [
    (0x8, "hardware slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "power brake"),
];
const THROTTLE_WARN: [(u64, &str); 1] = [(0x20, "software thermal slowdown")];

/// A check result.
pub fn result(
    name: &str,
    gpu_uuid: &str,
    verdict: &str,
    value: impl Into<String>,
    threshold: impl Into<String>,
    detail: impl Into<String>,
) -> CheckResult {
    CheckResult {
        name: name.to_string(),
        gpu_uuid: gpu_uuid.to_string(),
        verdict: verdict.to_string(),
        value: value.into(),
        threshold: threshold.into(),
        detail: detail.into(),
        peer: String::new(),
        gbps: 0.0,
    }
}

fn not_run(name: &str, gpu: &GpuReadings, why: &str) -> CheckResult {
    result(
        name,
        &gpu.uuid,
        NOT_RUN,
        "not read",
        "",
        format!("GPU {}: not checked: {why}", gpu.index),
    )
}

/// The four ECC counters: uncorrected volatile fails, uncorrected aggregate warns (an
/// error earlier in the GPU's life), corrected volatile warns from [`CORRECTED_WARN`],
/// corrected aggregate is reported.
pub fn ecc(g: &GpuReadings) -> Vec<CheckResult> {
    let names = [
        "ecc_uncorrected_volatile",
        "ecc_uncorrected_aggregate",
        "ecc_corrected_volatile",
        "ecc_corrected_aggregate",
    ];
    let c = match &g.ecc {
        Ok(c) => c,
        Err(why) => return names.iter().map(|n| not_run(n, g, why)).collect(),
    };
    let i = g.index;
    let uv = c.volatile_uncorrected;
    let ua = c.aggregate_uncorrected;
    let cv = c.volatile_corrected;
    vec![
        if uv > 0 {
            result(names[0], &g.uuid, FAIL, format!("{uv} uncorrected"), "0",
                format!("GPU {i}: {uv} uncorrected ECC error(s) since the driver loaded; drain the node and reset the GPU"))
        } else {
            result(
                names[0],
                &g.uuid,
                PASS,
                "0 uncorrected",
                "0",
                format!("GPU {i}: no uncorrected ECC error since the driver loaded"),
            )
        },
        if ua > 0 {
            result(names[1], &g.uuid, WARN, format!("{ua} uncorrected"), "0",
                format!("GPU {i}: {ua} uncorrected ECC error(s) over the GPU's life; watch it, service it if they recur"))
        } else {
            result(
                names[1],
                &g.uuid,
                PASS,
                "0 uncorrected",
                "0",
                format!("GPU {i}: no uncorrected ECC error over the GPU's life"),
            )
        },
        if cv >= CORRECTED_WARN {
            result(
                names[2],
                &g.uuid,
                WARN,
                format!("{cv} corrected"),
                format!("< {CORRECTED_WARN}"),
                format!(
                    "GPU {i}: {cv} corrected ECC errors since the driver loaded; watch the trend"
                ),
            )
        } else {
            result(
                names[2],
                &g.uuid,
                PASS,
                format!("{cv} corrected"),
                format!("< {CORRECTED_WARN}"),
                format!("GPU {i}: corrected ECC errors within the normal range"),
            )
        },
        result(
            names[3],
            &g.uuid,
            PASS,
            format!("{} corrected", c.aggregate_corrected),
            "reported only",
            format!("GPU {i}: corrected ECC errors over the GPU's life (informational)"),
        ),
    ]
}

/// XIDs since the previous check: a fatal one fails, a noteworthy one warns, an
/// application's own error passes (it says nothing about the GPU).
pub fn xid(g: &GpuReadings) -> CheckResult {
    let threshold = "no XID that needs a GPU reset or service";
    let codes = match &g.xids {
        Ok(c) => c,
        Err(why) => return not_run("xid", g, why),
    };
    if codes.is_empty() {
        return result(
            "xid",
            &g.uuid,
            PASS,
            "none",
            threshold,
            format!("GPU {}: no XID event since the previous check", g.index),
        );
    }
    let worst = codes
        .iter()
        .map(|&c| xid::meaning(c).class)
        .max()
        .unwrap_or(Class::App);
    let verdict = match worst {
        Class::Fatal => FAIL,
        Class::Warn => WARN,
        Class::App => PASS,
    };
    let mut seen: Vec<u64> = codes.clone();
    seen.sort_unstable();
    seen.dedup();
    let explained: Vec<String> = seen
        .iter()
        .map(|&c| {
            let m = xid::meaning(c);
            format!("XID {c} ({}): {}", m.name, m.action)
        })
        .collect();
    let value: Vec<String> = seen.iter().map(|c| c.to_string()).collect();
    result(
        "xid",
        &g.uuid,
        verdict,
        value.join(", "),
        threshold,
        format!("GPU {}: {}", g.index, explained.join("; ")),
    )
}

/// Temperature against the GPU's slowdown threshold: at or above it fails, within
/// [`TEMPERATURE_MARGIN_C`] of it warns.
pub fn temperature(g: &GpuReadings) -> CheckResult {
    let t = match g.temperature_c {
        Ok(t) => t,
        Err(ref why) => return not_run("temperature", g, why),
    };
    let (slowdown, note) = match g.slowdown_c {
        Ok(s) => (s, String::new()),
        Err(_) => (
            DEFAULT_SLOWDOWN_C,
            " (the GPU reports no slowdown temperature; the default is used)".to_string(),
        ),
    };
    let threshold = format!("< {slowdown} C (slowdown){note}");
    let i = g.index;
    if t >= slowdown {
        result("temperature", &g.uuid, FAIL, format!("{t} C"), threshold,
            format!("GPU {i} is at {t} C, at or above its slowdown temperature {slowdown} C: check its cooling"))
    } else if t + TEMPERATURE_MARGIN_C >= slowdown {
        result("temperature", &g.uuid, WARN, format!("{t} C"), threshold,
            format!("GPU {i} is at {t} C, within {TEMPERATURE_MARGIN_C} C of its slowdown temperature: check its cooling"))
    } else {
        result(
            "temperature",
            &g.uuid,
            PASS,
            format!("{t} C"),
            threshold,
            format!("GPU {i} is at {t} C"),
        )
    }
}

fn link(l: &PcieLink) -> (String, String) {
    (
        format!("Gen{} x{}", l.gen, l.width),
        format!("Gen{} x{}", l.max_gen, l.max_width),
    )
}

/// The PCIe link against its maximum: a narrower link fails (lanes lost: a seating or
/// riser fault); a lower generation warns (GPUs lower it while idle; under load it is a
/// fault).
pub fn pcie_link(g: &GpuReadings) -> CheckResult {
    let l = match &g.pcie {
        Ok(l) => l,
        Err(why) => return not_run("pcie_link", g, why),
    };
    let (value, threshold) = link(l);
    let i = g.index;
    if l.width < l.max_width {
        result("pcie_link", &g.uuid, FAIL, value, threshold,
            format!("GPU {i}: the PCIe link runs x{} of x{} lanes: reseat the GPU or its riser, or service the slot", l.width, l.max_width))
    } else if l.gen < l.max_gen {
        result("pcie_link", &g.uuid, WARN, value, threshold,
            format!("GPU {i}: the PCIe link runs Gen{} of Gen{}; idle GPUs lower it, under load it is a link fault", l.gen, l.max_gen))
    } else {
        result(
            "pcie_link",
            &g.uuid,
            PASS,
            value,
            threshold,
            format!("GPU {i}: the PCIe link runs at its maximum"),
        )
    }
}

/// NVLink counters: a link down or a recovery fails; replays or CRC errors warn.
pub fn nvlink(g: &GpuReadings) -> CheckResult {
    let n = match &g.nvlink {
        Ok(n) => n,
        Err(why) => return not_run("nvlink_errors", g, why),
    };
    let crc = n.crc_flit.saturating_add(n.crc_data);
    let value = format!(
        "{} link(s), {} down, replay {}, recovery {}, CRC {crc}",
        n.links,
        n.down.len(),
        n.replay,
        n.recovery
    );
    let threshold = "no link down, no recovery, replay and CRC 0";
    let i = g.index;
    if !n.down.is_empty() {
        let down: Vec<String> = n.down.iter().map(|l| l.to_string()).collect();
        result("nvlink_errors", &g.uuid, FAIL, value, threshold,
            format!("GPU {i}: NVLink link(s) {} are down: drain the node and reset the GPU; check its NVLink peer", down.join(", ")))
    } else if n.recovery > 0 {
        result("nvlink_errors", &g.uuid, FAIL, value, threshold,
            format!("GPU {i}: {} NVLink recovery error(s): a link went down and retrained; drain and reset", n.recovery))
    } else if n.replay > 0 || crc > 0 {
        result(
            "nvlink_errors",
            &g.uuid,
            WARN,
            value,
            threshold,
            format!("GPU {i}: NVLink replays or CRC errors: watch the link"),
        )
    } else {
        result(
            "nvlink_errors",
            &g.uuid,
            PASS,
            value,
            threshold,
            format!("GPU {i}: every NVLink is up without errors"),
        )
    }
}

/// Pending page retirement fails (the GPU must be reset to take the bad pages out).
pub fn retired_pages_pending(g: &GpuReadings) -> CheckResult {
    match g.retired_pages_pending {
        Ok(true) => result(
            "retired_pages_pending",
            &g.uuid,
            FAIL,
            "pending",
            "none pending",
            format!(
                "GPU {}: retired pages are pending; reset the GPU (or reboot) before use",
                g.index
            ),
        ),
        Ok(false) => result(
            "retired_pages_pending",
            &g.uuid,
            PASS,
            "none pending",
            "none pending",
            format!("GPU {}: no page retirement pending", g.index),
        ),
        Err(ref why) => not_run("retired_pages_pending", g, why),
    }
}

/// Retired pages: [`RETIRED_PAGES_FAIL`] fails, [`RETIRED_PAGES_WARN`] warns.
pub fn retired_pages(g: &GpuReadings) -> CheckResult {
    let n = match g.retired_pages {
        Ok(n) => n,
        Err(ref why) => return not_run("retired_pages", g, why),
    };
    let threshold = format!("< {RETIRED_PAGES_FAIL} (warn from {RETIRED_PAGES_WARN})");
    let (verdict, detail) = if n >= RETIRED_PAGES_FAIL {
        (FAIL, "the GPU has used up its page retirement: service it")
    } else if n >= RETIRED_PAGES_WARN {
        (WARN, "many retired pages: watch the trend")
    } else {
        (PASS, "within the limit")
    };
    result(
        "retired_pages",
        &g.uuid,
        verdict,
        format!("{n} retired"),
        threshold,
        format!("GPU {}: {n} retired page(s); {detail}", g.index),
    )
}

/// Row remapping: a failed or pending remap fails; many uncorrectable remaps warn.
pub fn remapped_rows(g: &GpuReadings) -> CheckResult {
    let threshold =
        format!("no failure, none pending, < {REMAPPED_UNCORRECTABLE_WARN} uncorrectable");
    let i = g.index;
    match g.remapped_rows {
        RowRemap::Counts {
            correctable,
            uncorrectable,
            pending,
            failure,
        } => {
            let value = format!(
                "{correctable} correctable, {uncorrectable} uncorrectable{}{}",
                if pending { ", pending" } else { "" },
                if failure { ", failed" } else { "" }
            );
            if failure {
                result("remapped_rows", &g.uuid, FAIL, value, threshold,
                    format!("GPU {i}: a row remapping failed; its memory cannot be repaired in the field: drain it and have it serviced"))
            } else if pending {
                result(
                    "remapped_rows",
                    &g.uuid,
                    FAIL,
                    value,
                    threshold,
                    format!("GPU {i}: row remapping is pending; reset the GPU before use"),
                )
            } else if uncorrectable >= REMAPPED_UNCORRECTABLE_WARN {
                result(
                    "remapped_rows",
                    &g.uuid,
                    WARN,
                    value,
                    threshold,
                    format!(
                        "GPU {i}: {uncorrectable} rows remapped for uncorrectable errors: watch it"
                    ),
                )
            } else {
                result(
                    "remapped_rows",
                    &g.uuid,
                    PASS,
                    value,
                    threshold,
                    format!("GPU {i}: row remapping healthy"),
                )
            }
        }
        RowRemap::NotUnderMig => not_run(
            "remapped_rows",
            g,
            "NVML does not report remapped rows while MIG is on",
        ),
        RowRemap::Unsupported => not_run("remapped_rows", g, "this GPU does not remap rows"),
        RowRemap::Unknown => not_run("remapped_rows", g, "the remapped rows could not be read"),
    }
}

/// Power draw against the enforced limit (drawing more than the limit warns).
pub fn power(g: &GpuReadings) -> CheckResult {
    let p = match g.power_mw {
        Ok(p) => p,
        Err(ref why) => return not_run("power", g, why),
    };
    let w = |mw: u32| format!("{:.1} W", mw as f64 / 1000.0);
    match g.power_limit_mw {
        Ok(limit) if p > limit => result(
            "power",
            &g.uuid,
            WARN,
            w(p),
            format!("<= {} (enforced limit)", w(limit)),
            format!(
                "GPU {}: draws more than its enforced power limit: check the power supply",
                g.index
            ),
        ),
        Ok(limit) => result(
            "power",
            &g.uuid,
            PASS,
            w(p),
            format!("<= {} (enforced limit)", w(limit)),
            format!("GPU {}: power draw within its limit", g.index),
        ),
        Err(ref why) => result(
            "power",
            &g.uuid,
            PASS,
            w(p),
            "limit unknown",
            format!(
                "GPU {}: power draw read; its limit could not be: {why}",
                g.index
            ),
        ),
    }
}

/// Throttle reasons: hardware slowdown, thermal slowdown or power brake fail; software
/// thermal slowdown warns; idle, application clocks and the power cap are normal.
pub fn throttle(g: &GpuReadings) -> CheckResult {
    let bits = match g.throttle_reasons {
        Ok(b) => b,
        Err(ref why) => return not_run("throttle", g, why),
    };
    let names = |table: &[(u64, &'static str)]| -> Vec<&'static str> {
        table
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, n)| *n)
            .collect()
    };
    let (fail, warn) = (names(&THROTTLE_FAIL), names(&THROTTLE_WARN));
    let threshold = "no hardware slowdown, thermal slowdown or power brake";
    let value = if fail.is_empty() && warn.is_empty() {
        format!("none (reasons 0x{bits:x})")
    } else {
        fail.iter()
            .chain(&warn)
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    };
    let i = g.index;
    if !fail.is_empty() {
        result(
            "throttle",
            &g.uuid,
            FAIL,
            value,
            threshold,
            format!(
                "GPU {i}: clocks are held down by {}: check its power supply and cooling",
                fail.join(", ")
            ),
        )
    } else if !warn.is_empty() {
        result(
            "throttle",
            &g.uuid,
            WARN,
            value,
            threshold,
            format!("GPU {i}: the GPU runs hotter than its target"),
        )
    } else {
        result(
            "throttle",
            &g.uuid,
            PASS,
            value,
            threshold,
            format!("GPU {i}: no harmful throttling"),
        )
    }
}

/// The driver the node runs against the one its cluster needs (or, when none is given,
/// against the GPU model's minimum: older warns).
pub fn driver(
    reported: &Result<String, String>,
    expected: Option<&str>,
    model_min: Option<(&str, &str)>,
) -> CheckResult {
    let now = match reported {
        Ok(v) => v,
        Err(why) => {
            return result(
                "driver",
                "",
                FAIL,
                "unreadable",
                expected.unwrap_or(""),
                format!("the node's driver version cannot be read: {why}"),
            )
        }
    };
    match (expected, model_min) {
        (Some(want), _) if want == now => result("driver", "", PASS, now.clone(), want, format!("the node runs driver {now} as its cluster needs")),
        (Some(want), _) => result("driver", "", FAIL, now.clone(), want,
            format!("the node runs driver {now}, its cluster needs {want}: install {want} (or return the node for a driver change)")),
        (None, Some((model, min))) => {
            let threshold = format!(">= {min} ({model} minimum)");
            if gpufleet_gpu::catalog::compare_driver_versions(now, min).is_lt() {
                // No cluster asks for a driver yet: a cluster's install fixes it, so the
                // node is not failed for it.
                result("driver", "", WARN, now.clone(), threshold, format!("driver {now} is older than {model} needs ({min} or newer): a cluster on this node must install a newer one"))
            } else {
                result("driver", "", PASS, now.clone(), threshold, format!("driver {now} supports {model}"))
            }
        }
        (None, None) => result("driver", "", PASS, now.clone(), "reported only", format!("the node runs driver {now}")),
    }
}

fn describe(placements: Option<&[Placement]>) -> String {
    match placements {
        None => "whole GPU (MIG off)".to_string(),
        Some([]) => "MIG on, no instance".to_string(),
        Some(p) => {
            let mut p: Vec<&Placement> = p.iter().collect();
            p.sort_by_key(|p| p.start);
            p.iter()
                .map(|p| format!("{}@{}", p.profile, p.start))
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// A GPU's MIG state against the layout recorded for it.
pub fn mig_layout(gpu: &GpuInfo, expected: Option<&[Placement]>) -> CheckResult {
    let actual = if gpu.mig_enabled {
        Some(gpufleet_wire::inventory::placements_of(gpu))
    } else {
        None
    };
    let value = describe(actual.as_deref());
    let threshold = describe(expected);
    if gpufleet_wire::inventory::gpu_matches(gpu, expected) {
        result(
            "mig_layout",
            &gpu.uuid,
            PASS,
            value,
            threshold,
            format!("GPU {}: MIG state as recorded", gpu.index),
        )
    } else {
        result("mig_layout", &gpu.uuid, FAIL, value, threshold,
            format!("GPU {}: MIG state differs from the recorded layout: re-apply the layout, or look for changes made outside gpufleet", gpu.index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_gpu::hardware::{EccCounts, GpuBackend, NvlinkErrors};

    fn healthy() -> GpuReadings {
        GpuReadings {
            index: 2,
            uuid: "GPU-2".into(),
            ecc: Ok(EccCounts::default()),
            retired_pages_pending: Ok(false),
            retired_pages: Ok(0),
            remapped_rows: RowRemap::Counts {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            },
            xids: Ok(vec![]),
            temperature_c: Ok(40),
            slowdown_c: Ok(87),
            power_mw: Ok(100_000),
            power_limit_mw: Ok(700_000),
            throttle_reasons: Ok(0x1),
            pcie: Ok(PcieLink {
                gen: 5,
                width: 16,
                max_gen: 5,
                max_width: 16,
            }),
            nvlink: Ok(NvlinkErrors {
                links: 18,
                ..NvlinkErrors::default()
            }),
            sm_clock_mhz: Ok(1980),
            max_sm_clock_mhz: Ok(1980),
        }
    }

    fn all(g: &GpuReadings) -> Vec<CheckResult> {
        let mut v = ecc(g);
        v.extend([
            xid(g),
            temperature(g),
            pcie_link(g),
            nvlink(g),
            retired_pages_pending(g),
            retired_pages(g),
            remapped_rows(g),
            power(g),
            throttle(g),
        ]);
        v
    }

    #[test]
    fn a_healthy_gpu_passes_every_check_with_its_values() {
        let g = healthy();
        for c in all(&g) {
            assert_eq!(c.verdict, PASS, "{c:?}");
            assert_eq!(c.gpu_uuid, "GPU-2");
            assert!(
                !c.value.is_empty() && !c.threshold.is_empty() && !c.detail.is_empty(),
                "{c:?}"
            );
        }
        assert_eq!(temperature(&g).value, "40 C");
        assert_eq!(pcie_link(&g).threshold, "Gen5 x16");
    }

    #[test]
    fn an_ecc_burst_fails_with_its_count() {
        let mut g = healthy();
        g.ecc = Ok(EccCounts {
            volatile_uncorrected: 3,
            aggregate_uncorrected: 3,
            volatile_corrected: 5000,
            ..EccCounts::default()
        });
        let r = ecc(&g);
        assert_eq!(
            (
                r[0].verdict.as_str(),
                r[0].value.as_str(),
                r[0].threshold.as_str()
            ),
            (FAIL, "3 uncorrected", "0")
        );
        assert_eq!(r[1].verdict, WARN);
        assert_eq!(
            (r[2].verdict.as_str(), r[2].threshold.as_str()),
            (WARN, "< 1000")
        );
        assert!(r[0].detail.contains("reset the GPU"), "{}", r[0].detail);
        g.ecc = Err("ECC is disabled".into());
        assert!(ecc(&g)
            .iter()
            .all(|c| c.verdict == NOT_RUN && c.detail.contains("ECC is disabled")));
    }

    #[test]
    fn xids_fail_warn_or_pass_by_their_meaning() {
        let mut g = healthy();
        g.xids = Ok(vec![13, 79, 13]);
        let c = xid(&g);
        assert_eq!((c.verdict.as_str(), c.value.as_str()), (FAIL, "13, 79"));
        assert!(
            c.detail.contains("GPU_HAS_FALLEN_OFF_THE_BUS"),
            "{}",
            c.detail
        );
        g.xids = Ok(vec![63]);
        assert_eq!(xid(&g).verdict, WARN);
        g.xids = Ok(vec![31]);
        assert_eq!(xid(&g).verdict, PASS);
        g.xids = Err("no event symbols".into());
        assert_eq!(xid(&g).verdict, NOT_RUN);
    }

    #[test]
    fn temperature_against_slowdown() {
        let mut g = healthy();
        g.temperature_c = Ok(87);
        let c = temperature(&g);
        assert_eq!(
            (c.verdict.as_str(), c.value.as_str(), c.threshold.as_str()),
            (FAIL, "87 C", "< 87 C (slowdown)")
        );
        g.temperature_c = Ok(83);
        assert_eq!(temperature(&g).verdict, WARN);
        g.slowdown_c = Err("n/a".into());
        g.temperature_c = Ok(86);
        assert_eq!(temperature(&g).verdict, FAIL);
        assert!(temperature(&g).threshold.contains("default"));
    }

    #[test]
    fn a_degraded_pcie_link_fails_on_width_and_warns_on_generation() {
        let mut g = healthy();
        g.pcie = Ok(PcieLink {
            gen: 3,
            width: 8,
            max_gen: 5,
            max_width: 16,
        });
        let c = pcie_link(&g);
        assert_eq!(
            (c.verdict.as_str(), c.value.as_str(), c.threshold.as_str()),
            (FAIL, "Gen3 x8", "Gen5 x16")
        );
        g.pcie = Ok(PcieLink {
            gen: 1,
            width: 16,
            max_gen: 5,
            max_width: 16,
        });
        assert_eq!(pcie_link(&g).verdict, WARN);
    }

    #[test]
    fn nvlink_memory_power_and_throttle_faults() {
        let mut g = healthy();
        g.nvlink = Ok(NvlinkErrors {
            links: 18,
            recovery: 2,
            ..NvlinkErrors::default()
        });
        assert_eq!(nvlink(&g).verdict, FAIL);
        g.nvlink = Ok(NvlinkErrors {
            links: 18,
            down: vec![4],
            ..NvlinkErrors::default()
        });
        assert!(nvlink(&g).detail.contains("4 are down"));
        g.nvlink = Ok(NvlinkErrors {
            links: 18,
            crc_data: 7,
            ..NvlinkErrors::default()
        });
        assert_eq!(nvlink(&g).verdict, WARN);
        g.nvlink = Err("no NVLink".into());
        assert_eq!(nvlink(&g).verdict, NOT_RUN);
        g.retired_pages_pending = Ok(true);
        assert_eq!(retired_pages_pending(&g).verdict, FAIL);
        g.retired_pages = Ok(63);
        assert_eq!(
            (
                retired_pages(&g).verdict.as_str(),
                retired_pages(&g).value.as_str()
            ),
            (FAIL, "63 retired")
        );
        g.remapped_rows = RowRemap::Counts {
            correctable: 1,
            uncorrectable: 2,
            pending: false,
            failure: true,
        };
        assert_eq!(remapped_rows(&g).verdict, FAIL);
        g.remapped_rows = RowRemap::NotUnderMig;
        assert_eq!(remapped_rows(&g).verdict, NOT_RUN);
        g.power_mw = Ok(720_000);
        let p = power(&g);
        assert_eq!(
            (p.verdict.as_str(), p.value.as_str(), p.threshold.as_str()),
            (WARN, "720.0 W", "<= 700.0 W (enforced limit)")
        );
        g.throttle_reasons = Ok(0x40 | 0x1);
        let t = throttle(&g);
        assert_eq!(
            (t.verdict.as_str(), t.value.as_str()),
            (FAIL, "hardware thermal slowdown")
        );
        g.throttle_reasons = Ok(0x20);
        assert_eq!(throttle(&g).verdict, WARN);
    }

    #[test]
    fn driver_against_the_cluster_or_the_model() {
        let ok = Ok("550.54.15".to_string());
        let c = driver(&ok, Some("570.133.20"), None);
        assert_eq!(
            (c.verdict.as_str(), c.value.as_str(), c.threshold.as_str()),
            (FAIL, "550.54.15", "570.133.20")
        );
        assert_eq!(driver(&ok, Some("550.54.15"), None).verdict, PASS);
        assert_eq!(driver(&ok, None, Some(("B200", "570.26"))).verdict, WARN);
        assert_eq!(
            driver(&ok, None, Some(("H100-80GB", "520.61.05"))).verdict,
            PASS
        );
        assert_eq!(driver(&Err("gone".into()), None, None).verdict, FAIL);
    }

    #[test]
    fn mig_layout_against_the_record() {
        let m = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let n = gpufleet_gpu::hardware::SimulatedNode::new("n", m, 1, "550.54.15");
        let l: gpufleet_gpu::mig::Layout = [("3g.40gb".to_string(), 2)].into_iter().collect();
        let plan = gpufleet_gpu::mig::plan(m, &l).unwrap();
        let gpu = n.gpu(0).unwrap();
        let c = mig_layout(&gpu, Some(&plan));
        assert_eq!(
            (c.verdict.as_str(), c.value.as_str(), c.threshold.as_str()),
            (FAIL, "whole GPU (MIG off)", "3g.40gb@0, 3g.40gb@4")
        );
        assert_eq!(mig_layout(&gpu, None).verdict, PASS);
        gpufleet_gpu::hardware::apply_layout(&n, 0, &plan).unwrap();
        assert_eq!(mig_layout(&n.gpu(0).unwrap(), Some(&plan)).verdict, PASS);
    }
}
