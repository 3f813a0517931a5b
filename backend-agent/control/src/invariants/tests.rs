//! Each invariant broken by hand in a real store (SQLite, as `serve` migrates it) and
//! named by the check, read through the same read-only path as `gpufleet-agent check`.

use rusqlite::Connection;

use super::answers::{self, Answer};
use super::{check_store, Concern, Violation};
use crate::clock::rfc3339;

const NOW: i64 = 1_900_000_000;
const H100: &str = "H100-80GB";

/// A store with tenants `a` (quota 32 H100 GPUs) and `b` (16 + 8 burst), four pool and
/// one on-demand H100 node of 8 GPUs; `a` holds cluster `c1` on two pool nodes and
/// reservation `r1` of two nodes in an hour. Nothing in it is wrong.
struct Store {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    conn: Connection,
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = crate::store::open(&path).unwrap();
        let store = Store {
            _dir: dir,
            path,
            conn,
        };
        for t in ["a", "b"] {
            store.sql(&format!(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('{t}', 'team-{t}', '{t}', '{{}}', 'h{t}', 0)"
            ));
        }
        store.sql("INSERT INTO quotas (id, tenant_id, gpu_type, gpus, burst_gpus) VALUES ('qa', 'a', 'H100-80GB', 32, 0), ('qb', 'b', 'H100-80GB', 16, 8)");
        for i in 1..=4 {
            store.node(&format!("p{i}"), H100, "pool");
        }
        store.node("od1", H100, "on-demand");
        store.cluster("c1", "a", None, 2);
        store.assign("p1", "c1");
        store.assign("p2", "c1");
        store.reservation("r1", "a", NOW + 3600, NOW + 7200, (2, 0));
        store
    }

    fn sql(&self, sql: &str) {
        self.conn
            .execute_batch(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    fn node(&self, id: &str, model: &str, capacity: &str) {
        self.sql(&format!(
            "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                cuda_version, state)
             VALUES ('{id}', 'host-{id}', '{model}', '{capacity}', 8, '550', '12.4', 'ready')"
        ));
    }

    /// Through the store's own holding path, which writes the usage records too.
    fn assign(&self, node: &str, cluster: &str) {
        assert!(crate::store::nodes::assign(&self.conn, node, cluster, NOW).unwrap());
    }

    fn cluster(&self, id: &str, tenant: &str, reservation: Option<&str>, node_count: i64) {
        let reservation = reservation.map_or("NULL".to_string(), |r| format!("'{r}'"));
        self.sql(&format!(
            "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                   reservation_id, storage_gib, status, endpoint, credentials,
                                   storage_path, mig_layout)
             VALUES ('{id}', '{tenant}', 'name-{id}', 'kubernetes', 'H100-80GB', {node_count},
                     {reservation}, 100, 'running', '', '', '', '{{}}')"
        ));
    }

    fn reservation(&self, id: &str, tenant: &str, start: i64, end: i64, split: (i64, i64)) {
        crate::store::reservations::insert(
            &self.conn,
            &crate::store::reservations::ReservationRow {
                id: id.into(),
                tenant_id: tenant.into(),
                gpu_type: H100.into(),
                node_count: split.0 + split.1,
                start_time: start,
                end_time: end,
                allow_on_demand: split.1 > 0,
                pool_nodes: split.0,
                on_demand_nodes: split.1,
            },
        )
        .unwrap();
    }

    fn event(&self, object: &str, tenant: &str) {
        crate::store::events::record(&self.conn, NOW, object, tenant, "created", "", "x").unwrap();
    }

    /// An audit entry of `tenant`, numbered as the store's writer numbers them.
    fn audit(&self, tenant: &str) {
        self.sql(&format!(
            "INSERT INTO audit_log (tenant_seq, at, tenant_id, token_name, token_scope, method,
                                    object, outcome, message)
             VALUES ((SELECT IFNULL(MAX(tenant_seq), 0) + 1 FROM audit_log
                      WHERE tenant_id = '{tenant}'),
                     {NOW}, '{tenant}', 'default', 'write', 'CreateReservation', '', 'ok', '')"
        ));
    }

    fn check(&self, answers: Option<&[Answer]>) -> Vec<Violation> {
        check_store(&self.path, NOW, answers).unwrap()
    }

    /// The one violation the store has, of `concern`.
    fn only(&self, concern: Concern, answers: Option<&[Answer]>) -> String {
        let found = self.check(answers);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].concern, concern, "{found:#?}");
        found[0].to_string()
    }
}

#[test]
fn a_store_that_keeps_every_promise_has_no_violation() {
    let store = Store::new();
    // The pool is full in r1's window: b's reservation takes the on-demand node.
    store.reservation("r2", "b", NOW + 1800, NOW + 9000, (0, 1));
    // A preemptible cluster on a pool node: it yields to r1 and r2 when they start.
    store.cluster("pre", "b", None, 1);
    store.sql("INSERT INTO cluster_preemption VALUES ('pre', 0)");
    store.assign("p3", "pre");
    // A reservation that ended holds nothing any more.
    store.reservation("old", "a", NOW - 7200, NOW - 3600, (4, 0));
    for _ in 0..3 {
        store.event("c1", "a");
        store.audit("a");
    }
    store.event("n1", "");
    assert_eq!(store.check(None), Vec::<Violation>::new());
}

#[test]
fn an_overbooked_pool_is_named_with_its_instant_holders_and_numbers() {
    let store = Store::new();
    // From r1's start, c1 (2) + r1 (2) + r2 (1) = 5 pool nodes of 4.
    store.reservation("r2", "b", NOW + 3000, NOW + 4000, (1, 0));
    let message = store.only(Concern::Capacity, None);
    assert_eq!(
        message,
        format!(
            "capacity: H100-80GB pool overbooked at {}: 5 nodes held (reservation r1 (2), reservation r2 (1), cluster c1 (2)), the fleet has 4 in service",
            rfc3339(NOW + 3600)
        )
    );
}

#[test]
fn on_demand_capacity_and_quarantined_nodes_count_too() {
    let store = Store::new();
    store.reservation("r2", "b", NOW, NOW + 600, (0, 2));
    let message = store.only(Concern::Capacity, None);
    assert!(
        message.contains("H100-80GB on-demand overbooked at")
            && message.contains("2 nodes held (reservation r2 (2)), the fleet has 1 in service"),
        "{message}"
    );
    // A quarantined pool node is no one's capacity: c1 and r1 then need 4 of 3.
    let store = Store::new();
    store.sql("UPDATE nodes SET state = 'quarantined' WHERE id = 'p4'");
    let message = store.only(Concern::Capacity, None);
    assert!(
        message.ends_with(
            "4 nodes held (reservation r1 (2), cluster c1 (2)), the fleet has 3 in service"
        ),
        "{message}"
    );
}

#[test]
fn a_tenant_over_its_quota_is_named_with_the_instant_and_its_limit() {
    let store = Store::new();
    store.sql("UPDATE quotas SET gpus = 24 WHERE id = 'qa'");
    let message = store.only(Concern::Quota, None);
    assert_eq!(
        message,
        format!(
            "quota: tenant 'team-a' (a) holds 32 H100-80GB GPUs at {} (reservation r1 (16), cluster c1 (16)), its quota 24 (24 guaranteed + 0 burst)",
            rfc3339(NOW + 3600)
        )
    );
    // Holding a model without any quota for it.
    let store = Store::new();
    store.sql("DELETE FROM quotas WHERE id = 'qa'");
    let found = store.check(None);
    assert!(
        found
            .iter()
            .any(|v| v.to_string().ends_with("it has no quota for it")),
        "{found:#?}"
    );
}

#[test]
fn nodes_in_clusters_that_are_not_theirs_are_named() {
    let store = Store::new();
    store.sql("PRAGMA foreign_keys = OFF");
    store.assign("p3", "gone");
    let message = store.only(Concern::Membership, None);
    assert_eq!(
        message,
        "membership: node p3 (host-p3) is assigned to cluster gone, which does not exist"
    );

    let store = Store::new();
    store.node("a1", "A100-80GB", "pool");
    store.assign("a1", "c1");
    let found = store.check(None);
    assert!(
        found.iter().any(|v| v.to_string()
            == "membership: node a1 (host-a1) is a A100-80GB node in cluster c1 of H100-80GB"),
        "{found:#?}"
    );
}

#[test]
fn clusters_holding_more_than_their_reservation_has_are_named() {
    let store = Store::new();
    // r1 is active now with 2 nodes; its clusters hold 3.
    store.sql(&format!(
        "UPDATE reservations SET start_time = {} WHERE id = 'r1'",
        NOW - 60
    ));
    store.cluster("d1", "a", Some("r1"), 2);
    store.cluster("d2", "a", Some("r1"), 1);
    store.assign("p3", "d1");
    store.assign("p4", "d1");
    store.assign("od1", "d2");
    let found = store.check(None);
    assert!(
        found.iter().any(|v| v.to_string()
            == "membership: reservation r1 has 2 nodes, its clusters hold 3 (cluster d1 (2), cluster d2 (1))"),
        "{found:#?}"
    );
    // Another tenant's reservation is not one to draw from.
    let store = Store::new();
    store.cluster("e1", "b", Some("r1"), 1);
    let message = store.only(Concern::Membership, None);
    assert!(
        message.contains("cluster e1 of tenant 'team-b' (b) and H100-80GB draws from reservation r1 of tenant 'team-a' (a)"),
        "{message}"
    );
}

#[test]
fn holes_and_disorder_in_a_tenants_sequences_are_named() {
    let store = Store::new();
    for _ in 0..4 {
        store.event("c1", "a");
    }
    store.sql("DELETE FROM events WHERE tenant_seq IN (2, 3)");
    let message = store.only(Concern::Sequence, None);
    assert_eq!(
        message,
        "sequence: events of tenant 'team-a' (a): tenant_seq goes from 1 (seq 1) to 4 (seq 4): 2..=3 are missing"
    );

    let store = Store::new();
    store.audit("b");
    store.audit("b");
    store.sql("UPDATE audit_log SET tenant_seq = 1 WHERE seq = 2");
    let message = store.only(Concern::Sequence, None);
    assert_eq!(
        message,
        "sequence: audit entries of tenant 'team-b' (b): tenant_seq 1 (seq 2) comes after tenant_seq 1 (seq 1); it must rise"
    );
}

/// An object keeps its newest events only; the hole that leaves in its tenant's
/// sequence is the store's own pruning, not a lost event.
#[test]
fn the_event_logs_own_pruning_is_no_hole() {
    let store = Store::new();
    store.event("c1", "a");
    for _ in 0..crate::store::events::KEEP_PER_OBJECT + 5 {
        store.event("busy", "a");
    }
    store.event("c1", "a");
    assert_eq!(store.check(None), Vec::<Violation>::new());
    // The same hole above the pruning horizon is one.
    store.event("c1", "a");
    store.event("c1", "a");
    store.sql(
        "DELETE FROM events WHERE seq = (SELECT MAX(seq) - 1 FROM events WHERE tenant_id = 'a')",
    );
    assert_eq!(
        store
            .only(Concern::Sequence, None)
            .matches("is missing")
            .count(),
        1
    );
}

fn answer(line: &str) -> Answer {
    answers::parse(line).unwrap().remove(0)
}

#[test]
fn acknowledged_answers_the_store_does_not_hold_are_named() {
    let store = Store::new();
    let held = [
        answer(
            r#"{"request_id":"1","op":"create","kind":"cluster","object":{"id":"c1","tenant_id":"a","gpu_type":"H100-80GB","node_count":2,"name":"name-c1","reservation_id":""}}"#,
        ),
        answer(&format!(
            r#"{{"request_id":"2","op":"create","kind":"reservation","object":{{"id":"r1","node_count":2,"start_time":{},"end_time":{}}}}}"#,
            NOW + 3600,
            NOW + 7200
        )),
        answer(
            r#"{"request_id":"3","op":"create","kind":"reservation","object":{"id":"r9","node_count":1}}"#,
        ),
        answer(r#"{"request_id":"4","op":"delete","kind":"reservation","object":{"id":"r9"}}"#),
    ];
    // The request ids of c1's and r1's creates, as their creates remembered them.
    store.sql(
        "INSERT INTO idempotency VALUES ('cluster', 'a', '1', 'f', 'c1'),
                                        ('reservation', 'a', '2', 'f', 'r1')",
    );
    assert_eq!(store.check(Some(&held)), Vec::<Violation>::new());
    // A create's request id that no longer leads to its object: a retry would make another.
    store.sql("DELETE FROM idempotency WHERE request_id = '1'");
    assert_eq!(
        store.only(Concern::Answer, Some(&held)),
        "answer: cluster c1: the request_id 1 of its create leads to nothing, so a retry of that create would not find it"
    );
    store.sql("INSERT INTO idempotency VALUES ('cluster', 'a', '1', 'f', 'c1')");

    let broken = [
        answer(
            r#"{"request_id":"5","op":"resize","kind":"cluster","object":{"id":"c1","node_count":3}}"#,
        ),
        answer(r#"{"request_id":"6","op":"delete","kind":"reservation","object":{"id":"r1"}}"#),
        answer(
            r#"{"request_id":"7","op":"create","kind":"cluster","object":{"id":"lost","node_count":1}}"#,
        ),
    ];
    let found: Vec<String> = store
        .check(Some(&broken))
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        found,
        [
            "answer: reservation r1 is still there, but delete 6 acknowledged its delete",
            "answer: cluster c1: node_count is 2, but resize 5 acknowledged 3",
            "answer: cluster lost is missing, but create 7 acknowledged it",
        ]
    );
}

#[test]
fn an_answers_log_that_is_not_one_is_refused_naming_the_line() {
    let text = "\n{\"request_id\":\"1\",\"op\":\"create\",\"kind\":\"cluster\",\"object\":{\"id\":\"c1\"}}\n{\"request_id\":\"2\",\"op\":\"grow\",\"kind\":\"cluster\",\"object\":{\"id\":\"c1\"}}\n";
    let refused = answers::parse(text).unwrap_err();
    assert!(
        refused.starts_with("line 3: unknown variant `grow`"),
        "{refused}"
    );
    let refused = answers::parse(
        r#"{"request_id":"1","op":"create","kind":"cluster","object":{"id":"c1","nodes":2}}"#,
    )
    .unwrap_err();
    assert!(
        refused.starts_with("line 1: unknown field `nodes`"),
        "{refused}"
    );
}

#[test]
fn a_missing_store_is_an_error_not_an_empty_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let refused = check_store(&dir.path().join("state.db"), NOW, None).unwrap_err();
    assert!(
        refused
            .to_string()
            .ends_with("state.db: no state database there"),
        "{refused}"
    );
}

#[test]
fn usage_records_that_disagree_with_the_holdings_are_named() {
    let store = Store::new();
    // A release and an assignment that bypass the store's holding path.
    store.sql("UPDATE nodes SET cluster_id = NULL WHERE id = 'p2'");
    store.sql("UPDATE nodes SET cluster_id = 'c1' WHERE id = 'p3'");
    let found: Vec<String> = store
        .check(None)
        .iter()
        .filter(|v| v.concern == Concern::Usage)
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        found,
        [
            "usage: node p2 (host-p2) is free, but its usage records count 8 GPUs as still held",
            "usage: node p3 (host-p3) is held by cluster c1, but its usage records count 0 of its 8 GPUs as held",
        ]
    );
    // Released through the store, both agree again.
    store.sql("UPDATE nodes SET cluster_id = NULL WHERE id = 'p3'");
    crate::store::nodes::release(&store.conn, "p2", NOW).unwrap();
    assert!(!store
        .check(None)
        .iter()
        .any(|v| v.concern == Concern::Usage));
}

/// `gpufleet-agent check` reads the same store, and finds the same, on both engines.
#[test]
fn the_invariants_read_the_same_on_both_engines() {
    let (dir, mut sqlite) = crate::store::to_postgres::fixture::filled_sqlite();
    let (_guard, mut pg, _) = crate::store::postgres::engines::postgres();
    crate::store::to_postgres::copy(&mut sqlite, &mut pg, 1).unwrap();
    drop(sqlite);
    let now = 1200;
    let on_sqlite = crate::invariants::Snapshot::load(
        &mut gpufleet_sql::Database::sqlite(
            crate::store::invariants::open_read_only(&dir.path().join("state.db")).unwrap(),
        ),
        now,
    )
    .unwrap();
    let on_postgres = crate::invariants::Snapshot::load(&mut pg, now).unwrap();
    assert_eq!(format!("{on_postgres:?}"), format!("{on_sqlite:?}"));
    // The fixture holds something to find: its reservation holds an on-demand node
    // while the only on-demand node is quarantined. Both engines find it, and only it.
    let found = |v: Vec<crate::invariants::Violation>| -> Vec<String> {
        v.iter().map(|v| v.to_string()).collect()
    };
    let lite =
        found(crate::invariants::check_store(&dir.path().join("state.db"), now, None).unwrap());
    let post = found(crate::invariants::check_database(&mut pg, now, None).unwrap());
    assert_eq!(post, lite);
    assert_eq!(post.len(), 1, "{post:?}");
    assert!(
        post[0].starts_with("capacity: H100-80GB on-demand overbooked"),
        "{post:?}"
    );
    assert!(!on_postgres.models.is_empty() && !on_postgres.usage.is_empty());
}
