//! The multi-host tier (issue 20): hosts apart, each its own network namespace (with its
//! own hostname and `/run`) and address on one bridge: a control-plane host, GPU hosts
//! running node agents, a client host running Terraform and the harness's own gRPC
//! clients. Nothing talks over 127.0.0.1 or through shared files.
//!
//! - The network itself: hosts reach each other only by address, the root namespace
//!   reaches none of them, a cut host is unreachable until healed, and everything is
//!   torn down even when the test panics (a volume loop-mounted on a host, as a node-local
//!   team volume is, included: its loop device detaches; and a dead run's namespaces are
//!   swept).
//! - A ring bandwidth test across hosts reports every pair; the host whose link `tc`
//!   shapes slower is the one blamed.
//! - A host cut off: unreachable, its cluster degraded, its node replaced on another
//!   host; healed: the old agent learns it left the cluster, its node ends free with
//!   whole GPUs, its host holds no tenant process or key, and `terraform plan` is empty.
//!
//! Needs root (CI runs as root); without it each test fails naming what is missing.

use std::collections::HashMap;
use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::multihost::Fleet;
use gpufleet_e2e::netns::{self, Network};
use gpufleet_e2e::{eventually, grpc, hcl, Backend, Clients, Terraform};
use gpufleet_proto::v1::health_service_client::HealthServiceClient;
use gpufleet_proto::v1::{
    CreateTenantClusterRequest, GetTenantClusterRequest, Node, RunHealthCheckRequest,
    TenantCluster, UpdateTenantClusterRequest,
};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);

async fn node(admin: &mut Clients, name: &str) -> Option<Node> {
    admin.nodes().await.into_iter().find(|n| n.hostname == name)
}

async fn ready_nodes(admin: &Clients, names: &[&str]) {
    eventually(&format!("nodes {names:?} ready"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let all = admin.nodes().await;
            names
                .iter()
                .all(|name| {
                    all.iter()
                        .any(|n| n.hostname == *name && n.state == "ready")
                })
                .then_some(())
        }
    })
    .await
}

async fn cluster(admin: &mut Clients, id: &str) -> TenantCluster {
    admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest { id: id.into() })
        .await
        .unwrap_or_else(|s| panic!("GetTenantCluster: {s}"))
        .into_inner()
}

async fn cluster_in(admin: &Clients, id: &str, status: &str) -> TenantCluster {
    eventually(&format!("cluster {id} {status}"), LIMIT, || {
        let (mut admin, id) = (admin.clone(), id.to_string());
        async move {
            let c = cluster(&mut admin, &id).await;
            (c.status == status).then_some(c)
        }
    })
    .await
}

fn hostnames(c: &TenantCluster) -> Vec<String> {
    c.nodes.iter().map(|n| n.hostname.clone()).collect()
}

/// Every file under `dir` whose content mentions `needle` (file names too).
fn files_mentioning(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_mentioning(&path, needle));
        } else if path.to_string_lossy().contains(needle)
            || std::fs::read(&path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
        {
            found.push(path.display().to_string());
        }
    }
    found
}

#[test]
fn hosts_reach_each_other_only_by_address_and_nothing_is_left_even_after_a_panic() {
    netns::require("the multi-host tests");
    // A dead run's namespace (its pid is gone) is swept by the next network.
    let dead_pid = (4_000_000..4_100_000u32)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid");
    // (This process's pid in it keeps parallel runs from making the same one.)
    let stale = format!("{}{dead_pid}-{}-x", netns::PREFIX, std::process::id());
    let added = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(added.success());

    let net = Network::new(&["a", "b"]);
    assert!(!netns::namespaces().contains(&stale), "stale {stale} swept");
    let (a, b) = (net.host("a"), net.host("b"));
    // Each host its own hostname and its own /run.
    for host in [a, b] {
        let out = host.run("hostname", &[]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), host.name());
    }
    let marker = format!("/run/gfmh-marker-{}", std::process::id());
    assert!(a.run("touch", &[&marker]).status.success());
    assert!(a.run("test", &["-e", &marker]).status.success());
    assert!(!b.run("test", &["-e", &marker]).status.success());
    assert!(
        !std::path::Path::new(&marker).exists(),
        "/run of this machine"
    );

    // b listens on its address; a reaches it there, this machine does not.
    let listener = b.launcher().listen((b.addr(), 0).into()).unwrap();
    let target = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || {
        for _ in 0..2 {
            let _ = listener.accept();
        }
    });
    a.launcher().connect(target).expect("a reaches b");
    let from_here = std::net::TcpStream::connect_timeout(&target, Duration::from_millis(300));
    assert!(from_here.is_err(), "this machine reached {target}");
    // b's address is not on a's loopback: a's 127.0.0.1 reaches nothing of b's.
    let loopback = a.launcher().connect_within(
        ([127, 0, 0, 1], target.port()).into(),
        Duration::from_secs(1),
    );
    assert!(loopback.is_err(), "a reached b's port on its own loopback");
    // The root namespace got no link or address of the network.
    let links = std::process::Command::new("ip")
        .args(["-br", "addr"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout).to_string();
    assert!(
        !links.contains(&a.addr().to_string()) && !links.contains("p-a"),
        "{links}"
    );

    // Cut off: b's port is unreachable from a, though b and its processes stay up.
    b.cut();
    let cut = a
        .launcher()
        .connect_within(target, Duration::from_millis(500));
    assert!(cut.is_err(), "a reached a cut host");
    assert!(b.pids().contains(&b.holder_pid()));
    b.heal();
    a.launcher()
        .connect(target)
        .expect("a reaches b once healed");
    accept.join().unwrap();
    drop(net);

    // A test that panics with its hosts up, a process running on one and a volume
    // loop-mounted there (as a node-local team volume is) leaves nothing.
    let mut left = (Vec::new(), Vec::new(), String::new());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let net = Network::new(&["x", "y"]);
        let child = net.host("x").spawn("sleep", &["1000"]);
        let image = net.host("x").dir().join("volume.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .unwrap();
        let image = image.display().to_string();
        let made = net.host("x").run("mkfs.ext4", &["-q", "-F", &image]);
        assert!(made.status.success(), "{made:?}");
        let mounted = net.host("x").run(
            "sh",
            &[
                "-c",
                &format!("mkdir -p /run/vol && mount -o loop {image} /run/vol"),
            ],
        );
        assert!(mounted.status.success(), "{mounted:?}");
        left = (
            net.namespaces(),
            vec![child.id(), net.host("y").holder_pid()],
            image,
        );
        std::mem::forget(child);
        panic!("the test body fails");
    }));
    assert!(outcome.is_err());
    let (namespaces, pids, image) = left;
    // The mount went with x's mount namespace, and its loop device with the mount.
    gpufleet_e2e::node_agent::wait_for("the volume's loop device detached", LIMIT, || {
        let loops = std::process::Command::new("losetup")
            .args(["-l", "-n", "-O", "BACK-FILE"])
            .output()
            .unwrap();
        (!String::from_utf8_lossy(&loops.stdout).contains(&image)).then_some(())
    });
    assert_eq!(namespaces.len(), 3, "{namespaces:?}");
    let now = netns::namespaces();
    assert!(namespaces.iter().all(|ns| !now.contains(ns)), "{now:?}");
    for pid in pids {
        // Gone, or a zombie whose parent (this process) has not reaped it.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "pid {pid} still runs: {stat}"
        );
    }
}

type Health = HealthServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, grpc::BearerAuth>,
>;

async fn health_client(backend: &Backend) -> Health {
    let from = backend.dial_from().expect("a multi-host backend");
    let channel = grpc::channel_from(from, &backend.endpoint()).await;
    HealthServiceClient::with_interceptor(channel, grpc::bearer_auth(backend.admin_token()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_bandwidth_test_across_hosts_blames_the_host_whose_link_is_shaped() {
    netns::require("the multi-host tests");
    // No spare host: the report keeps the ring's own results (a replacement's checks
    // would take the place of its neighbours').
    let gpu_hosts = ["g1", "g2", "g3"];
    let Fleet {
        net,
        backend,
        agents: _agents,
    } = Fleet::start(
        &gpu_hosts,
        &["--node-timeout", "10s", "--replace-after", "1h"],
        &["--gpus", "1"],
        LIMIT,
    )
    .await;
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "ring").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 3, 0).await;
    let created = create_pool_cluster(&mut admin, &tenant.id, "ring", "H100-80GB", 3).await;
    let running = cluster_in(&admin, &created.id, "running").await;
    let held = hostnames(&running);
    // Judged from now on: 0.2 Gbit/s of bus bandwidth in a 3-node ring is 0.15 Gbit/s a
    // pair, far below what a veth pair moves and far above the shaped link's 20 Mbit/s.
    admin
        .clusters
        .update_tenant_cluster(UpdateTenantClusterRequest {
            id: created.id.clone(),
            set_acceptance: true,
            acceptance_level: "quick".into(),
            min_bus_bandwidth_gbps: 0.2,
            run_acceptance_on_create: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("UpdateTenantCluster: {s}"));
    let slow = held[1].clone();
    net.host(&slow).shape("20mbit");

    let report = health_client(&backend)
        .await
        .run_health_check(RunHealthCheckRequest {
            cluster_id: created.id.clone(),
            level: "quick".into(),
            bandwidth_duration_ms: 500,
        })
        .await
        .unwrap_or_else(|s| panic!("RunHealthCheck: {s}"))
        .into_inner();
    // One bandwidth result per node of the ring: to its peer, in Gbit/s.
    let mut pairs: HashMap<(String, String), (f64, String)> = HashMap::new();
    for n in &report.nodes {
        for c in n.checks.iter().filter(|c| c.name == "bandwidth") {
            pairs.insert(
                (n.node.clone(), c.peer.clone()),
                (c.gbps, c.verdict.clone()),
            );
        }
    }
    assert_eq!(pairs.len(), 3, "a result per pair of the ring: {pairs:?}");
    for ((from, to), (gbps, verdict)) in &pairs {
        assert!(held.contains(from) && held.contains(to), "{from}->{to}");
        let touches_slow = *from == slow || *to == slow;
        if touches_slow {
            assert!(
                *gbps < 0.15,
                "{from}->{to} {gbps} Gbit/s through the shaped link"
            );
        } else {
            assert!(*gbps >= 0.15, "{from}->{to} only {gbps} Gbit/s");
            assert_eq!(verdict, "pass", "{from}->{to}");
        }
        // Only the shaped host fails; its neighbours' reports of it are warnings.
        let expected = if *from == slow {
            "fail"
        } else if touches_slow {
            "warn"
        } else {
            "pass"
        };
        assert_eq!(verdict, expected, "{from}->{to} {gbps} Gbit/s: {report:#?}");
    }
    // The shaped host is blamed: quarantined with the check in its reason; with no host
    // to replace it, the cluster goes on degraded without it.
    let blamed = node(&mut admin, &slow).await.unwrap();
    assert_eq!(blamed.state, "quarantined", "{}", blamed.state_reason);
    assert!(
        blamed.state_reason.contains("bandwidth"),
        "{}",
        blamed.state_reason
    );
    for other in held.iter().filter(|h| **h != slow) {
        let n = node(&mut admin, other).await.unwrap();
        assert_ne!(n.state, "quarantined", "{other}: {}", n.state_reason);
    }
    let after = cluster_in(&admin, &created.id, "degraded").await;
    let now = hostnames(&after);
    assert!(!now.contains(&slow) && now.len() == 2, "{now:?}");
}

const CLUSTER: &str = "gpufleet_tenant_cluster.train";

fn mig_cluster_config() -> String {
    hcl::config(&[
        hcl::tenant("t", "speech"),
        hcl::quota("h100", "gpufleet_tenant.t.id", "H100-80GB", 0).number("burst_gpus", 8),
        hcl::pool_cluster("train", "gpufleet_tenant.t.id", "train", "H100-80GB", 2)
            .expr("mig_layout", "{ \"3g.40gb\" = 2 }")
            .depends_on(&["gpufleet_gpu_quota.h100"]),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_host_is_replaced_and_once_healed_holds_nothing_of_the_cluster() {
    netns::require("the multi-host tests");
    let gpu_hosts = ["g1", "g2", "g3"];
    // Keepalive PINGs every second: a cut agent notices within about two.
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &gpu_hosts,
        &["--node-timeout", "2s", "--replace-after", "1s"],
        &["--gpus", "2", "--keepalive", "1s"],
        LIMIT,
    )
    .await;
    let mut admin = backend.admin().await;

    // Terraform and the provider run on the client host.
    let tf = Terraform::on_host(net.host("client"), &backend, backend.admin_token());
    tf.write_main(&mig_cluster_config());
    tf.init();
    tf.apply();
    let state = tf.resource(CLUSTER);
    let cluster_id = state["id"].as_str().unwrap().to_string();
    let held = hostnames(&cluster(&mut admin, &cluster_id).await);
    let two_halves = vec![vec!["3g.40gb".to_string(); 2]; 2];
    let agent = |name: &str| agents.iter().find(|a| a.name == name).unwrap();
    for h in &held {
        assert_eq!(agent(h).profiles(), two_halves, "agent {h}");
    }

    // Partition the first node's host: it stays up, its agent keeps running.
    let cut = held[0].clone();
    let cut_host = net.host(&cut);
    let cut_pid = agent(&cut).pid().unwrap();
    cut_host.cut();
    let degraded = cluster_in(&admin, &cluster_id, "degraded").await;
    assert!(
        degraded.status_reason.contains(&cut),
        "{}",
        degraded.status_reason
    );
    let unreachable = node(&mut admin, &cut).await.unwrap();
    assert_eq!(
        unreachable.state, "unreachable",
        "{}",
        unreachable.state_reason
    );
    // Replaced on another host, which the agents partition like the others.
    let replaced = cluster_in(&admin, &cluster_id, "running").await;
    let now = hostnames(&replaced);
    let spare = gpu_hosts
        .iter()
        .find(|h| !held.contains(&h.to_string()))
        .unwrap()
        .to_string();
    assert!(
        now.contains(&spare) && !now.contains(&cut) && now.len() == 2,
        "{now:?}"
    );
    assert_eq!(agent(&spare).profiles(), two_halves);
    assert!(
        cut_host.pids().contains(&cut_pid),
        "the cut agent still runs"
    );
    // The control plane closed the cut agent's connection (its keepalive PINGs went
    // unanswered) rather than holding a dead socket for the partition's length.
    eventually(
        "the control plane to close the cut agent's connection",
        LIMIT,
        || {
            let log = backend.log();
            let needle = format!("node agent disconnected node={cut}");
            async move { log.contains(&needle).then_some(()) }
        },
    )
    .await;
    // The cut agent noticed on its own (its PINGs went unanswered), not only the
    // control plane: it is trying to reconnect.
    eventually("the cut agent to notice the partition", LIMIT, || {
        let log = agent(&cut).log();
        async move { log.contains("lost the control plane").then_some(()) }
    })
    .await;

    // Healed: the old agent reconnects, learns its node left the cluster, and is reset
    // to whole GPUs and given back to the pool.
    cut_host.heal();
    ready_nodes(&admin, &[cut.as_str()]).await;
    let back = node(&mut admin, &cut).await.unwrap();
    assert!(
        back.cluster_id.is_empty(),
        "{cut} still in {}",
        back.cluster_id
    );
    eventually("the healed agent back to whole GPUs", LIMIT, || {
        let profiles = agent(&cut).profiles();
        async move { (profiles == vec![Vec::<String>::new(); 2]).then_some(()) }
    })
    .await;
    // Its host runs nothing but its agent, and keeps nothing of the cluster.
    let processes = cut_host.processes();
    assert_eq!(
        processes.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        vec![cut_pid],
        "{processes:?}"
    );
    let kept = files_mentioning(&agent(&cut).data_dir(), &cluster_id);
    assert!(kept.is_empty(), "{cut} keeps {kept:?}");
    // Nor in the host's own /run (where runtime keys and sockets would be).
    let in_run = cut_host.run("grep", &["-rl", &cluster_id, "/run"]);
    assert!(
        in_run.stdout.is_empty(),
        "{cut}'s /run keeps {}",
        String::from_utf8_lossy(&in_run.stdout)
    );
    assert_eq!(
        hostnames(&cluster(&mut admin, &cluster_id).await),
        now,
        "the cluster kept its replacement"
    );
    tf.assert_no_changes();
    tf.destroy();
}

/// The guides' old default, as an operator who copies `--bandwidth-listen 127.0.0.1:0`
/// would have it: nodes on separate hosts offering loopback to each other. Each agent
/// warns at start, and a 2-node cluster's acceptance names the unreachable pairs and the
/// flags, takes no node out of service, and never says "0 Gbit/s above the threshold".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_offering_loopback_to_other_hosts_warn_and_fail_acceptance_naming_the_pairs() {
    netns::require("the multi-host tests");
    let Fleet {
        net: _net,
        backend,
        agents,
    } = Fleet::start(
        &["g1", "g2"],
        &[],
        &[
            "--gpus",
            "1",
            "--bandwidth-listen",
            "127.0.0.1:0",
            "--address",
            "127.0.0.1",
        ],
        LIMIT,
    )
    .await;
    for a in &agents {
        let log = a.log();
        assert!(
            log.contains(
                "the bandwidth-test address offered to peers is not reachable from other hosts"
            ) && log.contains(
                "the Slurm address offered to the controller is not reachable from other hosts"
            ),
            "{log}"
        );
    }
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "loop").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 2, 0).await;
    let refused = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: "loopback-ring".into(),
            tenant_id: tenant.id.clone(),
            name: "ring".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 2,
            storage_gib: 1,
            set_acceptance: true,
            acceptance_level: "medium".into(),
            run_acceptance_on_create: true,
            ..Default::default()
        })
        .await
        .expect_err("acceptance cannot pass");
    let m = refused.message();
    assert!(
        m.contains("no node of the cluster could reach a peer's bandwidth-test listener")
            && m.contains("127.0.0.1")
            && m.contains("--bandwidth-listen")
            && !m.contains("0 Gbit/s"),
        "{m}"
    );
    // No node was taken out for the network's fault.
    ready_nodes(&admin, &["g1", "g2"]).await;
}
