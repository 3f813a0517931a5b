//! A tenant with only its own token cannot take the shared pool out of service: an
//! acceptance threshold no pair of nodes reaches fails that tenant's cluster, and every
//! node stays in service for everyone.

mod common;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

#[tokio::test]
async fn an_unreachable_bandwidth_threshold_fails_the_cluster_and_quarantines_no_node() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&dir.path().join("data"));
    let mut admin = agent.admin().await;
    let (team, token) = admin.tenant("team-a").await;
    admin.quota(&team.id, "H100-80GB", 16, 0).await;
    let (other, _) = admin.tenant("team-b").await;
    admin.quota(&other.id, "H100-80GB", 16, 0).await;

    // The tenant's own pipeline, with only its token: loopback gives tens of Gbit/s.
    let mut tenant = agent.clients(&token).await;
    let mut req = Clients::cluster(&team.id, "greedy", "H100-80GB", 2);
    req.set_acceptance = true;
    req.acceptance_level = "quick".into();
    req.min_bus_bandwidth_gbps = 100_000.0;
    req.run_acceptance_on_create = true;
    let refused = status(tenant.clusters.create_tenant_cluster(req).await);
    assert_ne!(refused.code(), Code::Ok);
    assert!(
        refused
            .message()
            .contains("acceptance.min_bus_bandwidth_gbps: no pair of the cluster's 2 nodes"),
        "{}",
        refused.message()
    );
    assert!(refused
        .message()
        .contains("no node was taken out of service"));

    let nodes = admin
        .fleet
        .list_nodes(ListNodesRequest {
            gpu_type: "H100-80GB".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert!(!nodes.is_empty());
    let out: Vec<(&str, &str)> = nodes
        .iter()
        .filter(|n| n.state == "quarantined")
        .map(|n| (n.hostname.as_str(), n.state_reason.as_str()))
        .collect();
    assert!(out.is_empty(), "quarantined: {out:?}");

    // The pool is still everyone's: another team gets the same nodes.
    let cluster = admin
        .create_pool_cluster(&other.id, "after", "H100-80GB", 2)
        .await;
    assert_eq!(cluster.node_count, 2);
}
