//! What holds nodes of one GPU model, read for admission: reservations whose window
//! overlaps a time window, found through an index by length class and start (see
//! [`overlapping`] and migration 8), and each cluster's node counts in one query. The
//! cost of a read follows what overlaps the window, not how many reservations were ever
//! made.

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

/// The longest reservation (end minus start, in seconds) of each length class but the
/// last, which has no limit: 1 h, then 4 times longer each (migration 8 computes the
/// same classes in the generated column `span_class`).
pub const CLASS_LONGEST: [i64; 8] = [
    3_600, 14_400, 57_600, 230_400, 921_600, 3_686_400, 14_745_600, 58_982_400,
];

/// Reservations of `gpu_type` whose window `[start_time, end_time)` overlaps
/// `[from, until)` (`until = None`: for ever), in no particular order (admission sums
/// them; it never depends on their order).
///
/// One range of the covering index `reservations_by_window` per length class: a
/// reservation no longer than `longest` that ends after `from` starts after
/// `from - longest`, so each range holds the overlapping reservations of its class and
/// at most a few times as many that end just before `from`. The cost follows what
/// overlaps the window, not how many reservations were ever made.
pub fn overlapping(
    conn: &Connection,
    gpu_type: &str,
    from: i64,
    until: Option<i64>,
) -> rusqlite::Result<Vec<ReservationHold>> {
    let mut stmt = conn.prepare_cached(&OVERLAPPING_SQL)?;
    stmt.raw_bind_parameter(1, gpu_type)?;
    stmt.raw_bind_parameter(2, until.unwrap_or(i64::MAX))?;
    stmt.raw_bind_parameter(3, from)?;
    for class in 0..=CLASS_LONGEST.len() {
        let starts_after = CLASS_LONGEST
            .get(class)
            .map_or(i64::MIN, |&longest| from.saturating_sub(longest));
        stmt.raw_bind_parameter(FIRST_CLASS_PARAMETER + class, starts_after)?;
    }
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(ReservationHold {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            start_time: r.get(2)?,
            end_time: r.get(3)?,
            pool_nodes: r.get(4)?,
            on_demand_nodes: r.get(5)?,
        });
    }
    Ok(out)
}

/// Where the per-class lower bounds of start_time begin among [`OVERLAPPING_SQL`]'s
/// parameters (1: model, 2: until, 3: from).
const FIRST_CLASS_PARAMETER: usize = 4;

/// One statement, one index range per length class: ?1 model, ?2 until, ?3 from, and the
/// lower bound of start_time of class k at ?(4 + k).
static OVERLAPPING_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    (0..=CLASS_LONGEST.len())
        .map(|class| {
            format!(
                "SELECT id, tenant_id, start_time, end_time, pool_nodes, on_demand_nodes
                 FROM reservations INDEXED BY reservations_by_window
                 WHERE gpu_type = ?1 AND span_class = {class} AND start_time > ?{}
                   AND start_time < ?2 AND end_time > ?3",
                FIRST_CLASS_PARAMETER + class
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
});

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
    fn the_index_follows_updates_and_deletes() {
        let (_dir, conn) = open();
        let t = 1_900_000_000;
        let mut r = reservation("a", "H100-80GB", t, t + 10);
        insert(&conn, &r).unwrap();
        // Ten seconds long becomes a hundred days long: another length class.
        r.end_time = t + 100 * 86_400;
        crate::store::reservations::update(&conn, &r).unwrap();
        assert_eq!(
            ids(overlapping(&conn, "H100-80GB", t + 50 * 86_400, Some(t + 51 * 86_400)).unwrap()),
            ["a"]
        );
        crate::store::reservations::delete(&conn, "a").unwrap();
        assert!(overlapping(&conn, "H100-80GB", 0, None).unwrap().is_empty());
    }

    /// The classes the migration's generated column computes are the ones the reads
    /// assume: a reservation exactly as long as a class's longest is in that class.
    #[test]
    fn length_classes_in_sql_match_the_reads() {
        let (_dir, conn) = open();
        let t = 1_900_000_000;
        let class_of = |len: i64| -> i64 {
            let id = format!("len-{len}");
            insert(&conn, &reservation(&id, "H100-80GB", t, t + len)).unwrap();
            conn.query_row(
                "SELECT span_class FROM reservations WHERE id = ?1",
                [&id],
                |r| r.get(0),
            )
            .unwrap()
        };
        assert_eq!(class_of(1), 0);
        for (k, &longest) in CLASS_LONGEST.iter().enumerate() {
            assert_eq!(class_of(longest), k as i64, "{longest} s");
            assert_eq!(class_of(longest + 1), k as i64 + 1, "{} s", longest + 1);
        }
        assert_eq!(class_of(40 * 365 * 86_400), CLASS_LONGEST.len() as i64);
    }

    /// Against every row checked one by one: reservations of every length class, windows
    /// of every size, edges one second either side.
    #[test]
    fn overlap_matches_a_check_of_every_reservation() {
        let (_dir, conn) = open();
        let t = 1_900_000_000;
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = |n: i64| -> i64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as i64
        };
        let lengths = [
            1,
            3_599,
            3_600,
            3_601,
            20_000,
            200_000,
            5_000_000,
            60_000_000,
            900_000_000,
        ];
        let mut all = Vec::new();
        for i in 0..400 {
            let start = t + next(2 * 365 * 86_400);
            let len = lengths[i % lengths.len()] + next(3) - 1;
            let model = if i % 7 == 0 { "A100-80GB" } else { "H100-80GB" };
            let r = reservation(&format!("r{i}"), model, start, start + len.max(1));
            insert(&conn, &r).unwrap();
            all.push(r);
        }
        for _ in 0..300 {
            let from = t - 86_400 + next(2 * 365 * 86_400);
            let until = match next(4) {
                0 => None,
                1 => Some(from + 1),
                2 => Some(from + 1 + next(48 * 3_600)),
                _ => Some(from + 1 + next(400 * 86_400)),
            };
            let mut expected: Vec<String> = all
                .iter()
                .filter(|r| r.gpu_type == "H100-80GB")
                .filter(|r| r.end_time > from && until.is_none_or(|u| r.start_time < u))
                .map(|r| r.id.clone())
                .collect();
            expected.sort();
            assert_eq!(
                ids(overlapping(&conn, "H100-80GB", from, until).unwrap()),
                expected,
                "window [{from}, {until:?})"
            );
        }
    }
}
