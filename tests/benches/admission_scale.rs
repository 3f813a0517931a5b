//! Admission at scale, measured from outside through the gRPC API (issue 7).
//!
//! Starts two real `gpufleet-agent serve` processes (release build: `$GPUFLEET_AGENT_BIN`,
//! else `target/release/gpufleet-agent`), each with a simulated fleet of 1,000 8-GPU H100
//! pool nodes and 16 tenants sharing a quota for all of them (serve's limit of open
//! reservations per tenant raised to fit). One stays empty: the same run's baseline. The
//! other is seeded with 10,000 reservations. Both are then measured in alternating rounds:
//! each round creates 1-node reservations in random windows (start within the next year, 1
//! to 48 hours long) from 8 concurrent clients, each on its own connection, and deletes
//! them afterwards, so every round starts from the same holdings. Alternating puts what
//! else the machine does on both sides alike; the table gives the rounds' medians, and one
//! availability query's latency on each side. Last, it creates one large tenant cluster
//! (`CLUSTER_NODES`, default 1,000, from a second pool of A100 nodes on the seeded
//! backend) and measures reads and reservation creates made while it is created, against
//! the same calls made for as long right after it. Prints tables; nothing is asserted.
//!
//! `cargo build --release -p gpufleet-agent --bins && cargo bench -p gpufleet-e2e --bench admission_scale`
//! Environment: `EXISTING` (default 10000), `MEASURED` (creates per round, default 2000),
//! `ROUNDS` (per side, default 5), `CLIENTS` (default 8), `TENANTS` (default 16),
//! `CLUSTER_NODES` (default 1000; 0 skips the cluster measurement).
//!
//! `COMPARE=durability` compares commit durability instead (issue 19): both backends hold
//! `EXISTING` (default 0) reservations, the baseline with `serve --durability normal`
//! (SQLite `synchronous=NORMAL`), the other with `--durability full` (each commit
//! fsynced); `CLUSTER_NODES` defaults to 0.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_e2e::{Backend, Clients};
use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::{
    AvailabilityRequest, CreateGpuQuotaRequest, CreateReservationRequest,
    CreateTenantClusterRequest, CreateTenantRequest, DeleteReservationRequest,
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
    /// The reservations it made, so a measurement round can take them back.
    ids: Vec<String>,
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
    let ids = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let failed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let mut c = c.clone();
        let (next, latencies, failed) = (next.clone(), latencies.clone(), failed.clone());
        let ids = ids.clone();
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
                    Ok(r) => {
                        latencies.lock().unwrap().push(took);
                        ids.lock().unwrap().push(r.into_inner().id);
                    }
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
    let ids = std::mem::take(&mut *ids.lock().unwrap());
    Batch {
        creates: latencies.len(),
        failed: failed.load(Ordering::Relaxed),
        wall,
        latencies,
        ids,
    }
}

/// Deletes `ids` from `clients` concurrently (not measured): a round leaves the backend
/// holding what it held before it.
async fn delete_all(clients: &[Clients], ids: Vec<String>) {
    let ids = Arc::new(Mutex::new(ids));
    let mut tasks = Vec::new();
    for c in clients {
        let (mut c, ids) = (c.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(id) = ids.lock().unwrap().pop() else {
                    break;
                };
                c.reservations
                    .delete_reservation(DeleteReservationRequest { id })
                    .await
                    .unwrap_or_else(|s| panic!("DeleteReservation: {s}"));
            }
        }));
    }
    for t in tasks {
        t.await.expect("delete task");
    }
}

/// What the rounds at one point measured: each round's rate and latency percentiles.
#[derive(Default)]
struct Rounds {
    per_second: Vec<f64>,
    p50: Vec<Duration>,
    p99: Vec<Duration>,
    max: Duration,
    failed: usize,
}

impl Rounds {
    fn add(&mut self, b: &Batch) {
        self.per_second.push(b.per_second());
        self.p50.push(percentile(&b.latencies, 50.0));
        self.p99.push(percentile(&b.latencies, 99.0));
        self.max = self.max.max(*b.latencies.last().unwrap_or(&Duration::ZERO));
        self.failed += b.failed;
    }
}

fn median_f64(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn median(values: &[Duration]) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or(Duration::ZERO)
}

/// One backend of the comparison: its admin clients and its tenants.
struct Side {
    backend: Backend,
    admin: Clients,
    clients: Vec<Clients>,
    tenants: Vec<String>,
}

/// Starts a backend on `fleet` with `flags`, with `n_tenants` tenants sharing the pool's
/// GPUs as guarantees (their sum may not exceed the pool), and `n_clients` connections.
async fn side(fleet: String, flags: Vec<String>, n_tenants: usize, n_clients: usize) -> Side {
    let booted = Instant::now();
    let backend = tokio::task::spawn_blocking(move || {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Backend::start_with_fleet_and_args(&fleet, &flags)
    })
    .await
    .expect("start the backend");
    eprintln!("backend ready in {:.1} s", booted.elapsed().as_secs_f64());
    let mut admin = backend.admin().await;
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
    Side {
        backend,
        admin,
        clients,
        tenants,
    }
}

/// One measured round on `s`: `measured` creates (ids from `first`), then taken back.
async fn round(s: &Side, rounds: &mut Rounds, first: usize, measured: usize, seed: u64) {
    let b = creates(&s.clients, &s.tenants, first, measured, seed).await;
    rounds.add(&b);
    delete_all(&s.clients, b.ids).await;
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

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes `--bench`; no other arguments are taken.
    let existing = env_usize("EXISTING", 10_000);
    let measured = env_usize("MEASURED", 2_000);
    let n_rounds = env_usize("ROUNDS", 5).max(1);
    let n_clients = env_usize("CLIENTS", 8).max(1);
    let n_tenants = env_usize("TENANTS", 16).clamp(1, POOL_NODES as usize);
    let durability = std::env::var("COMPARE").is_ok_and(|v| v == "durability");
    let existing = if durability {
        env_usize("EXISTING", 0)
    } else {
        existing
    };
    let agent = gpufleet_e2e::binaries::release_agent();
    assert!(
        agent.is_file(),
        "{} not found: build it with `cargo build --release -p gpufleet-agent --bins` or set {}",
        agent.display(),
        gpufleet_e2e::binaries::AGENT_ENV
    );
    std::env::set_var(gpufleet_e2e::binaries::AGENT_ENV, &agent);
    eprintln!("agent: {}", agent.display());
    let cluster_nodes = env_usize("CLUSTER_NODES", if durability { 0 } else { 1_000 }).min(10_000);
    // Room for the seeded and measured creates and, around the cluster create, the probes.
    let per_tenant = (existing + measured + PROBE_ALLOWANCE).div_ceil(n_tenants) + 1;
    let flags = limit_flags(&agent, per_tenant);
    let pool = format!("[[pool]]\ngpu_type = \"{GPU_TYPE}\"\nnodes = {POOL_NODES}\n");
    let mut fleet = pool.clone();
    if cluster_nodes > 0 {
        fleet += &format!("[[pool]]\ngpu_type = \"{CLUSTER_GPU_TYPE}\"\nnodes = {cluster_nodes}\n");
    }
    // Two backends side by side: the baseline stays empty, the other holds `existing`
    // (or, comparing durability, both hold it and differ in --durability). Their rounds
    // alternate, so what else the machine does falls on both alike.
    let (base_flags, other_flags, base_label, other_label) = if durability {
        let with = |d: &str| {
            let mut f = flags.clone();
            f.extend(["--durability".to_string(), d.to_string()]);
            f
        };
        (
            with("normal"),
            with("full"),
            "durability normal".to_string(),
            "durability full".to_string(),
        )
    } else {
        (
            flags.clone(),
            flags,
            "0 existing".to_string(),
            String::new(),
        )
    };
    let empty = side(
        if durability { fleet.clone() } else { pool },
        base_flags,
        n_tenants,
        n_clients,
    )
    .await;
    let mut full = side(fleet, other_flags, n_tenants, n_clients).await;

    let (mut avail_empty, mut open_empty) = availability(&empty.clients[0], 100, 7).await;
    let seeding = Instant::now();
    let seed = creates(&full.clients, &full.tenants, 0, existing, 2).await;
    let held = seed.creates;
    eprintln!(
        "seeded {held} reservations in {:.1} s ({} refused)",
        seeding.elapsed().as_secs_f64(),
        seed.failed
    );
    if durability && existing > 0 {
        // The baseline holds the same (the same seed: the same windows).
        creates(&empty.clients, &empty.tenants, 0, existing, 2).await;
        (avail_empty, open_empty) = availability(&empty.clients[0], 100, 7).await;
    }
    let (avail_full, open_full) = availability(&full.clients[0], 100, 8).await;

    let (mut at_empty, mut at_full) = (Rounds::default(), Rounds::default());
    let mut first = held;
    for r in 0..n_rounds {
        let seed = 10 + r as u64;
        // Which side goes first alternates too.
        if r % 2 == 0 {
            round(&empty, &mut at_empty, first, measured, seed).await;
            round(&full, &mut at_full, first, measured, seed).await;
        } else {
            round(&full, &mut at_full, first, measured, seed).await;
            round(&empty, &mut at_empty, first, measured, seed).await;
        }
        first += measured;
    }

    let cluster = if cluster_nodes > 0 {
        Some(
            during_cluster_create(
                &full.clients,
                &mut full.admin,
                &full.tenants,
                first,
                cluster_nodes as i64,
            )
            .await,
        )
    } else {
        None
    };

    let existing_text = if durability {
        other_label
    } else {
        format!("{held} existing")
    };
    let sides = if durability {
        format!("both holding {held}, one with serve --durability normal (SQLite synchronous=NORMAL) and one with --durability full (synchronous=FULL, each commit fsynced)")
    } else {
        format!("one empty and one holding {held}")
    };
    println!();
    println!(
        "Admission: {POOL_NODES} x 8-GPU {GPU_TYPE} pool nodes, {n_tenants} tenants (the pool's GPUs shared out as guarantees), 1-node reservations in random windows (start within a year, 1-48 h), {n_clients} clients; {n_rounds} rounds of {measured} creates on each of two backends, {sides}, alternating; each round's reservations are deleted after it; medians of the rounds"
    );
    println!();
    println!("| measure | {base_label} (baseline) | {existing_text} | ratio |");
    println!("|---|---|---|---|");
    let row = |name: &str, base: f64, now: f64, unit: &str| {
        println!(
            "| {name} | {base:.2} {unit} | {now:.2} {unit} | {:.2}x |",
            now / base
        );
    };
    let (rate_empty, rate_full) = (
        median_f64(&at_empty.per_second),
        median_f64(&at_full.per_second),
    );
    row("creates per second", rate_empty, rate_full, "/s");
    let (p50_empty, p50_full) = (ms(median(&at_empty.p50)), ms(median(&at_full.p50)));
    row("create latency p50", p50_empty, p50_full, "ms");
    let (p99_empty, p99_full) = (ms(median(&at_empty.p99)), ms(median(&at_full.p99)));
    row("create latency p99", p99_empty, p99_full, "ms");
    row(
        "create latency max (every round)",
        ms(at_empty.max),
        ms(at_full.max),
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
    let list = |r: &Rounds| {
        r.per_second
            .iter()
            .zip(&r.p99)
            .map(|(rate, p99)| format!("{rate:.0}/s p99 {:.2} ms", ms(*p99)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("\nrounds, {base_label}: {}", list(&at_empty));
    println!("rounds, {existing_text}: {}", list(&at_full));
    if at_empty.failed + at_full.failed > 0 {
        println!(
            "\nrefused creates: {} (baseline), {} (at {existing_text})",
            at_empty.failed, at_full.failed
        );
    }
    if let Some(c) = &cluster {
        print_during_cluster(c);
    }
    // Machine-readable lines for scripts/bench.sh.
    let bench = if durability {
        "durability"
    } else {
        "admission"
    };
    println!(
        "\nBENCH {bench} creates_per_s_empty={rate_empty:.0} creates_per_s_full={rate_full:.0} p99_ms_empty={p99_empty:.2} p99_ms_full={p99_full:.2} avail_p50_ms_empty={:.2} avail_p50_ms_full={:.2} existing={held} tenants={n_tenants} rounds={n_rounds}",
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
    let backends = [empty, full].map(|s| s.backend);
    tokio::task::spawn_blocking(move || drop(backends))
        .await
        .expect("stop the backends");
}
