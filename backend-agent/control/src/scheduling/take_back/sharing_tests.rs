//! Fair sharing on a real store: lending limits at admission (`placement::nodes_to_add`)
//! and the weighted fair-share order of a take-back (`take_back::plan_take_back`), with
//! exact numbers. Beside `take_back`, whose planning it reaches.

use rusqlite::Connection;

use super::plan_take_back;
use crate::scheduling::placement::nodes_to_add;
use crate::store::{self, clusters::ClusterRow};

const T0: i64 = 1_900_000_000;

/// A store with four 8-GPU H100 pool nodes `p1`..`p4` and one on-demand `d1`; tenants
/// `team-a` (16 guaranteed, its lending limit as given), `team-b` (32 burst) and
/// `team-c` (8 guaranteed + 24 burst, weight as given).
fn seed(a_lends: Option<i64>, c_weight: i64) -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = store::open(&dir.path().join("state.db")).unwrap();
    conn.execute_batch(
        "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
             VALUES ('a', 'team-a', '', '{}', 'ha', 0), ('b', 'team-b', '', '{}', 'hb', 0),
                    ('c', 'team-c', '', '{}', 'hc', 0);",
    )
    .unwrap();
    for (id, tenant, gpus, burst, weight, lends) in [
        ("qa", "a", 16, 0, 1, a_lends),
        ("qb", "b", 0, 32, 1, None),
        ("qc", "c", 8, 24, c_weight, None),
    ] {
        let q = store::quotas::QuotaRow {
            weight,
            lending_limit_gpus: lends,
            ..store::quotas::QuotaRow::new(
                id.into(),
                tenant.into(),
                "H100-80GB".into(),
                gpus,
                burst,
            )
        };
        store::quotas::insert(&conn, &q).unwrap();
    }
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
    (dir, conn)
}

/// A running cluster of `tenant` asking for `nodes` nodes (none held yet).
fn cluster(conn: &Connection, id: &str, tenant: &str, nodes: i64, preemptible: bool) -> ClusterRow {
    conn.execute(
        "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                               storage_gib, status, endpoint, credentials, storage_path,
                               mig_layout)
         VALUES (?1, ?2, ?1, 'kubernetes', 'H100-80GB', ?3, 1, 'running', '', '', '', '{}')",
        rusqlite::params![id, tenant, nodes],
    )
    .unwrap();
    if preemptible {
        store::preemption::insert(conn, id, false).unwrap();
    }
    store::clusters::get(conn, id).unwrap().unwrap()
}

fn hold(conn: &Connection, cluster: &str, nodes: &[&str]) {
    for n in nodes {
        assert!(store::nodes::assign(conn, n, cluster, T0).unwrap());
    }
}

#[test]
fn a_borrower_is_never_given_what_a_lending_limit_keeps_idle() {
    // team-a holds nothing of its 16 guaranteed GPUs and lends none of them: of the 32
    // free, team-b may borrow 16 (2 nodes).
    let (_dir, conn) = seed(Some(0), 1);
    let b1 = cluster(&conn, "b1", "b", 3, true);
    let refused = nodes_to_add(&conn, "team-b", &b1, 0, T0).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "node_count: needs 3 H100-80GB pool nodes now (24 GPUs), the pool has 4 free now (32 GPUs), but lending limits keep 16 of them idle for their tenants (tenant 'team-a' lends at most 0 of its 16 idle guaranteed GPUs (lending_limit_gpus = 0), keeping 16): tenant 'team-b' may borrow 16 GPUs (2 nodes); no idle capacity for the rest"
    );
    let b2 = cluster(&conn, "b2", "b", 2, false);
    assert_eq!(nodes_to_add(&conn, "team-b", &b2, 0, T0).unwrap().len(), 2);
    // The owner itself is not held to its own limit: team-a takes its 2 nodes.
    let a1 = cluster(&conn, "a1", "a", 2, false);
    assert_eq!(nodes_to_add(&conn, "team-a", &a1, 0, T0).unwrap().len(), 2);
}

#[test]
fn a_lending_limit_lends_that_many_and_what_the_owner_uses_is_not_idle() {
    // team-a lends 8 of its 16 idle GPUs: 24 of the 32 free may be borrowed (3 nodes).
    let (_dir, conn) = seed(Some(8), 1);
    let b1 = cluster(&conn, "b1", "b", 4, true);
    let refused = nodes_to_add(&conn, "team-b", &b1, 0, T0).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("lending limits keep 8 of them idle for their tenants (tenant 'team-a' lends at most 8 of its 16 idle guaranteed GPUs (lending_limit_gpus = 8), keeping 8): tenant 'team-b' may borrow 24 GPUs (3 nodes)"),
        "{refused}"
    );
    let b2 = cluster(&conn, "b2", "b", 3, true);
    assert_eq!(nodes_to_add(&conn, "team-b", &b2, 0, T0).unwrap().len(), 3);
    // Once team-a holds one node (8 of its 16), only 8 are idle: its limit of 8 lends
    // them all and keeps none, so team-b's 4th node is short of the pool, not the limit.
    cluster(&conn, "a1", "a", 1, false);
    hold(&conn, "a1", &["p1"]);
    let b3 = cluster(&conn, "b3", "b", 3, true);
    assert_eq!(nodes_to_add(&conn, "team-b", &b3, 0, T0).unwrap().len(), 3);
    let b4 = cluster(&conn, "b4", "b", 4, true);
    let short = nodes_to_add(&conn, "team-b", &b4, 0, T0).unwrap_err();
    assert!(
        short.to_string().starts_with(
            "node_count: needs 4 H100-80GB pool nodes now (32 GPUs), the pool has 3 free now (24 GPUs): no idle capacity to borrow"
        ),
        "{short}"
    );
}

/// team-b (weight 1) borrows 2 nodes with b1; team-c (8 guaranteed, `c_weight`) holds 2
/// with the newer c1; then team-a's reservation of 2 nodes starts: 2 must go back.
/// Returns (cluster, nodes taken, on-demand replacements); with `on_demand` both clusters
/// allow on-demand replacements, of which one (`d1`) is free.
fn taken_back(c_weight: i64, on_demand: bool) -> Vec<(String, usize, usize)> {
    let (_dir, conn) = seed(None, c_weight);
    cluster(&conn, "b1", "b", 2, true);
    hold(&conn, "b1", &["p1", "p2"]);
    cluster(&conn, "c1", "c", 2, true);
    hold(&conn, "c1", &["p3", "p4"]);
    if on_demand {
        conn.execute("UPDATE cluster_preemption SET allow_on_demand = 1", [])
            .unwrap();
    }
    store::reservations::insert(
        &conn,
        &store::reservations::ReservationRow {
            id: "r1".into(),
            tenant_id: "a".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 2,
            start_time: T0,
            end_time: T0 + 3_600,
            allow_on_demand: false,
            pool_nodes: 2,
            on_demand_nodes: 0,
        },
    )
    .unwrap();
    plan_take_back(&conn, "H100-80GB", T0 + 1)
        .unwrap()
        .into_iter()
        .map(|w| {
            assert!(
                w.why.starts_with(&format!(
                    "a reservation window from {} to {} (tenant 'team-a') needs the pool nodes back; taken in weighted fair-share order: tenant '",
                    crate::state::rfc3339(T0),
                    crate::state::rfc3339(T0 + 3_600)
                )),
                "{}",
                w.why
            );
            (w.cluster.id, w.taken.len(), w.replacements.len())
        })
        .collect()
}

#[test]
fn take_back_preempts_the_borrower_furthest_above_its_weighted_share() {
    // team-b borrows 16 at weight 1 (share 16); team-c holds 16 against 8 guaranteed,
    // borrowing 8 at weight 3 (share 8/3): both nodes come from team-b, though c1 is
    // newer (the order before weights took from the newest cluster first).
    assert_eq!(taken_back(3, false), vec![("b1".to_string(), 2, 0)]);
}

#[test]
fn take_back_between_equal_shares_goes_newest_first_then_by_share() {
    // team-c at weight 1 borrows 8 (share 8) against team-b's 16: team-b gives one node
    // (16 -> 8), then the tie at 8 goes to the newest cluster, c1.
    assert_eq!(
        taken_back(1, false),
        vec![("b1".to_string(), 1, 0), ("c1".to_string(), 1, 0)]
    );
}

#[test]
fn a_scarce_on_demand_replacement_goes_to_the_lowest_weighted_share() {
    // As above, and both may move to on-demand nodes, of which one is free. After the
    // take-back team-b borrows 8 (share 8), team-c 0 (share 0): c1 gets d1, though b1
    // was preempted first (before weights, the first victim got it).
    assert_eq!(
        taken_back(1, true),
        vec![("b1".to_string(), 1, 0), ("c1".to_string(), 1, 1)]
    );
}
