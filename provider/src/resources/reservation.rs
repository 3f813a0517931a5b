//! `gpufleet_reservation`: whole nodes of one model held for a tenant over a window.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::checks::{verdict, written, Asked};
use super::common::{
    answered, check_min, check_window, deleted, diag, found, imported, known_gpu_type,
    optional_tenant, request_id, required_i64, required_str, respelled_prior, with_tenant_spelling,
};
use crate::client::Client;
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, AttrPath, Attribute,
    Diagnostic, Diagnostics, PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::times;

pub struct Reservation {
    provider: Arc<ProviderState>,
}

impl Reservation {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

/// Computed attributes that an in-place change of node_count, end_time or allow_on_demand
/// recomputes.
const ALLOCATION: &[&str] = &["status", "pool_nodes", "on_demand_nodes"];

/// The state as the backend reports it, keeping the spelling of times from `spelled`
/// (the prior or planned state) where it denotes the backend's instant.
fn state(r: &api::Reservation, spelled: Option<&Value>, now: i64) -> Value {
    let spelling =
        |name: &str| spelled.and_then(|s| s.get(name).as_str(&AttrPath::attr(name)).ok().flatten());
    let start = r.start_time.as_ref().map(|t| t.seconds).unwrap_or_default();
    let end = r.end_time.as_ref().map(|t| t.seconds).unwrap_or_default();
    Value::object([
        ("id", Value::string(&r.id)),
        ("tenant", Value::string(&r.tenant_id)),
        ("gpu_type", Value::string(&r.gpu_type)),
        ("node_count", Value::Number(r.node_count)),
        (
            "start_time",
            Value::String(times::keep_start_spelling(
                spelling("start_time"),
                start,
                now,
            )),
        ),
        (
            "end_time",
            Value::String(times::keep_spelling(spelling("end_time"), end)),
        ),
        ("allow_on_demand", Value::Bool(r.allow_on_demand)),
        ("status", Value::string(&r.status)),
        ("pool_nodes", Value::Number(r.pool_nodes)),
        ("on_demand_nodes", Value::Number(r.on_demand_nodes)),
    ])
}

fn instant(v: &Value, name: &str) -> Option<i64> {
    v.str_attr(name)
        .ok()
        .flatten()
        .and_then(|s| times::unix(s).ok())
}

/// The plan without backend checks.
pub fn plan(prior: Option<&Value>, proposed: Value, config: &Value, now: i64) -> PlannedChange {
    let mut planned = proposed;
    default_when_unset(&mut planned, config, "allow_on_demand", Value::Bool(false));
    let Some(prior) = prior else {
        mark_unknown(&mut planned, &["id"]);
        mark_unknown(&mut planned, ALLOCATION);
        return PlannedChange {
            state: planned,
            requires_replace: vec![],
        };
    };
    let mut requires_replace =
        requires_replace_if_changed(prior, &planned, &["tenant", "gpu_type"]);
    // Times are compared as instants; a start in the past that the backend moved to the
    // creation time is the same start.
    let same_start = match (
        instant(&planned, "start_time"),
        instant(prior, "start_time"),
    ) {
        (Some(p), Some(b)) => times::same_start(p, b, now),
        _ => false,
    };
    if !same_start {
        requires_replace.push(AttrPath::attr("start_time"));
    }
    let end_changed = planned.get("end_time").is_unknown()
        || instant(&planned, "end_time") != instant(prior, "end_time");
    let count_changed = planned.get("node_count") != prior.get("node_count");
    // Turning on-demand capacity off moves nodes back to the pool; the split is the backend's.
    let on_demand_changed = changed(prior, &planned, "allow_on_demand");
    if end_changed || count_changed || on_demand_changed {
        mark_unknown(&mut planned, ALLOCATION);
    }
    PlannedChange {
        state: planned,
        requires_replace,
    }
}

/// A create as a sibling's dry run takes it.
fn planned(r: &api::CreateReservationRequest) -> api::PlannedReservation {
    api::PlannedReservation {
        tenant_id: r.tenant_id.clone(),
        gpu_type: r.gpu_type.clone(),
        node_count: r.node_count,
        start_time: r.start_time,
        end_time: r.end_time,
        allow_on_demand: r.allow_on_demand,
    }
}

/// The create call for a planned reservation (a dry run at plan time, the real one at apply).
fn create_request(planned: &Value) -> Result<api::CreateReservationRequest, Diagnostics> {
    let start = times::unix(&required_str(planned, "start_time")?)
        .map_err(|r| diag(Diagnostic::error(r, "")))?;
    let end = times::unix(&required_str(planned, "end_time")?)
        .map_err(|r| diag(Diagnostic::error(r, "")))?;
    Ok(api::CreateReservationRequest {
        request_id: request_id(),
        tenant_id: optional_tenant(planned)?,
        gpu_type: required_str(planned, "gpu_type")?,
        node_count: required_i64(planned, "node_count")?,
        start_time: Some(times::to_proto(start)),
        end_time: Some(times::to_proto(end)),
        allow_on_demand: planned
            .bool_attr("allow_on_demand")
            .map_err(diag)?
            .unwrap_or(false),
        validate_only: false,
        also_planned: Vec::new(),
    })
}

/// The update call taking a reservation from `prior` to `planned`; None when only the
/// spelling of a time changed (nothing to send).
fn update_request(
    prior: &Value,
    planned: &Value,
) -> Result<Option<api::UpdateReservationRequest>, Diagnostics> {
    let end = instant(planned, "end_time");
    let on_demand_changed = changed(prior, planned, "allow_on_demand");
    let count_changed = prior.get("node_count") != planned.get("node_count");
    let end_changed = instant(prior, "end_time") != end;
    if !(count_changed || end_changed || on_demand_changed) {
        return Ok(None);
    }
    // Only what changes is sent (0 / absent leave a field as it is), so the backend
    // answers about that change: turning allow_on_demand off alone asks whether the pool
    // takes the on-demand nodes back.
    Ok(Some(api::UpdateReservationRequest {
        id: required_str(prior, "id")?,
        node_count: if count_changed {
            required_i64(planned, "node_count")?
        } else {
            0
        },
        end_time: end.filter(|_| end_changed).map(times::to_proto),
        allow_on_demand: planned
            .bool_attr("allow_on_demand")
            .map_err(diag)?
            .filter(|_| on_demand_changed),
        validate_only: false,
    }))
}

/// Whether every input a dry run sends is known at plan time (a tenant or time computed
/// by the same apply is not).
fn inputs_known(planned: &Value) -> bool {
    [
        "tenant",
        "gpu_type",
        "node_count",
        "start_time",
        "end_time",
        "allow_on_demand",
    ]
    .iter()
    .all(|name| !planned.get(name).is_unknown())
}

impl Reservation {
    /// Plan-time admission: the backend's dry run of the create or update this plan
    /// applies, when every input is known. Only a create or a change of node_count,
    /// end_time or allow_on_demand asks, so an unchanged configuration asks the backend
    /// nothing and cannot block `terraform destroy` (whose pre-destroy plan runs in normal
    /// mode). The replace half of a replacement is not asked about; Terraform plans its
    /// create half as a create (without a prior state).
    async fn check_with_backend(
        &self,
        prior: Option<&Value>,
        planned: &PlannedChange,
    ) -> Result<(), Diagnostics> {
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let (state, replacing) = (&planned.state, !planned.requires_replace.is_empty());
        if let Some(gpu_type) = state.str_attr("gpu_type").map_err(diag)? {
            known_gpu_type(&client, gpu_type).await?;
        }
        if !inputs_known(state) || (prior.is_some() && replacing) {
            return Ok(());
        }
        let answer = match prior {
            // A destroy creates nothing (see `destroy_run`).
            None if super::destroy_run::destroying() => return Ok(()),
            None => self.create_dry_run(&client, create_request(state)?).await,
            Some(prior) => {
                let Some(request) = update_request(prior, state)? else {
                    return Ok(());
                };
                let request = api::UpdateReservationRequest {
                    validate_only: true,
                    ..request
                };
                client.reservations().update_reservation(request).await
            }
        };
        let tenant = super::common::optional_tenant(state)?;
        let gpu_type = state.str_attr("gpu_type").map_err(diag)?;
        let asked = Asked {
            tenant: &tenant,
            gpu_type,
        };
        verdict(
            &client,
            &self.provider.run,
            asked,
            answer,
            &written(&self.schema()),
            "node_count",
        )
        .await
    }

    /// The dry run of a create, sent with the reservations this plan's earlier dry runs
    /// admitted and not yet created (its siblings: Terraform plans them side by side), and
    /// recorded among them when admitted. One admitted (or created) meanwhile makes it ask
    /// again, so of two that cannot both fit the later is refused, naming the other, and
    /// none is counted twice.
    async fn create_dry_run(
        &self,
        client: &Client,
        request: api::CreateReservationRequest,
    ) -> Result<tonic::Response<api::Reservation>, tonic::Status> {
        let run = &self.provider.run;
        let max = gpufleet_proto::limits::MAX_ALSO_PLANNED;
        // Each round follows a change of the siblings (at most two per reservation of the
        // run); a bound all the same.
        let mut rounds = 0;
        loop {
            let (seen, also_planned) = run.planned_reservations(&request.gpu_type, max);
            let asked = api::CreateReservationRequest {
                validate_only: true,
                also_planned,
                ..request.clone()
            };
            let answer = client.reservations().create_reservation(asked).await;
            rounds += 1;
            // A sibling created meanwhile (the apply plans each resource again) may have
            // been counted twice: a refusal then asks again too.
            let settled = match &answer {
                Ok(_) => run.admits_reservation(seen, planned(&request)),
                Err(_) => !run.reservations_changed_since(seen),
            };
            if settled || rounds > 2 * max {
                return answer;
            }
        }
    }

    async fn get(
        &self,
        client: &Client,
        id: String,
    ) -> Result<Option<api::Reservation>, Diagnostics> {
        let request = api::GetReservationRequest { id };
        found(client, client.reservations().get_reservation(request).await)
    }
}

#[async_trait]
impl ResourceType for Reservation {
    fn name(&self) -> &'static str {
        "reservation"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Whole nodes of one GPU model held for a tenant between two times.",
            vec![
                Attribute::computed("id", Type::String, "The reservation's id, assigned by the backend."),
                Attribute::optional("tenant", Type::String, "The tenant, by id or by name (a `gpufleet_tenant`'s `id` or `name`; state keeps what you write). With a tenant token it may be left out: the token's own tenant. Changing it forces replacement."),
                Attribute::required("gpu_type", Type::String, "GPU model, e.g. `H100-80GB`. Changing it forces replacement."),
                Attribute::required("node_count", Type::Number, "Whole nodes to hold, at least 1. Changes in place when capacity and quota allow."),
                Attribute::required("start_time", Type::String, "Start of the window, RFC 3339. A past time means from now on. Changing it forces replacement."),
                Attribute::required("end_time", Type::String, "End of the window, RFC 3339, after `start_time`. Changes in place when capacity and quota allow."),
                Attribute::optional_computed(
                    "allow_on_demand",
                    Type::Bool,
                    "When the pool is short, take the rest from on-demand capacity instead of failing. Defaults to `false`. Changes in place; turning it off moves on-demand nodes back to the pool, and fails when the pool cannot take them for the whole window.",
                ),
                Attribute::computed("status", Type::String, "`scheduled`, `active` or `ended`."),
                Attribute::computed("pool_nodes", Type::Number, "Nodes held from the pool."),
                Attribute::computed("on_demand_nodes", Type::Number, "Nodes held from on-demand capacity."),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        check_min(config, "node_count", 1, &mut diags);
        check_window(config, &mut diags);
        diags.into_result()
    }

    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        let found = self.get(&client, required_str(prior, "id")?).await?;
        Ok(found.map(|r| {
            with_tenant_spelling(
                state(&r, Some(prior), times::now()),
                prior,
                &r.tenant_id,
                &r.tenant_name,
            )
        }))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        let respelled = respelled_prior(self.provider.plan_client(), prior, &proposed).await;
        let prior = respelled.as_ref().or(prior);
        let planned = plan(prior, proposed, config, times::now());
        super::common::note_prior(&self.provider.run, prior);
        self.check_with_backend(prior, &planned).await?;
        Ok(planned)
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = create_request(planned)?;
        self.provider
            .run
            .creating_reservation(&self::planned(&request));
        let created = answered(
            &client,
            client.reservations().create_reservation(request).await,
        )?;
        Ok(with_tenant_spelling(
            state(&created, Some(planned), times::now()),
            planned,
            &created.tenant_id,
            &created.tenant_name,
        ))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        _config: &Value,
    ) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let current = if let Some(request) = update_request(prior, planned)? {
            answered(
                &client,
                client.reservations().update_reservation(request).await,
            )?
        } else {
            // Only the spelling of a time changed: nothing to send.
            let id = required_str(prior, "id")?;
            self.get(&client, id).await?.ok_or_else(|| {
                diag(Diagnostic::error(
                    "the reservation no longer exists in the backend",
                    "",
                ))
            })?
        };
        Ok(with_tenant_spelling(
            state(&current, Some(planned), times::now()),
            planned,
            &current.tenant_id,
            &current.tenant_name,
        ))
    }

    async fn delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let id = required_str(prior, "id")?;
        let tenant = super::common::optional_tenant(prior)?;
        let _under_way = self.provider.run.deleting(&[&id, &tenant]);
        let request = api::DeleteReservationRequest { id };
        deleted(
            &client,
            client.reservations().delete_reservation(request).await,
        )
    }

    async fn plan_delete(&self, prior: &Value) -> Result<(), Diagnostics> {
        // A quota this reservation uses may be deleted by the same plan.
        self.provider.run.plans_delete(&required_str(prior, "id")?);
        Ok(())
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let found = self.get(&client, id.to_string()).await?;
        let found = imported(
            "reservation",
            id,
            "its id (reservations have no name)",
            found,
        )?;
        let tenant = super::common::imported_tenant(&client, None, &found.tenant_id).await;
        let mut s = state(&found, None, times::now());
        s.set("tenant", tenant);
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn prior() -> Value {
        Value::object([
            ("id", Value::string("r1")),
            ("tenant", Value::string("t1")),
            ("gpu_type", Value::string("H100-80GB")),
            ("node_count", Value::Number(2)),
            ("start_time", Value::string("2027-01-04T00:00:00Z")),
            ("end_time", Value::string("2027-01-18T00:00:00Z")),
            ("allow_on_demand", Value::Bool(false)),
            ("status", Value::string("scheduled")),
            ("pool_nodes", Value::Number(2)),
            ("on_demand_nodes", Value::Number(0)),
        ])
    }

    fn config_of(state: &Value) -> Value {
        let mut c = state.clone();
        for name in ["id", "status", "pool_nodes", "on_demand_nodes"] {
            c.set(name, Value::Null);
        }
        c
    }

    #[test]
    fn no_change_keeps_every_computed_value() {
        let p = prior();
        let planned = plan(Some(&p), p.clone(), &config_of(&p), NOW);
        assert_eq!(planned.state, p);
        assert!(planned.requires_replace.is_empty());
    }

    #[test]
    fn growing_makes_the_allocation_unknown_in_place() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("node_count", Value::Number(4));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed), NOW);
        assert!(planned.requires_replace.is_empty());
        for name in ALLOCATION {
            assert!(planned.state.get(name).is_unknown(), "{name}");
        }
        assert_eq!(planned.state.get("id"), &Value::string("r1"));
    }

    #[test]
    fn same_instant_in_another_spelling_is_not_a_change() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("start_time", Value::string("2027-01-04T01:00:00+01:00"));
        proposed.set("end_time", Value::string("2027-01-18T01:00:00+01:00"));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed), NOW);
        assert!(planned.requires_replace.is_empty());
        assert_eq!(planned.state.get("status"), &Value::string("scheduled"));
    }

    #[test]
    fn start_and_model_force_replacement() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("start_time", Value::string("2027-01-05T00:00:00Z"));
        proposed.set("gpu_type", Value::string("A100-80GB"));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed), NOW);
        assert_eq!(
            planned.requires_replace,
            vec![AttrPath::attr("gpu_type"), AttrPath::attr("start_time")]
        );
    }

    #[test]
    fn on_demand_changes_in_place_with_the_split_unknown() {
        let p = prior();
        let mut proposed = p.clone();
        proposed.set("allow_on_demand", Value::Bool(true));
        let planned = plan(Some(&p), proposed.clone(), &config_of(&proposed), NOW);
        assert!(planned.requires_replace.is_empty());
        assert!(planned.state.get("pool_nodes").is_unknown());
        assert!(planned.state.get("on_demand_nodes").is_unknown());
        assert_eq!(planned.state.get("node_count"), &Value::Number(2));
    }

    #[tokio::test]
    async fn end_before_start_is_refused_on_end_time() {
        let r = Reservation::new(Arc::new(ProviderState::default()));
        let mut cfg = config_of(&prior());
        cfg.set("end_time", Value::string("2027-01-01T00:00:00Z"));
        let err = r.validate(&cfg).await.unwrap_err();
        assert_eq!(err.0[0].path, Some(AttrPath::attr("end_time")));
        assert_eq!(
            err.0[0].summary,
            "end_time: must be after start_time (2027-01-01T00:00:00Z is not after 2027-01-04T00:00:00Z)"
        );
    }
}
