//! Clients that fail over between a control plane's addresses (issue 41): a node agent
//! given a dead address first and a live control plane second registers at the second
//! and carries out its orders; the provider given a dead port first applies through its
//! second endpoint (the `endpoints` attribute, then GPUFLEET_ENDPOINT with commas), and
//! the plan after is empty. The dead address is a port the OS handed out and that was
//! closed again: connections to it are refused at once.

use std::net::TcpListener;
use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::{eventually, hcl, Backend, NodeAgent, Terraform};
use gpufleet_proto::v1::UpdateTenantClusterRequest;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(20);

/// `http://127.0.0.1:<port>` where nothing listens.
fn dead_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local address").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_a_dead_address_first_registers_at_the_next_and_carries_out_an_order() {
    let backend = Backend::start_external("30s", "5m");
    let dead = dead_endpoint();
    let live = backend.endpoint();
    let agent =
        NodeAgent::start_dialing(&backend, &format!("{dead},{live}"), "n1", &["--gpus", "2"]);
    let mut admin = backend.admin().await;
    eventually("n1 ready", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            nodes
                .iter()
                .any(|n| n.hostname == "n1" && n.state == "ready")
                .then_some(())
        }
    })
    .await;
    // It said where it could not connect and which address it moved to.
    let log = agent.log();
    assert!(
        log.contains("lost the control plane; trying its next address")
            && log.contains(&format!("control_plane={dead}"))
            && log.contains(&format!("next={live}")),
        "{log}"
    );
    assert!(
        log.contains(&format!("address={live}")),
        "registered at {live}\n{log}"
    );

    // An order through the second address: a MIG layout the agent applies.
    let (tenant, _) = create_tenant(&mut admin, "vision").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 0, 8).await;
    let cluster = create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;
    let changed = admin
        .clusters
        .update_tenant_cluster(UpdateTenantClusterRequest {
            id: cluster.id.clone(),
            mig_layout: [("3g.40gb".to_string(), 2)].into_iter().collect(),
            set_mig_layout: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("update: {s}"))
        .into_inner();
    assert_eq!(changed.status, "running", "{changed:?}");
    assert_eq!(agent.profiles(), vec![vec!["3g.40gb".to_string(); 2]; 2]);
}

#[test]
fn the_provider_applies_through_its_second_endpoint_when_the_first_is_a_dead_port() {
    let backend = Backend::start();
    let dead = dead_endpoint();
    let live = backend.endpoint();
    // GPUFLEET_ENDPOINT names both, dead first (the variable's comma form).
    let tf = Terraform::detached(&format!("{dead},{live}"), backend.admin_token());
    tf.write_main(&hcl::config(&[
        hcl::tenant("t", "speech"),
        hcl::quota("q", "gpufleet_tenant.t.id", "H100-80GB", 8),
        hcl::pool_cluster("c", "gpufleet_tenant.t.id", "train", "H100-80GB", 1)
            .expr("depends_on", "[gpufleet_gpu_quota.q]"),
    ]));
    // The apply through the attribute, which goes before the variable.
    tf.write_file(
        "endpoints.tf",
        &format!("provider \"gpufleet\" {{\n  endpoints = [\"{dead}\", \"{live}\"]\n}}\n"),
    );
    tf.init();
    tf.apply();
    let cluster = tf.resource("gpufleet_tenant_cluster.c");
    assert_eq!(cluster["status"], "running", "{cluster}");
    tf.assert_no_changes();
    // The variable's form alone: the plan after is empty too.
    tf.remove_file("endpoints.tf");
    tf.assert_no_changes();

    // The first endpoint alone is dead indeed: what the apply reached was the second.
    tf.write_file(
        "endpoints.tf",
        &format!("provider \"gpufleet\" {{\n  endpoint = \"{dead}\"\n}}\n"),
    );
    tf.plan_fails()
        .assert_mentions(&["cannot reach the gpufleet backend at", &dead]);

    // Both `endpoint` and `endpoints`: refused at plan, naming the attribute.
    tf.write_file(
        "endpoints.tf",
        &format!(
            "provider \"gpufleet\" {{\n  endpoint  = \"{live}\"\n  endpoints = [\"{live}\"]\n}}\n"
        ),
    );
    let plan = tf.plan_fails();
    plan.assert_mentions(&["endpoints: give either `endpoint` or `endpoints`, not both"]);
}
