//! A replay's report as people read it (Markdown tables: the pooled fleet beside its
//! fixed partitions, then team by team) or as JSON for tools.

use std::fmt::Write;

use crate::measures::{Scenario, TeamMeasures};
use crate::Report;

pub fn json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("a report is plain data")
}

pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let models: Vec<String> = r
        .models
        .iter()
        .map(|m| {
            format!(
                "{} {} pool + {} on-demand nodes x {} GPUs",
                m.gpu_type, m.pool_nodes, m.on_demand_nodes, m.gpus_per_node
            )
        })
        .collect();
    let s = &r.summary;
    let _ = writeln!(
        out,
        "Replay of {} ({:?} layout: {} rows, {} jobs{}) on {} ({}); horizon {}; both scenarios replayed in {:.2} s ({:.0} jobs/s)\n",
        r.trace.display(),
        s.layout,
        s.rows,
        s.jobs.len(),
        left_out(s),
        r.fleet.display(),
        models.join("; "),
        duration(r.horizon_seconds),
        r.replay_seconds,
        r.rows_per_second,
    );
    let (p, b) = (&r.pooled, &r.partitions);
    let _ = writeln!(out, "| measure | pooled | fixed partitions (baseline) |");
    let _ = writeln!(out, "|---|---|---|");
    let mut row = |name: &str, f: &dyn Fn(&Scenario) -> String| {
        let _ = writeln!(out, "| {name} | {} | {} |", f(p), f(b));
    };
    row("pool GPU utilisation (held)", &|s| {
        format!("{:.1}%", s.pool_utilisation * 100.0)
    });
    row("pool GPU utilisation (used)", &|s| {
        format!("{:.1}%", s.pool_used_utilisation * 100.0)
    });
    row("GPU-hours held / asked by the jobs", &|s| {
        format!("{:.1} / {:.1}", s.held_gpu_hours, s.asked_gpu_hours)
    });
    row("GPU-hours used", &|s| format!("{:.1}", s.used_gpu_hours));
    if r.summary.mig_jobs > 0 {
        row("MIG instance-hours asked (GPU-equivalent hours)", &|s| {
            format!(
                "{:.1} ({:.1})",
                s.mig_slice_hours, s.mig_gpu_equivalent_hours
            )
        });
    }
    row("pool GPU-hours borrowed beyond guarantees", &|s| {
        format!("{:.1}", s.borrowed_gpu_hours)
    });
    row("idle-but-guaranteed GPU-hours", &|s| {
        format!("{:.1}", s.idle_guaranteed_gpu_hours)
    });
    row("on-demand GPU-hours", &|s| {
        format!("{:.1}", s.on_demand_gpu_hours)
    });
    row("cost", &|s| cost(s.cost, s.unpriced_gpu_hours));
    row("wait p50 / p95", &|s| {
        format!(
            "{} / {}",
            wait(s.wait_p50_seconds),
            wait(s.wait_p95_seconds)
        )
    });
    row("jobs admitted / never admitted", &|s| {
        format!("{} / {}", s.admitted, s.never_admitted)
    });
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| team | guaranteed GPUs (share) | jobs | wait p50 / p95 pooled | wait p50 / p95 partitions | share held pooled | share held partitions | burst GPU-h pooled | on-demand GPU-h pooled / partitions | cost pooled / partitions | share of borrowed GPU-h pooled / weighted fair share |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for (tp, tb) in p.teams.iter().zip(&b.teams) {
        let _ = writeln!(
            out,
            "| {} | {} ({:.1}%) | {}{} | {} | {} | {:.1}% | {:.1}% | {:.1} | {:.1} / {:.1} | {:.2} / {:.2} | {} / {} |",
            tp.team,
            tp.guaranteed_gpus,
            tp.guaranteed_share * 100.0,
            tp.jobs,
            never(tp, tb),
            waits(tp),
            waits(tb),
            tp.share * 100.0,
            tb.share * 100.0,
            tp.burst_gpu_hours,
            tp.on_demand_gpu_hours,
            tb.on_demand_gpu_hours,
            tp.cost,
            tb.cost,
            percent(tp.borrowed_share),
            percent(tp.weighted_fair_share),
        );
    }
    out
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{:.1}%", s * 100.0))
}

fn left_out(s: &crate::trace::Trace) -> String {
    let mut parts = Vec::new();
    if s.skipped_without_gpus > 0 {
        parts.push(format!("{} without GPUs left out", s.skipped_without_gpus));
    }
    if s.skipped_never_ran > 0 {
        parts.push(format!("{} that never ran left out", s.skipped_never_ran));
    }
    if s.used_reported < s.jobs.len() {
        parts.push(format!(
            "{} without a used fraction, busy on every GPU they ask for",
            s.jobs.len() - s.used_reported
        ));
    }
    if s.shared_gpu_rounded_up > 0 {
        parts.push(format!(
            "{} GPU-sharing rows given a whole GPU",
            s.shared_gpu_rounded_up
        ));
    }
    if s.shared_gpu_as_mig > 0 {
        parts.push(format!(
            "{} GPU-sharing rows given a MIG instance",
            s.shared_gpu_as_mig
        ));
    }
    if s.mig_jobs > 0 {
        parts.push(format!("{} asking for MIG instances", s.mig_jobs));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; {}", parts.join(", "))
    }
}

fn never(p: &TeamMeasures, b: &TeamMeasures) -> String {
    if p.never_admitted == 0 && b.never_admitted == 0 {
        String::new()
    } else {
        format!(
            " ({} / {} never admitted)",
            p.never_admitted, b.never_admitted
        )
    }
}

fn waits(t: &TeamMeasures) -> String {
    format!(
        "{} / {}",
        wait(t.wait_p50_seconds),
        wait(t.wait_p95_seconds)
    )
}

fn cost(cost: f64, unpriced: f64) -> String {
    if unpriced > 0.0 {
        format!("{cost:.2} ({unpriced:.1} GPU-h unpriced)")
    } else {
        format!("{cost:.2}")
    }
}

fn wait(seconds: Option<i64>) -> String {
    seconds.map_or_else(|| "-".to_string(), duration)
}

/// `0s`, `45s`, `12m`, `1.5h`, `3.2d`.
pub fn duration(seconds: i64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{:.1}h", s as f64 / 3_600.0),
        s => format!("{:.1}d", s as f64 / 86_400.0),
    }
}
