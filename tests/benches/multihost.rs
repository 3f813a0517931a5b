//! The multi-host tier measured (issue 20): a control-plane host, a client host and N GPU
//! hosts, each its own network namespace on one bridge (see `tests/src/netns.rs`).
//!
//! For N = 8 and 32 (`HOSTS`, comma-separated): registration to ready (every agent started
//! at once until the control plane lists every node ready, their medium acceptance checks
//! included) and one MIG order across the fleet (a cluster of all N nodes with a MIG
//! layout and no acceptance checks, from the create until it is running). Then the ring
//! bandwidth test across two hosts (each pair's Gbit/s; both pairs at once) next to a plain
//! TCP copy between the same two hosts, both ways at once for as long. Prints tables;
//! nothing is asserted. Needs root.
//!
//! `cargo bench -p gpufleet-e2e --bench multihost` (binaries: `GPUFLEET_AGENT_BIN`, else
//! `target/debug`).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use gpufleet_e2e::fixtures::{create_quota, create_tenant, request_id};
use gpufleet_e2e::netns::{self, Network};
use gpufleet_e2e::{eventually, grpc, Backend, Clients, NodeAgent};
use gpufleet_proto::v1::health_service_client::HealthServiceClient;
use gpufleet_proto::v1::{
    CreateTenantClusterRequest, GetTenantClusterRequest, RunHealthCheckRequest,
};

const LIMIT: Duration = Duration::from_secs(600);
const COPY_FOR: Duration = Duration::from_secs(1);

fn network(gpu_hosts: usize) -> (Network, Vec<String>) {
    let gpus: Vec<String> = (1..=gpu_hosts).map(|i| format!("g{i}")).collect();
    let mut names = vec!["cp", "client"];
    names.extend(gpus.iter().map(String::as_str));
    (Network::new(&names), gpus)
}

fn backend(net: &Network) -> Backend {
    Backend::start_on(
        net.host("cp"),
        net.host("client"),
        &[
            "--node-agents",
            "external",
            "--node-timeout",
            "30s",
            "--health-interval",
            "0",
            "--bandwidth-duration",
            "1s",
        ],
    )
}

async fn all_ready(admin: &Clients, count: usize) {
    eventually(&format!("{count} nodes ready"), LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.iter().filter(|n| n.state == "ready").count() == count).then_some(())
        }
    })
    .await
}

async fn running(admin: &Clients, id: &str) {
    eventually("the cluster running", LIMIT, || {
        let (mut admin, id) = (admin.clone(), id.to_string());
        async move {
            let c = admin
                .clusters
                .get_tenant_cluster(GetTenantClusterRequest { id })
                .await
                .ok()?
                .into_inner();
            (c.status == "running").then_some(())
        }
    })
    .await
}

/// Registration to ready and one MIG order across `n` GPU hosts.
async fn fleet(n: usize) -> (Duration, Duration) {
    let (net, gpus) = network(n);
    let backend = backend(&net);
    let mut admin = backend.admin().await;
    let started = Instant::now();
    let _agents: Vec<NodeAgent> = gpus
        .iter()
        .map(|h| NodeAgent::start_on(net.host(h), &backend, h, &["--gpus", "1"]))
        .collect();
    all_ready(&admin, n).await;
    let ready = started.elapsed();

    let (tenant, _) = create_tenant(&mut admin, "bench").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", n as i64, 0).await;
    let started = Instant::now();
    let created = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: request_id(),
            tenant_id: tenant.id.clone(),
            name: "mig".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: n as i64,
            storage_gib: 100,
            mig_layout: [("3g.40gb".to_string(), 2)].into(),
            // The order alone: no acceptance checks (their bandwidth test would take its
            // full duration on top).
            set_acceptance: true,
            acceptance_level: "quick".into(),
            run_acceptance_on_create: false,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTenantCluster: {s}"))
        .into_inner();
    running(&admin, &created.id).await;
    (ready, started.elapsed())
}

/// The ring bandwidth test between two hosts (each pair's Gbit/s), and a plain TCP copy
/// between the same two hosts.
async fn two_hosts() -> (Vec<(String, String, f64)>, Vec<(String, String, f64)>) {
    let (net, gpus) = network(2);
    let backend = backend(&net);
    let mut admin = backend.admin().await;
    let _agents: Vec<NodeAgent> = gpus
        .iter()
        .map(|h| NodeAgent::start_on(net.host(h), &backend, h, &["--gpus", "1"]))
        .collect();
    all_ready(&admin, 2).await;
    let (tenant, _) = create_tenant(&mut admin, "bw").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 2, 0).await;
    let created =
        gpufleet_e2e::fixtures::create_pool_cluster(&mut admin, &tenant.id, "bw", "H100-80GB", 2)
            .await;
    running(&admin, &created.id).await;
    let channel = grpc::channel_from(backend.dial_from().unwrap(), &backend.endpoint()).await;
    let mut health =
        HealthServiceClient::with_interceptor(channel, grpc::bearer_auth(backend.admin_token()));
    let report = health
        .run_health_check(RunHealthCheckRequest {
            cluster_id: created.id,
            level: "quick".into(),
            bandwidth_duration_ms: COPY_FOR.as_millis() as u32,
        })
        .await
        .unwrap_or_else(|s| panic!("RunHealthCheck: {s}"))
        .into_inner();
    let pairs = report
        .nodes
        .iter()
        .flat_map(|n| {
            n.checks
                .iter()
                .filter(|c| c.name == "bandwidth")
                .map(|c| (n.node.clone(), c.peer.clone(), c.gbps))
        })
        .collect();

    // The plain copy, like the test's ring: g1 -> g2 and g2 -> g1 at once, each as fast
    // as it can for as long as the test's pairs.
    let (g1, g2) = (net.host("g1"), net.host("g2"));
    let copies = [(g1, g2), (g2, g1)].map(|(from, to)| {
        let listener = to.launcher().listen((to.addr(), 0).into()).unwrap();
        let out = from
            .launcher()
            .connect(listener.local_addr().unwrap())
            .unwrap();
        let (name, peer) = (from.name().to_string(), to.name().to_string());
        std::thread::spawn(move || (name, peer, copy(listener, out)))
    });
    let copies = copies.map(|c| c.join().unwrap()).to_vec();
    (pairs, copies)
}

/// Writes into `out` for [`COPY_FOR`] while a thread reads from `listener`'s one
/// connection; the Gbit/s that arrived.
fn copy(listener: std::net::TcpListener, mut out: std::net::TcpStream) -> f64 {
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    let buf = vec![7u8; 1 << 20];
    let started = Instant::now();
    while started.elapsed() < COPY_FOR {
        out.write_all(&buf).unwrap();
    }
    drop(out);
    let bytes = receiver.join().unwrap();
    bytes as f64 * 8.0 / started.elapsed().as_secs_f64() / 1e9
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Some(why) = netns::unavailable() {
        println!("multihost bench skipped: {why}");
        return;
    }
    let sizes: Vec<usize> = std::env::var("HOSTS")
        .unwrap_or_else(|_| "8,32".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("| GPU hosts (namespaces) | registration to ready | MIG order across the fleet |");
    println!("|---:|---:|---:|");
    for n in sizes {
        let (ready, mig) = fleet(n).await;
        println!(
            "| {n} | {:.2} s | {:.2} s |",
            ready.as_secs_f64(),
            mig.as_secs_f64()
        );
    }
    let (pairs, copies) = two_hosts().await;
    println!();
    println!("| between two hosts ({COPY_FOR:?}) | Gbit/s |");
    println!("|---|---:|");
    for (from, to, gbps) in pairs {
        println!("| ring bandwidth test, {from} -> {to} | {gbps:.2} |");
    }
    for (from, to, gbps) in copies {
        println!("| plain TCP copy, {from} -> {to} | {gbps:.2} |");
    }
}
