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

    // Lists hold only A's objects; A has no cluster, so no node either.
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
    assert_eq!(
        c.nodes().await,
        vec![],
        "a tenant without clusters has no nodes"
    );
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
            .delete_tenant(DeleteTenantRequest {
                id: b.id.clone(),
                ..Default::default()
            })
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

/// `gpufleet-agent SUBCOMMAND` against `agent` with `token`: its stdout.
fn cli(agent: &Agent, subcommand: &str, token: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args([subcommand, "--endpoint", &agent.endpoint, "--token", token])
        .env_remove("GPUFLEET_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpufleet-agent {subcommand}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The cells of `table`'s row for `model`.
fn row<'a>(table: &'a str, model: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.starts_with(model))
        .unwrap_or_else(|| panic!("no {model} row in\n{table}"))
        .split_whitespace()
        .collect()
}

/// Everything a tenant could learn of a node: its id, hostname and GPU and MIG UUIDs.
fn identifiers(n: &Node) -> Vec<String> {
    let mut ids = vec![n.id.clone(), n.hostname.clone()];
    for g in &n.gpus {
        ids.push(g.uuid.clone());
        ids.extend(g.mig_devices.iter().map(|d| d.uuid.clone()));
    }
    ids
}

#[tokio::test]
async fn a_tenant_sees_its_own_nodes_and_the_pool_only_as_counts() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut admin = agent.admin().await;
    let (a, a_token) = admin.tenant("team-a").await;
    let (b, _) = admin.tenant("team-b").await;
    admin.quota(&a.id, "H100-80GB", 16, 0).await;
    admin.quota(&b.id, "H100-80GB", 16, 0).await;
    let a_cluster = admin
        .create_pool_cluster(&a.id, "own", "H100-80GB", 1)
        .await;
    // B's cluster is split into MIG devices, which A must not see either.
    let mut split = Clients::cluster(&b.id, "split", "H100-80GB", 2);
    split.mig_layout = [("3g.40gb".to_string(), 2)].into_iter().collect();
    let b_cluster = admin.create_cluster(split).await;

    let all = admin.nodes().await;
    let of = |cluster: &str| -> Vec<Node> {
        all.iter()
            .filter(|n| n.cluster_id == cluster)
            .cloned()
            .collect()
    };
    let (a_nodes, b_nodes) = (of(&a_cluster.id), of(&b_cluster.id));
    assert_eq!((a_nodes.len(), b_nodes.len()), (1, 2), "{all:#?}");
    assert!(b_nodes.iter().all(|n| n.gpus[0].mig_devices.len() == 2));
    let b_ids: Vec<String> = b_nodes.iter().flat_map(identifiers).collect();

    // A lists its own node, with its holder, and no other: not B's, not the free ones.
    let mut c = agent.clients(&a_token).await;
    let mut seen = c.nodes().await;
    for n in &mut seen {
        n.heartbeat_age_seconds = 0;
    }
    let mut own = a_nodes.clone();
    for n in &mut own {
        n.heartbeat_age_seconds = 0;
    }
    assert_eq!(seen, own, "A lists exactly the node of its cluster");
    assert_eq!(
        (seen[0].tenant_id.as_str(), seen[0].cluster_id.as_str()),
        (a.id.as_str(), a_cluster.id.as_str())
    );
    // Every way of asking, paged and filtered, holds nothing of B's.
    let mut answers = Vec::new();
    for req in [
        ListNodesRequest::default(),
        ListNodesRequest {
            gpu_type: "H100-80GB".into(),
            page_size: 1,
            ..Default::default()
        },
        ListNodesRequest {
            cluster_id: b_cluster.id.clone(),
            ..Default::default()
        },
    ] {
        let answer = c.fleet.list_nodes(req).await.unwrap().into_inner();
        answers.push(format!("{answer:?}"));
    }
    for text in &answers {
        for id in &b_ids {
            assert!(
                !text.contains(id.as_str()),
                "A's answer names {id} of B's: {text}"
            );
        }
        assert!(
            !text.contains(&b.id) && !text.contains(&b_cluster.id),
            "{text}"
        );
    }
    // B's cluster as a filter answers like a cluster that does not exist: no nodes.
    let unknown_filter = c
        .fleet
        .list_nodes(ListNodesRequest {
            cluster_id: UNKNOWN.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answers[2], format!("{unknown_filter:?}"));

    // B's node by id or by name answers like one that does not exist.
    let b_node = &b_nodes[0];
    let events = |id: &str| {
        let mut fleet = c.fleet.clone();
        let id = id.to_string();
        async move {
            status(
                fleet
                    .list_events(ListEventsRequest {
                        object_id: id,
                        ..Default::default()
                    })
                    .await,
            )
        }
    };
    let (theirs, nobodys) = (events(&b_node.id).await, events(UNKNOWN).await);
    assert_eq!(theirs.code(), Code::NotFound);
    assert_eq!(shape(theirs, &b_node.id), shape(nobodys, UNKNOWN));
    let give_back = |name: &str| {
        let mut fleet = c.fleet.clone();
        let name = name.to_string();
        async move { status(fleet.return_node(ReturnNodeRequest { name }).await) }
    };
    let (theirs, nobodys) = (
        give_back(&b_node.hostname).await,
        give_back("no-such-node").await,
    );
    assert_eq!(
        shape(theirs, &b_node.hostname),
        shape(nobodys, "no-such-node")
    );
    // Nor release another team's node name for an agent of its own.
    let release = |name: &str| {
        let mut fleet = c.fleet.clone();
        let name = name.to_string();
        async move {
            status(
                fleet
                    .forget_node_secret(ForgetNodeSecretRequest { name })
                    .await,
            )
        }
    };
    let (theirs, nobodys) = (
        release(&b_node.hostname).await,
        release("no-such-node").await,
    );
    assert_eq!(
        theirs.code(),
        Code::PermissionDenied,
        "{}",
        theirs.message()
    );
    assert_eq!(
        shape(theirs, &b_node.hostname),
        shape(nobodys, "no-such-node")
    );

    // Capacity as counts, the same for A as for the admin, and B's nodes are not free.
    let types = c.gpu_types().await;
    assert_eq!(types, admin.gpu_types().await);
    let h100 = types.iter().find(|t| t.name == "H100-80GB").unwrap();
    let free = all
        .iter()
        .filter(|n| {
            n.gpu_type == "H100-80GB"
                && n.capacity == "pool"
                && n.cluster_id.is_empty()
                && n.state != "quarantined"
        })
        .count() as i64;
    assert_eq!(h100.free_pool_nodes, free);
    assert_eq!(h100.free_pool_nodes, h100.pool_nodes - 3, "{h100:?}");

    // The CLIs with A's token: the same fleet counts as the admin's, only A's node.
    let fleet_a = cli(&agent, "fleet", &a_token);
    let fleet_admin = cli(&agent, "fleet", ADMIN);
    assert_eq!(fleet_a, fleet_admin);
    // GPU TYPE, GPUS/NODE, MEMORY MIB, POOL NODES, POOL FREE, ...
    assert_eq!(row(&fleet_a, "H100-80GB")[4], free.to_string(), "{fleet_a}");
    let nodes_a = cli(&agent, "nodes", &a_token);
    assert_eq!(
        nodes_a.lines().count(),
        2,
        "a header and A's node:\n{nodes_a}"
    );
    assert!(nodes_a.contains(&a_nodes[0].hostname), "{nodes_a}");
    for n in &b_nodes {
        assert!(!nodes_a.contains(&n.hostname), "{nodes_a}");
    }
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
