//! `gpufleet_tenant_cluster`'s `wait_for_capacity` (issue 42): how long a create that does
//! not fit now may wait for capacity or burst quota instead of being refused, checked at
//! plan time; the plan's warning that the create will wait and why (the backend's dry
//! run answers it `queued`, with the reason); and the error of an apply whose wait ran
//! out before the cluster was admitted.

use std::collections::HashMap;
use std::sync::Mutex;

use gpufleet_proto::limits::MAX_WAIT_SECONDS;

use super::waiting::parse_duration;
use crate::framework::{AttrPath, Attribute, Diagnostic, Diagnostics, Type, Value};

pub const ATTRIBUTE: &str = "wait_for_capacity";

/// The status of a cluster waiting for capacity, holding nothing.
pub const QUEUED: &str = "queued";

pub fn attribute() -> Attribute {
    Attribute::optional(
        ATTRIBUTE,
        Type::String,
        "How long a create that does not fit now (the pool, or what other teams' lending limits leave of it, is short; or the tenant's burst quota is held by its other clusters) waits to be admitted instead of being refused, e.g. `\"30m\"` (units `h`, `m`, `s`; at most `24h`). The plan warns that the create will wait and says why with the numbers; the cluster is `queued`, holding nothing, until the platform admits it in weighted fair-share order (see `gpufleet_gpu_quota`'s `weight`); the apply waits for it within `timeouts.create`. When the wait runs out the cluster is deleted and the apply fails saying why, leaving nothing in state. A create that could never fit (more than the tenant's quota, or than the pool) is refused at plan whatever the wait. Unset or `\"0s\"`: refused at plan when it does not fit now. Only a create waits; changing it later changes nothing on the backend.",
    )
}

/// `wait_for_capacity` in seconds: "0s" is 0 (no wait); otherwise a duration of
/// `timeouts`' form, at most 24h.
pub fn seconds(text: &str) -> Result<i64, String> {
    if matches!(text, "0s" | "0m" | "0h") {
        return Ok(0); // no wait
    }
    let d = parse_duration(text)?;
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    if secs > MAX_WAIT_SECONDS {
        return Err(format!("must be at most 24h (got {text:?})"));
    }
    Ok(secs)
}

/// Plan-time check of the attribute (an unknown value is left to apply).
pub fn check(config: &Value, diags: &mut Diagnostics) {
    match config.str_attr(ATTRIBUTE) {
        Ok(Some(text)) => {
            if let Err(reason) = seconds(text) {
                diags.attr_error(ATTRIBUTE, reason);
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
}

/// The create request's `wait_seconds` for a planned cluster (0 when unset).
pub fn requested(planned: &Value) -> Result<i64, Diagnostics> {
    match planned.str_attr(ATTRIBUTE).map_err(Diagnostics::from)? {
        Some(text) => seconds(text).map_err(|reason| {
            Diagnostic::error_at(
                AttrPath::attr(ATTRIBUTE),
                format!("{ATTRIBUTE}: {reason}"),
                "",
            )
            .into()
        }),
        None => Ok(0),
    }
}

/// What the plan's dry runs said of creates that will wait, until the plan's warnings
/// are gathered (`ResourceType::plan_warnings`), by tenant and name.
#[derive(Default)]
pub struct WillWait(Mutex<HashMap<(String, String), String>>);

impl WillWait {
    /// The dry run of the create of `name` (of `tenant` as configured) answered `queued`,
    /// saying `reason`.
    pub fn note(&self, tenant: &str, name: &str, reason: &str) {
        if let Ok(mut waits) = self.0.lock() {
            waits.insert((tenant.into(), name.into()), reason.into());
        }
    }

    /// The warning for the planned create of `planned`, once.
    pub fn warning(&self, planned: &Value) -> Option<Diagnostic> {
        // The tenant as the dry run's request had it ("" when left to the token).
        let tenant = planned
            .str_attr("tenant")
            .ok()
            .flatten()
            .unwrap_or_default();
        let key = (
            tenant.to_string(),
            planned.str_attr("name").ok()??.to_string(),
        );
        let reason = self.0.lock().ok()?.remove(&key)?;
        Some(Diagnostic::warning_at(
            AttrPath::attr(ATTRIBUTE),
            format!("the create will wait: {reason}"),
            format!(
                "It does not fit now. The apply queues it (holding nothing) and waits until the platform admits it in weighted fair-share order, for at most {ATTRIBUTE} (and timeouts.create); if its wait runs out first, the apply fails and nothing is created."
            ),
        ))
    }
}

/// The error of a create whose cluster was deleted while queued: its wait ran out (or it
/// was deleted) before it was admitted. `said`: the backend's last word on it (its
/// `queue_expired` event, else its last status_reason).
pub fn ran_out(name: &str, said: &str) -> Diagnostic {
    Diagnostic::error_at(
        AttrPath::attr(ATTRIBUTE),
        format!("tenant cluster {name:?} was not created: it was not admitted within {ATTRIBUTE}: {said}"),
        "The cluster waited in the queue, holding nothing, and was deleted when its wait ran out; nothing is in state. Apply again to queue it again, with a longer wait, or once capacity or quota is free.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_durations_up_to_a_day_and_zero_is_no_wait() {
        assert_eq!(seconds("0s"), Ok(0));
        assert_eq!(seconds("0m"), Ok(0));
        assert_eq!(seconds("30m"), Ok(1800));
        assert_eq!(seconds("24h"), Ok(86_400));
        assert_eq!(
            seconds("25h"),
            Err("must be at most 24h (got \"25h\")".into())
        );
        assert!(seconds("soon").unwrap_err().contains("is not a duration"));
        assert!(seconds("").is_err());
    }

    #[test]
    fn a_bad_wait_is_refused_on_the_attribute() {
        let config = Value::object([(ATTRIBUTE, Value::string("2d"))]);
        let mut diags = Diagnostics::default();
        check(&config, &mut diags);
        assert_eq!(diags.0.len(), 1, "{diags:?}");
        assert_eq!(diags.0[0].path, Some(AttrPath::attr(ATTRIBUTE)));
        assert!(
            diags.0[0].summary.contains("wait_for_capacity"),
            "{diags:?}"
        );
    }

    #[test]
    fn the_plan_warns_once_per_waiting_create() {
        let will = WillWait::default();
        let planned = Value::object([
            ("tenant", Value::string("team-a")),
            ("name", Value::string("train")),
        ]);
        assert_eq!(will.warning(&planned), None);
        will.note(
            "team-a",
            "train",
            "waiting for capacity: needs 1 H100-80GB nodes",
        );
        let w = will.warning(&planned).expect("a warning");
        assert_eq!(
            w.summary,
            "the create will wait: waiting for capacity: needs 1 H100-80GB nodes"
        );
        assert_eq!(will.warning(&planned), None);
    }
}
