//! `timeouts` on `gpufleet_tenant_cluster`, with real Terraform, a real control plane and a
//! real node agent kept busy on purpose: the agent is paused (SIGSTOP) while a create and
//! then a driver change are under way, so each apply runs out of its short timeout
//! deterministically. The error says what it was waiting on; the backend carries on once the
//! agent resumes; the next apply picks up the same cluster (no second one, no "already
//! exists", no "being updated"), and the plan after it is empty. A destroy that times out
//! while the agent returns the GPUs to whole is finished by the backend, and the next
//! destroy waits for it. A malformed timeout is refused at plan time, naming the attribute.

use std::time::Duration;

use gpufleet_e2e::{eventually, Backend, Clients, NodeAgent, Terraform};
use gpufleet_proto::v1::TenantCluster;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);
const CLUSTER: &str = "gpufleet_tenant_cluster.train";

fn config(driver: &str, timeouts: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "t" {{
  name = "speech"
}}
resource "gpufleet_gpu_quota" "h100" {{
  tenant   = gpufleet_tenant.t.id
  gpu_type = "H100-80GB"
  gpus     = 2
}}
resource "gpufleet_tenant_cluster" "train" {{
  tenant         = gpufleet_tenant.t.id
  name           = "train"
  orchestrator   = "kubernetes"
  gpu_type       = "H100-80GB"
  node_count     = 1
  driver_version = "{driver}"
  depends_on     = [gpufleet_gpu_quota.h100]
  timeouts {{
    {timeouts}
  }}
}}
"#
    )
}

/// The clusters named "train" the backend has.
async fn trains(admin: &mut Clients) -> Vec<TenantCluster> {
    admin
        .inventory()
        .await
        .clusters
        .into_iter()
        .filter(|c| c.name == "train")
        .collect()
}

/// Waits until the one "train" cluster has `status` (the backend finishing on its own).
async fn settles(admin: &Clients, status: &str) -> TenantCluster {
    eventually(&format!("the cluster {status}"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let found = trains(&mut admin).await;
            assert_eq!(found.len(), 1, "{found:#?}");
            found.into_iter().find(|c| c.status == status)
        }
    })
    .await
}

async fn ready(admin: &Clients, name: &str) {
    eventually(&format!("node {name} ready"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            admin
                .nodes()
                .await
                .iter()
                .any(|n| n.hostname == name && n.state == "ready")
                .then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_applies_say_what_they_wait_on_and_the_next_apply_resumes() {
    // Heartbeats are missed while the agent is paused: far longer than the test takes.
    let backend = Backend::start_external("5m", "10m");
    let agent = NodeAgent::start(&backend, "n1", &["--gpus", "2"]);
    let mut admin = backend.admin().await;
    ready(&admin, "n1").await;
    let tf = Terraform::new(&backend, backend.admin_token());

    // A malformed timeout is refused at plan time, naming the attribute.
    tf.write_main(&config("570.133.20", "create = \"soon\""));
    tf.init();
    tf.plan_fails()
        .assert_mentions(&["timeouts.create", "\"soon\" is not a duration"]);

    // The create's driver install cannot finish while the agent is paused.
    tf.write_main(&config("570.133.20", "create = \"2s\""));
    agent.pause();
    let failed = tf.apply_fails();
    failed.assert_mentions(&[
        "timeouts.create: tenant cluster \"train\" not created within 2s",
        "waiting for node n1: driver install: installing 570.133.20",
        "Status: creating",
    ]);
    // The backend carries on with it.
    let started = trains(&mut admin).await;
    assert_eq!(started.len(), 1, "{started:#?}");
    assert_eq!(started[0].status, "creating");
    assert!(tf.find_resource(CLUSTER).is_none(), "nothing in state yet");

    // An apply while it is still under way waits for the same cluster again.
    let again = tf.apply_fails();
    again.assert_mentions(&["not created within 2s", "waiting for node n1"]);
    assert!(!again.output().contains("already"), "{again}");
    assert_eq!(trains(&mut admin).await.len(), 1);

    // Once the agent answers, the backend finishes the create on its own, and the next
    // apply takes in that cluster: the same id, no second one, then nothing to do.
    agent.resume();
    let running = settles(&admin, "running").await;
    tf.apply();
    let state = tf.resource(CLUSTER);
    assert_eq!(state["id"], running.id.as_str());
    assert_eq!(state["status"], "running");
    assert_eq!(state["driver_version"], "570.133.20");
    assert_eq!(trains(&mut admin).await.len(), 1);
    tf.assert_no_changes();

    // A driver change that cannot finish in time: the rolling install waits on the node.
    tf.write_main(&config("580.65.06", "update = \"2s\""));
    agent.pause();
    tf.apply_fails().assert_mentions(&[
        "timeouts.update: tenant cluster \"train\" not updated within 2s",
        "waiting for node n1",
        "Status: updating",
    ]);
    // The next apply finds it still updating to the same driver: it waits for that update
    // (and runs out of time again) instead of being refused as a concurrent change.
    let again = tf.apply_fails();
    again.assert_mentions(&["not updated within 2s", "waiting for node n1"]);
    assert!(!again.output().contains("being updated"), "{again}");

    agent.resume();
    settles(&admin, "running").await;
    tf.apply();
    let state = tf.resource(CLUSTER);
    assert_eq!(state["driver_version"], "580.65.06");
    assert_eq!(state["status"], "running");
    assert_eq!(state["nodes"][0]["driver_version"], "580.65.06");
    tf.assert_no_changes();
    assert_eq!(agent.driver().as_deref(), Some("580.65.06"));
    tf.destroy();
    assert!(trains(&mut admin).await.is_empty());
}

fn mig_config(timeouts: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "t" {{
  name = "vision"
}}
resource "gpufleet_gpu_quota" "h100" {{
  tenant   = gpufleet_tenant.t.id
  gpu_type = "H100-80GB"
  gpus     = 2
}}
resource "gpufleet_tenant_cluster" "train" {{
  tenant       = gpufleet_tenant.t.id
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
  mig_layout   = {{ "3g.40gb" = 2 }}
  depends_on   = [gpufleet_gpu_quota.h100]
  timeouts {{
    {timeouts}
  }}
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_destroy_is_finished_by_the_backend_and_the_next_destroy_waits_for_it() {
    let backend = Backend::start_external("5m", "10m");
    let agent = NodeAgent::start(&backend, "n1", &["--gpus", "2"]);
    let mut admin = backend.admin().await;
    ready(&admin, "n1").await;
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&mig_config("delete = \"2s\""));
    tf.init();
    tf.apply();
    assert_eq!(agent.profiles(), vec![vec!["3g.40gb".to_string(); 2]; 2]);

    // Giving the node back needs its agent to return its GPUs to whole.
    agent.pause();
    tf.run_fails(&["destroy", "-auto-approve", "-no-color", "-input=false"])
        .assert_mentions(&[
            "timeouts.delete: tenant cluster \"train\" not deleted within 2s",
            "waiting for node n1: MIG partitioning: back to whole GPUs",
            "Status: deleting",
        ]);
    assert!(tf.find_resource(CLUSTER).is_some(), "still in state");
    // A destroy while the first is under way waits for it (and runs out of time too)
    // instead of being refused.
    let again = tf.run_fails(&["destroy", "-auto-approve", "-no-color", "-input=false"]);
    again.assert_mentions(&["not deleted within 2s"]);
    assert!(!again.output().contains("being deleted"), "{again}");

    agent.resume();
    eventually("the cluster deleted", LIMIT, || {
        let mut admin = admin.clone();
        async move { trains(&mut admin).await.is_empty().then_some(()) }
    })
    .await;
    tf.destroy();
    assert!(tf.state_list().is_empty(), "{:?}", tf.state_list());
    assert!(admin.inventory().await.is_empty());
    assert_eq!(agent.profiles(), vec![Vec::<String>::new(); 2]);
}
