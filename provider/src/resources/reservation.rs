//! `gpufleet_reservation`: whole nodes of one model held for a tenant over a window.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::checks::{availability, capacity_error, check_quota};
use super::common::{
    answered, check_min, check_window, compared_prior, deleted, diag, found, imported,
    known_gpu_type, optional_tenant, request_id, required_i64, required_str, with_tenant_spelling,
};
use crate::client::Client;
use crate::framework::{
    changed, default_when_unset, mark_unknown, requires_replace_if_changed, AttrPath, Attribute,
    Diagnostic, Diagnostics, PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::provider::ProviderState;
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

/// Whether the plan turns allow_on_demand from true to false.
fn turns_on_demand_off(prior: &Value, planned: &Value) -> bool {
    prior.bool_attr("allow_on_demand").ok().flatten() == Some(true)
        && planned.bool_attr("allow_on_demand").ok().flatten() == Some(false)
}

/// The refusal when turning allow_on_demand off needs `needed` more pool nodes than the
/// pool has free over `window`.
pub fn on_demand_off_error(
    needed: i64,
    gpu_type: &str,
    window: (i64, i64),
    free: &api::Availability,
) -> Option<Diagnostic> {
    (free.free_pool_nodes < needed).then(|| {
        Diagnostic::error_at(
            AttrPath::attr("allow_on_demand"),
            format!(
                "allow_on_demand: turning it off needs {needed} more {gpu_type} pool nodes from {} to {}, the pool has {} free",
                times::canonical(window.0),
                times::canonical(window.1),
                free.free_pool_nodes,
            ),
            "Keep allow_on_demand = true, or lower node_count to what the pool can hold.",
        )
    })
}

impl Reservation {
    /// Capacity and quota checks at plan time, when every input is known.
    async fn check_with_backend(
        &self,
        prior: Option<&Value>,
        planned: &Value,
    ) -> Result<(), Diagnostics> {
        let Some(client) = self.provider.plan_client() else {
            return Ok(());
        };
        let Some(gpu_type) = planned.str_attr("gpu_type").map_err(diag)? else {
            return Ok(());
        };
        let model = known_gpu_type(&client, gpu_type).await?;
        let (Some(tenant), Some(count), Some(start), Some(end), Some(allow)) = (
            planned.str_attr("tenant").map_err(diag)?,
            planned.i64_attr("node_count").map_err(diag)?,
            instant(planned, "start_time"),
            instant(planned, "end_time"),
            planned.bool_attr("allow_on_demand").map_err(diag)?,
        ) else {
            return Ok(());
        };
        let now = times::now();
        let from = start.max(now);
        if end <= from {
            return Ok(()); // the backend refuses a window that has ended, with its words
        }
        // Checks only what changes, so an unchanged configuration asks the backend nothing
        // and cannot block `terraform destroy` (its pre-destroy plan runs in normal mode;
        // a failing check on an edited configuration blocks it, `-refresh=false` does not).
        if let Some(prior) = prior {
            let relevant = ["node_count", "end_time", "allow_on_demand"];
            if !relevant.iter().any(|name| changed(prior, planned, name)) {
                return Ok(());
            }
        }
        let mut diags = Diagnostics::default();
        // What must be newly found: everything on create; on update, the added nodes over
        // the current window and all nodes over an extension.
        let (mut needs, extra_nodes) = match prior {
            None => (vec![(count, (from, end))], count),
            Some(prior) => {
                let old_count = required_i64(prior, "node_count")?;
                let old_end = instant(prior, "end_time").unwrap_or(end);
                let mut needs = vec![];
                let current_window = (from, end.min(old_end));
                if turns_on_demand_off(prior, planned) {
                    // Every node must then be a pool node: the pool must take all of them
                    // beyond the pool nodes the reservation holds already.
                    let pool_nodes = required_i64(prior, "pool_nodes")?;
                    if count > pool_nodes && current_window.1 > from {
                        let free = availability(&client, gpu_type, from, current_window.1).await?;
                        if let Some(d) =
                            on_demand_off_error(count - pool_nodes, gpu_type, current_window, &free)
                        {
                            diags.push(d);
                        }
                    }
                } else if count > old_count && current_window.1 > from {
                    needs.push((count - old_count, current_window));
                }
                if end > old_end {
                    needs.push((count, (old_end.max(from), end)));
                }
                (needs, (count - old_count).max(0))
            }
        };
        for (nodes, window) in needs.drain(..) {
            let free = availability(&client, gpu_type, window.0, window.1).await?;
            if let Some(d) = capacity_error(nodes, gpu_type, window, &free, allow) {
                diags.push(d);
                break;
            }
        }
        if extra_nodes > 0 {
            // The whole reservation counts against the quota (its current nodes are
            // "reserved", not "used"), so compare all of it with what clusters leave.
            check_quota(&client, tenant, &model, count, &mut diags).await?;
        }
        diags.into_result()
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
        let planned = plan(prior, proposed, config, times::now());
        self.check_with_backend(compared_prior(prior, &planned), &planned.state)
            .await?;
        Ok(planned)
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let start = times::unix(&required_str(planned, "start_time")?)
            .map_err(|r| diag(Diagnostic::error(r, "")))?;
        let end = times::unix(&required_str(planned, "end_time")?)
            .map_err(|r| diag(Diagnostic::error(r, "")))?;
        let request = api::CreateReservationRequest {
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
        };
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
        let id = required_str(prior, "id")?;
        let count = required_i64(planned, "node_count")?;
        let end = instant(planned, "end_time");
        let allow_on_demand = planned.bool_attr("allow_on_demand").map_err(diag)?;
        let on_demand_changed = changed(prior, planned, "allow_on_demand");
        let any_change = prior.get("node_count") != planned.get("node_count")
            || instant(prior, "end_time") != end
            || on_demand_changed;
        let current = if any_change {
            let request = api::UpdateReservationRequest {
                id,
                node_count: count,
                end_time: end.map(times::to_proto),
                allow_on_demand: allow_on_demand.filter(|_| on_demand_changed),
            };
            answered(
                &client,
                client.reservations().update_reservation(request).await,
            )?
        } else {
            // Only the spelling of a time changed: nothing to send.
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
        let request = api::DeleteReservationRequest { id };
        deleted(
            &client,
            client.reservations().delete_reservation(request).await,
        )
    }

    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let found = self.get(&client, id.to_string()).await?;
        Ok(state(
            &imported("reservation", id, found)?,
            None,
            times::now(),
        ))
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

    #[test]
    fn turning_on_demand_off_names_what_the_pool_lacks() {
        let free = api::Availability {
            free_pool_nodes: 1,
            ..Default::default()
        };
        let d = on_demand_off_error(2, "H100-80GB", (NOW, NOW + 3600), &free).unwrap();
        assert_eq!(d.path, Some(AttrPath::attr("allow_on_demand")));
        assert_eq!(
            d.summary,
            "allow_on_demand: turning it off needs 2 more H100-80GB pool nodes from 2027-01-15T08:00:00Z to 2027-01-15T09:00:00Z, the pool has 1 free"
        );
        assert!(on_demand_off_error(1, "H100-80GB", (NOW, NOW + 3600), &free).is_none());
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
