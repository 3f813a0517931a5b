//! `gpufleet_health_report`: the latest health-check results of a cluster's nodes
//! (acceptance checks, on-demand checks and the periodic quick checks).

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::required_arg;
use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::resources::acceptance::{result_type, results, summary_type, summary_value, whole_gbps};
use crate::state::ProviderState;
use crate::times;

pub struct HealthReport {
    provider: Arc<ProviderState>,
}

impl HealthReport {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn answer_state(config: &Value, r: &api::ClusterHealthReport) -> Value {
    let mut s = config.clone();
    s.set("id", Value::String(format!("health/{}", r.cluster_id)));
    s.set("status", Value::string(&r.status));
    s.set("level", Value::string(&r.level));
    s.set(
        "checked_at",
        r.checked_at
            .as_ref()
            .filter(|t| t.seconds > 0)
            .map_or(Value::Null, |t| Value::String(times::canonical(t.seconds))),
    );
    s.set(
        "nodes",
        Value::List(r.nodes.iter().map(summary_value).collect()),
    );
    s.set("results", results(r));
    s.set("bus_bandwidth_gbps", whole_gbps(r.bus_bandwidth_gbps));
    s.set(
        "min_bus_bandwidth_gbps",
        whole_gbps(r.min_bus_bandwidth_gbps),
    );
    s
}

#[async_trait]
impl DataSourceType for HealthReport {
    fn name(&self) -> &'static str {
        "health_report"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The latest health-check results of a tenant cluster's nodes: its acceptance checks, checks a `gpufleet_health_check` ran, and the periodic quick checks. A tenant token reads only its own clusters' reports.",
            vec![
                Attribute::computed("id", Type::String, "`health/<cluster_id>`."),
                Attribute::required("cluster_id", Type::String, "The cluster (a `gpufleet_tenant_cluster`'s `id`); the token must see it."),
                Attribute::computed("status", Type::String, "`passed`, `failed`, `running` or `not_run`: the cluster's latest run."),
                Attribute::computed("level", Type::String, "The level of the latest run."),
                Attribute::computed("checked_at", Type::String, "When the latest run finished (RFC 3339); null before any."),
                Attribute::computed("nodes", Type::list(summary_type()), "Each node's latest verdict (its nodes now, and those the latest run took out): `node`, `level`, `verdict`, `summary`, `action`, `checked_at`."),
                Attribute::computed("results", Type::list(result_type()), "Every check of those results: `node`, `check`, `gpu_uuid`, `verdict` (`pass`, `warn`, `fail` or `not_run`), `value`, `threshold`, `detail`, `peer`."),
                Attribute::computed("bus_bandwidth_gbps", Type::Number, "All-reduce bus bandwidth equivalent of the slowest pair in the latest run, Gbit/s (whole)."),
                Attribute::computed("min_bus_bandwidth_gbps", Type::Number, "The cluster's threshold for it (0: not judged)."),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let cluster_id = required_arg(config, "cluster_id")?;
        let r = client
            .health()
            .get_health_report(api::GetHealthReportRequest { cluster_id })
            .await
            .map_err(|s| client.diagnostic(&s))?
            .into_inner();
        Ok(answer_state(config, &r))
    }
}
