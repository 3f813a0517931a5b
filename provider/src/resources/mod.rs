//! The managed resources, one module each, and what they share.

pub(crate) mod acceptance;
mod capacity_wait;
pub(crate) mod checks;
mod cluster_node;
mod cluster_waits;
pub(crate) mod common;
mod credentials;
mod destroy_run;
mod gpu_quota;
mod health_check;
pub(crate) mod identity;
mod node_plan;
mod reservation;
mod tenant;
mod tenant_cluster;
mod tenant_token;
pub(crate) mod waiting;

use std::sync::Arc;

use crate::framework::ResourceType;
use crate::state::ProviderState;
use credentials::Withheld;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn ResourceType>> {
    // The resources that kept credentials in state, wrapped (see `credentials`).
    let withheld = |r: Arc<dyn ResourceType>, kept| Arc::new(Withheld::new(r, kept, state.clone()));
    vec![
        withheld(
            Arc::new(tenant::Tenant::new(state.clone())),
            credentials::TENANT,
        ),
        withheld(
            Arc::new(tenant_token::TenantToken::new(state.clone())),
            credentials::TENANT_TOKEN,
        ),
        Arc::new(gpu_quota::GpuQuota::new(state.clone())),
        Arc::new(reservation::Reservation::new(state.clone())),
        withheld(
            Arc::new(tenant_cluster::TenantCluster::new(state.clone())),
            credentials::TENANT_CLUSTER,
        ),
        Arc::new(health_check::HealthCheck::new(state.clone())),
    ]
}
