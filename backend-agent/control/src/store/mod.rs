//! The durable state: one SQLite database under the data dir.
//!
//! WAL journal, foreign keys on, a busy timeout, and schema migrations kept in code as an
//! ordered list; each applied migration is recorded in `schema_version`. Callers run every
//! mutation inside one transaction, so a crash leaves either the old or the new state.
//!
//! `serve` opens it with [`open_checked`]: a damaged file (`PRAGMA quick_check`), or a
//! database that holds fewer commits than its [`commit_record`] says were acknowledged
//! (a truncated or deleted WAL, an older backup put back), is refused before anything is
//! served. How durable a commit is depends on [`Durability`] (docs/operations.md).

pub mod audit;
pub mod breaker;
pub mod checkpoints;
pub mod clusters;
pub mod commit_record;
pub mod events;
pub mod health;
pub mod holdings;
pub mod idempotency;
pub mod invariants;
pub mod leases;
pub mod nodes;
pub mod postgres;
pub mod preemption;
pub mod queue;
pub mod quotas;
pub mod readers;
pub mod reservations;
pub mod slurm_access;
pub mod take_backs;
pub mod tenants;
pub mod to_postgres;
pub mod tokens;
pub mod usage;
#[cfg(test)]
mod usage_tests;

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

/// Migrations in order; index + 1 is the schema version. Never edit an applied one: append.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
    CREATE TABLE tenants (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        display_name TEXT NOT NULL,
        labels TEXT NOT NULL,
        token_hash TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE quotas (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        gpu_type TEXT NOT NULL,
        gpus INTEGER NOT NULL CHECK (gpus >= 0),
        burst_gpus INTEGER NOT NULL CHECK (burst_gpus >= 0),
        UNIQUE (tenant_id, gpu_type)
    );
    CREATE TABLE reservations (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        gpu_type TEXT NOT NULL,
        node_count INTEGER NOT NULL CHECK (node_count >= 1),
        start_time INTEGER NOT NULL,
        end_time INTEGER NOT NULL,
        allow_on_demand INTEGER NOT NULL,
        pool_nodes INTEGER NOT NULL CHECK (pool_nodes >= 0),
        on_demand_nodes INTEGER NOT NULL CHECK (on_demand_nodes >= 0),
        CHECK (end_time > start_time),
        CHECK (pool_nodes + on_demand_nodes = node_count)
    );
    CREATE TABLE clusters (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        name TEXT NOT NULL,
        orchestrator TEXT NOT NULL CHECK (orchestrator IN ('kubernetes', 'slurm')),
        gpu_type TEXT NOT NULL,
        node_count INTEGER NOT NULL CHECK (node_count >= 1),
        reservation_id TEXT REFERENCES reservations(id),
        storage_gib INTEGER NOT NULL CHECK (storage_gib >= 1),
        status TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        credentials TEXT NOT NULL,
        storage_path TEXT NOT NULL,
        mig_layout TEXT NOT NULL,
        UNIQUE (tenant_id, name)
    );
    -- A node belongs to at most one cluster: ownership is this single column.
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        hostname TEXT NOT NULL UNIQUE,
        gpu_type TEXT NOT NULL,
        capacity TEXT NOT NULL CHECK (capacity IN ('pool', 'on-demand')),
        gpu_count INTEGER NOT NULL,
        driver_version TEXT NOT NULL,
        cuda_version TEXT NOT NULL,
        cluster_id TEXT REFERENCES clusters(id)
    );
    CREATE TABLE gpus (
        node_id TEXT NOT NULL REFERENCES nodes(id),
        idx INTEGER NOT NULL,
        uuid TEXT NOT NULL UNIQUE,
        model TEXT NOT NULL,
        memory_mib INTEGER NOT NULL,
        mig_enabled INTEGER NOT NULL,
        PRIMARY KEY (node_id, idx)
    );
    CREATE TABLE mig_devices (
        node_id TEXT NOT NULL,
        gpu_idx INTEGER NOT NULL,
        profile TEXT NOT NULL,
        profile_id INTEGER NOT NULL,
        start INTEGER NOT NULL,
        size INTEGER NOT NULL,
        memory_mib INTEGER NOT NULL,
        uuid TEXT NOT NULL,
        PRIMARY KEY (node_id, gpu_idx, start),
        FOREIGN KEY (node_id, gpu_idx) REFERENCES gpus(node_id, idx)
    );
    -- Idempotent creates: (kind, scope, request_id) -> the object the first call created.
    -- scope is the owning tenant id (empty for tenants) so request ids never collide
    -- across tenants.
    CREATE TABLE idempotency (
        kind TEXT NOT NULL,
        scope TEXT NOT NULL,
        request_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        object_id TEXT NOT NULL,
        PRIMARY KEY (kind, scope, request_id)
    );
    "#,
    // 2: node agents. A node's state comes from its agent (ready once registered and
    // converged, unreachable without heartbeats, quarantined by an operator or a check);
    // a cluster's status carries a reason when it is not simply running.
    r#"
    ALTER TABLE nodes ADD COLUMN state TEXT NOT NULL DEFAULT 'unreachable'
        CHECK (state IN ('ready', 'busy', 'unreachable', 'quarantined'));
    ALTER TABLE nodes ADD COLUMN state_reason TEXT NOT NULL DEFAULT '';
    ALTER TABLE nodes ADD COLUMN state_since INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE clusters ADD COLUMN status_reason TEXT NOT NULL DEFAULT '';
    "#,
    // 3: drivers per cluster, and an event log per object.
    r#"
    ALTER TABLE clusters ADD COLUMN cuda_version TEXT NOT NULL DEFAULT '';
    ALTER TABLE clusters ADD COLUMN driver_version TEXT NOT NULL DEFAULT '';
    ALTER TABLE clusters ADD COLUMN max_unavailable INTEGER NOT NULL DEFAULT 1
        CHECK (max_unavailable >= 1);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        object_id TEXT NOT NULL,
        tenant_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        node TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX events_by_object ON events (object_id, seq);
    "#,
    // 4: health checks (issue 10): each node's results with history, a cluster's
    // acceptance settings and latest run, and each agent's bandwidth-test address.
    r#"
    CREATE TABLE health_results (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        node_id TEXT NOT NULL,
        node TEXT NOT NULL,
        cluster_id TEXT NOT NULL,
        tenant_id TEXT NOT NULL,
        level TEXT NOT NULL CHECK (level IN ('quick', 'medium', 'long')),
        verdict TEXT NOT NULL CHECK (verdict IN ('passed', 'failed')),
        summary TEXT NOT NULL,
        checks TEXT NOT NULL,
        action TEXT NOT NULL,
        finished_at INTEGER NOT NULL
    );
    CREATE INDEX health_by_node ON health_results (node_id, seq);
    CREATE INDEX health_by_cluster ON health_results (cluster_id, seq);
    CREATE TABLE cluster_acceptance (
        cluster_id TEXT PRIMARY KEY,
        level TEXT NOT NULL CHECK (level IN ('quick', 'medium', 'long')),
        min_bus_bandwidth_gbps REAL NOT NULL CHECK (min_bus_bandwidth_gbps >= 0),
        run_on_create INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('passed', 'failed', 'running', 'not_run')),
        run_id TEXT NOT NULL,
        run_level TEXT NOT NULL,
        checked_at INTEGER NOT NULL,
        alg_bandwidth_gbps REAL NOT NULL,
        bus_bandwidth_gbps REAL NOT NULL
    );
    CREATE TABLE node_endpoints (
        node_id TEXT PRIMARY KEY,
        bandwidth_addr TEXT NOT NULL
    );
    "#,
    // 5: admission at scale (issue 7): an R*Tree over reservation windows, kept by triggers,
    // so admission reads what overlaps a window instead of every reservation ever made;
    // indexes for a tenant's open reservations and for the nodes and clusters of a model.
    r#"
    CREATE VIRTUAL TABLE reservation_windows USING rtree(id, start_time, end_time);
    INSERT INTO reservation_windows (id, start_time, end_time)
        SELECT rowid, start_time, end_time FROM reservations;
    CREATE TRIGGER reservation_windows_insert AFTER INSERT ON reservations BEGIN
        INSERT INTO reservation_windows (id, start_time, end_time)
            VALUES (NEW.rowid, NEW.start_time, NEW.end_time);
    END;
    CREATE TRIGGER reservation_windows_update AFTER UPDATE OF start_time, end_time
        ON reservations BEGIN
        DELETE FROM reservation_windows WHERE id = OLD.rowid;
        INSERT INTO reservation_windows (id, start_time, end_time)
            VALUES (NEW.rowid, NEW.start_time, NEW.end_time);
    END;
    CREATE TRIGGER reservation_windows_delete AFTER DELETE ON reservations BEGIN
        DELETE FROM reservation_windows WHERE id = OLD.rowid;
    END;
    CREATE INDEX reservations_by_tenant ON reservations (tenant_id, end_time);
    CREATE INDEX nodes_by_cluster ON nodes (cluster_id);
    CREATE INDEX nodes_by_model ON nodes (gpu_type, capacity, gpu_count);
    CREATE INDEX clusters_by_model ON clusters (gpu_type);
    "#,
    // 6: preemptible clusters (issue 7): pool nodes that reservations take back, and
    // whether on-demand nodes then replace them. A preemptible cluster may shrink to no
    // nodes, so a cluster's node_count may be 0: SQLite's documented way to relax a CHECK
    // constraint in place (the stored rows all satisfy the new one).
    r#"
    PRAGMA writable_schema = ON;
    UPDATE sqlite_master
        SET sql = replace(sql, 'node_count INTEGER NOT NULL CHECK (node_count >= 1)',
                               'node_count INTEGER NOT NULL CHECK (node_count >= 0)')
        WHERE type = 'table' AND name = 'clusters';
    PRAGMA writable_schema = RESET;
    CREATE TABLE cluster_preemption (
        cluster_id TEXT PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
        allow_on_demand INTEGER NOT NULL
    );
    "#,
    // 7: admission at scale (issue 7): how many nodes each model has per capacity kind, and
    // how many reservations each tenant holds, kept by triggers in the writer's transaction,
    // so an admission reads one row instead of counting the fleet or a tenant's history; an
    // index that answers a model's largest node without a scan.
    r#"
    CREATE TABLE model_nodes (
        gpu_type TEXT NOT NULL,
        capacity TEXT NOT NULL,
        nodes INTEGER NOT NULL CHECK (nodes >= 0),
        PRIMARY KEY (gpu_type, capacity)
    ) WITHOUT ROWID;
    INSERT INTO model_nodes (gpu_type, capacity, nodes)
        SELECT gpu_type, capacity, COUNT(*) FROM nodes GROUP BY gpu_type, capacity;
    CREATE TRIGGER model_nodes_insert AFTER INSERT ON nodes BEGIN
        INSERT INTO model_nodes (gpu_type, capacity, nodes) VALUES (NEW.gpu_type, NEW.capacity, 1)
            ON CONFLICT (gpu_type, capacity) DO UPDATE SET nodes = nodes + 1;
    END;
    CREATE TRIGGER model_nodes_update AFTER UPDATE OF gpu_type, capacity ON nodes BEGIN
        UPDATE model_nodes SET nodes = nodes - 1
            WHERE gpu_type = OLD.gpu_type AND capacity = OLD.capacity;
        INSERT INTO model_nodes (gpu_type, capacity, nodes) VALUES (NEW.gpu_type, NEW.capacity, 1)
            ON CONFLICT (gpu_type, capacity) DO UPDATE SET nodes = nodes + 1;
    END;
    CREATE TRIGGER model_nodes_delete AFTER DELETE ON nodes BEGIN
        UPDATE model_nodes SET nodes = nodes - 1
            WHERE gpu_type = OLD.gpu_type AND capacity = OLD.capacity;
    END;
    CREATE TABLE tenant_reservations (
        tenant_id TEXT PRIMARY KEY,
        reservations INTEGER NOT NULL CHECK (reservations >= 0)
    ) WITHOUT ROWID;
    INSERT INTO tenant_reservations (tenant_id, reservations)
        SELECT tenant_id, COUNT(*) FROM reservations GROUP BY tenant_id;
    CREATE TRIGGER tenant_reservations_insert AFTER INSERT ON reservations BEGIN
        INSERT INTO tenant_reservations (tenant_id, reservations) VALUES (NEW.tenant_id, 1)
            ON CONFLICT (tenant_id) DO UPDATE SET reservations = reservations + 1;
    END;
    CREATE TRIGGER tenant_reservations_update AFTER UPDATE OF tenant_id ON reservations BEGIN
        UPDATE tenant_reservations SET reservations = reservations - 1
            WHERE tenant_id = OLD.tenant_id;
        INSERT INTO tenant_reservations (tenant_id, reservations) VALUES (NEW.tenant_id, 1)
            ON CONFLICT (tenant_id) DO UPDATE SET reservations = reservations + 1;
    END;
    CREATE TRIGGER tenant_reservations_delete AFTER DELETE ON reservations BEGIN
        UPDATE tenant_reservations SET reservations = reservations - 1
            WHERE tenant_id = OLD.tenant_id;
    END;
    CREATE INDEX nodes_by_model_size ON nodes (gpu_type, gpu_count);
    "#,
    // 8: admission at scale (issue 7): reservations sorted into length classes (up to 1 h,
    // 4 h, 16 h, ... 16,384 h, and longer; see `holdings::CLASS_LONGEST`), indexed by
    // model, class and start with everything admission reads. A reservation of class k
    // that overlaps [from, until) starts after from minus the class's longest length, so
    // each class is one short range of one index, read without touching the table. It
    // replaces the R*Tree of migration 5, whose reads looked up every row in the table.
    r#"
    DROP TRIGGER reservation_windows_insert;
    DROP TRIGGER reservation_windows_update;
    DROP TRIGGER reservation_windows_delete;
    DROP TABLE reservation_windows;
    ALTER TABLE reservations ADD COLUMN span_class INTEGER GENERATED ALWAYS AS (
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
    ) VIRTUAL;
    CREATE INDEX reservations_by_window ON reservations
        (gpu_type, span_class, start_time, end_time, pool_nodes, on_demand_nodes, tenant_id, id);
    "#,
    // 9: nodes out of service are nobody's capacity (issue 18): `model_nodes` counts the
    // nodes not quarantined, so admission, availability and quota usage never offer one.
    r#"
    DROP TRIGGER model_nodes_insert;
    DROP TRIGGER model_nodes_update;
    DROP TRIGGER model_nodes_delete;
    DELETE FROM model_nodes;
    INSERT INTO model_nodes (gpu_type, capacity, nodes)
        SELECT gpu_type, capacity, COUNT(*) FROM nodes WHERE state != 'quarantined'
        GROUP BY gpu_type, capacity;
    CREATE TRIGGER model_nodes_insert AFTER INSERT ON nodes WHEN NEW.state != 'quarantined' BEGIN
        INSERT INTO model_nodes (gpu_type, capacity, nodes) VALUES (NEW.gpu_type, NEW.capacity, 1)
            ON CONFLICT (gpu_type, capacity) DO UPDATE SET nodes = nodes + 1;
    END;
    CREATE TRIGGER model_nodes_update_out AFTER UPDATE OF gpu_type, capacity, state ON nodes
        WHEN OLD.state != 'quarantined' BEGIN
        UPDATE model_nodes SET nodes = nodes - 1
            WHERE gpu_type = OLD.gpu_type AND capacity = OLD.capacity;
    END;
    CREATE TRIGGER model_nodes_update_in AFTER UPDATE OF gpu_type, capacity, state ON nodes
        WHEN NEW.state != 'quarantined' BEGIN
        INSERT INTO model_nodes (gpu_type, capacity, nodes) VALUES (NEW.gpu_type, NEW.capacity, 1)
            ON CONFLICT (gpu_type, capacity) DO UPDATE SET nodes = nodes + 1;
    END;
    CREATE TRIGGER model_nodes_delete AFTER DELETE ON nodes WHEN OLD.state != 'quarantined' BEGIN
        UPDATE model_nodes SET nodes = nodes - 1
            WHERE gpu_type = OLD.gpu_type AND capacity = OLD.capacity;
    END;
    "#,
    // 10: the automatic-quarantine breaker (issue 18): the automatic quarantines of each
    // GPU model in the current window, and the models whose breaker is open.
    r#"
    CREATE TABLE automatic_quarantines (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        gpu_type TEXT NOT NULL,
        node_id TEXT NOT NULL,
        at INTEGER NOT NULL
    );
    CREATE INDEX automatic_quarantines_by_model ON automatic_quarantines (gpu_type, at);
    CREATE TABLE quarantine_breakers (
        gpu_type TEXT PRIMARY KEY,
        opened_at INTEGER NOT NULL,
        reason TEXT NOT NULL,
        held INTEGER NOT NULL DEFAULT 0
    );
    "#,
    // 11: Slurm without handing out the key (issue 18): each Slurm cluster's platform-side
    // access (its munge key, its account's uid, the controller's and the login's ports, the
    // team's ssh keys) apart from `credentials`, which is what the team is given. A login
    // port of 0 (clusters from before) is allocated at the cluster's next bring-up.
    r#"
    CREATE TABLE slurm_access (
        cluster_id TEXT PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
        munge_key TEXT NOT NULL,
        uid INTEGER NOT NULL UNIQUE,
        controller_port INTEGER NOT NULL,
        login_port INTEGER NOT NULL,
        ssh_public_keys TEXT NOT NULL DEFAULT '[]'
    );
    INSERT INTO slurm_access (cluster_id, munge_key, uid, controller_port, login_port)
        SELECT id, json_extract(credentials, '$.munge_key'),
               1900000000 + ROW_NUMBER() OVER (ORDER BY rowid),
               CAST(substr(endpoint, instr(endpoint, ':') + 1) AS INTEGER), 0
        FROM clusters
        WHERE orchestrator = 'slurm' AND json_valid(credentials)
          AND json_extract(credentials, '$.munge_key') IS NOT NULL;
    UPDATE clusters SET credentials = '' WHERE orchestrator = 'slurm';
    "#,
    // 12: the store counts its commits (issue 19), next to the count the writer keeps in
    // `state.db.commits` outside the WAL (`commit_record`): a start that finds fewer
    // commits here than there has lost acknowledged writes. The store's random id ties a
    // record to its database.
    r#"
    CREATE TABLE commit_counter (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        store_id TEXT NOT NULL,
        seq INTEGER NOT NULL CHECK (seq >= 0)
    );
    INSERT INTO commit_counter (id, store_id, seq) VALUES (1, lower(hex(randomblob(8))), 0);
    "#,
    // 13: a node's name is bound to the host that first took it (issue 19): the hash of
    // the secret issued at its first registration, which later ones must present. Nodes
    // from before get one at their next registration.
    r#"
    ALTER TABLE nodes ADD COLUMN secret_hash TEXT NOT NULL DEFAULT '';
    "#,
    // 14: a node's host as Slurm declares it (issue 20): the address its slurmd is reached
    // at, the host's name, its CPUs and memory, and whether its GPUs are simulated, as its
    // agent reported them at its last registration. Nodes from before get a row at their
    // next registration.
    r#"
    CREATE TABLE node_hosts (
        node_id TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
        address TEXT NOT NULL,
        hostname TEXT NOT NULL,
        cpus INTEGER NOT NULL,
        memory_mib INTEGER NOT NULL,
        simulated INTEGER NOT NULL
    );
    "#,
    // 15: nodes join as candidates (issue 29): a node is in service from the time it first
    // passed the control plane's own admission checks, was returned by an operator, or was
    // declared by the platform (a fleet file, this host). Until then its failures count
    // toward no breaker, it is never handed out, and it expires. Nodes from before were
    // admitted under the old rules: they are in service.
    r#"
    ALTER TABLE nodes ADD COLUMN in_service_since INTEGER;
    UPDATE nodes SET in_service_since = state_since;
    CREATE INDEX nodes_candidates ON nodes (state_since) WHERE in_service_since IS NULL;
    "#,
    // 16: tokens a platform can live with (issue 30). Each tenant may hold several named
    // tokens, each `read` or `write`, rotated with an overlap, revoked, expiring; the
    // tenant's own token moves here as "default". Only SHA-256 hashes of the secrets are
    // kept, as before (192 random bits each: a slow hash would add nothing). The old
    // `tenants.token_hash` (UNIQUE, so SQLite cannot drop it) is no longer read; new rows
    // put 'moved:<id>' there. Refused tokens stay 30 days so a refusal can say why.
    // The audit log and per-tenant event sequences: a tenant's cursors tell it nothing
    // of other tenants.
    r#"
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        tenant_id TEXT REFERENCES tenants(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        scope TEXT NOT NULL CHECK (scope IN ('read', 'write')),
        hash TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        rotated_at INTEGER,
        retire_at INTEGER,
        revoked_at INTEGER
    );
    CREATE UNIQUE INDEX tokens_live_name ON tokens (IFNULL(tenant_id, ''), name)
        WHERE rotated_at IS NULL AND revoked_at IS NULL;
    INSERT INTO tokens (id, tenant_id, name, scope, hash, created_at)
        SELECT lower(hex(randomblob(16))), id, 'default', 'write', token_hash, created_at
        FROM tenants;
    UPDATE tenants SET token_hash = 'moved:' || id;
    CREATE TABLE audit_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant_seq INTEGER,
        at INTEGER NOT NULL,
        tenant_id TEXT NOT NULL,
        token_name TEXT NOT NULL,
        token_scope TEXT NOT NULL,
        method TEXT NOT NULL,
        object TEXT NOT NULL,
        outcome TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX audit_log_tenant ON audit_log (tenant_id, tenant_seq);
    CREATE INDEX audit_log_at ON audit_log (at);
    ALTER TABLE events ADD COLUMN tenant_seq INTEGER;
    UPDATE events SET tenant_seq = r.n FROM (
        SELECT seq AS s, ROW_NUMBER() OVER (PARTITION BY tenant_id ORDER BY seq) AS n
        FROM events WHERE tenant_id != ''
    ) AS r WHERE events.seq = r.s;
    CREATE INDEX events_tenant_seq ON events (tenant_id, tenant_seq);
    "#,
    // What deleting a cluster does to its volume.
    r#"
    ALTER TABLE clusters ADD COLUMN storage_retention TEXT NOT NULL DEFAULT 'delete'
        CHECK (storage_retention IN ('delete', 'keep'));
    "#,
    // A Slurm cluster's controller and login run on its own nodes (issue 28): which node
    // runs the primary controller and the login (its head) and which the backup (node ids;
    // '' none yet), each node's slurmd port as its slurm.conf declares it (node name ->
    // port), and the login's host key (an OpenSSH private key and its public half), the
    // cluster's whichever node runs the login. Clusters from before get them at their next
    // bring-up (the host key from the control plane's old login files when it has them).
    r#"
    ALTER TABLE slurm_access ADD COLUMN head_node TEXT NOT NULL DEFAULT '';
    ALTER TABLE slurm_access ADD COLUMN backup_node TEXT NOT NULL DEFAULT '';
    ALTER TABLE slurm_access ADD COLUMN node_ports TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE slurm_access ADD COLUMN login_host_key TEXT NOT NULL DEFAULT '';
    ALTER TABLE slurm_access ADD COLUMN login_host_public TEXT NOT NULL DEFAULT '';
    "#,
    // Job ids never go back when a head is lost without shared storage (issue 39): the
    // greatest NEXT_JOB_ID any controller of the cluster reported, and the FirstJobId the
    // current head's controller was started with (0: Slurm's default).
    r#"
    ALTER TABLE slurm_access ADD COLUMN next_job_id INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE slurm_access ADD COLUMN first_job_id INTEGER NOT NULL DEFAULT 0;
    "#,
    // The audit log as chains (issue 40, `store::audit`): each entry carries the SHA-256 of
    // the one before it in its chain and its place there; `audit_chains` records where each
    // chain starts and its newest entry. Entries from before stay unchained, ahead of their
    // chain. Admin calls are marked (`by_admin`): an admin call on a team's objects is the
    // team's entry too. A tenant's sequence is counted apart, so pruning never reuses it.
    r#"
    ALTER TABLE audit_log ADD COLUMN by_admin INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit_log ADD COLUMN chain TEXT NOT NULL DEFAULT '';
    ALTER TABLE audit_log ADD COLUMN chain_seq INTEGER;
    ALTER TABLE audit_log ADD COLUMN prev_hash BLOB;
    UPDATE audit_log SET
        by_admin = (tenant_id = '' AND token_name != ''),
        chain = CASE WHEN tenant_id != '' THEN tenant_id WHEN token_name != '' THEN '' ELSE '*' END;
    CREATE INDEX audit_log_chain ON audit_log (chain, seq);
    CREATE TABLE audit_chains (
        chain TEXT PRIMARY KEY,
        start_seq INTEGER NOT NULL,
        start_chain_seq INTEGER NOT NULL,
        start_prev_hash BLOB NOT NULL,
        head_seq INTEGER NOT NULL,
        head_chain_seq INTEGER NOT NULL,
        head_hash BLOB NOT NULL,
        pruned INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE audit_tenant_seqs (
        tenant_id TEXT PRIMARY KEY,
        last INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO audit_tenant_seqs (tenant_id, last)
        SELECT tenant_id, MAX(tenant_seq) FROM audit_log WHERE tenant_id != '' GROUP BY tenant_id;
    "#,
    // Where each candidate node registered from (issue 40): anyone with the join token can
    // register names, so candidates are bounded per source address too (serve's
    // --max-candidates-per-source). Empty for nodes from before and the platform's own.
    r#"
    ALTER TABLE nodes ADD COLUMN joined_from TEXT NOT NULL DEFAULT '';
    CREATE INDEX nodes_candidates_from ON nodes (joined_from) WHERE in_service_since IS NULL;
    "#,
    // GPU-seconds held (issue 42): one interval per node a cluster holds, opened and
    // closed in the transactions that assign and release it (`store::usage`); the names
    // are copied so history outlives the tenant and cluster. Nodes held at upgrade start
    // counting now. `usage_pruned` carries what retention removed into lifetime totals.
    r#"
    CREATE TABLE usage_intervals (
        id INTEGER PRIMARY KEY,
        node_id TEXT NOT NULL,
        tenant_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        cluster TEXT NOT NULL,
        gpu_type TEXT NOT NULL,
        class TEXT NOT NULL,
        gpus INTEGER NOT NULL CHECK (gpus > 0),
        start_time INTEGER NOT NULL,
        end_time INTEGER CHECK (end_time IS NULL OR end_time >= start_time)
    );
    CREATE INDEX usage_intervals_open ON usage_intervals (node_id) WHERE end_time IS NULL;
    CREATE INDEX usage_intervals_open_by_tenant ON usage_intervals (tenant_id, gpu_type, class)
        WHERE end_time IS NULL;
    CREATE INDEX usage_intervals_end ON usage_intervals (end_time);
    CREATE INDEX usage_intervals_tenant ON usage_intervals (tenant_id, start_time);
    CREATE TABLE usage_pruned (
        tenant_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        gpu_type TEXT NOT NULL,
        class TEXT NOT NULL,
        gpu_seconds INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, gpu_type, class)
    ) WITHOUT ROWID;
    INSERT INTO usage_intervals (node_id, tenant_id, tenant, cluster, gpu_type, class, gpus, start_time)
        SELECT n.id, c.tenant_id, t.name, c.name, n.gpu_type,
               CASE WHEN n.capacity <> 'pool' THEN 'on-demand'
                    WHEN EXISTS (SELECT 1 FROM cluster_preemption p WHERE p.cluster_id = c.id)
                        THEN 'borrowed-preemptible'
                    ELSE 'guaranteed' END,
               n.gpu_count, CAST(strftime('%s', 'now') AS INTEGER)
        FROM nodes n JOIN clusters c ON c.id = n.cluster_id JOIN tenants t ON t.id = c.tenant_id
        WHERE n.gpu_count > 0;
    "#,
    // Fair sharing of idle capacity (issue 42): a quota's weight (capacity taken back
    // from borrowers comes first from the one furthest above its weighted share) and how
    // many of its idle guaranteed GPUs may be lent to other tenants (NULL: no limit).
    r#"
    ALTER TABLE quotas ADD COLUMN weight INTEGER NOT NULL DEFAULT 1
        CHECK (weight BETWEEN 1 AND 1000);
    ALTER TABLE quotas ADD COLUMN lending_limit_gpus INTEGER
        CHECK (lending_limit_gpus IS NULL OR lending_limit_gpus >= 0);
    "#,
    // Singletons behind a fenced lease (issue 41): the replica holding a lease does its
    // work; a takeover raises the epoch, which every write of a singleton checks in its
    // transaction and every order to a node agent carries (`store::leases`).
    r#"
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch INTEGER NOT NULL CHECK (epoch >= 1),
        expires_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // GPU-seconds used (issue 42): the node agents' utilisation readings, per tenant,
    // cluster, model, class and hour (`store::usage::record_used`). `used_ms` is the
    // GPU-milliseconds the GPUs were busy, `measured_ms` those the readings covered (a GPU
    // that reports no utilisation, as under MIG, covers none); `first_t`..`last_t` the
    // part of the hour the readings covered. An interval's `used_through` is its last
    // reading counted, so a reading is never counted twice, across restarts too.
    r#"
    CREATE TABLE usage_used (
        tenant_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        cluster TEXT NOT NULL,
        gpu_type TEXT NOT NULL,
        class TEXT NOT NULL,
        hour INTEGER NOT NULL,
        used_ms INTEGER NOT NULL CHECK (used_ms >= 0),
        measured_ms INTEGER NOT NULL CHECK (measured_ms >= used_ms),
        first_t INTEGER NOT NULL,
        last_t INTEGER NOT NULL CHECK (last_t > first_t),
        PRIMARY KEY (tenant_id, cluster, gpu_type, class, hour)
    ) WITHOUT ROWID;
    CREATE INDEX usage_used_last ON usage_used (last_t);
    CREATE INDEX usage_used_tenant ON usage_used (tenant_id, last_t);
    ALTER TABLE usage_intervals ADD COLUMN used_through INTEGER;
    CREATE INDEX usage_intervals_node ON usage_intervals (node_id, end_time);
    ALTER TABLE usage_pruned ADD COLUMN used_ms INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage_pruned ADD COLUMN measured_ms INTEGER NOT NULL DEFAULT 0;
    "#,
    // MIG profiles in usage (issue 42): a node of a cluster with a MIG layout has an
    // interval per class and profile, counting its instances (`slices`) and its part of
    // the GPUs (`share_840ths`, in 840ths of a GPU: `store::usage::profile_shares`).
    // Existing rows are whole GPUs ('none', no slices, the whole GPU). The used and
    // pruned totals are keyed by the profile too (rebuilt: a key cannot be altered), the
    // pruned held time kept in 840ths of GPU-seconds so no part is rounded away.
    r#"
    ALTER TABLE usage_intervals ADD COLUMN mig_profile TEXT NOT NULL DEFAULT 'none';
    ALTER TABLE usage_intervals ADD COLUMN slices INTEGER NOT NULL DEFAULT 0
        CHECK (slices >= 0);
    ALTER TABLE usage_intervals ADD COLUMN share_840ths INTEGER NOT NULL DEFAULT 840
        CHECK (share_840ths BETWEEN 1 AND 840);
    CREATE TABLE usage_used_by_profile (
        tenant_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        cluster TEXT NOT NULL,
        gpu_type TEXT NOT NULL,
        class TEXT NOT NULL,
        mig_profile TEXT NOT NULL,
        hour INTEGER NOT NULL,
        used_ms INTEGER NOT NULL CHECK (used_ms >= 0),
        measured_ms INTEGER NOT NULL CHECK (measured_ms >= used_ms),
        first_t INTEGER NOT NULL,
        last_t INTEGER NOT NULL CHECK (last_t > first_t),
        PRIMARY KEY (tenant_id, cluster, gpu_type, class, mig_profile, hour)
    ) WITHOUT ROWID;
    INSERT INTO usage_used_by_profile
        SELECT tenant_id, tenant, cluster, gpu_type, class, 'none', hour, used_ms,
               measured_ms, first_t, last_t
        FROM usage_used;
    DROP TABLE usage_used;
    ALTER TABLE usage_used_by_profile RENAME TO usage_used;
    CREATE INDEX usage_used_last ON usage_used (last_t);
    CREATE INDEX usage_used_tenant ON usage_used (tenant_id, last_t);
    CREATE TABLE usage_pruned_by_profile (
        tenant_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        gpu_type TEXT NOT NULL,
        mig_profile TEXT NOT NULL,
        class TEXT NOT NULL,
        gpu_seconds_840ths INTEGER NOT NULL,
        slice_seconds INTEGER NOT NULL DEFAULT 0,
        used_ms INTEGER NOT NULL DEFAULT 0,
        measured_ms INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant_id, gpu_type, mig_profile, class)
    ) WITHOUT ROWID;
    INSERT INTO usage_pruned_by_profile
        SELECT tenant_id, tenant, gpu_type, 'none', class, gpu_seconds * 840, 0, used_ms,
               measured_ms
        FROM usage_pruned;
    DROP TABLE usage_pruned;
    ALTER TABLE usage_pruned_by_profile RENAME TO usage_pruned;
    "#,
    // Creates that wait for capacity (issue 42): a cluster in status "queued" holds no
    // node; its row here says since when it waits and until when (`store::queue`).
    r#"
    CREATE TABLE cluster_queue (
        cluster_id TEXT PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
        queued_at INTEGER NOT NULL,
        wait_until INTEGER NOT NULL CHECK (wait_until > queued_at)
    ) WITHOUT ROWID;
    "#,
    // Take-backs decided and not yet recorded (issue 41): the preemption loop's decision
    // marks its victim with the lease's epoch and the replacements it assigned, its record
    // deletes the row; a later leader settles the rows an older epoch left
    // (`store::take_backs`).
    r#"
    CREATE TABLE pending_take_backs (
        cluster_id TEXT PRIMARY KEY REFERENCES clusters(id) ON DELETE CASCADE,
        epoch INTEGER NOT NULL CHECK (epoch >= 1),
        replacements TEXT NOT NULL,
        decided_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 29: clusters numbered in the order they are created (`created_seq`), which the
    // take-back's "newest gives back first" reads (`store::preemption::holding_pool`):
    // SQLite's rowid said it, and PostgreSQL (issue 41) has no rowid. Existing clusters
    // keep their rowid's order; a new one is numbered by a trigger.
    r#"
    ALTER TABLE clusters ADD COLUMN created_seq INTEGER;
    UPDATE clusters SET created_seq = rowid;
    CREATE TRIGGER clusters_created_seq AFTER INSERT ON clusters WHEN NEW.created_seq IS NULL BEGIN
        UPDATE clusters SET created_seq = NEW.rowid WHERE rowid = NEW.rowid;
    END;
    "#,
    // 30: where the lease's holder serves its API (`leases.holder_url`), so that a replica
    // that does not lead forwards requests to the one that does (issue 41).
    "ALTER TABLE leases ADD COLUMN holder_url TEXT NOT NULL DEFAULT '';",
];

/// Prepared statements kept per connection.
pub const STATEMENT_CACHE: usize = 256;

/// Runs one statement through the connection's statement cache, so a statement run once
/// per node of a large cluster is compiled once, not a thousand times.
pub fn exec<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Keeps the hot pages in memory (64 MiB of page cache, and the file mapped) instead of
/// reading them back from the OS on every admission.
pub fn tune_reads(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "cache_size", -65_536)?;
    conn.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    Ok(())
}

/// What connections map of the database file.
const MMAP_BYTES: i64 = 1 << 30;

/// The writer reads through the map too, so its page cache holds little more than the
/// pages it writes. It stays small (4 MiB) because SQLite scans the whole cache at every
/// commit that followed a B-tree page split (a split moves a page through the lock
/// page's number, above the file's end), and random keys split pages often.
fn tune_writes(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "cache_size", -4_096)?;
    conn.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    Ok(())
}

/// How durable a commit is when its caller is answered (`serve --durability`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: every commit is on disk (the WAL fsynced) before anyone is
    /// answered; it survives an OS crash or power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: a commit survives the process (kill -9 included), but an OS
    /// crash or power loss may lose the last ones, which were acknowledged; the WAL is
    /// fsynced only at checkpoints.
    Normal,
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        }
    }
}

/// Opens (creating when needed) the database and brings its schema up to date, without
/// the checks of [`open_checked`] and without fsyncs at each commit (tests, tools).
pub fn open(path: &Path) -> anyhow::Result<Connection> {
    let mut conn = connect(path, Durability::Normal)?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// The writer connection's settings on a database file.
fn connect(path: &Path, durability: Durability) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // Room for every statement the handlers run, so none is compiled twice.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    tune_writes(&conn)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", durability.pragma())?;
    Ok(conn)
}

/// How `serve` opens the store.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    pub durability: Durability,
    /// What to do with a database behind its commit record (`--accept-rollback`).
    pub on_loss: commit_record::OnLoss,
}

/// The store as `serve` opens it: checked whole (`quick_check`) and against its commit
/// record, migrated, with the record the writer keeps from then on. A damaged file or a
/// lost commit is an error naming the file and what was lost; only the second can be
/// accepted (`options.on_loss`), which resets the record to what the database holds.
pub fn open_checked(
    path: &Path,
    options: OpenOptions,
) -> anyhow::Result<(Connection, commit_record::CommitRecord)> {
    let record_path = commit_record::path_for(path);
    let mut recorded = commit_record::read(&record_path)?;
    // A record without its database: the database was deleted (or emptied). Checked
    // before opening, which would make an empty one in its place.
    let holds_data = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.len() > 0);
    let wal = path.with_file_name(format!(
        "{}-wal",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    if !holds_data(path) && !holds_data(&wal) {
        if let commit_record::Recorded::Count(r) = &recorded {
            if r.commits > 0 {
                let refusal = format!(
                    "{} is missing or empty, but its commit record {} says {} commits were acknowledged: put back state.db (with its state.db-wal) from a backup, or start with --accept-rollback to begin with an empty store",
                    path.display(),
                    record_path.display(),
                    r.commits
                );
                if options.on_loss == commit_record::OnLoss::Refuse {
                    anyhow::bail!("{refusal}. See docs/operations.md, \"A damaged store\"");
                }
                tracing::warn!("--accept-rollback: {refusal}");
            }
        }
        // A new store: nothing of a record can be checked against it.
        recorded = commit_record::Recorded::Missing;
    }
    let started = std::time::Instant::now();
    let mut conn = connect(path, options.durability).map_err(|e| damaged(path, e))?;
    quick_check(path, &conn)?;
    let checked = started.elapsed();
    migrate(&mut conn).map_err(|e| match e.downcast::<rusqlite::Error>() {
        Ok(e) => damaged(path, e),
        Err(e) => e,
    })?;
    let count = commit_record::in_database(&conn).map_err(|e| damaged(path, e))?;
    commit_record::check(path, &count, &recorded, options.on_loss)?;
    let record = commit_record::CommitRecord::reset(&record_path, &count)?;
    tracing::info!(
        commits = count.commits,
        check_ms = checked.as_secs_f64() * 1e3,
        durability = options.durability.pragma(),
        "opened the state database and checked it against its commit record"
    );
    Ok((conn, record))
}

/// `PRAGMA quick_check` over the whole file (every page, WAL included): a truncated or
/// overwritten `state.db` is refused here instead of failing requests later.
fn quick_check(path: &Path, conn: &Connection) -> anyhow::Result<()> {
    let problems = (|| -> rusqlite::Result<Vec<String>> {
        let mut stmt = conn.prepare("PRAGMA quick_check(5)")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect()
    })()
    .map_err(|e| damaged(path, e))?;
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(damaged_because(path, &problems.join("; ")))
}

/// A database that cannot be read as one.
fn damaged(path: &Path, e: rusqlite::Error) -> anyhow::Error {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    match e.sqlite_error_code() {
        Some(DatabaseCorrupt | NotADatabase) => damaged_because(path, &e.to_string()),
        _ => anyhow::Error::new(e)
            .context(format!("cannot open the state database {}", path.display())),
    }
}

fn damaged_because(path: &Path, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is damaged ({why}): put back a backup of it; --accept-rollback cannot serve a damaged file. See docs/operations.md, \"A damaged store\"",
        path.display()
    )
}

fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )?;
    let current: i64 = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )?;
    if current > MIGRATIONS.len() as i64 {
        anyhow::bail!(
            "the database has schema version {current}, newer than this binary knows ({}); use a newer gpufleet-agent",
            MIGRATIONS.len()
        );
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            (i as i64 + 1, crate::clock::Clock::System.now()),
        )?;
        tx.commit()?;
        tracing::info!(version = i + 1, "applied schema migration");
    }
    Ok(())
}

/// Serializes a string map for a TEXT column.
pub fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("maps of strings always serialize")
}

pub fn from_json<T: serde::de::DeserializeOwned + Default>(text: &str) -> T {
    serde_json::from_str(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn migrations_apply_once_and_are_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(super::open(&path).unwrap());
        let conn = super::open(&path).unwrap();
        let versions: i64 = conn
            .query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(versions, super::MIGRATIONS.len() as i64);
        let fk: i64 = conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    /// Rows of (model, kind, nodes) or (tenant, reservations).
    type Counts3 = Vec<(String, String, i64)>;
    type Counts2 = Vec<(String, i64)>;

    /// What the trigger-kept counters say, next to what counting the rows says.
    fn counters(conn: &rusqlite::Connection) -> (Counts3, Counts3, Counts2, Counts2) {
        let rows3 = |sql: &str| -> Vec<(String, String, i64)> {
            let mut stmt = conn.prepare(sql).unwrap();
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap();
            rows.collect::<rusqlite::Result<_>>().unwrap()
        };
        let rows2 = |sql: &str| -> Vec<(String, i64)> {
            let mut stmt = conn.prepare(sql).unwrap();
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
            rows.collect::<rusqlite::Result<_>>().unwrap()
        };
        (
            rows3("SELECT gpu_type, capacity, nodes FROM model_nodes WHERE nodes > 0 ORDER BY 1, 2"),
            rows3("SELECT gpu_type, capacity, COUNT(*) FROM nodes GROUP BY 1, 2 ORDER BY 1, 2"),
            rows2("SELECT tenant_id, reservations FROM tenant_reservations WHERE reservations > 0 ORDER BY 1"),
            rows2("SELECT tenant_id, COUNT(*) FROM reservations GROUP BY 1 ORDER BY 1"),
        )
    }

    fn add_node(conn: &rusqlite::Connection, id: &str, gpu_type: &str, capacity: &str) {
        conn.execute(
            "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version, cuda_version)
             VALUES (?1, ?1, ?2, ?3, 8, '550.54.15', '12.4')",
            (id, gpu_type, capacity),
        )
        .unwrap();
    }

    fn add_reservation(conn: &rusqlite::Connection, id: &str, tenant: &str) {
        conn.execute(
            "INSERT INTO reservations (id, tenant_id, gpu_type, node_count, start_time, end_time,
                 allow_on_demand, pool_nodes, on_demand_nodes)
             VALUES (?1, ?2, 'H100-80GB', 1, 100, 200, 0, 1, 0)",
            (id, tenant),
        )
        .unwrap();
    }

    /// A database with the first `version` migrations applied, as an older release left it.
    fn at_version(path: &std::path::Path, version: usize) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
        )
        .unwrap();
        for (i, sql) in super::MIGRATIONS[..version].iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?1, 0)",
                [i as i64 + 1],
            )
            .unwrap();
        }
        conn
    }

    fn add_tenant(conn: &rusqlite::Connection, id: &str) {
        conn.execute(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES (?1, ?1, ?1, '{}', ?1, 0)",
            [id],
        )
        .unwrap();
    }

    #[test]
    fn counters_kept_by_triggers_match_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::open(&dir.path().join("state.db")).unwrap();
        for t in ["t1", "t2"] {
            add_tenant(&conn, t);
        }
        add_node(&conn, "a", "H100-80GB", "pool");
        add_node(&conn, "b", "H100-80GB", "pool");
        add_node(&conn, "c", "H100-80GB", "on-demand");
        add_node(&conn, "d", "A100-80GB", "pool");
        for (id, t) in [("r1", "t1"), ("r2", "t1"), ("r3", "t2")] {
            add_reservation(&conn, id, t);
        }
        let (kept, counted, kept_r, counted_r) = counters(&conn);
        assert_eq!(kept, counted);
        assert_eq!(kept.len(), 3);
        assert_eq!(kept_r, vec![("t1".into(), 2), ("t2".into(), 1)]);
        assert_eq!(kept_r, counted_r);
        assert_eq!(super::nodes::counts(&conn, "H100-80GB").unwrap(), (2, 1));
        assert_eq!(super::nodes::counts(&conn, "B200").unwrap(), (0, 0));
        assert_eq!(super::reservations::count_held(&conn, "t1").unwrap(), 2);
        assert_eq!(super::reservations::count_held(&conn, "nobody").unwrap(), 0);

        // Moves between kinds and models, and removals, follow.
        conn.execute("UPDATE nodes SET capacity = 'on-demand' WHERE id = 'a'", [])
            .unwrap();
        conn.execute(
            "UPDATE nodes SET gpu_type = 'H100-80GB', capacity = 'pool' WHERE id = 'd'",
            [],
        )
        .unwrap();
        conn.execute("UPDATE nodes SET state_reason = 'x' WHERE id = 'b'", [])
            .unwrap();
        conn.execute("DELETE FROM nodes WHERE id = 'c'", [])
            .unwrap();
        conn.execute(
            "UPDATE reservations SET tenant_id = 't2' WHERE id = 'r1'",
            [],
        )
        .unwrap();
        conn.execute("DELETE FROM reservations WHERE id = 'r2'", [])
            .unwrap();
        let (kept, counted, kept_r, counted_r) = counters(&conn);
        assert_eq!(kept, counted);
        assert_eq!(super::nodes::counts(&conn, "H100-80GB").unwrap(), (2, 1));
        assert_eq!(super::nodes::counts(&conn, "A100-80GB").unwrap(), (0, 0));
        assert_eq!(kept_r, counted_r);
        assert_eq!(kept_r, vec![("t2".into(), 2)]);
    }

    #[test]
    fn counters_start_from_the_rows_of_an_older_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            // A database at schema version 6, holding rows, as a previous release left it.
            let conn = at_version(&path, 6);
            add_tenant(&conn, "t1");
            add_node(&conn, "a", "H100-80GB", "pool");
            add_node(&conn, "b", "H100-80GB", "on-demand");
            add_reservation(&conn, "r1", "t1");
        }
        let conn = super::open(&path).unwrap();
        let (kept, counted, kept_r, counted_r) = counters(&conn);
        assert_eq!(kept, counted);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept_r, counted_r);
        assert_eq!(kept_r, vec![("t1".into(), 1)]);
        // Its reservation is found by the admission index built by the upgrade.
        let held = super::holdings::overlapping(&conn, "H100-80GB", 150, Some(160)).unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].id, "r1");
    }

    #[test]
    fn a_tenants_token_and_events_survive_the_move_to_named_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            // A database at schema version 15, as the release before issue 30 left it.
            let conn = at_version(&path, 15);
            add_tenant(&conn, "t1");
            add_tenant(&conn, "t2");
            for (tenant, object) in [("t1", "c1"), ("t2", "c2"), ("", "n1"), ("t1", "c1")] {
                conn.execute(
                    "INSERT INTO events (at, object_id, tenant_id, kind, node, message) VALUES (1, ?1, ?2, 'k', '', '')",
                    [object, tenant],
                )
                .unwrap();
            }
        }
        let conn = super::open(&path).unwrap();
        let token = super::tokens::by_hash(&conn, "t1").unwrap().unwrap();
        assert_eq!(
            (
                token.tenant_id.as_deref(),
                token.name.as_str(),
                token.scope.as_str()
            ),
            (Some("t1"), "default", "write")
        );
        let own: Vec<Option<i64>> = super::events::stream(&conn, Some("t1"), 0, 10)
            .unwrap()
            .into_iter()
            .map(|e| e.tenant_seq)
            .collect();
        assert_eq!(own, vec![Some(1), Some(2)]);
        // New events continue each tenant's sequence.
        super::events::record(&conn, 2, "c2", "t2", "k", "", "").unwrap();
        let t2 = super::events::stream(&conn, Some("t2"), 1, 10).unwrap();
        assert_eq!(t2[0].tenant_seq, Some(2));
    }
}
