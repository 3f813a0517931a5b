//! `gpufleet_tenant`: a team on the fleet, and its bearer token.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::common::{answered, deleted, diag, found, imported, request_id, required_str};
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, AttrPath, Attribute,
    Diagnostic, Diagnostics, PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::validation;

pub struct Tenant {
    provider: Arc<ProviderState>,
}

impl Tenant {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

/// How long a rotated token keeps working when `token_overlap_seconds` is unset, and the
/// most it may be (the backend's bounds).
pub(crate) const DEFAULT_OVERLAP_SECONDS: i64 = 3600;
pub(crate) const MAX_OVERLAP_SECONDS: i64 = 7 * 24 * 3600;

/// The state of a tenant as the backend reports it; the token is never reported back, and
/// the rotation settings are the configuration's own.
fn state(t: &api::Tenant, token: Value, rotation: &Value) -> Value {
    Value::object([
        ("id", Value::string(&t.id)),
        ("name", Value::string(&t.name)),
        ("display_name", Value::string(&t.display_name)),
        ("labels", Value::string_map(&t.labels)),
        ("token", token),
        ("token_rotation", rotation.get("token_rotation").clone()),
        (
            "token_overlap_seconds",
            match rotation.get("token_overlap_seconds") {
                Value::Null => Value::Number(DEFAULT_OVERLAP_SECONDS),
                v => v.clone(),
            },
        ),
    ])
}

/// A token rotation of the tenant's "default" token with the planned overlap (by the
/// admin or the team itself); the new secret.
pub(crate) async fn rotate_default(
    client: &crate::client::Client,
    tenant_id: &str,
    planned: &Value,
) -> Result<String, Diagnostics> {
    let overlap = planned
        .i64_attr("token_overlap_seconds")
        .map_err(diag)?
        .unwrap_or(DEFAULT_OVERLAP_SECONDS);
    let request = api::RotateTokenRequest {
        tenant_id: tenant_id.to_string(),
        name: "default".into(),
        overlap_seconds: Some(overlap),
        request_id: request_id(),
    };
    let issued = answered(client, client.access().rotate_token(request).await)?;
    Ok(issued.secret)
}

/// Plans a tenant: defaults made concrete, computed values unknown only on create, and
/// replacement when the name changes.
pub fn plan(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
    let mut planned = proposed;
    // display_name defaults to the name (sent explicitly, so the plan is what happens).
    default_when_unset(
        &mut planned,
        config,
        "display_name",
        config.get("name").clone(),
    );
    default_when_unset(
        &mut planned,
        config,
        "labels",
        Value::Map(Default::default()),
    );
    default_when_unset(
        &mut planned,
        config,
        "token_overlap_seconds",
        Value::Number(DEFAULT_OVERLAP_SECONDS),
    );
    match prior {
        None => {
            mark_unknown(&mut planned, &["id", "token"]);
            PlannedChange {
                state: planned,
                requires_replace: vec![],
            }
        }
        Some(prior) => {
            let requires_replace = requires_replace_if_changed(prior, &planned, &["name"]);
            // A new `token_rotation` rotates the token in place: a new secret.
            if requires_replace.is_empty() && changed(prior, &planned, "token_rotation") {
                mark_unknown(&mut planned, &["token"]);
            }
            PlannedChange {
                state: planned,
                requires_replace,
            }
        }
    }
}

#[async_trait]
impl ResourceType for Tenant {
    fn name(&self) -> &'static str {
        "tenant"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A tenant: a team on the shared GPU fleet, with its own bearer token.",
            vec![
                Attribute::computed("id", Type::String, "The tenant's id, assigned by the backend."),
                Attribute::required(
                    "name",
                    Type::String,
                    "Tenant name: a DNS label (1 to 63 lowercase letters, digits and `-`). Changing it forces replacement.",
                ),
                Attribute::optional_computed(
                    "display_name",
                    Type::String,
                    "Human-readable name. Defaults to `name`. Changes in place.",
                ),
                Attribute::optional_computed(
                    "labels",
                    Type::map(Type::String),
                    "Free-form labels. Defaults to none. Change in place.",
                ),
                Attribute::computed(
                    "token",
                    Type::String,
                    "The tenant's bearer token (its token named `default`, scope `write`), issued at create and at each rotation and kept in state (the backend stores only its hash). Null after import.",
                )
                .sensitive(),
                Attribute::optional(
                    "token_rotation",
                    Type::String,
                    "Any value; changing it rotates `token` in place (quotas, reservations and clusters untouched): the new secret goes to `token`, the old one keeps working for `token_overlap_seconds`, then is refused as rotated.",
                ),
                Attribute::optional_computed(
                    "token_overlap_seconds",
                    Type::Number,
                    "How long the old token keeps working after a rotation: 0 to 604800 (7 days). Defaults to 3600.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        match config.str_attr("name") {
            Ok(Some(name)) => {
                if let Err(reason) = validation::dns_label(name) {
                    diags.attr_error("name", reason);
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        check_display_name_and_labels(config, &mut diags);
        check_overlap(config, &mut diags);
        diags.into_result()
    }

    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let tenant = found(
            &client,
            client
                .tenants()
                .get_tenant(api::GetTenantRequest { id })
                .await,
        )?;
        Ok(tenant.map(|t| state(&t, prior.get("token").clone(), prior)))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        let planned = plan(prior, proposed, config);
        super::common::note_prior(&self.provider.run, prior);
        if prior.is_none() || !planned.requires_replace.is_empty() {
            if let Ok(Some(name)) = planned.state.str_attr("name") {
                self.provider.run.creates_tenant(name);
            }
            self.check_with_backend(&planned.state).await?;
        }
        Ok(planned)
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = create_request(planned)?;
        let created = answered(&client, client.tenants().create_tenant(request).await)?;
        let tenant = created.tenant.unwrap_or_default();
        Ok(state(&tenant, Value::String(created.token), planned))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        _config: &Value,
    ) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = api::UpdateTenantRequest {
            id: required_str(prior, "id")?,
            display_name: required_str(planned, "display_name")?,
            labels: planned
                .string_map_attr("labels")
                .map_err(diag)?
                .unwrap_or_default(),
        };
        let updated = answered(&client, client.tenants().update_tenant(request).await)?;
        let token = if changed(prior, planned, "token_rotation") {
            Value::String(rotate_default(&client, &updated.id, planned).await?)
        } else {
            prior.get("token").clone()
        };
        Ok(state(&updated, token, planned))
    }

    /// Deletes the tenant. Terraform deletes a tenant and the quotas, reservations and
    /// clusters that name it by a literal string (not a reference) in parallel: while
    /// this run is deleting such dependents the tenant delete waits for them and tries
    /// again, instead of failing for dependents that are about to be gone.
    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let name = required_str(prior, "name")?;
        loop {
            let request = api::DeleteTenantRequest {
                id: id.clone(),
                validate_only: false,
            };
            let run = &self.provider.run;
            let since = run.deletes_ended();
            match client.tenants().delete_tenant(request).await {
                Err(s) if has_dependents(&s) => {
                    if !run
                        .dependents_deleted(&[&id, &name], DELETE_GRACE, since)
                        .await
                    {
                        return Err(client.diagnostic(&s).into());
                    }
                }
                answer => return deleted(&client, answer),
            }
        }
    }

    /// A tenant that still has clusters or reservations this plan does not delete beside
    /// it is refused here, naming everything it still has (the backend's dry run of the
    /// delete), rather than at apply after the deletes beside it ran. Quotas left are let
    /// through: those of a `for_each` of teams are instances of a resource that refers to
    /// the tenant, which Terraform plans only after the tenant, and their own plans refuse
    /// a delete that clusters or reservations block.
    async fn plan_delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let id = required_str(prior, "id")?;
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let request = api::DeleteTenantRequest {
            id,
            validate_only: true,
        };
        let status = match client.tenants().delete_tenant(request).await {
            Ok(_) => return Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
            Err(s) => s,
        };
        let dependents = super::checks::used_by(&status);
        if dependents.is_empty() {
            return Err(client.diagnostic(&status).into());
        }
        let quotas = super::checks::ids_in(&status, gpufleet_proto::error_info::QUOTA_IDS);
        let left = self
            .provider
            .run
            .unplanned_deletes(&dependents, DELETE_GRACE)
            .await;
        if left.iter().all(|id| quotas.contains(id)) {
            return Ok(());
        }
        Err(Diagnostic::error(
            status.message().to_string(),
            format!(
                "Not deleted beside the tenant by this plan: {} of them (ids: {}). Delete them in the same change, or keep the tenant until they are gone: the apply would otherwise delete what it can and then fail on the tenant.",
                left.len(),
                left.join(", ")
            ),
        )
        .into())
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = api::GetTenantRequest { id: id.to_string() };
        let tenant = imported(
            "tenant",
            id,
            "its id or its name",
            found(&client, client.tenants().get_tenant(request).await)?,
        )?;
        // The backend keeps only the token's hash: an imported tenant has no token.
        Ok(state(&tenant, Value::Null, &Value::Null))
    }
}

/// How long a tenant delete refused for its dependents waits for a delete of one of them
/// to begin in this run (Terraform starts parallel deletes together, give or take).
const DELETE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a delete was refused because the tenant still has quotas, reservations or
/// clusters.
fn has_dependents(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition && status.message().contains(" still has ")
}

/// The create call for a planned tenant (a dry run at plan time, the real one at apply).
fn create_request(planned: &Value) -> Result<api::CreateTenantRequest, Diagnostics> {
    Ok(api::CreateTenantRequest {
        request_id: request_id(),
        name: required_str(planned, "name")?,
        display_name: required_str(planned, "display_name")?,
        labels: planned
            .string_map_attr("labels")
            .map_err(diag)?
            .unwrap_or_default(),
        validate_only: false,
    })
}

/// Attributes a backend refusal of a tenant may name.
const ATTRIBUTES: &[&str] = &["name", "display_name", "labels"];

impl Tenant {
    /// Plan-time admission of a create: the backend's dry run (the admin token, the name's
    /// rules, a name no tenant has), when every input is known. A token that may not
    /// create tenants is said on `name`, the attribute that asks for one.
    async fn check_with_backend(&self, planned: &Value) -> Result<(), Diagnostics> {
        // A destroy creates nothing (see `destroy_run`).
        if super::destroy_run::destroying() {
            return Ok(());
        }
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        if !ATTRIBUTES.iter().all(|a| planned.get(a).is_fully_known()) {
            return Ok(());
        }
        let request = api::CreateTenantRequest {
            validate_only: true,
            ..create_request(planned)?
        };
        let status = match client.tenants().create_tenant(request).await {
            Ok(_) => return Ok(()),
            Err(s) => s,
        };
        if status.code() == tonic::Code::PermissionDenied {
            return Err(Diagnostic::error_at(
                AttrPath::attr("name"),
                status.message().to_string(),
                "Tenants are created with the admin token (the platform's configuration); a team's token manages that team's quotas' use, reservations and clusters.",
            )
            .into());
        }
        let run = &self.provider.run;
        match super::checks::refusals(&status, ATTRIBUTES, "name", |id| run.holds(id)) {
            Some(found) if found.is_empty() => Ok(()),
            Some(found) => {
                let mut diags = Diagnostics(found);
                if status.code() == tonic::Code::AlreadyExists {
                    let name = required_str(planned, "name")?;
                    super::checks::adopt_hint(&mut diags, "name", "gpufleet_tenant", &name);
                }
                Err(diags)
            }
            None => Err(client.diagnostic(&status).into()),
        }
    }
}

/// `token_overlap_seconds` within the backend's bounds, at plan time.
pub(crate) fn check_overlap_attr(config: &Value, name: &str, diags: &mut Diagnostics) {
    match config.i64_attr(name) {
        Ok(Some(v)) if !(0..=MAX_OVERLAP_SECONDS).contains(&v) => diags.attr_error(
            name,
            format!("{v} is out of range: give 0 (no overlap) to {MAX_OVERLAP_SECONDS} (7 days)"),
        ),
        Ok(_) => {}
        Err(d) => diags.push(d),
    }
}

fn check_overlap(config: &Value, diags: &mut Diagnostics) {
    check_overlap_attr(config, "token_overlap_seconds", diags);
}

/// The API's bounds on `display_name` and `labels`, at plan time.
fn check_display_name_and_labels(config: &Value, diags: &mut Diagnostics) {
    use gpufleet_proto::limits::MAX_DISPLAY_NAME_CHARS;
    match config.str_attr("display_name") {
        Ok(Some(d)) => {
            if let Err(reason) = validation::max_chars(d, MAX_DISPLAY_NAME_CHARS) {
                diags.attr_error("display_name", reason);
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
    match config.string_map_attr("labels") {
        Ok(Some(labels)) => {
            let sorted: std::collections::BTreeMap<_, _> = labels.iter().collect();
            let pairs = sorted.into_iter().map(|(k, v)| (k.as_str(), v.as_str()));
            for (key, reason) in validation::labels(pairs) {
                match key {
                    Some(key) => diags.push(Diagnostic::error_at(
                        AttrPath::attr("labels").key(&key),
                        format!("labels[{key:?}]: {reason}"),
                        "",
                    )),
                    None => diags.attr_error("labels", reason),
                }
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::AttrPath;

    fn config(name: &str) -> Value {
        Value::object([("name", Value::string(name))])
    }

    #[test]
    fn create_plans_defaults_and_unknown_computed_values() {
        let planned = plan(None, config("team-a"), &config("team-a"));
        assert_eq!(planned.state.get("display_name"), &Value::string("team-a"));
        assert_eq!(planned.state.get("labels"), &Value::Map(Default::default()));
        assert!(planned.state.get("id").is_unknown());
        assert!(planned.state.get("token").is_unknown());
    }

    #[test]
    fn update_keeps_computed_values_and_replaces_only_on_name() {
        let prior = Value::object([
            ("id", Value::string("t1")),
            ("name", Value::string("team-a")),
            ("display_name", Value::string("team-a")),
            ("labels", Value::Map(Default::default())),
            ("token", Value::string("secret")),
        ]);
        let mut proposed = prior.clone();
        proposed.set("display_name", Value::string("Team A"));
        let mut cfg = config("team-a");
        cfg.set("display_name", Value::string("Team A"));
        let planned = plan(Some(&prior), proposed, &cfg);
        assert!(planned.requires_replace.is_empty());
        assert_eq!(planned.state.get("token"), &Value::string("secret"));
        assert_eq!(planned.state.get("id"), &Value::string("t1"));

        let mut proposed = prior.clone();
        proposed.set("name", Value::string("team-b"));
        let planned = plan(Some(&prior), proposed, &config("team-b"));
        assert_eq!(planned.requires_replace, vec![AttrPath::attr("name")]);
    }

    #[test]
    fn removing_display_name_plans_the_name_again() {
        let prior = Value::object([
            ("name", Value::string("team-a")),
            ("display_name", Value::string("Team A")),
        ]);
        let planned = plan(Some(&prior), prior.clone(), &config("team-a"));
        assert_eq!(planned.state.get("display_name"), &Value::string("team-a"));
    }

    #[tokio::test]
    async fn bad_names_are_refused_with_the_attribute() {
        let tenant = Tenant::new(Arc::new(ProviderState::default()));
        let err = tenant.validate(&config("Team_A")).await.unwrap_err();
        assert_eq!(err.0[0].path, Some(AttrPath::attr("name")));
        assert!(err.0[0]
            .summary
            .starts_with("name: \"Team_A\" is not a DNS label"));
    }
}
