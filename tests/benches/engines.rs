//! The store's two engines side by side (issue 41, "Measured"): admission on SQLite and on
//! PostgreSQL with one and three replicas, failover times, and one Terraform apply's wall
//! time on each. Prints tables; nothing is asserted (the numbers are this machine's).
//!
//! 1. **Admission.** Three control planes run at once: one `serve` on SQLite (the
//!    baseline, its fleet embedded from a fleet file), one `serve --postgres` replica and
//!    three replicas on one PostgreSQL server (each plane its own server, started by
//!    `gpufleet_sql::test_server`). Every plane has the same fleet: `POOL` (default 32)
//!    8-GPU H100 pool nodes; on PostgreSQL these are simulated node agents (`gpufleet-agent
//!    node`, `--node-agents external`, the tested path: a follower turns embedded agents
//!    away). 32 and not admission_scale's 1,000: each is a process, and two planes' worth
//!    must share this machine's 2 cores with three control planes. So that 10,000
//!    reservations still fit a fleet that small, windows are 1 to 8 hours long (not 1 to
//!    48), starting within the next year: about 16% of the pool's node-hours. `TENANTS`
//!    (default 4) share the pool's GPUs as guarantees. Each plane is seeded with `EXISTING`
//!    (default 10,000) reservations through the API, then measured in `ROUNDS` (default 3)
//!    rounds of `MEASURED` (default 500) creates from `CLIENTS` (default 8) concurrent
//!    clients, each on its own connection; on three replicas client i calls replica i % 3,
//!    so two thirds of the calls are forwarded by a follower to the leader. The planes'
//!    rounds alternate (which goes first rotates) and each round's reservations are deleted
//!    after it, so every round starts from the same holdings; the table gives the rounds'
//!    medians.
//! 2. **Leader replica lost** (`TTLS`, default "15s,3s": each a fresh set of three
//!    replicas with that `--lease-ttl`, `--node-timeout 2s --replace-after 1s`, and three
//!    2-GPU node agents). A 1-node cluster with a MIG layout runs on one of them. At the
//!    same instant the leader replica and the cluster's node agent are killed with
//!    SIGKILL. Measured from that instant: (a) the next successful reservation create, a
//!    client that retries the same `request_id` on the two other replicas in turn (as the
//!    provider does); (b) the replacement node assigned to the cluster (the dead node out
//!    of its node list, another in: the new leader's replacement, after the node timeout
//!    and `--replace-after`); (c) the cluster `running` again: the replacement's MIG order
//!    answered. `FAILOVER_ROUNDS` (default 3) kills per TTL; the killed replica and agent
//!    are started again between them.
//! 3. **Database primary lost** (only with `PATRONI=1`, as root: namespace hosts): a
//!    three-member Patroni cluster, one replica on a fourth host that reaches it by the
//!    multi-host URL (`target_session_attrs=read-write`); the primary is killed (SIGKILL)
//!    and the time to the next successful create (same `request_id`, retried) measured.
//! 4. **Terraform.** The same configuration (a tenant, its quota, a 1-node pool cluster and
//!    a 1-node reservation) applied on each admission plane, so at `EXISTING` reservations:
//!    `APPLIES` (default 2) applies each, alternating planes, destroyed in between (not
//!    measured); the median apply's wall time. On three replicas the provider's endpoints
//!    list two followers first, so every call is forwarded.
//!
//! Uses the debug build (`target/debug`, or `GPUFLEET_AGENT_BIN`): a release build of the
//! workspace takes long on 2 cores, and the comparison is between engines of one build.
//! Seeding through the API runs at about 150 creates/s on PostgreSQL here (2,000/s on
//! SQLite), so `EXISTING` keeps the issue's 10,000 (about 70 s per PostgreSQL plane); the
//! whole default run takes about 6 minutes on 2 cores (with `PATRONI=1`).
//!
//! `source scripts/env.sh; cargo build --workspace --bins; cargo bench -p gpufleet-e2e --bench engines`

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_e2e::fixtures::{create_quota, create_tenant};
use gpufleet_e2e::replicas::Replicas;
use gpufleet_e2e::{hcl, Backend, Clients, Terraform};
use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::{
    CreateGpuQuotaRequest, CreateReservationRequest, CreateTenantClusterRequest,
    CreateTenantRequest, DeleteReservationRequest, GetTenantClusterRequest,
    ListReservationsRequest,
};
use tokio::task::block_in_place;

const GPU_TYPE: &str = "H100-80GB";
const HOUR: i64 = 3_600;
const YEAR: i64 = 365 * 24 * HOUR;
/// Nodes of the pool kept out of the admission tenants' guarantees: the Terraform
/// tenant's quota.
const TERRAFORM_NODES: i64 = 2;
/// One call of a retrying client waits this long for its answer.
const CALL_LIMIT: Duration = Duration::from_secs(5);
/// A retrying client's pause between two tries.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// A safety net for a failover that never ends (a hang, not a timing assertion).
const FAILOVER_LIMIT: Duration = Duration::from_secs(180);
/// The leader's log line when it takes the lease, and when it stops leading.
const LEADS: &str = "this replica leads";
const NO_LONGER_LEADS: &str = "this replica no longer leads";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// splitmix64: a seeded generator, so every plane is asked for the same windows.
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

    /// A window starting within the next year (at least an hour out), 1 to 8 hours long.
    fn window(&mut self, now: i64) -> (i64, i64) {
        let start = now + HOUR + self.below(YEAR);
        (start, start + HOUR + self.below(7 * HOUR))
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
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

fn median<T: Copy + PartialOrd>(values: &[T]) -> Option<T> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    v.get(v.len() / 2).copied()
}

/// What one batch of creates measured.
struct Batch {
    created: usize,
    refused: usize,
    wall: Duration,
    latencies: Vec<Duration>,
    /// The reservations it made, so a measurement round can take them back.
    ids: Vec<String>,
}

/// `count` 1-node creates from `clients` concurrently; request ids start at `first`.
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
    let refused = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let mut c = c.clone();
        let (next, latencies, ids, refused) = (
            next.clone(),
            latencies.clone(),
            ids.clone(),
            refused.clone(),
        );
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
                        if refused.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("create refused: {:?} {}", status.code(), status.message());
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
        created: latencies.len(),
        refused: refused.load(Ordering::Relaxed),
        wall,
        latencies,
        ids,
    }
}

/// Deletes `ids` from `clients` concurrently (not measured).
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

/// One control plane: a `serve` on SQLite, or replicas on PostgreSQL.
enum Plane {
    Sqlite(Backend),
    Postgres(Replicas),
}

impl Plane {
    fn replicas(&self) -> &[Backend] {
        match self {
            Plane::Sqlite(backend) => std::slice::from_ref(backend),
            Plane::Postgres(r) => &r.replicas,
        }
    }

    /// The provider's endpoints: the followers first (r1, r2, ..., then r0, which leads
    /// from the start), so that its calls are forwarded.
    fn endpoints_followers_first(&self) -> String {
        let replicas = self.replicas();
        let mut order: Vec<&Backend> = replicas.iter().skip(1).collect();
        order.push(&replicas[0]);
        order
            .iter()
            .map(|b| b.endpoint())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// One plane of the admission comparison, its clients and tenants.
struct Side {
    label: String,
    /// Taken (stopped) once the admission and Terraform measurements are done.
    plane: Option<Plane>,
    clients: Vec<Clients>,
    tenants: Vec<String>,
    /// Rounds' creates per second, p50 and p99.
    per_second: Vec<f64>,
    p50: Vec<Duration>,
    p99: Vec<Duration>,
    refused: usize,
    seeded: usize,
    seeding: Duration,
    /// The Terraform applies' wall times.
    applies: Vec<Duration>,
}

/// Flags of every admission plane: room for the seeded and measured reservations per
/// tenant, and for every node agent registering at once from loopback.
fn admission_flags(per_tenant: usize, pool: usize) -> Vec<String> {
    [
        "--max-open-reservations",
        &per_tenant.to_string(),
        "--max-candidates",
        &(pool + 8).to_string(),
        "--max-candidates-per-source",
        &(pool + 8).to_string(),
        "--health-interval",
        "0",
    ]
    .map(str::to_string)
    .to_vec()
}

/// Starts a plane: SQLite (`replicas` 0) or that many PostgreSQL replicas, with `pool`
/// nodes, `n_tenants` tenants sharing the pool less [`TERRAFORM_NODES`] as guarantees,
/// and `n_clients` connections (client i to replica i % replicas).
async fn side(
    label: &str,
    replicas: usize,
    pool: usize,
    flags: &[String],
    n_tenants: usize,
    n_clients: usize,
) -> Side {
    let booted = Instant::now();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let plane = if replicas == 0 {
        let fleet = format!("[[pool]]\ngpu_type = \"{GPU_TYPE}\"\nnodes = {pool}\n");
        Plane::Sqlite(block_in_place(|| {
            Backend::start_with_fleet_and_args(&fleet, &flags)
        }))
    } else {
        let mut r = block_in_place(|| Replicas::start(replicas, "15s", &flags));
        for n in 0..pool {
            r.start_node(&format!("h100-{n}"), &["--capacity", "pool", "--gpus", "8"]);
        }
        r.wait_ready(0, pool).await;
        Plane::Postgres(r)
    };
    eprintln!(
        "{label}: ready with {pool} nodes in {:.1} s",
        booted.elapsed().as_secs_f64()
    );
    let mut admin = plane.replicas()[0].admin().await;
    let gpus_each = (pool as i64 - TERRAFORM_NODES) * 8 / n_tenants as i64;
    let mut tenants = Vec::new();
    for k in 0..n_tenants {
        let (tenant, _) = create_tenant(&mut admin, &format!("bench-{k}")).await;
        create_quota(&mut admin, &tenant.id, GPU_TYPE, gpus_each, 0).await;
        tenants.push(tenant.id);
    }
    let mut clients = Vec::new();
    for i in 0..n_clients {
        let replicas = plane.replicas();
        clients.push(replicas[i % replicas.len()].admin().await);
    }
    Side {
        label: label.to_string(),
        plane: Some(plane),
        clients,
        tenants,
        per_second: Vec::new(),
        p50: Vec::new(),
        p99: Vec::new(),
        refused: 0,
        seeded: 0,
        seeding: Duration::ZERO,
        applies: Vec::new(),
    }
}

/// One measured round on `s`: `measured` creates (ids from `first`), then taken back.
async fn round(s: &mut Side, first: usize, measured: usize, seed: u64) {
    let b = creates(&s.clients, &s.tenants, first, measured, seed).await;
    s.per_second
        .push(b.created as f64 / b.wall.as_secs_f64().max(1e-9));
    s.p50.push(percentile(&b.latencies, 50.0));
    s.p99.push(percentile(&b.latencies, 99.0));
    s.refused += b.refused;
    delete_all(&s.clients, b.ids).await;
}

/// The Terraform configuration every plane applies: a tenant, its quota, a 1-node pool
/// cluster and a 1-node reservation 30 days out.
fn terraform_config() -> String {
    let rfc3339 = |t: i64| {
        time::OffsetDateTime::from_unix_timestamp(t)
            .expect("a valid time")
            .format(&time::format_description::well_known::Rfc3339)
            .expect("RFC 3339")
    };
    // Whole hours, so that the configuration is the same text on every plane.
    let start = (now() / HOUR + 30 * 24) * HOUR;
    hcl::config(&[
        hcl::tenant("t", "tf-bench"),
        hcl::quota("q", "gpufleet_tenant.t.id", GPU_TYPE, TERRAFORM_NODES * 8),
        hcl::pool_cluster("c", "gpufleet_tenant.t.id", "train", GPU_TYPE, 1)
            .depends_on(&["gpufleet_gpu_quota.q"]),
        hcl::reservation(
            "r",
            "gpufleet_tenant.t.id",
            GPU_TYPE,
            1,
            &rfc3339(start),
            &rfc3339(start + 4 * HOUR),
        )
        .depends_on(&["gpufleet_gpu_quota.q"]),
    ])
}

/// Creates a reservation with one `request_id` until some replica of `clients` answers
/// it (each try on the next client, as the provider goes round its endpoints): how long
/// that took from `since`, and the tries.
async fn create_until_ok(
    clients: &[Clients],
    request: CreateReservationRequest,
    since: Instant,
) -> (Duration, usize) {
    let mut tries = 0;
    loop {
        let mut c = clients[tries % clients.len()].clone();
        tries += 1;
        let mut call = tonic::Request::new(request.clone());
        call.set_timeout(CALL_LIMIT);
        let answer = tokio::time::timeout(CALL_LIMIT, c.reservations.create_reservation(call));
        if let Ok(Ok(_)) = answer.await {
            return (since.elapsed(), tries);
        }
        assert!(
            since.elapsed() < FAILOVER_LIMIT,
            "no create answered within {FAILOVER_LIMIT:?}"
        );
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// The replica of `r` that leads now, by its log since it last started (`log_from`):
/// its last leadership line says it leads.
fn leader(r: &Replicas, log_from: &[usize]) -> Option<usize> {
    r.replicas.iter().enumerate().find_map(|(i, b)| {
        b.pid()?;
        let log = b.log();
        let since = &log[log_from[i].min(log.len())..];
        let leads = since.rfind(LEADS)?;
        let lost = since.rfind(NO_LONGER_LEADS);
        (lost.is_none_or(|l| l < leads)).then_some(i)
    })
}

async fn wait_leader(r: &Replicas, log_from: &[usize]) -> usize {
    let since = Instant::now();
    loop {
        if let Some(i) = leader(r, log_from) {
            return i;
        }
        assert!(
            since.elapsed() < FAILOVER_LIMIT,
            "no replica leads\n{}",
            r.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one kill of the leader measured.
struct Failover {
    create: Duration,
    create_tries: usize,
    assigned: Duration,
    running: Duration,
}

/// Three replicas with lease TTL `ttl` and three 2-GPU node agents; `rounds` times the
/// leader and the cluster's node agent are killed together and the failover measured.
async fn leader_failovers(ttl: &str, rounds: usize) -> Vec<Failover> {
    let mut r = block_in_place(|| {
        Replicas::start(
            3,
            ttl,
            &[
                "--node-timeout",
                "2s",
                "--replace-after",
                "1s",
                "--health-interval",
                "0",
            ],
        )
    });
    for n in 0..3 {
        r.start_node(&format!("n{n}"), &["--capacity", "pool", "--gpus", "2"]);
    }
    r.wait_ready(0, 3).await;
    let mut log_from = vec![0; 3];
    let mut admin = r.replicas[0].admin().await;
    let (tenant, _) = create_tenant(&mut admin, "failover").await;
    create_quota(&mut admin, &tenant.id, GPU_TYPE, 4, 0).await;
    // A MIG layout, so that a replacement takes an order before the cluster runs again.
    let cluster = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: "failover-cluster".into(),
            tenant_id: tenant.id.clone(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: GPU_TYPE.into(),
            node_count: 1,
            storage_gib: 10,
            mig_layout: [("3g.40gb".to_string(), 2)].into_iter().collect(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTenantCluster: {s}"))
        .into_inner();
    let mut out = Vec::new();
    let mut clients: HashMap<usize, Clients> = HashMap::new();
    for i in 0..3 {
        clients.insert(i, r.replicas[i].admin().await);
    }
    for k in 0..rounds {
        let lead = wait_leader(&r, &log_from).await;
        let mut watcher = clients[&((lead + 2) % 3)].clone();
        let now_in = watcher
            .clusters
            .get_tenant_cluster(GetTenantClusterRequest {
                id: cluster.id.clone(),
            })
            .await
            .unwrap_or_else(|s| panic!("GetTenantCluster: {s}"))
            .into_inner();
        let dead = now_in.nodes[0].hostname.clone();
        let agent = r
            .nodes
            .iter()
            .position(|n| n.name == dead)
            .expect("the cluster's node is one of ours");
        let survivors: Vec<Clients> = [(lead + 1) % 3, (lead + 2) % 3]
            .iter()
            .map(|i| clients[i].clone())
            .collect();
        let request = CreateReservationRequest {
            request_id: format!("failover-{ttl}-{k}"),
            tenant_id: tenant.id.clone(),
            gpu_type: GPU_TYPE.into(),
            node_count: 1,
            start_time: Some(from_unix(now() + 2 * HOUR)),
            end_time: Some(from_unix(now() + 3 * HOUR)),
            ..Default::default()
        };
        let killed = Instant::now();
        block_in_place(|| {
            r.replicas[lead].crash();
            r.nodes[agent].kill9();
        });
        let creating = tokio::spawn({
            let survivors = survivors.clone();
            async move { create_until_ok(&survivors, request, killed).await }
        });
        // The cluster as the surviving replicas answer it, until it runs on another node.
        let mut assigned = None;
        let mut polls = 0usize;
        let running = loop {
            let mut c = survivors[polls % 2].clone();
            polls += 1;
            let mut call = tonic::Request::new(GetTenantClusterRequest {
                id: cluster.id.clone(),
            });
            call.set_timeout(CALL_LIMIT);
            if let Ok(answer) = c.clusters.get_tenant_cluster(call).await {
                let c = answer.into_inner();
                let replaced = !c.nodes.is_empty() && c.nodes.iter().all(|n| n.hostname != dead);
                if replaced && assigned.is_none() {
                    assigned = Some(killed.elapsed());
                }
                if replaced && c.status == "running" {
                    break killed.elapsed();
                }
            }
            assert!(
                killed.elapsed() < FAILOVER_LIMIT,
                "{dead} not replaced within {FAILOVER_LIMIT:?}\n{}",
                r.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (create, create_tries) = creating.await.expect("the create task");
        let f = Failover {
            create,
            create_tries,
            assigned: assigned.unwrap_or(running),
            running,
        };
        eprintln!(
            "ttl {ttl}, kill {k}: r{lead} and {dead} killed; create {:.2} s ({} tries), replacement assigned {:.2} s, running {:.2} s",
            f.create.as_secs_f64(),
            f.create_tries,
            f.assigned.as_secs_f64(),
            f.running.as_secs_f64()
        );
        out.push(f);
        // Back as they were: the reservation gone, the killed replica a follower, the
        // killed agent's node free again.
        let mut any = survivors[0].clone();
        let held = any
            .reservations
            .list_reservations(ListReservationsRequest::default())
            .await
            .unwrap_or_else(|s| panic!("ListReservations: {s}"))
            .into_inner()
            .reservations;
        for res in held {
            let _ = any
                .reservations
                .delete_reservation(DeleteReservationRequest { id: res.id })
                .await;
        }
        log_from[lead] = r.replicas[lead].log().len();
        block_in_place(|| {
            r.replicas[lead].start_again();
            r.nodes[agent].restart();
        });
        clients.insert(lead, r.replicas[lead].admin().await);
        let lead_now = wait_leader(&r, &log_from).await;
        r.wait_ready(lead_now, 3).await;
    }
    block_in_place(move || drop(r));
    out
}

/// The database's primary lost under one replica (Patroni on namespace hosts): the
/// time from the kill to the next successful create, and its tries. `Err`: why not run.
async fn database_failover() -> Result<(Duration, usize, String), String> {
    use gpufleet_e2e::netns::{self, Network};
    use gpufleet_e2e::patroni::PatroniCluster;
    use gpufleet_e2e::NodeAgent;
    use std::os::unix::fs::PermissionsExt;

    if std::env::var("PATRONI").ok().as_deref() != Some("1") {
        return Err("not run: set PATRONI=1 (needs root, namespace hosts, Debian's postgresql and patroni; about a minute)".into());
    }
    if let Some(why) = netns::unavailable() {
        return Err(format!("not run: {why}"));
    }
    let members = ["pg1", "pg2", "pg3"];
    let net = block_in_place(|| Network::new(&["pg1", "pg2", "pg3", "cp"]));
    let mut cluster = block_in_place(|| PatroniCluster::start(&net, &members));
    let cp = net.host("cp");
    block_in_place(|| cluster.psql(cp, &cluster.url("postgres"), "CREATE DATABASE gpufleet"))
        .map_err(|e| format!("CREATE DATABASE: {e}"))?;
    let file = cp.dir().join("database.url");
    std::fs::write(&file, cluster.url("gpufleet")).expect("write the database file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
        .expect("chmod the database file");
    let file = file.display().to_string();
    let backend = block_in_place(|| {
        Backend::start_on(
            cp,
            cp,
            &[
                "--postgres",
                "--database-file",
                &file,
                "--node-agents",
                "external",
                "--replica-id",
                "r0",
                "--health-interval",
                "0",
            ],
        )
    });
    let _node = block_in_place(|| {
        NodeAgent::start_on(cp, &backend, "n0", &["--capacity", "pool", "--gpus", "8"])
    });
    let mut admin = backend.admin().await;
    let since = Instant::now();
    while !admin
        .nodes()
        .await
        .iter()
        .any(|n| n.hostname == "n0" && n.state == "ready")
    {
        assert!(since.elapsed() < FAILOVER_LIMIT, "n0 not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tenant = admin
        .tenants
        .create_tenant(CreateTenantRequest {
            request_id: "db-tenant".into(),
            name: "db".into(),
            display_name: "Database failover".into(),
            ..Default::default()
        })
        .await
        .map_err(|s| format!("CreateTenant: {s}"))?
        .into_inner()
        .tenant
        .expect("the tenant");
    admin
        .quotas
        .create_gpu_quota(CreateGpuQuotaRequest {
            request_id: "db-quota".into(),
            tenant_id: tenant.id.clone(),
            gpu_type: GPU_TYPE.into(),
            gpus: 8,
            ..Default::default()
        })
        .await
        .map_err(|s| format!("CreateGpuQuota: {s}"))?;
    let request = |k: i64| CreateReservationRequest {
        request_id: format!("db-{k}"),
        tenant_id: tenant.id.clone(),
        gpu_type: GPU_TYPE.into(),
        node_count: 1,
        start_time: Some(from_unix(now() + (2 + 2 * k) * HOUR)),
        end_time: Some(from_unix(now() + (3 + 2 * k) * HOUR)),
        ..Default::default()
    };
    // Writes before the kill, so that the primary dies with a history behind it.
    for k in 0..5 {
        create_until_ok(std::slice::from_ref(&admin), request(k), Instant::now()).await;
    }
    let killed = Instant::now();
    let primary = block_in_place(|| cluster.kill_primary());
    let (took, tries) = create_until_ok(std::slice::from_ref(&admin), request(5), killed).await;
    // Dropped in reverse order: the agent, serve, the cluster, then the hosts.
    Ok((took, tries, primary))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes `--bench`; no other arguments are taken.
    let existing = env_usize("EXISTING", 10_000);
    let measured = env_usize("MEASURED", 500);
    let n_rounds = env_usize("ROUNDS", 3).max(1);
    let n_clients = env_usize("CLIENTS", 8).max(1);
    let n_tenants = env_usize("TENANTS", 4).max(1);
    let pool = env_usize("POOL", 32).max(TERRAFORM_NODES as usize + 1);
    let applies = env_usize("APPLIES", 2);
    let failover_rounds = env_usize("FAILOVER_ROUNDS", 3);
    let ttls: Vec<String> = std::env::var("TTLS")
        .unwrap_or_else(|_| "15s,3s".into())
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    eprintln!("agent: {}", gpufleet_e2e::binaries::agent().display());
    let began = Instant::now();

    let per_tenant = (existing + measured).div_ceil(n_tenants) + 16;
    let flags = admission_flags(per_tenant, pool);
    let mut sides = Vec::new();
    for (label, replicas) in [
        ("SQLite, 1 serve (baseline)", 0),
        ("PostgreSQL, 1 replica", 1),
        ("PostgreSQL, 3 replicas", 3),
    ] {
        sides.push(side(label, replicas, pool, &flags, n_tenants, n_clients).await);
    }
    for s in &mut sides {
        let t0 = Instant::now();
        let seed = creates(&s.clients, &s.tenants, 0, existing, 2).await;
        s.seeded = seed.created;
        s.seeding = t0.elapsed();
        eprintln!(
            "{}: seeded {} reservations in {:.1} s ({} refused)",
            s.label,
            seed.created,
            s.seeding.as_secs_f64(),
            seed.refused
        );
    }
    let mut first = existing;
    for r in 0..n_rounds {
        // Which plane goes first rotates: what else the machine does falls on all alike.
        for k in 0..sides.len() {
            let i = (r + k) % sides.len();
            round(&mut sides[i], first, measured, 10 + r as u64).await;
        }
        first += measured;
    }
    eprintln!("admission done at {:.0} s", began.elapsed().as_secs_f64());

    // The same Terraform apply on each plane, alternating, destroyed in between.
    let tfs: Vec<Terraform> = sides
        .iter()
        .map(|s| {
            let plane = s.plane.as_ref().expect("the plane runs");
            let tf = Terraform::detached(
                &plane.endpoints_followers_first(),
                plane.replicas()[0].admin_token(),
            );
            tf.write_main(&terraform_config());
            block_in_place(|| tf.init());
            tf
        })
        .collect();
    for a in 0..applies {
        for k in 0..sides.len() {
            let i = (a + k) % sides.len();
            let t0 = Instant::now();
            let run = block_in_place(|| tfs[i].apply());
            sides[i].applies.push(t0.elapsed());
            let summary = run.output();
            let summary = summary
                .lines()
                .find(|l| l.contains("Apply complete"))
                .unwrap_or("no summary");
            eprintln!("{}: {summary}", sides[i].label);
            block_in_place(|| tfs[i].destroy());
        }
    }
    drop(tfs);
    eprintln!("terraform done at {:.0} s", began.elapsed().as_secs_f64());
    // Stopped before the failovers, which want the machine to themselves.
    let stopped: Vec<Plane> = sides.iter_mut().filter_map(|s| s.plane.take()).collect();
    block_in_place(move || drop(stopped));

    let mut failovers = Vec::new();
    for ttl in &ttls {
        failovers.push((ttl.clone(), leader_failovers(ttl, failover_rounds).await));
    }
    eprintln!(
        "leader failovers done at {:.0} s",
        began.elapsed().as_secs_f64()
    );
    let database = database_failover().await;

    println!();
    println!(
        "Admission: {pool} x 8-GPU {GPU_TYPE} pool nodes on every plane (SQLite: embedded from a fleet file; PostgreSQL: node agent processes), {n_tenants} tenants, 1-node reservations in random windows (start within a year, 1-8 h), {n_clients} clients (3 replicas: client i to replica i % 3); each plane seeded through the API, then {n_rounds} rounds of {measured} creates per plane, alternating, each round's reservations deleted after it; medians of the rounds"
    );
    println!();
    println!(
        "| plane | existing | creates/s | p50 | p99 | creates/s vs SQLite | seeding (creates/s) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let base_rate = median(&sides[0].per_second).unwrap_or(0.0);
    for s in &sides {
        let rate = median(&s.per_second).unwrap_or(0.0);
        println!(
            "| {} | {} | {rate:.1} | {:.2} ms | {:.2} ms | {:.2}x | {:.1} s ({:.1}/s) |",
            s.label,
            s.seeded,
            ms(median(&s.p50).unwrap_or_default()),
            ms(median(&s.p99).unwrap_or_default()),
            rate / base_rate,
            s.seeding.as_secs_f64(),
            s.seeded as f64 / s.seeding.as_secs_f64().max(1e-9),
        );
    }
    for s in &sides {
        let rounds: Vec<String> = s
            .per_second
            .iter()
            .zip(&s.p99)
            .map(|(rate, p99)| format!("{rate:.0}/s p99 {:.1} ms", ms(*p99)))
            .collect();
        println!("\nrounds, {}: {}", s.label, rounds.join(", "));
        if s.refused > 0 {
            println!("refused creates while measured, {}: {}", s.label, s.refused);
        }
    }

    println!();
    println!(
        "Terraform: one apply of a tenant, its quota, a 1-node pool cluster and a 1-node reservation, on each admission plane (at its existing reservations); {applies} applies each, alternating, destroyed in between; 3 replicas: the provider's endpoints list the two followers first"
    );
    println!();
    println!("| plane | apply wall time (median) | vs SQLite | every apply |");
    println!("|---|---|---|---|");
    let base_apply = median(&sides[0].applies).unwrap_or_default();
    for s in &sides {
        let m = median(&s.applies).unwrap_or_default();
        let all: Vec<String> = s
            .applies
            .iter()
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .collect();
        println!(
            "| {} | {:.2} s | {:.2}x | {} |",
            s.label,
            m.as_secs_f64(),
            m.as_secs_f64() / base_apply.as_secs_f64().max(1e-9),
            all.join(", ")
        );
    }

    println!();
    println!(
        "Leader replica lost: 3 replicas on one PostgreSQL server, --node-timeout 2s --replace-after 1s, three 2-GPU node agents, a 1-node cluster with a MIG layout; the leader replica and the cluster's node agent killed (SIGKILL) at the same instant; times from that instant; {failover_rounds} kills per TTL (median, then each)"
    );
    println!();
    println!("| lease TTL | next create (retried on the survivors) | replacement node assigned | cluster running on it (MIG order answered) | every kill: create / assigned / running |");
    println!("|---|---|---|---|---|");
    for (ttl, runs) in &failovers {
        let pick = |f: fn(&Failover) -> Duration| {
            median(&runs.iter().map(f).collect::<Vec<_>>()).unwrap_or_default()
        };
        let each: Vec<String> = runs
            .iter()
            .map(|f| {
                format!(
                    "{:.2} / {:.2} / {:.2} s",
                    f.create.as_secs_f64(),
                    f.assigned.as_secs_f64(),
                    f.running.as_secs_f64()
                )
            })
            .collect();
        println!(
            "| {ttl} | {:.2} s | {:.2} s | {:.2} s | {} |",
            pick(|f| f.create).as_secs_f64(),
            pick(|f| f.assigned).as_secs_f64(),
            pick(|f| f.running).as_secs_f64(),
            each.join("; ")
        );
    }

    println!();
    println!("Database primary lost: Patroni, 3 members with synchronous replication on namespace hosts, one replica on a fourth host by the multi-host URL; the primary killed (SIGKILL)");
    println!();
    match database {
        Ok((took, tries, primary)) => {
            println!("| measure | time |");
            println!("|---|---|");
            println!(
                "| {primary} killed to the next successful create ({tries} tries) | {:.2} s |",
                took.as_secs_f64()
            );
        }
        Err(why) => println!("{why}"),
    }
    eprintln!("done in {:.0} s", began.elapsed().as_secs_f64());
}
