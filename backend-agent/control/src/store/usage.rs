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

/// How long closed intervals are kept: 400 days (part of the API's contract).
pub const RETENTION_SECS: i64 = gpufleet_proto::limits::USAGE_RETENTION_SECS;

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
        "INSERT INTO usage_pruned (tenant_id, tenant, gpu_type, class, gpu_seconds)
         SELECT tenant_id, MAX(tenant), gpu_type, class, SUM(gpus * (end_time - start_time))
         FROM usage_intervals WHERE end_time < ?1 GROUP BY tenant_id, gpu_type, class
         ON CONFLICT (tenant_id, gpu_type, class) DO UPDATE
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

/// A tenant's lifetime GPU-seconds of one model and class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifetime {
    pub tenant_id: String,
    pub tenant: String,
    pub gpu_type: String,
    pub class: String,
    pub gpu_seconds: i64,
}

/// Lifetime GPU-seconds per (tenant, model, class) up to `now`, pruned history included:
/// what the Prometheus counter reports (it never goes down).
pub fn lifetime(conn: &Connection, now: i64) -> rusqlite::Result<Vec<Lifetime>> {
    let mut stmt = conn.prepare_cached(
        "SELECT tenant_id, MAX(tenant), gpu_type, class, SUM(s) FROM (
             SELECT tenant_id, tenant, gpu_type, class,
                    gpus * (MAX(COALESCE(end_time, ?1), start_time) - start_time) AS s
             FROM usage_intervals
             UNION ALL
             SELECT tenant_id, tenant, gpu_type, class, gpu_seconds FROM usage_pruned)
         GROUP BY tenant_id, gpu_type, class ORDER BY tenant_id, gpu_type, class",
    )?;
    let rows = stmt.query_map([now], |r| {
        Ok(Lifetime {
            tenant_id: r.get(0)?,
            tenant: r.get(1)?,
            gpu_type: r.get(2)?,
            class: r.get(3)?,
            gpu_seconds: r.get(4)?,
        })
    })?;
    rows.collect()
}
