//! `gpufleet_gpu_seconds_total{tenant_id,gpu_type,class}` (and `tenant`, the name, only
//! with `serve --metrics-tenant-names`): the GPU-seconds each tenant's clusters have held,
//! computed at each scrape from the usage intervals (`store::usage::lifetime`); beside it
//! `gpufleet_gpu_seconds_used_total` (busy, from the node agents' utilisation readings) and
//! `gpufleet_gpu_seconds_measured_total` (held time those readings covered), with the same
//! labels, only for a model and class whose GPUs reported utilisation: a series that is
//! absent is not reported (MIG under NVML), not 0. No in-memory count: they are exact
//! across restarts, and never go down (what retention prunes is carried into the totals).
//! The operator's view has every tenant's series; a team's view ([`super::team`]) its own.

use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Opts, Registry};

use crate::store::usage::{Lifetime, LifetimeUsed};

pub fn families(held: &[Lifetime], used: &[LifetimeUsed], tenant_names: bool) -> Vec<MetricFamily> {
    let registry = Registry::new();
    let labels: &[&str] = if tenant_names {
        &["tenant_id", "tenant", "gpu_type", "class"]
    } else {
        &["tenant_id", "gpu_type", "class"]
    };
    let counter = |name: &str, help: &str| {
        let c = CounterVec::new(Opts::new(name, help), labels).expect("a valid counter definition");
        registry
            .register(Box::new(c.clone()))
            .expect("a counter registered once");
        c
    };
    let held_total = counter(
        "gpufleet_gpu_seconds_total",
        "GPU-seconds held by each tenant's clusters, by GPU model and capacity class (guaranteed, burst, borrowed-preemptible, on-demand).",
    );
    let used_total = counter(
        "gpufleet_gpu_seconds_used_total",
        "GPU-seconds the held GPUs were busy, from their node agents' utilisation readings; absent where no GPU reported utilisation (not reported, e.g. MIG), not 0.",
    );
    let measured_total = counter(
        "gpufleet_gpu_seconds_measured_total",
        "GPU-seconds held that utilisation readings covered (gpufleet_gpu_seconds_used_total is of these).",
    );
    let labelled = |tenant_id: &str, tenant: &str, gpu_type: &str, class: &str| -> Vec<String> {
        if tenant_names {
            vec![
                tenant_id.into(),
                tenant.into(),
                gpu_type.into(),
                class.into(),
            ]
        } else {
            vec![tenant_id.into(), gpu_type.into(), class.into()]
        }
    };
    for r in held {
        let values = labelled(&r.tenant_id, &r.tenant, &r.gpu_type, &r.class);
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        held_total
            .with_label_values(&values)
            .inc_by(r.gpu_seconds as f64);
    }
    for r in used {
        let values = labelled(&r.tenant_id, &r.tenant, &r.gpu_type, &r.class);
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        used_total
            .with_label_values(&values)
            .inc_by(r.used_ms as f64 / 1000.0);
        measured_total
            .with_label_values(&values)
            .inc_by(r.measured_ms as f64 / 1000.0);
    }
    registry.gather()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_is_in_seconds_beside_held_and_absent_where_not_reported() {
        let held = [
            Lifetime {
                tenant_id: "t1".into(),
                tenant: "vision".into(),
                gpu_type: "H100-80GB".into(),
                class: "guaranteed".into(),
                gpu_seconds: 800,
            },
            Lifetime {
                tenant_id: "t1".into(),
                tenant: "vision".into(),
                gpu_type: "A100-40GB".into(),
                class: "burst".into(),
                gpu_seconds: 70,
            },
        ];
        let used = [LifetimeUsed {
            tenant_id: "t1".into(),
            tenant: "vision".into(),
            gpu_type: "H100-80GB".into(),
            class: "guaranteed".into(),
            used_ms: 200_500,
            measured_ms: 400_000,
        }];
        let text =
            gpufleet_process::metrics_endpoint::encode(families(&held, &used, false)).unwrap();
        let h100 = r#"class="guaranteed",gpu_type="H100-80GB",tenant_id="t1""#;
        for line in [
            format!("gpufleet_gpu_seconds_total{{{h100}}} 800"),
            format!("gpufleet_gpu_seconds_used_total{{{h100}}} 200.5"),
            format!("gpufleet_gpu_seconds_measured_total{{{h100}}} 400"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // The A100s reported no utilisation: held only.
        assert!(
            text.contains(r#"gpufleet_gpu_seconds_total{class="burst""#),
            "{text}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("gpufleet_gpu_seconds_used_total") && l.contains("A100")),
            "{text}"
        );
    }
}
