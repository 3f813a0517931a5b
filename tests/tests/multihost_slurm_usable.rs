//! "Running" means usable (issue 33, item 2), on the multi-host tier: a Slurm cluster is
//! `running` only once its controller answered through every node, a job step ran on every
//! node at once as the cluster's account, and its login answered. A node that declares an
//! address the controller cannot reach registers with the controller all the same (slurmd
//! calls the controller, not the other way), so Slurm lists it `idle`; the cluster is
//! `degraded` nonetheless, saying the job step did not run, until the node declares an
//! address that works.
//!
//! Needs root (CI runs as root); without namespaces it fails saying so.

use std::time::Duration;

use gpufleet_e2e::multihost::ONE_GPU_HOST;
use gpufleet_e2e::netns::{self, Network};
use gpufleet_e2e::slurm_login::{team_key, two_node_vision};
use gpufleet_e2e::{eventually, Backend, NodeAgent, Terraform};
use gpufleet_proto::v1::TenantCluster;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_cluster_whose_controller_cannot_reach_a_node_is_not_running() {
    netns::require("the multi-host Slurm acceptance tests");
    let net = Network::new(&["cp", "client", "g1", "g2"]);
    let backend = Backend::start_on(
        net.host("cp"),
        net.host("client"),
        &["--node-agents", "external", "--health-interval", "0"],
    );
    // g2 declares an address on the hosts' network that no host has: its slurmd registers
    // with the controller, which cannot reach it.
    let nowhere = {
        let [a, b, c, _] = net.host("g2").addr().octets();
        format!("{a}.{b}.{c}.250")
    };
    let _g1 = NodeAgent::start_on(net.host("g1"), &backend, "g1", &ONE_GPU_HOST);
    let mut g2 = NodeAgent::start_on(
        net.host("g2"),
        &backend,
        "g2",
        &[&ONE_GPU_HOST[..], &["--address", &nowhere]].concat(),
    );
    let admin = backend.admin().await;
    eventually("both nodes ready", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == 2 && nodes.iter().all(|n| n.state == "ready")).then_some(())
        }
    })
    .await;
    let client = net.host("client");
    let (_key, public) = team_key(client, "vision");
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.write_file("vision.pub", &public);
    tf.write_main(&two_node_vision(""));
    tf.init();
    tf.apply();
    let made = tf.resource("gpufleet_tenant_cluster.vision");
    assert_eq!(made["status"], "degraded", "{made:#}");
    let reason = made["status_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("Slurm: not usable: ") && reason.contains("did not run"),
        "{reason}"
    );
    // It stays so (Slurm alone would call the node idle)...
    let cluster = |admin: &gpufleet_e2e::Clients| {
        let mut admin = admin.clone();
        async move {
            admin
                .inventory()
                .await
                .clusters
                .into_iter()
                .next()
                .expect("the cluster")
        }
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now: TenantCluster = cluster(&admin).await;
    assert_eq!(now.status, "degraded", "{}", now.status_reason);

    // ...until the node declares an address the controller reaches.
    g2.restart_with(&ONE_GPU_HOST);
    eventually("the cluster running once every node works", LIMIT, || {
        let admin = admin.clone();
        async move {
            let now = cluster(&admin).await;
            (now.status == "running").then_some(())
        }
    })
    .await;
    tf.destroy();
}
