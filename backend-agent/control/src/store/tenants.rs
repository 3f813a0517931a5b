//! Tenant rows.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row};

use super::{from_json, to_json};

#[derive(Debug, Clone)]
pub struct TenantRow {
    pub id: String,
    pub name: String,
    pub display_name: String,
    pub labels: BTreeMap<String, String>,
    pub created_at: i64,
}

const COLUMNS: &str = "id, name, display_name, labels, created_at";

fn from_row(r: &Row) -> rusqlite::Result<TenantRow> {
    Ok(TenantRow {
        id: r.get(0)?,
        name: r.get(1)?,
        display_name: r.get(2)?,
        labels: from_json(&r.get::<_, String>(3)?),
        created_at: r.get(4)?,
    })
}

/// A new tenant; its tokens are in `store::tokens` (the old `token_hash` column gets
/// 'moved:<id>': see migration 16).
pub fn insert(conn: &Connection, t: &TenantRow) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached("INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at) VALUES (?1, ?2, ?3, ?4, 'moved:' || ?1, ?5)")?;
    stmt.execute((
        &t.id,
        &t.name,
        &t.display_name,
        to_json(&t.labels),
        t.created_at,
    ))?;
    Ok(())
}

pub fn get(conn: &Connection, id: &str) -> rusqlite::Result<Option<TenantRow>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tenants WHERE id = ?1"))?
        .query_row([id], from_row)
        .optional()
}

pub fn by_name(conn: &Connection, name: &str) -> rusqlite::Result<Option<TenantRow>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tenants WHERE name = ?1"))?
        .query_row([name], from_row)
        .optional()
}

pub fn list(conn: &Connection) -> rusqlite::Result<Vec<TenantRow>> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM tenants ORDER BY name"))?;
    let rows = stmt.query_map([], from_row)?;
    rows.collect()
}

pub fn update(
    conn: &Connection,
    id: &str,
    display_name: &str,
    labels: &BTreeMap<String, String>,
) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE tenants SET display_name = ?2, labels = ?3 WHERE id = ?1")?
        .execute((id, display_name, to_json(labels)))?;
    Ok(())
}

pub fn delete(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.execute("DELETE FROM tenants WHERE id = ?1", [id])?;
    Ok(())
}
