//! MIG layouts through Terraform: a valid layout is applied and visible per GPU, an
//! impossible one is refused at plan time naming the rule, a change re-partitions in place
//! (warning of the profiles it removes),
//! and a failure injected mid-change is rolled back with state and backend still truthful.

use std::collections::BTreeMap;

use gpufleet_e2e::hcl;
use gpufleet_e2e::json::{array_of, i64_of, str_of};
use gpufleet_e2e::{Backend, Clients, Terraform};
use gpufleet_proto::v1::{GetTenantClusterRequest, ListNodesRequest};
use serde_json::Value;

const CLUSTER: &str = "gpufleet_tenant_cluster.inference";
/// The cluster's nodes as `gpufleet_nodes` lists them, GPU by GPU.
const LISTED: &str = "data.gpufleet_nodes.inference";

/// `layout` rendered as an HCL map, e.g. `{ "3g.40gb" = 1 }`.
fn hcl_layout(layout: &[(&str, i64)]) -> String {
    let entries: Vec<String> = layout
        .iter()
        .map(|(profile, count)| format!("\"{profile}\" = {count}"))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

/// A tenant with an A100 quota and a 1-node Slurm cluster partitioned by `layout`.
fn config(layout: &[(&str, i64)]) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "t" {{
  name = "speech"
}}
resource "gpufleet_gpu_quota" "a100" {{
  tenant   = gpufleet_tenant.t.id
  gpu_type = "A100-80GB"
  gpus     = 8
}}
resource "gpufleet_tenant_cluster" "inference" {{
  tenant       = gpufleet_tenant.t.id
  name         = "inference"
  orchestrator = "slurm"
  gpu_type     = "A100-80GB"
  node_count   = 1
  mig_layout   = {layout}
  depends_on   = [gpufleet_gpu_quota.a100]
}}
data "gpufleet_nodes" "inference" {{
  cluster_id = gpufleet_tenant_cluster.inference.id
  depends_on = [gpufleet_tenant_cluster.inference]
}}
"#,
        layout = hcl_layout(layout)
    )
}

fn as_map(layout: &[(&str, i64)]) -> BTreeMap<String, i64> {
    layout.iter().map(|(p, c)| (p.to_string(), *c)).collect()
}

/// Profile -> count over one GPU's devices as `gpufleet_nodes` lists them, and checks the
/// devices do not overlap.
fn listed_gpu_layout(gpu: &Value) -> BTreeMap<String, i64> {
    assert_eq!(gpu["mig_enabled"], true, "MIG mode on: {gpu:#}");
    let mut counts = BTreeMap::new();
    let mut used = [false; 8];
    for device in array_of(gpu, "mig_devices") {
        *counts.entry(str_of(device, "profile")).or_insert(0) += 1;
        let (start, size) = (i64_of(device, "start"), i64_of(device, "size"));
        for slice in start..start + size {
            let slice = usize::try_from(slice).expect("slice index");
            assert!(!used[slice], "memory slice {slice} used twice on {gpu:#}");
            used[slice] = true;
        }
        assert!(str_of(device, "uuid").starts_with("MIG-"), "{device:#}");
        assert!(i64_of(device, "memory_mib") > 0, "{device:#}");
    }
    counts
}

/// Profile -> count of a node's `mig_instances` in state.
fn instances(node: &Value) -> BTreeMap<String, i64> {
    node["mig_instances"]
        .as_object()
        .unwrap_or_else(|| panic!("mig_instances is not a map: {node:#}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or_default()))
        .collect()
}

/// Asserts that the cluster in state carries `layout` and each node its instances on 8
/// GPUs.
fn assert_state_layout(tf: &Terraform, layout: &[(&str, i64)]) {
    let cluster = tf.resource(CLUSTER);
    let expected = as_map(layout);
    let in_state: BTreeMap<String, i64> = cluster["mig_layout"]
        .as_object()
        .unwrap_or_else(|| panic!("mig_layout is not a map: {cluster:#}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or_default()))
        .collect();
    assert_eq!(in_state, expected, "mig_layout in state");
    let nodes = array_of(&cluster, "nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(array_of(&nodes[0], "gpus").len(), 8, "every GPU is listed");
    let on_eight: BTreeMap<String, i64> =
        expected.iter().map(|(p, c)| (p.clone(), c * 8)).collect();
    assert_eq!(instances(&nodes[0]), on_eight, "the node's instances");
}

/// Asserts that `gpufleet_nodes` lists `layout` on every GPU, device by device.
fn assert_listed_layout(tf: &Terraform, layout: &[(&str, i64)]) {
    let expected = as_map(layout);
    let listed = tf.resource(LISTED);
    let listed_nodes = array_of(&listed, "nodes");
    assert_eq!(listed_nodes.len(), 1, "{listed:#}");
    let gpus = array_of(&listed_nodes[0], "gpus");
    assert_eq!(gpus.len(), 8, "every GPU of the node is listed");
    for gpu in gpus {
        assert_eq!(listed_gpu_layout(gpu), expected, "GPU listed: {gpu:#}");
    }
}

/// Asserts that the backend's cluster and its node's real GPUs carry `layout`.
async fn assert_backend_layout(admin: &mut Clients, cluster_id: &str, layout: &[(&str, i64)]) {
    let expected = as_map(layout);
    let cluster = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: cluster_id.to_string(),
        })
        .await
        .expect("GetTenantCluster")
        .into_inner();
    let recorded: BTreeMap<String, i64> = cluster
        .mig_layout
        .iter()
        .map(|(k, v)| (k.clone(), i64::from(*v)))
        .collect();
    assert_eq!(recorded, expected, "the cluster's recorded layout");
    let nodes = admin
        .fleet
        .list_nodes(ListNodesRequest {
            cluster_id: cluster_id.to_string(),
            ..Default::default()
        })
        .await
        .expect("ListNodes")
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 1);
    for gpu in &nodes[0].gpus {
        assert!(gpu.mig_enabled, "GPU {} MIG mode", gpu.index);
        let mut counts = BTreeMap::new();
        for device in &gpu.mig_devices {
            *counts.entry(device.profile.clone()).or_insert(0i64) += 1;
        }
        assert_eq!(counts, expected, "GPU {} on the node", gpu.index);
    }
}

const MIXED: &[(&str, i64)] = &[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)];
const HALVES: &[(&str, i64)] = &[("4g.40gb", 1), ("3g.40gb", 1)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_layout_is_applied_and_visible_per_gpu() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config(MIXED));
    tf.init();
    tf.apply();

    assert_state_layout(&tf, MIXED);
    assert_listed_layout(&tf, MIXED);
    let cluster_id = str_of(&tf.resource(CLUSTER), "id");
    assert_backend_layout(&mut backend.admin().await, &cluster_id, MIXED).await;
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_layout_is_refused_at_plan_time_naming_the_rule() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config(&[("3g.40gb", 2), ("1g.10gb", 1)]));
    tf.init();
    let plan = tf.plan_fails();
    plan.assert_mentions(&["mig_layout", "memory slice"]);
    let apply = tf.apply_fails();
    apply.assert_mentions(&["mig_layout"]);
    assert!(backend.admin().await.inventory().await.is_empty());

    // Compute slices: 4g + 2 x 2g uses 8 memory slices but 8 compute slices.
    tf.write_main(&config(&[("4g.40gb", 1), ("2g.20gb", 2)]));
    tf.plan_fails()
        .assert_mentions(&["mig_layout", "compute slice"]);

    // A profile the model does not have.
    tf.write_main(&config(&[("3g.71gb", 1)]));
    tf.plan_fails().assert_mentions(&["mig_layout", "3g.71gb"]);
    assert!(backend.admin().await.inventory().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_change_repartitions_in_place() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config(MIXED));
    tf.init();
    tf.apply();
    let cluster_id = str_of(&tf.resource(CLUSTER), "id");

    tf.write_main(&config(HALVES));
    let (changes, text) = tf.plan_changes();
    let change = changes.iter().find(|c| c.address == CLUSTER).unwrap();
    assert_eq!(change.actions, vec!["update"], "{text}");
    text.assert_mentions(&["updated in-place", "mig_layout"]);
    // MIXED's 2g and 1g slices are gone from HALVES: jobs asking for them would wait
    // for ever, so the plan warns, naming them and how a Slurm job asks for one.
    text.assert_mentions(&[
        "Warning: mig_layout: the new layout removes profiles \"1g.10gb\", \"2g.20gb\"; work asking for them will stay pending",
        "--gres=gpu:1g.10gb:1",
    ]);
    tf.apply();

    assert_eq!(str_of(&tf.resource(CLUSTER), "id"), cluster_id);
    assert_state_layout(&tf, HALVES);
    assert_listed_layout(&tf, HALVES);
    assert_backend_layout(&mut backend.admin().await, &cluster_id, HALVES).await;
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mid_change_rolls_back_and_next_apply_converges() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config(MIXED));
    tf.init();
    tf.apply();
    let cluster_id = str_of(&tf.resource(CLUSTER), "id");
    let mut admin = backend.admin().await;

    // The simulated hardware fails the second instance it creates.
    backend.write_sim_faults("fail_create_after = 1\n");
    tf.write_main(&config(HALVES));
    tf.apply_fails();

    assert_state_layout(&tf, MIXED);
    assert_backend_layout(&mut admin, &cluster_id, MIXED).await;

    backend.clear_sim_faults();
    tf.apply();
    assert_state_layout(&tf, HALVES);
    assert_listed_layout(&tf, HALVES);
    assert_backend_layout(&mut admin, &cluster_id, HALVES).await;
    tf.assert_no_changes();
}

/// A fleet with L40S nodes (no MIG) besides the A100s.
const L40S_FLEET: &str = r#"
[[pool]]
gpu_type = "A100-80GB"
nodes = 1

[[pool]]
gpu_type = "L40S"
nodes = 2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_layout_on_a_model_without_mig_is_refused_at_plan_time() {
    let backend = Backend::start_with_fleet(L40S_FLEET);
    let tf = Terraform::new(&backend, backend.admin_token());
    let l40s_cluster = |layout: Option<&str>| {
        let cluster = hcl::pool_cluster("render", "gpufleet_tenant.t.id", "render", "L40S", 1)
            .depends_on(&["gpufleet_gpu_quota.l40s"]);
        let cluster = match layout {
            Some(layout) => cluster.expr("mig_layout", layout),
            None => cluster,
        };
        hcl::config(&[
            hcl::tenant("t", "render"),
            hcl::quota("l40s", "gpufleet_tenant.t.id", "L40S", 8),
            cluster,
        ])
    };
    tf.write_main(&l40s_cluster(Some(&hcl_layout(&[("1g.10gb", 1)]))));
    tf.init();
    let expected =
        "mig_layout: L40S does not support MIG; leave mig_layout unset to use whole GPUs";
    tf.plan_fails().assert_mentions(&[expected]);
    tf.apply_fails().assert_mentions(&[expected]);
    assert!(backend.admin().await.inventory().await.is_empty());

    // Whole L40S GPUs are fine, and the node shows them without MIG.
    tf.write_main(&l40s_cluster(None));
    tf.apply();
    let cluster = tf.resource("gpufleet_tenant_cluster.render");
    let nodes = array_of(&cluster, "nodes");
    assert_eq!(nodes.len(), 1);
    let gpus = array_of(&nodes[0], "gpus");
    assert_eq!(gpus.len(), 8, "{cluster:#}");
    assert!(instances(&nodes[0]).is_empty(), "whole GPUs: {cluster:#}");
    tf.assert_no_changes();
}

/// Four A100 nodes of eight GPUs each.
const FOUR_NODES_OF_EIGHT: &str = r#"
[[pool]]
gpu_type = "A100-80GB"
nodes = 4
gpus_per_node = 8
"#;

/// The most lines `terraform plan` may print for a MIG change of 4 nodes x 8 GPUs.
const MAX_PLAN_LINES: usize = 150;
/// What the same plan printed while the cluster's nodes listed every GPU's MIG devices
/// (measured with this test on the provider before the change).
const LINES_BEFORE: usize = 1324;

/// A MIG change on 4 nodes of 8 GPUs plans what happens per node, in a size that does
/// not grow with the GPUs: the plan's text stays within [`MAX_PLAN_LINES`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_change_on_four_nodes_of_eight_gpus_plans_in_few_lines() {
    let backend = Backend::start_with_fleet(FOUR_NODES_OF_EIGHT);
    let tf = Terraform::new(&backend, backend.admin_token());
    let four = |layout: &[(&str, i64)]| {
        config(layout)
            .replace("gpus     = 8", "gpus     = 32")
            .replace("node_count   = 1", "node_count   = 4")
    };
    tf.write_main(&four(MIXED));
    tf.init();
    tf.apply();

    tf.write_main(&four(HALVES));
    let plan = tf.run_ok(&["plan", "-no-color", "-input=false"]);
    let lines = plan.stdout.lines().count();
    println!(
        "plan of a MIG change on 4 nodes x 8 GPUs: {lines} lines (before per-node planning: {LINES_BEFORE})\n{}",
        plan.stdout
    );
    // Per node, what it will hold: 8 of each profile of the new layout.
    plan.assert_mentions(&["updated in-place", "mig_layout", "+ \"4g.40gb\" = 8"]);
    assert!(
        lines <= MAX_PLAN_LINES,
        "the plan has {lines} lines (at most {MAX_PLAN_LINES})\n{plan}"
    );

    // The apply gives what was planned (Terraform checks every known value), and then
    // there is nothing left to change.
    tf.apply();
    let cluster = tf.resource(CLUSTER);
    let nodes = array_of(&cluster, "nodes");
    assert_eq!(nodes.len(), 4);
    let on_eight: BTreeMap<String, i64> = as_map(HALVES)
        .into_iter()
        .map(|(p, c)| (p, c * 8))
        .collect();
    for node in nodes {
        assert_eq!(instances(node), on_eight, "{node:#}");
    }
    tf.assert_no_changes();
}
