//! Ended reservations hold nothing: they do not block deleting a quota or a tenant, and
//! they are removed together with the quota (or tenant) they belong to.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// Waits until the server reports the reservation as ended (its end is seconds away).
async fn until_ended(c: &mut Clients, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.get_reservation(id).await;
        if r.status == "ended" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "reservation {id} never ended: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn ended_reservations_go_with_their_quota_and_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    let quota = c.quota(&t.id, "H100-80GB", 16, 0).await;
    let n = now();
    let live = c
        .create_reservation(&t.id, "H100-80GB", 1, n + HOUR, n + 2 * HOUR)
        .await;
    let short = c.create_reservation(&t.id, "H100-80GB", 1, n, n + 3).await;
    // A cluster drew from the short reservation while it was active; it outlives it.
    let k = c
        .create_cluster(Clients::cluster_on_reservation(
            &t.id,
            "k",
            "H100-80GB",
            1,
            &short.id,
        ))
        .await;
    until_ended(&mut c, &short.id).await;

    let delete_quota = DeleteGpuQuotaRequest {
        id: quota.id.clone(),
        ..Default::default()
    };
    let msg = assert_status(
        c.quotas.delete_gpu_quota(delete_quota.clone()).await,
        Code::FailedPrecondition,
        "",
    );
    assert_eq!(
        msg,
        format!(
            "the H100-80GB quota is still used by reservation {}, cluster 'k'; delete them first",
            live.id
        )
    );
    assert_status(
        c.tenants
            .delete_tenant(DeleteTenantRequest {
                id: t.id.clone(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        "still has 1 gpu quota(s), 1 reservation(s) and 1 cluster(s)",
    );

    c.delete_cluster(&k.id).await;
    c.delete_reservation(&live.id).await;
    // Only the ended reservation is left: it no longer blocks, and goes with the quota.
    c.quotas.delete_gpu_quota(delete_quota).await.unwrap();
    assert_status(
        c.reservations
            .get_reservation(GetReservationRequest {
                id: short.id.clone(),
            })
            .await,
        Code::NotFound,
        &short.id,
    );
    c.tenants
        .delete_tenant(DeleteTenantRequest {
            id: t.id,
            ..Default::default()
        })
        .await
        .unwrap();
    let left = c
        .reservations
        .list_reservations(ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(left.reservations.is_empty(), "{left:?}");
}
