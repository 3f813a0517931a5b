//! Quota and capacity arithmetic over time, on-demand overflow, dedicated nodes,
//! dependents that block deletes, and the clusters' storage directories.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

#[tokio::test]
async fn quotas_bound_clusters_and_reservations_over_time() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    let quota = c.quota(&t.id, "H100-80GB", 24, 8).await;

    c.create_pool_cluster(&t.id, "a", "H100-80GB", 2).await;
    let msg = assert_status(
        c.clusters
            .create_tenant_cluster(Clients::cluster(&t.id, "b", "H100-80GB", 3))
            .await,
        Code::FailedPrecondition,
        "",
    );
    assert_eq!(msg, "needs 24 H100-80GB GPUs, quota of tenant 'team-a' leaves 16 (limit 32 = 24 guaranteed + 8 burst, 16 in use)");
    let no_quota = Clients::cluster(&t.id, "c", "A100-80GB", 1);
    assert_status(
        c.clusters.create_tenant_cluster(no_quota).await,
        Code::FailedPrecondition,
        "has no quota for A100-80GB",
    );

    // Reservations count only over their window.
    let n = now();
    let res =
        |nodes, s, e| Clients::reservation(&t.id, "H100-80GB", nodes, n + s * HOUR, n + e * HOUR);
    c.create_reservation_from(res(2, 10, 12)).await;
    assert_status(
        c.reservations.create_reservation(res(1, 11, 13)).await,
        Code::FailedPrecondition,
        "leaves 0",
    );
    c.create_reservation_from(res(2, 12, 14)).await;

    let usage = c.usage(&t.id, "H100-80GB").await;
    assert_eq!(
        (
            usage.gpus,
            usage.burst_gpus,
            usage.used,
            usage.reserved,
            usage.available
        ),
        (24, 8, 16, 16, 0)
    );

    let lower = UpdateGpuQuotaRequest {
        id: quota.id.clone(),
        gpus: 16,
        burst_gpus: 0,
        ..Default::default()
    };
    assert_status(
        c.quotas.update_gpu_quota(lower).await,
        Code::FailedPrecondition,
        "32 GPUs at peak",
    );
}

#[tokio::test]
async fn reservations_never_double_book_and_overflow_to_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (a, _) = c.tenant("team-a").await;
    let (b, _) = c.tenant("team-b").await;
    c.quota(&a.id, "H100-80GB", 0, 64).await; // burst: the pool guarantees 32
    c.quota(&b.id, "H100-80GB", 0, 64).await;
    let n = now();

    c.create_reservation(&a.id, "H100-80GB", 3, n + HOUR, n + 3 * HOUR)
        .await;
    // Overlapping [2h, 3h): the pool has 1 node left there.
    let mut second = Clients::reservation(&b.id, "H100-80GB", 2, n + 2 * HOUR, n + 4 * HOUR);
    assert_status(
        c.reservations.create_reservation(second.clone()).await,
        Code::FailedPrecondition,
        "needs 2 H100-80GB nodes from ",
    );
    let msg = status(c.reservations.create_reservation(second.clone()).await)
        .message()
        .to_string();
    assert!(
        msg.contains("pool has 1 free") && msg.contains("on-demand has 4 free"),
        "{msg}"
    );
    second.allow_on_demand = true;
    let overflow = c.create_reservation_from(second).await;
    assert_eq!((overflow.pool_nodes, overflow.on_demand_nodes), (1, 1));

    let window = AvailabilityRequest {
        gpu_type: "H100-80GB".into(),
        start_time: ts(n + 2 * HOUR),
        end_time: ts(n + 3 * HOUR),
        ..Default::default()
    };
    let avail = c.fleet.get_availability(window).await.unwrap().into_inner();
    assert_eq!((avail.free_pool_nodes, avail.free_on_demand_nodes), (0, 3));
    // Back to back with the first reservation: no overlap, the pool is free again.
    let after = c
        .create_reservation(&a.id, "H100-80GB", 3, n + 3 * HOUR, n + 5 * HOUR)
        .await;
    assert_eq!(after.pool_nodes, 3);
    // Clusters hold pool nodes from now on: none is free for ever.
    assert_status(
        c.clusters
            .create_tenant_cluster(Clients::cluster(&a.id, "k", "H100-80GB", 1))
            .await,
        Code::FailedPrecondition,
        "pool has 0 free",
    );
    // Growing a reservation is checked like a new one (excluding itself).
    assert_status(
        c.reservations
            .update_reservation(Clients::resize_reservation(&overflow.id, 6))
            .await,
        Code::FailedPrecondition,
        "needs 6 H100-80GB nodes",
    );
    let grown = c
        .update_reservation(Clients::resize_reservation(&overflow.id, 4))
        .await;
    assert_eq!((grown.pool_nodes, grown.on_demand_nodes), (1, 3));
}

/// Creates that arrive together share one transaction (group commit); each still sees
/// the ones before it. 24 at once for the same window against 4 pool nodes: exactly 4
/// are admitted, a repeated request id makes one reservation, and dry runs hold nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_double_book() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (a, _) = c.tenant("team-a").await;
    let (b, _) = c.tenant("team-b").await;
    c.quota(&a.id, "H100-80GB", 0, 64).await;
    c.quota(&b.id, "H100-80GB", 0, 64).await;
    let n = now();
    let (start, end) = (n + HOUR, n + 2 * HOUR);
    let mut tasks = Vec::new();
    for i in 0..24 {
        let mut client = agent.admin().await;
        let tenant = if i % 2 == 0 {
            a.id.clone()
        } else {
            b.id.clone()
        };
        let mut req = Clients::reservation(&tenant, "H100-80GB", 1, start, end);
        // Two requests share an id (a client's retry): one reservation between them.
        req.request_id = if i < 2 {
            "retried".into()
        } else {
            format!("race-{i}")
        };
        req.tenant_id = if i < 2 { a.id.clone() } else { tenant };
        let dry = i % 6 == 5;
        req.validate_only = dry;
        let retried = i < 2;
        tasks.push(tokio::spawn(async move {
            (
                dry,
                retried,
                client.reservations.create_reservation(req).await,
            )
        }));
    }
    let mut admitted = std::collections::BTreeSet::new();
    let (mut answered, mut refused) = (0, 0);
    let mut retried_ids = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (true, _, _) => {}
            (false, retried, Ok(r)) => {
                let r = r.into_inner();
                assert_eq!((r.pool_nodes, r.on_demand_nodes), (1, 0));
                if retried {
                    retried_ids.push(r.id.clone());
                }
                admitted.insert(r.id);
                answered += 1;
            }
            (false, _, Err(s)) => {
                assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
                assert!(s.message().contains("pool has 0 free"), "{s:?}");
                refused += 1;
            }
        }
    }
    assert_eq!(admitted.len(), 4, "admitted {admitted:?}");
    // 20 real requests (4 were dry runs). The two sharing an id are admitted together,
    // as one reservation, or refused together, depending on when they came.
    assert_eq!(answered + refused, 20);
    match retried_ids.as_slice() {
        [] => assert_eq!(answered, 4),
        [first, second] => {
            assert_eq!(first, second);
            assert_eq!(answered, 5);
        }
        other => panic!("a retried request answered alone: {other:?}"),
    }
    let window = AvailabilityRequest {
        gpu_type: "H100-80GB".into(),
        start_time: ts(start),
        end_time: ts(end),
        ..Default::default()
    };
    let avail = c.fleet.get_availability(window).await.unwrap().into_inner();
    assert_eq!(avail.free_pool_nodes, 0);
    let listed = c
        .reservations
        .list_reservations(ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .reservations;
    let listed: std::collections::BTreeSet<String> = listed.into_iter().map(|r| r.id).collect();
    assert_eq!(listed, admitted);
}

#[tokio::test]
async fn clusters_draw_nodes_from_active_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 32, 0).await;
    let n = now();
    let res = c
        .create_reservation(&t.id, "H100-80GB", 2, n, n + 2 * HOUR)
        .await;
    let k = c
        .create_cluster(Clients::cluster_on_reservation(
            &t.id,
            "k",
            "H100-80GB",
            2,
            &res.id,
        ))
        .await;
    assert_eq!(k.nodes.len(), 2);
    let usage = c.usage(&t.id, "H100-80GB").await;
    assert_eq!(
        (usage.used, usage.reserved),
        (0, 16),
        "a cluster on a reservation uses the reserved GPUs"
    );

    let more = UpdateTenantClusterRequest {
        id: k.id.clone(),
        node_count: 3,
        ..Default::default()
    };
    assert_status(
        c.clusters.update_tenant_cluster(more).await,
        Code::FailedPrecondition,
        "reservation",
    );
    assert_status(
        c.reservations
            .update_reservation(Clients::resize_reservation(&res.id, 1))
            .await,
        Code::FailedPrecondition,
        "clusters hold 2 nodes",
    );
    assert_status(
        c.reservations
            .delete_reservation(DeleteReservationRequest { id: res.id.clone() })
            .await,
        Code::FailedPrecondition,
        "'k'",
    );
    let later = c
        .create_reservation(&t.id, "H100-80GB", 1, n + 5 * HOUR, n + 6 * HOUR)
        .await;
    assert_eq!(later.status, "scheduled");
    let early = Clients::cluster_on_reservation(&t.id, "early", "H100-80GB", 1, &later.id);
    assert_status(
        c.clusters.create_tenant_cluster(early).await,
        Code::FailedPrecondition,
        "is scheduled",
    );

    // Scaling down releases the highest-numbered node.
    let down = UpdateTenantClusterRequest {
        id: k.id.clone(),
        node_count: 1,
        ..Default::default()
    };
    let k = c.update_cluster(down).await;
    assert_eq!(
        k.nodes
            .iter()
            .map(|n| n.hostname.as_str())
            .collect::<Vec<_>>(),
        vec!["h100-80gb-pool-01"]
    );
}

#[tokio::test]
async fn nodes_are_dedicated_to_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (a, _) = c.tenant("team-a").await;
    let (b, _) = c.tenant("team-b").await;
    c.quota(&a.id, "H100-80GB", 0, 64).await; // burst: the pool guarantees 32
    c.quota(&b.id, "H100-80GB", 0, 64).await;
    let ka = c.create_pool_cluster(&a.id, "k", "H100-80GB", 2).await;
    let kb = c.create_pool_cluster(&b.id, "k", "H100-80GB", 2).await;
    let hosts = |k: &TenantCluster| {
        k.nodes
            .iter()
            .map(|n| n.hostname.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        hosts(&ka).iter().all(|h| !hosts(&kb).contains(h)),
        "{:?} vs {:?}",
        hosts(&ka),
        hosts(&kb)
    );
    assert_status(
        c.clusters
            .create_tenant_cluster(Clients::cluster(&a.id, "k2", "H100-80GB", 1))
            .await,
        Code::FailedPrecondition,
        "pool has 0 free",
    );
    let filtered = c
        .fleet
        .list_nodes(ListNodesRequest {
            cluster_id: ka.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(filtered
        .into_inner()
        .nodes
        .iter()
        .all(|n| n.cluster_id == ka.id && n.tenant_id == a.id));
}

#[tokio::test]
async fn dependents_block_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    let quota = c.quota(&t.id, "H100-80GB", 16, 0).await;
    let k = c.create_pool_cluster(&t.id, "k", "H100-80GB", 1).await;

    assert_status(
        c.tenants
            .delete_tenant(DeleteTenantRequest {
                id: t.id.clone(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        "still has 1 gpu quota(s), 0 reservation(s) and 1 cluster(s)",
    );
    assert_status(
        c.quotas
            .delete_gpu_quota(DeleteGpuQuotaRequest {
                id: quota.id.clone(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        "cluster 'k'",
    );
    c.delete_cluster(&k.id).await;
    c.quotas
        .delete_gpu_quota(DeleteGpuQuotaRequest {
            id: quota.id,
            ..Default::default()
        })
        .await
        .unwrap();
    c.tenants
        .delete_tenant(DeleteTenantRequest {
            id: t.id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(c.tenant_count().await, 0);
}

#[tokio::test]
async fn storage_directories_are_created_grown_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 16, 0).await;
    let mut req = Clients::cluster(&t.id, "k", "H100-80GB", 1);
    req.storage_gib = 500;
    let k = c.create_cluster(req).await;
    let path = std::path::PathBuf::from(&k.storage_path);
    assert!(
        path.is_absolute() && path.ends_with(format!("volumes/{}/k", t.id)),
        "{}",
        path.display()
    );
    assert!(path.starts_with(std::fs::canonicalize(&agent.data_dir).unwrap()));
    let meta = || std::fs::read_to_string(path.join("volume.json")).unwrap();
    assert!(meta().contains("\"size_gib\":500"), "{}", meta());

    let grow = UpdateTenantClusterRequest {
        id: k.id.clone(),
        storage_gib: 1000,
        ..Default::default()
    };
    assert_eq!(c.update_cluster(grow).await.storage_gib, 1000);
    assert!(meta().contains("\"size_gib\":1000"), "{}", meta());

    // A create refused by the quota leaves no directory behind.
    let refused = Clients::cluster(&t.id, "refused", "H100-80GB", 2);
    assert_status(
        c.clusters.create_tenant_cluster(refused).await,
        Code::FailedPrecondition,
        "quota",
    );
    assert!(!agent
        .data_dir
        .join(format!("volumes/{}/refused", t.id))
        .exists());

    c.delete_cluster(&k.id).await;
    assert!(!path.exists());
}
