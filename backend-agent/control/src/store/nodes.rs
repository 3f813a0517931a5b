//! Node, GPU and MIG device rows: the fleet as NVML would report it.

use rusqlite::{Connection, Row};

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

fn from_row(r: &Row) -> rusqlite::Result<NodeRow> {
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

pub fn count(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT COUNT(*) FROM nodes", [], |r| r.get(0))
}

pub fn insert(conn: &Connection, n: &NodeRow, gpus: &[GpuRow]) -> rusqlite::Result<()> {
    super::exec(
        conn,
        &format!(
            "INSERT INTO nodes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ),
        rusqlite::params![
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
        super::exec(
            conn,
            "INSERT INTO gpus (node_id, idx, uuid, model, memory_mib, mig_enabled) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            (&g.node_id, g.index, &g.uuid, &g.model, g.memory_mib, g.mig_enabled),
        )?;
    }
    Ok(())
}

/// Nodes in hostname order, optionally narrowed to a GPU model and/or a cluster.
pub fn list(
    conn: &Connection,
    gpu_type: Option<&str>,
    cluster_id: Option<&str>,
) -> rusqlite::Result<Vec<NodeRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM nodes
         WHERE (?1 IS NULL OR gpu_type = ?1) AND (?2 IS NULL OR cluster_id = ?2)
         ORDER BY hostname"
    ))?;
    let rows = stmt.query_map([gpu_type, cluster_id], from_row)?;
    rows.collect()
}

/// The nodes in `tenant_id`'s clusters, in hostname order, optionally narrowed like
/// [`list`]: all a tenant may see of the fleet's nodes.
pub fn list_of_tenant(
    conn: &Connection,
    tenant_id: &str,
    gpu_type: Option<&str>,
    cluster_id: Option<&str>,
) -> rusqlite::Result<Vec<NodeRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM nodes
         WHERE cluster_id IN (SELECT id FROM clusters WHERE tenant_id = ?1)
         AND (?2 IS NULL OR gpu_type = ?2) AND (?3 IS NULL OR cluster_id = ?3)
         ORDER BY hostname"
    ))?;
    let rows = stmt.query_map(rusqlite::params![tenant_id, gpu_type, cluster_id], from_row)?;
    rows.collect()
}

/// Free nodes of a model and capacity kind that can be handed out now (their agent is
/// connected and the node is converged), lowest hostname first.
pub fn free(conn: &Connection, gpu_type: &str, capacity: &str) -> rusqlite::Result<Vec<NodeRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM nodes WHERE gpu_type = ?1 AND capacity = ?2 AND cluster_id IS NULL
         AND state = 'ready' ORDER BY hostname"
    ))?;
    let rows = stmt.query_map([gpu_type, capacity], from_row)?;
    rows.collect()
}

/// Hands a free node to a cluster at `t`; fails (0 rows) if someone else holds it. Its
/// usage interval opens in the same transaction.
pub fn assign(
    conn: &Connection,
    node_id: &str,
    cluster_id: &str,
    t: i64,
) -> rusqlite::Result<bool> {
    let changed = super::exec(
        conn,
        "UPDATE nodes SET cluster_id = ?2 WHERE id = ?1 AND cluster_id IS NULL",
        [node_id, cluster_id],
    )?;
    if changed == 1 {
        super::usage::open(conn, node_id, cluster_id, t)?;
    }
    Ok(changed == 1)
}

pub fn get(conn: &Connection, id: &str) -> rusqlite::Result<Option<NodeRow>> {
    use rusqlite::OptionalExtension;
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM nodes WHERE id = ?1"),
        [id],
        from_row,
    )
    .optional()
}

pub fn by_hostname(conn: &Connection, hostname: &str) -> rusqlite::Result<Option<NodeRow>> {
    use rusqlite::OptionalExtension;
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM nodes WHERE hostname = ?1"),
        [hostname],
        from_row,
    )
    .optional()
}

/// Moves a node to `state` (one of the `NODE_*` constants) as of `since`.
pub fn set_state(
    conn: &Connection,
    node_id: &str,
    state: &str,
    reason: &str,
    since: i64,
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET state = ?2, state_reason = ?3, state_since = ?4 WHERE id = ?1",
        rusqlite::params![node_id, state, reason, since],
    )?;
    Ok(())
}

/// Puts a node in service (once: the first time counts): it passed the control plane's
/// admission checks, an operator returned it, or the platform declared it.
pub fn put_in_service(conn: &Connection, node_id: &str, now: i64) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET in_service_since = ?2 WHERE id = ?1 AND in_service_since IS NULL",
        rusqlite::params![node_id, now],
    )?;
    Ok(())
}

/// Whether the node was ever in service (None: no such node). A node that was not is a
/// candidate.
pub fn in_service(conn: &Connection, node_id: &str) -> rusqlite::Result<Option<bool>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached("SELECT in_service_since IS NOT NULL FROM nodes WHERE id = ?1")?
        .query_row([node_id], |r| r.get(0))
        .optional()
}

/// How many nodes are candidates (never in service).
pub fn candidates(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COUNT(*) FROM nodes WHERE in_service_since IS NULL")?
        .query_row([], |r| r.get(0))
}

/// Candidates that registered from `source` (see `agents::admission::source_of`).
pub fn candidates_from(conn: &Connection, source: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "SELECT COUNT(*) FROM nodes WHERE in_service_since IS NULL AND joined_from = ?1",
    )?
    .query_row([source], |r| r.get(0))
}

/// Records where a new node registered from.
pub fn set_joined_from(conn: &Connection, node_id: &str, source: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET joined_from = ?2 WHERE id = ?1",
        [node_id, source],
    )?;
    Ok(())
}

/// Candidates that have been in their state since before `before` (unix seconds).
pub fn stale_candidates(conn: &Connection, before: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id FROM nodes WHERE in_service_since IS NULL AND cluster_id IS NULL AND state_since < ?1 ORDER BY id",
    )?;
    let ids = stmt.query_map([before], |r| r.get(0))?;
    ids.collect()
}

/// Removes a candidate and everything recorded of it (its GPUs, host, endpoint, checks and
/// events); false when the node is not a free candidate (it was put in service meanwhile).
pub fn forget_candidate(conn: &Connection, node_id: &str) -> rusqlite::Result<bool> {
    let candidate: bool = conn
        .prepare_cached(
            "SELECT COUNT(*) > 0 FROM nodes WHERE id = ?1 AND in_service_since IS NULL AND cluster_id IS NULL",
        )?
        .query_row([node_id], |r| r.get(0))?;
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
        super::exec(conn, sql, [node_id])?;
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

pub fn set_host(conn: &Connection, node_id: &str, h: &NodeHost) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "INSERT OR REPLACE INTO node_hosts (node_id, address, hostname, cpus, memory_mib, simulated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        rusqlite::params![
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
pub fn host(conn: &Connection, node_id: &str) -> rusqlite::Result<Option<NodeHost>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached(
        "SELECT address, hostname, cpus, memory_mib, simulated FROM node_hosts WHERE node_id = ?1",
    )?
    .query_row([node_id], |r| {
        Ok(NodeHost {
            address: r.get(0)?,
            hostname: r.get(1)?,
            cpus: r.get(2)?,
            memory_mib: r.get::<_, i64>(3)?.max(0) as u64,
            simulated: r.get(4)?,
        })
    })
    .optional()
}

pub fn set_versions(
    conn: &Connection,
    node_id: &str,
    driver_version: &str,
    cuda_version: &str,
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET driver_version = ?2, cuda_version = ?3 WHERE id = ?1",
        [node_id, driver_version, cuda_version],
    )?;
    Ok(())
}

/// Takes a node back from its cluster at `t`; its usage interval closes in the same
/// transaction.
pub fn release(conn: &Connection, node_id: &str, t: i64) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET cluster_id = NULL WHERE id = ?1",
        [node_id],
    )?;
    Ok(super::usage::close(conn, node_id, t)?)
}

pub fn gpus(conn: &Connection, node_id: &str) -> rusqlite::Result<Vec<GpuRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT node_id, idx, uuid, model, memory_mib, mig_enabled FROM gpus WHERE node_id = ?1 ORDER BY idx",
    )?;
    let rows = stmt.query_map([node_id], gpu_row)?;
    rows.collect()
}

pub fn mig_devices(
    conn: &Connection,
    node_id: &str,
    gpu_index: i64,
) -> rusqlite::Result<Vec<MigDeviceRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT profile, profile_id, start, size, memory_mib, uuid FROM mig_devices
         WHERE node_id = ?1 AND gpu_idx = ?2 ORDER BY start",
    )?;
    let rows = stmt.query_map((node_id, gpu_index), |r| mig_device_row(r, 0))?;
    rows.collect()
}

/// The GPUs of `node_ids`, by node, in index order: one statement for a whole page.
pub fn gpus_of(
    conn: &Connection,
    node_ids: &[&str],
) -> rusqlite::Result<std::collections::HashMap<String, Vec<GpuRow>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT node_id, idx, uuid, model, memory_mib, mig_enabled FROM gpus
         WHERE node_id IN (SELECT value FROM json_each(?1)) ORDER BY node_id, idx",
    )?;
    let mut out: std::collections::HashMap<String, Vec<GpuRow>> = Default::default();
    let rows = stmt.query_map([json_list(node_ids)], gpu_row)?;
    for g in rows {
        let g = g?;
        out.entry(g.node_id.clone()).or_default().push(g);
    }
    Ok(out)
}

/// The MIG devices of `node_ids`, by (node, GPU index), in start order: one statement.
pub fn mig_devices_of(
    conn: &Connection,
    node_ids: &[&str],
) -> rusqlite::Result<std::collections::HashMap<(String, i64), Vec<MigDeviceRow>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT node_id, gpu_idx, profile, profile_id, start, size, memory_mib, uuid FROM mig_devices
         WHERE node_id IN (SELECT value FROM json_each(?1)) ORDER BY node_id, gpu_idx, start",
    )?;
    let mut out: std::collections::HashMap<(String, i64), Vec<MigDeviceRow>> = Default::default();
    let rows = stmt.query_map([json_list(node_ids)], |r| {
        Ok((
            (r.get::<_, String>(0)?, r.get::<_, i64>(1)?),
            mig_device_row(r, 2)?,
        ))
    })?;
    for row in rows {
        let (key, d) = row?;
        out.entry(key).or_default().push(d);
    }
    Ok(out)
}

/// A `gpus` row: node_id, idx, uuid, model, memory_mib, mig_enabled.
fn gpu_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GpuRow> {
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
fn mig_device_row(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<MigDeviceRow> {
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
pub(crate) fn json_list_values(engine: gpufleet_sql::Engine) -> &'static str {
    match engine {
        gpufleet_sql::Engine::Sqlite => "SELECT value FROM json_each(?1)",
        gpufleet_sql::Engine::Postgres => {
            "SELECT value FROM json_array_elements_text(CAST(CAST(?1 AS TEXT) AS JSON))"
        }
    }
}

/// Records a GPU's MIG state as the hardware reported it after a change.
pub fn set_mig_state(
    conn: &Connection,
    node_id: &str,
    gpu_index: i64,
    mig_enabled: bool,
    devices: &[MigDeviceRow],
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE gpus SET mig_enabled = ?3 WHERE node_id = ?1 AND idx = ?2",
        (node_id, gpu_index, mig_enabled),
    )?;
    super::exec(
        conn,
        "DELETE FROM mig_devices WHERE node_id = ?1 AND gpu_idx = ?2",
        (node_id, gpu_index),
    )?;
    for d in devices {
        super::exec(
            conn,
            "INSERT INTO mig_devices (node_id, gpu_idx, profile, profile_id, start, size, memory_mib, uuid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            rusqlite::params![node_id, gpu_index, d.profile, d.profile_id, d.start, d.size, d.memory_mib, d.uuid],
        )?;
    }
    Ok(())
}

/// The hash of the secret a node's registrations must present ("" when none is issued).
pub fn secret_hash(conn: &Connection, node_id: &str) -> rusqlite::Result<String> {
    use rusqlite::OptionalExtension;
    Ok(conn
        .query_row(
            "SELECT secret_hash FROM nodes WHERE id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or_default())
}

pub fn set_secret_hash(conn: &Connection, node_id: &str, hash: &str) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET secret_hash = ?2 WHERE id = ?1",
        (node_id, hash),
    )?;
    Ok(())
}

/// At start: every node waits for its agent to register with this process (quarantined
/// nodes stay quarantined).
pub fn await_agents(conn: &Connection, now: i64) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE nodes SET state = 'unreachable', state_reason = 'waiting for its agent to register', state_since = ?1
         WHERE state != 'quarantined'",
        [now],
    )?;
    Ok(())
}

/// The node that holds the GPU with this UUID, if any.
pub fn owner_of_gpu(conn: &Connection, uuid: &str) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.query_row("SELECT node_id FROM gpus WHERE uuid = ?1", [uuid], |r| {
        r.get(0)
    })
    .optional()
}

/// Gives a node's GPUs new indexes by UUID (`order`: UUID -> index), as the hardware now
/// numbers them; their MIG devices are dropped (recorded again from the same report).
pub fn reindex_gpus(
    conn: &Connection,
    node_id: &str,
    order: &[(String, i64)],
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "DELETE FROM mig_devices WHERE node_id = ?1",
        [node_id],
    )?;
    // Out of the way first, so no two rows share an index mid-way.
    super::exec(
        conn,
        "UPDATE gpus SET idx = -1 - idx WHERE node_id = ?1",
        [node_id],
    )?;
    for (uuid, index) in order {
        super::exec(
            conn,
            "UPDATE gpus SET idx = ?3 WHERE node_id = ?1 AND uuid = ?2",
            (node_id, uuid, index),
        )?;
    }
    Ok(())
}

/// The GPU count of a model's nodes (0 when the fleet has none).
pub fn gpus_per_node(conn: &Connection, gpu_type: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COALESCE(MAX(gpu_count), 0) FROM nodes WHERE gpu_type = ?1")?
        .query_row([gpu_type], |r| r.get(0))
}

/// How many pool and on-demand nodes of a model the fleet has.
pub fn counts(conn: &Connection, gpu_type: &str) -> rusqlite::Result<(i64, i64)> {
    // `model_nodes` is kept by triggers on `nodes` (migration 7): two rows, not a scan.
    let mut stmt = conn.prepare_cached(
        "SELECT COALESCE(SUM(CASE WHEN capacity = 'pool' THEN nodes END), 0),
                COALESCE(SUM(CASE WHEN capacity = 'on-demand' THEN nodes END), 0)
         FROM model_nodes WHERE gpu_type = ?1",
    )?;
    stmt.query_row([gpu_type], |r| Ok((r.get(0)?, r.get(1)?)))
}

/// MIG devices per (model, profile, node): the fleet's slices.
pub fn mig_slices(conn: &Connection) -> rusqlite::Result<Vec<(String, String, String, i64)>> {
    let mut stmt = conn.prepare(
        "SELECT n.gpu_type, m.profile, n.id, COUNT(*) FROM mig_devices m
         JOIN nodes n ON n.id = m.node_id GROUP BY n.gpu_type, m.profile, n.id",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
    rows.collect()
}

/// Records a GPU's UUID at an index (when the hardware renumbers its GPUs).
pub fn set_gpu_uuid(
    conn: &Connection,
    node_id: &str,
    index: i64,
    uuid: &str,
) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE gpus SET uuid = ?3 WHERE node_id = ?1 AND idx = ?2",
        rusqlite::params![node_id, index, uuid],
    )?;
    Ok(())
}
