//! The node agents' load tests through Terraform: simulated GPUs that fail only under
//! load (memory that flips bits, memory at half speed, a GPU that throttles and logs an
//! XID when worked) fail their load test with the measured and the expected figure, and
//! the node is quarantined and replaced; a host that cannot run the load tests (no CUDA)
//! fails a cluster's acceptance, unless its fleet group sets `load_test_skip = true`,
//! where its tests say "not run" and why; and load-test failures count in the quarantine
//! breaker like any failed check.

use std::time::Duration;

use gpufleet_e2e::{eventually, Backend, Clients, NodeAgent, Terraform};
use gpufleet_proto::v1::{GetTenantClusterRequest, Node};
use serde_json::Value;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const CLUSTER: &str = "gpufleet_tenant_cluster.train";
const CHECK: &str = "gpufleet_health_check.now";

/// A team, its quota (`nodes` x `gpus` H100 GPUs) and a `nodes`-node H100 cluster with
/// medium acceptance checks; from round 1 on, a medium health check run triggered by the
/// round.
fn config(nodes: u32, gpus: u32, round: Option<u32>) -> String {
    let quota = nodes * gpus;
    let mut hcl = format!(
        r#"
resource "gpufleet_tenant" "ml" {{
  name = "ml"
}}

resource "gpufleet_gpu_quota" "h100" {{
  tenant   = gpufleet_tenant.ml.id
  gpu_type = "H100-80GB"
  gpus     = {quota}
}}

resource "gpufleet_tenant_cluster" "train" {{
  tenant       = gpufleet_tenant.ml.id
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = {nodes}
  depends_on   = [gpufleet_gpu_quota.h100]

  acceptance {{
    level = "medium"
  }}
}}
"#
    );
    if let Some(round) = round {
        hcl.push_str(&format!(
            r#"
resource "gpufleet_health_check" "now" {{
  cluster_id = gpufleet_tenant_cluster.train.id
  level      = "medium"
  triggers   = {{ round = "{round}" }}
}}
"#
        ));
    }
    hcl
}

async fn node(admin: &mut Clients, name: &str) -> Option<Node> {
    admin.nodes().await.into_iter().find(|n| n.hostname == name)
}

async fn nodes_in_state(admin: &Clients, names: &[String], state: &str) {
    eventually(&format!("nodes {names:?} {state}"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let all = admin.nodes().await;
            names
                .iter()
                .all(|name| all.iter().any(|n| &n.hostname == name && n.state == state))
                .then_some(())
        }
    })
    .await
}

fn hostnames(resource: &Value) -> Vec<String> {
    resource["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["hostname"].as_str().unwrap().to_string())
        .collect()
}

fn results_of<'a>(results: &'a Value, node: &str, check: &str) -> Vec<&'a Value> {
    results
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["node"] == node && r["check"].as_str().unwrap_or_default().starts_with(check))
        .collect()
}

/// `node` failed `check` with a value and a threshold, and is quarantined with a reason
/// naming them.
async fn caught(admin: &mut Clients, results: &Value, node_name: &str, check: &str) -> Value {
    let hit = results_of(results, node_name, check)
        .into_iter()
        .find(|r| r["verdict"] == "fail")
        .unwrap_or_else(|| panic!("{node_name}: no failed {check} in {results}"))
        .clone();
    let n = node(admin, node_name).await.expect("the node is listed");
    assert_eq!(n.state, "quarantined", "{node_name}: {}", n.state_reason);
    for needle in [
        check,
        hit["value"].as_str().unwrap(),
        hit["threshold"].as_str().unwrap(),
    ] {
        assert!(
            n.state_reason.contains(needle),
            "{needle:?} in the reason {:?}",
            n.state_reason
        );
    }
    hit
}

/// `serve` for external agents (`extra` flags besides), and `count` agent processes of
/// two simulated GPUs named `PREFIX1`..., every one ready.
async fn agent_fleet(
    extra: &[&str],
    prefix: &str,
    count: usize,
) -> (Backend, Vec<NodeAgent>, Clients) {
    let mut args = vec![
        "--node-agents",
        "external",
        "--node-timeout",
        "10s",
        "--replace-after",
        "1h",
        "--health-interval",
        "0",
    ];
    args.extend_from_slice(extra);
    let backend = Backend::start_with_args(&args);
    let names: Vec<String> = (1..=count).map(|i| format!("{prefix}{i}")).collect();
    let agents: Vec<NodeAgent> = names
        .iter()
        .map(|n| NodeAgent::start(&backend, n, &["--gpus", "2"]))
        .collect();
    let admin = backend.admin().await;
    nodes_in_state(&admin, &names, "ready").await;
    (backend, agents, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_that_fail_only_under_load_are_caught_by_their_load_tests_quarantined_and_replaced() {
    let (backend, agents, mut admin) =
        agent_fleet(&["--breaker-max-quarantines", "8"], "u", 6).await;

    // Healthy simulated GPUs pass the medium level's load tests at create.
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.init();
    tf.write_main(&config(3, 2, None));
    tf.apply();
    let cluster = tf.resource(CLUSTER);
    assert_eq!(cluster["acceptance_status"], "passed", "{cluster}");
    let cluster_id = cluster["id"].as_str().unwrap().to_string();
    tf.assert_no_changes();

    // One fault under load per node: bits that flip, memory at half speed, a GPU that
    // throttles for heat and logs XID 79 when it is worked.
    let held = hostnames(&cluster);
    let faults = [
        "flipped_bits = 2",
        "memory_speed = 0.5",
        "throttle_under_load = 64\nxid_under_load = 79",
    ];
    for (name, fault) in held.iter().zip(faults) {
        let agent = agents.iter().find(|a| &a.name == name).unwrap();
        std::fs::write(
            agent.data_dir().join("sim-faults.toml"),
            format!("[[under_load]]\nnode = \"{name}\"\ngpu = 1\n{fault}\n"),
        )
        .unwrap();
    }
    tf.write_main(&config(3, 2, Some(1)));
    tf.apply();
    let run = tf.resource(CHECK);
    let results = &run["results"];
    let memory = caught(&mut admin, results, &held[0], "gpu_memory").await;
    assert_eq!(
        memory["value"], "6 mismatches",
        "two words of each of three patterns"
    );
    let hbm = caught(&mut admin, results, &held[1], "hbm_bandwidth").await;
    assert!(
        hbm["threshold"]
            .as_str()
            .unwrap()
            .contains("of the expected 3001.7"),
        "{hbm}"
    );
    let throttle = caught(&mut admin, results, &held[2], "under_load:throttle").await;
    assert_eq!(throttle["value"], "hardware thermal slowdown", "{throttle}");
    let xid = results_of(results, &held[2], "under_load:xid");
    assert!(
        xid.iter()
            .any(|r| r["verdict"] == "fail" && r["value"] == "79"),
        "{xid:?}"
    );
    // The burn measured the model's figure on the healthy GPU of a faulty node.
    let burns = results_of(results, &held[0], "gpu_burn");
    assert_eq!(burns.len(), 2, "{burns:?}");
    assert!(burns
        .iter()
        .all(|b| b["verdict"] == "pass" && b["value"].as_str().unwrap().ends_with("TFLOP/s")));

    // Replaced by nodes that passed: the cluster is whole and healthy again.
    assert_eq!(run["passed"], true, "{run}");
    let now = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest { id: cluster_id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.status, "running", "{}", now.status_reason);
    assert_eq!(now.nodes.len(), 3);
    assert!(now.nodes.iter().all(|n| !held.contains(&n.hostname)));
    tf.assert_no_changes();
}

/// A fleet of two single-GPU H100 nodes, the fleet group's load-test settings added.
fn fleet(settings: &str) -> String {
    format!("[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 2\ngpus_per_node = 1\n{settings}")
}

const NO_CUDA: &str = "no_cuda = [\"h100-80gb-pool-01\", \"h100-80gb-pool-02\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_cuda_fails_acceptance_unless_its_fleet_group_allows_skipping() {
    // Without the setting: the load tests that cannot run fail, each node is quarantined
    // in turn, and the cluster is not created.
    let strict = Backend::start_with_fleet_and_args(&fleet(""), &[]);
    let mut admin = strict.admin().await;
    let both = vec![
        "h100-80gb-pool-01".to_string(),
        "h100-80gb-pool-02".to_string(),
    ];
    nodes_in_state(&admin, &both, "ready").await;
    strict.write_sim_faults(NO_CUDA);
    let tf = Terraform::new(&strict, strict.admin_token());
    tf.init();
    tf.write_main(&config(1, 1, None));
    tf.apply_fails()
        .assert_mentions(&["acceptance", "gpu_memory", "not run: no CUDA library"]);
    for name in &both {
        let n = node(&mut admin, name).await.unwrap();
        assert_eq!(n.state, "quarantined", "{name}: {}", n.state_reason);
        assert!(n.state_reason.contains("not run"), "{}", n.state_reason);
    }
    drop(strict);

    // With load_test_skip = true the same hosts pass, their load tests "not run" with why.
    let lenient = Backend::start_with_fleet_and_args(&fleet("load_test_skip = true\n"), &[]);
    let admin = lenient.admin().await;
    nodes_in_state(&admin, &both, "ready").await;
    lenient.write_sim_faults(NO_CUDA);
    let tf = Terraform::new(&lenient, lenient.admin_token());
    tf.init();
    tf.write_main(&config(1, 1, Some(1)));
    tf.apply();
    assert_eq!(tf.resource(CLUSTER)["acceptance_status"], "passed");
    let run = tf.resource(CHECK);
    let node = hostnames(&tf.resource(CLUSTER))[0].clone();
    for check in ["gpu_memory", "gpu_burn", "hbm_bandwidth", "host_bandwidth"] {
        let r = results_of(&run["results"], &node, check);
        assert_eq!(r.len(), 1, "{check}: {r:?}");
        assert_eq!(r[0]["verdict"], "not_run", "{check}: {:?}", r[0]);
        assert!(
            r[0]["detail"].as_str().unwrap().contains("no CUDA library"),
            "{:?}",
            r[0]
        );
    }
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_test_failures_count_in_the_breaker_which_holds_the_third_node_in_service() {
    // The default breaker: at most 2 automatic quarantines of a model per window.
    let (backend, agents, mut admin) = agent_fleet(&[], "b", 5).await;
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.init();
    tf.write_main(&config(3, 2, None));
    tf.apply();
    let held = hostnames(&tf.resource(CLUSTER));

    // Every node of the cluster burns at a third of the model's figure.
    for name in &held {
        let agent = agents.iter().find(|a| &a.name == name).unwrap();
        std::fs::write(
            agent.data_dir().join("sim-faults.toml"),
            format!("[[under_load]]\nnode = \"{name}\"\ngpu = 0\ncompute_speed = 0.3\n"),
        )
        .unwrap();
    }
    tf.write_main(&config(3, 2, Some(1)));
    // The run fails a node that stays in the cluster; whether the apply says so or not,
    // what matters is what happened to the nodes.
    let _ = tf.run(&["apply", "-auto-approve", "-no-color", "-input=false"]);
    let mut states = Vec::new();
    for name in &held {
        states.push(node(&mut admin, name).await.unwrap());
    }
    let out: Vec<&Node> = states.iter().filter(|n| n.state == "quarantined").collect();
    assert_eq!(out.len(), 2, "the cap: {states:?}");
    for n in &out {
        assert!(n.state_reason.contains("gpu_burn"), "{}", n.state_reason);
    }
    let kept = states.iter().find(|n| n.state != "quarantined").unwrap();
    let log = admin
        .fleet
        .list_events(gpufleet_proto::v1::ListEventsRequest {
            object_id: "breaker/H100-80GB".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let opened: Vec<_> = log.iter().filter(|e| e.kind == "breaker_opened").collect();
    assert_eq!(opened.len(), 1, "{log:?}");
    let held_back = log
        .iter()
        .find(|e| e.kind == "quarantine_held")
        .unwrap_or_else(|| panic!("no quarantine_held in {log:?}"));
    assert!(
        held_back.message.contains("gpu_burn"),
        "{}",
        held_back.message
    );
    assert_eq!(held_back.node, kept.hostname, "{log:?}");
}
