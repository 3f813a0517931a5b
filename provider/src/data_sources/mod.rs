//! The data sources, one module each.

mod audit_log;
mod availability;
mod cluster_dashboard;
mod driver_versions;
mod events;
mod gpu_types;
mod health_report;
mod lookups;
mod mig_layout;
mod nodes;
mod quota_usage;
mod usage;

use std::sync::Arc;

use crate::framework::{AttrPath, DataSourceType, Diagnostic, Diagnostics, Value};
use crate::state::ProviderState;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn DataSourceType>> {
    vec![
        Arc::new(gpu_types::GpuTypes::new(state.clone())),
        Arc::new(availability::Availability::new(state.clone())),
        Arc::new(nodes::Nodes::new(state.clone())),
        Arc::new(quota_usage::QuotaUsage::new(state.clone())),
        Arc::new(mig_layout::MigLayout::new(state.clone())),
        Arc::new(driver_versions::DriverVersions::new(state.clone())),
        Arc::new(events::Events::new(state.clone())),
        Arc::new(health_report::HealthReport::new(state.clone())),
        Arc::new(cluster_dashboard::ClusterDashboard::new(state.clone())),
        Arc::new(lookups::Tenants::new(state.clone())),
        Arc::new(lookups::Clusters::new(state.clone())),
        Arc::new(lookups::Reservations::new(state.clone())),
        Arc::new(audit_log::AuditLog::new(state.clone())),
        Arc::new(usage::Usage::new(state.clone())),
    ]
}

/// A required string argument of a data source.
pub(crate) fn required_arg(config: &Value, name: &str) -> Result<String, Diagnostics> {
    config
        .str_attr(name)
        .map_err(Diagnostics::from)?
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
