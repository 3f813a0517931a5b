//! GPU quota rows: one per (tenant, gpu_type).

use rusqlite::{Connection, OptionalExtension, Row};

#[derive(Debug, Clone)]
pub struct QuotaRow {
    pub id: String,
    pub tenant_id: String,
    pub gpu_type: String,
    pub gpus: i64,
    pub burst_gpus: i64,
    /// Weight in fair sharing of idle capacity, 1 to 1000.
    pub weight: i64,
    /// Idle guaranteed GPUs that may be lent to other tenants; None: no limit.
    pub lending_limit_gpus: Option<i64>,
}

impl QuotaRow {
    /// A quota with the default weight (1) and no lending limit.
    pub fn new(id: String, tenant_id: String, gpu_type: String, gpus: i64, burst: i64) -> Self {
        Self {
            id,
            tenant_id,
            gpu_type,
            gpus,
            burst_gpus: burst,
            weight: gpufleet_proto::limits::DEFAULT_QUOTA_WEIGHT,
            lending_limit_gpus: None,
        }
    }
}

const COLUMNS: &str = "id, tenant_id, gpu_type, gpus, burst_gpus, weight, lending_limit_gpus";

fn from_row(r: &Row) -> rusqlite::Result<QuotaRow> {
    Ok(QuotaRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        gpu_type: r.get(2)?,
        gpus: r.get(3)?,
        burst_gpus: r.get(4)?,
        weight: r.get(5)?,
        lending_limit_gpus: r.get(6)?,
    })
}

pub fn insert(conn: &Connection, q: &QuotaRow) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(&format!(
        "INSERT INTO quotas ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    ))?;
    stmt.execute((
        &q.id,
        &q.tenant_id,
        &q.gpu_type,
        q.gpus,
        q.burst_gpus,
        q.weight,
        q.lending_limit_gpus,
    ))?;
    Ok(())
}

pub fn get(conn: &Connection, id: &str) -> rusqlite::Result<Option<QuotaRow>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM quotas WHERE id = ?1"))?
        .query_row([id], from_row)
        .optional()
}

pub fn for_model(
    conn: &Connection,
    tenant_id: &str,
    gpu_type: &str,
) -> rusqlite::Result<Option<QuotaRow>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM quotas WHERE tenant_id = ?1 AND gpu_type = ?2"
    ))?
    .query_row([tenant_id, gpu_type], from_row)
    .optional()
}

/// All quotas, or those of one tenant.
pub fn list(conn: &Connection, tenant_id: Option<&str>) -> rusqlite::Result<Vec<QuotaRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM quotas WHERE ?1 IS NULL OR tenant_id = ?1 ORDER BY tenant_id, gpu_type"
    ))?;
    let rows = stmt.query_map([tenant_id], from_row)?;
    rows.collect()
}

/// The quotas of one model, every tenant's.
pub fn of_model(conn: &Connection, gpu_type: &str) -> rusqlite::Result<Vec<QuotaRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM quotas WHERE gpu_type = ?1 ORDER BY tenant_id"
    ))?;
    let rows = stmt.query_map([gpu_type], from_row)?;
    rows.collect()
}

pub fn update(conn: &Connection, id: &str, gpus: i64, burst_gpus: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE quotas SET gpus = ?2, burst_gpus = ?3 WHERE id = ?1")?
        .execute((id, gpus, burst_gpus))?;
    Ok(())
}

/// Sets a quota's weight and lending limit (None: no limit).
pub fn set_sharing(
    conn: &Connection,
    id: &str,
    weight: i64,
    lending_limit_gpus: Option<i64>,
) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE quotas SET weight = ?2, lending_limit_gpus = ?3 WHERE id = ?1")?
        .execute((id, weight, lending_limit_gpus))?;
    Ok(())
}

pub fn delete(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM quotas WHERE id = ?1", [id])?;
    Ok(())
}
