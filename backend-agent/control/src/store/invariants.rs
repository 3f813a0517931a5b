//! What `gpufleet-agent check` reads to verify the store's invariants
//! (`crate::invariants`): every holding of every model, the fleet's capacity counted from
//! the nodes themselves (not from the `model_nodes` counters that admission reads), the
//! quotas, each node's cluster, the tenants' event and audit sequences, and the objects an
//! answers log names. Read-only, on either engine (`gpufleet_sql`); the caller reads them
//! all in one read transaction (`Database::read`), so that they see one committed state
//! while `serve` goes on writing.

use std::path::Path;
use std::time::Duration;

use gpufleet_sql::{params, AsConn};
use rusqlite::{Connection, OpenFlags};

/// Opens the database at `path` read-only (a WAL reader: `serve` may be writing it).
pub fn open_read_only(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

/// A reservation as the capacity and quota checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationHeld {
    pub id: String,
    pub tenant_id: String,
    pub gpu_type: String,
    pub node_count: i64,
    pub start_time: i64,
    pub end_time: i64,
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
}

/// Every reservation, ended or not.
pub fn reservations(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<ReservationHeld>> {
    conn.as_conn().query_map(
        "SELECT id, tenant_id, gpu_type, node_count, start_time, end_time, pool_nodes,
                on_demand_nodes
         FROM reservations ORDER BY id",
        params![],
        |r| {
            Ok(ReservationHeld {
                id: r.get(0)?,
                tenant_id: r.get(1)?,
                gpu_type: r.get(2)?,
                node_count: r.get(3)?,
                start_time: r.get(4)?,
                end_time: r.get(5)?,
                pool_nodes: r.get(6)?,
                on_demand_nodes: r.get(7)?,
            })
        },
    )
}

/// A cluster with the nodes it holds, counted from the nodes' own `cluster_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterHeld {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub gpu_type: String,
    /// The nodes it asks for (those it holds may differ while a change is under way).
    pub node_count: i64,
    pub reservation_id: Option<String>,
    /// Its reservation's end, when it draws from one that still exists.
    pub reservation_end: Option<i64>,
    pub pool: i64,
    pub on_demand: i64,
    pub preemptible: bool,
}

/// Every cluster with its pool and on-demand nodes.
pub fn clusters(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<ClusterHeld>> {
    conn.as_conn().query_map(
        "SELECT c.id, c.tenant_id, c.name, c.gpu_type, c.node_count, c.reservation_id,
                r.end_time,
                (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id AND n.capacity = 'pool'),
                (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id AND n.capacity <> 'pool'),
                EXISTS (SELECT 1 FROM cluster_preemption p WHERE p.cluster_id = c.id)
         FROM clusters c LEFT JOIN reservations r ON r.id = c.reservation_id
         ORDER BY c.id",
        params![],
        |r| {
            Ok(ClusterHeld {
                id: r.get(0)?,
                tenant_id: r.get(1)?,
                name: r.get(2)?,
                gpu_type: r.get(3)?,
                node_count: r.get(4)?,
                reservation_id: r.get(5)?,
                reservation_end: r.get(6)?,
                pool: r.get(7)?,
                on_demand: r.get(8)?,
                preemptible: r.get(9)?,
            })
        },
    )
}

/// One GPU model's capacity: its nodes in service (not quarantined) of each kind, and
/// the GPUs a node of it has (the most any has, as admission counts them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCapacity {
    pub gpu_type: String,
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
    pub gpus_per_node: i64,
}

/// Every model of the fleet, counted from the `nodes` rows.
pub fn models(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<ModelCapacity>> {
    // CASE, not a sum of comparisons (PostgreSQL's are booleans); CAST, as PostgreSQL's
    // SUM of integers is a NUMERIC.
    conn.as_conn().query_map(
        "SELECT gpu_type,
                CAST(SUM(CASE WHEN capacity = 'pool' AND state <> 'quarantined' THEN 1 ELSE 0 END) AS BIGINT),
                CAST(SUM(CASE WHEN capacity <> 'pool' AND state <> 'quarantined' THEN 1 ELSE 0 END) AS BIGINT),
                MAX(gpu_count)
         FROM nodes GROUP BY gpu_type ORDER BY gpu_type",
        params![],
        |r| {
        Ok(ModelCapacity {
            gpu_type: r.get(0)?,
            pool_nodes: r.get(1)?,
            on_demand_nodes: r.get(2)?,
            gpus_per_node: r.get(3)?,
        })
    },
    )
}

/// A tenant's quota of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaLimit {
    pub tenant_id: String,
    pub tenant_name: String,
    pub gpu_type: String,
    pub gpus: i64,
    pub burst_gpus: i64,
}

pub fn quotas(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<QuotaLimit>> {
    conn.as_conn().query_map(
        "SELECT q.tenant_id, COALESCE(t.name, ''), q.gpu_type, q.gpus, q.burst_gpus
         FROM quotas q LEFT JOIN tenants t ON t.id = q.tenant_id
         ORDER BY q.tenant_id, q.gpu_type",
        params![],
        |r| {
            Ok(QuotaLimit {
                tenant_id: r.get(0)?,
                tenant_name: r.get(1)?,
                gpu_type: r.get(2)?,
                gpus: r.get(3)?,
                burst_gpus: r.get(4)?,
            })
        },
    )
}

/// Tenant names by id (for messages).
pub fn tenant_names(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<(String, String)>> {
    conn.as_conn()
        .query_map("SELECT id, name FROM tenants ORDER BY id", params![], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
}

/// A node assigned to a cluster, and what that cluster is (None: no such cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub node_id: String,
    pub hostname: String,
    pub node_gpu_type: String,
    pub cluster_id: String,
    pub cluster_gpu_type: Option<String>,
}

/// Every node that names a cluster.
pub fn memberships(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<Membership>> {
    conn.as_conn().query_map(
        "SELECT n.id, n.hostname, n.gpu_type, n.cluster_id, c.gpu_type
         FROM nodes n LEFT JOIN clusters c ON c.id = n.cluster_id
         WHERE n.cluster_id IS NOT NULL ORDER BY n.cluster_id, n.id",
        params![],
        |r| {
            Ok(Membership {
                node_id: r.get(0)?,
                hostname: r.get(1)?,
                node_gpu_type: r.get(2)?,
                cluster_id: r.get(3)?,
                cluster_gpu_type: r.get(4)?,
            })
        },
    )
}

/// A node as the usage records see it (issue 42): the cluster it names, whether that
/// cluster exists, its GPUs, and the GPUs its open usage intervals count as held (a MIG
/// node's interval per profile counts its part of them: `store::usage::profile_shares`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageHeld {
    pub node_id: String,
    pub hostname: String,
    pub cluster_id: Option<String>,
    pub cluster_exists: bool,
    pub gpu_count: i64,
    pub open_gpus: i64,
}

/// Every node with what its open usage intervals count.
pub fn usage_held(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<UsageHeld>> {
    // The sum CAST before dividing: an integer division on both engines.
    conn.as_conn().query_map(
        "SELECT n.id, n.hostname, n.cluster_id,
                EXISTS (SELECT 1 FROM clusters c WHERE c.id = n.cluster_id), n.gpu_count,
                COALESCE((SELECT CAST(SUM(u.gpus * u.share_840ths) AS BIGINT) / 840
                          FROM usage_intervals u
                          WHERE u.node_id = n.id AND u.end_time IS NULL), 0)
         FROM nodes n ORDER BY n.id",
        params![],
        |r| {
            Ok(UsageHeld {
                node_id: r.get(0)?,
                hostname: r.get(1)?,
                cluster_id: r.get(2)?,
                cluster_exists: r.get(3)?,
                gpu_count: r.get(4)?,
                open_gpus: r.get(5)?,
            })
        },
    )
}

/// A create's request id and the object it made: (kind, scope, request_id, object_id),
/// kind "reservation", "cluster", ..., scope the owning tenant's id.
pub type RequestId = (String, String, String, String);

/// Every request id the idempotency table remembers.
pub fn request_ids(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<RequestId>> {
    conn.as_conn().query_map(
        "SELECT kind, scope, request_id, object_id FROM idempotency ORDER BY 1, 2, 3",
        params![],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}

/// Which of the two logs with per-tenant sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    Events,
    Audit,
}

impl Log {
    fn table(self) -> &'static str {
        match self {
            Log::Events => "events",
            Log::Audit => "audit_log",
        }
    }
}

/// One entry of a tenant's sequence: its fleet-wide `seq` and its own `tenant_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequenced {
    pub seq: i64,
    pub tenant_seq: Option<i64>,
}

/// Every tenant's entries of `log` (those of no tenant left out), by tenant, in the
/// fleet-wide order.
pub fn tenant_entries(
    conn: &impl AsConn,
    log: Log,
) -> gpufleet_sql::Result<Vec<(String, Sequenced)>> {
    conn.as_conn().query_map(
        &format!(
            "SELECT tenant_id, seq, tenant_seq FROM {} WHERE tenant_id <> ''
             ORDER BY tenant_id, seq",
            log.table()
        ),
        params![],
        |r| {
            Ok((
                r.get(0)?,
                Sequenced {
                    seq: r.get(1)?,
                    tenant_seq: r.get(2)?,
                },
            ))
        },
    )
}

/// Per tenant, the greatest fleet-wide `seq` at or below which the event log's pruning
/// (each object keeps the events within [`super::events::KEEP_PER_OBJECT`] of its
/// newest) may have removed an event of it. Tenants whose objects were never pruned
/// are absent.
pub fn event_prune_horizons(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<(String, i64)>> {
    // The subquery is named: PostgreSQL 15 requires it.
    conn.as_conn().query_map(
        "SELECT tenant_id, MAX(newest) - ?1 FROM
             (SELECT tenant_id, object_id, MAX(seq) AS newest FROM events
              WHERE tenant_id <> '' GROUP BY tenant_id, object_id) AS per_object
         GROUP BY tenant_id HAVING MAX(newest) - ?1 > 0",
        params![super::events::KEEP_PER_OBJECT],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read-only connection sees what a writer committed, in a snapshot that later
    /// commits do not change.
    #[test]
    fn a_snapshot_holds_still_while_the_writer_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let writer = crate::store::open(&path).unwrap();
        let add = |id: &str| {
            writer
                .execute(
                    "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                     VALUES (?1, ?1, ?1, '{}', ?1, 0)",
                    [id],
                )
                .unwrap()
        };
        add("t1");
        let mut reader = gpufleet_sql::Database::sqlite(open_read_only(&path).unwrap());
        let (before, after) = reader
            .read(|c| {
                let before = tenant_names(c)?.len();
                add("t2");
                Ok((before, tenant_names(c)?.len()))
            })
            .unwrap();
        assert_eq!((before, after), (1, 1));
        assert_eq!(reader.read(|c| tenant_names(c)).unwrap().len(), 2);
        assert!(reader
            .conn()
            .execute("DELETE FROM tenants", params![])
            .is_err_and(|e| e.to_string().contains("readonly")));
    }
}
