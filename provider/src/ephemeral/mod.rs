//! The ephemeral resources (Terraform 1.10+): credentials a configuration uses during one
//! plan or apply (in a provider block, a provisioner) that no state or plan keeps.
//!
//! - `cluster_credentials`: a cluster's endpoint and login details (kubeconfig, or
//!   Slurm's login JSON), read with the provider's token;
//! - `tenant_token`: a token minted at open (scope `read` by default, a short expiry) and
//!   revoked at close.

mod cluster_credentials;
mod tenant_token;

use std::sync::Arc;

use crate::framework::EphemeralResourceType;
use crate::state::ProviderState;

pub fn all(state: &Arc<ProviderState>) -> Vec<Arc<dyn EphemeralResourceType>> {
    vec![
        Arc::new(cluster_credentials::ClusterCredentials::new(state.clone())),
        Arc::new(tenant_token::TenantToken::new(state.clone())),
    ]
}
