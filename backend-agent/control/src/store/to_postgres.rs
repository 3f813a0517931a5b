//! `gpufleet-agent migrate`: an SQLite store copied whole into an empty PostgreSQL
//! database (issue 41). One snapshot of the SQLite file is read; PostgreSQL's schema is
//! made (`store::postgres`) and every table is written in one transaction, parents before
//! the tables that refer to them, so that a copy that fails half-way leaves the database
//! empty. The counters that triggers keep (`model_nodes`, `tenant_reservations`) are not
//! copied: PostgreSQL's triggers count the copied rows again, and the copy is checked
//! against SQLite's counts. Identity columns continue after the highest number copied.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use gpufleet_sql::{params, Conn, Database, Value};

/// Tables kept by PostgreSQL's triggers from the rows of others.
const COUNTED_BY_TRIGGERS: &[&str] = &["model_nodes", "tenant_reservations"];

/// Tables that are the schema's own bookkeeping, not the store's objects.
const BOOKKEEPING: &[&str] = &["schema_version"];

/// At most this many rows per INSERT (and at most PostgreSQL's 65,535 parameters).
const ROWS_PER_INSERT: usize = 500;

/// What a copy wrote: rows per table, in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub tables: Vec<(String, usize)>,
}

impl Copied {
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|(_, n)| n).sum()
    }
}

/// A table of PostgreSQL's schema: the columns a copy writes (not generated ones), and
/// its identity column if it has one.
struct Table {
    name: String,
    columns: Vec<String>,
    identity: Option<String>,
}

/// Copies the SQLite store `sqlite` (opened and migrated by this binary) into `pg`, which
/// must hold no store yet. `now` stamps PostgreSQL's schema versions.
pub fn copy(
    sqlite: &mut rusqlite::Connection,
    pg: &mut Database,
    now: i64,
) -> anyhow::Result<Copied> {
    let sqlite_version: i64 = sqlite.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )?;
    anyhow::ensure!(
        sqlite_version == super::MIGRATIONS.len() as i64,
        "the SQLite store has schema version {sqlite_version}; this binary copies version {}",
        super::MIGRATIONS.len()
    );
    super::postgres::migrate(pg, now).context("making PostgreSQL's schema")?;
    let tables = pg.read(tables)?;
    let held: Vec<String> = pg.read(|c| {
        let mut held = Vec::new();
        for t in &tables {
            let n: i64 = c.query_row(
                &format!("SELECT COUNT(*) FROM \"{}\"", t.name),
                params![],
                |r| r.get(0),
            )?;
            if n > 0 {
                held.push(format!("{} ({n} rows)", t.name));
            }
        }
        Ok(held)
    })?;
    anyhow::ensure!(
        held.is_empty(),
        "the PostgreSQL database already holds a store: {}; copy into an empty database",
        held.join(", ")
    );

    // One snapshot of the SQLite store, read whole before anything is written.
    let snapshot = sqlite.transaction()?;
    let source = Conn::sqlite(&snapshot);
    let mut rows: BTreeMap<String, Vec<Vec<Value>>> = BTreeMap::new();
    for t in &tables {
        let select = format!("SELECT {} FROM \"{}\"", quoted(&t.columns), t.name);
        let read = source
            .query(&select, params![])
            .with_context(|| format!("reading {} from SQLite", t.name))?;
        rows.insert(
            t.name.clone(),
            read.into_iter().map(|r| r.into_values()).collect(),
        );
    }
    let counters = counts(&source)?;
    drop(snapshot);

    let copied = pg.write(|c| {
        let mut written = Vec::new();
        for t in &tables {
            let table_rows = &rows[&t.name];
            let per_insert = ROWS_PER_INSERT.min(65_535 / t.columns.len().max(1));
            for chunk in table_rows.chunks(per_insert.max(1)) {
                insert(c, t, chunk)?;
            }
            if let Some(column) = &t.identity {
                // The next number after the highest copied one.
                c.query(
                    &format!(
                        "SELECT setval(pg_get_serial_sequence('\"{0}\"', '{1}'),
                                COALESCE((SELECT MAX(\"{1}\") FROM \"{0}\"), 0) + 1, false)",
                        t.name, column
                    ),
                    params![],
                )?;
            }
            written.push((t.name.clone(), table_rows.len()));
        }
        Ok(written)
    })?;

    // What the triggers counted from the copied rows is what SQLite counted.
    let recounted = pg.read(counts)?;
    anyhow::ensure!(
        recounted == counters,
        "PostgreSQL's counters differ from SQLite's after the copy: {recounted:?} against {counters:?}"
    );
    Ok(Copied { tables: copied })
}

fn quoted(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn insert(c: &Conn<'_>, t: &Table, rows: &[Vec<Value>]) -> gpufleet_sql::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let width = t.columns.len();
    let values: Vec<String> = (0..rows.len())
        .map(|r| {
            let marks: Vec<String> = (1..=width).map(|i| format!("?{}", r * width + i)).collect();
            format!("({})", marks.join(", "))
        })
        .collect();
    let sql = format!(
        "INSERT INTO \"{}\" ({}) VALUES {}",
        t.name,
        quoted(&t.columns),
        values.join(", ")
    );
    let flat: Vec<&dyn gpufleet_sql::ToValue> = rows
        .iter()
        .flatten()
        .map(|v| v as &dyn gpufleet_sql::ToValue)
        .collect();
    c.execute(&sql, &flat)?;
    Ok(())
}

/// PostgreSQL's tables of the store, parents first (by their foreign keys), without the
/// counters and the bookkeeping.
fn tables(c: &Conn<'_>) -> gpufleet_sql::Result<Vec<Table>> {
    let mut columns: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut identity: BTreeMap<String, String> = BTreeMap::new();
    for r in c.query(
        "SELECT table_name::text, column_name::text, is_generated::text, is_identity::text
         FROM information_schema.columns
         WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
        params![],
    )? {
        let (table, column): (String, String) = (r.get(0)?, r.get(1)?);
        if r.get::<String>(2)? != "NEVER" {
            continue;
        }
        if r.get::<String>(3)? == "YES" {
            identity.insert(table.clone(), column.clone());
        }
        columns.entry(table).or_default().push(column);
    }
    let parents: Vec<(String, String)> = c.query_map(
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint
         WHERE contype = 'f' AND connamespace = 'public'::regnamespace",
        params![],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let skip: BTreeSet<&str> = COUNTED_BY_TRIGGERS
        .iter()
        .chain(BOOKKEEPING)
        .copied()
        .collect();
    // Parents first: a table is written once every table it refers to is.
    let mut left: BTreeSet<String> = columns
        .keys()
        .filter(|t| !skip.contains(t.as_str()))
        .cloned()
        .collect();
    let mut order = Vec::new();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|t| {
                parents
                    .iter()
                    .all(|(child, parent)| child != *t || parent == *t || !left.contains(parent))
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            // A cycle of foreign keys: none in this schema; write the rest as they come
            // and let PostgreSQL name what it refuses.
            order.extend(std::mem::take(&mut left));
            break;
        }
        for t in ready {
            left.remove(&t);
            order.push(t);
        }
    }
    Ok(order
        .into_iter()
        .map(|name| Table {
            identity: identity.remove(&name),
            columns: columns.remove(&name).unwrap_or_default(),
            name,
        })
        .collect())
}

/// The triggers' counters, on either engine.
fn counts(c: &Conn<'_>) -> gpufleet_sql::Result<Vec<String>> {
    let mut all = c.query_map(
        "SELECT gpu_type, capacity, nodes FROM model_nodes WHERE nodes > 0 ORDER BY gpu_type, capacity",
        params![],
        |r| {
            Ok(format!(
                "{}/{}={}",
                r.get::<String>(0)?,
                r.get::<String>(1)?,
                r.get::<i64>(2)?
            ))
        },
    )?;
    all.extend(c.query_map(
        "SELECT tenant_id, reservations FROM tenant_reservations WHERE reservations > 0 ORDER BY tenant_id",
        params![],
        |r| Ok(format!("{}={}", r.get::<String>(0)?, r.get::<i64>(1)?)),
    )?);
    Ok(all)
}

/// A store with a row of every kind (the copy's tests, and the invariants' on both
/// engines).
#[cfg(test)]
pub mod fixture {
    /// A row in every table of the store, each table's own kind of object, linked as the
    /// control plane links them.
    pub const EVERY_KIND: &str = r#"
        INSERT INTO tenants VALUES ('t1', 'team-a', 'Team A', '{"cost":"42"}', 'h-t1', 100),
                                   ('t2', 'team-b', 'Team "B" ?1', '{}', 'h-t2', 101);
        INSERT INTO quotas VALUES ('q1', 't1', 'H100-80GB', 16, 8, 3, NULL), ('q2', 't2', 'H100-80GB', 8, 0, 1, 4);
        INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time, allow_on_demand, pool_nodes, on_demand_nodes)
            VALUES ('r1', 't1', 'H100-80GB', 2, 1000, 90000, 1, 1, 1);
        INSERT INTO clusters VALUES ('c1', 't1', 'train', 'slurm', 'H100-80GB', 2, 'r1', 100, 'running', '10.0.0.1:22',
            'enc:v1:abc', '/srv/c1', '{"1g.10gb":7}', '', '12.4', '550.54', 1, 'keep', NULL);
        INSERT INTO nodes VALUES ('n1', 'gpu-1', 'H100-80GB', 'pool', 8, '550.54', '12.4', 'c1', 'busy', '', 5, 'sh', 10, '10.0.0.1'),
                                 ('n2', 'gpu-2', 'H100-80GB', 'on-demand', 8, '550.54', '12.4', NULL, 'quarantined', 'xid 79', 6, '', NULL, '');
        INSERT INTO gpus VALUES ('n1', 0, 'GPU-aaaa', 'H100-80GB', 81559, 1);
        INSERT INTO mig_devices VALUES ('n1', 0, '1g.10gb', 19, 0, 1, 9856, 'MIG-bbbb');
        INSERT INTO idempotency VALUES ('cluster', 't1', 'req-1', 'fp', 'c1');
        INSERT INTO events (at, object_id, tenant_id, kind, node, message, tenant_seq)
            VALUES (200, 'c1', 't1', 'created', '', 'it''s up', 1), (201, 'n2', '', 'quarantined', 'n2', '', NULL);
        INSERT INTO health_results (run_id, node_id, node, cluster_id, tenant_id, level, verdict, summary, checks, action, finished_at)
            VALUES ('run-1', 'n1', 'gpu-1', 'c1', 't1', 'quick', 'passed', 'ok', '[]', 'none', 300);
        INSERT INTO cluster_acceptance VALUES ('c1', 'medium', 40.5, 1, 'passed', 'run-1', 'medium', 301, 123.25, 231.09375);
        INSERT INTO node_endpoints VALUES ('n1', '10.0.0.1:7000');
        INSERT INTO cluster_preemption VALUES ('c1', 1);
        INSERT INTO automatic_quarantines (gpu_type, node_id, at) VALUES ('H100-80GB', 'n2', 400);
        INSERT INTO quarantine_breakers VALUES ('H100-80GB', 401, 'three in an hour', 1);
        INSERT INTO slurm_access VALUES ('c1', 'munge-key', 60001, 6817, 2222, '["ssh-ed25519 AAAA"]', 'n1', '', '{"n1":6818}',
            'host-key', 'host-pub', 17, 1);
        INSERT INTO node_hosts VALUES ('n1', '10.0.0.1', 'gpu-1', 64, 515000, 0);
        INSERT INTO tokens VALUES ('tok-1', 't1', 'ci', 'write', 'th-1', 500, NULL, NULL, NULL, NULL),
                                  ('tok-2', NULL, 'admin', 'write', 'th-2', 501, 9999, 600, 700, NULL);
        INSERT INTO audit_log (tenant_seq, at, tenant_id, token_name, token_scope, method, object, outcome, message, by_admin, chain, chain_seq, prev_hash)
            VALUES (1, 800, 't1', 'ci', 'write', 'CreateCluster', 'c1', 'ok', '', 0, 't1', 1, X'00ff10');
        INSERT INTO audit_chains VALUES ('t1', 1, 1, X'00', 1, 1, X'abcdef', 0);
        INSERT INTO audit_tenant_seqs VALUES ('t1', 1);
        INSERT INTO usage_intervals (node_id, tenant_id, tenant, cluster, gpu_type, class, gpus, start_time, end_time, used_through, mig_profile, slices, share_840ths)
            VALUES ('n1', 't1', 'team-a', 'train', 'H100-80GB', 'reserved', 8, 1000, NULL, 1500, '1g.10gb', 7, 840),
                   ('n1', 't1', 'team-a', 'train', 'H100-80GB', 'reserved', 8, 500, 1000, NULL, 'none', 0, 840);
        INSERT INTO leases VALUES ('singletons', 'replica-1', 1700000000, 1700000015, 'http://10.0.0.9:7700');
        INSERT INTO usage_used VALUES ('t1', 'team-a', 'train', 'H100-80GB', 'reserved', 'none', 0, 100, 200, 10, 20);
        INSERT INTO usage_pruned VALUES ('t1', 'team-a', 'H100-80GB', 'none', 'reserved', 8400, 0, 5, 9);
        INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count, storage_gib, status, endpoint, credentials, storage_path, mig_layout)
            VALUES ('c2', 't2', 'waiting', 'kubernetes', 'H100-80GB', 1, 10, 'queued', '', '', '', '{}');
        INSERT INTO cluster_queue VALUES ('c2', 900, 1900);
        INSERT INTO pending_take_backs VALUES ('c1', 1700000000, '["n2"]', 950);
    "#;

    /// An SQLite store opened as serve opens it, holding [`EVERY_KIND`].
    pub fn filled_sqlite() -> (tempfile::TempDir, rusqlite::Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("state.db")).unwrap();
        conn.execute_batch(EVERY_KIND).unwrap();
        (dir, conn)
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::filled_sqlite;
    use super::*;
    use crate::store::postgres::engines;

    /// Every table's rows, ordered, as values; with the columns PostgreSQL's copy writes.
    fn contents(c: &Conn<'_>, tables: &[Table]) -> BTreeMap<String, Vec<Vec<Value>>> {
        tables
            .iter()
            .map(|t| {
                let cols = quoted(&t.columns);
                let rows = c
                    .query(
                        &format!("SELECT {cols} FROM \"{}\" ORDER BY {cols}", t.name),
                        params![],
                    )
                    .unwrap()
                    .into_iter()
                    .map(|r| r.into_values())
                    .collect();
                (t.name.clone(), rows)
            })
            .collect()
    }

    #[test]
    fn a_store_with_every_kind_of_object_is_copied_whole() {
        let (_dir, mut sqlite) = filled_sqlite();
        let (_guard, mut pg, _) = engines::postgres();
        let copied = copy(&mut sqlite, &mut pg, 1).unwrap();
        let tables = pg.read(tables).unwrap();
        // Every table of the store holds rows here: a new table fails this until the
        // fixture has one of its rows, and so is tested by the copy.
        let empty: Vec<&str> = copied
            .tables
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(t, _)| t.as_str())
            .collect();
        assert!(empty.is_empty(), "the fixture has no rows in {empty:?}");
        assert_eq!(copied.tables.len(), tables.len());
        // Parents before children: tenants before clusters before nodes before gpus.
        let at = |name: &str| copied.tables.iter().position(|(t, _)| t == name).unwrap();
        assert!(at("tenants") < at("clusters") && at("clusters") < at("nodes"));
        assert!(at("nodes") < at("gpus") && at("gpus") < at("mig_devices"));
        // Row for row, value for value, the same (blobs, reals, quotes and NULLs).
        let source = contents(&Conn::sqlite(&sqlite), &tables);
        let target = pg.read(|c| Ok(contents(c, &tables))).unwrap();
        for (table, rows) in &source {
            assert_eq!(Some(rows), target.get(table), "table {table}");
        }
        // The counters the triggers kept from the copied rows.
        let counted = pg.read(counts).unwrap();
        assert_eq!(
            counted,
            vec!["H100-80GB/pool=1".to_string(), "t1=1".to_string()]
        );
        // The numbering goes on after the highest number copied.
        let seq: i64 = pg
            .write(|c| {
                c.query_row(
                    "INSERT INTO events (at, object_id, tenant_id, kind, node, message)
                     VALUES (1, 'x', '', 'k', '', '') RETURNING seq",
                    params![],
                    |r| r.get(0),
                )
            })
            .unwrap();
        assert_eq!(seq, 3);
        // A second copy into the same database is refused, naming what it holds.
        let again = copy(&mut sqlite, &mut pg, 2).unwrap_err().to_string();
        assert!(
            again.contains("already holds a store") && again.contains("tenants (2 rows)"),
            "{again}"
        );
    }

    /// A row PostgreSQL refuses (text with a NUL, which SQLite keeps) fails the copy and
    /// leaves no row behind.
    #[test]
    fn a_copy_that_fails_half_way_leaves_the_database_empty() {
        let (_dir, mut sqlite) = filled_sqlite();
        sqlite
            .execute(
                "UPDATE events SET message = 'a' || char(0) || 'b' WHERE at = 201",
                [],
            )
            .unwrap();
        let (_guard, mut pg, _) = engines::postgres();
        let e = format!("{:#}", copy(&mut sqlite, &mut pg, 1).unwrap_err());
        assert!(e.contains("22021"), "{e}");
        let rows: i64 = pg
            .read(|c| {
                let mut n = 0;
                for t in tables(c)? {
                    n += c.query_row(
                        &format!("SELECT COUNT(*) FROM \"{}\"", t.name),
                        params![],
                        |r| r.get::<i64>(0),
                    )?;
                }
                Ok(n)
            })
            .unwrap();
        assert_eq!(rows, 0);
    }
}
