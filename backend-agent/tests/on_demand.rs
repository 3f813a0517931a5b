//! Changing a reservation's allow_on_demand in place: allowing it keeps the allocation,
//! turning it off moves on-demand nodes back to the pool or says why it cannot.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

fn set_allow(id: &str, allow: bool) -> UpdateReservationRequest {
    UpdateReservationRequest {
        id: id.into(),
        node_count: 0,
        end_time: None,
        allow_on_demand: Some(allow),
    }
}

async fn get(c: &mut Clients, id: &str) -> Reservation {
    c.reservations
        .get_reservation(GetReservationRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner()
}

fn split(r: &Reservation) -> (bool, i64, i64) {
    (r.allow_on_demand, r.pool_nodes, r.on_demand_nodes)
}

#[tokio::test]
async fn allowing_on_demand_keeps_the_allocation_and_lets_later_growth_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 64, 0).await;
    let n = now();
    let r = c
        .reservations
        .create_reservation(Clients::reservation(
            &t.id,
            "H100-80GB",
            1,
            n + HOUR,
            n + 2 * HOUR,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&r), (false, 1, 0));

    let allowed = c
        .reservations
        .update_reservation(set_allow(&r.id, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&allowed), (true, 1, 0));
    assert_eq!(split(&get(&mut c, &r.id).await), (true, 1, 0));

    // The default fleet has 4 pool and 4 on-demand H100-80GB nodes.
    let grow = UpdateReservationRequest {
        id: r.id.clone(),
        node_count: 6,
        end_time: None,
        allow_on_demand: None,
    };
    let grown = c
        .reservations
        .update_reservation(grow)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&grown), (true, 4, 2));
}

#[tokio::test]
async fn turning_on_demand_off_moves_nodes_back_or_says_how_much_the_pool_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 64, 0).await;
    let n = now();
    let blocker = c
        .reservations
        .create_reservation(Clients::reservation(
            &t.id,
            "H100-80GB",
            3,
            n + HOUR,
            n + 3 * HOUR,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut req = Clients::reservation(&t.id, "H100-80GB", 3, n + 2 * HOUR, n + 4 * HOUR);
    req.allow_on_demand = true;
    let r = c
        .reservations
        .create_reservation(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&r), (true, 1, 2));

    // Over [2h, 3h) the blocker holds 3 of the 4 pool nodes and r the fourth.
    let before = c.snapshot().await;
    let msg = assert_status(
        c.reservations
            .update_reservation(set_allow(&r.id, false))
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
    assert_eq!(
        c.snapshot().await,
        before,
        "a refused update changes nothing"
    );

    c.reservations
        .delete_reservation(DeleteReservationRequest { id: blocker.id })
        .await
        .unwrap();
    let moved = c
        .reservations
        .update_reservation(set_allow(&r.id, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&moved), (false, 3, 0));
    assert_eq!(split(&get(&mut c, &r.id).await), (false, 3, 0));
    // Off again: growing past the pool no longer overflows.
    let grow = UpdateReservationRequest {
        id: r.id.clone(),
        node_count: 5,
        end_time: None,
        allow_on_demand: None,
    };
    assert_status(
        c.reservations.update_reservation(grow).await,
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
    c.quota(&t.id, "H100-80GB", 64, 0).await;
    let n = now();
    let mut req = Clients::reservation(&t.id, "H100-80GB", 5, n, n + HOUR);
    req.allow_on_demand = true;
    let r = c
        .reservations
        .create_reservation(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&r), (true, 4, 1));
    let mut on_res = Clients::cluster(&t.id, "k", "H100-80GB", 5);
    on_res.reservation_id = r.id.clone();
    let k = c
        .clusters
        .create_tenant_cluster(on_res)
        .await
        .unwrap()
        .into_inner();

    let before = c.snapshot().await;
    assert_status(
        c.reservations
            .update_reservation(set_allow(&r.id, false))
            .await,
        Code::FailedPrecondition,
        "allow_on_demand: cluster 'k' (",
    );
    assert_eq!(
        c.snapshot().await,
        before,
        "a refused update changes nothing"
    );

    c.clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest { id: k.id })
        .await
        .unwrap();
    // Alone, the pool cannot take the fifth node; shrinking in the same update can.
    assert_status(
        c.reservations
            .update_reservation(set_allow(&r.id, false))
            .await,
        Code::FailedPrecondition,
        "keep allow_on_demand or shrink node_count to 4",
    );
    let shrink = UpdateReservationRequest {
        id: r.id.clone(),
        node_count: 4,
        end_time: None,
        allow_on_demand: Some(false),
    };
    let shrunk = c
        .reservations
        .update_reservation(shrink)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(split(&shrunk), (false, 4, 0));
}
