//! `gpufleet_gpu_seconds_total{tenant_id,gpu_type,class}` (and `tenant`, the name, only
//! with `serve --metrics-tenant-names`): the GPU-seconds each tenant's clusters have held,
//! computed at each scrape from the usage intervals (`store::usage::lifetime`). No
//! in-memory count: it is exact across restarts, and never goes down (what retention
//! prunes is carried into the totals).

use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Opts, Registry};

use crate::store::usage::Lifetime;

pub fn families(rows: &[Lifetime], tenant_names: bool) -> Vec<MetricFamily> {
    let registry = Registry::new();
    let labels: &[&str] = if tenant_names {
        &["tenant_id", "tenant", "gpu_type", "class"]
    } else {
        &["tenant_id", "gpu_type", "class"]
    };
    let counter = CounterVec::new(
        Opts::new(
            "gpufleet_gpu_seconds_total",
            "GPU-seconds held by each tenant's clusters, by GPU model and capacity class (guaranteed, burst, borrowed-preemptible, on-demand).",
        ),
        labels,
    )
    .expect("a valid counter definition");
    registry
        .register(Box::new(counter.clone()))
        .expect("a counter registered once");
    for r in rows {
        let series = if tenant_names {
            counter.with_label_values(&[&r.tenant_id, &r.tenant, &r.gpu_type, &r.class])
        } else {
            counter.with_label_values(&[&r.tenant_id, &r.gpu_type, &r.class])
        };
        series.inc_by(r.gpu_seconds as f64);
    }
    registry.gather()
}
