//! Clusters drawing from a reservation: a cluster asking for more nodes than the
//! reservation has left is refused at plan time with the numbers.

use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::json::str_of;
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{Backend, Terraform};

const TENANT: &str = "gpufleet_tenant.t.id";
const RESERVATION: &str = "gpufleet_reservation.r";

/// A cluster of `node_count` H100 nodes drawing from the reservation.
fn reserved_cluster(label: &str, node_count: i64) -> Block {
    hcl::pool_cluster(label, TENANT, label, "H100-80GB", node_count)
        .expr("reservation_id", "gpufleet_reservation.r.id")
}

/// A tenant with 32 H100 GPUs of quota and an active 2-node reservation, plus `clusters`.
fn config(start: &str, end: &str, clusters: &[Block]) -> String {
    let mut blocks = vec![
        hcl::tenant("t", "team"),
        hcl::quota("q", TENANT, "H100-80GB", 32),
        hcl::reservation("r", TENANT, "H100-80GB", 2, start, end)
            .depends_on(&["gpufleet_gpu_quota.q"]),
    ];
    blocks.extend_from_slice(clusters);
    hcl::config(&blocks)
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
