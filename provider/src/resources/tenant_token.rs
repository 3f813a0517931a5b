//! `gpufleet_tenant_token`: a named bearer token of a tenant, scope `read` (plan and read,
//! never change: a pull-request pipeline's) or `write`, with an optional expiry; rotated
//! in place, revoked on destroy.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::checks::{adopt_hint, import_tenant, verdict, Asked};
use super::common::{
    answered, deleted, diag, found, import_id, imported, optional_tenant, request_id, required_str,
    ImportId,
};
use super::tenant::{check_overlap_attr, DEFAULT_OVERLAP_SECONDS};
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, Attribute, Diagnostics,
    PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::{times, validation};

pub struct TenantToken {
    provider: Arc<ProviderState>,
}

impl TenantToken {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

/// Changing one of these issues a different token: replacement.
const REPLACED_BY: &[&str] = &["tenant", "name", "scope", "expires_at"];

/// The state from the backend's record; the secret, the tenant's spelling, the expiry's
/// spelling and the rotation settings are the configuration's (or the prior state's).
fn state(t: &api::Token, token: Value, written: &Value) -> Value {
    let expires_at = match (written.get("expires_at"), &t.expires_at) {
        (Value::String(s), Some(e)) if times::unix(s) == Ok(e.seconds) => Value::string(s),
        (_, Some(e)) => Value::String(times::canonical(e.seconds)),
        (_, None) => Value::Null,
    };
    Value::object([
        ("id", Value::String(format!("{}/{}", t.tenant_id, t.name))),
        ("tenant", written.get("tenant").clone()),
        ("tenant_id", Value::string(&t.tenant_id)),
        ("name", Value::string(&t.name)),
        ("scope", Value::string(&t.scope)),
        ("expires_at", expires_at),
        ("rotation", written.get("rotation").clone()),
        (
            "rotation_overlap_seconds",
            match written.get("rotation_overlap_seconds") {
                Value::Null => Value::Number(DEFAULT_OVERLAP_SECONDS),
                v => v.clone(),
            },
        ),
        ("token", token),
    ])
}

pub fn plan(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
    let mut planned = proposed;
    default_when_unset(
        &mut planned,
        config,
        "rotation_overlap_seconds",
        Value::Number(DEFAULT_OVERLAP_SECONDS),
    );
    match prior {
        None => {
            mark_unknown(&mut planned, &["id", "tenant_id", "token"]);
            PlannedChange {
                state: planned,
                requires_replace: vec![],
            }
        }
        Some(prior) => {
            let requires_replace = requires_replace_if_changed(prior, &planned, REPLACED_BY);
            if !requires_replace.is_empty() {
                mark_unknown(&mut planned, &["id", "tenant_id", "token"]);
            } else if changed(prior, &planned, "rotation") {
                mark_unknown(&mut planned, &["token"]);
            }
            PlannedChange {
                state: planned,
                requires_replace,
            }
        }
    }
}

fn create_request(
    planned: &Value,
    validate_only: bool,
) -> Result<api::CreateTokenRequest, Diagnostics> {
    let expires_at = match planned.str_attr("expires_at").map_err(diag)? {
        Some(text) => Some(times::to_proto(times::unix(text).map_err(|reason| {
            let mut d = Diagnostics::default();
            d.attr_error("expires_at", reason);
            d
        })?)),
        None => None,
    };
    Ok(api::CreateTokenRequest {
        tenant_id: optional_tenant(planned)?,
        name: required_str(planned, "name")?,
        scope: required_str(planned, "scope")?,
        expires_at,
        request_id: request_id(),
        validate_only,
    })
}

#[async_trait]
impl ResourceType for TenantToken {
    fn name(&self) -> &'static str {
        "tenant_token"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A named bearer token of a tenant: scope read (plan and read, never change) or write, with an optional expiry.",
            vec![
                Attribute::computed("id", Type::String, "`<tenant_id>/<name>`."),
                Attribute::optional(
                    "tenant",
                    Type::String,
                    "The tenant, by id or by name. With a tenant's write token it may be left out: the token's own tenant. Changing it forces replacement.",
                ),
                Attribute::computed("tenant_id", Type::String, "The tenant's id."),
                Attribute::required(
                    "name",
                    Type::String,
                    "The token's name: a DNS label, unique among the tenant's live tokens (`default` is the tenant's own token). Changing it forces replacement.",
                ),
                Attribute::required(
                    "scope",
                    Type::String,
                    "`read` (every read and plan-time dry run of the tenant's objects, never a change) or `write`. Changing it forces replacement.",
                ),
                Attribute::optional(
                    "expires_at",
                    Type::String,
                    "When the token stops working (RFC 3339, in the future at create). Unset: never. Changing it forces replacement.",
                ),
                Attribute::optional(
                    "rotation",
                    Type::String,
                    "Any value; changing it rotates the token in place: the new secret goes to `token`, the old one keeps working for `rotation_overlap_seconds`.",
                ),
                Attribute::optional_computed(
                    "rotation_overlap_seconds",
                    Type::Number,
                    "How long the old secret keeps working after a rotation: 0 to 604800 (7 days). Defaults to 3600.",
                ),
                Attribute::computed(
                    "token",
                    Type::String,
                    "The secret, issued at create and at each rotation and kept in state (the backend stores only its hash). Null after import.",
                )
                .sensitive(),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        match config.str_attr("name") {
            Ok(Some(name)) => {
                if let Err(reason) = validation::dns_label(name) {
                    diags.attr_error("name", reason);
                } else if name == "default" || name == "admin" {
                    diags.attr_error(
                        "name",
                        format!("'{name}' is taken by the token the tenant (or serve) was given; choose another name"),
                    );
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        match config.str_attr("scope") {
            Ok(Some("read" | "write")) | Ok(None) => {}
            Ok(Some(other)) => diags.attr_error(
                "scope",
                format!("{other:?} is not a scope; use \"read\" (plan and read, never change) or \"write\""),
            ),
            Err(d) => diags.push(d),
        }
        match config.str_attr("expires_at") {
            Ok(Some(text)) => {
                if let Err(reason) = times::unix(text) {
                    diags.attr_error("expires_at", reason);
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        check_overlap_attr(config, "rotation_overlap_seconds", &mut diags);
        diags.into_result()
    }

    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        let request = api::GetTokenRequest {
            tenant_id: required_str(prior, "tenant_id")?,
            name: required_str(prior, "name")?,
        };
        let token = found(&client, client.access().get_token(request).await)?;
        // A revoked or expired token is gone: the next plan issues it again.
        Ok(token
            .filter(|t| t.state == "active" || t.state == "retiring")
            .map(|t| state(&t, prior.get("token").clone(), prior)))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        let planned = plan(prior, proposed, config);
        super::common::note_prior(&self.provider.run, prior);
        // A destroy creates nothing (see `destroy_run`).
        let new = (prior.is_none() || !planned.requires_replace.is_empty())
            && !super::destroy_run::destroying();
        let known = REPLACED_BY
            .iter()
            .all(|a| planned.state.get(a).is_fully_known());
        if let (true, true, Some(client)) = (new, known, self.provider.plan_client()) {
            // The backend's dry run: the scope, the expiry, a name in use, the permission,
            // and the tenant (one this run creates is no refusal).
            let answer = client
                .access()
                .create_token(create_request(&planned.state, true)?)
                .await;
            let tenant = optional_tenant(&planned.state)?;
            let asked = Asked {
                tenant: &tenant,
                gpu_type: None,
            };
            let taken = matches!(&answer, Err(s) if s.code() == tonic::Code::AlreadyExists);
            let said = verdict(
                &client,
                &self.provider.run,
                asked,
                answer,
                REPLACED_BY,
                "name",
            )
            .await;
            match said {
                Err(mut diags) if taken => {
                    let name = required_str(&planned.state, "name")?;
                    let id = format!("{}/{name}", import_tenant(&client, &tenant).await);
                    adopt_hint(&mut diags, "name", "gpufleet_tenant_token", &id);
                    return Err(diags);
                }
                said => said?,
            }
        }
        Ok(planned)
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let issued = answered(
            &client,
            client
                .access()
                .create_token(create_request(planned, false)?)
                .await,
        )?;
        let token = issued.token.unwrap_or_default();
        Ok(state(&token, Value::String(issued.secret), planned))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        _config: &Value,
    ) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        if !changed(prior, planned, "rotation") {
            let mut next = planned.clone();
            next.set("token", prior.get("token").clone());
            return Ok(next);
        }
        let overlap = planned
            .i64_attr("rotation_overlap_seconds")
            .map_err(diag)?
            .unwrap_or(DEFAULT_OVERLAP_SECONDS);
        let request = api::RotateTokenRequest {
            tenant_id: required_str(prior, "tenant_id")?,
            name: required_str(prior, "name")?,
            overlap_seconds: Some(overlap),
            request_id: request_id(),
        };
        let issued = answered(&client, client.access().rotate_token(request).await)?;
        let token = issued.token.unwrap_or_default();
        Ok(state(&token, Value::String(issued.secret), planned))
    }

    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let request = api::RevokeTokenRequest {
            tenant_id: required_str(prior, "tenant_id")?,
            name: required_str(prior, "name")?,
        };
        deleted(&client, client.access().revoke_token(request).await)
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let (tenant, name) = match import_id(id) {
            ImportId::Named { tenant, name } => (Some(tenant), name),
            ImportId::Id(name) => (None, name),
        };
        let request = api::GetTokenRequest {
            tenant_id: tenant.unwrap_or_default().to_string(),
            name: name.to_string(),
        };
        let token = imported(
            "tenant token",
            id,
            "TENANT/NAME (with a tenant token, NAME alone) of a live token",
            found(&client, client.access().get_token(request).await)?
                .filter(|t| t.state == "active" || t.state == "retiring"),
        )?;
        let written = Value::object([("tenant", tenant.map_or(Value::Null, Value::string))]);
        // The backend keeps only the secret's hash: an imported token has none.
        Ok(state(&token, Value::Null, &written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Value {
        Value::object([
            ("tenant", Value::string("team-a")),
            ("name", Value::string("ci")),
            ("scope", Value::string("read")),
        ])
    }

    #[test]
    fn a_new_rotation_plans_a_new_secret_in_place_and_a_new_scope_replaces() {
        let created = plan(None, config(), &config());
        assert!(created.state.get("token").is_unknown());
        let mut prior = created.state.clone();
        prior.set("token", Value::string("gft_x"));
        prior.set("id", Value::string("t/ci"));
        prior.set("tenant_id", Value::string("t"));
        let same = plan(Some(&prior), prior.clone(), &config());
        assert_eq!(same.state, prior);
        let mut rotated = prior.clone();
        rotated.set("rotation", Value::string("2026-12"));
        let planned = plan(Some(&prior), rotated, &config());
        assert!(planned.requires_replace.is_empty());
        assert!(planned.state.get("token").is_unknown());
        let mut wider = prior.clone();
        wider.set("scope", Value::string("write"));
        let planned = plan(Some(&prior), wider, &config());
        assert_eq!(planned.requires_replace.len(), 1);
    }

    #[tokio::test]
    async fn bad_scopes_names_and_overlaps_are_refused_with_the_attribute() {
        let r = TenantToken::new(Arc::new(ProviderState::default()));
        let mut c = config();
        c.set("scope", Value::string("admin"));
        c.set("name", Value::string("default"));
        c.set("rotation_overlap_seconds", Value::Number(-1));
        let err = r.validate(&c).await.unwrap_err();
        let summaries: Vec<&str> = err.0.iter().map(|d| d.summary.as_str()).collect();
        assert!(
            summaries[0].starts_with("name: 'default' is taken"),
            "{summaries:?}"
        );
        assert!(summaries[1].starts_with("scope: \"admin\" is not a scope"));
        assert!(summaries[2].starts_with("rotation_overlap_seconds: -1 is out of range"));
    }
}
