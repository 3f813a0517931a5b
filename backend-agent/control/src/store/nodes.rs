//! Node, GPU and MIG device rows: the fleet as NVML would report it.
//!
//! The same statements run on SQLite and PostgreSQL (`gpufleet_sql`), but for the JSON
//! list of a page's ids ([`json_list_values`]). Lists come in bytewise order of their
//! text keys on both ([`by_hostname_bytes`]).

use gpufleet_sql::{params, AsConn, Engine, Row};

#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: String,
    pub hostname: String,
    pub gpu_type: String,
    /// "pool" or "on-demand".
    pub capacity: String,
    pub gpu_count: i64,
    pub driver_version: String,
    pub cuda_version: String,
    pub cluster_id: Option<String>,
    /// `ready`, `busy`, `unreachable` or `quarantined` (see the `NODE_*` constants).
    pub state: String,
    /// Why the node is in its state, when that needs saying (empty otherwise).
    pub state_reason: String,
    /// Unix seconds when the node entered its state.
    pub state_since: i64,
}

#[derive(Debug, Clone)]
pub struct GpuRow {
    pub node_id: String,
    pub index: i64,
    pub uuid: String,
    pub model: String,
    pub memory_mib: i64,
    pub mig_enabled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDeviceRow {
    pub profile: String,
    pub profile_id: i64,
    pub start: i64,
    pub size: i64,
    pub memory_mib: i64,
    pub uuid: String,
}

pub const POOL: &str = "pool";
pub const ON_DEMAND: &str = "on-demand";

/// Registered, converged, and free to be handed out (or working in its cluster).
pub const NODE_READY: &str = "ready";
/// Registered but converging to what the control plane wants (e.g. being reset).
pub const NODE_BUSY: &str = "busy";
/// No agent, or no heartbeat within the node timeout.
pub const NODE_UNREACHABLE: &str = "unreachable";
/// Taken out of service; never handed out until an operator returns it.
pub const NODE_QUARANTINED: &str = "quarantined";

const COLUMNS: &str =
    "id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version, cluster_id, state, state_reason, state_since";

fn from_row(r: &Row) -> gpufleet_sql::Result<NodeRow> {
    Ok(NodeRow {
        id: r.get(0)?,
        hostname: r.get(1)?,
        gpu_type: r.get(2)?,
        capacity: r.get(3)?,
        gpu_count: r.get(4)?,
        driver_version: r.get(5)?,
        cuda_version: r.get(6)?,
        cluster_id: r.get(7)?,
        state: r.get(8)?,
        state_reason: r.get(9)?,
        state_since: r.get(10)?,
    })
}

/// Nodes in hostname order by its bytes, as SQLite's ORDER BY gives them: PostgreSQL's
/// follows the database's collation (case and punctuation weigh differently).
fn by_hostname_bytes(mut nodes: Vec<NodeRow>) -> Vec<NodeRow> {
    nodes.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    nodes
}

pub fn count(conn: &impl AsConn) -> gpufleet_sql::Result<i64> {
    conn.as_conn()
        .query_row("SELECT COUNT(*) FROM nodes", params![], |r| r.get(0))
}

pub fn insert(conn: &impl AsConn, n: &NodeRow, gpus: &[GpuRow]) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    c.execute(
        &format!(
            "INSERT INTO nodes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ),
        params![
            n.id,
            n.hostname,
            n.gpu_type,
            n.capacity,
            n.gpu_count,
            n.driver_version,
            n.cuda_version,
            n.cluster_id,
            n.state,
            n.state_reason,
            n.state_since
        ],
    )?;
    for g in gpus {
        c.execute(
            "INSERT INTO gpus (node_id, idx, uuid, model, memory_mib, mig_enabled) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![g.node_id, g.index, g.uuid, g.model, g.memory_mib, g.mig_enabled],
        )?;
    }
    Ok(())
}

/// Nodes in hostname order, optionally narrowed to a GPU model and/or a cluster.
pub fn list(
    conn: &impl AsConn,
    gpu_type: Option<&str>,
    cluster_id: Option<&str>,
) -> gpufleet_sql::Result<Vec<NodeRow>> {
    // CAST: PostgreSQL cannot tell the type of a parameter that is only tested for NULL.
    let nodes = conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM nodes
             WHERE (CAST(?1 AS TEXT) IS NULL OR gpu_type = ?1)
               AND (CAST(?2 AS TEXT) IS NULL OR cluster_id = ?2)
             ORDER BY hostname"
        ),
        params![gpu_type, cluster_id],
        from_row,
    )?;
    Ok(by_hostname_bytes(nodes))
}

/// The nodes in `tenant_id`'s clusters, in hostname order, optionally narrowed like
/// [`list`]: all a tenant may see of the fleet's nodes.
pub fn list_of_tenant(
    conn: &impl AsConn,
    tenant_id: &str,
    gpu_type: Option<&str>,
    cluster_id: Option<&str>,
) -> gpufleet_sql::Result<Vec<NodeRow>> {
    let nodes = conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM nodes
             WHERE cluster_id IN (SELECT id FROM clusters WHERE tenant_id = ?1)
             AND (CAST(?2 AS TEXT) IS NULL OR gpu_type = ?2)
             AND (CAST(?3 AS TEXT) IS NULL OR cluster_id = ?3)
             ORDER BY hostname"
        ),
        params![tenant_id, gpu_type, cluster_id],
        from_row,
    )?;
    Ok(by_hostname_bytes(nodes))
}

/// Free nodes of a model and capacity kind that can be handed out now (their agent is
/// connected and the node is converged), lowest hostname first.
pub fn free(
    conn: &impl AsConn,
    gpu_type: &str,
    capacity: &str,
) -> gpufleet_sql::Result<Vec<NodeRow>> {
    let nodes = conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM nodes WHERE gpu_type = ?1 AND capacity = ?2 AND cluster_id IS NULL
             AND state = 'ready' ORDER BY hostname"
        ),
        params![gpu_type, capacity],
        from_row,
    )?;
    Ok(by_hostname_bytes(nodes))
}

/// Hands a free node to a cluster at `t`; fails (0 rows) if someone else holds it. Its
/// usage interval opens in the same transaction.
pub fn assign(
    conn: &impl AsConn,
    node_id: &str,
    cluster_id: &str,
    t: i64,
) -> gpufleet_sql::Result<bool> {
    let c = conn.as_conn();
    let changed = c.execute(
        "UPDATE nodes SET cluster_id = ?2 WHERE id = ?1 AND cluster_id IS NULL",
        params![node_id, cluster_id],
    )?;
    if changed == 1 {
        super::usage::open(&c, node_id, cluster_id, t)?;
    }
    Ok(changed == 1)
}

pub fn get(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<Option<NodeRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM nodes WHERE id = ?1"),
        params![id],
        from_row,
    )
}

pub fn by_hostname(conn: &impl AsConn, hostname: &str) -> gpufleet_sql::Result<Option<NodeRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM nodes WHERE hostname = ?1"),
        params![hostname],
        from_row,
    )
}

/// Moves a node to `state` (one of the `NODE_*` constants) as of `since`.
pub fn set_state(
    conn: &impl AsConn,
    node_id: &str,
    state: &str,
    reason: &str,
    since: i64,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE nodes SET state = ?2, state_reason = ?3, state_since = ?4 WHERE id = ?1",
        params![node_id, state, reason, since],
    )?;
    Ok(())
}

/// Puts a node in service (once: the first time counts): it passed the control plane's
/// admission checks, an operator returned it, or the platform declared it.
pub fn put_in_service(conn: &impl AsConn, node_id: &str, now: i64) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE nodes SET in_service_since = ?2 WHERE id = ?1 AND in_service_since IS NULL",
        params![node_id, now],
    )?;
    Ok(())
}

/// Whether the node was ever in service (None: no such node). A node that was not is a
/// candidate.
pub fn in_service(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<Option<bool>> {
    conn.as_conn().query_opt(
        "SELECT in_service_since IS NOT NULL FROM nodes WHERE id = ?1",
        params![node_id],
        |r| r.get(0),
    )
}

/// How many nodes are candidates (never in service).
pub fn candidates(conn: &impl AsConn) -> gpufleet_sql::Result<i64> {
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM nodes WHERE in_service_since IS NULL",
        params![],
        |r| r.get(0),
    )
}

/// Candidates that registered from `source` (see `agents::admission::source_of`).
pub fn candidates_from(conn: &impl AsConn, source: &str) -> gpufleet_sql::Result<i64> {
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM nodes WHERE in_service_since IS NULL AND joined_from = ?1",
        params![source],
        |r| r.get(0),
    )
}

/// Records where a new node registered from.
pub fn set_joined_from(
    conn: &impl AsConn,
    node_id: &str,
    source: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE nodes SET joined_from = ?2 WHERE id = ?1",
        params![node_id, source],
    )?;
    Ok(())
}

/// Candidates that have been in their state since before `before` (unix seconds), in
/// id order by its bytes (see [`by_hostname_bytes`]).
pub fn stale_candidates(conn: &impl AsConn, before: i64) -> gpufleet_sql::Result<Vec<String>> {
    let mut ids: Vec<String> = conn.as_conn().query_map(
        "SELECT id FROM nodes WHERE in_service_since IS NULL AND cluster_id IS NULL AND state_since < ?1 ORDER BY id",
        params![before],
        |r| r.get(0),
    )?;
    ids.sort();
    Ok(ids)
}

/// Removes a candidate and everything recorded of it (its GPUs, host, endpoint, checks and
/// events); false when the node is not a free candidate (it was put in service meanwhile).
pub fn forget_candidate(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<bool> {
    let c = conn.as_conn();
    let candidate: bool = c.query_row(
        "SELECT COUNT(*) > 0 FROM nodes WHERE id = ?1 AND in_service_since IS NULL AND cluster_id IS NULL",
        params![node_id],
        |r| r.get(0),
    )?;
    if !candidate {
        return Ok(false);
    }
    for sql in [
        "DELETE FROM mig_devices WHERE node_id = ?1",
        "DELETE FROM gpus WHERE node_id = ?1",
        "DELETE FROM node_endpoints WHERE node_id = ?1",
        "DELETE FROM node_hosts WHERE node_id = ?1",
        "DELETE FROM health_results WHERE node_id = ?1",
        "DELETE FROM events WHERE object_id = ?1",
        "DELETE FROM nodes WHERE id = ?1",
    ] {
        c.execute(sql, params![node_id])?;
    }
    Ok(true)
}

/// Records what a node's agent reported at registration: versions (GPUs are set apart).
/// A node's host as Slurm declares it, from its agent's last registration.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeHost {
    /// Where the controller reaches the node's slurmd (NodeAddr).
    pub address: String,
    /// The host's name (NodeHostname).
    pub hostname: String,
    pub cpus: u32,
    /// 0: not reported (Slurm's default).
    pub memory_mib: u64,
    /// Simulated GPUs: slurmd declares what slurm.conf says, not what it finds.
    pub simulated: bool,
}

pub fn set_host(conn: &impl AsConn, node_id: &str, h: &NodeHost) -> gpufleet_sql::Result<()> {
    // An upsert of every column: the row INSERT OR REPLACE left, on both engines.
    conn.as_conn().execute(
        "INSERT INTO node_hosts (node_id, address, hostname, cpus, memory_mib, simulated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (node_id) DO UPDATE SET address = ?2, hostname = ?3, cpus = ?4,
             memory_mib = ?5, simulated = ?6",
        params![
            node_id,
            h.address,
            h.hostname,
            h.cpus,
            // Bounded at admission (at most 2^30), so it fits.
            h.memory_mib as i64,
            h.simulated
        ],
    )?;
    Ok(())
}

/// The node's host as last registered; None for a node that has not registered since
/// hosts were recorded.
pub fn host(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<Option<NodeHost>> {
    conn.as_conn().query_opt(
        "SELECT address, hostname, cpus, memory_mib, simulated FROM node_hosts WHERE node_id = ?1",
        params![node_id],
        |r| {
            Ok(NodeHost {
                address: r.get(0)?,
                hostname: r.get(1)?,
                cpus: r.get(2)?,
                memory_mib: r.get::<i64>(3)?.max(0) as u64,
                simulated: r.get(4)?,
            })
        },
    )
}

pub fn set_versions(
    conn: &impl AsConn,
    node_id: &str,
    driver_version: &str,
    cuda_version: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE nodes SET driver_version = ?2, cuda_version = ?3 WHERE id = ?1",
        params![node_id, driver_version, cuda_version],
    )?;
    Ok(())
}

/// Takes a node back from its cluster at `t`; its usage interval closes in the same
/// transaction.
pub fn release(conn: &impl AsConn, node_id: &str, t: i64) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    c.execute(
        "UPDATE nodes SET cluster_id = NULL WHERE id = ?1",
        params![node_id],
    )?;
    super::usage::close(&c, node_id, t)
}

pub fn gpus(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<Vec<GpuRow>> {
    conn.as_conn().query_map(
        "SELECT node_id, idx, uuid, model, memory_mib, mig_enabled FROM gpus WHERE node_id = ?1 ORDER BY idx",
        params![node_id],
        gpu_row,
    )
}

pub fn mig_devices(
    conn: &impl AsConn,
    node_id: &str,
    gpu_index: i64,
) -> gpufleet_sql::Result<Vec<MigDeviceRow>> {
    conn.as_conn().query_map(
        "SELECT profile, profile_id, start, size, memory_mib, uuid FROM mig_devices
         WHERE node_id = ?1 AND gpu_idx = ?2 ORDER BY start",
        params![node_id, gpu_index],
        |r| mig_device_row(r, 0),
    )
}

/// The GPUs of `node_ids`, by node, in index order: one statement for a whole page.
pub fn gpus_of(
    conn: &impl AsConn,
    node_ids: &[&str],
) -> gpufleet_sql::Result<std::collections::HashMap<String, Vec<GpuRow>>> {
    let c = conn.as_conn();
    let rows = c.query_map(
        &format!(
            "SELECT node_id, idx, uuid, model, memory_mib, mig_enabled FROM gpus
             WHERE node_id IN ({}) ORDER BY node_id, idx",
            json_list_values(c.engine())
        ),
        params![json_list(node_ids)],
        gpu_row,
    )?;
    let mut out: std::collections::HashMap<String, Vec<GpuRow>> = Default::default();
    for g in rows {
        out.entry(g.node_id.clone()).or_default().push(g);
    }
    Ok(out)
}

/// The MIG devices of `node_ids`, by (node, GPU index), in start order: one statement.
pub fn mig_devices_of(
    conn: &impl AsConn,
    node_ids: &[&str],
) -> gpufleet_sql::Result<std::collections::HashMap<(String, i64), Vec<MigDeviceRow>>> {
    let c = conn.as_conn();
    let rows = c.query_map(
        &format!(
            "SELECT node_id, gpu_idx, profile, profile_id, start, size, memory_mib, uuid FROM mig_devices
             WHERE node_id IN ({}) ORDER BY node_id, gpu_idx, start",
            json_list_values(c.engine())
        ),
        params![json_list(node_ids)],
        |r| Ok(((r.get::<String>(0)?, r.get::<i64>(1)?), mig_device_row(r, 2)?)),
    )?;
    let mut out: std::collections::HashMap<(String, i64), Vec<MigDeviceRow>> = Default::default();
    for (key, d) in rows {
        out.entry(key).or_default().push(d);
    }
    Ok(out)
}

/// A `gpus` row: node_id, idx, uuid, model, memory_mib, mig_enabled.
fn gpu_row(r: &Row) -> gpufleet_sql::Result<GpuRow> {
    Ok(GpuRow {
        node_id: r.get(0)?,
        index: r.get(1)?,
        uuid: r.get(2)?,
        model: r.get(3)?,
        memory_mib: r.get(4)?,
        mig_enabled: r.get(5)?,
    })
}

/// A `mig_devices` row's profile, profile_id, start, size, memory_mib and uuid, from
/// column `first` on.
fn mig_device_row(r: &Row, first: usize) -> gpufleet_sql::Result<MigDeviceRow> {
    Ok(MigDeviceRow {
        profile: r.get(first)?,
        profile_id: r.get(first + 1)?,
        start: r.get(first + 2)?,
        size: r.get(first + 3)?,
        memory_mib: r.get(first + 4)?,
        uuid: r.get(first + 5)?,
    })
}

/// `ids` as a JSON array, the one parameter `?1` of an `IN (`[`json_list_values`]`)`.
pub(crate) fn json_list(ids: &[&str]) -> String {
    serde_json::to_string(ids).expect("strings encode as JSON")
}

/// The strings of the [`json_list`] in `?1`, one row each in a column `value`. JSON's
/// functions differ: SQLite's `json_each`, PostgreSQL's `json_array_elements_text`.
pub(crate) fn json_list_values(engine: Engine) -> &'static str {
    match engine {
        Engine::Sqlite => "SELECT value FROM json_each(?1)",
        Engine::Postgres => {
            "SELECT value FROM json_array_elements_text(CAST(CAST(?1 AS TEXT) AS JSON))"
        }
    }
}

/// Records a GPU's MIG state as the hardware reported it after a change.
pub fn set_mig_state(
    conn: &impl AsConn,
    node_id: &str,
    gpu_index: i64,
    mig_enabled: bool,
    devices: &[MigDeviceRow],
) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    c.execute(
        "UPDATE gpus SET mig_enabled = ?3 WHERE node_id = ?1 AND idx = ?2",
        params![node_id, gpu_index, mig_enabled],
    )?;
    c.execute(
        "DELETE FROM mig_devices WHERE node_id = ?1 AND gpu_idx = ?2",
        params![node_id, gpu_index],
    )?;
    for d in devices {
        c.execute(
            "INSERT INTO mig_devices (node_id, gpu_idx, profile, profile_id, start, size, memory_mib, uuid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![node_id, gpu_index, d.profile, d.profile_id, d.start, d.size, d.memory_mib, d.uuid],
        )?;
    }
    Ok(())
}

/// The hash of the secret a node's registrations must present ("" when none is issued).
pub fn secret_hash(conn: &impl AsConn, node_id: &str) -> gpufleet_sql::Result<String> {
    Ok(conn
        .as_conn()
        .query_opt(
            "SELECT secret_hash FROM nodes WHERE id = ?1",
            params![node_id],
            |r| r.get(0),
        )?
        .unwrap_or_default())
}

pub fn set_secret_hash(conn: &impl AsConn, node_id: &str, hash: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE nodes SET secret_hash = ?2 WHERE id = ?1",
        params![node_id, hash],
    )?;
    Ok(())
}

/// At start: every node waits for its agent to register with this process (quarantined
/// nodes stay quarantined).
pub fn await_agents(conn: &impl AsConn, now: i64) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE nodes SET state = 'unreachable', state_reason = 'waiting for its agent to register', state_since = ?1
         WHERE state != 'quarantined'",
        params![now],
    )?;
    Ok(())
}

/// The node that holds the GPU with this UUID, if any.
pub fn owner_of_gpu(conn: &impl AsConn, uuid: &str) -> gpufleet_sql::Result<Option<String>> {
    conn.as_conn().query_opt(
        "SELECT node_id FROM gpus WHERE uuid = ?1",
        params![uuid],
        |r| r.get(0),
    )
}

/// Gives a node's GPUs new indexes by UUID (`order`: UUID -> index), as the hardware now
/// numbers them; their MIG devices are dropped (recorded again from the same report).
pub fn reindex_gpus(
    conn: &impl AsConn,
    node_id: &str,
    order: &[(String, i64)],
) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    c.execute(
        "DELETE FROM mig_devices WHERE node_id = ?1",
        params![node_id],
    )?;
    // Out of the way first, so no two rows share an index mid-way (PostgreSQL checks the
    // key at each row, SQLite too).
    c.execute(
        "UPDATE gpus SET idx = -1 - idx WHERE node_id = ?1",
        params![node_id],
    )?;
    for (uuid, index) in order {
        c.execute(
            "UPDATE gpus SET idx = ?3 WHERE node_id = ?1 AND uuid = ?2",
            params![node_id, uuid, index],
        )?;
    }
    Ok(())
}

/// The GPU count of a model's nodes (0 when the fleet has none).
pub fn gpus_per_node(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<i64> {
    conn.as_conn().query_row(
        "SELECT COALESCE(MAX(gpu_count), 0) FROM nodes WHERE gpu_type = ?1",
        params![gpu_type],
        |r| r.get(0),
    )
}

/// How many pool and on-demand nodes of a model the fleet has.
pub fn counts(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<(i64, i64)> {
    // `model_nodes` is kept by triggers on `nodes` (migration 7): two rows, not a scan.
    // CAST: PostgreSQL's SUM of BIGINT is NUMERIC.
    conn.as_conn().query_row(
        "SELECT COALESCE(CAST(SUM(CASE WHEN capacity = 'pool' THEN nodes END) AS BIGINT), 0),
                COALESCE(CAST(SUM(CASE WHEN capacity = 'on-demand' THEN nodes END) AS BIGINT), 0)
         FROM model_nodes WHERE gpu_type = ?1",
        params![gpu_type],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// MIG devices per (model, profile, node): the fleet's slices.
pub fn mig_slices(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<(String, String, String, i64)>> {
    conn.as_conn().query_map(
        "SELECT n.gpu_type, m.profile, n.id, COUNT(*) FROM mig_devices m
         JOIN nodes n ON n.id = m.node_id GROUP BY n.gpu_type, m.profile, n.id",
        params![],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}

/// Records a GPU's UUID at an index (when the hardware renumbers its GPUs).
pub fn set_gpu_uuid(
    conn: &impl AsConn,
    node_id: &str,
    index: i64,
    uuid: &str,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE gpus SET uuid = ?3 WHERE node_id = ?1 AND idx = ?2",
        params![node_id, index, uuid],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines;
    use gpufleet_sql::{Conn, Database};

    /// Each test runs on SQLite and on PostgreSQL, with tenants `t1` and `t2` and t1's
    /// cluster `c1` (plain SQL: tenants are not on the engine seam yet).
    fn on_both(test: impl Fn(&Conn<'_>)) {
        engines::on_both(|db| {
            fixtures(db);
            test(&db.conn());
        });
    }

    fn fixtures(db: &Database) {
        db.conn()
            .execute_batch(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t1', 'a', 'A', '{}', 'h1', 0), ('t2', 'b', 'B', '{}', 'h2', 0);
                 INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                     reservation_id, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
                 VALUES ('c1', 't1', 'one', 'kubernetes', 'H100-80GB', 1, NULL, 1, 'running', '', '', '', '{}');",
            )
            .unwrap();
    }

    fn node(id: &str, hostname: &str, gpu_type: &str, capacity: &str, state: &str) -> NodeRow {
        NodeRow {
            id: id.into(),
            hostname: hostname.into(),
            gpu_type: gpu_type.into(),
            capacity: capacity.into(),
            gpu_count: 8,
            driver_version: "550.54".into(),
            cuda_version: "12.4".into(),
            cluster_id: None,
            state: state.into(),
            state_reason: String::new(),
            state_since: 0,
        }
    }

    fn gpu(node_id: &str, index: i64) -> GpuRow {
        GpuRow {
            node_id: node_id.into(),
            index,
            uuid: format!("GPU-{node_id}-{index}"),
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            mig_enabled: false,
        }
    }

    fn add(c: &Conn<'_>, id: &str, hostname: &str) {
        let gpus = [gpu(id, 0), gpu(id, 1)];
        insert(c, &node(id, hostname, "H100-80GB", POOL, NODE_READY), &gpus).unwrap();
    }

    fn hostnames(nodes: Vec<NodeRow>) -> Vec<String> {
        nodes.into_iter().map(|n| n.hostname).collect()
    }

    fn rows_of(c: &Conn<'_>, table: &str, column: &str, node_id: &str) -> i64 {
        c.query_row(
            &format!("SELECT COUNT(*) FROM {table} WHERE {column} = ?1"),
            params![node_id],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn a_node_reads_back_with_its_gpus_and_lists_by_filter() {
        on_both(|c| {
            add(c, "n-b", "b");
            insert(
                c,
                &node("n-a", "a", "H100-80GB", ON_DEMAND, NODE_READY),
                &[],
            )
            .unwrap();
            insert(
                c,
                &node("n-c", "c", "A100-80GB", POOL, NODE_QUARANTINED),
                &[gpu("n-c", 0)],
            )
            .unwrap();
            // A hostname is one node's.
            assert!(insert(c, &node("n-d", "a", "H100-80GB", POOL, NODE_READY), &[]).is_err());

            let b = get(c, "n-b").unwrap().unwrap();
            assert_eq!(
                (
                    b.hostname.as_str(),
                    b.capacity.as_str(),
                    b.gpu_count,
                    b.cuda_version.as_str()
                ),
                ("b", POOL, 8, "12.4")
            );
            assert_eq!(by_hostname(c, "a").unwrap().unwrap().id, "n-a");
            assert!(get(c, "missing").unwrap().is_none());
            assert!(by_hostname(c, "missing").unwrap().is_none());
            assert_eq!(count(c).unwrap(), 3);
            let gpus = gpus(c, "n-b").unwrap();
            assert_eq!(
                gpus.iter()
                    .map(|g| (g.index, g.uuid.as_str()))
                    .collect::<Vec<_>>(),
                [(0, "GPU-n-b-0"), (1, "GPU-n-b-1")]
            );
            assert_eq!(gpus[0].memory_mib, 81_559);
            assert!(!gpus[0].mig_enabled);
            assert_eq!(
                owner_of_gpu(c, "GPU-n-c-0").unwrap().as_deref(),
                Some("n-c")
            );
            assert!(owner_of_gpu(c, "GPU-none").unwrap().is_none());

            assert_eq!(hostnames(list(c, None, None).unwrap()), ["a", "b", "c"]);
            assert_eq!(
                hostnames(list(c, Some("H100-80GB"), None).unwrap()),
                ["a", "b"]
            );
            assert!(list(c, None, Some("c1")).unwrap().is_empty());
            // The triggers' counts leave a quarantined node out.
            assert_eq!(counts(c, "H100-80GB").unwrap(), (1, 1));
            assert_eq!(counts(c, "A100-80GB").unwrap(), (0, 0));
            assert_eq!(gpus_per_node(c, "H100-80GB").unwrap(), 8);
            assert_eq!(gpus_per_node(c, "B200").unwrap(), 0);
        });
    }

    #[test]
    fn assigning_and_releasing_open_and_close_the_usage_interval() {
        on_both(|c| {
            add(c, "n2", "host-2");
            add(c, "n1", "host-1");
            insert(c, &node("n3", "host-3", "H100-80GB", POOL, NODE_BUSY), &[]).unwrap();
            assert_eq!(
                hostnames(free(c, "H100-80GB", POOL).unwrap()),
                ["host-1", "host-2"]
            );
            assert!(free(c, "H100-80GB", ON_DEMAND).unwrap().is_empty());

            assert!(assign(c, "n1", "c1", 100).unwrap());
            // Held: a second hand-out changes nothing and opens nothing.
            assert!(!assign(c, "n1", "c1", 110).unwrap());
            assert_eq!(hostnames(free(c, "H100-80GB", POOL).unwrap()), ["host-2"]);
            assert_eq!(hostnames(list(c, None, Some("c1")).unwrap()), ["host-1"]);
            assert_eq!(
                hostnames(list_of_tenant(c, "t1", None, None).unwrap()),
                ["host-1"]
            );
            assert_eq!(
                hostnames(list_of_tenant(c, "t1", Some("H100-80GB"), Some("c1")).unwrap()),
                ["host-1"]
            );
            assert!(list_of_tenant(c, "t1", Some("A100-80GB"), None)
                .unwrap()
                .is_empty());
            assert!(list_of_tenant(c, "t2", None, None).unwrap().is_empty());
            let open = |c: &Conn<'_>| -> Vec<(i64, Option<i64>)> {
                c.query_map(
                    "SELECT start_time, end_time FROM usage_intervals WHERE node_id = 'n1'",
                    params![],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap()
            };
            assert_eq!(open(c), [(100, None)]);

            release(c, "n1", 200).unwrap();
            assert_eq!(get(c, "n1").unwrap().unwrap().cluster_id, None);
            assert_eq!(open(c), [(100, Some(200))]);
            assert_eq!(
                hostnames(free(c, "H100-80GB", POOL).unwrap()),
                ["host-1", "host-2"]
            );
        });
    }

    #[test]
    fn candidates_are_put_in_service_once_and_forgotten_with_their_records() {
        on_both(|c| {
            add(c, "n1", "host-1");
            add(c, "n2", "host-2");
            set_joined_from(c, "n1", "10.0.0.0/24").unwrap();
            assert_eq!(candidates(c).unwrap(), 2);
            assert_eq!(candidates_from(c, "10.0.0.0/24").unwrap(), 1);
            assert_eq!(in_service(c, "n1").unwrap(), Some(false));
            assert_eq!(in_service(c, "missing").unwrap(), None);

            put_in_service(c, "n2", 50).unwrap();
            put_in_service(c, "n2", 60).unwrap();
            let since: Option<i64> = c
                .query_row(
                    "SELECT in_service_since FROM nodes WHERE id = 'n2'",
                    params![],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(since, Some(50), "the first time counts");
            assert_eq!(in_service(c, "n2").unwrap(), Some(true));
            assert_eq!(candidates(c).unwrap(), 1);

            set_state(c, "n1", NODE_READY, "", 10).unwrap();
            set_state(c, "n2", NODE_READY, "", 10).unwrap();
            assert_eq!(stale_candidates(c, 11).unwrap(), ["n1"]);
            assert!(stale_candidates(c, 10).unwrap().is_empty());

            // Everything recorded of n1.
            let host = NodeHost {
                address: "10.0.0.1".into(),
                hostname: "host-1".into(),
                cpus: 64,
                memory_mib: 1 << 20,
                simulated: false,
            };
            set_host(c, "n1", &host).unwrap();
            set_mig_state(
                c,
                "n1",
                0,
                true,
                &[MigDeviceRow {
                    profile: "7g.80gb".into(),
                    profile_id: 0,
                    start: 0,
                    size: 8,
                    memory_mib: 81_000,
                    uuid: "MIG-1".into(),
                }],
            )
            .unwrap();
            c.execute_batch(
                "INSERT INTO node_endpoints (node_id, bandwidth_addr) VALUES ('n1', '10.0.0.1:9');
                 INSERT INTO health_results (run_id, node_id, node, cluster_id, tenant_id, level,
                     verdict, summary, checks, action, finished_at)
                 VALUES ('run', 'n1', 'host-1', '', '', 'quick', 'passed', '', '[]', '', 1);
                 INSERT INTO events (at, object_id, tenant_id, kind, node, message)
                 VALUES (1, 'n1', '', 'registered', 'host-1', '');",
            )
            .unwrap();

            // In service: not a candidate to forget.
            assert!(!forget_candidate(c, "n2").unwrap());
            assert!(get(c, "n2").unwrap().is_some());
            assert!(forget_candidate(c, "n1").unwrap());
            assert!(get(c, "n1").unwrap().is_none());
            for (table, column) in [
                ("mig_devices", "node_id"),
                ("gpus", "node_id"),
                ("node_endpoints", "node_id"),
                ("node_hosts", "node_id"),
                ("health_results", "node_id"),
                ("events", "object_id"),
            ] {
                assert_eq!(rows_of(c, table, column, "n1"), 0, "{table}");
            }
            assert_eq!(rows_of(c, "gpus", "node_id", "n2"), 2);
            assert!(!forget_candidate(c, "n1").unwrap());
        });
    }

    #[test]
    fn a_host_is_replaced_whole() {
        on_both(|c| {
            add(c, "n1", "host-1");
            assert_eq!(host(c, "n1").unwrap(), None);
            let first = NodeHost {
                address: "10.0.0.1".into(),
                hostname: "host-1".into(),
                cpus: 64,
                memory_mib: 0,
                simulated: true,
            };
            set_host(c, "n1", &first).unwrap();
            assert_eq!(host(c, "n1").unwrap(), Some(first));
            let second = NodeHost {
                address: "10.0.0.2".into(),
                hostname: "host-1.example".into(),
                cpus: u32::MAX,
                memory_mib: 1 << 30,
                simulated: false,
            };
            set_host(c, "n1", &second).unwrap();
            assert_eq!(host(c, "n1").unwrap(), Some(second));
            assert_eq!(rows_of(c, "node_hosts", "node_id", "n1"), 1);
        });
    }

    fn device(start: i64, uuid: &str) -> MigDeviceRow {
        MigDeviceRow {
            profile: "3g.40gb".into(),
            profile_id: 9,
            start,
            size: 4,
            memory_mib: 40_192,
            uuid: uuid.into(),
        }
    }

    #[test]
    fn mig_state_is_replaced_and_gpus_are_renumbered_by_uuid() {
        on_both(|c| {
            add(c, "n1", "host-1");
            add(c, "n2", "host-2");
            set_mig_state(c, "n1", 0, true, &[device(4, "MIG-b"), device(0, "MIG-a")]).unwrap();
            assert!(gpus(c, "n1").unwrap()[0].mig_enabled);
            assert_eq!(
                mig_devices(c, "n1", 0).unwrap(),
                [device(0, "MIG-a"), device(4, "MIG-b")]
            );
            set_mig_state(c, "n1", 1, true, &[device(0, "MIG-c")]).unwrap();
            assert_eq!(
                mig_slices(c).unwrap(),
                [(
                    "H100-80GB".to_string(),
                    "3g.40gb".to_string(),
                    "n1".to_string(),
                    3
                )]
            );

            // A page's GPUs and devices, by node, with a missing id and JSON's escapes.
            let page = ["n2", "n1", "missing", "n\"\\é"];
            let by_node = gpus_of(c, &page).unwrap();
            assert_eq!(by_node.len(), 2);
            assert_eq!(
                by_node["n1"].iter().map(|g| g.index).collect::<Vec<_>>(),
                [0, 1]
            );
            let devices = mig_devices_of(c, &page).unwrap();
            assert_eq!(devices.len(), 2);
            assert_eq!(
                devices[&("n1".to_string(), 0)],
                [device(0, "MIG-a"), device(4, "MIG-b")]
            );
            assert!(gpus_of(c, &[]).unwrap().is_empty());
            assert!(mig_devices_of(c, &[]).unwrap().is_empty());

            // MIG off again: no devices.
            set_mig_state(c, "n1", 1, false, &[]).unwrap();
            assert!(mig_devices(c, "n1", 1).unwrap().is_empty());

            // The hardware swapped the two GPUs' indexes.
            reindex_gpus(
                c,
                "n1",
                &[("GPU-n1-1".to_string(), 0), ("GPU-n1-0".to_string(), 1)],
            )
            .unwrap();
            assert_eq!(
                gpus(c, "n1")
                    .unwrap()
                    .iter()
                    .map(|g| (g.index, g.uuid.as_str()))
                    .collect::<Vec<_>>(),
                [(0, "GPU-n1-1"), (1, "GPU-n1-0")]
            );
            assert!(mig_devices(c, "n1", 0).unwrap().is_empty());
            set_gpu_uuid(c, "n1", 0, "GPU-new").unwrap();
            assert_eq!(owner_of_gpu(c, "GPU-new").unwrap().as_deref(), Some("n1"));
            assert_eq!(gpus(c, "n2").unwrap().len(), 2);
        });
    }

    #[test]
    fn states_versions_and_secrets() {
        on_both(|c| {
            add(c, "n1", "host-1");
            add(c, "n2", "host-2");
            set_state(c, "n1", NODE_BUSY, "resetting", 5).unwrap();
            set_state(c, "n2", NODE_QUARANTINED, "by an operator", 6).unwrap();
            let n1 = get(c, "n1").unwrap().unwrap();
            assert_eq!(
                (n1.state.as_str(), n1.state_reason.as_str(), n1.state_since),
                (NODE_BUSY, "resetting", 5)
            );
            set_versions(c, "n1", "560.1", "12.6").unwrap();
            let n1 = get(c, "n1").unwrap().unwrap();
            assert_eq!(
                (n1.driver_version.as_str(), n1.cuda_version.as_str()),
                ("560.1", "12.6")
            );

            assert_eq!(secret_hash(c, "n1").unwrap(), "");
            assert_eq!(secret_hash(c, "missing").unwrap(), "");
            set_secret_hash(c, "n1", "hash").unwrap();
            assert_eq!(secret_hash(c, "n1").unwrap(), "hash");

            await_agents(c, 100).unwrap();
            let n1 = get(c, "n1").unwrap().unwrap();
            assert_eq!(
                (n1.state.as_str(), n1.state_reason.as_str(), n1.state_since),
                (NODE_UNREACHABLE, "waiting for its agent to register", 100)
            );
            let n2 = get(c, "n2").unwrap().unwrap();
            assert_eq!((n2.state.as_str(), n2.state_since), (NODE_QUARANTINED, 6));
        });
    }

    /// PostgreSQL orders text by the database's collation (SQLite and `String` by bytes):
    /// under a collation where case weighs less than letters, the lists still come in
    /// SQLite's order.
    #[test]
    fn postgres_lists_in_bytewise_order_whatever_the_collation() {
        let (_guard, db, _) = engines::postgres();
        fixtures(&db);
        let c = db.conn();
        c.execute_batch(
            "ALTER TABLE nodes ALTER COLUMN hostname TYPE TEXT COLLATE \"und-x-icu\";
             ALTER TABLE nodes ALTER COLUMN id TYPE TEXT COLLATE \"und-x-icu\";",
        )
        .unwrap();
        for (id, hostname) in [("b", "b"), ("C", "C"), ("a", "a")] {
            add(&c, id, hostname);
        }
        // The premise: the database's own order is not bytewise.
        let collated: Vec<String> = c
            .query_map(
                "SELECT hostname FROM nodes ORDER BY hostname",
                params![],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(collated, ["a", "b", "C"]);

        let bytewise = ["C", "a", "b"];
        assert_eq!(hostnames(list(&c, None, None).unwrap()), bytewise);
        assert_eq!(hostnames(free(&c, "H100-80GB", POOL).unwrap()), bytewise);
        for id in bytewise {
            assert!(assign(&c, id, "c1", 1).unwrap());
        }
        assert_eq!(
            hostnames(list_of_tenant(&c, "t1", None, None).unwrap()),
            bytewise
        );
        for id in bytewise {
            release(&c, id, 2).unwrap();
        }
        assert_eq!(stale_candidates(&c, 1).unwrap(), bytewise);
    }
}
