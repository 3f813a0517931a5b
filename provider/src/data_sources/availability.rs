//! `gpufleet_availability`: free pool and on-demand nodes of a model over a window, and
//! the earliest window in which `node_count` pool nodes are free for a `duration`. The
//! backend answers both from the holdings it places reservations against.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::required_arg;
use crate::framework::{
    AttrPath, Attribute, DataSourceType, Diagnostic, Diagnostics, Schema, Type, Value,
};
use crate::resources::common::{answered, check_window, known_gpu_type};
use crate::state::ProviderState;
use crate::times;

pub struct Availability {
    provider: Arc<ProviderState>,
}

impl Availability {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

/// The longest `duration` one can ask about (the backend's bound): ten years.
const MAX_DURATION_SECONDS: i64 = 10 * 366 * 24 * 3600;

/// Seconds of a duration such as `48h`, `90m`, `1h30m` or `3600s` (also `d` for days).
pub fn duration_seconds(text: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not a duration such as \"48h\", \"90m\" or \"1h30m\"");
    if text.is_empty() {
        return Err(bad());
    }
    let mut total: i64 = 0;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: i64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
    }
    if !digits.is_empty() {
        return Err(bad());
    }
    if !(1..=MAX_DURATION_SECONDS).contains(&total) {
        return Err(format!(
            "{text:?} must be more than 0 and at most 3660 days"
        ));
    }
    Ok(total)
}

fn time_arg(config: &Value, name: &str) -> Result<Option<i64>, Diagnostics> {
    let Some(text) = config.str_attr(name).map_err(Diagnostics::from)? else {
        return Ok(None);
    };
    times::unix(text).map(Some).map_err(|reason| {
        Diagnostic::error_at(AttrPath::attr(name), format!("{name}: {reason}"), "").into()
    })
}

/// `node_count` and `duration` of an earliest-window question: both or neither.
fn question(config: &Value) -> Result<Option<(i64, i64)>, Diagnostics> {
    let count = config.i64_attr("node_count").map_err(Diagnostics::from)?;
    let duration = config.str_attr("duration").map_err(Diagnostics::from)?;
    let at = |name: &str, summary: String| -> Diagnostics {
        Diagnostic::error_at(AttrPath::attr(name), summary, "").into()
    };
    match (count, duration) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(at(
            "duration",
            "duration: required with node_count (how long the nodes are needed, e.g. \"48h\")"
                .into(),
        )),
        (None, Some(_)) => Err(at(
            "node_count",
            "node_count: required with duration (how many nodes are needed)".into(),
        )),
        (Some(n), Some(_)) if n < 1 => Err(at(
            "node_count",
            format!("node_count: must be at least 1 (got {n})"),
        )),
        (Some(n), Some(d)) => {
            let seconds = duration_seconds(d)
                .map_err(|reason| at("duration", format!("duration: {reason}")))?;
            Ok(Some((n, seconds)))
        }
    }
}

#[async_trait]
impl DataSourceType for Availability {
    fn name(&self) -> &'static str {
        "availability"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Nodes of one GPU model free for the whole of a window, and the earliest window in which a number of pool nodes is free for a duration.",
            vec![
                Attribute::computed(
                    "id",
                    Type::String,
                    "An id made of the model and the question.",
                ),
                Attribute::required("gpu_type", Type::String, "GPU model, e.g. `H100-80GB`."),
                Attribute::optional(
                    "start_time",
                    Type::String,
                    "Start of the window (and where the search for `earliest_start` begins), RFC 3339. Default: now; a past time means now.",
                ),
                Attribute::optional(
                    "end_time",
                    Type::String,
                    "End of the window, RFC 3339; after `start_time`. Default: `start_time` plus `duration`, or for ever without one.",
                ),
                Attribute::optional(
                    "node_count",
                    Type::Number,
                    "With `duration`: how many pool nodes `earliest_start` looks for, at least 1.",
                ),
                Attribute::optional(
                    "duration",
                    Type::String,
                    "With `node_count`: how long the nodes are needed, e.g. `48h`, `90m` or `1h30m` (units `d`, `h`, `m`, `s`).",
                ),
                Attribute::computed(
                    "free_pool_nodes",
                    Type::Number,
                    "The fewest pool nodes free at any instant of the window.",
                ),
                Attribute::computed(
                    "free_on_demand_nodes",
                    Type::Number,
                    "The fewest on-demand nodes free at any instant of the window.",
                ),
                Attribute::computed(
                    "earliest_start",
                    Type::String,
                    "With `node_count` and `duration`: the first instant from `start_time` at which that many pool nodes are free for the whole duration, RFC 3339 (a reservation of that window fits, quota allowing). Null without them, and null when that never happens (`earliest_start_reason` says why).",
                ),
                Attribute::computed(
                    "earliest_start_reason",
                    Type::String,
                    "Why `earliest_start` is null although `node_count` and `duration` were asked, e.g. `5 H100-80GB pool nodes are never free for 1h: the pool has 4 nodes and clusters hold 0 of them with no end`; null otherwise.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        check_window(config, &mut diags);
        let all_known = ["node_count", "duration"]
            .iter()
            .all(|name| !config.get(name).is_unknown());
        if all_known {
            if let Err(more) = question(config) {
                diags.0.extend(more.0);
            }
        }
        diags.into_result()
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let gpu_type = required_arg(config, "gpu_type")?;
        known_gpu_type(&client, &gpu_type).await?;
        let start = time_arg(config, "start_time")?;
        let end = time_arg(config, "end_time")?;
        let wanted = question(config)?;
        let (node_count, duration) = wanted.unwrap_or((0, 0));
        let request = api::AvailabilityRequest {
            gpu_type: gpu_type.clone(),
            start_time: start.map(times::to_proto),
            end_time: end.map(times::to_proto),
            node_count,
            duration_seconds: duration,
        };
        let free = answered(&client, client.fleet().get_availability(request).await)?;
        let text = |t: Option<i64>| t.map_or_else(|| "now".to_string(), |t| t.to_string());
        let mut state = config.clone();
        state.set(
            "id",
            Value::String(format!(
                "{gpu_type}/{}/{}/{node_count}/{duration}",
                text(start),
                end.map_or_else(String::new, |t| t.to_string())
            )),
        );
        state.set("free_pool_nodes", Value::Number(free.free_pool_nodes));
        state.set(
            "free_on_demand_nodes",
            Value::Number(free.free_on_demand_nodes),
        );
        state.set(
            "earliest_start",
            free.earliest_start
                .map_or(Value::Null, |t| Value::String(times::canonical(t.seconds))),
        );
        let reason = Some(free.earliest_start_reason).filter(|r| !r.is_empty());
        state.set(
            "earliest_start_reason",
            reason.map_or(Value::Null, Value::String),
        );
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_go_style_units() {
        assert_eq!(duration_seconds("48h"), Ok(48 * 3600));
        assert_eq!(duration_seconds("1h30m"), Ok(5400));
        assert_eq!(duration_seconds("2d"), Ok(2 * 86_400));
        assert_eq!(duration_seconds("3600s"), Ok(3600));
        for bad in ["", "48", "h", "4x", "1.5h", "0s", "99999999999999999999h"] {
            assert!(duration_seconds(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn node_count_and_duration_come_together() {
        let cfg = |count: Value, duration: Value| {
            Value::object([("node_count", count), ("duration", duration)])
        };
        assert_eq!(question(&cfg(Value::Null, Value::Null)).unwrap(), None);
        assert_eq!(
            question(&cfg(Value::Number(2), Value::string("48h"))).unwrap(),
            Some((2, 48 * 3600))
        );
        let err = question(&cfg(Value::Number(2), Value::Null)).unwrap_err();
        assert_eq!(err.0[0].path, Some(AttrPath::attr("duration")));
        let err = question(&cfg(Value::Null, Value::string("1h"))).unwrap_err();
        assert_eq!(err.0[0].path, Some(AttrPath::attr("node_count")));
        let err = question(&cfg(Value::Number(0), Value::string("1h"))).unwrap_err();
        assert!(err.0[0].summary.contains("at least 1"));
    }
}
