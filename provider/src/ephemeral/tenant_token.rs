//! `ephemeral "gpufleet_tenant_token"`: a token minted for one run and revoked after it.
//!
//! Open creates a token named `<name_prefix>-<8 random hex>` (so plans and applies that
//! overlap never collide) with scope `read` unless asked otherwise, expiring after
//! `ttl_seconds`; close revokes it. The expiry bounds a token whose close never came
//! (Terraform killed): it stops working by itself. Renew has nothing to do: the token
//! lives its whole expiry. The secret is in the open's answer only: the backend keeps its
//! hash, Terraform keeps it in memory for the run.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;
use serde::{Deserialize, Serialize};

use crate::framework::{
    Attribute, Diagnostic, Diagnostics, EphemeralResourceType, Opened, Schema, Type, Value,
};
use crate::resources::common::{answered, deleted, diag, optional_tenant, request_id};
use crate::state::ProviderState;
use crate::{times, validation};

/// How long a minted token works when `ttl_seconds` is unset: longer than most applies.
const DEFAULT_TTL_SECONDS: i64 = 3600;
const MIN_TTL_SECONDS: i64 = 60;
/// A day: an ephemeral token that outlives that is a standing one.
const MAX_TTL_SECONDS: i64 = 86_400;
const DEFAULT_PREFIX: &str = "tf-ephemeral";
/// Leaves room for `-` and 8 hex digits within a 63-character DNS label.
const MAX_PREFIX_CHARS: usize = 54;

pub struct TenantToken {
    provider: Arc<ProviderState>,
}

impl TenantToken {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

/// What close needs to revoke the token (Terraform keeps it in memory only).
#[derive(Serialize, Deserialize)]
struct Minted {
    tenant_id: String,
    name: String,
}

fn ttl(config: &Value) -> Result<i64, Diagnostic> {
    Ok(config
        .i64_attr("ttl_seconds")?
        .unwrap_or(DEFAULT_TTL_SECONDS))
}

fn prefix(config: &Value) -> Result<String, Diagnostic> {
    Ok(config
        .str_attr("name_prefix")?
        .unwrap_or(DEFAULT_PREFIX)
        .to_string())
}

/// A name no other open shares: the prefix and 8 random hex digits.
fn minted_name(prefix: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &random[..8])
}

#[async_trait]
impl EphemeralResourceType for TenantToken {
    fn name(&self) -> &'static str {
        "tenant_token"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A tenant token minted for this run only (open creates it, close revokes it, `ttl_seconds` bounds it if close never comes): never in state or plan. Configure a provider with it (`token = ephemeral.gpufleet_tenant_token.x.token`).",
            vec![
                Attribute::optional(
                    "tenant",
                    Type::String,
                    "The tenant, by id or by name. With a tenant's write token it may be left out: the token's own tenant. With the admin token left out: an admin-scoped token (scope `read` only).",
                ),
                Attribute::optional_computed(
                    "scope",
                    Type::String,
                    "`read` (every read and plan-time dry run, never a change) or `write`. Defaults to `read`.",
                ),
                Attribute::optional_computed(
                    "ttl_seconds",
                    Type::Number,
                    "How long the token works if it is not revoked first: 60 to 86400. Defaults to 3600.",
                ),
                Attribute::optional_computed(
                    "name_prefix",
                    Type::String,
                    "The start of the token's name (a DNS label of at most 54 characters); 8 random hex digits follow. Defaults to `tf-ephemeral`.",
                ),
                Attribute::computed("name", Type::String, "The minted token's name."),
                Attribute::computed("tenant_id", Type::String, "The tenant's id (empty for an admin-scoped token)."),
                Attribute::computed("expires_at", Type::String, "When the token stops working (RFC 3339)."),
                Attribute::computed("token", Type::String, "The secret.").sensitive(),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        match config.str_attr("scope") {
            Ok(Some("read" | "write")) | Ok(None) => {}
            Ok(Some(other)) => diags.attr_error(
                "scope",
                format!("{other:?} is not a scope; use \"read\" (plan and read, never change) or \"write\""),
            ),
            Err(d) => diags.push(d),
        }
        match config.i64_attr("ttl_seconds") {
            Ok(Some(t)) if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&t) => diags.attr_error(
                "ttl_seconds",
                format!("{t} is out of range: {MIN_TTL_SECONDS} to {MAX_TTL_SECONDS}"),
            ),
            Ok(_) => {}
            Err(d) => diags.push(d),
        }
        match config.str_attr("name_prefix") {
            Ok(Some(p)) => {
                if let Err(reason) = validation::dns_label(p) {
                    diags.attr_error("name_prefix", reason);
                } else if p.len() > MAX_PREFIX_CHARS {
                    diags.attr_error(
                        "name_prefix",
                        format!(
                            "at most {MAX_PREFIX_CHARS} characters (8 random hex digits follow)"
                        ),
                    );
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        diags.into_result()
    }

    async fn open(&self, config: &Value) -> Result<Opened, Diagnostics> {
        let client = self.provider.client()?;
        let scope = config
            .str_attr("scope")
            .map_err(diag)?
            .unwrap_or("read")
            .to_string();
        let ttl = ttl(config).map_err(diag)?;
        let prefix = prefix(config).map_err(diag)?;
        let expires = times::now() + ttl;
        let request = api::CreateTokenRequest {
            tenant_id: optional_tenant(config)?,
            name: minted_name(&prefix),
            scope: scope.clone(),
            expires_at: Some(times::to_proto(expires)),
            request_id: request_id(),
            validate_only: false,
        };
        let issued = answered(&client, client.access().create_token(request).await)?;
        let token = issued.token.unwrap_or_default();
        let private = serde_json::to_vec(&Minted {
            tenant_id: token.tenant_id.clone(),
            name: token.name.clone(),
        })
        .map_err(|e| diag(Diagnostic::error(format!("tenant token: {e}"), "")))?;
        let expires_at = token.expires_at.map_or(expires, |t| t.seconds);
        Ok(Opened {
            result: Value::object([
                ("tenant", config.get("tenant").clone()),
                ("scope", Value::string(&token.scope)),
                ("ttl_seconds", Value::Number(ttl)),
                ("name_prefix", Value::String(prefix)),
                ("name", Value::string(&token.name)),
                ("tenant_id", Value::string(&token.tenant_id)),
                ("expires_at", Value::String(times::canonical(expires_at))),
                ("token", Value::String(issued.secret)),
            ]),
            private: Some(private),
            renew_at: None,
        })
    }

    /// Revokes the minted token: every secret of its name stops working at once.
    async fn close(&self, private: Option<&[u8]>) -> Result<(), Diagnostics> {
        let Some(private) = private else {
            return Ok(());
        };
        let minted: Minted = serde_json::from_slice(private).map_err(|e| {
            diag(Diagnostic::error(
                format!("tenant token: what open kept is unreadable ({e})"),
                "The token was not revoked; it stops working at its expiry.",
            ))
        })?;
        let client = self.provider.client()?;
        let request = api::RevokeTokenRequest {
            tenant_id: minted.tenant_id,
            name: minted.name,
        };
        deleted(&client, client.access().revoke_token(request).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_scopes_ttls_and_prefixes_are_refused_with_the_attribute() {
        let e = TenantToken::new(Arc::new(ProviderState::default()));
        let config = Value::object([
            ("scope", Value::string("admin")),
            ("ttl_seconds", Value::Number(10)),
            ("name_prefix", Value::string("Not_A_Label")),
        ]);
        let err = e.validate(&config).await.unwrap_err();
        let summaries: Vec<&str> = err.0.iter().map(|d| d.summary.as_str()).collect();
        assert!(summaries[0].starts_with("scope: "), "{summaries:?}");
        assert!(summaries[1].starts_with("ttl_seconds: 10 is out of range"));
        assert!(summaries[2].starts_with("name_prefix: "));
        assert!(e
            .validate(&Value::object([("scope", Value::Null)]))
            .await
            .is_ok());
    }

    #[test]
    fn minted_names_are_dns_labels_that_differ_each_open() {
        let long = "p".repeat(MAX_PREFIX_CHARS);
        let a = minted_name(&long);
        assert!(validation::dns_label(&a).is_ok(), "{a}");
        assert_ne!(minted_name("tf"), minted_name("tf"));
    }
}
