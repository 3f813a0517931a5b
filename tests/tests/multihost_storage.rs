//! Team volumes on the multi-host tier: the shared storage (a loop-mounted btrfs standing
//! for the file system every host mounts) is mounted before the hosts are made, so each
//! namespace host sees it at the same path; the control plane (`serve --shared-storage`)
//! makes a quota'd volume per cluster, and each node agent (`node --shared-storage`)
//! bind-mounts its cluster's volume at `storage_path` in its own host's mount namespace.
//!
//! Through Terraform on the client host: two teams, team A's cluster on two hosts and
//! team B's on a third. A file written on one of A's hosts is read on the other; A's
//! volume is not there on B's host, nor B's on A's; A writing past 1 GiB fails with
//! "Disk quota exceeded" while B still writes; a host that leaves A's cluster (scale-down)
//! no longer has the mount; when the host of A's last node is cut off, the free host that
//! replaces it mounts A's volume with its data, and the cut host, healed, comes back free
//! and unmounts it (before that, the same with a node an operator drains: the replacement
//! mounts the volume and the drained node unmounts it); after destroy no host has any volume mount and nothing is left on the
//! shared storage.
//!
//! Needs root, loop devices and btrfs-progs (CI runs as root after scripts/bootstrap.sh).

use std::time::Duration;

use gpufleet_e2e::grpc::Clients;
use gpufleet_e2e::hcl;
use gpufleet_e2e::json::str_of;
use gpufleet_e2e::multihost::Fleet;
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::shared_storage::SharedStorage;
use gpufleet_e2e::{eventually, Terraform};
use gpufleet_proto::v1::{DrainNodeRequest, GetTenantClusterRequest, ReturnNodeRequest};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const A: &str = "gpufleet_tenant_cluster.a";
const B: &str = "gpufleet_tenant_cluster.b";
const MOUNTS: &str = "/run/gpufleet/volumes";

fn config(a_nodes: Option<i64>) -> String {
    let mut blocks = vec![
        hcl::tenant("ta", "team-a"),
        hcl::tenant("tb", "team-b"),
        hcl::quota("qa", "gpufleet_tenant.ta.id", "H100-80GB", 4),
        hcl::quota("qb", "gpufleet_tenant.tb.id", "H100-80GB", 2),
        hcl::pool_cluster("b", "gpufleet_tenant.tb.id", "data", "H100-80GB", 1)
            .number("storage_gib", 1)
            .depends_on(&["gpufleet_gpu_quota.qb"]),
    ];
    if let Some(n) = a_nodes {
        blocks.push(
            hcl::pool_cluster("a", "gpufleet_tenant.ta.id", "data", "H100-80GB", n)
                .number("storage_gib", 1)
                .depends_on(&["gpufleet_gpu_quota.qa", B]),
        );
    }
    hcl::config(&blocks)
}

/// `sh -c script` on `host`: its stdout, or Err with its stderr.
fn sh(host: &Host, script: &str) -> Result<String, String> {
    let out = host.run("sh", &["-c", script]);
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The volume mounts in `host`'s own mount namespace.
fn volume_mounts(host: &Host) -> Vec<String> {
    let info = sh(host, "cat /proc/self/mountinfo").unwrap();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Under it: the root itself is a mount of its own (see `gpufleet_slurm::sandbox`).
        .filter(|p| p.starts_with(&format!("{MOUNTS}/")))
        .map(str::to_string)
        .collect()
}

fn hosts_of(tf: &Terraform, address: &str) -> Vec<String> {
    let c = tf.resource(address);
    c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| str_of(n, "hostname"))
        .collect()
}

/// Waits until cluster `id` runs on one node other than `gone`: that node's hostname.
async fn replaced(admin: &Clients, id: &str, gone: &str) -> String {
    eventually(&format!("{gone} replaced"), LIMIT, || {
        let (mut admin, id, gone) = (admin.clone(), id.to_string(), gone.to_string());
        async move {
            let c = admin
                .clusters
                .get_tenant_cluster(GetTenantClusterRequest { id })
                .await
                .ok()?
                .into_inner();
            let hosts: Vec<String> = c.nodes.iter().map(|n| n.hostname.clone()).collect();
            (c.status == "running" && hosts.len() == 1 && hosts[0] != gone)
                .then(|| hosts[0].clone())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_mounts_its_clusters_volume_in_its_own_namespace_and_only_while_it_is_in_the_cluster(
) {
    netns::require("the multi-host storage tests");
    // Mounted before the hosts are made: each copies it into its own mount namespace.
    let storage = SharedStorage::new(8);
    let shared = storage.arg();
    // A silent node is unreachable after 2s and replaced 1s later; agents ping every second.
    let fleet = Fleet::start(
        &["g1", "g2", "g3"],
        &[
            "--shared-storage",
            &shared,
            "--node-timeout",
            "2s",
            "--replace-after",
            "1s",
        ],
        &[
            "--gpus",
            "2",
            "--shared-storage",
            &shared,
            "--keepalive",
            "1s",
        ],
        LIMIT,
    )
    .await;
    let host = |name: &str| fleet.net.host(name);
    let tf = Terraform::on_host(host("client"), &fleet.backend, fleet.backend.admin_token());
    tf.write_main(&config(Some(2)));
    tf.init();
    tf.apply();
    let (path_a, path_b) = (
        str_of(&tf.resource(A), "storage_path"),
        str_of(&tf.resource(B), "storage_path"),
    );
    assert!(path_a.starts_with(MOUNTS), "{path_a}");
    let (a_hosts, b_hosts) = (hosts_of(&tf, A), hosts_of(&tf, B));
    assert_eq!((a_hosts.len(), b_hosts.len()), (2, 1));
    let (a1, a2, b1) = (host(&a_hosts[0]), host(&a_hosts[1]), host(&b_hosts[0]));

    // Each node has exactly its own cluster's volume, in its own namespace.
    assert_eq!(volume_mounts(a1), vec![path_a.clone()]);
    assert_eq!(volume_mounts(a2), vec![path_a.clone()]);
    assert_eq!(volume_mounts(b1), vec![path_b.clone()]);
    assert!(
        sh(b1, &format!("test -e {path_a}")).is_err(),
        "A's volume on B's host"
    );
    assert_eq!(volume_mounts(host("cp")), Vec::<String>::new());

    // Written on one node, read on the other.
    sh(a1, &format!("echo from-{} > {path_a}/hello", a_hosts[0])).unwrap();
    assert_eq!(
        sh(a2, &format!("cat {path_a}/hello")).unwrap().trim(),
        format!("from-{}", a_hosts[0])
    );

    // Exactly 1 GiB: A's writes past it fail, B's own still work.
    let past = sh(
        a1,
        &format!("dd if=/dev/zero of={path_a}/big bs=1M count=1200 conv=fsync"),
    )
    .expect_err("1.2 GiB do not fit in a 1 GiB volume");
    assert!(past.contains("Disk quota exceeded"), "{past}");
    sh(
        b1,
        &format!("dd if=/dev/zero of={path_b}/big bs=1M count=600 conv=fsync"),
    )
    .expect("team B still writes");

    // A node that leaves the cluster keeps nothing of its volume; the one that stays does.
    tf.write_main(&config(Some(1)));
    tf.apply();
    let stays = hosts_of(&tf, A);
    assert_eq!(stays.len(), 1);
    let left = a_hosts.iter().find(|h| **h != stays[0]).unwrap();
    assert_eq!(
        volume_mounts(host(left)),
        Vec::<String>::new(),
        "{left} left A"
    );
    assert_eq!(volume_mounts(host(&stays[0])), vec![path_a.clone()]);
    assert!(sh(host(&stays[0]), &format!("test -s {path_a}/hello")).is_ok());

    // An operator drains A's node (the replacement a failed check gets too): the free host
    // replaces it and mounts A's volume, with the data; the drained host keeps nothing of
    // it, and the operator returns it to the pool.
    let id = str_of(&tf.resource(A), "id");
    let admin = fleet.backend.admin().await;
    let drained = stays[0].clone();
    admin
        .fleet
        .clone()
        .drain_node(DrainNodeRequest {
            name: drained.clone(),
            reason: "fan replaced".into(),
        })
        .await
        .expect("the admin drains a node");
    let replacement = replaced(&admin, &id, &drained).await;
    assert_eq!(replacement, *left, "the free host replaces the drained one");
    assert_eq!(volume_mounts(host(left)), vec![path_a.clone()]);
    assert!(sh(host(left), &format!("test -s {path_a}/hello")).is_ok());
    assert_eq!(
        volume_mounts(host(&drained)),
        Vec::<String>::new(),
        "the drained host keeps A's volume"
    );
    admin
        .fleet
        .clone()
        .return_node(ReturnNodeRequest {
            name: drained.clone(),
        })
        .await
        .expect("the admin returns the drained node");

    // The host of A's node cut off: the returned host replaces it and mounts A's volume,
    // with the data; healed, the cut host's node comes back free and keeps nothing of it.
    let cut = host(left);
    cut.cut();
    let replacement = replaced(&admin, &id, left).await;
    assert_eq!(
        replacement, drained,
        "the returned host replaces the cut one"
    );
    assert_eq!(volume_mounts(host(&drained)), vec![path_a.clone()]);
    assert!(sh(host(&drained), &format!("test -s {path_a}/hello")).is_ok());
    cut.heal();
    eventually("the healed host unmounts A's volume", LIMIT, || {
        let mounts = volume_mounts(cut);
        async move { mounts.is_empty().then_some(()) }
    })
    .await;

    // Destroyed: no host has a volume mount, and nothing is left on the shared storage.
    tf.destroy();
    for h in ["g1", "g2", "g3"] {
        assert_eq!(volume_mounts(host(h)), Vec::<String>::new(), "{h}");
    }
    assert_eq!(storage.subvolumes(), Vec::<String>::new());
    assert_eq!(storage.quota_groups(), Vec::<String>::new());
    drop(fleet);
}
