//! Tenant cluster rows. Their nodes are the `nodes` rows whose `cluster_id` points here.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row};

use super::{from_json, to_json};

#[derive(Debug, Clone)]
pub struct ClusterRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub orchestrator: String,
    pub gpu_type: String,
    pub node_count: i64,
    pub reservation_id: Option<String>,
    pub storage_gib: i64,
    pub status: String,
    pub endpoint: String,
    pub credentials: String,
    pub storage_path: String,
    pub mig_layout: BTreeMap<String, u32>,
    /// Why the status is what it is, when it is not simply `running` (empty otherwise).
    pub status_reason: String,
    /// The CUDA version asked for ("" when none).
    pub cuda_version: String,
    /// The driver the cluster's nodes run ("" until known).
    pub driver_version: String,
    /// Nodes a rolling driver change takes out of service at once.
    pub max_unavailable: i64,
    /// What deleting the cluster does to its volume: "delete" or "keep".
    pub storage_retention: String,
}

const COLUMNS: &str = "id, tenant_id, name, orchestrator, gpu_type, node_count, reservation_id, storage_gib, status, endpoint, credentials, storage_path, mig_layout, status_reason, cuda_version, driver_version, max_unavailable, storage_retention";

fn from_row(r: &Row) -> rusqlite::Result<ClusterRow> {
    Ok(ClusterRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        name: r.get(2)?,
        orchestrator: r.get(3)?,
        gpu_type: r.get(4)?,
        node_count: r.get(5)?,
        reservation_id: r.get(6)?,
        storage_gib: r.get(7)?,
        status: r.get(8)?,
        endpoint: r.get(9)?,
        credentials: r.get(10)?,
        storage_path: r.get(11)?,
        mig_layout: from_json(&r.get::<_, String>(12)?),
        status_reason: r.get(13)?,
        cuda_version: r.get(14)?,
        driver_version: r.get(15)?,
        max_unavailable: r.get(16)?,
        storage_retention: r.get(17)?,
    })
}

pub fn insert(conn: &Connection, c: &ClusterRow) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "INSERT INTO clusters ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
        ),
        rusqlite::params![
            c.id,
            c.tenant_id,
            c.name,
            c.orchestrator,
            c.gpu_type,
            c.node_count,
            c.reservation_id,
            c.storage_gib,
            c.status,
            c.endpoint,
            c.credentials,
            c.storage_path,
            to_json(&c.mig_layout),
            c.status_reason,
            c.cuda_version,
            c.driver_version,
            c.max_unavailable,
            c.storage_retention
        ],
    )?;
    Ok(())
}

pub fn get(conn: &Connection, id: &str) -> rusqlite::Result<Option<ClusterRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM clusters WHERE id = ?1"),
        [id],
        from_row,
    )
    .optional()
}

/// The tenant of each of `cluster_ids` that exists: one statement for a whole page.
pub fn tenants_of(
    conn: &Connection,
    cluster_ids: &[&str],
) -> rusqlite::Result<std::collections::HashMap<String, String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, tenant_id FROM clusters WHERE id IN (SELECT value FROM json_each(?1))",
    )?;
    let rows = stmt.query_map([super::nodes::json_list(cluster_ids)], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?;
    rows.collect()
}

pub fn by_name(
    conn: &Connection,
    tenant_id: &str,
    name: &str,
) -> rusqlite::Result<Option<ClusterRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM clusters WHERE tenant_id = ?1 AND name = ?2"),
        [tenant_id, name],
        from_row,
    )
    .optional()
}

/// Clusters filtered by tenant, GPU model and/or reservation.
pub fn list(
    conn: &Connection,
    tenant_id: Option<&str>,
    gpu_type: Option<&str>,
    reservation_id: Option<&str>,
) -> rusqlite::Result<Vec<ClusterRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM clusters
         WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR gpu_type = ?2)
           AND (?3 IS NULL OR reservation_id = ?3)
         ORDER BY tenant_id, name"
    ))?;
    let rows = stmt.query_map([tenant_id, gpu_type, reservation_id], from_row)?;
    rows.collect()
}

pub fn update(conn: &Connection, c: &ClusterRow) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE clusters SET node_count = ?2, storage_gib = ?3, status = ?4, mig_layout = ?5, status_reason = ?6,
         cuda_version = ?7, driver_version = ?8, max_unavailable = ?9, storage_retention = ?10 WHERE id = ?1",
        rusqlite::params![
            &c.id,
            c.node_count,
            c.storage_gib,
            &c.status,
            to_json(&c.mig_layout),
            &c.status_reason,
            &c.cuda_version,
            &c.driver_version,
            c.max_unavailable,
            &c.storage_retention
        ],
    )?;
    Ok(())
}

/// Sets a cluster's status and its reason (empty when there is nothing to explain).
pub fn set_status(conn: &Connection, id: &str, status: &str, reason: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE clusters SET status = ?2, status_reason = ?3 WHERE id = ?1",
        (id, status, reason),
    )?;
    Ok(())
}

/// Sets a settled cluster's status (`running` or `degraded`) and reason, unless a change
/// has started meanwhile. Returns whether the row changed.
pub fn set_settled_status(
    conn: &Connection,
    id: &str,
    status: &str,
    reason: &str,
) -> rusqlite::Result<bool> {
    let n = conn.execute(
        "UPDATE clusters SET status = ?2, status_reason = ?3
         WHERE id = ?1 AND status IN ('running', 'degraded') AND (status != ?2 OR status_reason != ?3)",
        (id, status, reason),
    )?;
    Ok(n > 0)
}

/// Sets how a tenant reaches its cluster (a Slurm cluster's configuration changes with
/// its nodes).
pub fn set_endpoint(conn: &Connection, id: &str, endpoint: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE clusters SET endpoint = ?2 WHERE id = ?1",
        (id, endpoint),
    )?;
    Ok(())
}

pub fn set_credentials(conn: &Connection, id: &str, credentials: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE clusters SET credentials = ?2 WHERE id = ?1",
        (id, credentials),
    )?;
    Ok(())
}

/// Clusters whose status is one of `statuses`.
pub fn with_status(conn: &Connection, statuses: &[&str]) -> rusqlite::Result<Vec<ClusterRow>> {
    let mut out = Vec::new();
    for c in list(conn, None, None, None)? {
        if statuses.contains(&c.status.as_str()) {
            out.push(c);
        }
    }
    Ok(out)
}

/// Degraded clusters that hold fewer nodes than their node_count: failed nodes were
/// quarantined and their replacement failed (a replacement under way leaves the
/// cluster's status alone until it fails).
pub fn short_of_nodes(conn: &Connection) -> rusqlite::Result<Vec<ClusterRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM clusters c
         WHERE status = 'degraded'
           AND node_count > (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id)"
    ))?;
    let rows = stmt.query_map([], from_row)?;
    rows.collect()
}

pub fn delete(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM clusters WHERE id = ?1", [id])?;
    Ok(())
}
