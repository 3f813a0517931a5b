//! The provider block: where the backend is and which token to use; and the registration
//! of every resource, data source, list resource and action, which share the state `configure` makes
//! (`state::ProviderState`). Nothing below imports this module.

use std::sync::Arc;

use async_trait::async_trait;

use crate::client::Client;
use crate::framework::{
    ActionType, Attribute, DataSourceType, Diagnostics, EphemeralResourceType, ListResourceType,
    ProviderType, ResourceIdentity, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::{actions, data_sources, ephemeral, lists, resources};

pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7700";

pub struct GpufleetProvider {
    state: Arc<ProviderState>,
}

impl GpufleetProvider {
    pub fn new() -> Self {
        Self {
            state: Arc::new(ProviderState::default()),
        }
    }
}

impl Default for GpufleetProvider {
    fn default() -> Self {
        Self::new()
    }
}

/// The value of a provider setting: the configuration, else the environment variable.
fn setting(config: &Value, name: &str, env: Option<&str>) -> Result<Option<String>, Diagnostics> {
    if let Some(v) = config.str_attr(name).map_err(Diagnostics::from)? {
        return Ok(Some(v.to_string()));
    }
    Ok(env
        .and_then(|var| std::env::var(var).ok())
        .filter(|v| !v.is_empty()))
}

#[async_trait]
impl ProviderType for GpufleetProvider {
    fn schema(&self) -> Schema {
        Schema::new(
            "The gpufleet provider manages tenants, GPU quotas, reservations and tenant clusters on a gpufleet control plane.",
            vec![
                Attribute::optional(
                    "endpoint",
                    Type::String,
                    "URL of the gpufleet backend (`gpufleet-agent serve`). Defaults to the `GPUFLEET_ENDPOINT` environment variable, then `http://127.0.0.1:7700`.",
                ),
                Attribute::optional(
                    "token",
                    Type::String,
                    "Bearer token: the admin token, or a tenant's token. Defaults to the `GPUFLEET_TOKEN` environment variable.",
                )
                .sensitive(),
                Attribute::optional(
                    "ca_cert_pem",
                    Type::String,
                    "PEM of the CA that signed the backend's TLS certificate, for `https` endpoints (e.g. `file(\"ca.pem\")`). The certificate must name the endpoint's host. Defaults to the `GPUFLEET_CA_CERT_PEM` environment variable.",
                ),
                Attribute::optional(
                    "store_credentials_in_state",
                    Type::Bool,
                    "Whether resources keep credentials in state: `gpufleet_tenant.token`, `gpufleet_tenant_token.token` and `gpufleet_tenant_cluster.credentials` (all deprecated). `false` (the default): they are null in every state and plan (a refresh empties a state that holds them); use the ephemeral resources `gpufleet_tenant_token` and `gpufleet_cluster_credentials` instead. `true` keeps them, for configurations that still read them (each read warns), until the attributes are removed.",
                ),
            ],
        )
    }

    async fn configure(&self, config: &Value) -> Result<(), Diagnostics> {
        let known = config.is_fully_known();
        let endpoint = setting(config, "endpoint", Some("GPUFLEET_ENDPOINT"))?
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = setting(config, "token", Some("GPUFLEET_TOKEN"))?;
        let ca = setting(config, "ca_cert_pem", Some("GPUFLEET_CA_CERT_PEM"))?;
        let client = Client::new(&endpoint, token.as_deref(), ca.as_deref())?;
        self.state.set(client, known);
        // Secrets stay out of state unless asked for. Unknown until apply: withheld, as by
        // default (the plan then shows null, and an apply that keeps them shows them after).
        let keep = config
            .bool_attr("store_credentials_in_state")
            .map_err(Diagnostics::from)?
            .unwrap_or(false);
        self.state.set_keeps_credentials(keep);
        Ok(())
    }

    fn resources(&self) -> Vec<Arc<dyn ResourceType>> {
        resources::all(&self.state)
    }

    fn data_sources(&self) -> Vec<Arc<dyn DataSourceType>> {
        data_sources::all(&self.state)
    }

    fn ephemeral_resources(&self) -> Vec<Arc<dyn EphemeralResourceType>> {
        ephemeral::all(&self.state)
    }

    fn identities(&self) -> Vec<Arc<dyn ResourceIdentity>> {
        resources::identity::all(&self.state)
    }

    fn list_resources(&self) -> Vec<Arc<dyn ListResourceType>> {
        lists::all(&self.state)
    }

    fn actions(&self) -> Vec<Arc<dyn ActionType>> {
        actions::all(&self.state)
    }
}
