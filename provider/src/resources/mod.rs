//! The managed resources, one module each, and what they share.

mod gpu_quota;
mod reservation;
mod tenant;
mod tenant_cluster;

use std::sync::Arc;

use gpufleet_proto::v1::{GpuType, QuotaUsage, QuotaUsageRequest};

use crate::client::Client;
use crate::framework::{AttrPath, Diagnostic, Diagnostics, ResourceType, Value};
use crate::provider::ProviderState;
use crate::validation;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn ResourceType>> {
    vec![
        Arc::new(tenant::Tenant::new(state.clone())),
        Arc::new(gpu_quota::GpuQuota::new(state.clone())),
        Arc::new(reservation::Reservation::new(state.clone())),
        Arc::new(tenant_cluster::TenantCluster::new(state.clone())),
    ]
}

/// A fresh idempotency key for one create call.
pub(crate) fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Converts a type error from an accessor into diagnostics.
pub(crate) fn diag(d: Diagnostic) -> Diagnostics {
    d.into()
}

/// The catalog entry of `name`, or an error on attribute `gpu_type` listing the known models.
pub(crate) async fn known_gpu_type(client: &Client, name: &str) -> Result<GpuType, Diagnostics> {
    let types = client.gpu_types().await?;
    types
        .iter()
        .find(|t| t.name == name)
        .cloned()
        .ok_or_else(|| {
            let known: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
            Diagnostic::error_at(
                AttrPath::attr("gpu_type"),
                format!("gpu_type: {}", validation::unknown_gpu_type(name, &known)),
                "",
            )
            .into()
        })
}

pub(crate) async fn quota_usage(
    client: &Client,
    tenant: &str,
    gpu_type: &str,
) -> Result<QuotaUsage, Diagnostics> {
    client
        .quotas()
        .get_quota_usage(QuotaUsageRequest {
            tenant_id: tenant.to_string(),
            gpu_type: gpu_type.to_string(),
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| client.diagnostic(&s).into())
}

/// A required string attribute of a planned or prior state.
pub(crate) fn required_str(state: &Value, name: &str) -> Result<String, Diagnostics> {
    state
        .str_attr(name)
        .map_err(diag)?
        .map(str::to_string)
        .ok_or_else(|| {
            Diagnostic::error_at(
                AttrPath::attr(name),
                format!("{name}: a value is required"),
                "",
            )
            .into()
        })
}

/// A required number attribute of a planned or prior state.
pub(crate) fn required_i64(state: &Value, name: &str) -> Result<i64, Diagnostics> {
    state.i64_attr(name).map_err(diag)?.ok_or_else(|| {
        Diagnostic::error_at(
            AttrPath::attr(name),
            format!("{name}: a value is required"),
            "",
        )
        .into()
    })
}

/// Checks a count attribute of the configuration against a minimum, when known.
pub(crate) fn check_min(config: &Value, name: &str, min: i64, diags: &mut Diagnostics) {
    match config.i64_attr(name) {
        Ok(Some(v)) => {
            if let Err(reason) = validation::at_least(v, min) {
                diags.attr_error(name, reason);
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
}
