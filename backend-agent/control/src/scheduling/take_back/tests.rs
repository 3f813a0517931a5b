//! A take-back a former leader decided and never recorded, on one store shared by two
//! replicas: the next leader settles it under its own epoch, leaves a request's
//! `updating` cluster alone, and the former leader's late record is refused.

use rusqlite::Connection;

use super::{fenced_plan, fenced_record, fenced_settle};
use crate::lease::{testing, Fence, DEFAULT_TTL};
use crate::store;

const T0: i64 = 1_900_000_000;
const REPLACE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Pool nodes `p1`, `p2` and on-demand `d1`, 8 H100s each. Tenant `team-a` guarantees 2
/// nodes' worth and has a reservation window for 1 pool node from T0; tenant `team-b`
/// borrows: its preemptible `b1` (on-demand replacements allowed) holds both pool nodes,
/// and a request of its own is updating its cluster `u1` (no nodes, no take-back).
fn seed() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = store::open(&dir.path().join("state.db")).unwrap();
    conn.execute_batch(
        "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES ('a', 'team-a', '', '{}', 'ha', 0), ('b', 'team-b', '', '{}', 'hb', 0);
         INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                            cuda_version, state)
             VALUES ('p1', 'p1', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready'),
                    ('p2', 'p2', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready'),
                    ('d1', 'd1', 'H100-80GB', 'on-demand', 8, '550', '12.4', 'ready');
         INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                               storage_gib, status, status_reason, endpoint, credentials,
                               storage_path, mig_layout)
             VALUES ('b1', 'b', 'b1', 'kubernetes', 'H100-80GB', 2, 1, 'running', '', '', '',
                     '', '{}'),
                    ('u1', 'b', 'u1', 'kubernetes', 'H100-80GB', 0, 1, 'updating',
                     'a request of team-b', '', '', '', '{}');",
    )
    .unwrap();
    for (id, tenant, gpus, burst) in [("qa", "a", 16, 0), ("qb", "b", 0, 32)] {
        let q =
            store::quotas::QuotaRow::new(id.into(), tenant.into(), "H100-80GB".into(), gpus, burst);
        store::quotas::insert(&conn, &q).unwrap();
    }
    store::preemption::insert(&conn, "b1", true).unwrap();
    for n in ["p1", "p2"] {
        assert!(store::nodes::assign(&conn, n, "b1", T0 - 1_000).unwrap());
    }
    store::reservations::insert(
        &conn,
        &store::reservations::ReservationRow {
            id: "r1".into(),
            tenant_id: "a".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            start_time: T0,
            end_time: T0 + 3_600,
            allow_on_demand: false,
            pool_nodes: 1,
            on_demand_nodes: 0,
        },
    )
    .unwrap();
    (dir, conn)
}

/// `cluster`'s status, reason and node hostnames.
fn cluster(conn: &Connection, id: &str) -> (String, String, Vec<String>) {
    let row = store::clusters::get(conn, id).unwrap().unwrap();
    let mut nodes: Vec<String> = store::nodes::list(conn, None, Some(id))
        .unwrap()
        .into_iter()
        .map(|n| n.hostname)
        .collect();
    nodes.sort();
    (row.status, row.status_reason, nodes)
}

fn preempted(conn: &Connection, cluster: &str) -> usize {
    store::events::list(conn, cluster)
        .unwrap()
        .iter()
        .filter(|e| e.kind == "preempted")
        .count()
}

#[test]
fn the_next_leader_settles_a_take_back_its_former_leader_never_recorded() {
    let (_dir, mut conn) = seed();
    let u1_before = cluster(&conn, "u1");
    let (a, b) = (testing::replica("a"), testing::replica("b"));
    testing::take(&a, &mut conn, T0 - 10);
    let (a_fence, b_fence) = (Fence::singleton(a.clone()), Fence::singleton(b.clone()));

    // a decides: b1 gives back p2, on-demand d1 in its place, b1 `updating`.
    let tx = conn.transaction().unwrap();
    let plan = fenced_plan(&a_fence, &tx, "H100-80GB", T0 + 1).unwrap();
    tx.commit().unwrap();
    assert_eq!(plan.len(), 1);
    let decided = cluster(&conn, "b1");
    assert_eq!(decided.0, "updating");
    assert_eq!(decided.2, vec!["d1", "p1", "p2"]);

    // a pauses before its record; b takes the expired lease over under a newer epoch.
    testing::take(&b, &mut conn, T0 - 10 + DEFAULT_TTL.as_secs() as i64 + 1);
    assert!(b.epoch().unwrap() > a.epoch().unwrap());
    let tx = conn.transaction().unwrap();
    let settled = fenced_settle(&b_fence, &tx, (T0 + 7, REPLACE_AFTER)).unwrap();
    tx.commit().unwrap();
    assert_eq!(settled, vec!["b1".to_string()]);

    // As a restart would: back to its node_count, the replacement free again, running.
    let (status, reason, nodes) = cluster(&conn, "b1");
    assert_eq!(status, "running");
    assert_eq!(nodes, vec!["p1", "p2"]);
    assert_eq!(
        reason,
        format!(
            "a take-back decided under epoch {} of the singletons' lease was never recorded (its leader lost the lease); settled under epoch {}, its on-demand replacements d1 released; the next round takes the nodes back again",
            a.last_epoch(),
            b.last_epoch()
        )
    );
    assert_eq!(
        store::nodes::get(&conn, "d1").unwrap().unwrap().cluster_id,
        None
    );
    assert_eq!(preempted(&conn, "b1"), 0);
    // The request's change is not a take-back's: untouched.
    assert_eq!(cluster(&conn, "u1"), u1_before);
    let epoch_b = i64::try_from(b.last_epoch()).unwrap();
    assert!(!store::take_backs::any_before(&conn, epoch_b + 1).unwrap());

    // a's late record of its take-back is refused, and writes nothing.
    let work = plan.into_iter().next().unwrap();
    let tx = conn.transaction().unwrap();
    let refused = fenced_record(&a_fence, &tx, work, Ok(()), (T0 + 8, REPLACE_AFTER))
        .err()
        .unwrap();
    assert!(
        refused
            .to_string()
            .contains("a former leader writes nothing"),
        "{refused}"
    );
    drop(tx);
    assert_eq!(cluster(&conn, "b1").2, vec!["p1", "p2"]);
    assert_eq!(preempted(&conn, "b1"), 0);

    // b's next round decides the take-back again and records it; its own decision is
    // not a former leader's to settle.
    let tx = conn.transaction().unwrap();
    let plan = fenced_plan(&b_fence, &tx, "H100-80GB", T0 + 9).unwrap();
    assert!(fenced_settle(&b_fence, &tx, (T0 + 9, REPLACE_AFTER))
        .unwrap()
        .is_empty());
    tx.commit().unwrap();
    assert_eq!(cluster(&conn, "b1").0, "updating");
    for work in plan {
        let tx = conn.transaction().unwrap();
        fenced_record(&b_fence, &tx, work, Ok(()), (T0 + 10, REPLACE_AFTER))
            .unwrap()
            .unwrap();
        tx.commit().unwrap();
    }
    let (status, _, nodes) = cluster(&conn, "b1");
    assert_eq!(
        (status.as_str(), nodes),
        ("running", vec!["d1".into(), "p1".into()])
    );
    assert_eq!(preempted(&conn, "b1"), 1);
    assert!(!store::take_backs::any_before(&conn, i64::MAX).unwrap());
    assert_eq!(cluster(&conn, "u1"), u1_before);
}

#[test]
fn a_record_whose_take_back_was_settled_meanwhile_writes_nothing() {
    // Whatever its fence: the decision's mark is what a record clears, once.
    let (_dir, mut conn) = seed();
    let (a, b) = (testing::replica("a"), testing::replica("b"));
    testing::take(&a, &mut conn, T0 - 100);
    let tx = conn.transaction().unwrap();
    let plan = fenced_plan(&Fence::singleton(a), &tx, "H100-80GB", T0 + 1).unwrap();
    tx.commit().unwrap();
    testing::take(&b, &mut conn, T0);
    let tx = conn.transaction().unwrap();
    fenced_settle(&Fence::singleton(b.clone()), &tx, (T0 + 2, REPLACE_AFTER)).unwrap();
    tx.commit().unwrap();
    let settled = cluster(&conn, "b1");
    for work in plan {
        let tx = conn.transaction().unwrap();
        let refused = fenced_record(
            &Fence::singleton(b.clone()),
            &tx,
            work,
            Ok(()),
            (T0 + 3, REPLACE_AFTER),
        )
        .err()
        .unwrap();
        assert!(
            refused
                .to_string()
                .contains("was settled since; nothing recorded"),
            "{refused}"
        );
    }
    assert_eq!(cluster(&conn, "b1"), settled);
    assert_eq!(preempted(&conn, "b1"), 0);
}

#[test]
fn a_replica_that_does_not_lead_settles_nothing() {
    let (_dir, mut conn) = seed();
    let (a, b) = (testing::replica("a"), testing::replica("b"));
    testing::take(&a, &mut conn, T0 - 100);
    let tx = conn.transaction().unwrap();
    fenced_plan(&Fence::singleton(a.clone()), &tx, "H100-80GB", T0 + 1).unwrap();
    tx.commit().unwrap();
    testing::take(&b, &mut conn, T0);
    // a, a former leader now, cannot settle even its own decision.
    let tx = conn.transaction().unwrap();
    assert!(fenced_settle(&Fence::singleton(a), &tx, (T0 + 2, REPLACE_AFTER)).is_err());
    drop(tx);
    assert_eq!(cluster(&conn, "b1").0, "updating");
    assert_eq!(cluster(&conn, "b1").2, vec!["d1", "p1", "p2"]);
}
