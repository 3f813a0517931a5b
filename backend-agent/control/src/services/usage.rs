//! GetUsage: GPU-seconds held in a window (issue 42), read from the usage intervals the
//! store writes with every holding, and beside them the GPU-seconds used, from the node
//! agents' utilisation readings (none where no GPU of the group reported any), and with
//! the operator's price list their cost (`crate::usage_cost`). The admin sees every
//! team's, a team's token only its own; the window and the answer are bounded.

use std::collections::BTreeMap;

use gpufleet_proto::limits::{usage_by, usage_window, MAX_USAGE_ROWS, USAGE_RETENTION_SECS};
use gpufleet_proto::v1;
use gpufleet_sql::AsConn;
use tonic::{Request, Status};

use super::invalid;
use crate::auth::Caller;
use crate::state::{db_error, rfc3339, AppState};
use crate::store::usage::{self, GroupBy};

pub fn report(
    state: &AppState,
    conn: &impl AsConn,
    request: Request<v1::UsageRequest>,
) -> Result<v1::UsageReport, Status> {
    let (caller, req) = super::enter(state, conn, request)?;
    // The admin leaving the tenant out reads every team; a team's token, its own.
    let tenant = match (&caller, req.tenant_id.as_str()) {
        (Caller::Admin, "") => None,
        _ => Some(super::target_tenant(conn, &caller, &req.tenant_id)?.id),
    };
    let since = req
        .since
        .ok_or_else(|| invalid("since: required (the window's start)"))?
        .seconds;
    let until = req
        .until
        .ok_or_else(|| invalid("until: required (the window's end)"))?
        .seconds;
    usage_window(since, until).map_err(invalid)?;
    let now = state.now();
    let oldest = now - USAGE_RETENTION_SECS;
    if since < oldest {
        return Err(invalid(format!(
            "since: {} is older than the {}-day usage retention (kept from {})",
            rfc3339(since),
            USAGE_RETENTION_SECS / 86_400,
            rfc3339(oldest)
        )));
    }
    usage_by(&req.by).map_err(invalid)?;
    let has = |name: &str| req.by.iter().any(|b| b == name);
    let by = GroupBy {
        tenant: has("tenant"),
        cluster: has("cluster"),
        gpu_type: has("gpu_type"),
        class: has("class"),
        mig_profile: has("mig_profile"),
    };
    let limit = MAX_USAGE_ROWS as i64 + 1;
    let held =
        usage::held(conn, tenant.as_deref(), since, until, now, by, limit).map_err(db_error)?;
    let used = usage::used(conn, tenant.as_deref(), since, until, by, limit).map_err(db_error)?;
    let mut rows = merge(held, used);
    if rows.len() > MAX_USAGE_ROWS {
        return Err(invalid(format!(
            "by: more than {MAX_USAGE_ROWS} rows; group by less or read a shorter window"
        )));
    }
    let cost_unavailable = crate::usage_cost::price(state.prices.as_deref(), &req.by, &mut rows);
    Ok(v1::UsageReport {
        rows,
        retention_seconds: USAGE_RETENTION_SECS,
        cost_unavailable,
    })
}

/// Held and used of the same groups side by side, in the groups' order (the store's
/// `ORDER BY` on text is by bytes, as `String`'s `Ord`). A group without readings has no
/// used (not reported); used is rounded to seconds from milliseconds.
fn merge(held: Vec<usage::UsageRow>, used: Vec<usage::UsedRow>) -> Vec<v1::UsageRow> {
    type Key = (String, String, String, String, String);
    let empty = |(tenant, cluster, gpu_type, class, mig_profile): Key| v1::UsageRow {
        tenant,
        cluster,
        gpu_type,
        class,
        mig_profile,
        ..Default::default()
    };
    let mut rows: BTreeMap<Key, v1::UsageRow> = BTreeMap::new();
    for r in held {
        let key = (r.tenant, r.cluster, r.gpu_type, r.class, r.mig_profile);
        rows.insert(
            key.clone(),
            v1::UsageRow {
                gpu_seconds: r.gpu_seconds,
                slice_seconds: r.slice_seconds,
                ..empty(key)
            },
        );
    }
    let seconds = |ms: i64| (ms + 500).div_euclid(1000);
    for r in used.into_iter().filter(|r| r.measured_ms > 0) {
        let key = (r.tenant, r.cluster, r.gpu_type, r.class, r.mig_profile);
        let row = rows.entry(key.clone()).or_insert_with(|| empty(key));
        row.gpu_seconds_used = Some(seconds(r.used_ms));
        row.gpu_seconds_measured = seconds(r.measured_ms);
    }
    rows.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(class: &str, gpu_seconds: i64) -> usage::UsageRow {
        usage::UsageRow {
            tenant: "team-a".into(),
            cluster: String::new(),
            gpu_type: "H100-80GB".into(),
            class: class.into(),
            mig_profile: String::new(),
            gpu_seconds,
            slice_seconds: 0,
        }
    }

    /// Used beside held per group; a group without readings says none (not reported),
    /// not 0; milliseconds round to seconds.
    #[test]
    fn used_sits_beside_held_and_missing_readings_are_not_zero() {
        let used = vec![usage::UsedRow {
            tenant: "team-a".into(),
            cluster: String::new(),
            gpu_type: "H100-80GB".into(),
            class: "guaranteed".into(),
            mig_profile: String::new(),
            used_ms: 1_499,
            measured_ms: 8_000,
        }];
        let rows = merge(vec![held("burst", 10), held("guaranteed", 9)], used);
        let got: Vec<(&str, i64, Option<i64>, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.class.as_str(),
                    r.gpu_seconds,
                    r.gpu_seconds_used,
                    r.gpu_seconds_measured,
                )
            })
            .collect();
        assert_eq!(got, [("burst", 10, None, 0), ("guaranteed", 9, Some(1), 8)]);
    }
}
