//! `ephemeral "gpufleet_cluster_credentials"`: a tenant cluster's endpoint and login
//! details, read at open with the provider's token (the cluster's tenant's, or the admin
//! token). Nothing to renew or close: the details are the cluster's own and stay valid
//! while it lives.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use crate::framework::{
    Attribute, Diagnostic, Diagnostics, EphemeralResourceType, Opened, Schema, Type, Value,
};
use crate::resources::common::{found, required_str};
use crate::state::ProviderState;

pub struct ClusterCredentials {
    provider: Arc<ProviderState>,
}

impl ClusterCredentials {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl EphemeralResourceType for ClusterCredentials {
    fn name(&self) -> &'static str {
        "cluster_credentials"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A tenant cluster's endpoint and login details, for this run only: never in state or plan. Use it instead of `gpufleet_tenant_cluster.credentials`.",
            vec![
                Attribute::required(
                    "cluster_id",
                    Type::String,
                    "The cluster's id (e.g. `gpufleet_tenant_cluster.x.id`).",
                ),
                Attribute::computed("orchestrator", Type::String, "`kubernetes` or `slurm`."),
                Attribute::computed(
                    "endpoint",
                    Type::String,
                    "Kubernetes API server URL, or the Slurm cluster's login endpoint (its sshd) as host:port.",
                ),
                Attribute::computed(
                    "credentials",
                    Type::String,
                    "For this cluster alone: a kubeconfig (Kubernetes: the cluster's own CA and a client certificate and key signed by it), or for Slurm a JSON object saying how to log in (`user`, `host`, `port`, `login`, `known_hosts`, `home`, `cluster`).",
                )
                .sensitive(),
            ],
        )
    }

    async fn open(&self, config: &Value) -> Result<Opened, Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(config, "cluster_id")?;
        let request = api::GetTenantClusterRequest { id: id.clone() };
        let cluster = found(&client, client.clusters().get_tenant_cluster(request).await)?
            .ok_or_else(|| {
                Diagnostics::from(Diagnostic::error_at(
                    crate::framework::AttrPath::attr("cluster_id"),
                    format!("cluster_id: no tenant cluster {id:?}"),
                    "It does not exist, or this provider's token may not see it.",
                ))
            })?;
        Ok(Opened {
            result: Value::object([
                ("cluster_id", Value::string(&cluster.id)),
                ("orchestrator", Value::string(&cluster.orchestrator)),
                ("endpoint", Value::string(&cluster.endpoint)),
                ("credentials", Value::string(&cluster.credentials)),
            ]),
            private: None,
            renew_at: None,
        })
    }
}
