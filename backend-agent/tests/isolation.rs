//! A tenant token sees and changes only its own tenant's objects; another tenant's
//! objects answer exactly like ids that do not exist.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

const UNKNOWN: &str = "00000000-0000-0000-0000-000000000000";

/// The message with the id replaced, to compare "someone else's" with "does not exist".
fn shape(s: tonic::Status, id: &str) -> (Code, String) {
    (s.code(), s.message().replace(id, "<id>"))
}

#[tokio::test]
async fn tenant_tokens_cannot_see_change_or_detect_other_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut admin = agent.admin().await;
    let (a, a_token) = admin.tenant("team-a").await;
    let (b, _) = admin.tenant("team-b").await;
    let b_quota = admin.quota(&b.id, "H100-80GB", 16, 16).await;
    admin.quota(&a.id, "H100-80GB", 16, 0).await;
    let t = now();
    let b_res = admin
        .create_reservation(&b.id, "H100-80GB", 1, t + HOUR, t + 2 * HOUR)
        .await;
    let b_cluster = admin
        .create_pool_cluster(&b.id, "secret", "H100-80GB", 1)
        .await;
    let before = admin.snapshot().await;

    let mut c = agent.clients(&a_token).await;
    // Reads of B's objects answer like unknown ids.
    let same = |other: tonic::Status, unknown: tonic::Status, id: &str| {
        assert_eq!(other.code(), Code::NotFound);
        assert_eq!(shape(other, id), shape(unknown, UNKNOWN));
    };
    same(
        status(
            c.tenants
                .get_tenant(GetTenantRequest { id: b.id.clone() })
                .await,
        ),
        status(
            c.tenants
                .get_tenant(GetTenantRequest { id: UNKNOWN.into() })
                .await,
        ),
        &b.id,
    );
    same(
        status(
            c.quotas
                .get_gpu_quota(GetGpuQuotaRequest {
                    id: b_quota.id.clone(),
                })
                .await,
        ),
        status(
            c.quotas
                .get_gpu_quota(GetGpuQuotaRequest { id: UNKNOWN.into() })
                .await,
        ),
        &b_quota.id,
    );
    same(
        status(
            c.reservations
                .get_reservation(GetReservationRequest {
                    id: b_res.id.clone(),
                })
                .await,
        ),
        status(
            c.reservations
                .get_reservation(GetReservationRequest { id: UNKNOWN.into() })
                .await,
        ),
        &b_res.id,
    );
    same(
        status(
            c.clusters
                .get_tenant_cluster(GetTenantClusterRequest {
                    id: b_cluster.id.clone(),
                })
                .await,
        ),
        status(
            c.clusters
                .get_tenant_cluster(GetTenantClusterRequest { id: UNKNOWN.into() })
                .await,
        ),
        &b_cluster.id,
    );
    same(
        status(
            c.clusters
                .list_tenant_clusters(ListTenantClustersRequest {
                    tenant_id: b.id.clone(),
                    ..Default::default()
                })
                .await,
        ),
        status(
            c.clusters
                .list_tenant_clusters(ListTenantClustersRequest {
                    tenant_id: UNKNOWN.into(),
                    ..Default::default()
                })
                .await,
        ),
        &b.id,
    );
    same(
        status(
            c.quotas
                .get_quota_usage(QuotaUsageRequest {
                    tenant_id: b.id.clone(),
                    gpu_type: "H100-80GB".into(),
                })
                .await,
        ),
        status(
            c.quotas
                .get_quota_usage(QuotaUsageRequest {
                    tenant_id: UNKNOWN.into(),
                    gpu_type: "H100-80GB".into(),
                })
                .await,
        ),
        &b.id,
    );
    // Changes to B's objects answer like unknown ids too.
    same(
        status(
            c.clusters
                .update_tenant_cluster(UpdateTenantClusterRequest {
                    id: b_cluster.id.clone(),
                    node_count: 2,
                    ..Default::default()
                })
                .await,
        ),
        status(
            c.clusters
                .update_tenant_cluster(UpdateTenantClusterRequest {
                    id: UNKNOWN.into(),
                    node_count: 2,
                    ..Default::default()
                })
                .await,
        ),
        &b_cluster.id,
    );
    same(
        status(
            c.clusters
                .delete_tenant_cluster(DeleteTenantClusterRequest {
                    id: b_cluster.id.clone(),
                })
                .await,
        ),
        status(
            c.clusters
                .delete_tenant_cluster(DeleteTenantClusterRequest { id: UNKNOWN.into() })
                .await,
        ),
        &b_cluster.id,
    );
    same(
        status(
            c.reservations
                .delete_reservation(DeleteReservationRequest {
                    id: b_res.id.clone(),
                })
                .await,
        ),
        status(
            c.reservations
                .delete_reservation(DeleteReservationRequest { id: UNKNOWN.into() })
                .await,
        ),
        &b_res.id,
    );
    same(
        status(
            c.clusters
                .create_tenant_cluster(Clients::cluster(&b.id, "x", "H100-80GB", 1))
                .await,
        ),
        status(
            c.clusters
                .create_tenant_cluster(Clients::cluster(UNKNOWN, "x", "H100-80GB", 1))
                .await,
        ),
        &b.id,
    );

    // Lists hold only A's objects; node ownership of others is hidden.
    let tenants = c
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tenants;
    assert_eq!(
        tenants.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        vec!["team-a"]
    );
    assert!(c
        .clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .clusters
        .is_empty());
    assert!(c
        .reservations
        .list_reservations(ListReservationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .reservations
        .is_empty());
    let quotas = c
        .quotas
        .list_gpu_quotas(ListGpuQuotasRequest::default())
        .await
        .unwrap()
        .into_inner()
        .quotas;
    assert!(quotas.iter().all(|q| q.tenant_id == a.id) && quotas.len() == 1);
    let nodes = c.nodes().await;
    assert!(nodes
        .iter()
        .all(|n| n.cluster_id.is_empty() && n.tenant_id.is_empty()));
    let filtered = c
        .fleet
        .list_nodes(ListNodesRequest {
            cluster_id: b_cluster.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(filtered.into_inner().nodes.is_empty());

    // Admin-only operations.
    let create = CreateTenantRequest {
        request_id: "x".into(),
        name: "team-c".into(),
        ..Default::default()
    };
    assert_status(
        c.tenants.create_tenant(create).await,
        Code::PermissionDenied,
        "admin token",
    );
    let q = CreateGpuQuotaRequest {
        request_id: "q".into(),
        tenant_id: a.id.clone(),
        gpu_type: "A100-80GB".into(),
        gpus: 8,
        burst_gpus: 0,
        ..Default::default()
    };
    assert_status(
        c.quotas.create_gpu_quota(q).await,
        Code::PermissionDenied,
        "admin token",
    );
    assert_status(
        c.tenants
            .delete_tenant(DeleteTenantRequest { id: b.id.clone() })
            .await,
        Code::PermissionDenied,
        "admin token",
    );

    // A's own work still goes through, inside its own tenant.
    let own = c.create_pool_cluster("", "mine", "H100-80GB", 1).await;
    assert_eq!(own.tenant_id, a.id);
    c.delete_cluster(&own.id).await;
    admin
        .assert_unchanged(&before, "B's objects are untouched")
        .await;
}

#[tokio::test]
async fn missing_or_bad_tokens_are_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut bad = agent.clients("gft_not-a-token").await;
    assert_status(
        bad.fleet.list_nodes(ListNodesRequest::default()).await,
        Code::Unauthenticated,
        "GPUFLEET_TOKEN",
    );
    let channel = tonic::transport::Channel::from_shared(agent.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut none = gpufleet_proto::v1::tenant_service_client::TenantServiceClient::new(channel);
    assert_status(
        none.list_tenants(ListTenantsRequest::default()).await,
        Code::Unauthenticated,
        "`token`",
    );
}
