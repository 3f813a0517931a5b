//! An apply that fails part-way: what was created stays in state, what failed is absent,
//! the backend holds exactly what state says, and the next apply converges once the cause
//! is gone.

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::hcl;
use gpufleet_e2e::json::str_of;
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::DeleteTenantClusterRequest;

const FIRST: &str = "gpufleet_tenant_cluster.first";
const SECOND: &str = "gpufleet_tenant_cluster.second";

/// Two 1-node A100 clusters of one tenant, `second` created after `first`.
fn two_clusters(tenant_id: &str) -> String {
    let tenant = hcl::id(tenant_id);
    hcl::config(&[
        hcl::pool_cluster("first", &tenant, "first", "A100-80GB", 1),
        hcl::pool_cluster("second", &tenant, "second", "A100-80GB", 1).depends_on(&[FIRST]),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_taken_between_plan_and_apply_leaves_state_truthful_and_converges() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (team, _) = create_tenant(&mut admin, "team").await;
    let (rival, _) = create_tenant(&mut admin, "rival").await;
    create_quota(&mut admin, &team.id, "A100-80GB", 16, 0).await;
    // The pool's 16 A100 GPUs are guaranteed to the team; the rival bursts.
    create_quota(&mut admin, &rival.id, "A100-80GB", 0, 8).await;

    // The plan is made while both A100 pool nodes are free, so it passes every check.
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&two_clusters(&team.id));
    tf.init();
    tf.save_plan("tfplan")
        .assert_mentions(&["2 to add", "0 to change"]);

    // Another tenant takes one of the two A100 nodes before the plan is applied.
    let blocker = create_pool_cluster(&mut admin, &rival.id, "blocker", "A100-80GB", 1).await;
    let apply = tf.apply_saved_fails("tfplan");
    // Terraform re-plans each resource during apply: whether the provider's plan-time pool
    // check or the backend's create refuses `second` depends on ordering; both say this.
    apply.assert_mentions(&[
        "node_count: needs 1 ",
        "A100-80GB",
        "pool has 0 free",
        SECOND,
    ]);
    assert_eq!(
        apply.output().matches("Error:").count(),
        1,
        "only the second cluster fails\n{apply}"
    );

    // State: the first cluster, not the second. Backend: the same, plus the blocker.
    assert_eq!(tf.state_list(), vec![FIRST.to_string()], "{apply}");
    let first_id = str_of(&tf.resource(FIRST), "id");
    let clusters = admin.inventory().await.clusters;
    let mut held: Vec<(String, String)> = clusters
        .iter()
        .map(|c| (c.tenant_id.clone(), c.name.clone()))
        .collect();
    held.sort();
    let mut expected = vec![
        (team.id.clone(), "first".to_string()),
        (rival.id.clone(), "blocker".to_string()),
    ];
    expected.sort();
    assert_eq!(held, expected, "no half-made second cluster: {clusters:#?}");
    let a100_nodes = admin
        .nodes()
        .await
        .into_iter()
        .filter(|n| n.gpu_type == "A100-80GB")
        .collect::<Vec<_>>();
    let mut owners: Vec<&str> = a100_nodes.iter().map(|n| n.cluster_id.as_str()).collect();
    owners.sort();
    let mut expected_owners = vec![first_id.as_str(), blocker.id.as_str()];
    expected_owners.sort();
    assert_eq!(owners, expected_owners, "each A100 node held once");

    // Once the blocker is gone the plan wants the second cluster alone, and applying it
    // converges.
    admin
        .clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest {
            id: blocker.id.clone(),
        })
        .await
        .expect("DeleteTenantCluster blocker");
    assert_eq!(tf.planned_actions(SECOND), vec!["create"]);
    assert_eq!(tf.planned_actions(FIRST), vec!["no-op"]);
    tf.apply();
    assert_eq!(tf.state_list(), vec![FIRST.to_string(), SECOND.to_string()]);
    assert_eq!(str_of(&tf.resource(FIRST), "id"), first_id, "first kept");
    tf.assert_no_changes();
    let names: Vec<String> = admin
        .inventory()
        .await
        .clusters
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"first".into()) && names.contains(&"second".into()));
}
