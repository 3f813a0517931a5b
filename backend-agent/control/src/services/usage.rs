//! GetUsage: GPU-seconds held in a window (issue 42), read from the usage intervals the
//! store writes with every holding. The admin sees every team's, a team's token only its
//! own; the window and the answer are bounded.

use gpufleet_proto::limits::{usage_by, usage_window, MAX_USAGE_ROWS, USAGE_RETENTION_SECS};
use gpufleet_proto::v1;
use rusqlite::Connection;
use tonic::{Request, Status};

use super::invalid;
use crate::auth::Caller;
use crate::state::{db_error, rfc3339, AppState};
use crate::store::usage::{self, GroupBy};

pub fn report(
    state: &AppState,
    conn: &Connection,
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
    };
    let limit = MAX_USAGE_ROWS as i64 + 1;
    let rows =
        usage::held(conn, tenant.as_deref(), since, until, now, by, limit).map_err(db_error)?;
    if rows.len() > MAX_USAGE_ROWS {
        return Err(invalid(format!(
            "by: more than {MAX_USAGE_ROWS} rows; group by less or read a shorter window"
        )));
    }
    Ok(v1::UsageReport {
        rows: rows
            .into_iter()
            .map(|r| v1::UsageRow {
                tenant: r.tenant,
                cluster: r.cluster,
                gpu_type: r.gpu_type,
                class: r.class,
                gpu_seconds: r.gpu_seconds,
            })
            .collect(),
        retention_seconds: USAGE_RETENTION_SECS,
    })
}
