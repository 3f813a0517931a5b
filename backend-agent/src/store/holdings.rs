//! What holds nodes of one GPU model, read for admission: reservations whose window
//! overlaps a time window, found through an R*Tree over the windows (kept by triggers,
//! see the migration), and each cluster's node counts in one query. The cost of a read
//! follows what overlaps the window, not how many reservations were ever made.

use rusqlite::Connection;

/// What admission needs of a reservation: who holds how many nodes, when.
#[derive(Debug, Clone)]
pub struct ReservationHold {
    pub id: String,
    pub tenant_id: String,
    pub start_time: i64,
    pub end_time: i64,
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
}

/// Reservations of `gpu_type` whose window `[start_time, end_time)` overlaps
/// `[from, until)` (`until = None`: for ever), in no particular order (admission sums
/// them; it never depends on their order).
///
/// The R*Tree stores 32-bit floats whose boxes are rounded outwards, so it yields a
/// superset; the exact integer columns decide.
pub fn overlapping(
    conn: &Connection,
    gpu_type: &str,
    from: i64,
    until: Option<i64>,
) -> rusqlite::Result<Vec<ReservationHold>> {
    let until = until.unwrap_or(i64::MAX);
    // CROSS JOIN keeps the R*Tree as the outer loop.
    let mut stmt = conn.prepare_cached(
        "SELECT r.id, r.tenant_id, r.start_time, r.end_time, r.pool_nodes, r.on_demand_nodes
         FROM reservation_windows w CROSS JOIN reservations r ON r.rowid = w.id
         WHERE w.end_time > ?2 AND w.start_time < ?3
           AND r.gpu_type = ?1 AND r.end_time > ?2 AND r.start_time < ?3",
    )?;
    let rows = stmt.query_map((gpu_type, from, until), |r| {
        Ok(ReservationHold {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            start_time: r.get(2)?,
            end_time: r.get(3)?,
            pool_nodes: r.get(4)?,
            on_demand_nodes: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// A cluster of one model as the holdings see it.
#[derive(Debug, Clone)]
pub struct ClusterHold {
    pub id: String,
    pub tenant_id: String,
    pub reservation_id: Option<String>,
    /// Its reservation's end, when it draws from one.
    pub reservation_end: Option<i64>,
    pub pool: i64,
    pub on_demand: i64,
}

/// Every cluster of `gpu_type` with the pool and on-demand nodes it holds.
pub fn clusters(conn: &Connection, gpu_type: &str) -> rusqlite::Result<Vec<ClusterHold>> {
    let mut stmt = conn.prepare_cached(
        "SELECT c.id, c.tenant_id, c.reservation_id, r.end_time,
                (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id AND n.capacity = 'pool'),
                (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id AND n.capacity <> 'pool')
         FROM clusters c LEFT JOIN reservations r ON r.id = c.reservation_id
         WHERE c.gpu_type = ?1
         ORDER BY c.tenant_id, c.name",
    )?;
    let rows = stmt.query_map([gpu_type], |r| {
        Ok(ClusterHold {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            reservation_id: r.get(2)?,
            reservation_end: r.get(3)?,
            pool: r.get(4)?,
            on_demand: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// Rebuilds the window index from the reservations (on every open), so its rowids are
/// right even after a VACUUM renumbered the table's. Ended reservations stay indexed but
/// cost nothing: they lie before any window admission asks about, and the tree skips them.
pub fn rebuild_windows(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    tx.execute("DELETE FROM reservation_windows", [])?;
    tx.execute(
        "INSERT INTO reservation_windows (id, start_time, end_time)
         SELECT rowid, start_time, end_time FROM reservations",
        [],
    )?;
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reservations::{insert, ReservationRow};

    fn reservation(id: &str, gpu_type: &str, start: i64, end: i64) -> ReservationRow {
        ReservationRow {
            id: id.into(),
            tenant_id: "t".into(),
            gpu_type: gpu_type.into(),
            node_count: 1,
            start_time: start,
            end_time: end,
            allow_on_demand: false,
            pool_nodes: 1,
            on_demand_nodes: 0,
        }
    }

    fn open() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("state.db")).unwrap();
        conn.execute(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES ('t', 't', 't', '{}', 'h', 0)",
            [],
        )
        .unwrap();
        (dir, conn)
    }

    fn ids(rows: Vec<ReservationHold>) -> Vec<String> {
        let mut ids: Vec<String> = rows.into_iter().map(|r| r.id).collect();
        ids.sort();
        ids
    }

    /// Edges one second apart near 2030, where a 32-bit float cannot tell them apart: the
    /// exact columns must.
    #[test]
    fn overlap_is_exact_at_the_edges_and_per_model() {
        let (_dir, conn) = open();
        let t = 1_900_000_000;
        insert(&conn, &reservation("a", "H100-80GB", t, t + 10)).unwrap();
        insert(&conn, &reservation("b", "H100-80GB", t + 10, t + 20)).unwrap();
        insert(&conn, &reservation("c", "A100-80GB", t, t + 20)).unwrap();
        let h100 = |from, until| ids(overlapping(&conn, "H100-80GB", from, until).unwrap());
        assert_eq!(h100(t + 9, Some(t + 10)), ["a"]);
        assert_eq!(h100(t + 10, Some(t + 11)), ["b"]);
        assert_eq!(h100(t + 9, Some(t + 11)), ["a", "b"]);
        assert_eq!(h100(t - 5, Some(t)), Vec::<String>::new());
        assert_eq!(h100(t + 20, None), Vec::<String>::new());
        assert_eq!(h100(t + 19, None), ["b"]);
        assert_eq!(h100(0, None), ["a", "b"]);
    }

    #[test]
    fn the_index_follows_updates_deletes_and_rebuilds() {
        let (_dir, mut conn) = open();
        let t = 1_900_000_000;
        let mut r = reservation("a", "H100-80GB", t, t + 10);
        insert(&conn, &r).unwrap();
        r.end_time = t + 100;
        crate::store::reservations::update(&conn, &r).unwrap();
        assert_eq!(
            ids(overlapping(&conn, "H100-80GB", t + 50, Some(t + 60)).unwrap()),
            ["a"]
        );
        rebuild_windows(&mut conn).unwrap();
        assert_eq!(
            ids(overlapping(&conn, "H100-80GB", t + 50, Some(t + 60)).unwrap()),
            ["a"]
        );
        crate::store::reservations::delete(&conn, "a").unwrap();
        assert!(overlapping(&conn, "H100-80GB", 0, None).unwrap().is_empty());
    }
}
