//! The automatic-quarantine breakers' gauges, per GPU model:
//! `gpufleet_quarantine_breaker_open{gpu_type}` (1 open, 0 closed),
//! `gpufleet_quarantine_breaker_quarantines{gpu_type}` (automatic quarantines in the
//! current window), `gpufleet_quarantine_breaker_cap{gpu_type}` and
//! `gpufleet_quarantine_breaker_held{gpu_type}` (quarantines held back since it opened).

use prometheus::Registry;

use crate::scheduling::breaker::View;

pub fn gauges(views: &[View]) -> Vec<prometheus::proto::MetricFamily> {
    use gpufleet_process::metrics_endpoint::gauge_vec;
    let registry = Registry::new();
    let open = gauge_vec(
        &registry,
        "gpufleet_quarantine_breaker_open",
        "Whether the automatic-quarantine breaker of a GPU model is open (1): failed checks then leave its nodes in service until an operator resets it (`gpufleet-agent breaker reset`).",
        &["gpu_type"],
    );
    let counted = gauge_vec(
        &registry,
        "gpufleet_quarantine_breaker_quarantines",
        "Automatic quarantines of a GPU model in the breaker's current window.",
        &["gpu_type"],
    );
    let cap = gauge_vec(
        &registry,
        "gpufleet_quarantine_breaker_cap",
        "Automatic quarantines of a GPU model a window may hold before its breaker opens (0: the breaker is off).",
        &["gpu_type"],
    );
    let held = gauge_vec(
        &registry,
        "gpufleet_quarantine_breaker_held",
        "Quarantines of a GPU model the open breaker held back (nodes left in service) since it opened.",
        &["gpu_type"],
    );
    for v in views {
        let m = [v.gpu_type.as_str()];
        open.with_label_values(&m)
            .set(if v.open.is_some() { 1.0 } else { 0.0 });
        counted
            .with_label_values(&m)
            .set(v.quarantines_in_window as f64);
        cap.with_label_values(&m).set(v.cap as f64);
        held.with_label_values(&m)
            .set(v.open.as_ref().map_or(0.0, |o| o.held as f64));
    }
    registry.gather()
}
