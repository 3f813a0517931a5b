//! GPU-seconds held, per tenant, cluster, GPU model, capacity class and MIG profile
//! (issue 42), from the control plane's own allocation records: intervals per node a
//! cluster holds, opened by [`open`] in the transaction that assigns the node and closed
//! by [`close`] in the one that releases it. A read counts closed intervals as written and open ones up
//! to its `now`, so a restart neither double counts nor leaves a gap: there is no sampler.
//!
//! GPU-seconds used come from the node agents' utilisation readings ([`record_used`]):
//! each reading of a held node adds, to every interval of the node it falls in, the
//! GPUs' busy fraction times the time since the interval's previous reading, at most the
//! heartbeat gap limit (a silence is not counted as use). The sums are kept per group and
//! hour in `usage_used`, with the GPU-time the readings covered (`measured`): a group
//! whose GPUs report no utilisation (NVML under MIG) has none, and reads as not
//! reported, never as 0. The interval's `used_through` is written in the same
//! transaction, so a reading is counted once, whatever restarts.
//!
//! A cluster with a MIG layout holds its nodes' GPUs whole, cut into its layout's
//! instances: each node has an interval per class and profile ([`profile_shares`]) that
//! counts the instances (`slices`, so slice-seconds) and its part of the GPUs
//! (`share_840ths`: the profile's memory slices over those the layout occupies, in 840ths
//! of a GPU, which every part of 1..=8 memory slices divides exactly), so the profiles of
//! a node add up to its GPUs and GPU-seconds stay whole GPUs held, as quotas count them.
//! Whole GPUs are the profile [`WHOLE_GPUS`] with no slices.
//!
//! History is bounded: intervals that ended more than [`RETENTION_SECS`] ago are pruned
//! when a node is released, and hours of readings as old when readings are recorded,
//! their seconds carried into `usage_pruned` so the lifetime totals behind the
//! Prometheus counters never go down.
//!
//! The statements run on SQLite and PostgreSQL (`gpufleet_sql`, issue 41). What differs:
//! text is compared bytewise on both ([`bytewise`]: groups in order, the name a tenant's
//! rows are read under), and an hour cut by a read's window is counted in doubles on
//! SQLite and exactly (NUMERIC) on PostgreSQL ([`used`]). An interval's `id` is only a
//! handle (never a cursor), so PostgreSQL's identity column numbers it.

use std::collections::BTreeMap;

use gpufleet_gpu::catalog;
use gpufleet_sql::{params, AsConn, Conn, Engine, Row};

/// How long closed intervals are kept: 400 days (part of the API's contract).
pub const RETENTION_SECS: i64 = gpufleet_proto::limits::USAGE_RETENTION_SECS;

/// The capacity classes admission distinguishes.
pub const GUARANTEED: &str = "guaranteed";
pub const BURST: &str = "burst";
pub const BORROWED_PREEMPTIBLE: &str = "borrowed-preemptible";
pub const ON_DEMAND: &str = "on-demand";

/// The MIG profile of whole GPUs (no layout): never a profile's name.
pub const WHOLE_GPUS: &str = "none";

/// A GPU's part a share counts in: 840 is divisible by every count of memory slices a
/// layout can occupy (1 to 8), so each profile's part is a whole number of them.
pub const SHARE_UNITS: i64 = 840;

/// One MIG profile of a cluster's layout, as a held GPU is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileShare {
    pub profile: String,
    /// Instances of the profile on each GPU.
    pub per_gpu: i64,
    /// The profile's part of each GPU, in [`SHARE_UNITS`]: its instances' memory slices
    /// over the memory slices the whole layout occupies.
    pub share: i64,
}

/// How each GPU of a cluster of `gpu_type` with `layout` (profile -> instances per GPU,
/// as the cluster row keeps it) is counted: one whole GPU ([`WHOLE_GPUS`]) without a
/// layout, else each profile's instances and part; the parts add up to the whole GPU. A
/// profile the catalog does not know (the layout was checked when written) counts as one
/// memory slice per instance.
pub fn profile_shares(gpu_type: &str, layout: &BTreeMap<String, u32>) -> Vec<ProfileShare> {
    let model = catalog::model(gpu_type);
    let parts: Vec<(String, i64, i64)> = layout
        .iter()
        .filter(|&(_, &n)| n > 0)
        .map(|(name, &n)| {
            let memory = model
                .and_then(|m| m.profile(name))
                .map_or(1, |p| i64::from(p.memory_slices));
            (name.clone(), i64::from(n), memory * i64::from(n))
        })
        .collect();
    let occupied: i64 = parts.iter().map(|p| p.2).sum();
    if occupied == 0 {
        return vec![ProfileShare {
            profile: WHOLE_GPUS.to_string(),
            per_gpu: 0,
            share: SHARE_UNITS,
        }];
    }
    // Exact when `occupied` divides 840; otherwise (an unknown profile) the remainder
    // goes to the last part, so the parts still add up to the whole GPU.
    let mut shares: Vec<ProfileShare> = parts
        .iter()
        .map(|(profile, per_gpu, memory)| ProfileShare {
            profile: profile.clone(),
            per_gpu: *per_gpu,
            share: memory * SHARE_UNITS / occupied,
        })
        .collect();
    let counted: i64 = shares.iter().map(|s| s.share).sum();
    if let Some(last) = shares.last_mut() {
        last.share += SHARE_UNITS - counted;
    }
    shares
}

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

/// `column` compared by its bytes, as SQLite compares text and as `String` orders:
/// PostgreSQL compares by the database's collation unless told `"C"`.
fn bytewise(c: Conn<'_>, column: &str) -> String {
    match c.engine() {
        Engine::Sqlite => column.to_string(),
        Engine::Postgres => format!("{column} COLLATE \"C\""),
    }
}

/// Opens the intervals of `node_id`, just assigned to `cluster_id`, at `t`.
pub fn open(
    conn: &impl AsConn,
    node_id: &str,
    cluster_id: &str,
    t: i64,
) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    let found = c.query_opt(
        "SELECT c.tenant_id, t.name, c.name, n.gpu_type, n.capacity <> 'pool', n.gpu_count,
                EXISTS (SELECT 1 FROM cluster_preemption p WHERE p.cluster_id = c.id),
                COALESCE((SELECT q.gpus FROM quotas q
                          WHERE q.tenant_id = c.tenant_id AND q.gpu_type = n.gpu_type), 0),
                c.mig_layout
         FROM nodes n JOIN clusters c ON c.id = ?2 JOIN tenants t ON t.id = c.tenant_id
         WHERE n.id = ?1",
        params![node_id, cluster_id],
        |r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<String>(1)?,
                r.get::<String>(2)?,
                r.get::<String>(3)?,
                r.get::<bool>(4)?,
                r.get::<i64>(5)?,
                r.get::<bool>(6)?,
                r.get::<i64>(7)?,
                r.get::<String>(8)?,
            ))
        },
    )?;
    let Some((tenant_id, tenant, cluster, gpu_type, on_demand, gpus, preemptible, quota, layout)) =
        found
    else {
        return Ok(());
    };
    // A node's profiles repeat its GPUs, each with its part: their parts add up to them.
    let guaranteed_held: i64 = c.query_row(
        "SELECT COALESCE(CAST(SUM(gpus * share_840ths) AS BIGINT), 0) / 840 FROM usage_intervals
         WHERE end_time IS NULL AND tenant_id = ?1 AND gpu_type = ?2 AND class = 'guaranteed'",
        params![tenant_id, gpu_type],
        |r| r.get(0),
    )?;
    let shares = profile_shares(&gpu_type, &super::from_json(&layout));
    for (class, n) in classify(on_demand, preemptible, gpus, quota, guaranteed_held) {
        let by = Holder {
            node: node_id,
            tenant_id: &tenant_id,
            tenant: &tenant,
            cluster: &cluster,
            gpu_type: &gpu_type,
            class,
        };
        for s in &shares {
            open_interval(c, &by, n, t, s)?;
        }
    }
    Ok(())
}

/// Who holds a node's GPUs in a usage interval, and in which class.
struct Holder<'a> {
    node: &'a str,
    tenant_id: &'a str,
    tenant: &'a str,
    cluster: &'a str,
    gpu_type: &'a str,
    class: &'a str,
}

/// Opens at `t` the interval of `gpus` GPUs held by `by`, counted under the profile `s`.
fn open_interval(
    c: Conn<'_>,
    by: &Holder,
    gpus: i64,
    t: i64,
    s: &ProfileShare,
) -> gpufleet_sql::Result<()> {
    c.execute(
        "INSERT INTO usage_intervals
             (node_id, tenant_id, tenant, cluster, gpu_type, class, gpus, start_time,
              mig_profile, slices, share_840ths)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            by.node,
            by.tenant_id,
            by.tenant,
            by.cluster,
            by.gpu_type,
            by.class,
            gpus,
            t,
            s.profile,
            gpus * s.per_gpu,
            s.share
        ],
    )?;
    Ok(())
}

/// Cuts the GPUs `cluster_id`'s nodes hold into its layout as recorded now, from `t`:
/// where a node's open intervals count other profiles (its layout changed), they close
/// at `t` and the same GPUs of the same classes open again cut into the new profiles. A
/// node whose intervals already count the layout is left alone, so calling it when the
/// layout did not change writes nothing. Run in the transaction that records the layout.
pub fn relayout(conn: &impl AsConn, cluster_id: &str, t: i64) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    let found: Option<(String, String)> = c.query_opt(
        "SELECT gpu_type, mig_layout FROM clusters WHERE id = ?1",
        params![cluster_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let Some((gpu_type, layout)) = found else {
        return Ok(());
    };
    let shares = profile_shares(&gpu_type, &super::from_json(&layout));
    // Each node's open intervals: (node, tenant id, tenant, cluster, model, class, GPUs,
    // profile, slices, share).
    type Open = (
        String,
        String,
        String,
        String,
        String,
        String,
        i64,
        String,
        i64,
        i64,
    );
    let open: Vec<Open> = c.query_map(
        "SELECT node_id, tenant_id, tenant, cluster, gpu_type, class, gpus, mig_profile,
                slices, share_840ths
         FROM usage_intervals
         WHERE end_time IS NULL
           AND node_id IN (SELECT id FROM nodes WHERE cluster_id = ?1)
         ORDER BY node_id, class, mig_profile",
        params![cluster_id],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        },
    )?;
    let mut nodes: BTreeMap<&str, Vec<&Open>> = BTreeMap::new();
    for o in &open {
        nodes.entry(o.0.as_str()).or_default().push(o);
    }
    for (node, intervals) in nodes {
        // What the node's intervals count now, against what the layout cuts.
        let counted: std::collections::BTreeSet<(&str, i64, i64)> = intervals
            .iter()
            .map(|o| (o.7.as_str(), o.8 / o.6.max(1), o.9))
            .collect();
        let wanted: std::collections::BTreeSet<(&str, i64, i64)> = shares
            .iter()
            .map(|s| (s.profile.as_str(), s.per_gpu, s.share))
            .collect();
        if counted == wanted {
            continue;
        }
        // An interval opened at `t` (this transaction's assignment) counted nothing yet.
        c.execute(
            "DELETE FROM usage_intervals WHERE node_id = ?1 AND end_time IS NULL AND start_time >= ?2",
            params![node, t],
        )?;
        c.execute(
            "UPDATE usage_intervals SET end_time = ?2 WHERE node_id = ?1 AND end_time IS NULL",
            params![node, t],
        )?;
        // The node's classes once each (its profiles repeat them).
        let classes: std::collections::BTreeSet<(&str, &str, &str, &str, &str, i64)> = intervals
            .iter()
            .map(|o| {
                (
                    o.1.as_str(),
                    o.2.as_str(),
                    o.3.as_str(),
                    o.4.as_str(),
                    o.5.as_str(),
                    o.6,
                )
            })
            .collect();
        for (tenant_id, tenant, cluster, gpu_type, class, gpus) in classes {
            let by = Holder {
                node,
                tenant_id,
                tenant,
                cluster,
                gpu_type,
                class,
            };
            for s in &shares {
                open_interval(c, &by, gpus, t, s)?;
            }
        }
    }
    Ok(())
}

/// Closes the open intervals of `node_id` at `t` (never before they opened), and prunes
/// what ended past the retention.
pub fn close(conn: &impl AsConn, node_id: &str, t: i64) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    c.execute(
        "UPDATE usage_intervals SET end_time = CASE WHEN start_time > ?2 THEN start_time ELSE ?2 END
         WHERE node_id = ?1 AND end_time IS NULL",
        params![node_id, t],
    )?;
    prune(&c, t)
}

/// Moves intervals that ended more than [`RETENTION_SECS`] before `t` into the
/// per-(tenant, model, MIG profile, class) totals, so lifetime totals stay whole (held
/// time in [`SHARE_UNITS`] of GPU-seconds, so that no part is rounded away).
pub fn prune(conn: &impl AsConn, t: i64) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    let cutoff = t - RETENTION_SECS;
    // The totals' columns are named with their table in the updates: PostgreSQL reads a
    // bare one as ambiguous with `excluded`'s.
    let tenant = bytewise(c, "tenant");
    c.execute(
        &format!(
            "INSERT INTO usage_pruned (tenant_id, tenant, gpu_type, mig_profile, class,
                                       gpu_seconds_840ths, slice_seconds)
             SELECT tenant_id, MAX({tenant}), gpu_type, mig_profile, class,
                    CAST(SUM(gpus * share_840ths * (end_time - start_time)) AS BIGINT),
                    CAST(SUM(slices * (end_time - start_time)) AS BIGINT)
             FROM usage_intervals WHERE end_time < ?1
             GROUP BY tenant_id, gpu_type, mig_profile, class
             ON CONFLICT (tenant_id, gpu_type, mig_profile, class) DO UPDATE
                 SET gpu_seconds_840ths = usage_pruned.gpu_seconds_840ths + excluded.gpu_seconds_840ths,
                     slice_seconds = usage_pruned.slice_seconds + excluded.slice_seconds"
        ),
        params![cutoff],
    )?;
    c.execute(
        "DELETE FROM usage_intervals WHERE end_time < ?1",
        params![cutoff],
    )?;
    c.execute(
        &format!(
            "INSERT INTO usage_pruned (tenant_id, tenant, gpu_type, mig_profile, class,
                                       gpu_seconds_840ths, slice_seconds, used_ms, measured_ms)
             SELECT tenant_id, MAX({tenant}), gpu_type, mig_profile, class, 0, 0,
                    CAST(SUM(used_ms) AS BIGINT), CAST(SUM(measured_ms) AS BIGINT)
             FROM usage_used WHERE last_t < ?1 GROUP BY tenant_id, gpu_type, mig_profile, class
             ON CONFLICT (tenant_id, gpu_type, mig_profile, class) DO UPDATE
                 SET used_ms = usage_pruned.used_ms + excluded.used_ms,
                     measured_ms = usage_pruned.measured_ms + excluded.measured_ms"
        ),
        params![cutoff],
    )?;
    c.execute("DELETE FROM usage_used WHERE last_t < ?1", params![cutoff])?;
    Ok(())
}

/// One group of a usage read; the fields not grouped by are empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub tenant: String,
    pub cluster: String,
    pub gpu_type: String,
    pub class: String,
    /// A MIG profile's name, or [`WHOLE_GPUS`].
    pub mig_profile: String,
    /// Whole GPUs held, a MIG profile's part of them included, rounded to seconds.
    pub gpu_seconds: i64,
    /// MIG instances held times seconds (0 for whole GPUs).
    pub slice_seconds: i64,
}

/// What a usage read groups by.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupBy {
    pub tenant: bool,
    pub cluster: bool,
    pub gpu_type: bool,
    pub class: bool,
    pub mig_profile: bool,
}

/// A read's groups: its first five columns, grouped and ordered by their places
/// (PostgreSQL refuses a bare `''` in GROUP BY and ORDER BY; a place is the same on
/// both).
const GROUPS: &str = "GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5";

impl GroupBy {
    /// The SQL list of the grouped columns, `''` for those not grouped by, each ordered
    /// bytewise. A cluster's name is unique only within its tenant: grouping by cluster
    /// keeps the tenant.
    fn columns(&self, c: Conn<'_>) -> String {
        let col = |on: bool, name: &'static str| {
            if on {
                bytewise(c, name)
            } else {
                "''".to_string()
            }
        };
        [
            col(self.tenant || self.cluster, "tenant"),
            col(self.cluster, "cluster"),
            col(self.gpu_type, "gpu_type"),
            col(self.class, "class"),
            col(self.mig_profile, "mig_profile"),
        ]
        .join(", ")
    }
}

/// GPU-seconds held in `[since, until)`, open intervals counted up to `now`, of one tenant
/// (`tenant_id`) or all, grouped by `by` and ordered by the groups; at most `limit` rows.
pub fn held(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    since: i64,
    until: i64,
    now: i64,
    by: GroupBy,
    limit: i64,
) -> gpufleet_sql::Result<Vec<UsageRow>> {
    let c = conn.as_conn();
    let list = by.columns(c);
    // Each interval's part of the window: from the later of its start and `since` (?2)
    // to the earliest of its end (or `now`, ?4) and `until` (?3); intervals that start
    // before the earlier of `until` and `now` (?6).
    let to = "CASE WHEN COALESCE(end_time, ?4) < ?3 THEN COALESCE(end_time, ?4) ELSE ?3 END";
    let from = "CASE WHEN start_time > ?2 THEN start_time ELSE ?2 END";
    let sql = format!(
        "SELECT {list},
                (CAST(SUM(gpus * share_840ths * ({to} - {from})) AS BIGINT) + 420) / 840,
                CAST(SUM(slices * ({to} - {from})) AS BIGINT)
         FROM usage_intervals
         WHERE (CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1) AND start_time < ?6
           AND COALESCE(end_time, ?4) > ?2
         {GROUPS} LIMIT ?5"
    );
    c.query_map(
        &sql,
        params![tenant_id, since, until, now, limit, until.min(now)],
        |r| {
            Ok(UsageRow {
                tenant: r.get(0)?,
                cluster: r.get(1)?,
                gpu_type: r.get(2)?,
                class: r.get(3)?,
                mig_profile: r.get(4)?,
                gpu_seconds: r.get(5)?,
                slice_seconds: r.get(6)?,
            })
        },
    )
}

/// A tenant's lifetime GPU-seconds of one model, MIG profile and class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifetime {
    pub tenant_id: String,
    pub tenant: String,
    pub gpu_type: String,
    pub class: String,
    /// A MIG profile's name, or [`WHOLE_GPUS`].
    pub mig_profile: String,
    pub gpu_seconds: i64,
    /// MIG instance-seconds (0 for whole GPUs).
    pub slice_seconds: i64,
}

/// The ORDER BY of a lifetime read: by tenant, model, class and profile, bytewise.
fn lifetime_order(c: Conn<'_>) -> String {
    ["tenant_id", "gpu_type", "class", "mig_profile"]
        .map(|col| bytewise(c, col))
        .join(", ")
}

/// Lifetime GPU-seconds per (tenant, model, MIG profile, class) up to `now`, pruned
/// history included, of one tenant or all: what the Prometheus counters report (they
/// never go down: held time is summed in parts of a GPU and rounded once).
pub fn lifetime(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    now: i64,
) -> gpufleet_sql::Result<Vec<Lifetime>> {
    let c = conn.as_conn();
    let (tenant, order) = (bytewise(c, "tenant"), lifetime_order(c));
    let end = "CASE WHEN COALESCE(end_time, ?1) > start_time THEN COALESCE(end_time, ?1) ELSE start_time END";
    let sql = format!(
        "SELECT tenant_id, MAX({tenant}), gpu_type, class, mig_profile,
                (CAST(SUM(s) AS BIGINT) + 420) / 840, CAST(SUM(slice_s) AS BIGINT) FROM (
             SELECT tenant_id, tenant, gpu_type, class, mig_profile,
                    gpus * share_840ths * ({end} - start_time) AS s,
                    slices * ({end} - start_time) AS slice_s
             FROM usage_intervals WHERE CAST(?2 AS TEXT) IS NULL OR tenant_id = ?2
             UNION ALL
             SELECT tenant_id, tenant, gpu_type, class, mig_profile, gpu_seconds_840ths,
                    slice_seconds
             FROM usage_pruned WHERE CAST(?2 AS TEXT) IS NULL OR tenant_id = ?2) AS parts
         GROUP BY tenant_id, gpu_type, mig_profile, class
         ORDER BY {order}"
    );
    c.query_map(&sql, params![now, tenant_id], |r| {
        Ok(Lifetime {
            tenant_id: r.get(0)?,
            tenant: r.get(1)?,
            gpu_type: r.get(2)?,
            class: r.get(3)?,
            mig_profile: r.get(4)?,
            gpu_seconds: r.get(5)?,
            slice_seconds: r.get(6)?,
        })
    })
}

/// One utilisation reading of a node, as the control plane received it at `t`: `reported`
/// of its GPUs said how busy they were, `busy_percent` is the sum of their percentages
/// (each 0..=100). A reading of none of them (`reported` 0) measures nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub t: i64,
    pub reported: u32,
    pub busy_percent: u32,
}

const HOUR: i64 = 3600;

/// A group of used time: tenant id, tenant, cluster, model, class, MIG profile.
type UsedKey = (String, String, String, String, String, String);

/// A usage interval a node's readings fall in.
struct Covered {
    id: i64,
    key: UsedKey,
    gpus: i64,
    /// Its part of each of those GPUs, in [`SHARE_UNITS`].
    share: i64,
    end: Option<i64>,
    /// Counted up to here: its last reading counted, or its start.
    through: i64,
    /// The node's GPUs: the interval's share of a reading is `gpus / node_gpus`.
    node_gpus: i64,
}

fn covered(r: &Row) -> gpufleet_sql::Result<Covered> {
    Ok(Covered {
        id: r.get(0)?,
        key: (
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ),
        gpus: r.get(7)?,
        share: r.get(8)?,
        end: r.get(9)?,
        through: r.get(10)?,
        node_gpus: r.get(11)?,
    })
}

/// What one flush adds to a group's hour.
#[derive(Default)]
struct Added {
    used_ms: i64,
    measured_ms: i64,
    first: i64,
    last: i64,
}

/// `num / den` rounded half up (both positive).
fn share(num: i64, den: i64) -> i64 {
    (num + den / 2) / den.max(1)
}

/// Counts `readings` of `node_id` (any order) as GPU-seconds used by the intervals of
/// the node they fall in: each reading, to each interval held when it came, its
/// utilisation times the seconds since that interval's previous reading (or its start),
/// at most `max_gap` seconds and never past the interval's end; the interval's share of a
/// node split between classes is its GPUs over the node's. A reading no later than an
/// interval's last one counted adds nothing to it (a restart cannot count one twice).
pub fn record_used(
    conn: &impl AsConn,
    node_id: &str,
    readings: &[Reading],
    max_gap: i64,
) -> gpufleet_sql::Result<()> {
    let c = conn.as_conn();
    let mut readings = readings.to_vec();
    readings.sort_by_key(|r| r.t);
    let Some(first) = readings.first().map(|r| r.t) else {
        return Ok(());
    };
    let max_gap = max_gap.max(1);
    let covered: Vec<Covered> = c.query_map(
        "SELECT i.id, i.tenant_id, i.tenant, i.cluster, i.gpu_type, i.class, i.mig_profile,
                i.gpus, i.share_840ths, i.end_time,
                CASE WHEN COALESCE(i.used_through, i.start_time) > i.start_time
                     THEN COALESCE(i.used_through, i.start_time) ELSE i.start_time END,
                CASE WHEN COALESCE(n.gpu_count, 0) > i.gpus
                     THEN COALESCE(n.gpu_count, 0) ELSE i.gpus END
         FROM usage_intervals i LEFT JOIN nodes n ON n.id = i.node_id
         WHERE i.node_id = ?1 AND (i.end_time IS NULL OR i.end_time > ?2)",
        params![node_id, first - max_gap],
        covered,
    )?;
    let mut added: BTreeMap<(UsedKey, i64), Added> = BTreeMap::new();
    for cov in covered {
        let mut through = cov.through;
        for r in &readings {
            if r.t <= through {
                continue;
            }
            let from = through.max(r.t - max_gap);
            let to = cov.end.map_or(r.t, |e| e.min(r.t));
            through = r.t;
            let mut a = from;
            while r.reported > 0 && a < to {
                let hour = a - a.rem_euclid(HOUR);
                let b = to.min(hour + HOUR);
                let secs = b - a;
                let sum = added.entry((cov.key.clone(), hour)).or_insert(Added {
                    first: a,
                    last: b,
                    ..Added::default()
                });
                // The interval's GPUs' part of the node's.
                let (num, den) = (cov.gpus * cov.share, cov.node_gpus * SHARE_UNITS);
                sum.used_ms += share(num * i64::from(r.busy_percent) * secs * 10, den);
                sum.measured_ms += share(num * i64::from(r.reported) * secs * 1000, den);
                sum.first = sum.first.min(a);
                sum.last = sum.last.max(b);
                a = b;
            }
        }
        if through != cov.through {
            c.execute(
                "UPDATE usage_intervals SET used_through = ?2 WHERE id = ?1",
                params![cov.id, through],
            )?;
        }
    }
    for ((key, hour), a) in added {
        let (tenant_id, tenant, cluster, gpu_type, class, mig_profile) = key;
        // The hour's columns are named with their table: PostgreSQL reads a bare one as
        // ambiguous with `excluded`'s.
        c.execute(
            "INSERT INTO usage_used (tenant_id, tenant, cluster, gpu_type, class, mig_profile,
                                     hour, used_ms, measured_ms, first_t, last_t)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
             ON CONFLICT (tenant_id, cluster, gpu_type, class, mig_profile, hour) DO UPDATE
                 SET used_ms = usage_used.used_ms + excluded.used_ms,
                     measured_ms = usage_used.measured_ms + excluded.measured_ms,
                     first_t = CASE WHEN usage_used.first_t < excluded.first_t
                                    THEN usage_used.first_t ELSE excluded.first_t END,
                     last_t = CASE WHEN usage_used.last_t > excluded.last_t
                                   THEN usage_used.last_t ELSE excluded.last_t END",
            params![
                tenant_id,
                tenant,
                cluster,
                gpu_type,
                class,
                mig_profile,
                hour,
                a.used_ms,
                a.measured_ms,
                a.first,
                a.last
            ],
        )?;
    }
    Ok(())
}

/// GPU-time used and measured of one group of a usage read, in GPU-milliseconds; the
/// fields not grouped by are empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsedRow {
    pub tenant: String,
    pub cluster: String,
    pub gpu_type: String,
    pub class: String,
    pub mig_profile: String,
    pub used_ms: i64,
    pub measured_ms: i64,
}

/// GPU-time used in `[since, until)` of one tenant or all, grouped as [`held`] groups:
/// exact for hours wholly inside the window; an hour cut by the window counts the part of
/// its readings' span inside it, pro rata. Only groups with readings are returned.
///
/// The pro rata parts are summed and rounded half away from zero on both engines, but
/// SQLite computes them in doubles and PostgreSQL exactly (`1.0` is a NUMERIC there): the
/// two can differ by a millisecond where a double's error crosses a half.
pub fn used(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
    since: i64,
    until: i64,
    by: GroupBy,
    limit: i64,
) -> gpufleet_sql::Result<Vec<UsedRow>> {
    let c = conn.as_conn();
    let list = by.columns(c);
    let part = |col: &str| {
        format!(
            "CASE WHEN first_t >= ?2 AND last_t <= ?3 THEN {col}
                  ELSE {col} * (CASE WHEN last_t < ?3 THEN last_t ELSE ?3 END
                                - CASE WHEN first_t > ?2 THEN first_t ELSE ?2 END)
                       * 1.0 / (last_t - first_t) END"
        )
    };
    let (used_part, measured_part) = (part("used_ms"), part("measured_ms"));
    let sql = format!(
        "SELECT {list}, CAST(ROUND(SUM({used_part})) AS BIGINT),
                CAST(ROUND(SUM({measured_part})) AS BIGINT)
         FROM usage_used
         WHERE (CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1) AND first_t < ?3 AND last_t > ?2
         {GROUPS} LIMIT ?4"
    );
    c.query_map(&sql, params![tenant_id, since, until, limit], |r| {
        Ok(UsedRow {
            tenant: r.get(0)?,
            cluster: r.get(1)?,
            gpu_type: r.get(2)?,
            class: r.get(3)?,
            mig_profile: r.get(4)?,
            used_ms: r.get(5)?,
            measured_ms: r.get(6)?,
        })
    })
}

/// A tenant's lifetime GPU-time used and measured of one model, class and MIG profile
/// (milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifetimeUsed {
    pub tenant_id: String,
    pub tenant: String,
    pub gpu_type: String,
    pub class: String,
    pub mig_profile: String,
    pub used_ms: i64,
    pub measured_ms: i64,
}

/// Lifetime GPU-time used per (tenant, model, MIG profile, class), pruned history
/// included, of one tenant or all; only where readings measured some (a model and class
/// whose GPUs report no utilisation has no row: not reported).
pub fn lifetime_used(
    conn: &impl AsConn,
    tenant_id: Option<&str>,
) -> gpufleet_sql::Result<Vec<LifetimeUsed>> {
    let c = conn.as_conn();
    let (tenant, order) = (bytewise(c, "tenant"), lifetime_order(c));
    let sql = format!(
        "SELECT tenant_id, MAX({tenant}), gpu_type, class, mig_profile,
                CAST(SUM(used_ms) AS BIGINT), CAST(SUM(measured_ms) AS BIGINT) FROM (
             SELECT tenant_id, tenant, gpu_type, class, mig_profile, used_ms, measured_ms
             FROM usage_used WHERE CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1
             UNION ALL
             SELECT tenant_id, tenant, gpu_type, class, mig_profile, used_ms, measured_ms
             FROM usage_pruned WHERE CAST(?1 AS TEXT) IS NULL OR tenant_id = ?1) AS parts
         GROUP BY tenant_id, gpu_type, mig_profile, class HAVING SUM(measured_ms) > 0
         ORDER BY {order}"
    );
    c.query_map(&sql, params![tenant_id], |r| {
        Ok(LifetimeUsed {
            tenant_id: r.get(0)?,
            tenant: r.get(1)?,
            gpu_type: r.get(2)?,
            class: r.get(3)?,
            mig_profile: r.get(4)?,
            used_ms: r.get(5)?,
            measured_ms: r.get(6)?,
        })
    })
}
