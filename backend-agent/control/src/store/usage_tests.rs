//! The usage intervals through the holding path (a node assigned to a cluster and
//! released), on SQLite and on PostgreSQL: create, resize, delete, a restart in the
//! middle, a rollback, pruning. Beside `usage`, not in it: `usage` must not know `nodes`.

use std::path::PathBuf;

use gpufleet_sql::{params, Conn, Database};

use super::postgres::engines::{self, Guard};
use super::usage::*;

const T0: i64 = 1_900_000_000;

/// How a store is opened again, as a restarted control plane opens it.
enum Reopen {
    Sqlite(PathBuf),
    Postgres(String),
}

/// A store on one engine.
struct Store {
    _guard: Guard,
    db: Database,
    reopen: Reopen,
}

impl Store {
    /// A restart: the connection closes and a new one opens the same store.
    fn restart(&mut self) {
        let db = match &self.reopen {
            Reopen::Sqlite(path) => {
                // The old connection first, as a process that stopped.
                self.db = Database::sqlite(rusqlite::Connection::open_in_memory().unwrap());
                Database::sqlite(crate::store::open(path).unwrap())
            }
            Reopen::Postgres(url) => Database::postgres(url).unwrap(),
        };
        self.db = db;
    }
}

/// Each test runs on SQLite and on PostgreSQL.
fn on_both(test: impl Fn(&mut Store)) {
    let (pg_guard, pg, url) = engines::postgres();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let lite = Database::sqlite(crate::store::open(&path).unwrap());
    let stores = [
        Store {
            _guard: Guard::Sqlite(dir),
            db: lite,
            reopen: Reopen::Sqlite(path),
        },
        Store {
            _guard: pg_guard,
            db: pg,
            reopen: Reopen::Postgres(url),
        },
    ];
    for mut store in stores {
        eprintln!("on {:?}", store.db.engine());
        test(&mut store);
    }
}

/// `nodes::assign`'s statements (its module is not on the engine seam yet) around the
/// real [`open`]: a node's intervals open in the transaction that assigns it.
fn assign_in(c: &Conn<'_>, node: &str, cluster: &str, t: i64) -> gpufleet_sql::Result<bool> {
    let changed = c.execute(
        "UPDATE nodes SET cluster_id = ?2 WHERE id = ?1 AND cluster_id IS NULL",
        params![node, cluster],
    )?;
    if changed == 1 {
        open(c, node, cluster, t)?;
    }
    Ok(changed == 1)
}

/// `nodes::release`'s statements around the real [`close`].
fn release_in(c: &Conn<'_>, node: &str, t: i64) -> gpufleet_sql::Result<()> {
    c.execute(
        "UPDATE nodes SET cluster_id = NULL WHERE id = ?1",
        params![node],
    )?;
    close(c, node, t)
}

fn assign(db: &mut Database, node: &str, cluster: &str, t: i64) -> bool {
    db.write(|c| assign_in(c, node, cluster, t)).unwrap()
}

fn release(db: &mut Database, node: &str, t: i64) {
    db.write(|c| release_in(c, node, t)).unwrap()
}

fn sql(db: &mut Database, statement: &str) {
    db.write(|c| c.execute_batch(statement)).unwrap();
}

/// A store with tenants `a` (quota: 8 guaranteed H100s) and `b` (none), clusters
/// `a1`, `a2` (preemptible) of `a` and `b1` of `b`, and 8-GPU nodes `p1`..`p4` (pool)
/// and `d1` (on-demand).
fn seed(db: &mut Database) {
    sql(
        db,
        "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES ('a', 'team-a', '', '{}', 'ha', 0), ('b', 'team-b', '', '{}', 'hb', 0);
         INSERT INTO quotas (id, tenant_id, gpu_type, gpus, burst_gpus)
             VALUES ('q', 'a', 'H100-80GB', 8, 16);",
    );
    db.write(|c| {
        for (id, tenant) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            c.execute(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                 VALUES (?1, ?2, ?1, 'kubernetes', 'H100-80GB', 1, 1, 'running', '', '', '', '{}')",
                params![id, tenant],
            )?;
        }
        // `preemption::insert`'s statement (not on the seam yet).
        c.execute(
            "INSERT INTO cluster_preemption (cluster_id, allow_on_demand) VALUES ('a2', 0)",
            params![],
        )?;
        for (id, capacity) in [
            ("p1", "pool"),
            ("p2", "pool"),
            ("p3", "pool"),
            ("p4", "pool"),
            ("d1", "on-demand"),
        ] {
            c.execute(
                "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                    cuda_version, state)
                 VALUES (?1, ?1, 'H100-80GB', ?2, 8, '550', '12.4', 'ready')",
                params![id, capacity],
            )?;
        }
        Ok(())
    })
    .unwrap();
}

fn all() -> GroupBy {
    GroupBy {
        tenant: true,
        cluster: true,
        gpu_type: true,
        class: true,
        mig_profile: false,
    }
}

fn held_rows(
    db: &mut Database,
    tenant: Option<&str>,
    since: i64,
    until: i64,
    now: i64,
    by: GroupBy,
    limit: i64,
) -> Vec<UsageRow> {
    db.read(|c| held(c, tenant, since, until, now, by, limit))
        .unwrap()
}

fn total(db: &mut Database, tenant: Option<&str>, since: i64, until: i64, now: i64) -> i64 {
    held_rows(db, tenant, since, until, now, GroupBy::default(), 100)
        .iter()
        .map(|r| r.gpu_seconds)
        .sum()
}

fn lifetimes(db: &mut Database, tenant: Option<&str>, now: i64) -> Vec<Lifetime> {
    db.read(|c| lifetime(c, tenant, now)).unwrap()
}

fn used_of(
    db: &mut Database,
    tenant: Option<&str>,
    since: i64,
    until: i64,
    by: GroupBy,
    limit: i64,
) -> Vec<UsedRow> {
    db.read(|c| used(c, tenant, since, until, by, limit))
        .unwrap()
}

fn lifetimes_used(db: &mut Database, tenant: Option<&str>) -> Vec<LifetimeUsed> {
    db.read(|c| lifetime_used(c, tenant)).unwrap()
}

fn record(db: &mut Database, node: &str, readings: &[Reading], gap: i64) {
    db.write(|c| record_used(c, node, readings, gap)).unwrap()
}

#[test]
fn classes_follow_admission() {
    assert_eq!(classify(true, false, 8, 64, 0), [(ON_DEMAND, 8)]);
    assert_eq!(classify(false, true, 8, 64, 0), [(BORROWED_PREEMPTIBLE, 8)]);
    assert_eq!(classify(false, false, 8, 12, 0), [(GUARANTEED, 8)]);
    assert_eq!(
        classify(false, false, 8, 12, 8),
        [(GUARANTEED, 4), (BURST, 4)]
    );
    assert_eq!(classify(false, false, 8, 12, 16), [(BURST, 8)]);
    assert_eq!(classify(false, false, 8, 0, 0), [(BURST, 8)]);
}

/// Create, grow, shrink, delete: each second of each node counted once, in its class.
#[test]
fn create_resize_delete_count_every_held_second_once() {
    on_both(|s| {
        let db = &mut s.db;
        seed(db);
        // a1 created with one pool node at T0: within a's guarantee.
        assert!(assign(db, "p1", "a1", T0));
        // Grown by a pool node and an on-demand node at T0 + 100: past the guarantee.
        assert!(assign(db, "p2", "a1", T0 + 100));
        assert!(assign(db, "d1", "a1", T0 + 100));
        // The preemptible a2 borrows p3 from T0 + 50; b1 holds p4 from T0.
        assert!(assign(db, "p3", "a2", T0 + 50));
        assert!(assign(db, "p4", "b1", T0));
        // Shrunk at T0 + 300; deleted at T0 + 1000.
        release(db, "d1", T0 + 300);
        release(db, "p2", T0 + 1000);
        release(db, "p1", T0 + 1000);
        release(db, "p3", T0 + 1000);
        let rows = held_rows(db, None, T0 - 10, T0 + 2000, T0 + 5000, all(), 100);
        let got: Vec<(&str, &str, &str, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.tenant.as_str(),
                    r.cluster.as_str(),
                    r.class.as_str(),
                    r.gpu_seconds,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("team-a", "a1", BURST, 8 * 900),
                ("team-a", "a1", GUARANTEED, 8 * 1000),
                ("team-a", "a1", ON_DEMAND, 8 * 200),
                ("team-a", "a2", BORROWED_PREEMPTIBLE, 8 * 950),
                // b1 still holds p4: counted up to the read's until.
                ("team-b", "b1", BURST, 8 * 2000),
            ]
        );
        // A window cuts intervals at both ends; a team sees only its own.
        assert_eq!(
            total(db, Some("a"), T0 + 200, T0 + 400, T0 + 5000),
            8 * (200 + 200 + 100 + 200)
        );
        assert_eq!(total(db, Some("b"), T0 + 200, T0 + 400, T0 + 5000), 8 * 200);
        // Open intervals count up to now, never past it.
        assert_eq!(total(db, Some("b"), T0, T0 + 9000, T0 + 30), 8 * 30);
        // Grouped by nothing, or by model only: the same total.
        let by_model = GroupBy {
            gpu_type: true,
            ..GroupBy::default()
        };
        let rows = held_rows(db, None, T0, T0 + 2000, T0 + 5000, by_model, 100);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].gpu_type, "H100-80GB");
        assert_eq!(
            rows[0].gpu_seconds,
            total(db, None, T0, T0 + 2000, T0 + 5000)
        );
        // A window nothing was held in has no group, grouped or not.
        assert!(held_rows(
            db,
            None,
            T0 - 100,
            T0 - 10,
            T0 + 5000,
            GroupBy::default(),
            10
        )
        .is_empty());
        assert!(held_rows(db, None, T0 - 100, T0 - 10, T0 + 5000, all(), 10).is_empty());
        // The limit keeps the first groups.
        let first_two: Vec<String> = held_rows(db, None, T0 - 10, T0 + 2000, T0 + 5000, all(), 2)
            .into_iter()
            .map(|r| r.class)
            .collect();
        assert_eq!(first_two, [BURST, GUARANTEED]);
    });
}

/// Holdings through the real `nodes::assign` and `nodes::release`, which speak only
/// SQLite until their module moves onto the engine seam: SQLite only.
#[test]
fn the_real_holding_path_opens_and_closes_intervals_on_sqlite() {
    use super::nodes;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut db = Database::sqlite(crate::store::open(&path).unwrap());
    seed(&mut db);
    drop(db);
    let conn = crate::store::open(&path).unwrap();
    assert!(nodes::assign(&conn, "p1", "a1", T0).unwrap());
    assert!(nodes::assign(&conn, "p2", "a1", T0 + 100).unwrap());
    assert!(
        !nodes::assign(&conn, "p2", "b1", T0 + 100).unwrap(),
        "p2 is a1's"
    );
    nodes::release(&conn, "p2", T0 + 1000).unwrap();
    nodes::release(&conn, "p1", T0 + 1000).unwrap();
    let rows = held(&conn, None, T0 - 10, T0 + 2000, T0 + 5000, all(), 100).unwrap();
    let got: Vec<(&str, i64)> = rows
        .iter()
        .map(|r| (r.class.as_str(), r.gpu_seconds))
        .collect();
    assert_eq!(got, [(BURST, 8 * 900), (GUARANTEED, 8 * 1000)]);
}

/// A restart between the create and the delete: the total is what one process would
/// have counted, with no second counted twice and none missing.
#[test]
fn a_restart_in_the_middle_neither_double_counts_nor_leaves_a_gap() {
    on_both(|s| {
        seed(&mut s.db);
        assert!(assign(&mut s.db, "p1", "a1", T0));
        assert_eq!(
            total(&mut s.db, Some("a"), T0, T0 + 10_000, T0 + 400),
            8 * 400
        );
        // Down from T0 + 400 to T0 + 700: the node stays held by the allocation records.
        s.restart();
        let db = &mut s.db;
        assert_eq!(total(db, Some("a"), T0, T0 + 10_000, T0 + 700), 8 * 700);
        assert!(assign(db, "p2", "a1", T0 + 700));
        release(db, "p1", T0 + 1000);
        s.restart();
        let db = &mut s.db;
        release(db, "p2", T0 + 1200);
        assert_eq!(
            total(db, Some("a"), T0, T0 + 10_000, T0 + 9000),
            8 * 1000 + 8 * 500
        );
        // Releasing again (a retried delete) adds nothing.
        release(db, "p2", T0 + 5000);
        assert_eq!(
            total(db, Some("a"), T0, T0 + 10_000, T0 + 9000),
            8 * 1000 + 8 * 500
        );
    });
}

/// A rolled-back assignment leaves no interval: usage is written in its transaction.
#[test]
fn usage_follows_the_transaction_of_the_holding() {
    on_both(|s| {
        let db = &mut s.db;
        seed(db);
        let rolled_back: gpufleet_sql::Result<()> = db.write(|c| {
            assert!(assign_in(c, "p1", "a1", T0)?);
            Err(gpufleet_sql::Error::NoRows)
        });
        assert!(rolled_back.is_err());
        assert_eq!(total(db, None, T0, T0 + 100, T0 + 100), 0);
        // The node was not assigned either: it can be now.
        assert!(assign(db, "p1", "a1", T0 + 10));
        assert_eq!(total(db, None, T0, T0 + 100, T0 + 100), 8 * 90);
    });
}

/// Intervals past the retention leave the reads but stay in the lifetime totals.
#[test]
fn pruning_keeps_lifetime_totals_whole() {
    on_both(|s| {
        let db = &mut s.db;
        seed(db);
        assert!(assign(db, "p4", "b1", T0));
        release(db, "p4", T0 + 10);
        assert!(assign(db, "p4", "b1", T0 + RETENTION_SECS + 20));
        let now = T0 + RETENTION_SECS + 30;
        let before = lifetimes(db, None, now);
        assert_eq!(before[0].gpu_seconds, 8 * 10 + 8 * 10);
        release(db, "p4", now); // prunes the first interval
        assert_eq!(total(db, None, T0, now, now), 8 * 10);
        assert_eq!(lifetimes(db, None, now), before);
        assert_eq!(lifetimes(db, None, now + 50), before);
    });
}

/// The gap limit of the tests: the time since a reading's previous one counts up to this.
const GAP: i64 = 30;

fn reading(t: i64, reported: u32, busy_percent: u32) -> Reading {
    Reading {
        t,
        reported,
        busy_percent,
    }
}

/// (tenant, cluster, class, used ms, measured ms) of the groups with readings.
fn used_rows(db: &mut Database, since: i64, until: i64) -> Vec<(String, String, String, i64, i64)> {
    used_of(db, None, since, until, all(), 100)
        .into_iter()
        .map(|r| (r.tenant, r.cluster, r.class, r.used_ms, r.measured_ms))
        .collect()
}

fn row(
    tenant: &str,
    cluster: &str,
    class: &str,
    used_s: i64,
    measured_s: i64,
) -> (String, String, String, i64, i64) {
    (
        tenant.into(),
        cluster.into(),
        class.into(),
        used_s * 1000,
        measured_s * 1000,
    )
}

/// Busy fraction x the time since the previous reading, capped at the gap limit, never
/// past the release; a node split between classes shares by GPUs; GPUs without a
/// utilisation reading (MIG under NVML) measure nothing and their group has no row.
#[test]
fn readings_count_busy_time_capped_at_the_gap_and_split_by_class() {
    on_both(|s| {
        let db = &mut s.db;
        seed(db);
        sql(db, "UPDATE quotas SET gpus = 12 WHERE id = 'q'");
        assert!(assign(db, "p1", "a1", T0)); // 8 guaranteed
        assert!(assign(db, "p2", "a1", T0)); // 4 guaranteed, 4 burst
        assert!(assign(db, "p4", "b1", T0)); // 8 burst, in MIG mode
                                             // p1: 50% for 5 s, 100% for 5 s, then 90 s of silence counted as 30 s at 25%.
        let p1 = [
            reading(T0 + 5, 8, 8 * 50),
            reading(T0 + 10, 8, 8 * 100),
            reading(T0 + 100, 8, 8 * 25),
        ];
        record(db, "p1", &p1, GAP);
        // p2: all busy for its first 10 s, half of it in each class.
        record(db, "p2", &[reading(T0 + 10, 8, 800)], GAP);
        // p4's GPUs report memory but no utilisation.
        record(
            db,
            "p4",
            &[reading(T0 + 10, 0, 0), reading(T0 + 20, 0, 0)],
            GAP,
        );
        // Released at T0 + 105: a reading at T0 + 110 counts only up to the release.
        release(db, "p1", T0 + 105);
        record(db, "p1", &[reading(T0 + 110, 8, 800)], GAP);
        let p1_used = 4 * 5 + 8 * 5 + 2 * 30 + 8 * 5;
        assert_eq!(
            used_rows(db, T0 - 10, T0 + 1000),
            [
                row("team-a", "a1", BURST, 4 * 10, 4 * 10),
                row(
                    "team-a",
                    "a1",
                    GUARANTEED,
                    p1_used + 4 * 10,
                    8 * 45 + 4 * 10
                ),
            ]
        );
        // Counted once: the same readings again add nothing.
        record(db, "p2", &[reading(T0 + 10, 8, 800)], GAP);
        assert_eq!(used_rows(db, T0 - 10, T0 + 1000).len(), 2);
        assert_eq!(
            used_rows(db, T0 - 10, T0 + 1000)[0],
            row("team-a", "a1", BURST, 40, 40)
        );
        // A team's own only; b has held time but no readings: no row (not reported).
        assert!(used_of(db, Some("b"), T0, T0 + 1000, all(), 100).is_empty());
        assert_eq!(total(db, Some("b"), T0, T0 + 1000, T0 + 1000), 8 * 1000);
        let lifetime: Vec<(String, String, i64)> = lifetimes_used(db, None)
            .into_iter()
            .map(|l| (l.tenant_id, l.class, l.used_ms))
            .collect();
        assert_eq!(
            lifetime,
            [
                ("a".to_string(), BURST.to_string(), 40_000),
                (
                    "a".to_string(),
                    GUARANTEED.to_string(),
                    (p1_used + 40) * 1000
                ),
            ]
        );
        assert!(lifetimes_used(db, Some("b")).is_empty());
    });
}

/// Readings are kept per hour: a window on whole hours is exact, one that cuts an hour
/// counts the part of that hour's readings inside it, pro rata.
#[test]
fn hours_cut_by_the_window_count_pro_rata() {
    on_both(|s| {
        let db = &mut s.db;
        seed(db);
        // T0 is 2800 s into its hour: the hour ends at T0 + 800.
        assert_eq!(T0.rem_euclid(3600), 2800);
        assert!(assign(db, "p1", "a1", T0));
        // All busy from T0 + 760 (the first reading counts back 30 s at most) to T0 + 810.
        let readings = [reading(T0 + 790, 8, 800), reading(T0 + 810, 8, 800)];
        record(db, "p1", &readings, GAP);
        let mut used_ms = |since, until| {
            used_of(db, Some("a"), since, until, GroupBy::default(), 10)
                .iter()
                .map(|r| r.used_ms)
                .sum::<i64>()
        };
        let mut used_s = |since, until| used_ms(since, until) / 1000;
        assert_eq!(used_s(T0, T0 + 800), 8 * 40);
        assert_eq!(used_s(T0 + 800, T0 + 4400), 8 * 10);
        assert_eq!(used_s(T0, T0 + 4400), 8 * 50);
        // 20 of the first hour's 40 s, 5 of the second's 10.
        assert_eq!(used_s(T0 + 780, T0 + 805), 8 * 20 + 8 * 5);
        assert_eq!(used_s(T0 + 900, T0 + 4400), 0);
    });
}

/// A part of an hour that is not a whole millisecond rounds the same on both engines
/// (SQLite computes it in doubles, PostgreSQL exactly), half a millisecond away from
/// zero.
#[test]
fn a_cut_hours_part_rounds_alike_on_both_engines() {
    on_both(|s| {
        let db = &mut s.db;
        seed(db);
        // Hours of readings from 10 to 13 (3 s) and from 10 to 12 (2 s).
        sql(
            db,
            "INSERT INTO usage_used (tenant_id, tenant, cluster, gpu_type, class, mig_profile,
                                     hour, used_ms, measured_ms, first_t, last_t)
             VALUES ('a', 'team-a', 'a1', 'H100-80GB', 'guaranteed', 'none', 0, 24001, 24001, 10, 13),
                    ('b', 'team-b', 'b1', 'H100-80GB', 'burst', 'none', 0, 5, 6, 10, 12)",
        );
        let part = |db: &mut Database, tenant: &str, since: i64, until: i64| {
            let rows = used_of(db, Some(tenant), since, until, GroupBy::default(), 10);
            (rows[0].used_ms, rows[0].measured_ms)
        };
        // A third of 24,001 ms is 8,000.33: down; two thirds, 16,000.67: up.
        assert_eq!(part(db, "a", 10, 11), (8000, 8000));
        assert_eq!(part(db, "a", 11, 100), (16001, 16001));
        // Half of 5 ms is 2.5: 3, away from zero (not 2, to even); half of 6 is 3.
        assert_eq!(part(db, "b", 11, 100), (3, 3));
        assert_eq!(part(db, "b", 0, 11), (3, 3));
    });
}

/// A restart between readings: what was counted stays, a reading delivered again is not
/// counted twice, and the downtime counts only up to the gap limit.
#[test]
fn used_time_survives_a_restart_exactly() {
    let total_used = |db: &mut Database| {
        lifetimes_used(db, Some("a"))
            .iter()
            .map(|l| l.used_ms)
            .sum::<i64>()
    };
    on_both(|s| {
        seed(&mut s.db);
        assert!(assign(&mut s.db, "p1", "a1", T0));
        record(&mut s.db, "p1", &[reading(T0 + 10, 8, 800)], GAP);
        assert_eq!(total_used(&mut s.db), 8 * 10 * 1000);
        // Down from T0 + 10 to T0 + 400; the first reading after is at 50% and the last
        // one before comes again (a flush that was retried).
        s.restart();
        let after = [reading(T0 + 10, 8, 800), reading(T0 + 400, 8, 400)];
        record(&mut s.db, "p1", &after, GAP);
        let expected = (8 * 10 + 4 * GAP) * 1000;
        assert_eq!(total_used(&mut s.db), expected);
        s.restart();
        let db = &mut s.db;
        record(db, "p1", &after, GAP);
        assert_eq!(total_used(db), expected);
        assert_eq!(
            used_of(db, Some("a"), T0, T0 + 1000, GroupBy::default(), 10)[0].used_ms,
            expected
        );
        // Past the retention the hours leave the reads but stay in the lifetime totals.
        release(db, "p1", T0 + 500);
        db.write(|c| prune(c, T0 + RETENTION_SECS + 4000)).unwrap();
        assert!(used_of(db, Some("a"), T0, T0 + 1000, GroupBy::default(), 10).is_empty());
        assert_eq!(total_used(db), expected);
    });
}

/// Clusters `m1` (each H100 cut into 7 1g.10gb) and `m2` (3g.40gb + 2g.20gb + 2 1g.10gb,
/// which occupy 4 + 2 + 2 of the 8 memory slices) of tenant `a`, whose guarantee is 16.
fn seed_mig(db: &mut Database) {
    seed(db);
    sql(db, "UPDATE quotas SET gpus = 16 WHERE id = 'q'");
    db.write(|c| {
        for (id, layout) in [
            ("m1", r#"{"1g.10gb":7}"#),
            ("m2", r#"{"1g.10gb":2,"2g.20gb":1,"3g.40gb":1}"#),
        ] {
            c.execute(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                 VALUES (?1, 'a', ?1, 'kubernetes', 'H100-80GB', 1, 1, 'running', '', '', '', ?2)",
                params![id, layout],
            )?;
        }
        Ok(())
    })
    .unwrap();
}

fn by_profile() -> GroupBy {
    GroupBy {
        mig_profile: true,
        ..all()
    }
}

/// (cluster, class, MIG profile, GPU-seconds, slice-seconds) of a read.
fn profile_rows(rows: &[UsageRow]) -> Vec<(&str, &str, &str, i64, i64)> {
    rows.iter()
        .map(|r| {
            (
                r.cluster.as_str(),
                r.class.as_str(),
                r.mig_profile.as_str(),
                r.gpu_seconds,
                r.slice_seconds,
            )
        })
        .collect()
}

#[test]
fn a_layout_is_cut_into_profiles_that_add_up_to_the_whole_gpu() {
    let one = profile_shares("H100-80GB", &[("1g.10gb".to_string(), 7)].into());
    assert_eq!(
        one,
        [ProfileShare {
            profile: "1g.10gb".into(),
            per_gpu: 7,
            share: 840,
        }]
    );
    let mixed = profile_shares(
        "H100-80GB",
        &[
            ("1g.10gb".to_string(), 2),
            ("2g.20gb".to_string(), 1),
            ("3g.40gb".to_string(), 1),
        ]
        .into(),
    );
    let got: Vec<(&str, i64, i64)> = mixed
        .iter()
        .map(|s| (s.profile.as_str(), s.per_gpu, s.share))
        .collect();
    assert_eq!(
        got,
        [
            ("1g.10gb", 2, 210),
            ("2g.20gb", 1, 210),
            ("3g.40gb", 1, 420)
        ]
    );
    // A layout that occupies 3 of the 8 memory slices: its profiles still share the GPU.
    let partial = profile_shares(
        "H100-80GB",
        &[("1g.10gb".to_string(), 1), ("2g.20gb".to_string(), 1)].into(),
    );
    assert_eq!(
        partial.iter().map(|s| s.share).collect::<Vec<_>>(),
        [280, 560]
    );
    let whole = profile_shares("H100-80GB", &Default::default());
    assert_eq!(
        (whole[0].profile.as_str(), whole[0].per_gpu, whole[0].share),
        (WHOLE_GPUS, 0, 840)
    );
}

/// m2's node is assigned first: its three profile intervals count its 8 GPUs once
/// against a's guarantee of 16, so m1's node after it is guaranteed too (counting each
/// profile's GPUs whole would have made it burst). Held 100 s: m1 holds 56 1g.10gb
/// (5,600 slice-seconds, 800 GPU-seconds); m2 its GPUs' halves to 3g.40gb (400), quarters
/// to 2g.20gb and 1g.10gb (200 each), with 8, 8 and 16 instances.
#[test]
fn mig_clusters_count_slices_and_their_part_of_the_gpus() {
    on_both(|s| {
        let db = &mut s.db;
        seed_mig(db);
        assert!(assign(db, "p2", "m2", T0));
        assert!(assign(db, "p1", "m1", T0));
        assert!(assign(db, "p3", "a1", T0)); // whole GPUs, past the guarantee
        release(db, "p1", T0 + 100);
        release(db, "p2", T0 + 100);
        release(db, "p3", T0 + 100);
        let rows = held_rows(db, None, T0, T0 + 1000, T0 + 1000, by_profile(), 100);
        assert_eq!(
            profile_rows(&rows),
            [
                ("a1", BURST, WHOLE_GPUS, 800, 0),
                ("m1", GUARANTEED, "1g.10gb", 800, 56 * 100),
                ("m2", GUARANTEED, "1g.10gb", 200, 16 * 100),
                ("m2", GUARANTEED, "2g.20gb", 200, 8 * 100),
                ("m2", GUARANTEED, "3g.40gb", 400, 8 * 100),
            ]
        );
        // Not grouped by profile: whole GPUs held, as before.
        assert_eq!(total(db, Some("a"), T0, T0 + 1000, T0 + 1000), 3 * 800);
        // By profile only, every cluster's together.
        let only = GroupBy {
            mig_profile: true,
            ..GroupBy::default()
        };
        let rows = held_rows(db, None, T0, T0 + 1000, T0 + 1000, only, 100);
        assert_eq!(
            profile_rows(&rows),
            [
                ("", "", "1g.10gb", 1000, 72 * 100),
                ("", "", "2g.20gb", 200, 8 * 100),
                ("", "", "3g.40gb", 400, 8 * 100),
                ("", "", WHOLE_GPUS, 800, 0),
            ]
        );
        // A window that cuts the holding counts the profiles' parts of it.
        let rows = held_rows(db, Some("a"), T0 + 40, T0 + 61, T0 + 1000, only, 100);
        assert_eq!(rows[0].gpu_seconds, 8 * 21 + 8 * 21 / 4);
        assert_eq!(rows[0].slice_seconds, 72 * 21);
        // The lifetime totals behind the counters, per profile.
        let lifetime: Vec<(String, String, i64, i64)> = lifetimes(db, Some("a"), T0 + 1000)
            .into_iter()
            .map(|l| (l.class, l.mig_profile, l.gpu_seconds, l.slice_seconds))
            .collect();
        assert_eq!(
            lifetime,
            [
                (BURST.into(), WHOLE_GPUS.into(), 800, 0),
                (GUARANTEED.into(), "1g.10gb".into(), 1000, 7200),
                (GUARANTEED.into(), "2g.20gb".into(), 200, 800),
                (GUARANTEED.into(), "3g.40gb".into(), 400, 800),
            ]
        );
    });
}

/// A MIG holding across a restart and past the retention: every slice-second and
/// GPU-second once, and lifetime totals whole after pruning (kept in parts of a GPU).
#[test]
fn mig_usage_survives_a_restart_and_pruning_exactly() {
    let read = |db: &mut Database, now: i64| {
        profile_rows(&held_rows(
            db,
            Some("a"),
            T0,
            T0 + 10_000,
            now,
            by_profile(),
            100,
        ))
        .into_iter()
        .map(|(c, k, p, g, s)| (c.to_string(), k.to_string(), p.to_string(), g, s))
        .collect::<Vec<_>>()
    };
    on_both(|s| {
        seed_mig(&mut s.db);
        assert!(assign(&mut s.db, "p2", "m2", T0));
        assert_eq!(read(&mut s.db, T0 + 30)[2].3, 8 * 30 / 2);
        // Down from T0 + 30 to T0 + 70: still held by the allocation records.
        s.restart();
        release(&mut s.db, "p2", T0 + 70);
        s.restart();
        let db = &mut s.db;
        let expected = [
            ("m2", GUARANTEED, "1g.10gb", 140, 16 * 70),
            ("m2", GUARANTEED, "2g.20gb", 140, 8 * 70),
            ("m2", GUARANTEED, "3g.40gb", 280, 8 * 70),
        ]
        .map(|(c, k, p, g, s)| (c.to_string(), k.to_string(), p.to_string(), g, s));
        assert_eq!(read(db, T0 + 9000), expected);
        // A quarter of 8 GPUs for 3 s is 6 GPU-seconds; the lifetime total rounds once.
        assert!(assign(db, "p2", "m2", T0 + RETENTION_SECS + 100));
        release(db, "p2", T0 + RETENTION_SECS + 103);
        let now = T0 + RETENTION_SECS + 200;
        let before = lifetimes(db, Some("a"), now);
        assert_eq!(
            before.iter().map(|l| l.gpu_seconds).collect::<Vec<_>>(),
            [146, 146, 292]
        );
        db.write(|c| prune(c, now)).unwrap(); // the first holding leaves the reads
        assert!(read(db, now).is_empty());
        assert_eq!(lifetimes(db, Some("a"), now), before);
    });
}

/// The migration that keys usage by MIG profile: rows from before are whole GPUs, their
/// totals unchanged. SQLite only: it replays SQLite's own migrations on a file
/// (PostgreSQL's schema starts past them).
#[test]
fn usage_from_before_mig_profiles_reads_as_whole_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
        )
        .unwrap();
        let before = super::MIGRATIONS
            .iter()
            .position(|m| m.contains("usage_used_by_profile"))
            .unwrap();
        for (i, sql) in super::MIGRATIONS[..before].iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?1, 0)",
                [i as i64 + 1],
            )
            .unwrap();
        }
        conn.execute_batch(
            "INSERT INTO usage_intervals (node_id, tenant_id, tenant, cluster, gpu_type, class,
                                          gpus, start_time, end_time)
                 VALUES ('p1', 'a', 'team-a', 'a1', 'H100-80GB', 'guaranteed', 8, 1000, 1100);
             INSERT INTO usage_pruned (tenant_id, tenant, gpu_type, class, gpu_seconds, used_ms,
                                       measured_ms)
                 VALUES ('a', 'team-a', 'H100-80GB', 'guaranteed', 50, 7000, 9000);
             INSERT INTO usage_used (tenant_id, tenant, cluster, gpu_type, class, hour, used_ms,
                                     measured_ms, first_t, last_t)
                 VALUES ('a', 'team-a', 'a1', 'H100-80GB', 'guaranteed', 0, 1000, 2000, 1000, 1100);",
        )
        .unwrap();
    }
    let conn = crate::store::open(&path).unwrap();
    let rows = held(&conn, None, 0, 5000, 5000, by_profile(), 10).unwrap();
    assert_eq!(
        profile_rows(&rows),
        [("a1", GUARANTEED, WHOLE_GPUS, 800, 0)]
    );
    let life = lifetime(&conn, None, 5000).unwrap();
    assert_eq!(
        (life[0].mig_profile.as_str(), life[0].gpu_seconds),
        (WHOLE_GPUS, 850)
    );
    let used_life = lifetime_used(&conn, None).unwrap();
    assert_eq!(
        (
            used_life[0].mig_profile.as_str(),
            used_life[0].used_ms,
            used_life[0].measured_ms
        ),
        (WHOLE_GPUS, 8000, 11_000)
    );
    let used_rows = used(&conn, None, 0, 5000, by_profile(), 10).unwrap();
    assert_eq!(used_rows[0].mig_profile, WHOLE_GPUS);
}

/// m1's layout changes at T0 + 100 from 7 1g.10gb to 2 3g.40gb per GPU while it holds p1
/// (since T0) and p2 (assigned in the change's own transaction, with the old layout):
/// p1's 100 s count as 1g.10gb (800 GPU-s, 5,600 slice-s), then both nodes' as 3g.40gb
/// until their release at T0 + 300 (2 x 8 x 200 = 3,200 GPU-s, 2 x 16 x 200 = 6,400
/// slice-s); p2 has no zero-length 1g.10gb interval. Re-cutting to the same layout writes
/// nothing.
#[test]
fn a_layout_change_recuts_the_held_gpus_from_then_on() {
    let count = |db: &mut Database, sql: &str| -> i64 {
        db.read(|c| c.query_row(sql, params![], |r| r.get(0)))
            .unwrap()
    };
    on_both(|s| {
        let db = &mut s.db;
        seed_mig(db);
        assert!(assign(db, "p1", "m1", T0));
        db.write(|c| relayout(c, "m1", T0 + 50)).unwrap();
        assert_eq!(
            count(db, "SELECT COUNT(*) FROM usage_intervals"),
            1,
            "the same layout: nothing written"
        );
        // p2's assignment and the change, in one transaction.
        db.write(|c| {
            assert!(assign_in(c, "p2", "m1", T0 + 100)?);
            c.execute(
                r#"UPDATE clusters SET mig_layout = '{"3g.40gb":2}' WHERE id = 'm1'"#,
                params![],
            )?;
            relayout(c, "m1", T0 + 100)
        })
        .unwrap();
        release(db, "p1", T0 + 300);
        release(db, "p2", T0 + 300);
        let rows = held_rows(db, None, T0, T0 + 1000, T0 + 1000, by_profile(), 100);
        assert_eq!(
            profile_rows(&rows),
            [
                ("m1", GUARANTEED, "1g.10gb", 800, 5_600),
                ("m1", GUARANTEED, "3g.40gb", 3_200, 6_400),
            ]
        );
        assert_eq!(
            count(
                db,
                "SELECT COUNT(*) FROM usage_intervals WHERE node_id = 'p2'"
            ),
            1
        );
        assert_eq!(
            total(db, Some("a"), T0, T0 + 1000, T0 + 1000),
            8 * 300 + 8 * 200
        );
    });
}

/// Groups come in bytewise order, and a tenant's rows under the bytewise greatest of its
/// names, on both engines, whatever PostgreSQL's collation: here an ICU one, which puts
/// "Team-C" after "team-b" and "team-a" after "Team-a" (bytewise, capitals come first).
#[test]
fn groups_and_names_are_bytewise_on_postgres_whatever_its_collation() {
    on_both(|s| {
        let db = &mut s.db;
        if db.engine() == gpufleet_sql::Engine::Postgres {
            sql(
                db,
                r#"ALTER TABLE usage_intervals ALTER COLUMN tenant TYPE TEXT COLLATE "und-x-icu";
                   ALTER TABLE usage_intervals ALTER COLUMN cluster TYPE TEXT COLLATE "und-x-icu";
                   ALTER TABLE usage_pruned ALTER COLUMN tenant TYPE TEXT COLLATE "und-x-icu";"#,
            );
        }
        seed(db);
        // Tenant a renamed while it held: its intervals carry both names.
        sql(
            db,
            "INSERT INTO usage_intervals (node_id, tenant_id, tenant, cluster, gpu_type, class,
                                          gpus, start_time, end_time)
             VALUES ('p1', 'a', 'team-a', 'x', 'H100-80GB', 'burst', 1, 100, 110),
                    ('p1', 'a', 'Team-a', 'x', 'H100-80GB', 'burst', 1, 110, 120),
                    ('p2', 'b', 'team-b', 'a', 'H100-80GB', 'burst', 1, 100, 110),
                    ('p2', 'b', 'team-b', 'B', 'H100-80GB', 'burst', 1, 100, 110),
                    ('p3', 'c', 'Team-C', 'c', 'H100-80GB', 'burst', 1, 100, 110)",
        );
        let by_cluster = GroupBy {
            cluster: true,
            ..GroupBy::default()
        };
        let groups: Vec<(String, String)> = held_rows(db, None, 0, 1000, 1000, by_cluster, 10)
            .into_iter()
            .map(|r| (r.tenant, r.cluster))
            .collect();
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(t, c)| (t.to_string(), c.to_string()))
                .collect()
        };
        assert_eq!(
            groups,
            pairs(&[
                ("Team-C", "c"),
                ("Team-a", "x"),
                ("team-a", "x"),
                ("team-b", "B"),
                ("team-b", "a"),
            ])
        );
        // The first two groups are the bytewise first, not the collation's.
        assert_eq!(held_rows(db, None, 0, 1000, 1000, by_cluster, 2).len(), 2);
        let first: Vec<String> = held_rows(db, None, 0, 1000, 1000, by_cluster, 2)
            .into_iter()
            .map(|r| r.tenant)
            .collect();
        assert_eq!(first, ["Team-C", "Team-a"]);
        let names: Vec<(String, String)> = lifetimes(db, None, 1000)
            .into_iter()
            .map(|l| (l.tenant_id, l.tenant))
            .collect();
        assert_eq!(
            names,
            pairs(&[("a", "team-a"), ("b", "team-b"), ("c", "Team-C")])
        );
        // Pruned, the totals keep the same name.
        db.write(|c| prune(c, 1000 + RETENTION_SECS)).unwrap();
        let names: Vec<String> = lifetimes(db, Some("a"), 1000)
            .into_iter()
            .map(|l| l.tenant)
            .collect();
        assert_eq!(names, ["team-a"]);
    });
}
