//! A pipeline's Terraform against three control-plane replicas on one PostgreSQL (issue
//! 41), its `endpoints` listing them all with a replica that does not lead first: that
//! one passes every call on to the leader. The leader is killed (`kill -9`) while the
//! apply's cluster create is under way: the provider sends the create again, with its
//! request id, round the endpoints until a replica has taken the lease over and settled
//! what the dead one left; the apply completes, the plan after it is empty (also once
//! the killed replica is back, following), and `gpufleet-agent check` finds the store
//! sound.

use std::time::Duration;

use gpufleet_e2e::checker::Store;
use gpufleet_e2e::replicas::{wait_for_create_under_way, Replicas};
use gpufleet_e2e::{hcl, Terraform};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn an_apply_outlives_the_leaders_kill_9_and_the_plan_after_is_empty() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut plane = Replicas::start(3, "3s", &[]);
    // Each node operation of the simulated hardware takes a while, so that the create
    // is still under way when the leader is killed.
    for n in 0..3 {
        plane.start_node(
            &format!("gpu-{n}"),
            &["--gpus", "8", "--sim-op-delay-ms", "300"],
        );
    }
    runtime.block_on(plane.wait_ready(1, 3));
    let r = &plane.replicas;
    let endpoints = format!(
        "{},{},{}",
        r[1].endpoint(),
        r[2].endpoint(),
        r[0].endpoint()
    );
    let tf = Terraform::detached(&endpoints, r[0].admin_token());
    tf.write_main(&hcl::config(&[
        hcl::tenant("t", "speech"),
        hcl::quota("q", "gpufleet_tenant.t.id", "H100-80GB", 24),
        hcl::pool_cluster("c", "gpufleet_tenant.t.id", "train", "H100-80GB", 2)
            .expr("depends_on", "[gpufleet_gpu_quota.q]"),
    ]));
    tf.init();

    let mut admin = runtime.block_on(plane.replicas[1].admin());
    std::thread::scope(|s| {
        let apply = s.spawn(|| tf.apply());
        // The create is under way on the leader (r0, the first to start).
        wait_for_create_under_way(
            &runtime,
            &mut admin,
            "train",
            LIMIT,
            || !apply.is_finished(),
            || plane.logs(),
        );
        plane.replicas[0].crash();
        apply.join().expect("the apply's thread");
    });
    let cluster = tf.resource("gpufleet_tenant_cluster.c");
    assert_eq!(cluster["status"], "running", "{cluster}");
    assert_eq!(cluster["node_count"], 2, "{cluster}");
    tf.assert_no_changes();
    let logs = plane.logs();
    assert!(
        logs.contains("took the lease over: settled the former leader's interrupted changes"),
        "{logs}"
    );

    // The killed replica comes back and follows; the plan through it is empty too.
    plane.replicas[0].start_again();
    tf.write_file(
        "endpoints.tf",
        &format!(
            "provider \"gpufleet\" {{\n  endpoints = [\"{}\"]\n}}\n",
            plane.replicas[0].endpoint()
        ),
    );
    tf.assert_no_changes();
    let log = plane.replicas[0].log();
    let restarted = &log[log.rfind("serving the store on PostgreSQL").unwrap_or(0)..];
    assert!(
        restarted.contains("another replica leads: start-up recovery is left to it")
            && !restarted.contains("this replica leads"),
        "r0 came back as a follower\n{restarted}"
    );

    let (passed, output) = Store::Postgres(plane.database_file().to_path_buf()).check(None);
    assert!(passed, "{output}");
}
