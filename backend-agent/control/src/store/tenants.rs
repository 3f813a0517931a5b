//! Tenant rows. The same statements run on SQLite and PostgreSQL (`gpufleet_sql`).

use std::collections::BTreeMap;

use gpufleet_sql::{params, AsConn, Row};

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

fn from_row(r: &Row) -> gpufleet_sql::Result<TenantRow> {
    Ok(TenantRow {
        id: r.get(0)?,
        name: r.get(1)?,
        display_name: r.get(2)?,
        labels: from_json(&r.get::<String>(3)?),
        created_at: r.get(4)?,
    })
}

/// A new tenant; its tokens are in `store::tokens` (the old `token_hash` column gets
/// 'moved:<id>': see migration 16).
pub fn insert(conn: &impl AsConn, t: &TenantRow) -> gpufleet_sql::Result<()> {
    // The CAST: PostgreSQL cannot tell the type of a parameter in `'text' || ?1`.
    conn.as_conn().execute(
        "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at) VALUES (?1, ?2, ?3, ?4, 'moved:' || CAST(?1 AS TEXT), ?5)",
        params![t.id, t.name, t.display_name, to_json(&t.labels), t.created_at],
    )?;
    Ok(())
}

pub fn get(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<Option<TenantRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM tenants WHERE id = ?1"),
        params![id],
        from_row,
    )
}

pub fn by_name(conn: &impl AsConn, name: &str) -> gpufleet_sql::Result<Option<TenantRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM tenants WHERE name = ?1"),
        params![name],
        from_row,
    )
}

/// Every tenant, by name in bytewise order, as SQLite's ORDER BY gives it (PostgreSQL's
/// follows the database's collation, where case and punctuation weigh differently).
pub fn list(conn: &impl AsConn) -> gpufleet_sql::Result<Vec<TenantRow>> {
    let mut tenants = conn.as_conn().query_map(
        &format!("SELECT {COLUMNS} FROM tenants ORDER BY name"),
        params![],
        from_row,
    )?;
    tenants.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(tenants)
}

pub fn update(
    conn: &impl AsConn,
    id: &str,
    display_name: &str,
    labels: &BTreeMap<String, String>,
) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE tenants SET display_name = ?2, labels = ?3 WHERE id = ?1",
        params![id, display_name, to_json(labels)],
    )?;
    Ok(())
}

pub fn delete(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn()
        .execute("DELETE FROM tenants WHERE id = ?1", params![id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;

    fn tenant(id: &str, name: &str) -> TenantRow {
        TenantRow {
            id: id.to_string(),
            name: name.to_string(),
            display_name: name.to_uppercase(),
            labels: BTreeMap::from([("team".to_string(), name.to_string())]),
            created_at: 7,
        }
    }

    #[test]
    fn a_tenant_is_found_by_id_and_name_updated_and_deleted() {
        on_both(|db| {
            let c = db.conn();
            if c.engine() == gpufleet_sql::Engine::Postgres {
                // A collation where case weighs less than letters: still bytewise.
                c.execute_batch(
                    "ALTER TABLE tenants ALTER COLUMN name TYPE TEXT COLLATE \"und-x-icu\"",
                )
                .unwrap();
            }
            insert(&c, &tenant("t0", "C")).unwrap();
            insert(&c, &tenant("t2", "b")).unwrap();
            insert(&c, &tenant("t1", "a")).unwrap();
            // Names are unique.
            assert!(insert(&c, &tenant("t3", "a")).is_err());
            let a = get(&c, "t1").unwrap().unwrap();
            assert_eq!((a.name.as_str(), a.display_name.as_str()), ("a", "A"));
            assert_eq!(
                (a.labels.get("team").unwrap().as_str(), a.created_at),
                ("a", 7)
            );
            assert_eq!(by_name(&c, "b").unwrap().unwrap().id, "t2");
            assert!(get(&c, "t9").unwrap().is_none() && by_name(&c, "z").unwrap().is_none());
            let hash: String = c
                .query_row(
                    "SELECT token_hash FROM tenants WHERE id = 't1'",
                    params![],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(hash, "moved:t1");
            update(&c, "t1", "Team A", &BTreeMap::new()).unwrap();
            let a = get(&c, "t1").unwrap().unwrap();
            assert_eq!((a.display_name.as_str(), a.labels.len()), ("Team A", 0));
            let names: Vec<String> = list(&c).unwrap().into_iter().map(|t| t.name).collect();
            assert_eq!(names, vec!["C", "a", "b"]);
            delete(&c, "t2").unwrap();
            assert_eq!(list(&c).unwrap().len(), 2);
        });
    }
}
