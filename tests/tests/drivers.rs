//! CUDA driver versions per tenant cluster, through the API and real node agents: the
//! catalog and its refusals, choosing by CUDA version, and a rolling change in which one
//! node's install fails and the node is quarantined and replaced.

use gpufleet_e2e::fixtures::{create_quota, create_tenant, request_id};
use gpufleet_e2e::Backend;
use gpufleet_proto::v1::{
    CreateTenantClusterRequest, Event, ListDriverVersionsRequest, ListEventsRequest,
    ResolveDriverRequest, UpdateTenantClusterRequest,
};
use serde_json::Value;

const FLEET: &str = r#"
drivers = ["550.54.15", "550.90.07", "570.133.20", "580.65.06"]

[[pool]]
gpu_type = "H100-80GB"
nodes = 4
gpus_per_node = 2

[[pool]]
gpu_type = "B200"
nodes = 1
gpus_per_node = 2
"#;

/// The versions ListDriverVersions offers for `gpu_type` ("" for any).
async fn offered(admin: &mut gpufleet_e2e::Clients, gpu_type: &str) -> Vec<String> {
    admin
        .fleet
        .list_driver_versions(ListDriverVersionsRequest {
            gpu_type: gpu_type.into(),
            cuda_version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .drivers
        .into_iter()
        .map(|d| d.version)
        .collect()
}

fn resolve(gpu: &str, cuda: &str, driver: &str) -> ResolveDriverRequest {
    ResolveDriverRequest {
        gpu_type: gpu.into(),
        cuda_version: cuda.into(),
        driver_version: driver.into(),
        mig: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offer_is_listed_and_incompatible_choices_are_refused_with_the_reason() {
    let backend = Backend::start_with_fleet(FLEET);
    let mut admin = backend.admin().await;
    let all = offered(&mut admin, "").await;
    assert_eq!(all, ["580.65.06", "570.133.20", "550.90.07", "550.54.15"]);
    let for_b200 = offered(&mut admin, "B200").await;
    assert_eq!(for_b200, ["580.65.06", "570.133.20"]);

    // Only a CUDA version: the newest offered driver that runs it.
    let chosen = admin
        .fleet
        .resolve_driver(resolve("H100-80GB", "12.4", ""))
        .await
        .unwrap();
    assert_eq!(chosen.into_inner().driver.unwrap().version, "580.65.06");
    for (req, needles) in [
        (
            resolve("H100-80GB", "12.8", "550.90.07"),
            vec!["driver_version:", "at least 570.26"],
        ),
        (
            resolve("B200", "", "550.90.07"),
            vec!["driver_version:", "does not support B200", "570.86.15"],
        ),
        (
            resolve("H100-80GB", "", "535.216.03"),
            vec!["not offered", "550.54.15"],
        ),
        (
            resolve("H100-80GB", "12.7", ""),
            vec!["cuda_version:", "unknown CUDA version"],
        ),
        (
            resolve("H100-80GB", "", "5x0"),
            vec!["driver_version:", "not a data-center driver release"],
        ),
    ] {
        let e = admin.fleet.resolve_driver(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        for n in needles {
            assert!(e.message().contains(n), "{n:?} in {}", e.message());
        }
    }
}

/// The largest number of nodes out of service at once, from the cluster's events.
fn most_down_at_once(events: &[Event]) -> usize {
    let mut down = std::collections::BTreeSet::new();
    let mut most = 0;
    for e in events {
        match e.kind.as_str() {
            "node_draining" => {
                down.insert(e.node.clone());
            }
            "node_returned" | "node_quarantined" => {
                down.remove(&e.node);
            }
            _ => {}
        }
        most = most.max(down.len());
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_change_rolls_node_by_node_and_a_failed_node_is_replaced() {
    let backend = Backend::start_with_fleet(FLEET);
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "nlp").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let c = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: request_id(),
            tenant_id: tenant.id.clone(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 3,
            driver_version: "550.54.15".into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("create: {s}"))
        .into_inner();
    assert_eq!(c.driver_version, "550.54.15");
    assert_eq!(c.max_unavailable, 1);
    let failing = c.nodes[1].hostname.clone();
    backend.write_sim_faults(&format!("driver_install_fails = [\"{failing}\"]\n"));

    let change = UpdateTenantClusterRequest {
        id: c.id.clone(),
        set_driver: true,
        cuda_version: "12.8".into(),
        ..Default::default()
    };
    let err = admin
        .clusters
        .update_tenant_cluster(change.clone())
        .await
        .expect_err("the failed node is reported");
    assert!(
        err.message().contains(&failing) && err.message().contains("replaced by"),
        "{}",
        err.message()
    );
    backend.clear_sim_faults();

    let after = admin
        .clusters
        .get_tenant_cluster(gpufleet_proto::v1::GetTenantClusterRequest { id: c.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.driver_version, "580.65.06");
    assert_eq!(after.cuda_version, "12.8");
    assert_eq!(after.status, "running");
    assert_eq!(after.nodes.len(), 3);
    assert!(
        after.nodes.iter().all(|n| n.driver_version == "580.65.06"),
        "{:?}",
        after.nodes
    );
    assert!(after.nodes.iter().all(|n| n.hostname != failing));
    let quarantined = admin
        .nodes()
        .await
        .into_iter()
        .find(|n| n.hostname == failing)
        .unwrap();
    assert_eq!(quarantined.state, "quarantined");
    assert!(
        quarantined.state_reason.contains("sim-faults"),
        "{}",
        quarantined.state_reason
    );
    assert!(quarantined.cluster_id.is_empty());

    let events = admin
        .fleet
        .list_events(ListEventsRequest {
            object_id: c.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    assert_eq!(most_down_at_once(&events), 1, "{events:#?}");
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert!(
        kinds.contains(&"node_quarantined") && kinds.contains(&"node_replaced"),
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| **k == "node_returned").count(), 2);

    // Nothing left to do: the same change again succeeds without touching a node.
    let again = admin
        .clusters
        .update_tenant_cluster(change)
        .await
        .unwrap_or_else(|s| panic!("again: {s}"))
        .into_inner();
    assert_eq!(again.driver_version, "580.65.06");
    let events_after = admin
        .fleet
        .list_events(ListEventsRequest {
            object_id: c.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    assert_eq!(events_after.len(), events.len());
    // The same log from the command line.
    let log = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["events", &c.id, "--endpoint", &backend.endpoint()])
        .args(["--token", backend.admin_token()])
        .output()
        .expect("run gpufleet-agent events");
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.status.success(),
        "{}",
        String::from_utf8_lossy(&log.stderr)
    );
    assert!(
        text.starts_with("SEQ") && text.contains("node_quarantined") && text.contains(&failing),
        "{text}"
    );

    // The operator returns the repaired node: it is reset and ready, then free to use.
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["node-return", &failing, "--endpoint", &backend.endpoint()])
        .args(["--token", backend.admin_token()])
        .output()
        .expect("run gpufleet-agent node-return");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("returned to service"));
    gpufleet_e2e::eventually(
        "the returned node ready",
        std::time::Duration::from_secs(60),
        || {
            let mut admin = admin.clone();
            let failing = failing.clone();
            async move {
                let n = admin
                    .nodes()
                    .await
                    .into_iter()
                    .find(|n| n.hostname == failing)?;
                (n.state == "ready").then_some(())
            }
        },
    )
    .await;
    // Returning a node that is not quarantined is refused, naming why.
    let again = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(["node-return", &failing, "--endpoint", &backend.endpoint()])
        .args(["--token", backend.admin_token()])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not quarantined"));
}

/// A tenant, its H100 quota and a 3-node cluster whose driver is set by `driver_lines`
/// (HCL attribute lines such as `cuda_version = "12.4"`), as a platform team writes it.
fn tf_config(driver_lines: &str) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "t" {{
  name = "nlp"
}}
resource "gpufleet_gpu_quota" "h100" {{
  tenant   = gpufleet_tenant.t.id
  gpu_type = "H100-80GB"
  gpus     = 8
}}
data "gpufleet_driver_versions" "cuda128" {{
  gpu_type     = "H100-80GB"
  cuda_version = "12.8"
}}
resource "gpufleet_tenant_cluster" "train" {{
  tenant       = gpufleet_tenant.t.id
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 3
  {driver_lines}
  depends_on   = [gpufleet_gpu_quota.h100]
}}
output "newest_for_cuda128" {{
  value = data.gpufleet_driver_versions.cuda128.latest
}}
data "gpufleet_events" "train" {{
  object_id = gpufleet_tenant_cluster.train.id
}}
output "event_kinds" {{
  value = [for e in data.gpufleet_events.train.events : e.kind]
}}
"#
    )
}

const TF_CLUSTER: &str = "gpufleet_tenant_cluster.train";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_chooses_by_cuda_refuses_incompatible_pairs_and_rolls_a_change_in_place() {
    let backend = Backend::start_with_fleet(FLEET);
    let tf = gpufleet_e2e::Terraform::new(&backend, backend.admin_token());

    // A pair that cannot work is refused at plan time, naming the attribute and the minimum.
    tf.write_main(&tf_config(
        "cuda_version = \"12.8\"\n  driver_version = \"550.90.07\"",
    ));
    tf.init();
    tf.plan_fails()
        .assert_mentions(&["driver_version", "at least 570.26"]);
    assert!(backend.admin().await.inventory().await.is_empty());

    // Only a CUDA version: the driver is known in the plan already.
    tf.write_main(&tf_config("cuda_version = \"12.4\""));
    let plan = tf.plan();
    assert!(plan.output().contains("\"580.65.06\""), "{plan}");
    tf.apply();
    let state = tf.resource(TF_CLUSTER);
    assert_eq!(state["driver_version"], "580.65.06");
    tf.assert_no_changes();
    assert_eq!(tf.outputs()["newest_for_cuda128"], "580.65.06");

    // An exact, older driver: a change in place that rolls through the nodes.
    // The plan keeps every node, planned: only what the roll rewrites is unknown.
    let hostnames: Vec<Value> = state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostname"].clone())
        .collect();
    tf.write_main(&tf_config("driver_version = \"550.90.07\""));
    let (changes, text) = tf.plan_changes();
    let change = changes.iter().find(|c| c.address == TF_CLUSTER).unwrap();
    assert_eq!(change.actions, vec!["update".to_string()]);
    let after = &change.detail["change"]["after"];
    let planned: Vec<Value> = after["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("nodes are planned\n{text}"))
        .iter()
        .map(|n| n["hostname"].clone())
        .collect();
    assert_eq!(planned, hostnames);
    let now = state["nodes"].as_array().unwrap();
    for (node, was) in after["nodes"].as_array().unwrap().iter().zip(now) {
        assert_eq!(node["driver_version"], "550.90.07", "{node:#}");
        assert_eq!(node["gpu_uuids"], was["gpu_uuids"], "{node:#}");
    }
    // No GPU is shown leaving: a UUID line is a removal (-) or an addition (+) only
    // when the whole list is replaced.
    assert!(
        !text
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("- \"GPU-")),
        "{text}"
    );
    eprintln!(
        "driver change of 3 nodes: {} plan lines",
        text.stdout.lines().count()
    );
    tf.apply();
    let state = tf.resource(TF_CLUSTER);
    assert_eq!(state["driver_version"], "550.90.07");
    for node in state["nodes"].as_array().unwrap() {
        assert_eq!(node["driver_version"], "550.90.07", "{node:#}");
    }
    tf.assert_no_changes();
    // The roll is in the cluster's events, read through the data source.
    tf.refresh();
    let kinds = tf.outputs()["event_kinds"].clone();
    let count = |k: &str| kinds.as_array().unwrap().iter().filter(|v| *v == k).count();
    assert_eq!(
        (count("node_draining"), count("node_returned")),
        (3, 3),
        "{kinds}"
    );

    // One node fails its install: the apply says so, the node is replaced, and the next
    // plan has nothing to do.
    let failing = state["nodes"][0]["hostname"].as_str().unwrap().to_string();
    backend.write_sim_faults(&format!("driver_install_fails = [\"{failing}\"]\n"));
    tf.write_main(&tf_config("cuda_version = \"12.8\""));
    tf.apply_fails()
        .assert_mentions(&[&failing, "quarantined and replaced"]);
    backend.clear_sim_faults();
    // (The refresh takes in the outputs of the events the failed apply added.)
    tf.refresh();
    tf.assert_no_changes();
    let state = tf.resource(TF_CLUSTER);
    assert_eq!(state["driver_version"], "580.65.06");
    let hosts: Vec<&str> = state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(hosts.len(), 3);
    assert!(!hosts.contains(&failing.as_str()), "{hosts:?}");

    // Shrinking releases the highest hostnames: the plan shows the two that stay as they
    // are, and the apply keeps exactly those.
    tf.write_main(
        &tf_config("cuda_version = \"12.8\"").replace("node_count   = 3", "node_count   = 2"),
    );
    let (changes, text) = tf.plan_changes();
    let change = changes.iter().find(|c| c.address == TF_CLUSTER).unwrap();
    let kept: Vec<Value> = state["nodes"].as_array().unwrap()[..2].to_vec();
    assert_eq!(
        change.detail["change"]["after"]["nodes"],
        Value::Array(kept.clone()),
        "{text}"
    );
    tf.apply();
    assert_eq!(tf.resource(TF_CLUSTER)["nodes"], Value::Array(kept));
    tf.destroy();
}
