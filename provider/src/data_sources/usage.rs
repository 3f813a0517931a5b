//! `gpufleet_usage`: GPU-seconds held in a window per tenant, cluster, GPU model,
//! capacity class and MIG profile (issue 42), with the MIG instance-seconds, and used, from the GPUs' utilisation readings (null where
//! none reported any: not reported, not 0). The admin token reads every team's (or
//! one's); a tenant token only its own.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::limits::{usage_by, usage_window};
use gpufleet_proto::money::decimal;
use gpufleet_proto::v1 as api;

use super::required_arg;
use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::resources::common::answered;
use crate::state::ProviderState;
use crate::times;

pub struct Usage {
    provider: Arc<ProviderState>,
}

impl Usage {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn row_type() -> Type {
    Type::object([
        ("tenant", Type::String),
        ("cluster", Type::String),
        ("gpu_type", Type::String),
        ("class", Type::String),
        ("gpu_seconds", Type::Number),
        ("gpu_seconds_used", Type::Number),
        ("gpu_seconds_measured", Type::Number),
        ("mig_profile", Type::String),
        ("slice_seconds", Type::Number),
        ("cost", Type::String),
    ])
}

fn row_value(r: &api::UsageRow) -> Value {
    Value::object([
        ("tenant", Value::string(&r.tenant)),
        ("cluster", Value::string(&r.cluster)),
        ("gpu_type", Value::string(&r.gpu_type)),
        ("class", Value::string(&r.class)),
        ("gpu_seconds", Value::Number(r.gpu_seconds)),
        (
            "gpu_seconds_used",
            r.gpu_seconds_used.map_or(Value::Null, Value::Number),
        ),
        (
            "gpu_seconds_measured",
            Value::Number(r.gpu_seconds_measured),
        ),
        ("mig_profile", Value::string(&r.mig_profile)),
        ("slice_seconds", Value::Number(r.slice_seconds)),
        (
            "cost",
            r.cost_cents
                .map_or(Value::Null, |c| Value::String(decimal(c))),
        ),
    ])
}

/// `by` as strings; None while unknown or left out.
fn by_arg(config: &Value) -> Result<Option<Vec<String>>, Diagnostics> {
    match config.get("by") {
        Value::List(items) => {
            let mut by = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => by.push(s.clone()),
                    Value::Unknown => return Ok(None),
                    _ => {
                        let mut diags = Diagnostics::default();
                        diags.attr_error("by", "must be a list of strings");
                        return Err(diags);
                    }
                }
            }
            Ok(Some(by))
        }
        _ => Ok(None),
    }
}

/// The plan-time checks: RFC 3339 times, a window the backend answers, known groupings.
fn check(config: &Value) -> Diagnostics {
    let mut diags = Diagnostics::default();
    let mut parsed = [None, None];
    for (slot, name) in parsed.iter_mut().zip(["since", "until"]) {
        match config.str_attr(name) {
            Ok(Some(text)) => match times::unix(text) {
                Ok(t) => *slot = Some(t),
                Err(reason) => diags.attr_error(name, reason),
            },
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
    }
    if let [Some(since), Some(until)] = parsed {
        if let Err(e) = usage_window(since, until) {
            diags.attr_error("until", e.trim_start_matches("until: "));
        }
    }
    match by_arg(config) {
        Ok(Some(by)) => {
            if let Err(e) = usage_by(&by) {
                diags.attr_error("by", e.trim_start_matches("by: "));
            }
        }
        Ok(None) => {}
        Err(more) => diags.0.extend(more.0),
    }
    diags
}

#[async_trait]
impl DataSourceType for Usage {
    fn name(&self) -> &'static str {
        "usage"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "GPU-seconds held and used in a window, per tenant, cluster, GPU model, capacity class and MIG profile (the admin: every team's or one's; a tenant token: its own).",
            vec![
                Attribute::computed("id", Type::String, "`usage/<tenant>/<since>/<until>`."),
                Attribute::optional(
                    "tenant",
                    Type::String,
                    "Only this tenant's, by id or name. Left out: every tenant's with the admin token, the token's own with a tenant token (another tenant's is refused as not found).",
                ),
                Attribute::required(
                    "since",
                    Type::String,
                    "The window's start, RFC 3339 (e.g. `2027-01-01T00:00:00Z`); no older than the retention (400 days).",
                ),
                Attribute::required(
                    "until",
                    Type::String,
                    "The window's end (exclusive), RFC 3339, after `since` and at most 400 days later. Held time is counted up to now at most.",
                ),
                Attribute::optional(
                    "by",
                    Type::list(Type::String),
                    "What to group by: any of `tenant`, `cluster`, `gpu_type`, `class`, `mig_profile`. Left out: one total row.",
                ),
                Attribute::computed(
                    "rows",
                    Type::list(row_type()),
                    "One row per group, ordered by `tenant`, `cluster`, `gpu_type`, `class`, `mig_profile` (each empty when not grouped by; grouping by `cluster` keeps its `tenant`) with `gpu_seconds`, the GPU-seconds held; `gpu_seconds_used`, those the GPUs were busy by their node agents' utilisation readings (null: not reported, as for MIG slices on real GPUs; not 0); `gpu_seconds_measured`, the GPU-seconds held that the readings covered; and `slice_seconds`, the MIG instances held times seconds (0 for whole GPUs; every profile's together when not grouped by `mig_profile`). `class` is `guaranteed`, `burst`, `borrowed-preemptible` or `on-demand`; `mig_profile` is the MIG profile a cluster's `mig_layout` cuts its GPUs into (e.g. `1g.10gb`) or `none` for whole GPUs, and a profile's `gpu_seconds` is its part of the GPUs held (split by the memory slices each profile of the layout occupies, so the profiles add up to the whole GPUs). `cost` is the row's cost at the operator's price list (`serve --prices`), GPU-hours held times the price of its model and class, as a decimal in the list's currency (e.g. `\"5.56\"`); null where the row is not priced (see `cost_unavailable`).",
                ),
                Attribute::computed(
                    "cost_unavailable",
                    Type::String,
                    "Why some or all rows have no `cost`: the control plane has no price list, `by` lacks `gpu_type` or `class` (a price is per model and class), or the list has no price for the models and classes it names. Empty when every row has a cost.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        check(config).into_result()
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        check(config).into_result()?;
        let client = self.provider.client()?;
        let tenant = config
            .str_attr("tenant")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let since = required_arg(config, "since")?;
        let until = required_arg(config, "until")?;
        let to_proto = |text: &str| times::unix(text).ok().map(times::to_proto);
        let request = api::UsageRequest {
            tenant_id: tenant.clone(),
            since: to_proto(&since),
            until: to_proto(&until),
            by: by_arg(config)?.unwrap_or_default(),
        };
        let report = answered(&client, client.quotas().get_usage(request).await)?;
        let mut state = config.clone();
        state.set(
            "id",
            Value::String(format!("usage/{tenant}/{since}/{until}")),
        );
        state.set(
            "rows",
            Value::List(report.rows.iter().map(row_value).collect()),
        );
        state.set("cost_unavailable", Value::string(&report.cost_unavailable));
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(since: &str, until: &str, by: &[&str]) -> Value {
        Value::object([
            ("since", Value::string(since)),
            ("until", Value::string(until)),
            (
                "by",
                Value::List(by.iter().map(|b| Value::string(*b)).collect()),
            ),
        ])
    }

    fn summaries(config: &Value) -> Vec<String> {
        check(config).0.into_iter().map(|d| d.summary).collect()
    }

    #[test]
    fn a_good_window_and_grouping_pass() {
        let ok = config(
            "2027-01-01T00:00:00Z",
            "2027-02-01T00:00:00Z",
            &["tenant", "class"],
        );
        assert!(summaries(&ok).is_empty());
    }

    /// Each refusal names its attribute and why, at plan time.
    #[test]
    fn bad_times_windows_and_groupings_name_the_attribute() {
        let bad = summaries(&config("yesterday", "2027-02-01T00:00:00Z", &[]));
        assert_eq!(bad.len(), 1);
        assert!(
            bad[0].starts_with("since: \"yesterday\" is not an RFC 3339 time"),
            "{bad:?}"
        );
        assert_eq!(
            summaries(&config("2027-02-01T00:00:00Z", "2027-01-01T00:00:00Z", &[])),
            ["until: must be after since"]
        );
        assert!(
            summaries(&config("2027-01-01T00:00:00Z", "2029-01-01T00:00:00Z", &[]))[0]
                .starts_with("until: the window may be at most 400 days long")
        );
        assert_eq!(
            summaries(&config(
                "2027-01-01T00:00:00Z",
                "2027-02-01T00:00:00Z",
                &["team"]
            )),
            ["by: unknown grouping 'team'; use any of tenant, cluster, gpu_type, class, mig_profile"]
        );
    }

    /// Unknown values (from other resources) wait for the apply.
    #[test]
    fn unknown_values_are_not_judged() {
        let mut c = config("2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", &[]);
        c.set("until", Value::Unknown);
        c.set("by", Value::List(vec![Value::Unknown]));
        assert!(summaries(&c).is_empty());
    }

    /// Not reported is null, never 0.
    #[test]
    fn used_is_null_where_not_reported() {
        let mut r = api::UsageRow {
            gpu_seconds: 80,
            ..Default::default()
        };
        assert_eq!(row_value(&r).get("gpu_seconds_used"), &Value::Null);
        r.gpu_seconds_used = Some(0);
        r.gpu_seconds_measured = 80;
        assert_eq!(row_value(&r).get("gpu_seconds_used"), &Value::Number(0));
        assert_eq!(
            row_value(&r).get("gpu_seconds_measured"),
            &Value::Number(80)
        );
    }

    /// A MIG profile's row carries the profile and its slice-seconds.
    #[test]
    fn a_mig_profile_row_has_its_profile_and_slices() {
        let r = api::UsageRow {
            gpu_seconds: 80,
            mig_profile: "1g.10gb".into(),
            slice_seconds: 560,
            ..Default::default()
        };
        assert_eq!(row_value(&r).get("mig_profile"), &Value::string("1g.10gb"));
        assert_eq!(row_value(&r).get("slice_seconds"), &Value::Number(560));
    }

    /// A priced row's cost is an exact decimal; an unpriced one's is null, never 0.
    #[test]
    fn cost_is_a_decimal_or_null() {
        let mut r = api::UsageRow::default();
        assert_eq!(row_value(&r).get("cost"), &Value::Null);
        r.cost_cents = Some(556);
        assert_eq!(row_value(&r).get("cost"), &Value::string("5.56"));
        r.cost_cents = Some(7);
        assert_eq!(row_value(&r).get("cost"), &Value::string("0.07"));
    }
}
