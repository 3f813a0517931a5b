//! gRPC services, one module per service, and what they share: status helpers,
//! visibility rules, and loading the holdings the capacity and quota arithmetic needs.

pub mod admissions;
pub mod breakers;
pub mod clusters;
pub mod detached;
mod drain;
pub mod error_details;
pub mod fairness;
pub mod fleet;
pub mod health;
pub mod hints;
pub mod paging;
pub mod progress;
pub mod quotas;
pub mod request_framing;
pub mod reservations;
pub mod short_errors;
pub mod tenants;
pub mod to_leader;
pub mod tokens;
mod usage;

use std::collections::HashMap;

use gpufleet_proto::v1;
use gpufleet_sql::Savepoint;
use gpufleet_sql::{AsConn, Conn};
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::state::db_error;
use crate::state::AppState;
use crate::store::{self, tenants::TenantRow};

/// The one entry step of every call: who calls (from its token), then the message's
/// bounds, then the message itself.
pub fn enter<T: crate::limits::Bounded + crate::intent::Intent>(
    state: &AppState,
    conn: &impl AsConn,
    request: Request<T>,
) -> Result<(Caller, T), Status> {
    let caller = crate::auth::authenticate(state, conn, &request)?;
    crate::limits::check(request.get_ref())?;
    Ok((caller, request.into_inner()))
}

/// Serves a call that only reads: `handler` runs with a read-only connection, off the
/// async workers (see [`AppState::read`]).
pub async fn reading<S, T, A>(
    state: &AppState,
    svc: &S,
    request: Request<T>,
    handler: fn(&S, Conn<'_>, Request<T>) -> Result<A, Status>,
) -> Result<Response<A>, Status>
where
    S: Clone + Send + 'static,
    T: Send + 'static,
    A: Send + 'static,
{
    let svc = svc.clone();
    state
        .read(move |conn| handler(&svc, conn.as_conn(), request))
        .await
        .map(Response::new)
}

/// Serves a read-check-write call: `handler` runs in its own savepoint on the writer
/// thread and keeps its writes with `Savepoint::commit` (see [`AppState::write`]).
pub async fn writing<S, T, A>(
    state: &AppState,
    svc: &S,
    request: Request<T>,
    handler: fn(&S, Savepoint<'_>, Request<T>) -> Result<A, Status>,
) -> Result<Response<A>, Status>
where
    S: Clone + Send + 'static,
    T: Send + 'static,
    A: Send + 'static,
{
    let svc = svc.clone();
    state
        .write(move |sp| handler(&svc, sp, request))
        .await
        .map(Response::new)
}

/// Runs a handler's file work (a cluster's storage directory) on a blocking thread, so the
/// async workers stay free for other requests and the agents' streams. The database has
/// its own two ways (`AppState::read`, `AppState::write`).
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("request worker failed: {e}")))?
}

pub fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message)
}

pub fn precondition(message: impl Into<String>) -> Status {
    Status::failed_precondition(message)
}

/// The one NOT_FOUND message for an id, whether it does not exist or belongs to
/// another tenant, so a tenant cannot learn what others have.
pub fn not_found(kind: &str, id: &str) -> Status {
    Status::not_found(format!("{kind} {} not found", crate::limits::quote(id)))
}

pub fn request_id_conflict(request_id: &str, kind: &str) -> Status {
    invalid(format!(
        "request_id: '{request_id}' was already used for a different {kind} create request; use a new request_id"
    ))
}

/// The tenant a request acts for: the given id when the caller may see it, the caller's
/// own tenant when a tenant token leaves it empty.
pub fn target_tenant(
    conn: &impl AsConn,
    caller: &Caller,
    tenant_id: &str,
) -> Result<TenantRow, Status> {
    let id = match (caller, tenant_id) {
        (Caller::Tenant(own), "") => own.as_str(),
        // The admin token acts for no tenant, so it must name one (a tenant's token may
        // leave it out: its own).
        (Caller::Admin, "") => return Err(invalid(ADMIN_NAMES_THE_TENANT)),
        (_, id) => id,
    };
    visible_tenant(conn, caller, id)
}

/// The refusal of a request that leaves its tenant out with the admin token.
pub const ADMIN_NAMES_THE_TENANT: &str = "tenant_id: required with the admin token, which belongs to no tenant; name the tenant (by name or id), or use the tenant's own token, with which it may be left out";

/// A tenant by its id or its name, when the caller may see it (another tenant's answers
/// like one that does not exist).
pub fn visible_tenant(conn: &impl AsConn, caller: &Caller, id: &str) -> Result<TenantRow, Status> {
    let found = match store::tenants::get(conn, id).map_err(db_error)? {
        Some(t) => Some(t),
        None => store::tenants::by_name(conn, id).map_err(db_error)?,
    };
    match found {
        Some(t) if caller.sees(&t.id) => Ok(t),
        _ => Err(hints::unknown_tenant(conn, caller, id)),
    }
}

/// A tenant's name by id, for answers ("" when it is gone).
pub fn tenant_name(conn: &impl AsConn, tenant_id: &str) -> Result<String, Status> {
    Ok(store::tenants::get(conn, tenant_id)
        .map_err(db_error)?
        .map(|t| t.name)
        .unwrap_or_default())
}

/// The tenant filter of a List call: None (all) for the admin without a filter.
pub fn list_scope(
    conn: &impl AsConn,
    caller: &Caller,
    tenant_id: &str,
) -> Result<Option<String>, Status> {
    match (caller, tenant_id) {
        (Caller::Admin, "") => Ok(None),
        _ => Ok(Some(target_tenant(conn, caller, tenant_id)?.id)),
    }
}

pub fn to_timestamp(unix: i64) -> Option<prost_types::Timestamp> {
    Some(gpufleet_proto::timestamp::from_unix(unix))
}

pub fn to_hash_map<V: Clone>(m: &std::collections::BTreeMap<String, V>) -> HashMap<String, V> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Nodes as the API shows them; a tenant caller does not learn who holds others' nodes.
/// With `agents`, each node's heartbeat age is filled in.
pub fn node_messages(
    conn: &impl AsConn,
    agents: Option<&crate::registry::Registry>,
    caller: &Caller,
    rows: Vec<store::nodes::NodeRow>,
) -> Result<Vec<v1::Node>, Status> {
    // The page's rows first, three statements whatever its size, then the messages.
    let ids: Vec<&str> = rows.iter().map(|n| n.id.as_str()).collect();
    let clusters: Vec<&str> = rows
        .iter()
        .filter_map(|n| n.cluster_id.as_deref())
        .collect();
    let tenants = store::clusters::tenants_of(conn, &clusters).map_err(db_error)?;
    let mut all_gpus = store::nodes::gpus_of(conn, &ids).map_err(db_error)?;
    let mut all_devices = store::nodes::mig_devices_of(conn, &ids).map_err(db_error)?;
    let mut out = Vec::with_capacity(rows.len());
    for n in rows {
        let tenant_id = n
            .cluster_id
            .as_ref()
            .and_then(|c| tenants.get(c).cloned())
            .unwrap_or_default();
        let (cluster_id, tenant_id) = if caller.sees(&tenant_id) {
            (n.cluster_id.clone().unwrap_or_default(), tenant_id)
        } else {
            (String::new(), String::new())
        };
        let mut gpus = Vec::new();
        for g in all_gpus.remove(&n.id).unwrap_or_default() {
            let mig_devices = all_devices
                .remove(&(n.id.clone(), g.index))
                .unwrap_or_default()
                .into_iter()
                .map(|d| v1::MigDevice {
                    profile: d.profile,
                    profile_id: d.profile_id as i32,
                    start: d.start as i32,
                    size: d.size as i32,
                    memory_mib: d.memory_mib,
                    uuid: d.uuid,
                })
                .collect();
            gpus.push(v1::Gpu {
                index: g.index as i32,
                uuid: g.uuid,
                model: g.model,
                memory_mib: g.memory_mib,
                mig_enabled: g.mig_enabled,
                mig_devices,
            });
        }
        // Only ListNodes reports heartbeat ages: a cluster's answer stays the same while
        // nothing about it changes.
        let heartbeat_age = agents.map_or(0, |a| {
            a.heartbeat_age(&n.id)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(-1)
        });
        out.push(v1::Node {
            id: n.id,
            hostname: n.hostname,
            gpu_type: n.gpu_type,
            capacity: n.capacity,
            gpu_count: n.gpu_count as i32,
            gpus,
            driver_version: n.driver_version,
            cuda_version: n.cuda_version,
            heartbeat_age_seconds: heartbeat_age,
            state: n.state,
            state_reason: n.state_reason,
            cluster_id,
            tenant_id,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::store::nodes::MigDeviceRow;

    thread_local! {
        static STATEMENTS: Cell<usize> = const { Cell::new(0) };
    }

    fn count(_sql: &str) {
        STATEMENTS.with(|n| n.set(n.get() + 1));
    }

    #[test]
    fn a_page_of_nodes_is_read_in_three_statements_whatever_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("s.db")).unwrap();
        let fleet = crate::fleet::parse(
            "[[pool]]\ngpu_type = \"A100-80GB\"\nnodes = 40\ngpus_per_node = 4\n",
        )
        .unwrap();
        crate::fleet::seed(&conn, &fleet, 0).unwrap();
        let rows = store::nodes::list(&conn, None, None).unwrap();
        let sliced = rows[7].id.clone();
        let devices = [MigDeviceRow {
            profile: "3g.40gb".into(),
            profile_id: 9,
            start: 4,
            size: 4,
            memory_mib: 40192,
            uuid: "MIG-1".into(),
        }];
        store::nodes::set_mig_state(&conn, &sliced, 2, true, &devices).unwrap();

        #[allow(deprecated)] // trace_v2 takes a mask; one callback per statement is all we need
        conn.trace(Some(count));
        STATEMENTS.with(|n| n.set(0));
        let messages = node_messages(&conn, None, &Caller::Admin, rows.clone()).unwrap();
        assert_eq!(
            STATEMENTS.with(Cell::get),
            3,
            "statements for {} nodes",
            rows.len()
        );
        #[allow(deprecated)]
        conn.trace(None);

        assert_eq!(messages.len(), 40);
        for (row, m) in rows.iter().zip(&messages) {
            assert_eq!(m.id, row.id);
            let gpus = store::nodes::gpus(&conn, &row.id).unwrap();
            let uuids: Vec<&str> = m.gpus.iter().map(|g| g.uuid.as_str()).collect();
            assert_eq!(
                uuids,
                gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>()
            );
        }
        let m = &messages[7];
        assert!(m.gpus[2].mig_enabled);
        assert_eq!(m.gpus[2].mig_devices.len(), 1);
        assert_eq!(m.gpus[2].mig_devices[0].uuid, "MIG-1");
        assert!(m
            .gpus
            .iter()
            .enumerate()
            .all(|(i, g)| i == 2 || g.mig_devices.is_empty()));
    }
}
