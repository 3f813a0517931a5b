//! Changing a reservation's allow_on_demand in place: allowing it keeps the allocation,
//! turning it off moves on-demand nodes back to the pool or says why it cannot.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

fn split(r: &Reservation) -> (bool, i64, i64) {
    (r.allow_on_demand, r.pool_nodes, r.on_demand_nodes)
}

#[tokio::test]
async fn allowing_on_demand_keeps_the_allocation_and_lets_later_growth_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 32, 32).await;
    let n = now();
    let r = c
        .create_reservation(&t.id, "H100-80GB", 1, n + HOUR, n + 2 * HOUR)
        .await;
    assert_eq!(split(&r), (false, 1, 0));

    let allowed = c
        .update_reservation(Clients::set_allow_on_demand(&r.id, true))
        .await;
    assert_eq!(split(&allowed), (true, 1, 0));
    assert_eq!(split(&c.get_reservation(&r.id).await), (true, 1, 0));

    // The default fleet has 4 pool and 4 on-demand H100-80GB nodes.
    let grown = c
        .update_reservation(Clients::resize_reservation(&r.id, 6))
        .await;
    assert_eq!(split(&grown), (true, 4, 2));
}

#[tokio::test]
async fn turning_on_demand_off_moves_nodes_back_or_says_how_much_the_pool_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 32, 32).await;
    let n = now();
    let blocker = c
        .create_reservation(&t.id, "H100-80GB", 3, n + HOUR, n + 3 * HOUR)
        .await;
    let r = c
        .create_reservation_from(Clients::on_demand_reservation(
            &t.id,
            "H100-80GB",
            3,
            n + 2 * HOUR,
            n + 4 * HOUR,
        ))
        .await;
    assert_eq!(split(&r), (true, 1, 2));

    // Over [2h, 3h) the blocker holds 3 of the 4 pool nodes and r the fourth.
    let before = c.snapshot().await;
    let msg = assert_status(
        c.reservations
            .update_reservation(Clients::set_allow_on_demand(&r.id, false))
            .await,
        Code::FailedPrecondition,
        "allow_on_demand: the pool has 0 free H100-80GB nodes from ",
    );
    assert!(
        msg.ends_with(
            "the reservation holds 2 on-demand nodes; keep allow_on_demand or shrink node_count to 1"
        ),
        "{msg}"
    );
    c.assert_unchanged(&before, "a refused update changes nothing")
        .await;

    c.delete_reservation(&blocker.id).await;
    let moved = c
        .update_reservation(Clients::set_allow_on_demand(&r.id, false))
        .await;
    assert_eq!(split(&moved), (false, 3, 0));
    assert_eq!(split(&c.get_reservation(&r.id).await), (false, 3, 0));
    // Off again: growing past the pool no longer overflows.
    assert_status(
        c.reservations
            .update_reservation(Clients::resize_reservation(&r.id, 5))
            .await,
        Code::FailedPrecondition,
        "set allow_on_demand to use it",
    );
}

#[tokio::test]
async fn on_demand_nodes_held_by_clusters_keep_on_demand_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 32, 32).await;
    let n = now();
    let r = c
        .create_reservation_from(Clients::on_demand_reservation(
            &t.id,
            "H100-80GB",
            5,
            n,
            n + HOUR,
        ))
        .await;
    assert_eq!(split(&r), (true, 4, 1));
    let k = c
        .create_cluster(Clients::cluster_on_reservation(
            &t.id,
            "k",
            "H100-80GB",
            5,
            &r.id,
        ))
        .await;

    let before = c.snapshot().await;
    assert_status(
        c.reservations
            .update_reservation(Clients::set_allow_on_demand(&r.id, false))
            .await,
        Code::FailedPrecondition,
        "allow_on_demand: cluster 'k' (",
    );
    c.assert_unchanged(&before, "a refused update changes nothing")
        .await;

    c.delete_cluster(&k.id).await;
    // Alone, the pool cannot take the fifth node; shrinking in the same update can.
    assert_status(
        c.reservations
            .update_reservation(Clients::set_allow_on_demand(&r.id, false))
            .await,
        Code::FailedPrecondition,
        "keep allow_on_demand or shrink node_count to 4",
    );
    let shrink = UpdateReservationRequest {
        allow_on_demand: Some(false),
        ..Clients::resize_reservation(&r.id, 4)
    };
    let shrunk = c.update_reservation(shrink).await;
    assert_eq!(split(&shrunk), (false, 4, 0));
}
