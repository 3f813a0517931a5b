//! Fair sharing on a real store: lending limits at admission (`placement::nodes_to_add`),
//! the weighted fair-share order of a take-back (`take_back::plan_take_back`) and of an
//! owner reclaiming its lent guarantee (`clusters::scale_reclaiming`), and the lease's
//! fence on the preemption loop's writes, with exact numbers.

use rusqlite::Connection;

use super::take_back::{fenced_plan, fenced_record, plan_take_back};
use crate::lease::{testing, Fence};
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

/// team-a (16 guaranteed, 2 nodes idle) lent its idle guarantee: team-b (weight 1)
/// borrows `p1`, `p2` with its preemptible b1; team-c (8 guaranteed, `c_weight`) holds
/// `p3`, `p4` with its newer preemptible c1. The pool is full; team-a's guaranteed a1
/// asks for `nodes` nodes.
fn lent(c_weight: i64, nodes: i64) -> (tempfile::TempDir, Connection, ClusterRow) {
    let (dir, conn) = seed(None, c_weight);
    cluster(&conn, "b1", "b", 2, true);
    hold(&conn, "b1", &["p1", "p2"]);
    cluster(&conn, "c1", "c", 2, true);
    hold(&conn, "c1", &["p3", "p4"]);
    let a1 = cluster(&conn, "a1", "a", nodes, false);
    (dir, conn, a1)
}

/// team-a's a1 grows as a create does: what it took back, and (cluster, pool nodes
/// held) of b1, c1 and a1 after.
fn reclaimed(conn: &Connection, a1: &ClusterRow) -> (String, Vec<(&'static str, usize)>) {
    let every = std::time::Duration::from_secs(60);
    let scaling =
        crate::scheduling::clusters::scale_reclaiming(conn, "team-a", a1, T0 + 1, every).unwrap();
    let held = ["b1", "c1", "a1"]
        .into_iter()
        .map(|c| (c, store::nodes::list(conn, None, Some(c)).unwrap().len()))
        .collect();
    (scaling.taken_back.said, held)
}

#[test]
fn an_owner_takes_its_lent_guarantee_back_in_weighted_fair_share_order() {
    // team-b borrows 16 at weight 1 (share 16), team-c 8 at weight 3 (8/3): both nodes
    // come from team-b, which shrinks to none; a1 holds its 2 nodes.
    let (_dir, conn, a1) = lent(3, 2);
    assert_eq!(
        crate::scheduling::placement::owner_reclaim(&conn, &a1, 0, T0 + 1).unwrap(),
        2
    );
    let (said, held) = reclaimed(&conn, &a1);
    assert_eq!(
        said,
        "takes back 2 H100-80GB pool nodes lent to other tenants, in weighted fair-share order: p2, p1 from tenant 'team-b' (preemptible cluster 'b1')"
    );
    assert_eq!(held, vec![("b1", 0), ("c1", 2), ("a1", 2)]);
    let b1 = store::clusters::get(&conn, "b1").unwrap().unwrap();
    assert_eq!((b1.node_count, b1.status.as_str()), (0, "running"));
    let events = store::events::list(&conn, "b1").unwrap();
    let preempted: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == "preempted")
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(preempted.len(), 2);
    assert_eq!(
        preempted[0],
        "pool node taken back: tenant 'team-a' takes back its lent guarantee for its cluster 'a1'; taken in weighted fair-share order: tenant 'team-b' held 16 pool GPUs against 0 guaranteed (16 borrowed, weight 1); the cluster shrinks"
    );
    // Nothing more to take back: a1 fits.
    assert_eq!(
        crate::scheduling::placement::owner_reclaim(&conn, &a1, 2, T0 + 2).unwrap(),
        0
    );
}

#[test]
fn an_owners_take_back_between_equal_shares_goes_newest_first() {
    // team-c at weight 1 borrows 8 (share 8) against team-b's 16: team-b gives one node
    // (16 -> 8), then the tie at 8 goes to the newest cluster, c1, which keeps the node
    // within its own 8 guaranteed GPUs.
    let (_dir, conn, a1) = lent(1, 2);
    let (said, held) = reclaimed(&conn, &a1);
    assert!(said.ends_with("p2 from tenant 'team-b' (preemptible cluster 'b1'); p4 from tenant 'team-c' (preemptible cluster 'c1')"), "{said}");
    assert_eq!(held, vec![("b1", 1), ("c1", 1), ("a1", 2)]);
}

#[test]
fn burst_never_preempts() {
    // team-a may burst to 32, but only its 16 guaranteed (2 nodes) are taken back: a 3-node
    // cluster is refused as before and the borrowers keep every node.
    let (_dir, conn, a1) = lent(1, 3);
    conn.execute("UPDATE quotas SET burst_gpus = 16 WHERE id = 'qa'", [])
        .unwrap();
    assert_eq!(
        crate::scheduling::placement::owner_reclaim(&conn, &a1, 0, T0 + 1).unwrap(),
        0
    );
    let every = std::time::Duration::from_secs(60);
    let refused =
        crate::scheduling::clusters::scale_reclaiming(&conn, "team-a", &a1, T0 + 1, every);
    assert!(refused
        .err()
        .unwrap()
        .to_string()
        .starts_with("node_count: needs 3 H100-80GB nodes from now on, pool has 0 free"),);
    for c in ["b1", "c1"] {
        assert_eq!(store::nodes::list(&conn, None, Some(c)).unwrap().len(), 2);
    }
}

#[test]
fn an_owner_takes_nothing_a_borrower_holds_within_its_own_guarantee() {
    // team-b holds p1, p2 in a cluster that is not preemptible (burst, kept); team-c
    // holds p3, p4, 8 GPUs beyond its 8 guaranteed: only 1 node may come back, short of
    // the 2 team-a's cluster needs, so it is refused and team-c keeps both.
    let (_dir, conn) = seed(None, 1);
    cluster(&conn, "b1", "b", 2, false);
    hold(&conn, "b1", &["p1", "p2"]);
    cluster(&conn, "c1", "c", 2, true);
    hold(&conn, "c1", &["p3", "p4"]);
    let a1 = cluster(&conn, "a1", "a", 2, false);
    assert_eq!(
        crate::scheduling::placement::owner_reclaim(&conn, &a1, 0, T0 + 1).unwrap(),
        0
    );
    // One node is enough: c1 gives p4 and keeps p3, its guarantee.
    let a2 = cluster(&conn, "a2", "a", 1, false);
    assert_eq!(
        crate::scheduling::placement::owner_reclaim(&conn, &a2, 0, T0 + 1).unwrap(),
        1
    );
    let every = std::time::Duration::from_secs(60);
    crate::scheduling::clusters::scale_reclaiming(&conn, "team-a", &a2, T0 + 1, every).unwrap();
    let c1: Vec<String> = store::nodes::list(&conn, None, Some("c1"))
        .unwrap()
        .into_iter()
        .map(|n| n.hostname)
        .collect();
    assert_eq!(c1, vec!["p3".to_string()]);
}

/// Replicas `a` then `b` take the singletons' lease (b once a's has expired): a is a
/// former leader that still believes it leads. Their fences, a's then b's.
fn stale_leader(conn: &mut Connection) -> (Fence, Fence) {
    let (a, b) = (testing::replica("a"), testing::replica("b"));
    testing::take(&a, conn, T0 - 100);
    testing::take(&b, conn, T0);
    assert!(a.epoch().is_some() && b.epoch().is_some());
    (Fence::singleton(a), Fence::singleton(b))
}

#[test]
fn a_former_leaders_take_back_writes_nothing() {
    // As `taken_back` with on-demand replacements: a reservation window needs 2 nodes.
    let (_dir, mut conn) = seed(None, 1);
    cluster(&conn, "b1", "b", 2, true);
    hold(&conn, "b1", &["p1", "p2"]);
    cluster(&conn, "c1", "c", 2, true);
    hold(&conn, "c1", &["p3", "p4"]);
    conn.execute("UPDATE cluster_preemption SET allow_on_demand = 1", [])
        .unwrap();
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
    let (a, b) = stale_leader(&mut conn);
    let statuses = |conn: &Connection| -> Vec<(String, usize)> {
        ["b1", "c1"]
            .into_iter()
            .map(|c| {
                let row = store::clusters::get(conn, c).unwrap().unwrap();
                (
                    row.status,
                    store::nodes::list(conn, None, Some(c)).unwrap().len(),
                )
            })
            .collect()
    };
    let before = statuses(&conn);
    // The former leader decides nothing: no replacement assigned, no status written.
    {
        let tx = conn.transaction().unwrap();
        let refused = fenced_plan(&a, &tx, "H100-80GB", T0 + 1).err().unwrap();
        assert!(
            refused
                .to_string()
                .contains("a former leader writes nothing"),
            "{refused}"
        );
    }
    assert_eq!(statuses(&conn), before);
    // The leader plans; the former one cannot record that plan's outcome either.
    let tx = conn.transaction().unwrap();
    let plan = fenced_plan(&b, &tx, "H100-80GB", T0 + 1).unwrap();
    tx.commit().unwrap();
    assert_eq!(plan.len(), 2);
    let planned = statuses(&conn);
    assert_eq!(planned[0].0, "updating");
    let every = std::time::Duration::from_secs(60);
    for work in plan {
        let tx = conn.transaction().unwrap();
        assert!(fenced_record(&a, &tx, work, Ok(()), (T0 + 2, every)).is_err());
    }
    assert_eq!(statuses(&conn), planned);
    assert!(store::events::list(&conn, "b1")
        .unwrap()
        .iter()
        .all(|e| e.kind != "preempted"));
}
