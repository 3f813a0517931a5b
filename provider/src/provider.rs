//! The provider block: where the backend is and which token to use.

use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use crate::client::Client;
use crate::framework::{
    Attribute, DataSourceType, Diagnostic, Diagnostics, ProviderType, ResourceType, Schema, Type,
    Value,
};
use crate::{data_sources, resources};

pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7700";

/// What resources share: the client made by `configure`.
#[derive(Default)]
pub struct ProviderState {
    client: RwLock<Option<Arc<Client>>>,
    /// False when the provider block had values unknown until apply.
    config_known: RwLock<bool>,
    /// What this run's other resources plan and do.
    pub run: crate::this_run::ThisRun,
}

impl ProviderState {
    /// The configured client, or an error saying the provider was not configured.
    pub fn client(&self) -> Result<Arc<Client>, Diagnostics> {
        self.client
            .read()
            .ok()
            .and_then(|c| c.clone())
            .ok_or_else(|| {
                Diagnostic::error(
                    "the gpufleet provider is not configured yet",
                    "Its configuration depends on values known only after apply.",
                )
                .into()
            })
    }

    /// The client for plan-time checks: `None` when the provider configuration is not
    /// fully known yet (the checks then happen at apply, in the backend).
    pub fn plan_client(&self) -> Option<Arc<Client>> {
        if *self.config_known.read().ok()? {
            self.client().ok()
        } else {
            None
        }
    }

    fn set(&self, client: Client, known: bool) {
        if let Ok(mut slot) = self.client.write() {
            *slot = Some(Arc::new(client));
        }
        if let Ok(mut slot) = self.config_known.write() {
            *slot = known;
        }
    }
}

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
        Ok(())
    }

    fn resources(&self) -> Vec<Arc<dyn ResourceType>> {
        resources::all(&self.state)
    }

    fn data_sources(&self) -> Vec<Arc<dyn DataSourceType>> {
        data_sources::all(&self.state)
    }
}
