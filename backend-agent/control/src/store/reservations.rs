//! Reservation rows: nodes of one GPU model held over a time window. The same
//! statements run on SQLite and PostgreSQL (`gpufleet_sql`).

use gpufleet_sql::{params, AsConn, Row};

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

pub(super) fn from_row(r: &Row) -> gpufleet_sql::Result<ReservationRow> {
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

pub fn insert(conn: &impl AsConn, r: &ReservationRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        &format!(
            "INSERT INTO reservations ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        ),
        params![
            r.id,
            r.tenant_id,
            r.gpu_type,
            r.node_count,
            r.start_time,
            r.end_time,
            r.allow_on_demand,
            r.pool_nodes,
            r.on_demand_nodes
        ],
    )?;
    Ok(())
}

pub fn get(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<Option<ReservationRow>> {
    conn.as_conn().query_opt(
        &format!("SELECT {COLUMNS} FROM reservations WHERE id = ?1"),
        params![id],
        from_row,
    )
}

/// How many reservations of a tenant have not ended at `now` (an index range, whatever
/// the tenant's history).
pub fn count_open(conn: &impl AsConn, tenant_id: &str, now: i64) -> gpufleet_sql::Result<i64> {
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM reservations WHERE tenant_id = ?1 AND end_time > ?2",
        params![tenant_id, now],
        |r| r.get(0),
    )
}

/// How many reservations a tenant holds, ended or not: one row that triggers keep
/// (migration 7), so a tenant well under a limit is never counted.
pub fn count_held(conn: &impl AsConn, tenant_id: &str) -> gpufleet_sql::Result<i64> {
    conn.as_conn()
        .query_opt(
            "SELECT reservations FROM tenant_reservations WHERE tenant_id = ?1",
            params![tenant_id],
            |r| r.get(0),
        )
        .map(Option::unwrap_or_default)
}

/// Like [`count_open`], counting no further than `cap`: the cost of a limit check stays
/// bounded by the limit however many a tenant holds.
pub fn count_open_up_to(
    conn: &impl AsConn,
    tenant_id: &str,
    now: i64,
    cap: i64,
) -> gpufleet_sql::Result<i64> {
    // The subquery named: PostgreSQL 15 requires it.
    conn.as_conn().query_row(
        "SELECT COUNT(*) FROM (SELECT 1 FROM reservations WHERE tenant_id = ?1 AND end_time > ?2 LIMIT ?3) AS open",
        params![tenant_id, now, cap],
        |r| r.get(0),
    )
}

/// All reservations, optionally narrowed to a tenant and/or a GPU model, by start time,
/// then id by its bytes, as SQLite's ORDER BY gives them (PostgreSQL's follows the
/// database's collation, where case and punctuation weigh differently).
pub fn list(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    gpu_type: Option<&str>,
) -> gpufleet_sql::Result<Vec<ReservationRow>> {
    // CAST: PostgreSQL cannot tell the type of a parameter that is only tested for NULL.
    let mut rows = conn.as_conn().query_map(
        &format!(
            "SELECT {COLUMNS} FROM reservations
             WHERE (CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1)
               AND (CAST(?2 AS TEXT) IS NULL OR gpu_type = ?2)
             ORDER BY start_time, id"
        ),
        params![tenant_id, gpu_type],
        from_row,
    )?;
    rows.sort_by(|a, b| (a.start_time, &a.id).cmp(&(b.start_time, &b.id)));
    Ok(rows)
}

pub fn update(conn: &impl AsConn, r: &ReservationRow) -> gpufleet_sql::Result<()> {
    conn.as_conn().execute(
        "UPDATE reservations SET node_count = ?2, end_time = ?3, allow_on_demand = ?4, pool_nodes = ?5, on_demand_nodes = ?6 WHERE id = ?1",
        params![
            r.id,
            r.node_count,
            r.end_time,
            r.allow_on_demand,
            r.pool_nodes,
            r.on_demand_nodes
        ],
    )?;
    Ok(())
}

pub fn delete(conn: &impl AsConn, id: &str) -> gpufleet_sql::Result<()> {
    conn.as_conn()
        .execute("DELETE FROM reservations WHERE id = ?1", params![id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines::on_both;
    use gpufleet_sql::Engine;

    fn reservation(id: &str, tenant: &str, model: &str, start: i64, end: i64) -> ReservationRow {
        ReservationRow {
            id: id.into(),
            tenant_id: tenant.into(),
            gpu_type: model.into(),
            node_count: 2,
            start_time: start,
            end_time: end,
            allow_on_demand: true,
            pool_nodes: 1,
            on_demand_nodes: 1,
        }
    }

    fn ids(rows: Vec<ReservationRow>) -> Vec<String> {
        rows.into_iter().map(|r| r.id).collect()
    }

    #[test]
    fn reservations_are_kept_counted_and_listed_in_bytewise_order() {
        on_both(|db| {
            let c = db.conn();
            if c.engine() == Engine::Postgres {
                // A collation where case weighs less than letters: still bytewise.
                c.execute_batch(
                    "ALTER TABLE reservations ALTER COLUMN id TYPE TEXT COLLATE \"und-x-icu\"",
                )
                .unwrap();
            }
            c.execute(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t1', 'a', 'A', '{}', 'h1', 0), ('t2', 'b', 'B', '{}', 'h2', 0)",
                params![],
            )
            .unwrap();
            insert(&c, &reservation("b", "t1", "H100", 100, 200)).unwrap();
            insert(&c, &reservation("C", "t1", "H100", 100, 300)).unwrap();
            insert(&c, &reservation("a", "t1", "A100", 50, 150)).unwrap();
            insert(&c, &reservation("d", "t2", "H100", 10, 20)).unwrap();
            // The schema's checks hold on both: nodes add up, the window is not empty.
            let mut bad = reservation("e", "t1", "H100", 100, 200);
            bad.pool_nodes = 2;
            assert!(insert(&c, &bad).is_err());
            assert!(insert(&c, &reservation("f", "t1", "H100", 200, 200)).is_err());

            let b = get(&c, "b").unwrap().unwrap();
            assert!(b.allow_on_demand);
            assert_eq!((b.node_count, b.start_time, b.end_time), (2, 100, 200));
            assert_eq!((b.pool_nodes, b.on_demand_nodes), (1, 1));
            assert!(get(&c, "z").unwrap().is_none());

            assert_eq!(ids(list(&c, None, None).unwrap()), ["d", "a", "C", "b"]);
            assert_eq!(ids(list(&c, Some("t1"), None).unwrap()), ["a", "C", "b"]);
            assert_eq!(ids(list(&c, None, Some("H100")).unwrap()), ["d", "C", "b"]);
            assert_eq!(ids(list(&c, Some("t1"), Some("H100")).unwrap()), ["C", "b"]);

            assert_eq!(count_open(&c, "t1", 160).unwrap(), 2);
            assert_eq!(count_open_up_to(&c, "t1", 160, 1).unwrap(), 1);
            assert_eq!(count_open_up_to(&c, "t1", 0, 10).unwrap(), 3);
            assert_eq!(count_held(&c, "t1").unwrap(), 3);
            assert_eq!(count_held(&c, "t9").unwrap(), 0);

            let mut b = b;
            b.end_time = 400;
            b.allow_on_demand = false;
            b.pool_nodes = 2;
            b.on_demand_nodes = 0;
            update(&c, &b).unwrap();
            let b = get(&c, "b").unwrap().unwrap();
            assert!(!b.allow_on_demand);
            assert_eq!((b.end_time, b.pool_nodes, b.on_demand_nodes), (400, 2, 0));
            delete(&c, "b").unwrap();
            assert_eq!(count_held(&c, "t1").unwrap(), 2);
            assert_eq!(ids(list(&c, Some("t1"), None).unwrap()), ["a", "C"]);
        });
    }
}
