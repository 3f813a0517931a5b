//! Actions (Terraform 1.14+; here 1.15.5) invoked with `terraform apply
//! -invoke=action.TYPE.NAME` against a real control plane: a health check of a cluster at
//! a level shows its progress and passes, then fails naming the node, the check and its
//! value once the simulated hardware has an ECC fault (the node is quarantined); returning
//! that node fails while the fault lasts and succeeds once it is gone (the admin token; a
//! team's token is refused). The admin drains a cluster's node: it is quarantined with the
//! reason and the cluster gets another; drained again it stays as it is; returned, it is
//! ready. A cluster's `action_trigger` runs the check after its create. Bad configuration
//! is refused before anything runs, naming the attribute.

use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::{eventually, Backend, Terraform, TfRun};

const LIMIT: Duration = Duration::from_secs(90);

fn actions(cluster_id: &str, level: &str, node: &str) -> String {
    format!(
        r#"
action "gpufleet_run_health_check" "now" {{
  config {{
    cluster_id = "{cluster_id}"
    level      = "{level}"
  }}
}}

action "gpufleet_return_node" "back" {{
  config {{
    node = "{node}"
  }}
}}

action "gpufleet_drain_node" "out" {{
  config {{
    node   = "{node}"
    reason = "disk swap"
  }}
}}
"#
    )
}

fn invoke(tf: &Terraform, action: &str) -> TfRun {
    tf.run(&[
        "apply",
        "-auto-approve",
        "-no-color",
        "-input=false",
        &format!("-invoke=action.{action}"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_passes_then_fails_naming_the_check_and_the_node_is_returned() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, team_token) = create_tenant(&mut admin, "act").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 16, 0).await;
    let cluster = create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;
    let node = cluster.nodes[0].hostname.clone();

    // The team runs the check on its own cluster, with its own token.
    let mut tf = Terraform::new(&backend, &team_token);
    tf.write_main(&actions(&cluster.id, "quick", &node));
    tf.init();
    let passed = invoke(&tf, "gpufleet_run_health_check.now");
    assert_eq!(passed.code, 0, "{passed}");
    passed.assert_mentions(&[
        &format!("running quick health checks on cluster {}", cluster.id),
        &format!("{node}: passed"),
    ]);

    // An uncorrected ECC error on the node: the check fails, naming node, check and value.
    backend.write_sim_faults(&format!(
        "[[ecc_burst]]\nnode = \"{node}\"\ngpu = 0\nuncorrected = 3\n"
    ));
    let failed = invoke(&tf, "gpufleet_run_health_check.now");
    assert_ne!(failed.code, 0, "{failed}");
    failed.assert_mentions(&[
        &format!(
            "health check failed on node {node} of cluster {} (quick level): ecc_uncorrected_volatile on GPU-",
            cluster.id
        ),
        "(threshold 0); quarantined; replaced by",
    ]);
    let quarantined = admin
        .nodes()
        .await
        .into_iter()
        .find(|n| n.hostname == node)
        .expect("the node");
    assert_eq!(quarantined.state, "quarantined", "{quarantined:?}");

    // A team may not return a node; the admin may, once it passes its checks.
    let refused = invoke(&tf, "gpufleet_return_node.back");
    assert_ne!(refused.code, 0, "{refused}");
    refused.assert_mentions(&["the token does not allow this"]);
    tf.set_token(backend.admin_token());
    let still_bad = invoke(&tf, "gpufleet_return_node.back");
    assert_ne!(still_bad.code, 0, "{still_bad}");
    still_bad.assert_mentions(&[&format!("node: node {node} stays quarantined")]);
    backend.clear_sim_faults();
    let returned = invoke(&tf, "gpufleet_return_node.back");
    assert_eq!(returned.code, 0, "{returned}");
    returned.assert_mentions(&[
        &format!("returning node {node}: running its medium health checks first"),
        &format!("node {node} passed and is back in service"),
    ]);
    eventually(&format!("{node} ready"), LIMIT, || {
        let mut admin = admin.clone();
        let node = node.clone();
        async move {
            admin
                .nodes()
                .await
                .into_iter()
                .find(|n| n.hostname == node && n.state == "ready")
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_leaves_its_cluster_which_gets_another_and_it_comes_back() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, team_token) = create_tenant(&mut admin, "drain").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let cluster = create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;
    let node = cluster.nodes[0].hostname.clone();

    let mut tf = Terraform::new(&backend, &team_token);
    tf.write_main(&actions(&cluster.id, "quick", &node));
    tf.init();
    let refused = invoke(&tf, "gpufleet_drain_node.out");
    assert_ne!(refused.code, 0, "{refused}");
    refused.assert_mentions(&["the token does not allow this"]);

    tf.set_token(backend.admin_token());
    let drained = invoke(&tf, "gpufleet_drain_node.out");
    assert_eq!(drained.code, 0, "{drained}");
    drained.assert_mentions(&[
        &format!("draining node {node}"),
        &format!("node {node} is out of service: quarantined (drained by an operator: disk swap)"),
    ]);
    let out = admin
        .nodes()
        .await
        .into_iter()
        .find(|n| n.hostname == node)
        .expect("the node");
    assert_eq!(
        (out.state.as_str(), out.cluster_id.as_str()),
        ("quarantined", ""),
        "{out:?}"
    );
    // The cluster has another node, in service.
    let clusters = admin.clusters.clone();
    let id = cluster.id.clone();
    let replaced = eventually("the cluster's replacement", LIMIT, || {
        let mut clusters = clusters.clone();
        let (id, node) = (id.clone(), node.clone());
        async move {
            let c = clusters
                .get_tenant_cluster(gpufleet_proto::v1::GetTenantClusterRequest { id })
                .await
                .ok()?
                .into_inner();
            (c.status == "running" && c.nodes.len() == 1 && c.nodes[0].hostname != node)
                .then_some(c)
        }
    })
    .await;
    assert_ne!(replaced.nodes[0].hostname, node);

    // Drained again: left as it is. Returned: it passes its checks and is ready.
    let again = invoke(&tf, "gpufleet_drain_node.out");
    assert_eq!(again.code, 0, "{again}");
    again.assert_mentions(&[&format!("node {node} is out of service: quarantined")]);
    let returned = invoke(&tf, "gpufleet_return_node.back");
    assert_eq!(returned.code, 0, "{returned}");
    eventually(&format!("{node} ready"), LIMIT, || {
        let mut admin = admin.clone();
        let node = node.clone();
        async move {
            admin
                .nodes()
                .await
                .into_iter()
                .find(|n| n.hostname == node && n.state == "ready")
        }
    })
    .await;
}

/// A team's configuration checks the cluster it creates once it exists: an
/// `action_trigger` after create runs the health-check action in the same apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_triggers_its_health_check_after_create() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, team_token) = create_tenant(&mut admin, "trig").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let tf = Terraform::new(&backend, &team_token);
    tf.write_main(
        r#"
resource "gpufleet_tenant_cluster" "train" {
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1

  lifecycle {
    action_trigger {
      events  = [after_create]
      actions = [action.gpufleet_run_health_check.after_create]
    }
  }
}

action "gpufleet_run_health_check" "after_create" {
  config {
    cluster_id = gpufleet_tenant_cluster.train.id
    level      = "quick"
  }
}
"#,
    );
    tf.init();
    let applied = tf.apply();
    let cluster = tf.resource("gpufleet_tenant_cluster.train");
    let id = cluster["id"].as_str().expect("cluster id");
    applied.assert_mentions(&[
        &format!("running quick health checks on cluster {id}"),
        ": passed (",
    ]);
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_refused_before_anything_runs_naming_the_attribute() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, _token) = create_tenant(&mut admin, "bad").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let cluster = create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;

    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&actions(&cluster.id, "deep", "h100-80gb-pool-01"));
    tf.init();
    let validated = tf.run_fails(&["validate", "-no-color"]);
    validated.assert_mentions(&["level: must be \"quick\", \"medium\" or \"long\" (got \"deep\")"]);

    tf.write_main(&actions("no-such-cluster", "quick", ""));
    let validated = tf.run_fails(&["validate", "-no-color"]);
    validated.assert_mentions(&["node: must not be empty"]);

    tf.write_main(
        &actions("no-such-cluster", "quick", "n1").replace("disk swap", &"x".repeat(300)),
    );
    let validated = tf.run_fails(&["validate", "-no-color"]);
    validated.assert_mentions(&["reason: is 300 characters long; at most 256"]);

    tf.write_main(&actions("no-such-cluster", "quick", "h100-80gb-pool-01"));
    let planned = invoke(&tf, "gpufleet_run_health_check.now");
    assert_ne!(planned.code, 0, "{planned}");
    planned.assert_mentions(&["cluster_id: tenant cluster 'no-such-cluster' not found"]);
    assert!(
        !planned.output().contains("running quick health checks"),
        "refused at plan, before the action ran\n{planned}"
    );
}
