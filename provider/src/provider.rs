//! The provider block: where the backend is and which token to use; and the registration
//! of every resource, data source, list resource and action, which share the state `configure` makes
//! (`state::ProviderState`). Nothing below imports this module.

use std::sync::Arc;

use async_trait::async_trait;

use crate::client::Client;
use crate::failover::MAX_ENDPOINTS;
use crate::framework::{
    ActionType, AttrPath, Attribute, DataSourceType, Diagnostic, Diagnostics,
    EphemeralResourceType, ListResourceType, ProviderType, ResourceIdentity, ResourceType, Schema,
    Type, Value,
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

/// The backend's endpoints: `endpoint`, else `endpoints`, else GPUFLEET_ENDPOINT (several
/// comma-separated), else the default. Each is checked as a URL where the client is made.
fn endpoints(config: &Value, env: Option<&str>) -> Result<Vec<String>, Diagnostics> {
    let one = config.str_attr("endpoint").map_err(Diagnostics::from)?;
    let list = match config.get("endpoints") {
        Value::List(items) => Some(items),
        _ => None,
    };
    let error = |summary: String| -> Diagnostics {
        Diagnostic::error_at(AttrPath::attr("endpoints"), summary, "").into()
    };
    let (attribute, given): (&str, Vec<String>) = match (one, list) {
        (Some(_), Some(_)) => {
            return Err(error(
                "endpoints: give either `endpoint` or `endpoints`, not both".into(),
            ))
        }
        (Some(one), None) => return Ok(vec![one.to_string()]),
        (None, Some(items)) => {
            let mut given = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => given.push(s.trim().to_string()),
                    // Known at apply: the provider is configured again then.
                    Value::Unknown => return Ok(vec![DEFAULT_ENDPOINT.to_string()]),
                    _ => return Err(error("endpoints: an endpoint is null".into())),
                }
            }
            ("endpoints", given)
        }
        (None, None) => match env.filter(|e| !e.trim().is_empty()) {
            Some(env) => (
                "GPUFLEET_ENDPOINT",
                env.split(',').map(|e| e.trim().to_string()).collect(),
            ),
            None => return Ok(vec![DEFAULT_ENDPOINT.to_string()]),
        },
    };
    if given.is_empty() {
        return Err(error(format!("{attribute}: at least one endpoint")));
    }
    if given.len() > MAX_ENDPOINTS {
        return Err(error(format!(
            "{attribute}: at most {MAX_ENDPOINTS} endpoints (got {})",
            given.len()
        )));
    }
    for (i, endpoint) in given.iter().enumerate() {
        let shown: String = endpoint.chars().take(80).collect();
        if endpoint.is_empty() {
            return Err(error(format!("{attribute}: an empty endpoint")));
        }
        if given[..i].contains(endpoint) {
            return Err(error(format!("{attribute}: {shown:?} is given twice")));
        }
        let scheme = endpoint.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("http" | "https")) {
            return Err(error(format!(
                "{attribute}: {shown:?} is not an http:// or https:// URL"
            )));
        }
    }
    Ok(given)
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
                    "URL of the gpufleet backend (`gpufleet-agent serve`). Defaults to the `GPUFLEET_ENDPOINT` environment variable (several URLs comma-separated are as `endpoints`), then `http://127.0.0.1:7700`. Conflicts with `endpoints`.",
                ),
                Attribute::optional(
                    "endpoints",
                    Type::list(Type::String),
                    "Several URLs of the same gpufleet backend (at most 8, one scheme): calls go to the first, and when the connection to one fails the provider moves to the next; reads and creates with a request id are sent again there. Conflicts with `endpoint`.",
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
        let env = std::env::var("GPUFLEET_ENDPOINT").ok();
        let endpoints = endpoints(config, env.as_deref())?;
        let token = setting(config, "token", Some("GPUFLEET_TOKEN"))?;
        let ca = setting(config, "ca_cert_pem", Some("GPUFLEET_CA_CERT_PEM"))?;
        let client = Client::new(&endpoints, token.as_deref(), ca.as_deref())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, Value)]) -> Value {
        Value::object(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())))
    }

    fn list(urls: &[&str]) -> Value {
        Value::List(urls.iter().map(|u| Value::string(*u)).collect())
    }

    fn error(config: &Value, env: Option<&str>) -> (String, Option<String>) {
        let diags = endpoints(config, env).unwrap_err();
        let d = diags.0.first().expect("a diagnostic");
        (d.summary.clone(), d.path.as_ref().map(|p| format!("{p:?}")))
    }

    #[test]
    fn endpoints_come_from_one_attribute_or_the_list_or_the_variable_with_commas() {
        let none = config(&[]);
        assert_eq!(endpoints(&none, None).unwrap(), [DEFAULT_ENDPOINT]);
        assert_eq!(
            endpoints(&none, Some("http://a:7700, http://b:7700")).unwrap(),
            ["http://a:7700", "http://b:7700"]
        );
        let one = config(&[("endpoint", Value::string("http://a:7700"))]);
        assert_eq!(
            endpoints(&one, Some("http://b:7700")).unwrap(),
            ["http://a:7700"],
            "the configuration before the variable"
        );
        let several = config(&[("endpoints", list(&["http://a:7700", "http://b:7700"]))]);
        assert_eq!(
            endpoints(&several, Some("http://c:7700")).unwrap(),
            ["http://a:7700", "http://b:7700"]
        );
        let unknown = config(&[("endpoints", Value::List(vec![Value::Unknown]))]);
        assert_eq!(endpoints(&unknown, None).unwrap(), [DEFAULT_ENDPOINT]);
    }

    #[test]
    fn endpoints_are_refused_at_plan_naming_the_attribute_and_why() {
        let both = config(&[
            ("endpoint", Value::string("http://a:7700")),
            ("endpoints", list(&["http://b:7700"])),
        ]);
        let (summary, path) = error(&both, None);
        assert_eq!(
            summary,
            "endpoints: give either `endpoint` or `endpoints`, not both"
        );
        assert_eq!(path, Some(format!("{:?}", AttrPath::attr("endpoints"))));
        let nine: Vec<String> = (0..9).map(|i| format!("http://10.0.0.{i}:7700")).collect();
        let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
        assert_eq!(
            error(&config(&[("endpoints", list(&nine))]), None).0,
            "endpoints: at most 8 endpoints (got 9)"
        );
        assert_eq!(
            error(&config(&[("endpoints", list(&[]))]), None).0,
            "endpoints: at least one endpoint"
        );
        assert_eq!(
            error(
                &config(&[("endpoints", list(&["http://a:7700", "http://a:7700"]))]),
                None
            )
            .0,
            "endpoints: \"http://a:7700\" is given twice"
        );
        assert_eq!(
            error(&config(&[("endpoints", list(&["a:7700"]))]), None).0,
            "endpoints: \"a:7700\" is not an http:// or https:// URL"
        );
        assert_eq!(
            error(&config(&[]), Some("http://a:7700,,http://b:7700")).0,
            "GPUFLEET_ENDPOINT: an empty endpoint"
        );
    }
}
