//! What every resource does the same way: reading attributes of a plan or state, checking
//! configuration values, and turning the backend's answers into state or diagnostics.

use gpufleet_proto::v1::GpuType;
use tonic::{Code, Response, Status};

use crate::client::Client;
use crate::framework::{AttrPath, Diagnostic, Diagnostics, PlannedChange, Value};
use crate::{times, validation};

/// A fresh idempotency key for one create call.
pub(crate) fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Converts a type error from an accessor into diagnostics.
pub(crate) fn diag(d: Diagnostic) -> Diagnostics {
    d.into()
}

/// A required string attribute of a planned or prior state.
pub(crate) fn required_str(state: &Value, name: &str) -> Result<String, Diagnostics> {
    state
        .str_attr(name)
        .map_err(diag)?
        .map(str::to_string)
        .ok_or_else(|| missing(name))
}

/// A required number attribute of a planned or prior state.
pub(crate) fn required_i64(state: &Value, name: &str) -> Result<i64, Diagnostics> {
    state
        .i64_attr(name)
        .map_err(diag)?
        .ok_or_else(|| missing(name))
}

fn missing(name: &str) -> Diagnostics {
    Diagnostic::error_at(
        AttrPath::attr(name),
        format!("{name}: a value is required"),
        "",
    )
    .into()
}

/// Checks a count attribute of the configuration against a minimum and the API's
/// maximum (see [`validation::maximum`]), when known.
pub(crate) fn check_min(config: &Value, name: &str, min: i64, diags: &mut Diagnostics) {
    match config.i64_attr(name) {
        Ok(Some(v)) => {
            let max = validation::maximum(name).unwrap_or(i64::MAX);
            if let Err(reason) =
                validation::at_least(v, min).and_then(|()| validation::at_most(v, max))
            {
                diags.attr_error(name, reason);
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
}

/// Checks `start_time` and `end_time` of a configuration: each RFC 3339 when known, and
/// the end after the start when both are.
pub(crate) fn check_window(config: &Value, diags: &mut Diagnostics) {
    let mut parsed = [None, None];
    for (slot, name) in parsed.iter_mut().zip(["start_time", "end_time"]) {
        match config.str_attr(name) {
            Ok(Some(text)) => match times::unix(text) {
                Ok(t) => match validation::time_in_range(t) {
                    Ok(()) => *slot = Some(t),
                    Err(reason) => diags.attr_error(name, format!("{text:?} {reason}")),
                },
                Err(reason) => diags.attr_error(name, reason),
            },
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
    }
    if let [Some(start), Some(end)] = parsed {
        if end <= start {
            diags.attr_error(
                "end_time",
                format!(
                    "must be after start_time ({} is not after {})",
                    times::canonical(end),
                    times::canonical(start)
                ),
            );
        }
    }
}

/// The catalog entry of `name`, or an error on attribute `gpu_type` listing the known models.
pub(crate) async fn known_gpu_type(client: &Client, name: &str) -> Result<GpuType, Diagnostics> {
    let types = client.gpu_types().await?;
    types
        .iter()
        .find(|t| t.name == name)
        .cloned()
        .ok_or_else(|| {
            let known: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
            Diagnostic::error_at(
                AttrPath::attr("gpu_type"),
                format!("gpu_type: {}", validation::unknown_gpu_type(name, &known)),
                "",
            )
            .into()
        })
}

/// The backend's answer, or its refusal as a diagnostic.
pub(crate) fn answered<T>(
    client: &Client,
    answer: Result<Response<T>, Status>,
) -> Result<T, Diagnostics> {
    answer
        .map(Response::into_inner)
        .map_err(|s| client.diagnostic(&s).into())
}

/// The object a get call found; `None` when the backend says it does not exist (deleted
/// outside Terraform, or not visible to this token), so Terraform drops it from state.
pub(crate) fn found<T>(
    client: &Client,
    answer: Result<Response<T>, Status>,
) -> Result<Option<T>, Diagnostics> {
    match answer {
        Ok(r) => Ok(Some(r.into_inner())),
        Err(s) if s.code() == Code::NotFound => Ok(None),
        Err(s) => Err(client.diagnostic(&s).into()),
    }
}

/// A delete succeeded, or there was nothing left to delete.
pub(crate) fn deleted<T>(
    client: &Client,
    answer: Result<Response<T>, Status>,
) -> Result<(), Diagnostics> {
    found(client, answer).map(|_| ())
}

/// What an import found, or the error that the id names nothing (`kind` as a person says
/// it, e.g. "tenant cluster"; `forms` the import ids it takes, e.g. "its id or
/// TENANT/NAME").
pub(crate) fn imported<T>(
    kind: &str,
    id: &str,
    forms: &str,
    found: Option<T>,
) -> Result<T, Diagnostics> {
    found.ok_or_else(|| {
        diag(Diagnostic::error(
            format!("no {kind} {id:?}: not found"),
            format!(
                "Import takes {forms}, naming an existing {kind} that this provider's token may see."
            ),
        ))
    })
}

/// The prior state that plan-time checks compare with: none when the plan replaces the
/// object (then everything is new, as on create).
///
/// Known limitation: `terraform destroy` first runs a plan in normal mode, so a plan-time
/// check that fails on an edited configuration also blocks destroy (`-refresh=false` or
/// restoring the configuration gets past it). Each resource therefore asks the backend
/// only about attributes that change: an unchanged configuration is never refused.
pub(crate) fn compared_prior<'a>(
    prior: Option<&'a Value>,
    planned: &PlannedChange,
) -> Option<&'a Value> {
    prior.filter(|_| planned.requires_replace.is_empty())
}

/// `state` with its `tenant` as the configuration wrote it: a name stays a name and an id
/// an id when it names the tenant the backend answered with, and a `tenant` left out (a
/// tenant token's own tenant) stays out. Anything else (an import) keeps the backend's id.
pub(crate) fn with_tenant_spelling(
    mut state: Value,
    written: &Value,
    tenant_id: &str,
    tenant_name: &str,
) -> Value {
    match written.get("tenant") {
        Value::Null => state.set("tenant", Value::Null),
        Value::String(s) if s == tenant_id || (!tenant_name.is_empty() && s == tenant_name) => {
            state.set("tenant", Value::string(s))
        }
        _ => {}
    }
    state
}

/// Whether a refusal says the tenant a request named does not exist (yet): at plan time
/// that tenant may be created by the same apply, so the checks that need it wait for apply.
pub(crate) fn tenant_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound && status.message().starts_with("tenant '")
}

/// Notes for this run's other resources that the object of `prior` is in state (its
/// name is free once a replacement deletes it).
pub(crate) fn note_prior(run: &crate::this_run::ThisRun, prior: Option<&Value>) {
    if let Some(Ok(Some(id))) = prior.map(|p| p.str_attr("id")) {
        run.has(id);
    }
}

/// The `tenant` to send: as written, or "" (the token's own tenant) when left out.
pub(crate) fn optional_tenant(planned: &Value) -> Result<String, Diagnostics> {
    Ok(planned
        .str_attr("tenant")
        .map_err(diag)?
        .unwrap_or_default()
        .to_string())
}

/// The prior state to plan against when the configuration names the same tenant another
/// way than the state does (its name where an import stored its id, or the reverse; or,
/// with a tenant token, leaves out its own tenant that the state names, or the reverse):
/// the prior with the configuration's spelling, so the plan does not replace the object
/// for a new spelling. None when the spellings agree, either is unknown, the backend
/// cannot be asked, or they are different tenants.
pub(crate) async fn respelled_prior(
    client: Option<std::sync::Arc<Client>>,
    prior: Option<&Value>,
    proposed: &Value,
) -> Option<Value> {
    let prior = prior?;
    let (was, now) = (prior.get("tenant"), proposed.get("tenant"));
    if was == now || was.is_unknown() || now.is_unknown() {
        return None;
    }
    let client = client?;
    let spelled = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    };
    let (was_id, now_id) = (
        tenant_of(&client, spelled(was)).await?,
        tenant_of(&client, spelled(now)).await?,
    );
    if was_id != now_id {
        return None;
    }
    let mut respelled = prior.clone();
    respelled.set("tenant", now.clone());
    Some(respelled)
}

/// `proposed` with a `tenant` the configuration leaves out kept as the state spells it when
/// that names the token's own tenant (an import by `TENANT/NAME` with a tenant token wrote
/// it): `tenant` is optional and computed so that such a state plans nothing. Left out on
/// create, or with a state naming another tenant (or when the backend cannot be asked), it
/// is planned null as written, which replaces the object into the token's own tenant.
pub(crate) async fn kept_own_tenant(
    client: Option<std::sync::Arc<Client>>,
    config: &Value,
    proposed: &mut Value,
) {
    if !config.get("tenant").is_null() {
        return;
    }
    let kept = match (proposed.get("tenant").clone(), client) {
        (Value::String(spelled), Some(client)) => {
            let own = client.own_tenant().await;
            own.is_some() && tenant_of(&client, Some(spelled)).await == own
        }
        _ => false,
    };
    if !kept {
        proposed.set("tenant", Value::Null);
    }
}

/// The id of the tenant a `tenant` attribute names: the spelled tenant, or (left out) the
/// token's own; None when there is none or the backend cannot say.
async fn tenant_of(client: &Client, spelling: Option<String>) -> Option<String> {
    let Some(spelling) = spelling else {
        return client.own_tenant().await;
    };
    let request = gpufleet_proto::v1::GetTenantRequest { id: spelling };
    client
        .tenants()
        .get_tenant(request)
        .await
        .ok()
        .map(|t| t.into_inner().id)
}

/// What `terraform import` was given: an object's id, or `TENANT/NAME` (the tenant by
/// name or id, then the object's name, or for a quota its GPU model).
pub(crate) enum ImportId<'a> {
    Id(&'a str),
    Named { tenant: &'a str, name: &'a str },
}

pub(crate) fn import_id(id: &str) -> ImportId<'_> {
    match id.split_once('/') {
        Some((tenant, name)) if !tenant.is_empty() && !name.is_empty() => {
            ImportId::Named { tenant, name }
        }
        _ => ImportId::Id(id),
    }
}

/// The `tenant` an import writes into state, so that the plan after it is empty when the
/// configuration spells the tenant as the import id did: as `TENANT/...` wrote it; for a
/// bare id, left out (null) when it is the token's own tenant (how a team's configuration
/// leaves it), else the tenant's id.
pub(crate) async fn imported_tenant(
    client: &Client,
    written: Option<&str>,
    tenant_id: &str,
) -> Value {
    match written {
        Some(t) => Value::string(t),
        None if client.own_tenant().await.as_deref() == Some(tenant_id) => Value::Null,
        None => Value::string(tenant_id),
    }
}
