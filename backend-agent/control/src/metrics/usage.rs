//! `gpufleet_gpu_seconds_total{tenant_id,gpu_type,class,mig_profile}` (and `tenant`, the
//! name, only with `serve --metrics-tenant-names`): the GPU-seconds each tenant's clusters
//! have held, computed at each scrape from the usage intervals (`store::usage::lifetime`);
//! `mig_profile` is the MIG profile a cluster's layout cuts its GPUs into (its part of the
//! GPUs: `store::usage::profile_shares`), `none` for whole GPUs. Beside it
//! `gpufleet_mig_slice_seconds_total` (MIG instances held times seconds, only for MIG
//! profiles), `gpufleet_gpu_seconds_used_total` (busy, from the node agents' utilisation
//! readings) and `gpufleet_gpu_seconds_measured_total` (held time those readings covered),
//! with the same labels, the last two only for a group whose GPUs reported utilisation: a
//! series that is absent is not reported (MIG under NVML), not 0. No in-memory count: they
//! are exact across restarts, and never go down (what retention prunes is carried into
//! the totals). The operator's view has every tenant's series; a team's view
//! ([`super::team`]) its own.

use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Opts, Registry};

use crate::store::usage::{Lifetime, LifetimeUsed, WHOLE_GPUS};

pub fn families(held: &[Lifetime], used: &[LifetimeUsed], tenant_names: bool) -> Vec<MetricFamily> {
    let registry = Registry::new();
    let labels: &[&str] = if tenant_names {
        &["tenant_id", "tenant", "gpu_type", "class", "mig_profile"]
    } else {
        &["tenant_id", "gpu_type", "class", "mig_profile"]
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
        "GPU-seconds held by each tenant's clusters, by GPU model, capacity class (guaranteed, burst, borrowed-preemptible, on-demand) and MIG profile (none: whole GPUs; a profile's part of the GPUs its cluster's layout cuts).",
    );
    let slices_total = counter(
        "gpufleet_mig_slice_seconds_total",
        "MIG instances held by each tenant's clusters times seconds, by GPU model, capacity class and MIG profile.",
    );
    let used_total = counter(
        "gpufleet_gpu_seconds_used_total",
        "GPU-seconds the held GPUs were busy, from their node agents' utilisation readings; absent where no GPU reported utilisation (not reported, e.g. MIG), not 0.",
    );
    let measured_total = counter(
        "gpufleet_gpu_seconds_measured_total",
        "GPU-seconds held that utilisation readings covered (gpufleet_gpu_seconds_used_total is of these).",
    );
    let labelled = |tenant_id: &str, tenant: &str, gpu_type: &str, class: &str, profile: &str| {
        let mut values: Vec<String> = vec![tenant_id.into()];
        if tenant_names {
            values.push(tenant.into());
        }
        values.extend([gpu_type.into(), class.into(), profile.into()]);
        values
    };
    for r in held {
        let values = labelled(
            &r.tenant_id,
            &r.tenant,
            &r.gpu_type,
            &r.class,
            &r.mig_profile,
        );
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        held_total
            .with_label_values(&values)
            .inc_by(r.gpu_seconds as f64);
        if r.mig_profile != WHOLE_GPUS {
            slices_total
                .with_label_values(&values)
                .inc_by(r.slice_seconds as f64);
        }
    }
    for r in used {
        let values = labelled(
            &r.tenant_id,
            &r.tenant,
            &r.gpu_type,
            &r.class,
            &r.mig_profile,
        );
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
    fn used_is_in_seconds_beside_held_and_absent_where_not_reported_by_mig_profile() {
        let held = [
            Lifetime {
                tenant_id: "t1".into(),
                tenant: "vision".into(),
                gpu_type: "H100-80GB".into(),
                class: "guaranteed".into(),
                mig_profile: "none".into(),
                gpu_seconds: 800,
                slice_seconds: 0,
            },
            Lifetime {
                tenant_id: "t1".into(),
                tenant: "vision".into(),
                gpu_type: "A100-40GB".into(),
                class: "burst".into(),
                mig_profile: "none".into(),
                gpu_seconds: 70,
                slice_seconds: 0,
            },
            // One node of 8 H100s cut into 7 1g.10gb each, for 10 s.
            Lifetime {
                tenant_id: "t1".into(),
                tenant: "vision".into(),
                gpu_type: "H100-80GB".into(),
                class: "guaranteed".into(),
                mig_profile: "1g.10gb".into(),
                gpu_seconds: 80,
                slice_seconds: 560,
            },
        ];
        let used = [LifetimeUsed {
            tenant_id: "t1".into(),
            tenant: "vision".into(),
            gpu_type: "H100-80GB".into(),
            class: "guaranteed".into(),
            mig_profile: "none".into(),
            used_ms: 200_500,
            measured_ms: 400_000,
        }];
        let text =
            gpufleet_process::metrics_endpoint::encode(families(&held, &used, false)).unwrap();
        let h100 = r#"class="guaranteed",gpu_type="H100-80GB",mig_profile="none",tenant_id="t1""#;
        let mig = r#"class="guaranteed",gpu_type="H100-80GB",mig_profile="1g.10gb",tenant_id="t1""#;
        for line in [
            format!("gpufleet_gpu_seconds_total{{{h100}}} 800"),
            format!("gpufleet_gpu_seconds_used_total{{{h100}}} 200.5"),
            format!("gpufleet_gpu_seconds_measured_total{{{h100}}} 400"),
            format!("gpufleet_gpu_seconds_total{{{mig}}} 80"),
            format!("gpufleet_mig_slice_seconds_total{{{mig}}} 560"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Whole GPUs have no slice series.
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("gpufleet_mig_slice_seconds_total")
                    && l.contains(r#"mig_profile="none""#)),
            "{text}"
        );
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
