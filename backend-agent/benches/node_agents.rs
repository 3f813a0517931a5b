//! Node agents, measured in-process through the library (`cargo bench -p gpufleet-agent
//! --bench node_agents`): the control plane (store, registry, NodeAgentService) with
//! `--node-agents embedded` agents, each a full `gpufleet-agent node` agent speaking gRPC
//! to a loopback listener, all in this one process.
//!
//! Prints one markdown table:
//! - registration to ready, and the process RSS before and after, for 1,000 agents;
//! - heartbeat processing: `Registry::heartbeat` calls per second from many tasks, and
//!   1,000 real agent streams sending a heartbeat every 50 ms;
//! - a MIG layout order end to end (`mig::changes` + `mig::converge`, the agents' answers
//!   recorded in the store) for 1 node and for 100 nodes at once;
//! - GetTenantCluster latency through a real tonic server, idle and while a slow order
//!   (a `DiskSim` node with an op delay) runs on another node.
//!
//! Numbers only: nothing here asserts a timing.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_agent::embedded;
use gpufleet_control::error::Error;
use gpufleet_control::mig;
use gpufleet_control::registry::Registry;
use gpufleet_control::serve::{ControlPlane as Control, EmbeddedHost};
use gpufleet_control::services::{clusters::Clusters, quotas::Quotas, tenants::Tenants};
use gpufleet_control::state::AppState;
use gpufleet_control::store::{self, nodes::NodeRow};
use gpufleet_gpu::catalog::DEFAULT_DRIVER;
use gpufleet_gpu::hardware::GpuBackend;
use gpufleet_gpu::mig::Layout;
use gpufleet_node::sim_disk::DiskSim;
use gpufleet_proto::v1::{
    self, gpu_quota_service_client::GpuQuotaServiceClient,
    gpu_quota_service_server::GpuQuotaServiceServer,
    tenant_cluster_service_client::TenantClusterServiceClient,
    tenant_cluster_service_server::TenantClusterServiceServer,
    tenant_service_client::TenantServiceClient, tenant_service_server::TenantServiceServer,
};
use tokio::sync::watch;

const AGENTS: u32 = 1000;
const MODEL: &str = "H100-80GB";
const SLOW_MODEL: &str = "A100-80GB";
const ADMIN: &str = "bench-admin-token";
const JOIN: &str = "bench-join-token";
/// The layout every order applies: 3 + 2 + 1 + 1 compute slices, a full GPU.
const LAYOUT: &[(&str, i32)] = &[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)];
/// The slow node: 8 GPUs, each change (MIG mode, each instance) this long.
const SLOW_OP_DELAY: Duration = Duration::from_millis(60);

/// This process's resident set, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) this process has used.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into a struct this function owns.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn layout(pairs: &[(&str, i32)]) -> Layout {
    let map: HashMap<String, i32> = pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    mig::validate(MODEL, &map).expect("a valid layout")
}

/// A control plane as `serve` builds it: the store in a temp data dir with `nodes` H100
/// pool nodes seeded, the registry, the shared state, and the embedded agents' hardware.
struct ControlPlane {
    state: Arc<AppState>,
    control: Control,
    stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

fn control_plane(nodes: u32, node_timeout: Duration) -> ControlPlane {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = common::simulated_pool(dir.path(), MODEL, nodes);
    config.admin_token = Some(ADMIN.into());
    config.join_token = Some(JOIN.into());
    config.node_timeout = node_timeout;
    let control = Control::open(config).expect("open the control plane");
    let (stop, _) = watch::channel(false);
    ControlPlane {
        state: control.state.clone(),
        control,
        stop,
        _dir: dir,
    }
}

impl ControlPlane {
    /// Starts every host's agent; returns how long until all were registered and ready.
    async fn start_agents(&mut self) -> Duration {
        let hosts = self.control.embedded_hosts();
        let t = Instant::now();
        // The agents stop with the bench's stop signal; nothing waits for them.
        embedded::start(
            &self.control,
            hosts,
            true,
            self.stop.subscribe(),
            &mut Vec::new(),
        )
        .await
        .expect("embedded agents ready");
        t.elapsed()
    }

    async fn free_nodes(&self, gpu_type: &str) -> Vec<NodeRow> {
        let gpu_type = gpu_type.to_string();
        self.state
            .read(move |conn| {
                Ok::<_, Error>(store::nodes::free(conn, &gpu_type, store::nodes::POOL)?)
            })
            .await
            .expect("free nodes")
    }
}

/// One order round: the changes from the store's node rows, then every agent's verified answer.
async fn order(state: &AppState, gpu_type: &str, nodes: &[NodeRow], target: &Layout) -> Duration {
    let t = Instant::now();
    let (gpu_type, nodes, target) = (gpu_type.to_string(), nodes.to_vec(), target.clone());
    let changes = state
        .read(move |conn| mig::changes(conn, &gpu_type, &nodes, &target, &[]))
        .await
        .expect("changes");
    mig::converge(state, &changes)
        .await
        .unwrap_or_else(|e| panic!("order failed: {e}"));
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn latencies(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "p50 {}, p99 {}, max {} ({} reads)",
        ms(percentile(&v, 0.5)),
        ms(percentile(&v, 0.99)),
        ms(*v.last().unwrap()),
        v.len()
    )
}

fn with_admin<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        gpufleet_proto::AUTHORIZATION,
        gpufleet_proto::bearer(ADMIN).parse().unwrap(),
    );
    r
}

/// `Registry::heartbeat` from `tasks` tasks over `nodes` attached nodes for `window`.
async fn registry_heartbeats(nodes: usize, tasks: usize, window: Duration) -> f64 {
    let registry = Arc::new(Registry::new(
        Duration::from_secs(30),
        Duration::from_secs(300),
    ));
    let mut receivers = Vec::new();
    let sessions: Vec<(String, u64)> = (0..nodes)
        .map(|i| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            receivers.push(rx);
            let id = format!("node-{i:04}");
            let session =
                registry.attach(&id, tx, gpufleet_wire::protocol_version::Version::ours());
            (id, session)
        })
        .collect();
    let sessions = Arc::new(sessions);
    let count = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let deadline = t + window;
    let workers: Vec<_> = (0..tasks)
        .map(|k| {
            let (registry, sessions, count) = (registry.clone(), sessions.clone(), count.clone());
            tokio::spawn(async move {
                let mine: Vec<&(String, u64)> = sessions.iter().skip(k).step_by(tasks).collect();
                while Instant::now() < deadline {
                    for (id, session) in &mine {
                        registry.heartbeat(id, *session);
                    }
                    count.fetch_add(mine.len() as u64, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

/// TenantService, GpuQuotaService and TenantClusterService on a loopback listener, with
/// or without TCP_NODELAY on the accepted sockets.
async fn api_server(
    state: Arc<AppState>,
    nodelay: bool,
    mut stop: watch::Receiver<bool>,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = async_stream_of(listener, nodelay);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TenantServiceServer::new(Tenants {
                state: state.clone(),
            }))
            .add_service(GpuQuotaServiceServer::new(Quotas {
                state: state.clone(),
            }))
            .add_service(TenantClusterServiceServer::new(Clusters { state }))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
            .unwrap();
    });
    addr
}

/// The listener's accepted sockets, with TCP_NODELAY set when asked.
fn async_stream_of(
    listener: tokio::net::TcpListener,
    nodelay: bool,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<tokio::net::TcpStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await.map(|(stream, _)| {
                if nodelay {
                    let _ = stream.set_nodelay(true);
                }
                stream
            });
            if tx.send(accepted).await.is_err() {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

struct Row {
    what: String,
    how: String,
    result: String,
}

fn row(what: impl Into<String>, how: impl Into<String>, result: impl Into<String>) -> Row {
    Row {
        what: what.into(),
        how: how.into(),
        result: result.into(),
    }
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let mut rows = Vec::new();
    let applied = layout(LAYOUT);
    let whole = Layout::new();

    // (a) 1,000 agents: registration to ready, and memory.
    let mut cp = control_plane(AGENTS, Duration::from_secs(30));
    let rss_before = rss_kib();
    let ready_in = cp.start_agents().await;
    // Let the connections' buffers and the first heartbeats settle before reading RSS.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_kib();
    rows.push(row(
        "registration to ready, 1,000 agents",
        "`embedded::start` with 1,000 8-GPU H100 agents (each its own gRPC stream to a loopback listener), until every node is `ready` in the store",
        format!(
            "{:.2} s ({:.0} agents/s)",
            ready_in.as_secs_f64(),
            AGENTS as f64 / ready_in.as_secs_f64()
        ),
    ));
    rows.push(row(
        "process RSS, 1,000 agents",
        "VmRSS with the store seeded and the simulated GPUs built, then with all 1,000 agents ready (the in-process agents count too)",
        format!(
            "{:.1} MiB before, {:.1} MiB after: +{:.0} KiB per agent",
            rss_before as f64 / 1024.0,
            rss_after as f64 / 1024.0,
            (rss_after.saturating_sub(rss_before)) as f64 / AGENTS as f64
        ),
    ));

    // (b) heartbeats, the registry alone.
    let per_sec = registry_heartbeats(1000, 8, Duration::from_secs(2)).await;
    rows.push(row(
        "heartbeats: `Registry::heartbeat`",
        "8 tokio tasks over 1,000 attached nodes for 2 s (one mutex, no network)",
        format!("{:.2} M/s", per_sec / 1e6),
    ));

    // A real API server over loopback: a tenant, a quota and a one-node cluster to read.
    // The reads are measured on a listener whose accepted sockets keep Nagle on (what
    // `serve` did before this benchmark found it) and on one with TCP_NODELAY, as `serve`
    // now sets it.
    let plain_addr = api_server(cp.state.clone(), false, cp.stop.subscribe()).await;
    let addr = api_server(cp.state.clone(), true, cp.stop.subscribe()).await;
    let connect = |addr: std::net::SocketAddr| async move {
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap()
    };
    let channel = connect(addr).await;
    let mut plain_clusters = TenantClusterServiceClient::new(connect(plain_addr).await);
    let tenant = TenantServiceClient::new(channel.clone())
        .create_tenant(with_admin(v1::CreateTenantRequest {
            request_id: "bench-tenant".into(),
            name: "bench".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .tenant
        .unwrap();
    GpuQuotaServiceClient::new(channel.clone())
        .create_gpu_quota(with_admin(v1::CreateGpuQuotaRequest {
            request_id: "bench-quota".into(),
            tenant_id: tenant.id.clone(),
            gpu_type: MODEL.into(),
            gpus: 8,
            burst_gpus: 0,
            ..Default::default()
        }))
        .await
        .unwrap();
    let mut clusters = TenantClusterServiceClient::new(channel);
    let cluster = clusters
        .create_tenant_cluster(with_admin(v1::CreateTenantClusterRequest {
            request_id: "bench-cluster".into(),
            tenant_id: tenant.id.clone(),
            name: "bench".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: MODEL.into(),
            node_count: 1,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();

    // (c) a MIG layout order end to end, 1 node and 100 nodes at once.
    let free = cp.free_nodes(MODEL).await;
    let (one, rest) = free.split_at(1);
    let hundred = &rest[..100];
    let other = &rest[100..101];
    let (mut single, mut back) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        single.push(order(&cp.state, MODEL, one, &applied).await);
        back.push(order(&cp.state, MODEL, one, &whole).await);
    }
    let (mut many, mut many_back) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        many.push(order(&cp.state, MODEL, hundred, &applied).await);
        many_back.push(order(&cp.state, MODEL, hundred, &whole).await);
    }
    rows.push(row(
        "MIG layout order, 1 node",
        "`mig::changes` + `mig::converge`: 8 GPUs from whole to 3g.40gb + 2g.20gb + 2 x 1g.10gb (4 instances each), answer verified and recorded; median of 10",
        format!(
            "{} (back to whole GPUs: {})",
            ms(median(single)),
            ms(median(back))
        ),
    ));
    rows.push(row(
        "MIG layout order, 100 nodes at once",
        "the same order to 100 nodes (800 GPUs) in one `converge`; median of 3",
        format!(
            "{} (back to whole GPUs: {})",
            ms(median(many)),
            ms(median(many_back))
        ),
    ));

    // (d) reads while a slow order runs on another node.
    let slow_dir = cp.state.data_dir.join("slow-hw");
    std::fs::create_dir_all(&slow_dir).unwrap();
    let model = gpufleet_gpu::catalog::model(SLOW_MODEL).unwrap();
    let disk = DiskSim::open(
        &slow_dir,
        "slow-01",
        model,
        8,
        DEFAULT_DRIVER,
        SLOW_OP_DELAY,
    )
    .unwrap();
    let sim = disk.node.clone();
    let backend: Arc<dyn GpuBackend> = Arc::new(disk);
    embedded::start(
        &cp.control,
        vec![EmbeddedHost {
            name: "slow-01".into(),
            capacity: store::nodes::POOL.into(),
            gpu_type: SLOW_MODEL.into(),
            backend,
            sim: Some(sim),
            driver_version: DEFAULT_DRIVER.into(),
            declared: None,
        }],
        true,
        cp.stop.subscribe(),
        &mut Vec::new(),
    )
    .await
    .expect("the slow agent is ready");
    let slow_node = cp.free_nodes(SLOW_MODEL).await;
    let get = |clusters: &mut TenantClusterServiceClient<tonic::transport::Channel>| {
        let mut clusters = clusters.clone();
        let id = cluster.id.clone();
        async move {
            let t = Instant::now();
            clusters
                .get_tenant_cluster(with_admin(v1::GetTenantClusterRequest { id }))
                .await
                .unwrap();
            t.elapsed()
        }
    };
    let mut idle = Vec::new();
    for _ in 0..500 {
        idle.push(get(&mut clusters).await);
    }
    let mut idle_plain = Vec::new();
    for _ in 0..100 {
        idle_plain.push(get(&mut plain_clusters).await);
    }
    let slow_state = cp.state.clone();
    let slow_layout = applied.clone();
    let slow =
        tokio::spawn(async move { order(&slow_state, SLOW_MODEL, &slow_node, &slow_layout).await });
    // The reads run while the slow order does, and one 1-node order on another node
    // starts meanwhile.
    let mut during = Vec::new();
    let mut other_order = None;
    let mut reads_started = Instant::now();
    while !slow.is_finished() {
        during.push(get(&mut clusters).await);
        if other_order.is_none() && reads_started.elapsed() > Duration::from_millis(300) {
            other_order = Some(order(&cp.state, MODEL, other, &applied).await);
            reads_started = Instant::now();
        }
    }
    let slow_took = slow.await.unwrap();
    rows.push(row(
        "read latency, idle",
        "GetTenantCluster (admin token, 1-node cluster) through a real tonic server over loopback, one at a time, TCP_NODELAY on both ends",
        latencies(idle),
    ));
    rows.push(row(
        "read latency, idle, server sockets as `serve` accepts them",
        "the same reads on a listener that leaves Nagle on for accepted sockets (serve sets TCP_NODELAY; this is the baseline)",
        latencies(idle_plain),
    ));
    rows.push(row(
        "read latency during a slow order",
        format!(
            "the same reads while another node (`DiskSim`, {} ms per MIG change, as an `embedded::Host`) runs an 8-GPU order that takes {:.1} s",
            SLOW_OP_DELAY.as_millis(),
            slow_took.as_secs_f64()
        ),
        latencies(during),
    ));
    rows.push(row(
        "another node's order during the slow order",
        "a 1-node MIG layout order to a third node, started 0.3 s into the slow order",
        other_order
            .map(ms)
            .unwrap_or_else(|| "(slow order ended first)".into()),
    ));
    let _ = cp.stop.send(true);
    drop(cp);

    // (b) heartbeats through real streams: 1,000 agents of a control plane whose node
    // timeout is 200 ms, so each agent beats every 50 ms.
    let mut hb = control_plane(AGENTS, Duration::from_millis(200));
    hb.start_agents().await;
    let interval = hb.state.agents.heartbeat_interval();
    let ids: Vec<String> = hb
        .state
        .read(|conn| Ok::<_, Error>(store::nodes::list(conn, None, None)?))
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let window = Duration::from_secs(5);
    let (cpu0, t0) = (cpu_time(), Instant::now());
    let mut ages = Vec::new();
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for id in &ids {
            ages.push(hb.state.agents.heartbeat_age(id).unwrap_or(Duration::MAX));
        }
    }
    ages.sort();
    let (cpu, wall) = (cpu_time() - cpu0, t0.elapsed());
    let offered = ids.len() as f64 / interval.as_secs_f64();
    rows.push(row(
        "heartbeats: real streams",
        format!(
            "1,000 embedded agents each sending a heartbeat every {} ms over its gRPC stream ({:.0}/s offered) for 5 s; every node's heartbeat age sampled every 100 ms, and CPU of the whole process (agents and control plane)",
            interval.as_millis(),
            offered
        ),
        format!(
            "heartbeat age p50 {}, p99 {}, max {}; {:.2} cores busy: {:.0} µs CPU per heartbeat, both ends",
            ms(percentile(&ages, 0.5)),
            ms(percentile(&ages, 0.99)),
            ms(*ages.last().unwrap()),
            cpu.as_secs_f64() / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / (offered * wall.as_secs_f64())
        ),
    ));
    let _ = hb.stop.send(true);

    println!("| measure | how | result |");
    println!("|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} |", r.what, r.how, r.result);
    }
    eprintln!("(whole bench: {:.1} s)", started.elapsed().as_secs_f64());
}
