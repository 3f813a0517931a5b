//! Admission at scale, measured from outside through the gRPC API (issue 7).
//!
//! Starts a real `gpufleet-agent serve` (release build: `$GPUFLEET_AGENT_BIN`, else
//! `target/release/gpufleet-agent`) with a simulated fleet of 1,000 8-GPU H100 pool nodes,
//! 16 tenants sharing a quota for all of them (serve's limit of open reservations per
//! tenant raised to fit), and creates 1-node reservations in random windows (start within
//! the next year, 1 to 48 hours long) from 8 concurrent clients, each on its own
//! connection. It measures creates per second and latency with no existing
//! reservations (the same run's baseline), then seeds up to 10,000 existing reservations
//! and measures again, with one availability query's latency at both points. Last, it
//! creates one large tenant cluster (`CLUSTER_NODES`, default 1,000, from a second pool of
//! A100 nodes) and measures reads and reservation creates made while it is created, against
//! the same calls made for as long right after it. Prints tables; nothing is asserted.
//!
//! `cargo build --release -p gpufleet-agent --bins && cargo bench -p gpufleet-e2e --bench admission_scale`
//! Environment: `EXISTING` (default 10000), `MEASURED` (creates per measurement, default
//! 2000), `CLIENTS` (default 8), `TENANTS` (default 16), `CLUSTER_NODES` (default 1000; 0
//! skips the cluster measurement).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_e2e::{Backend, Clients};
use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::{
    AvailabilityRequest, CreateGpuQuotaRequest, CreateReservationRequest,
    CreateTenantClusterRequest, CreateTenantRequest,
};

const POOL_NODES: u32 = 1_000;
const GPU_TYPE: &str = "H100-80GB";
/// The second pool, only for the large cluster, so it finds nodes free for good.
const CLUSTER_GPU_TYPE: &str = "A100-80GB";
const HOUR: i64 = 3_600;
const YEAR: i64 = 365 * 24 * HOUR;
/// Reservations the probes around the large cluster create may make, at most.
const PROBE_ALLOWANCE: usize = 40_000;
/// serve's default `--max-open-reservations`.
const DEFAULT_OPEN_LIMIT: usize = 1_000;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// splitmix64: a seeded generator, so every run asks for the same windows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: i64) -> i64 {
        (self.next() % n as u64) as i64
    }

    /// A window starting within the next year (at least an hour out), 1 to 48 hours long.
    fn window(&mut self, now: i64) -> (i64, i64) {
        let start = now + HOUR + self.below(YEAR);
        (start, start + HOUR + self.below(47 * HOUR))
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// What one batch of creates measured.
struct Batch {
    creates: usize,
    failed: usize,
    wall: Duration,
    latencies: Vec<Duration>,
}

impl Batch {
    fn per_second(&self) -> f64 {
        self.creates as f64 / self.wall.as_secs_f64()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `count` creates from `clients` concurrent clients; request ids start at `first`.
async fn creates(
    clients: &[Clients],
    tenants: &[String],
    first: usize,
    count: usize,
    seed: u64,
) -> Batch {
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let failed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let mut c = c.clone();
        let (next, latencies, failed) = (next.clone(), latencies.clone(), failed.clone());
        let tenants = tenants.to_vec();
        let mut rng = Rng(seed ^ ((k as u64 + 1) << 32));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let (start, end) = rng.window(now());
                let request = CreateReservationRequest {
                    request_id: format!("bench-{}", first + i),
                    tenant_id: tenants[(first + i) % tenants.len()].clone(),
                    gpu_type: GPU_TYPE.into(),
                    node_count: 1,
                    start_time: Some(from_unix(start)),
                    end_time: Some(from_unix(end)),
                    ..Default::default()
                };
                let t0 = Instant::now();
                let answer = c.reservations.create_reservation(request).await;
                let took = t0.elapsed();
                match answer {
                    Ok(_) => latencies.lock().unwrap().push(took),
                    Err(status) => {
                        if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("create refused: {status}");
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let wall = started.elapsed();
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies.sort();
    Batch {
        creates: latencies.len(),
        failed: failed.load(Ordering::Relaxed),
        wall,
        latencies,
    }
}

/// Latencies of `count` availability queries, one at a time, each for a random 48-hour
/// window; and of one open-ended query (from now on, every holding counts).
async fn availability(c: &Clients, count: usize, seed: u64) -> (Vec<Duration>, Duration) {
    let mut c = c.clone();
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (start, _) = rng.window(now());
        let request = AvailabilityRequest {
            gpu_type: GPU_TYPE.into(),
            start_time: Some(from_unix(start)),
            end_time: Some(from_unix(start + 48 * HOUR)),
            ..Default::default()
        };
        let t0 = Instant::now();
        c.fleet
            .get_availability(request)
            .await
            .unwrap_or_else(|s| panic!("GetAvailability: {s}"));
        out.push(t0.elapsed());
    }
    out.sort();
    let t0 = Instant::now();
    c.fleet
        .get_availability(AvailabilityRequest {
            gpu_type: GPU_TYPE.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("GetAvailability (open-ended): {s}"));
    (out, t0.elapsed())
}

/// Latencies of calls made one at a time by two clients side by side until `done` is
/// set: availability queries for a random 48-hour window (reads) and 1-node reservation
/// creates (writes); request ids start at `first`.
async fn probe(
    reader: &Clients,
    writer: &Clients,
    tenants: &[String],
    first: usize,
    done: Arc<std::sync::atomic::AtomicBool>,
    seed: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut reader, mut writer) = (reader.clone(), writer.clone());
    let read_done = done.clone();
    let reads = tokio::spawn(async move {
        let mut rng = Rng(seed);
        let mut out = Vec::new();
        while !read_done.load(Ordering::Relaxed) {
            let (start, _) = rng.window(now());
            let t0 = Instant::now();
            reader
                .fleet
                .get_availability(AvailabilityRequest {
                    gpu_type: GPU_TYPE.into(),
                    start_time: Some(from_unix(start)),
                    end_time: Some(from_unix(start + 48 * HOUR)),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|s| panic!("GetAvailability: {s}"));
            out.push(t0.elapsed());
        }
        out
    });
    let tenants = tenants.to_vec();
    let writes = tokio::spawn(async move {
        let mut rng = Rng(seed ^ 0x5eed);
        let mut out = Vec::new();
        let mut i = first;
        while !done.load(Ordering::Relaxed) {
            let (start, end) = rng.window(now());
            let t0 = Instant::now();
            writer
                .reservations
                .create_reservation(CreateReservationRequest {
                    request_id: format!("bench-probe-{i}"),
                    tenant_id: tenants[i % tenants.len()].clone(),
                    gpu_type: GPU_TYPE.into(),
                    node_count: 1,
                    start_time: Some(from_unix(start)),
                    end_time: Some(from_unix(end)),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|s| panic!("CreateReservation (probe): {s}"));
            out.push(t0.elapsed());
            i += 1;
        }
        out
    });
    let mut reads = reads.await.expect("read probe");
    let mut writes = writes.await.expect("write probe");
    reads.sort();
    writes.sort();
    (reads, writes)
}

/// What calls measured while one large cluster was created, and the same calls just before.
struct DuringCluster {
    nodes: i64,
    create: Duration,
    idle: (Vec<Duration>, Vec<Duration>),
    during: (Vec<Duration>, Vec<Duration>),
}

/// Creates a `nodes`-node Kubernetes cluster from the second pool (acceptance checks off,
/// so what is measured is the control plane's work, not the agents' checks) while
/// [`probe`] runs; then probes for as long again, with nothing else running, as its
/// baseline.
async fn during_cluster_create(
    clients: &[Clients],
    admin: &mut Clients,
    tenants: &[String],
    first: usize,
    nodes: i64,
) -> DuringCluster {
    let tenant = tenants[0].as_str();
    admin
        .quotas
        .create_gpu_quota(CreateGpuQuotaRequest {
            request_id: "bench-cluster-quota".into(),
            tenant_id: tenant.into(),
            gpu_type: CLUSTER_GPU_TYPE.into(),
            gpus: nodes * 8,
            burst_gpus: 0,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateGpuQuota ({CLUSTER_GPU_TYPE}): {s}"));
    let request = CreateTenantClusterRequest {
        request_id: "bench-cluster".into(),
        tenant_id: tenant.into(),
        name: "bench-large".into(),
        orchestrator: "kubernetes".into(),
        gpu_type: CLUSTER_GPU_TYPE.into(),
        node_count: nodes,
        set_acceptance: true,
        acceptance_level: "quick".into(),
        run_acceptance_on_create: false,
        ..Default::default()
    };

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut cluster_client = admin.clone();
    let during_done = done.clone();
    let started = Instant::now();
    let create = tokio::spawn(async move {
        let answer = cluster_client.clusters.create_tenant_cluster(request).await;
        let took = started.elapsed();
        during_done.store(true, Ordering::Relaxed);
        answer.unwrap_or_else(|s| panic!("CreateTenantCluster ({nodes} nodes): {s}"));
        took
    });
    let during = probe(
        &clients[0],
        &clients[1 % clients.len()],
        tenants,
        first,
        done,
        11,
    )
    .await;
    let create = create.await.expect("cluster create task");

    // The baseline: the same calls for as long, with nothing else running.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let timer = tokio::spawn(async move {
        tokio::time::sleep(create).await;
        stop.store(true, Ordering::Relaxed);
    });
    let first_idle = first + during.1.len();
    let idle = probe(
        &clients[0],
        &clients[1 % clients.len()],
        tenants,
        first_idle,
        done,
        12,
    )
    .await;
    timer.await.expect("baseline timer");
    DuringCluster {
        nodes,
        create,
        idle,
        during,
    }
}

fn print_during_cluster(c: &DuringCluster) {
    println!();
    println!(
        "Calls during one {}-node {CLUSTER_GPU_TYPE} cluster create ({:.2} s), one reader and one writer one call at a time, vs the same for as long with nothing else running",
        c.nodes,
        c.create.as_secs_f64()
    );
    println!();
    println!("| measure | idle (baseline) | during the create | ratio |");
    println!("|---|---|---|---|");
    for (name, idle, during) in [
        ("availability (48 h window)", &c.idle.0, &c.during.0),
        ("reservation create", &c.idle.1, &c.during.1),
    ] {
        println!("| {name}: calls | {} | {} | - |", idle.len(), during.len());
        for (label, pick) in [("p50", 50.0), ("p99", 99.0), ("max", 100.0)] {
            let (a, b) = (ms(percentile(idle, pick)), ms(percentile(during, pick)));
            println!(
                "| {name}: {label} | {a:.2} ms | {b:.2} ms | {:.2}x |",
                b / a
            );
        }
    }
}

/// `serve` flags that raise the limit of open reservations per tenant (when this build
/// has one) to `per_tenant`, when that is above its default.
fn limit_flags(agent: &std::path::Path, per_tenant: usize) -> Vec<String> {
    let help = std::process::Command::new(agent)
        .args(["serve", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut flags = Vec::new();
    if help.contains("--max-open-reservations") && per_tenant > DEFAULT_OPEN_LIMIT {
        flags.extend([
            "--max-open-reservations".to_string(),
            per_tenant.to_string(),
        ]);
    }
    flags
}

fn release_agent() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(gpufleet_e2e::binaries::AGENT_ENV) {
        return path.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| gpufleet_e2e::binaries::workspace_root().join("target"));
    target.join("release").join("gpufleet-agent")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes `--bench`; no other arguments are taken.
    let existing = env_usize("EXISTING", 10_000);
    let measured = env_usize("MEASURED", 2_000);
    let n_clients = env_usize("CLIENTS", 8).max(1);
    let n_tenants = env_usize("TENANTS", 16).clamp(1, POOL_NODES as usize);
    let agent = release_agent();
    assert!(
        agent.is_file(),
        "{} not found: build it with `cargo build --release -p gpufleet-agent --bins` or set {}",
        agent.display(),
        gpufleet_e2e::binaries::AGENT_ENV
    );
    std::env::set_var(gpufleet_e2e::binaries::AGENT_ENV, &agent);
    let cluster_nodes = env_usize("CLUSTER_NODES", 1_000).min(10_000);
    // Room for the measured creates and, during and after the cluster create, the probes.
    let per_tenant =
        (existing.max(measured) + 2 * measured + PROBE_ALLOWANCE).div_ceil(n_tenants) + 1;
    let flags = limit_flags(&agent, per_tenant);
    let mut fleet = format!("[[pool]]\ngpu_type = \"{GPU_TYPE}\"\nnodes = {POOL_NODES}\n");
    if cluster_nodes > 0 {
        fleet += &format!("[[pool]]\ngpu_type = \"{CLUSTER_GPU_TYPE}\"\nnodes = {cluster_nodes}\n");
    }
    let booted = Instant::now();
    let backend = tokio::task::spawn_blocking(move || {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Backend::start_with_fleet_and_args(&fleet, &flags)
    })
    .await
    .expect("start the backend");
    eprintln!(
        "backend ready with {POOL_NODES} pool nodes in {:.1} s ({})",
        booted.elapsed().as_secs_f64(),
        agent.display()
    );

    let mut admin = backend.admin().await;
    // The pool's GPUs shared out as guarantees (their sum may not exceed the pool).
    let gpus_each = i64::from(POOL_NODES) * 8 / n_tenants as i64;
    let mut tenants = Vec::new();
    for k in 0..n_tenants {
        let tenant = admin
            .tenants
            .create_tenant(CreateTenantRequest {
                request_id: format!("bench-tenant-{k}"),
                name: format!("bench-{k}"),
                display_name: format!("Admission benchmark {k}"),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("CreateTenant: {s}"))
            .into_inner()
            .tenant
            .expect("CreateTenant answers the tenant");
        admin
            .quotas
            .create_gpu_quota(CreateGpuQuotaRequest {
                request_id: format!("bench-quota-{k}"),
                tenant_id: tenant.id.clone(),
                gpu_type: GPU_TYPE.into(),
                gpus: gpus_each,
                burst_gpus: 0,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("CreateGpuQuota: {s}"));
        tenants.push(tenant.id);
    }

    let mut clients = Vec::new();
    for _ in 0..n_clients {
        clients.push(backend.admin().await);
    }

    // Baseline: availability and creates with no existing reservations.
    let (avail_empty, open_empty) = availability(&clients[0], 100, 7).await;
    let empty = creates(&clients, &tenants, 0, measured, 1).await;
    let mut held = empty.creates;
    // Seed up to `existing` (not measured), then measure again.
    let seeding = Instant::now();
    if existing > held {
        let seed = creates(&clients, &tenants, held, existing - held, 2).await;
        held += seed.creates;
        eprintln!(
            "seeded {} reservations in {:.1} s ({} refused)",
            seed.creates,
            seeding.elapsed().as_secs_f64(),
            seed.failed
        );
    }
    let (avail_full, open_full) = availability(&clients[0], 100, 8).await;
    let full = creates(&clients, &tenants, held, measured, 3).await;

    let cluster = if cluster_nodes > 0 {
        let first = held + measured;
        Some(
            during_cluster_create(&clients, &mut admin, &tenants, first, cluster_nodes as i64)
                .await,
        )
    } else {
        None
    };

    let existing_text = format!("{held} existing");
    println!();
    println!(
        "Admission: {POOL_NODES} x 8-GPU {GPU_TYPE} pool nodes, {n_tenants} tenants ({gpus_each} guaranteed GPUs each), 1-node reservations in random windows (start within a year, 1-48 h), {n_clients} clients, {measured} creates per measurement"
    );
    println!();
    println!("| measure | 0 existing (baseline) | {existing_text} | ratio |");
    println!("|---|---|---|---|");
    let row = |name: &str, base: f64, now: f64, unit: &str| {
        println!(
            "| {name} | {base:.2} {unit} | {now:.2} {unit} | {:.2}x |",
            now / base
        );
    };
    row(
        "creates per second",
        empty.per_second(),
        full.per_second(),
        "/s",
    );
    for p in [50.0, 99.0] {
        row(
            &format!("create latency p{p}"),
            ms(percentile(&empty.latencies, p)),
            ms(percentile(&full.latencies, p)),
            "ms",
        );
    }
    row(
        "create latency max",
        ms(*empty.latencies.last().unwrap_or(&Duration::ZERO)),
        ms(*full.latencies.last().unwrap_or(&Duration::ZERO)),
        "ms",
    );
    for p in [50.0, 99.0] {
        row(
            &format!("availability (48 h window) p{p}"),
            ms(percentile(&avail_empty, p)),
            ms(percentile(&avail_full, p)),
            "ms",
        );
    }
    row(
        "availability (from now on, one query)",
        ms(open_empty),
        ms(open_full),
        "ms",
    );
    if empty.failed + full.failed > 0 {
        println!(
            "\nrefused creates: {} (baseline), {} (at {existing_text})",
            empty.failed, full.failed
        );
    }
    if let Some(c) = &cluster {
        print_during_cluster(c);
    }
    // Machine-readable lines for scripts/bench.sh.
    println!(
        "\nBENCH admission creates_per_s_empty={:.0} creates_per_s_full={:.0} p99_ms_empty={:.2} p99_ms_full={:.2} avail_p50_ms_empty={:.2} avail_p50_ms_full={:.2} existing={held} tenants={n_tenants}",
        empty.per_second(),
        full.per_second(),
        ms(percentile(&empty.latencies, 99.0)),
        ms(percentile(&full.latencies, 99.0)),
        ms(percentile(&avail_empty, 50.0)),
        ms(percentile(&avail_full, 50.0)),
    );
    if let Some(c) = &cluster {
        println!(
            "BENCH cluster_create nodes={} create_s={:.2} read_p99_ms_idle={:.2} read_p99_ms_during={:.2} write_p99_ms_idle={:.2} write_p99_ms_during={:.2}",
            c.nodes,
            c.create.as_secs_f64(),
            ms(percentile(&c.idle.0, 99.0)),
            ms(percentile(&c.during.0, 99.0)),
            ms(percentile(&c.idle.1, 99.0)),
            ms(percentile(&c.during.1, 99.0)),
        );
    }
    drop(clients);
    drop(admin);
    tokio::task::spawn_blocking(move || drop(backend))
        .await
        .expect("stop the backend");
}
