//! `gpufleet_quota_usage`: what a tenant's quota of one model allows, uses and reserves.

use std::sync::Arc;

use async_trait::async_trait;

use super::required_arg;
use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::state::ProviderState;

pub struct QuotaUsage {
    provider: Arc<ProviderState>,
}

impl QuotaUsage {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl DataSourceType for QuotaUsage {
    fn name(&self) -> &'static str {
        "quota_usage"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A tenant's quota of one GPU model and what counts against it.",
            vec![
                Attribute::computed(
                    "id",
                    Type::String,
                    "An id made of the tenant and the model.",
                ),
                Attribute::optional("tenant", Type::String, "The tenant, by id or by name. With a tenant token it may be left out: the token's own tenant."),
                Attribute::required("gpu_type", Type::String, "GPU model, e.g. `H100-80GB`."),
                Attribute::computed("gpus", Type::Number, "Guaranteed GPUs; 0 without a quota."),
                Attribute::computed("burst_gpus", Type::Number, "Burst GPUs; 0 without a quota."),
                Attribute::computed(
                    "used",
                    Type::Number,
                    "GPUs held by clusters that do not draw from a reservation.",
                ),
                Attribute::computed(
                    "reserved",
                    Type::Number,
                    "Peak GPUs held by not-yet-ended reservations from now on.",
                ),
                Attribute::computed(
                    "available",
                    Type::Number,
                    "GPUs the tenant can obtain now from the pool: the smallest of `quota_left`, `capacity_free` and the free pool GPUs other tenants' lending limits leave it.",
                ),
                Attribute::computed(
                    "quota_left",
                    Type::Number,
                    "`gpus + burst_gpus - (used + reserved)`, never below zero.",
                ),
                Attribute::computed(
                    "capacity_free",
                    Type::Number,
                    "GPUs of pool nodes free from now on (held by no cluster or reservation), whoever asks.",
                ),
                Attribute::computed(
                    "binding",
                    Type::String,
                    "Which limit `available` is: `quota` (the tenant's quota is the smallest), `capacity` (the pool is) or `lending_limit` (other tenants' lending limits keep the rest of the free pool idle for them).",
                ),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        // Left out: the token's own tenant (the backend refuses that for the admin token).
        let tenant = config
            .str_attr("tenant")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let gpu_type = required_arg(config, "gpu_type")?;
        // A data source reads what exists: an unknown tenant is an error here.
        let request = gpufleet_proto::v1::QuotaUsageRequest {
            tenant_id: tenant.clone(),
            gpu_type: gpu_type.clone(),
        };
        let usage = client
            .quotas()
            .get_quota_usage(request)
            .await
            .map_err(|s| client.diagnostic(&s))?
            .into_inner();
        let mut state = config.clone();
        state.set(
            "id",
            Value::String(format!("{}/{gpu_type}", usage.tenant_id)),
        );
        state.set("gpus", Value::Number(usage.gpus));
        state.set("burst_gpus", Value::Number(usage.burst_gpus));
        state.set("used", Value::Number(usage.used));
        state.set("reserved", Value::Number(usage.reserved));
        state.set("available", Value::Number(usage.available));
        state.set("quota_left", Value::Number(usage.quota_left));
        state.set("capacity_free", Value::Number(usage.capacity_free));
        state.set("binding", Value::String(usage.binding));
        Ok(state)
    }
}
