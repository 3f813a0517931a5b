//! GPU-seconds held, per tenant, cluster, GPU model and capacity class (issue 42), from
//! the control plane's own allocation records: one interval per node a cluster holds,
//! opened by [`open`] in the transaction that assigns the node and closed by [`close`] in
//! the one that releases it. A read counts closed intervals as written and open ones up
//! to its `now`, so a restart neither double counts nor leaves a gap: there is no sampler.
//!
//! History is bounded: intervals that ended more than [`RETENTION_SECS`] ago are pruned
//! when a node is released, their seconds carried into `usage_pruned` so the lifetime
//! totals behind the Prometheus counter never go down.

use rusqlite::{Connection, OptionalExtension};

/// How long closed intervals are kept: 400 days.
pub const RETENTION_SECS: i64 = 400 * 86_400;

/// The capacity classes admission distinguishes.
pub const GUARANTEED: &str = "guaranteed";
pub const BURST: &str = "burst";
pub const BORROWED_PREEMPTIBLE: &str = "borrowed-preemptible";
pub const ON_DEMAND: &str = "on-demand";

/// What a node handed to a cluster counts as: on-demand nodes are on-demand; pool nodes
/// of a preemptible cluster are borrowed; other pool GPUs are guaranteed up to the
/// tenant's quota `gpus` (`guaranteed_held` already counted as such), burst past it.
/// Returns (class, GPUs) parts; a node can straddle its tenant's guarantee.
pub fn classify(
    on_demand: bool,
    preemptible: bool,
    gpus: i64,
    quota_gpus: i64,
    guaranteed_held: i64,
) -> Vec<(&'static str, i64)> {
    if on_demand {
        return vec![(ON_DEMAND, gpus)];
    }
    if preemptible {
        return vec![(BORROWED_PREEMPTIBLE, gpus)];
    }
    let guaranteed = (quota_gpus - guaranteed_held).clamp(0, gpus);
    [(GUARANTEED, guaranteed), (BURST, gpus - guaranteed)]
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// Opens the intervals of `node_id`, just assigned to `cluster_id`, at `t`.
pub fn open(conn: &Connection, node_id: &str, cluster_id: &str, t: i64) -> rusqlite::Result<()> {
    let found = conn
        .prepare_cached(
            "SELECT c.tenant_id, t.name, c.name, n.gpu_type, n.capacity <> 'pool', n.gpu_count,
                    EXISTS (SELECT 1 FROM cluster_preemption p WHERE p.cluster_id = c.id),
                    COALESCE((SELECT q.gpus FROM quotas q
                              WHERE q.tenant_id = c.tenant_id AND q.gpu_type = n.gpu_type), 0)
             FROM nodes n JOIN clusters c ON c.id = ?2 JOIN tenants t ON t.id = c.tenant_id
             WHERE n.id = ?1",
        )?
        .query_row([node_id, cluster_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, bool>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, bool>(6)?,
                r.get::<_, i64>(7)?,
            ))
        })
        .optional()?;
    let Some((tenant_id, tenant, cluster, gpu_type, on_demand, gpus, preemptible, quota)) = found
    else {
        return Ok(());
    };
    let guaranteed_held: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(gpus), 0) FROM usage_intervals
             WHERE end_time IS NULL AND tenant_id = ?1 AND gpu_type = ?2 AND class = 'guaranteed'",
        )?
        .query_row([&tenant_id, &gpu_type], |r| r.get(0))?;
    for (class, n) in classify(on_demand, preemptible, gpus, quota, guaranteed_held) {
        if n <= 0 {
            continue;
        }
        super::exec(
            conn,
            "INSERT INTO usage_intervals
                 (node_id, tenant_id, tenant, cluster, gpu_type, class, gpus, start_time)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            (
                node_id, &tenant_id, &tenant, &cluster, &gpu_type, class, n, t,
            ),
        )?;
    }
    Ok(())
}

/// Closes the open intervals of `node_id` at `t` (never before they opened), and prunes
/// what ended past the retention.
pub fn close(conn: &Connection, node_id: &str, t: i64) -> rusqlite::Result<()> {
    super::exec(
        conn,
        "UPDATE usage_intervals SET end_time = MAX(start_time, ?2)
         WHERE node_id = ?1 AND end_time IS NULL",
        (node_id, t),
    )?;
    prune(conn, t)
}

/// Moves intervals that ended more than [`RETENTION_SECS`] before `t` into the
/// per-(tenant, model, class) totals, so lifetime totals stay whole.
pub fn prune(conn: &Connection, t: i64) -> rusqlite::Result<()> {
    let cutoff = t - RETENTION_SECS;
    super::exec(
        conn,
        "INSERT INTO usage_pruned (tenant, gpu_type, class, gpu_seconds)
         SELECT tenant, gpu_type, class, SUM(gpus * (end_time - start_time))
         FROM usage_intervals WHERE end_time < ?1 GROUP BY tenant, gpu_type, class
         ON CONFLICT (tenant, gpu_type, class) DO UPDATE
             SET gpu_seconds = gpu_seconds + excluded.gpu_seconds",
        [cutoff],
    )?;
    super::exec(
        conn,
        "DELETE FROM usage_intervals WHERE end_time < ?1",
        [cutoff],
    )?;
    Ok(())
}

/// One group of a usage read; the fields not grouped by are empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub tenant: String,
    pub cluster: String,
    pub gpu_type: String,
    pub class: String,
    pub gpu_seconds: i64,
}

/// What a usage read groups by.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupBy {
    pub tenant: bool,
    pub cluster: bool,
    pub gpu_type: bool,
    pub class: bool,
}

/// GPU-seconds held in `[since, until)`, open intervals counted up to `now`, of one tenant
/// (`tenant_id`) or all, grouped by `by` and ordered by the groups; at most `limit` rows.
pub fn held(
    conn: &Connection,
    tenant_id: Option<&str>,
    since: i64,
    until: i64,
    now: i64,
    by: GroupBy,
    limit: i64,
) -> rusqlite::Result<Vec<UsageRow>> {
    let col = |on: bool, name: &'static str| if on { name } else { "''" };
    // A cluster's name is unique only within its tenant: grouping by cluster keeps the tenant.
    let cols = [
        col(by.tenant || by.cluster, "tenant"),
        col(by.cluster, "cluster"),
        col(by.gpu_type, "gpu_type"),
        col(by.class, "class"),
    ];
    let list = cols.join(", ");
    let sql = format!(
        "SELECT {list},
                SUM(gpus * (MIN(COALESCE(end_time, ?4), ?3) - MAX(start_time, ?2)))
         FROM usage_intervals
         WHERE (?1 IS NULL OR tenant_id = ?1) AND start_time < MIN(?3, ?4)
           AND COALESCE(end_time, ?4) > ?2
         GROUP BY {list} ORDER BY {list} LIMIT ?5"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map((tenant_id, since, until, now, limit), |r| {
        Ok(UsageRow {
            tenant: r.get(0)?,
            cluster: r.get(1)?,
            gpu_type: r.get(2)?,
            class: r.get(3)?,
            gpu_seconds: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Lifetime GPU-seconds per (tenant, model, class) up to `now`, pruned history included:
/// what the Prometheus counter reports.
pub fn lifetime(conn: &Connection, now: i64) -> rusqlite::Result<Vec<UsageRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT tenant, gpu_type, class, SUM(s) FROM (
             SELECT tenant, gpu_type, class,
                    gpus * (MAX(COALESCE(end_time, ?1), start_time) - start_time) AS s
             FROM usage_intervals
             UNION ALL
             SELECT tenant, gpu_type, class, gpu_seconds FROM usage_pruned)
         GROUP BY tenant, gpu_type, class ORDER BY tenant, gpu_type, class",
    )?;
    let rows = stmt.query_map([now], |r| {
        Ok(UsageRow {
            tenant: r.get(0)?,
            cluster: String::new(),
            gpu_type: r.get(1)?,
            class: r.get(2)?,
            gpu_seconds: r.get(3)?,
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::nodes::{assign, release};

    const T0: i64 = 1_900_000_000;

    fn open(path: &std::path::Path) -> Connection {
        crate::store::open(path).unwrap()
    }

    /// A store with tenants `a` (quota: 8 guaranteed H100s) and `b` (none), clusters
    /// `a1`, `a2` (preemptible) of `a` and `b1` of `b`, and 8-GPU nodes `p1`..`p4` (pool)
    /// and `d1` (on-demand).
    fn seed(conn: &Connection) {
        conn.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('a', 'team-a', '', '{}', 'ha', 0), ('b', 'team-b', '', '{}', 'hb', 0);
             INSERT INTO quotas (id, tenant_id, gpu_type, gpus, burst_gpus)
                 VALUES ('q', 'a', 'H100-80GB', 8, 16);",
        )
        .unwrap();
        for (id, tenant) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            conn.execute(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                 VALUES (?1, ?2, ?1, 'kubernetes', 'H100-80GB', 1, 1, 'running', '', '', '', '{}')",
                [id, tenant],
            )
            .unwrap();
        }
        crate::store::preemption::insert(conn, "a2", false).unwrap();
        for (id, capacity) in [
            ("p1", "pool"),
            ("p2", "pool"),
            ("p3", "pool"),
            ("p4", "pool"),
            ("d1", "on-demand"),
        ] {
            conn.execute(
                "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                    cuda_version, state)
                 VALUES (?1, ?1, 'H100-80GB', ?2, 8, '550', '12.4', 'ready')",
                [id, capacity],
            )
            .unwrap();
        }
    }

    fn all() -> GroupBy {
        GroupBy {
            tenant: true,
            cluster: true,
            gpu_type: true,
            class: true,
        }
    }

    fn total(conn: &Connection, tenant: Option<&str>, since: i64, until: i64, now: i64) -> i64 {
        held(conn, tenant, since, until, now, GroupBy::default(), 100)
            .unwrap()
            .iter()
            .map(|r| r.gpu_seconds)
            .sum()
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
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("state.db"));
        seed(&conn);
        // a1 created with one pool node at T0: within a's guarantee.
        assert!(assign(&conn, "p1", "a1", T0).unwrap());
        // Grown by a pool node and an on-demand node at T0 + 100: past the guarantee.
        assert!(assign(&conn, "p2", "a1", T0 + 100).unwrap());
        assert!(assign(&conn, "d1", "a1", T0 + 100).unwrap());
        // The preemptible a2 borrows p3 from T0 + 50; b1 holds p4 from T0.
        assert!(assign(&conn, "p3", "a2", T0 + 50).unwrap());
        assert!(assign(&conn, "p4", "b1", T0).unwrap());
        // Shrunk at T0 + 300; deleted at T0 + 1000.
        release(&conn, "d1", T0 + 300).unwrap();
        release(&conn, "p2", T0 + 1000).unwrap();
        release(&conn, "p1", T0 + 1000).unwrap();
        release(&conn, "p3", T0 + 1000).unwrap();
        let rows = held(&conn, None, T0 - 10, T0 + 2000, T0 + 5000, all(), 100).unwrap();
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
            total(&conn, Some("a"), T0 + 200, T0 + 400, T0 + 5000),
            8 * (200 + 200 + 100 + 200)
        );
        assert_eq!(
            total(&conn, Some("b"), T0 + 200, T0 + 400, T0 + 5000),
            8 * 200
        );
        // Open intervals count up to now, never past it.
        assert_eq!(total(&conn, Some("b"), T0, T0 + 9000, T0 + 30), 8 * 30);
        // Grouped by nothing, or by model only: the same total.
        let by_model = GroupBy {
            gpu_type: true,
            ..GroupBy::default()
        };
        let rows = held(&conn, None, T0, T0 + 2000, T0 + 5000, by_model, 100).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].gpu_type, "H100-80GB");
        assert_eq!(
            rows[0].gpu_seconds,
            total(&conn, None, T0, T0 + 2000, T0 + 5000)
        );
    }

    /// A restart between the create and the delete: the total is what one process would
    /// have counted, with no second counted twice and none missing.
    #[test]
    fn a_restart_in_the_middle_neither_double_counts_nor_leaves_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let conn = open(&path);
            seed(&conn);
            assert!(assign(&conn, "p1", "a1", T0).unwrap());
            assert_eq!(total(&conn, Some("a"), T0, T0 + 10_000, T0 + 400), 8 * 400);
        }
        // Down from T0 + 400 to T0 + 700: the node stays held by the allocation records.
        let conn = open(&path);
        assert_eq!(total(&conn, Some("a"), T0, T0 + 10_000, T0 + 700), 8 * 700);
        assert!(assign(&conn, "p2", "a1", T0 + 700).unwrap());
        release(&conn, "p1", T0 + 1000).unwrap();
        drop(conn);
        let conn = open(&path);
        release(&conn, "p2", T0 + 1200).unwrap();
        assert_eq!(
            total(&conn, Some("a"), T0, T0 + 10_000, T0 + 9000),
            8 * 1000 + 8 * 500
        );
        // Releasing again (a retried delete) adds nothing.
        release(&conn, "p2", T0 + 5000).unwrap();
        assert_eq!(
            total(&conn, Some("a"), T0, T0 + 10_000, T0 + 9000),
            8 * 1000 + 8 * 500
        );
    }

    /// A rolled-back assignment leaves no interval: usage is written in its transaction.
    #[test]
    fn usage_follows_the_transaction_of_the_holding() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir.path().join("state.db"));
        seed(&conn);
        let tx = conn.transaction().unwrap();
        assert!(assign(&tx, "p1", "a1", T0).unwrap());
        tx.rollback().unwrap();
        assert_eq!(total(&conn, None, T0, T0 + 100, T0 + 100), 0);
    }

    /// Intervals past the retention leave the reads but stay in the lifetime totals.
    #[test]
    fn pruning_keeps_lifetime_totals_whole() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("state.db"));
        seed(&conn);
        assert!(assign(&conn, "p4", "b1", T0).unwrap());
        release(&conn, "p4", T0 + 10).unwrap();
        assert!(assign(&conn, "p4", "b1", T0 + RETENTION_SECS + 20).unwrap());
        let now = T0 + RETENTION_SECS + 30;
        let before = lifetime(&conn, now).unwrap();
        assert_eq!(before[0].gpu_seconds, 8 * 10 + 8 * 10);
        release(&conn, "p4", now).unwrap(); // prunes the first interval
        assert_eq!(total(&conn, None, T0, now, now), 8 * 10);
        assert_eq!(lifetime(&conn, now).unwrap(), before);
        assert_eq!(lifetime(&conn, now + 50).unwrap(), before);
    }
}
