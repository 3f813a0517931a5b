//! The managed resources, one module each, and what they share.

pub(crate) mod checks;
pub(crate) mod common;
mod gpu_quota;
mod reservation;
mod tenant;
mod tenant_cluster;

use std::sync::Arc;

use crate::framework::ResourceType;
use crate::provider::ProviderState;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn ResourceType>> {
    vec![
        Arc::new(tenant::Tenant::new(state.clone())),
        Arc::new(gpu_quota::GpuQuota::new(state.clone())),
        Arc::new(reservation::Reservation::new(state.clone())),
        Arc::new(tenant_cluster::TenantCluster::new(state.clone())),
    ]
}
