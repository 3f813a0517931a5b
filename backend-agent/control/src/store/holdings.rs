//! What holds nodes of one GPU model, read for admission: reservations whose window
//! overlaps a time window, found through an index by length class and start (see
//! [`overlapping`] and migration 8), and each cluster's node counts in one query. The
//! cost of a read follows what overlaps the window, not how many reservations were ever
//! made. The same statements run on SQLite and PostgreSQL (`gpufleet_sql`), but for
//! SQLite's index hint.

use gpufleet_sql::{params, AsConn, Engine, ToValue};

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
    conn: &impl AsConn,
    gpu_type: &str,
    from: i64,
    until: Option<i64>,
) -> gpufleet_sql::Result<Vec<ReservationHold>> {
    let c = conn.as_conn();
    let until = until.unwrap_or(i64::MAX);
    let starts_after = starts_after(from);
    // In the order of overlapping_sql's parameters.
    let mut values: Vec<&dyn ToValue> = vec![&gpu_type, &until, &from];
    values.extend(starts_after.iter().map(|s| s as &dyn ToValue));
    let sql = match c.engine() {
        Engine::Sqlite => &*OVERLAPPING_SQLITE,
        Engine::Postgres => &*OVERLAPPING_POSTGRES,
    };
    c.query_map(sql, &values, |r| {
        Ok(ReservationHold {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            start_time: r.get(2)?,
            end_time: r.get(3)?,
            pool_nodes: r.get(4)?,
            on_demand_nodes: r.get(5)?,
        })
    })
}

/// The lower bound of start_time of each length class, for a window from `from`.
fn starts_after(from: i64) -> Vec<i64> {
    (0..=CLASS_LONGEST.len())
        .map(|class| {
            CLASS_LONGEST
                .get(class)
                .map_or(i64::MIN, |&longest| from.saturating_sub(longest))
        })
        .collect()
}

/// Where the per-class lower bounds of start_time begin among [`overlapping_sql`]'s
/// parameters (1: model, 2: until, 3: from).
const FIRST_CLASS_PARAMETER: usize = 4;

// SQLite is held to the window index by its hint (INDEXED BY: an error, never another
// plan, if the index cannot serve the statement). PostgreSQL has no hints; its planner
// reads the same covering index (the test `postgres_reads_the_window_index`).
static OVERLAPPING_SQLITE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| overlapping_sql("INDEXED BY reservations_by_window"));
static OVERLAPPING_POSTGRES: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| overlapping_sql(""));

/// One statement, one index range per length class: ?1 model, ?2 until, ?3 from, and the
/// lower bound of start_time of class k at ?(4 + k).
fn overlapping_sql(index_hint: &str) -> String {
    (0..=CLASS_LONGEST.len())
        .map(|class| {
            format!(
                "SELECT id, tenant_id, start_time, end_time, pool_nodes, on_demand_nodes
                 FROM reservations {index_hint}
                 WHERE gpu_type = ?1 AND span_class = {class} AND start_time > ?{}
                   AND start_time < ?2 AND end_time > ?3",
                FIRST_CLASS_PARAMETER + class
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
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

/// Every cluster of `gpu_type` with the pool and on-demand nodes it holds, in tenant and
/// name order by their bytes, as SQLite's ORDER BY gives them (PostgreSQL's follows the
/// database's collation).
pub fn clusters(conn: &impl AsConn, gpu_type: &str) -> gpufleet_sql::Result<Vec<ClusterHold>> {
    let mut held = conn.as_conn().query_map(
        "SELECT c.id, c.tenant_id, c.reservation_id, r.end_time,
                (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id AND n.capacity = 'pool'),
                (SELECT COUNT(*) FROM nodes n WHERE n.cluster_id = c.id AND n.capacity <> 'pool'),
                c.name
         FROM clusters c LEFT JOIN reservations r ON r.id = c.reservation_id
         WHERE c.gpu_type = ?1
         ORDER BY c.tenant_id, c.name",
        params![gpu_type],
        |r| {
            let hold = ClusterHold {
                id: r.get(0)?,
                tenant_id: r.get(1)?,
                reservation_id: r.get(2)?,
                reservation_end: r.get(3)?,
                pool: r.get(4)?,
                on_demand: r.get(5)?,
            };
            Ok((r.get::<String>(6)?, hold))
        },
    )?;
    held.sort_by(|(a_name, a), (b_name, b)| (&a.tenant_id, a_name).cmp(&(&b.tenant_id, b_name)));
    Ok(held.into_iter().map(|(_, hold)| hold).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::engines;
    use crate::store::reservations::ReservationRow;
    use gpufleet_sql::{Conn, Database};

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

    /// Plain SQL: `store::reservations` is not on the engine seam yet.
    fn insert(c: &Conn<'_>, r: &ReservationRow) {
        c.execute(
            "INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time,
                 allow_on_demand, pool_nodes, on_demand_nodes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
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
        )
        .unwrap();
    }

    fn add_tenant(db: &Database) {
        db.conn()
            .execute(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t', 't', 't', '{}', 'h', 0)",
                params![],
            )
            .unwrap();
    }

    /// Each test runs on SQLite and on PostgreSQL, with the tenant `t`.
    fn on_both(test: impl Fn(&mut Database)) {
        engines::on_both(|db| {
            add_tenant(db);
            test(db);
        });
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
        on_both(|db| {
            let c = db.conn();
            let t = 1_900_000_000;
            insert(&c, &reservation("a", "H100-80GB", t, t + 10));
            insert(&c, &reservation("b", "H100-80GB", t + 10, t + 20));
            insert(&c, &reservation("c", "A100-80GB", t, t + 20));
            let h100 = |from, until| ids(overlapping(&c, "H100-80GB", from, until).unwrap());
            assert_eq!(h100(t + 9, Some(t + 10)), ["a"]);
            assert_eq!(h100(t + 10, Some(t + 11)), ["b"]);
            assert_eq!(h100(t + 9, Some(t + 11)), ["a", "b"]);
            assert_eq!(h100(t - 5, Some(t)), Vec::<String>::new());
            assert_eq!(h100(t + 20, None), Vec::<String>::new());
            assert_eq!(h100(t + 19, None), ["b"]);
            assert_eq!(h100(0, None), ["a", "b"]);
            // The extremes of the bounds bind on both engines.
            assert_eq!(h100(i64::MIN, Some(i64::MAX)), ["a", "b"]);
            assert_eq!(h100(i64::MAX, None), Vec::<String>::new());
        });
    }

    #[test]
    fn the_index_follows_updates_and_deletes() {
        on_both(|db| {
            let c = db.conn();
            let t = 1_900_000_000;
            insert(&c, &reservation("a", "H100-80GB", t, t + 10));
            // Ten seconds long becomes a hundred days long: another length class.
            c.execute(
                "UPDATE reservations SET end_time = ?2 WHERE id = ?1",
                params!["a", t + 100 * 86_400],
            )
            .unwrap();
            assert_eq!(
                ids(overlapping(&c, "H100-80GB", t + 50 * 86_400, Some(t + 51 * 86_400)).unwrap()),
                ["a"]
            );
            c.execute("DELETE FROM reservations WHERE id = ?1", params!["a"])
                .unwrap();
            assert!(overlapping(&c, "H100-80GB", 0, None).unwrap().is_empty());
        });
    }

    /// The classes the migration's generated column computes (SQLite's migration 8,
    /// PostgreSQL's schema) are the ones the reads assume: a reservation exactly as long
    /// as a class's longest is in that class.
    #[test]
    fn length_classes_in_sql_match_the_reads() {
        on_both(|db| {
            let c = db.conn();
            let t = 1_900_000_000;
            let class_of = |len: i64| -> i64 {
                let id = format!("len-{len}");
                insert(&c, &reservation(&id, "H100-80GB", t, t + len));
                c.query_row(
                    "SELECT span_class FROM reservations WHERE id = ?1",
                    params![id],
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
        });
    }

    /// Against every row checked one by one: reservations of every length class, windows
    /// of every size, edges one second either side. The same rows and windows on both
    /// engines, so both give the same answers.
    #[test]
    fn overlap_matches_a_check_of_every_reservation() {
        on_both(|db| {
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
                all.push(reservation(
                    &format!("r{i}"),
                    model,
                    start,
                    start + len.max(1),
                ));
            }
            db.write(|c| {
                all.iter().for_each(|r| insert(c, r));
                Ok(())
            })
            .unwrap();
            let c = db.conn();
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
                    ids(overlapping(&c, "H100-80GB", from, until).unwrap()),
                    expected,
                    "window [{from}, {until:?})"
                );
            }
        });
    }

    #[test]
    fn clusters_count_their_pool_and_on_demand_nodes() {
        on_both(|db| {
            let c = db.conn();
            let t = 1_900_000_000;
            insert(&c, &reservation("r", "H100-80GB", t, t + 10));
            c.execute_batch(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                     reservation_id, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
                 VALUES ('c1', 't', 'b', 'kubernetes', 'H100-80GB', 2, 'r', 1, 'running', '', '', '', '{}'),
                        ('c2', 't', 'a', 'slurm', 'H100-80GB', 1, NULL, 1, 'running', '', '', '', '{}'),
                        ('c3', 't', 'c', 'slurm', 'A100-80GB', 1, NULL, 1, 'running', '', '', '', '{}');
                 INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version, cluster_id)
                 VALUES ('n1', 'h1', 'H100-80GB', 'pool', 8, '', '', 'c1'),
                        ('n2', 'h2', 'H100-80GB', 'on-demand', 8, '', '', 'c1'),
                        ('n3', 'h3', 'H100-80GB', 'pool', 8, '', '', 'c2'),
                        ('n4', 'h4', 'H100-80GB', 'pool', 8, '', '', NULL);",
            )
            .unwrap();
            let held: Vec<_> = clusters(&c, "H100-80GB")
                .unwrap()
                .into_iter()
                .map(|h| {
                    (
                        h.id,
                        h.reservation_id,
                        h.reservation_end,
                        h.pool,
                        h.on_demand,
                    )
                })
                .collect();
            // In tenant and name order.
            assert_eq!(
                held,
                [
                    ("c2".to_string(), None, None, 1, 0),
                    ("c1".to_string(), Some("r".to_string()), Some(t + 10), 1, 1),
                ]
            );
        });
    }

    /// Under a PostgreSQL collation where case weighs less than letters, the clusters
    /// still come in SQLite's (bytewise) order.
    #[test]
    fn postgres_reads_clusters_in_bytewise_order_whatever_the_collation() {
        let (_guard, db, _) = engines::postgres();
        add_tenant(&db);
        let c = db.conn();
        c.execute_batch(
            "ALTER TABLE clusters ALTER COLUMN name TYPE TEXT COLLATE \"und-x-icu\";
             INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                 reservation_id, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
             VALUES ('c-b', 't', 'b', 'slurm', 'H100-80GB', 1, NULL, 1, 'running', '', '', '', '{}'),
                    ('c-C', 't', 'C', 'slurm', 'H100-80GB', 1, NULL, 1, 'running', '', '', '', '{}'),
                    ('c-a', 't', 'a', 'slurm', 'H100-80GB', 1, NULL, 1, 'running', '', '', '', '{}');",
        )
        .unwrap();
        // The premise: the database's own order is not bytewise.
        let collated: Vec<String> = c
            .query_map("SELECT id FROM clusters ORDER BY name", params![], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(collated, ["c-a", "c-b", "c-C"]);
        let held: Vec<String> = clusters(&c, "H100-80GB")
            .unwrap()
            .into_iter()
            .map(|h| h.id)
            .collect();
        assert_eq!(held, ["c-C", "c-a", "c-b"]);
    }

    /// PostgreSQL has no index hint: its planner must find the window index itself, for
    /// every length class, with a table of many reservations of which few overlap.
    #[test]
    fn postgres_reads_the_window_index() {
        let (_guard, mut db, _) = engines::postgres();
        add_tenant(&db);
        let t = 1_900_000_000_i64;
        db.write(|c| {
            // 5,000 reservations over ten years, of every length class.
            c.execute(
                "INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time,
                     allow_on_demand, pool_nodes, on_demand_nodes)
                 SELECT 'r' || i, 't', CASE WHEN i % 3 = 0 THEN 'A100-80GB' ELSE 'H100-80GB' END, 1,
                        CAST(?1 AS BIGINT) + i * 63072, CAST(?1 AS BIGINT) + i * 63072 + (ARRAY[600, 7200, 30000, 100000, 500000,
                            2000000, 8000000, 30000000, 90000000])[1 + i % 9], 0, 1, 0
                 FROM generate_series(CAST(1 AS BIGINT), 5000) AS i",
                params![t],
            )?;
            Ok(())
        })
        .unwrap();
        db.conn()
            .execute_batch("VACUUM ANALYZE reservations")
            .unwrap();
        let from = t + 5 * 365 * 86_400;
        let until = from + 7 * 86_400;
        let c = db.conn();
        let starts_after = starts_after(from);
        let mut values: Vec<&dyn ToValue> = vec![&"H100-80GB", &until, &from];
        values.extend(starts_after.iter().map(|s| s as &dyn ToValue));
        let plan: Vec<String> = c
            .query_map(
                &format!("EXPLAIN {}", *OVERLAPPING_POSTGRES),
                &values,
                |r| r.get(0),
            )
            .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{plan}");
        assert_eq!(
            plan.matches("using reservations_by_window").count(),
            CLASS_LONGEST.len() + 1,
            "{plan}"
        );
        assert!(!overlapping(&c, "H100-80GB", from, Some(until))
            .unwrap()
            .is_empty());
    }
}
