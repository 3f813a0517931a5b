//! Reservation rows: nodes of one GPU model held over a time window.

use rusqlite::{Connection, OptionalExtension, Row};

#[derive(Debug, Clone)]
pub struct ReservationRow {
    pub id: String,
    pub tenant_id: String,
    pub gpu_type: String,
    pub node_count: i64,
    pub start_time: i64,
    pub end_time: i64,
    pub allow_on_demand: bool,
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
}

const COLUMNS: &str =
    "id, tenant_id, gpu_type, node_count, start_time, end_time, allow_on_demand, pool_nodes, on_demand_nodes";

pub(super) fn from_row(r: &Row) -> rusqlite::Result<ReservationRow> {
    Ok(ReservationRow {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        gpu_type: r.get(2)?,
        node_count: r.get(3)?,
        start_time: r.get(4)?,
        end_time: r.get(5)?,
        allow_on_demand: r.get(6)?,
        pool_nodes: r.get(7)?,
        on_demand_nodes: r.get(8)?,
    })
}

pub fn insert(conn: &Connection, r: &ReservationRow) -> rusqlite::Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO reservations ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
    ))?
    .execute(rusqlite::params![
        r.id,
        r.tenant_id,
        r.gpu_type,
        r.node_count,
        r.start_time,
        r.end_time,
        r.allow_on_demand,
        r.pool_nodes,
        r.on_demand_nodes
    ])?;
    Ok(())
}

pub fn get(conn: &Connection, id: &str) -> rusqlite::Result<Option<ReservationRow>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM reservations WHERE id = ?1"))?
        .query_row([id], from_row)
        .optional()
}

/// How many reservations of a tenant have not ended at `now` (an index range, whatever
/// the tenant's history).
pub fn count_open(conn: &Connection, tenant_id: &str, now: i64) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COUNT(*) FROM reservations WHERE tenant_id = ?1 AND end_time > ?2")?
        .query_row((tenant_id, now), |r| r.get(0))
}

/// How many reservations a tenant holds, ended or not: one row that triggers keep
/// (migration 7), so a tenant well under a limit is never counted.
pub fn count_held(conn: &Connection, tenant_id: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT reservations FROM tenant_reservations WHERE tenant_id = ?1")?
        .query_row([tenant_id], |r| r.get(0))
        .optional()
        .map(Option::unwrap_or_default)
}

/// Like [`count_open`], counting no further than `cap`: the cost of a limit check stays
/// bounded by the limit however many a tenant holds.
pub fn count_open_up_to(
    conn: &Connection,
    tenant_id: &str,
    now: i64,
    cap: i64,
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "SELECT COUNT(*) FROM (SELECT 1 FROM reservations WHERE tenant_id = ?1 AND end_time > ?2 LIMIT ?3)",
    )?
    .query_row((tenant_id, now, cap), |r| r.get(0))
}

/// All reservations, optionally narrowed to a tenant and/or a GPU model.
pub fn list(
    conn: &Connection,
    tenant_id: Option<&str>,
    gpu_type: Option<&str>,
) -> rusqlite::Result<Vec<ReservationRow>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM reservations
         WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR gpu_type = ?2)
         ORDER BY start_time, id"
    ))?;
    let rows = stmt.query_map([tenant_id, gpu_type], from_row)?;
    rows.collect()
}

pub fn update(conn: &Connection, r: &ReservationRow) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached("UPDATE reservations SET node_count = ?2, end_time = ?3, allow_on_demand = ?4, pool_nodes = ?5, on_demand_nodes = ?6 WHERE id = ?1")?;
    stmt.execute((
        &r.id,
        r.node_count,
        r.end_time,
        r.allow_on_demand,
        r.pool_nodes,
        r.on_demand_nodes,
    ))?;
    Ok(())
}

pub fn delete(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM reservations WHERE id = ?1", [id])?;
    Ok(())
}
