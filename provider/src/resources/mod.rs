//! The managed resources, one module each, and what they share.

pub(crate) mod acceptance;
pub(crate) mod checks;
mod cluster_waits;
pub(crate) mod common;
mod gpu_quota;
mod health_check;
mod node_plan;
mod reservation;
mod tenant;
mod tenant_cluster;
mod tenant_token;
pub(crate) mod waiting;

use std::sync::Arc;

use crate::framework::ResourceType;
use crate::state::ProviderState;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn ResourceType>> {
    vec![
        Arc::new(tenant::Tenant::new(state.clone())),
        Arc::new(tenant_token::TenantToken::new(state.clone())),
        Arc::new(gpu_quota::GpuQuota::new(state.clone())),
        Arc::new(reservation::Reservation::new(state.clone())),
        Arc::new(tenant_cluster::TenantCluster::new(state.clone())),
        Arc::new(health_check::HealthCheck::new(state.clone())),
    ]
}
