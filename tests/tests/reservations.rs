//! Reservations through Terraform: allow_on_demand changes in place (taking on-demand
//! nodes when the pool is short, giving them back when it is not), and a cluster asking for
//! more nodes than its reservation has left is refused at plan time with the numbers.

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::json::{i64_of, str_of};
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::DeleteTenantClusterRequest;

const TENANT: &str = "gpufleet_tenant.t.id";
const RESERVATION: &str = "gpufleet_reservation.r";

/// A cluster of `node_count` H100 nodes drawing from the reservation.
fn reserved_cluster(label: &str, node_count: i64) -> Block {
    hcl::pool_cluster(label, TENANT, label, "H100-80GB", node_count)
        .expr("reservation_id", "gpufleet_reservation.r.id")
}

/// An H100 reservation of `node_count` nodes over `[start, end)`.
fn h100_reservation(start: &str, end: &str, node_count: i64, allow_on_demand: bool) -> Block {
    hcl::reservation("r", TENANT, "H100-80GB", node_count, start, end)
        .boolean("allow_on_demand", allow_on_demand)
        .depends_on(&["gpufleet_gpu_quota.q"])
}

/// A tenant with 32 H100 GPUs of quota (16 guaranteed, 16 burst: another tenant may be
/// guaranteed the rest of the 32-GPU pool), `reservation`, and `clusters`.
fn with_tenant(reservation: Block, clusters: &[Block]) -> String {
    let mut blocks = vec![
        hcl::tenant("t", "team"),
        hcl::quota("q", TENANT, "H100-80GB", 16).number("burst_gpus", 16),
        reservation,
    ];
    blocks.extend_from_slice(clusters);
    hcl::config(&blocks)
}

/// An active 2-node reservation (pool only) and `clusters`.
fn config(start: &str, end: &str, clusters: &[Block]) -> String {
    with_tenant(h100_reservation(start, end, 2, false), clusters)
}

/// (pool_nodes, on_demand_nodes) of the reservation in state.
fn split(tf: &Terraform) -> (i64, i64) {
    let r = tf.resource(RESERVATION);
    (i64_of(&r, "pool_nodes"), i64_of(&r, "on_demand_nodes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_on_demand_changes_in_place() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    // Another tenant holds 2 of the 4 H100 pool nodes: 2 stay free, plus 4 on demand.
    let (rival, _) = create_tenant(&mut admin, "rival").await;
    create_quota(&mut admin, &rival.id, "H100-80GB", 16, 0).await;
    let blocker = create_pool_cluster(&mut admin, &rival.id, "blocker", "H100-80GB", 2).await;

    let tf = Terraform::new(&backend, backend.admin_token());
    let (start, end) = (rfc3339_in_hours(-1), rfc3339_in_hours(24));
    let reservation = |nodes, allow| with_tenant(h100_reservation(&start, &end, nodes, allow), &[]);
    tf.write_main(&reservation(2, false));
    tf.init();
    tf.apply();
    let id = str_of(&tf.resource(RESERVATION), "id");
    assert_eq!(split(&tf), (2, 0));

    // Allowing on-demand capacity keeps the allocation: an in-place update, same id.
    tf.write_main(&reservation(2, true));
    let (changes, text) = tf.plan_changes();
    let change = changes.iter().find(|c| c.address == RESERVATION).unwrap();
    assert_eq!(change.actions, vec!["update"], "{text}");
    text.assert_mentions(&["updated in-place", "allow_on_demand", "false -> true"]);
    tf.apply();
    assert_eq!(str_of(&tf.resource(RESERVATION), "id"), id);
    assert_eq!(split(&tf), (2, 0));
    tf.assert_no_changes();

    // With it allowed, a third node comes from on-demand capacity.
    tf.write_main(&reservation(3, true));
    tf.apply();
    assert_eq!(split(&tf), (2, 1));
    tf.assert_no_changes();

    // Turning it off while the pool cannot take the on-demand node: refused at plan time.
    tf.write_main(&reservation(3, false));
    tf.plan_fails().assert_mentions(&[
        "allow_on_demand: the pool has 0 free H100-80GB nodes from ",
        "the reservation holds 1 on-demand nodes; keep allow_on_demand or shrink node_count to 2",
    ]);
    assert_eq!(split(&tf), (2, 1));

    // Once the pool has room, turning it off moves the node back to the pool, in place.
    admin
        .clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest { id: blocker.id })
        .await
        .expect("DeleteTenantCluster blocker");
    assert_eq!(tf.planned_actions(RESERVATION), vec!["update"]);
    tf.apply();
    assert_eq!(str_of(&tf.resource(RESERVATION), "id"), id);
    assert_eq!(split(&tf), (3, 0));
    assert_eq!(tf.resource(RESERVATION)["allow_on_demand"], false);
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_larger_than_what_its_reservation_has_left_is_refused_at_plan_time() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let (start, end) = (rfc3339_in_hours(-1), rfc3339_in_hours(24));
    tf.write_main(&config(&start, &end, &[reserved_cluster("a", 1)]));
    tf.init();
    tf.apply();
    let reservation_id = str_of(&tf.resource(RESERVATION), "id");
    let before = backend.admin().await.inventory().await;

    // A second cluster wanting 2 nodes where cluster a holds 1 of the 2.
    tf.write_main(&config(
        &start,
        &end,
        &[reserved_cluster("a", 1), reserved_cluster("b", 2)],
    ));
    let expected = format!(
        "node_count: needs 2 nodes from reservation {reservation_id}, which has 2 nodes of which other clusters hold 1 (1 left)"
    );
    tf.plan_fails().assert_mentions(&[&expected]);
    tf.apply_fails().assert_mentions(&[&expected]);
    assert_eq!(backend.admin().await.inventory().await, before);

    // Scaling cluster a past the whole reservation: its own node does not count as taken.
    tf.write_main(&config(&start, &end, &[reserved_cluster("a", 3)]));
    let expected = format!(
        "node_count: needs 3 nodes from reservation {reservation_id}, which has 2 nodes of which other clusters hold 0 (2 left)"
    );
    tf.plan_fails().assert_mentions(&[&expected]);
    assert_eq!(backend.admin().await.inventory().await, before);

    // What fits is planned and applied: cluster b with the 1 node left.
    tf.write_main(&config(
        &start,
        &end,
        &[reserved_cluster("a", 1), reserved_cluster("b", 1)],
    ));
    tf.apply();
    tf.assert_no_changes();
    assert_eq!(backend.admin().await.inventory().await.clusters.len(), 2);
}

/// A tenant with room in its quota for 8 H100 nodes (the pool has 4: 32 GPUs guaranteed,
/// 32 burst), and `reservations`.
fn roomy_tenant(reservations: &[Block]) -> String {
    let mut blocks = vec![
        hcl::tenant("t", "team"),
        hcl::quota("q", TENANT, "H100-80GB", 32).number("burst_gpus", 32),
    ];
    blocks.extend_from_slice(reservations);
    hcl::config(&blocks)
}

/// A pool-only H100 reservation `label` of `node_count` nodes over `[start, end)`.
fn sibling(label: &str, node_count: i64, start: &str, end: &str) -> Block {
    hcl::reservation(label, TENANT, "H100-80GB", node_count, start, end)
        .depends_on(&["gpufleet_gpu_quota.q"])
}

/// Two reservations of one plan that each fit the 4-node pool alone but not together:
/// the plan is refused, the refusal on one naming the other (nothing is half-applied);
/// two that fit together pass. And a configuration whose reservation no longer fits (an
/// apply that created only its sibling) still destroys: a destroy runs no create's dry run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_of_one_plan_are_admitted_together() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let (start, end) = (rfc3339_in_hours(1), rfc3339_in_hours(24));
    tf.write_main(&roomy_tenant(&[]));
    tf.init();
    tf.apply();
    let before = backend.admin().await.inventory().await;

    let both = roomy_tenant(&[sibling("a", 3, &start, &end), sibling("b", 3, &start, &end)]);
    tf.write_main(&both);
    let needles = [
        "node_count:",
        "with the reservation(s) this plan creates beside it (3 H100-80GB node(s) for tenant 'team' from ",
        "they do not all fit",
        "with gpufleet_reservation.",
    ];
    let plan = tf.plan_fails();
    plan.assert_mentions(&needles);
    assert_eq!(
        plan.output().matches("they do not all fit").count(),
        1,
        "one of the two is refused, naming the other\n{plan}"
    );
    tf.apply_fails().assert_mentions(&needles);
    assert_eq!(backend.admin().await.inventory().await, before);

    // Two that fit together (2 + 2 of 4) plan and apply.
    tf.write_main(&roomy_tenant(&[
        sibling("a", 2, &start, &end),
        sibling("b", 2, &start, &end),
    ]));
    tf.apply();
    tf.assert_no_changes();
    assert_eq!(
        backend.admin().await.inventory().await.reservations.len(),
        2
    );

    // State holds a and b, which fill the pool; a third, c, cannot be created: a plan
    // refuses it, yet destroy (whose refresh plans c's create) is not refused.
    tf.write_main(&roomy_tenant(&[
        sibling("a", 2, &start, &end),
        sibling("b", 2, &start, &end),
        sibling("c", 1, &start, &end),
    ]));
    tf.plan_fails()
        .assert_mentions(&["node_count:", "with gpufleet_reservation.c"]);
    tf.destroy();
    let after = backend.admin().await.inventory().await;
    assert!(
        after.reservations.is_empty() && after.tenants.is_empty(),
        "{after:?}"
    );
}
