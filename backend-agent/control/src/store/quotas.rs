//! GPU quota rows: one per (tenant, gpu_type).

use rusqlite::{Connection, OptionalExtension, Row};

#[derive(Debug, Clone)]
pub struct QuotaRow {
    pub id: String,
    pub tenant_id: String,
    pub gpu_type: String,
    pub gpus: i64,
    pub burst_gpus: i64,
}

const COLUMNS: &str = "id, tenant_id, gpu_type, gpus, burst_gpus";

fn from_row(r: &Row) -> rusqlite::Result<QuotaRow> {
    Ok(QuotaRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        gpu_type: r.get(2)?,
        gpus: r.get(3)?,
        burst_gpus: r.get(4)?,
    })
}

pub fn insert(conn: &Connection, q: &QuotaRow) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached("INSERT INTO quotas (id, tenant_id, gpu_type, gpus, burst_gpus) VALUES (?1, ?2, ?3, ?4, ?5)")?;
    stmt.execute((&q.id, &q.tenant_id, &q.gpu_type, q.gpus, q.burst_gpus))?;
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

pub fn update(conn: &Connection, id: &str, gpus: i64, burst_gpus: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE quotas SET gpus = ?2, burst_gpus = ?3 WHERE id = ?1")?
        .execute((id, gpus, burst_gpus))?;
    Ok(())
}

pub fn delete(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM quotas WHERE id = ?1", [id])?;
    Ok(())
}
