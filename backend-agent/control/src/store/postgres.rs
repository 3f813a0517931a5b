//! The store's schema on PostgreSQL (issue 41): the same tables as SQLite's, in
//! PostgreSQL's types, applied in order and recorded in `schema_version` as the SQLite
//! store records its own. The store's modules move onto the engine seam
//! (`gpufleet_sql`) one by one; `serve` does not yet run on PostgreSQL, as the modules
//! not yet moved speak only SQLite.

use gpufleet_sql::{params, Conn, Database};

/// One migration: what it is for, and its statements.
pub struct Migration {
    pub what: &'static str,
    pub sql: &'static str,
}

pub const MIGRATIONS: &[Migration] = &[Migration {
    what: "the store as SQLite's schema version 28 leaves it",
    sql: SCHEMA_28,
}];

/// SQLite's schema at its version 28 (`store::MIGRATIONS`), in PostgreSQL's words. What
/// differs, and why:
/// - `INTEGER` is `BIGINT`, `REAL` is `DOUBLE PRECISION`, `BLOB` is `BYTEA`; flags stay
///   integers 0 and 1, so that the same statements compare them;
/// - a column SQLite numbers itself (`AUTOINCREMENT`, `INTEGER PRIMARY KEY`) is an
///   identity column; where its order is read as a cursor (events, the audit log) the
///   ported module numbers the row itself in its serializable transaction, as a sequence's
///   numbers are neither gap-free nor in commit order;
/// - the reservations' `span_class` is a stored generated column (PostgreSQL 15 has no
///   virtual ones);
/// - the counters SQLite's triggers keep (`model_nodes`, `tenant_reservations`) are kept by
///   PL/pgSQL triggers doing the same;
/// - every text column compares bytewise (`COLLATE "C"`), as SQLite's do, whatever the
///   database's own collation: orders, ranges and cursors over names are the same;
/// - `commit_counter` is not here: it detects an SQLite file put back from a backup, and
///   PostgreSQL's durability and its replicas are the database's own.
const SCHEMA_28: &str = r#"
CREATE TABLE tenants (
    id TEXT COLLATE "C" PRIMARY KEY,
    name TEXT COLLATE "C" NOT NULL UNIQUE,
    display_name TEXT COLLATE "C" NOT NULL,
    labels TEXT COLLATE "C" NOT NULL,
    token_hash TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);
CREATE TABLE quotas (
    id TEXT COLLATE "C" PRIMARY KEY,
    tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    gpu_type TEXT COLLATE "C" NOT NULL,
    gpus BIGINT NOT NULL CHECK (gpus >= 0),
    burst_gpus BIGINT NOT NULL CHECK (burst_gpus >= 0),
    weight BIGINT NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    lending_limit_gpus BIGINT CHECK (lending_limit_gpus IS NULL OR lending_limit_gpus >= 0),
    UNIQUE (tenant_id, gpu_type)
);
CREATE TABLE reservations (
    id TEXT COLLATE "C" PRIMARY KEY,
    tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    gpu_type TEXT COLLATE "C" NOT NULL,
    node_count BIGINT NOT NULL CHECK (node_count >= 1),
    start_time BIGINT NOT NULL,
    end_time BIGINT NOT NULL,
    allow_on_demand BIGINT NOT NULL,
    pool_nodes BIGINT NOT NULL CHECK (pool_nodes >= 0),
    on_demand_nodes BIGINT NOT NULL CHECK (on_demand_nodes >= 0),
    span_class BIGINT GENERATED ALWAYS AS (
        CASE
            WHEN end_time - start_time <= 3600 THEN 0
            WHEN end_time - start_time <= 14400 THEN 1
            WHEN end_time - start_time <= 57600 THEN 2
            WHEN end_time - start_time <= 230400 THEN 3
            WHEN end_time - start_time <= 921600 THEN 4
            WHEN end_time - start_time <= 3686400 THEN 5
            WHEN end_time - start_time <= 14745600 THEN 6
            WHEN end_time - start_time <= 58982400 THEN 7
            ELSE 8
        END
    ) STORED,
    CHECK (end_time > start_time),
    CHECK (pool_nodes + on_demand_nodes = node_count)
);
CREATE TABLE clusters (
    id TEXT COLLATE "C" PRIMARY KEY,
    tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
    name TEXT COLLATE "C" NOT NULL,
    orchestrator TEXT COLLATE "C" NOT NULL CHECK (orchestrator IN ('kubernetes', 'slurm')),
    gpu_type TEXT COLLATE "C" NOT NULL,
    node_count BIGINT NOT NULL CHECK (node_count >= 0),
    reservation_id TEXT COLLATE "C" REFERENCES reservations(id),
    storage_gib BIGINT NOT NULL CHECK (storage_gib >= 1),
    status TEXT COLLATE "C" NOT NULL,
    endpoint TEXT COLLATE "C" NOT NULL,
    credentials TEXT COLLATE "C" NOT NULL,
    storage_path TEXT COLLATE "C" NOT NULL,
    mig_layout TEXT COLLATE "C" NOT NULL,
    status_reason TEXT COLLATE "C" NOT NULL DEFAULT '',
    cuda_version TEXT COLLATE "C" NOT NULL DEFAULT '',
    driver_version TEXT COLLATE "C" NOT NULL DEFAULT '',
    max_unavailable BIGINT NOT NULL DEFAULT 1 CHECK (max_unavailable >= 1),
    storage_retention TEXT COLLATE "C" NOT NULL DEFAULT 'delete' CHECK (storage_retention IN ('delete', 'keep')),
    UNIQUE (tenant_id, name)
);
CREATE TABLE nodes (
    id TEXT COLLATE "C" PRIMARY KEY,
    hostname TEXT COLLATE "C" NOT NULL UNIQUE,
    gpu_type TEXT COLLATE "C" NOT NULL,
    capacity TEXT COLLATE "C" NOT NULL CHECK (capacity IN ('pool', 'on-demand')),
    gpu_count BIGINT NOT NULL,
    driver_version TEXT COLLATE "C" NOT NULL,
    cuda_version TEXT COLLATE "C" NOT NULL,
    cluster_id TEXT COLLATE "C" REFERENCES clusters(id),
    state TEXT COLLATE "C" NOT NULL DEFAULT 'unreachable'
        CHECK (state IN ('ready', 'busy', 'unreachable', 'quarantined')),
    state_reason TEXT COLLATE "C" NOT NULL DEFAULT '',
    state_since BIGINT NOT NULL DEFAULT 0,
    secret_hash TEXT COLLATE "C" NOT NULL DEFAULT '',
    in_service_since BIGINT,
    joined_from TEXT COLLATE "C" NOT NULL DEFAULT ''
);
CREATE TABLE gpus (
    node_id TEXT COLLATE "C" NOT NULL REFERENCES nodes(id),
    idx BIGINT NOT NULL,
    uuid TEXT COLLATE "C" NOT NULL UNIQUE,
    model TEXT COLLATE "C" NOT NULL,
    memory_mib BIGINT NOT NULL,
    mig_enabled BIGINT NOT NULL,
    PRIMARY KEY (node_id, idx)
);
CREATE TABLE mig_devices (
    node_id TEXT COLLATE "C" NOT NULL,
    gpu_idx BIGINT NOT NULL,
    profile TEXT COLLATE "C" NOT NULL,
    profile_id BIGINT NOT NULL,
    start BIGINT NOT NULL,
    size BIGINT NOT NULL,
    memory_mib BIGINT NOT NULL,
    uuid TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (node_id, gpu_idx, start),
    FOREIGN KEY (node_id, gpu_idx) REFERENCES gpus(node_id, idx)
);
CREATE TABLE idempotency (
    kind TEXT COLLATE "C" NOT NULL,
    scope TEXT COLLATE "C" NOT NULL,
    request_id TEXT COLLATE "C" NOT NULL,
    fingerprint TEXT COLLATE "C" NOT NULL,
    object_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (kind, scope, request_id)
);
CREATE TABLE events (
    seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at BIGINT NOT NULL,
    object_id TEXT COLLATE "C" NOT NULL,
    tenant_id TEXT COLLATE "C" NOT NULL,
    kind TEXT COLLATE "C" NOT NULL,
    node TEXT COLLATE "C" NOT NULL,
    message TEXT COLLATE "C" NOT NULL,
    tenant_seq BIGINT
);
CREATE INDEX events_by_object ON events (object_id, seq);
CREATE INDEX events_tenant_seq ON events (tenant_id, tenant_seq);
CREATE TABLE health_results (
    seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    run_id TEXT COLLATE "C" NOT NULL,
    node_id TEXT COLLATE "C" NOT NULL,
    node TEXT COLLATE "C" NOT NULL,
    cluster_id TEXT COLLATE "C" NOT NULL,
    tenant_id TEXT COLLATE "C" NOT NULL,
    level TEXT COLLATE "C" NOT NULL CHECK (level IN ('quick', 'medium', 'long')),
    verdict TEXT COLLATE "C" NOT NULL CHECK (verdict IN ('passed', 'failed')),
    summary TEXT COLLATE "C" NOT NULL,
    checks TEXT COLLATE "C" NOT NULL,
    action TEXT COLLATE "C" NOT NULL,
    finished_at BIGINT NOT NULL
);
CREATE INDEX health_by_node ON health_results (node_id, seq);
CREATE INDEX health_by_cluster ON health_results (cluster_id, seq);
CREATE TABLE cluster_acceptance (
    cluster_id TEXT COLLATE "C" PRIMARY KEY,
    level TEXT COLLATE "C" NOT NULL CHECK (level IN ('quick', 'medium', 'long')),
    min_bus_bandwidth_gbps DOUBLE PRECISION NOT NULL CHECK (min_bus_bandwidth_gbps >= 0),
    run_on_create BIGINT NOT NULL,
    status TEXT COLLATE "C" NOT NULL CHECK (status IN ('passed', 'failed', 'running', 'not_run')),
    run_id TEXT COLLATE "C" NOT NULL,
    run_level TEXT COLLATE "C" NOT NULL,
    checked_at BIGINT NOT NULL,
    alg_bandwidth_gbps DOUBLE PRECISION NOT NULL,
    bus_bandwidth_gbps DOUBLE PRECISION NOT NULL
);
CREATE TABLE node_endpoints (
    node_id TEXT COLLATE "C" PRIMARY KEY,
    bandwidth_addr TEXT COLLATE "C" NOT NULL
);
CREATE INDEX reservations_by_tenant ON reservations (tenant_id, end_time);
CREATE INDEX reservations_by_window ON reservations
    (gpu_type, span_class, start_time, end_time, pool_nodes, on_demand_nodes, tenant_id, id);
CREATE INDEX nodes_by_cluster ON nodes (cluster_id);
CREATE INDEX nodes_by_model ON nodes (gpu_type, capacity, gpu_count);
CREATE INDEX nodes_by_model_size ON nodes (gpu_type, gpu_count);
CREATE INDEX nodes_candidates ON nodes (state_since) WHERE in_service_since IS NULL;
CREATE INDEX nodes_candidates_from ON nodes (joined_from) WHERE in_service_since IS NULL;
CREATE INDEX clusters_by_model ON clusters (gpu_type);
CREATE TABLE cluster_preemption (
    cluster_id TEXT COLLATE "C" PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
    allow_on_demand BIGINT NOT NULL
);
CREATE TABLE model_nodes (
    gpu_type TEXT COLLATE "C" NOT NULL,
    capacity TEXT COLLATE "C" NOT NULL,
    nodes BIGINT NOT NULL CHECK (nodes >= 0),
    PRIMARY KEY (gpu_type, capacity)
);
CREATE TABLE tenant_reservations (
    tenant_id TEXT COLLATE "C" PRIMARY KEY,
    reservations BIGINT NOT NULL CHECK (reservations >= 0)
);
CREATE FUNCTION tenant_reservations_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE tenant_reservations SET reservations = reservations - 1
            WHERE tenant_id = OLD.tenant_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO tenant_reservations (tenant_id, reservations) VALUES (NEW.tenant_id, 1)
            ON CONFLICT (tenant_id)
            DO UPDATE SET reservations = tenant_reservations.reservations + 1;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER tenant_reservations_insert AFTER INSERT ON reservations
    FOR EACH ROW EXECUTE FUNCTION tenant_reservations_count();
CREATE TRIGGER tenant_reservations_update AFTER UPDATE OF tenant_id ON reservations
    FOR EACH ROW EXECUTE FUNCTION tenant_reservations_count();
CREATE TRIGGER tenant_reservations_delete AFTER DELETE ON reservations
    FOR EACH ROW EXECUTE FUNCTION tenant_reservations_count();
CREATE FUNCTION model_nodes_out() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE model_nodes SET nodes = nodes - 1
        WHERE gpu_type = OLD.gpu_type AND capacity = OLD.capacity;
    RETURN NULL;
END $$;
CREATE FUNCTION model_nodes_in() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO model_nodes (gpu_type, capacity, nodes) VALUES (NEW.gpu_type, NEW.capacity, 1)
        ON CONFLICT (gpu_type, capacity) DO UPDATE SET nodes = model_nodes.nodes + 1;
    RETURN NULL;
END $$;
-- The out-trigger before the in-trigger on an update, as SQLite fires them: PostgreSQL
-- fires a table's triggers in the order of their names.
CREATE TRIGGER model_nodes_insert AFTER INSERT ON nodes
    FOR EACH ROW WHEN (NEW.state <> 'quarantined') EXECUTE FUNCTION model_nodes_in();
CREATE TRIGGER model_nodes_update_1_out AFTER UPDATE OF gpu_type, capacity, state ON nodes
    FOR EACH ROW WHEN (OLD.state <> 'quarantined') EXECUTE FUNCTION model_nodes_out();
CREATE TRIGGER model_nodes_update_2_in AFTER UPDATE OF gpu_type, capacity, state ON nodes
    FOR EACH ROW WHEN (NEW.state <> 'quarantined') EXECUTE FUNCTION model_nodes_in();
CREATE TRIGGER model_nodes_delete AFTER DELETE ON nodes
    FOR EACH ROW WHEN (OLD.state <> 'quarantined') EXECUTE FUNCTION model_nodes_out();
CREATE TABLE automatic_quarantines (
    seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    gpu_type TEXT COLLATE "C" NOT NULL,
    node_id TEXT COLLATE "C" NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX automatic_quarantines_by_model ON automatic_quarantines (gpu_type, at);
CREATE TABLE quarantine_breakers (
    gpu_type TEXT COLLATE "C" PRIMARY KEY,
    opened_at BIGINT NOT NULL,
    reason TEXT COLLATE "C" NOT NULL,
    held BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE slurm_access (
    cluster_id TEXT COLLATE "C" PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
    munge_key TEXT COLLATE "C" NOT NULL,
    uid BIGINT NOT NULL UNIQUE,
    controller_port BIGINT NOT NULL,
    login_port BIGINT NOT NULL,
    ssh_public_keys TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    head_node TEXT COLLATE "C" NOT NULL DEFAULT '',
    backup_node TEXT COLLATE "C" NOT NULL DEFAULT '',
    node_ports TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    login_host_key TEXT COLLATE "C" NOT NULL DEFAULT '',
    login_host_public TEXT COLLATE "C" NOT NULL DEFAULT '',
    next_job_id BIGINT NOT NULL DEFAULT 0,
    first_job_id BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE node_hosts (
    node_id TEXT COLLATE "C" PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    address TEXT COLLATE "C" NOT NULL,
    hostname TEXT COLLATE "C" NOT NULL,
    cpus BIGINT NOT NULL,
    memory_mib BIGINT NOT NULL,
    simulated BIGINT NOT NULL
);
CREATE TABLE tokens (
    id TEXT COLLATE "C" PRIMARY KEY,
    tenant_id TEXT COLLATE "C" REFERENCES tenants(id) ON DELETE CASCADE,
    name TEXT COLLATE "C" NOT NULL,
    scope TEXT COLLATE "C" NOT NULL CHECK (scope IN ('read', 'write')),
    hash TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    rotated_at BIGINT,
    retire_at BIGINT,
    revoked_at BIGINT
);
CREATE UNIQUE INDEX tokens_live_name ON tokens (COALESCE(tenant_id, ''), name)
    WHERE rotated_at IS NULL AND revoked_at IS NULL;
CREATE TABLE audit_log (
    seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    tenant_seq BIGINT,
    at BIGINT NOT NULL,
    tenant_id TEXT COLLATE "C" NOT NULL,
    token_name TEXT COLLATE "C" NOT NULL,
    token_scope TEXT COLLATE "C" NOT NULL,
    method TEXT COLLATE "C" NOT NULL,
    object TEXT COLLATE "C" NOT NULL,
    outcome TEXT COLLATE "C" NOT NULL,
    message TEXT COLLATE "C" NOT NULL,
    by_admin BIGINT NOT NULL DEFAULT 0,
    chain TEXT COLLATE "C" NOT NULL DEFAULT '',
    chain_seq BIGINT,
    prev_hash BYTEA
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, tenant_seq);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_chain ON audit_log (chain, seq);
CREATE TABLE audit_chains (
    chain TEXT COLLATE "C" PRIMARY KEY,
    start_seq BIGINT NOT NULL,
    start_chain_seq BIGINT NOT NULL,
    start_prev_hash BYTEA NOT NULL,
    head_seq BIGINT NOT NULL,
    head_chain_seq BIGINT NOT NULL,
    head_hash BYTEA NOT NULL,
    pruned BIGINT NOT NULL
);
CREATE TABLE audit_tenant_seqs (
    tenant_id TEXT COLLATE "C" PRIMARY KEY,
    last BIGINT NOT NULL
);
CREATE TABLE usage_intervals (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    node_id TEXT COLLATE "C" NOT NULL,
    tenant_id TEXT COLLATE "C" NOT NULL,
    tenant TEXT COLLATE "C" NOT NULL,
    cluster TEXT COLLATE "C" NOT NULL,
    gpu_type TEXT COLLATE "C" NOT NULL,
    class TEXT COLLATE "C" NOT NULL,
    gpus BIGINT NOT NULL CHECK (gpus > 0),
    start_time BIGINT NOT NULL,
    end_time BIGINT CHECK (end_time IS NULL OR end_time >= start_time),
    used_through BIGINT,
    mig_profile TEXT COLLATE "C" NOT NULL DEFAULT 'none',
    slices BIGINT NOT NULL DEFAULT 0 CHECK (slices >= 0),
    share_840ths BIGINT NOT NULL DEFAULT 840 CHECK (share_840ths BETWEEN 1 AND 840)
);
CREATE INDEX usage_intervals_open ON usage_intervals (node_id) WHERE end_time IS NULL;
CREATE INDEX usage_intervals_open_by_tenant ON usage_intervals (tenant_id, gpu_type, class)
    WHERE end_time IS NULL;
CREATE INDEX usage_intervals_end ON usage_intervals (end_time);
CREATE INDEX usage_intervals_tenant ON usage_intervals (tenant_id, start_time);
CREATE INDEX usage_intervals_node ON usage_intervals (node_id, end_time);
CREATE TABLE leases (
    name TEXT COLLATE "C" PRIMARY KEY,
    holder TEXT COLLATE "C" NOT NULL,
    epoch BIGINT NOT NULL CHECK (epoch >= 1),
    expires_at BIGINT NOT NULL
);
CREATE TABLE usage_used (
    tenant_id TEXT COLLATE "C" NOT NULL,
    tenant TEXT COLLATE "C" NOT NULL,
    cluster TEXT COLLATE "C" NOT NULL,
    gpu_type TEXT COLLATE "C" NOT NULL,
    class TEXT COLLATE "C" NOT NULL,
    mig_profile TEXT COLLATE "C" NOT NULL,
    hour BIGINT NOT NULL,
    used_ms BIGINT NOT NULL CHECK (used_ms >= 0),
    measured_ms BIGINT NOT NULL CHECK (measured_ms >= used_ms),
    first_t BIGINT NOT NULL,
    last_t BIGINT NOT NULL CHECK (last_t > first_t),
    PRIMARY KEY (tenant_id, cluster, gpu_type, class, mig_profile, hour)
);
CREATE INDEX usage_used_last ON usage_used (last_t);
CREATE INDEX usage_used_tenant ON usage_used (tenant_id, last_t);
CREATE TABLE usage_pruned (
    tenant_id TEXT COLLATE "C" NOT NULL,
    tenant TEXT COLLATE "C" NOT NULL,
    gpu_type TEXT COLLATE "C" NOT NULL,
    mig_profile TEXT COLLATE "C" NOT NULL,
    class TEXT COLLATE "C" NOT NULL,
    gpu_seconds_840ths BIGINT NOT NULL,
    slice_seconds BIGINT NOT NULL DEFAULT 0,
    used_ms BIGINT NOT NULL DEFAULT 0,
    measured_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, gpu_type, mig_profile, class)
);
CREATE TABLE cluster_queue (
    cluster_id TEXT COLLATE "C" PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
    queued_at BIGINT NOT NULL,
    wait_until BIGINT NOT NULL CHECK (wait_until > queued_at)
);
CREATE TABLE pending_take_backs (
    cluster_id TEXT COLLATE "C" PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
    epoch BIGINT NOT NULL CHECK (epoch >= 1),
    replacements TEXT COLLATE "C" NOT NULL,
    decided_at BIGINT NOT NULL
);
"#;

/// Applies the migrations the database has not had, each in its own transaction; a
/// database newer than this binary is refused. Replicas starting at once on one empty
/// database race here: the loser's transaction fails and is run again, and finds the
/// version applied.
pub fn migrate(db: &mut Database, now: i64) -> anyhow::Result<usize> {
    db.conn().execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )?;
    let mut applied = 0;
    for (i, m) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        let ran = db.write(|c| {
            if current(c)? >= version {
                return Ok(false);
            }
            c.execute_batch(m.sql)?;
            c.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
                params![version, now],
            )?;
            Ok(true)
        })?;
        if ran {
            tracing::info!(
                version,
                what = m.what,
                "applied PostgreSQL schema migration"
            );
            applied += 1;
        }
    }
    let current = db.read(current)?;
    if current > MIGRATIONS.len() as i64 {
        anyhow::bail!(
            "the database has schema version {current}, newer than this binary knows ({}); use a newer gpufleet-agent",
            MIGRATIONS.len()
        );
    }
    Ok(applied)
}

fn current(c: &Conn<'_>) -> gpufleet_sql::Result<i64> {
    c.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        params![],
        |r| r.get(0),
    )
}

/// The store's tests on both engines: an SQLite store opened as `serve` opens it, and a
/// fresh database on a PostgreSQL server of the test's own, migrated.
#[cfg(test)]
pub mod engines {
    use gpufleet_sql::test_server::TestServer;
    use gpufleet_sql::Database;

    /// What keeps a test's database alive: its folder, or its server.
    pub enum Guard {
        Sqlite(#[allow(dead_code)] tempfile::TempDir),
        Postgres(#[allow(dead_code)] TestServer),
    }

    /// A migrated SQLite store.
    pub fn sqlite() -> (Guard, Database) {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open(&dir.path().join("state.db")).unwrap();
        (Guard::Sqlite(dir), Database::sqlite(conn))
    }

    /// A migrated PostgreSQL database, and its address for more connections.
    pub fn postgres() -> (Guard, Database, String) {
        let server = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
        let url = server
            .database("gpufleet")
            .unwrap_or_else(|e| panic!("{e}"));
        let mut db = Database::postgres(&url).unwrap();
        super::migrate(&mut db, 1).unwrap();
        (Guard::Postgres(server), db, url)
    }

    /// Both, SQLite first.
    pub fn both() -> Vec<(Guard, Database)> {
        let (pg_guard, pg, _) = postgres();
        let (lite_guard, lite) = sqlite();
        vec![(lite_guard, lite), (pg_guard, pg)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_applies_nothing_the_second_time() {
        let (_guard, mut db, _) = engines::postgres();
        assert_eq!(migrate(&mut db, 2).unwrap(), 0);
        let version = db.read(current).unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
    }

    /// Every table and column of SQLite's schema, by name, from either engine.
    fn columns(db: &mut Database) -> std::collections::BTreeSet<(String, String)> {
        let sql = match db.engine() {
            gpufleet_sql::Engine::Sqlite => {
                "SELECT m.name, p.name FROM sqlite_master m, pragma_table_xinfo(m.name) p
                 WHERE m.type = 'table' AND m.name NOT IN ('sqlite_sequence', 'commit_counter')"
            }
            gpufleet_sql::Engine::Postgres => {
                "SELECT table_name::text, column_name::text FROM information_schema.columns
                 WHERE table_schema = 'public'"
            }
        };
        db.read(|c| c.query_map(sql, params![], |r| Ok((r.get(0)?, r.get(1)?))))
            .unwrap()
            .into_iter()
            .collect()
    }

    /// Text compares bytewise on PostgreSQL as on SQLite, whatever the database's own
    /// collation.
    #[test]
    fn every_text_column_compares_bytewise() {
        let (_guard, mut db, _) = engines::postgres();
        let other: Vec<String> = db
            .read(|c| {
                c.query_map(
                    "SELECT table_name || '.' || column_name FROM information_schema.columns
                     WHERE table_schema = 'public' AND data_type = 'text'
                       AND table_name <> 'schema_version'
                       AND COALESCE(collation_name, '') <> 'C'",
                    params![],
                    |r| r.get(0),
                )
            })
            .unwrap();
        assert!(other.is_empty(), "not bytewise: {other:?}");
        let order: Vec<String> = db
            .write(|c| {
                c.execute(
                    "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                     VALUES ('1', 'b', '', '{}', 'h1', 0), ('2', 'B', '', '{}', 'h2', 0),
                            ('3', 'a', '', '{}', 'h3', 0), ('4', '_', '', '{}', 'h4', 0)",
                    params![],
                )?;
                c.query_map("SELECT name FROM tenants ORDER BY name", params![], |r| {
                    r.get(0)
                })
            })
            .unwrap();
        assert_eq!(order, ["B", "_", "a", "b"]);
    }

    /// A new SQLite migration fails this until PostgreSQL's schema has it too.
    #[test]
    fn postgres_has_every_table_and_column_of_sqlite() {
        let mut both = engines::both();
        let sqlite = columns(&mut both[0].1);
        let postgres = columns(&mut both[1].1);
        let only_sqlite: Vec<_> = sqlite.difference(&postgres).collect();
        let only_postgres: Vec<_> = postgres.difference(&sqlite).collect();
        assert!(
            only_sqlite.is_empty() && only_postgres.is_empty(),
            "only on SQLite: {only_sqlite:?}; only on PostgreSQL: {only_postgres:?}"
        );
        assert!(sqlite.len() > 200, "{} columns", sqlite.len());
    }

    /// The counters the triggers keep count the same on both engines, through inserts,
    /// quarantines and returns, moves and deletes.
    #[test]
    fn the_triggers_keep_the_same_counts_on_both_engines() {
        let steps = [
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES ('t1', 'a', 'A', '{}', 'h1', 0), ('t2', 'b', 'B', '{}', 'h2', 0)",
            "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version, state)
             VALUES ('n1', 'h1', 'H100', 'pool', 8, '', '', 'ready'),
                    ('n2', 'h2', 'H100', 'pool', 8, '', '', 'ready'),
                    ('n3', 'h3', 'H100', 'on-demand', 8, '', '', 'quarantined')",
            "UPDATE nodes SET state = 'quarantined' WHERE id = 'n1'",
            "UPDATE nodes SET state = 'ready' WHERE id = 'n3'",
            "UPDATE nodes SET capacity = 'on-demand' WHERE id = 'n2'",
            "DELETE FROM nodes WHERE id = 'n3'",
            "INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time, allow_on_demand, pool_nodes, on_demand_nodes)
             VALUES ('r1', 't1', 'H100', 1, 0, 100, 0, 1, 0), ('r2', 't1', 'H100', 1, 0, 100000, 0, 1, 0)",
            "UPDATE reservations SET tenant_id = 't2' WHERE id = 'r2'",
            "DELETE FROM reservations WHERE id = 'r1'",
        ];
        let mut seen = Vec::new();
        for (_guard, mut db) in engines::both() {
            for step in steps {
                db.write(|c| c.execute(step, params![])).unwrap();
            }
            let counts = db
                .read(|c| {
                    let models = c.query_map(
                        "SELECT gpu_type, capacity, nodes FROM model_nodes ORDER BY gpu_type, capacity",
                        params![],
                        |r| Ok(format!("{}/{}={}", r.get::<String>(0)?, r.get::<String>(1)?, r.get::<i64>(2)?)),
                    )?;
                    let tenants = c.query_map(
                        "SELECT tenant_id, reservations FROM tenant_reservations ORDER BY tenant_id",
                        params![],
                        |r| Ok(format!("{}={}", r.get::<String>(0)?, r.get::<i64>(1)?)),
                    )?;
                    let spans = c.query_map(
                        "SELECT id, span_class FROM reservations ORDER BY id",
                        params![],
                        |r| Ok(format!("{}:{}", r.get::<String>(0)?, r.get::<i64>(1)?)),
                    )?;
                    Ok((models, tenants, spans))
                })
                .unwrap();
            seen.push(counts);
        }
        assert_eq!(seen[0], seen[1]);
        assert_eq!(
            seen[1].0,
            vec!["H100/on-demand=1".to_string(), "H100/pool=0".to_string()]
        );
        assert_eq!(seen[1].1, vec!["t1=0".to_string(), "t2=1".to_string()]);
        assert_eq!(seen[1].2, vec!["r2:3".to_string()]);
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused() {
        let (_guard, mut db, _) = engines::postgres();
        db.conn()
            .execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?1, 1)",
                params![MIGRATIONS.len() as i64 + 1],
            )
            .unwrap();
        let e = migrate(&mut db, 2).unwrap_err().to_string();
        assert!(e.contains("newer than this binary knows"), "{e}");
    }
}
