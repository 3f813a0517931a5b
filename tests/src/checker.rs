//! The randomized concurrent checker (issue 41): clients of several tenants create,
//! resize and delete reservations and clusters over the real gRPC API, each with its own
//! tenant token, for a bounded time, while `serve` is killed with `kill -9` and started
//! again at random moments. Every acknowledged answer goes to a JSON-lines log (the
//! format of `gpufleet-agent check --answers`); at the end `gpufleet-agent check` reads
//! the store (while serve runs) and that log, and names every violation. Half-way it
//! checks the store alone while the clients write.
//!
//! A call that gets no answer (serve killed under it) is asked again until it is
//! answered, as the provider does: a create with the same `request_id`, a resize to the
//! same count, a delete (NOT_FOUND then acknowledges it). Each object belongs to the one
//! client that made it, so its answers are logged in the order they were given.
//!
//! Seeded (xorshift64*): the same seed makes the same choices, though the kills land
//! where the timing puts them. [`seed`] reads `GPUFLEET_CHECKER_SEED`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::{
    CreateReservationRequest, CreateTenantClusterRequest, DeleteReservationRequest,
    DeleteTenantClusterRequest, ListTenantClustersRequest, Reservation, TenantCluster,
    UpdateReservationRequest, UpdateTenantClusterRequest,
};
use serde_json::json;
use tonic::Code;

use crate::commands::output_within;
use crate::fixtures::{create_quota, create_tenant};
use crate::replicas::Replicas;
use crate::{binaries, Backend, Clients};

/// The env var that gives a seed back to rerun a run.
pub const SEED_ENV: &str = "GPUFLEET_CHECKER_SEED";

/// Six H100 pool nodes and three on demand, 8 GPUs each: small, so that the clients
/// compete for the last nodes and admission refuses often.
pub const FLEET: &str = "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 6\n\n[[on_demand]]\ngpu_type = \"H100-80GB\"\nnodes = 3\n";
const H100: &str = "H100-80GB";
/// Per tenant: 16 GPUs guaranteed (three tenants' guarantees fill the pool) + 24 burst.
const GUARANTEED: i64 = 16;
const BURST: i64 = 24;

/// How long a call that gets no answer is asked again before the run gives up (a
/// safety net for a serve that never comes back, not a timing assertion).
const RETRY_LIMIT: Duration = Duration::from_secs(120);
/// How long one try may take: a call that neither answers nor fails in this long hangs,
/// and the run fails naming it (a safety net, not a timing assertion).
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// Between two tries of an unanswered call: serve is restarting.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// One run's shape.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub seed: u64,
    pub tenants: usize,
    pub clients_per_tenant: usize,
    /// How long clients start new operations.
    pub budget: Duration,
    /// `kill -9` of serve at random moments this far apart (None: never).
    pub kills_every: Option<(Duration, Duration)>,
    /// The store's engine, and how many replicas serve it.
    pub engine: Engine,
}

/// What a fault killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Killed {
    Serve,
    Database,
}

/// What serves the store in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// One `serve` on its data dir's SQLite file, its fleet embedded; a fault kills it
    /// and starts it again at once.
    Sqlite,
    /// `replicas` of `serve --postgres` on one PostgreSQL server, the fleet simulated
    /// node agents that know every replica; client `i` calls replica `i % replicas`. A
    /// fault starts the replica the last one killed, then kills one at random (the
    /// leader as often as any), so that another takes the lease over; every third fault
    /// (the 2nd, 5th, ...) kills the database server instead, every process of it, and
    /// starts it again at once (its crash recovery; failover to another member is
    /// `ha_database.rs`'s and `ha_control_plane.rs`'s).
    Postgres { replicas: usize },
}

/// The control plane of a run.
pub enum Plane {
    One(Backend),
    Replicas(Replicas),
}

/// Where a run's store is, for `gpufleet-agent check`.
#[derive(Debug, Clone)]
pub enum Store {
    /// The data dir of an SQLite store.
    DataDir(PathBuf),
    /// The file that holds a PostgreSQL store's address.
    Postgres(PathBuf),
}

impl Plane {
    async fn start(engine: Engine) -> Plane {
        match engine {
            Engine::Sqlite => Plane::One(Backend::start_with_fleet(FLEET)),
            Engine::Postgres { replicas } => {
                let mut plane =
                    tokio::task::block_in_place(|| Replicas::start(replicas, "3s", &[]));
                // FLEET's nodes: six pool nodes and three on demand of 8 H100s each.
                for n in 0..9 {
                    let capacity = if n < 6 { "pool" } else { "on-demand" };
                    plane.start_node(
                        &format!("h100-{n}"),
                        &["--capacity", capacity, "--gpus", "8"],
                    );
                }
                plane.wait_ready(0, 9).await;
                Plane::Replicas(plane)
            }
        }
    }

    /// The admin's clients (of the first replica).
    pub async fn admin(&self) -> Clients {
        match self {
            Plane::One(backend) => backend.admin().await,
            Plane::Replicas(r) => r.replicas[0].admin().await,
        }
    }

    /// The run's `nth` fault (from 0): kills a `serve` at random (`kill -9`), after
    /// starting again the one killed before, or the database (see [`Engine::Postgres`]).
    fn fault(&mut self, nth: u64, rng: &mut Rng, down: &mut Option<usize>) -> Killed {
        match self {
            Plane::One(backend) => {
                backend.crash();
                backend.start_again();
                Killed::Serve
            }
            Plane::Replicas(r) => {
                if let Some(i) = down.take() {
                    r.replicas[i].start_again();
                }
                if nth % 3 == 1 {
                    r.crash_database();
                    return Killed::Database;
                }
                let i = rng.below(r.replicas.len() as u64) as usize;
                r.replicas[i].crash();
                *down = Some(i);
                Killed::Serve
            }
        }
    }

    /// Starts again the replica a fault left down, if any.
    fn heal(&mut self, down: &mut Option<usize>) {
        if let (Plane::Replicas(r), Some(i)) = (self, down.take()) {
            r.replicas[i].start_again();
        }
    }

    /// Clients acting with `token`, of the `i`th client's replica.
    pub async fn clients(&self, token: &str, i: usize) -> Clients {
        match self {
            Plane::One(backend) => backend.clients(token).await,
            Plane::Replicas(r) => r.replicas[i % r.replicas.len()].clients(token).await,
        }
    }

    pub fn store(&self) -> Store {
        match self {
            Plane::One(backend) => Store::DataDir(backend.data_dir()),
            Plane::Replicas(r) => Store::Postgres(r.database_file().to_path_buf()),
        }
    }
}

impl Store {
    /// `gpufleet-agent check` of this store `[--answers FILE]`: (exited 0, its output).
    pub fn check(&self, answers: Option<&Path>) -> (bool, String) {
        let mut command = std::process::Command::new(binaries::agent());
        command.arg("check");
        match self {
            Store::DataDir(dir) => command.arg("--data-dir").arg(dir),
            Store::Postgres(file) => command.arg("--postgres").arg("--database-file").arg(file),
        };
        if let Some(answers) = answers {
            command.arg("--answers").arg(answers);
        }
        output_within(
            &mut command,
            "gpufleet-agent check",
            Duration::from_secs(60),
        )
    }
}

/// How long the clusters may take to settle once every client call was answered: a
/// takeover after the last kill settles what the killed leader left (a safety net, not a
/// timing assertion).
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// The clusters still in a changing status (creating, updating, deleting) once they had
/// [`SETTLE_LIMIT`] to settle after the clients' last answers, as `name status`: none
/// should be, as every change asked for has ended (a change whose record the store did
/// not take is settled, not left changing with nobody to carry it on).
async fn changing_left(plane: &Plane) -> Vec<String> {
    let give_up = Instant::now() + SETTLE_LIMIT;
    let mut admin = plane.admin().await;
    loop {
        let listed = admin
            .clusters
            .list_tenant_clusters(ListTenantClustersRequest {
                page_size: 1000,
                ..Default::default()
            })
            .await;
        let changing: Option<Vec<String>> = listed.ok().map(|r| {
            r.into_inner()
                .clusters
                .iter()
                .filter(|c| ["creating", "updating", "deleting"].contains(&c.status.as_str()))
                .map(|c| format!("{} {}", c.name, c.status))
                .collect()
        });
        match changing {
            Some(c) if c.is_empty() => return c,
            Some(c) if Instant::now() > give_up => return c,
            None if Instant::now() > give_up => {
                return vec!["(the clusters could not be listed)".into()]
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// What a run did and what the check found.
pub struct Outcome {
    pub seed: u64,
    /// Operations started (each answered in the end).
    pub operations: u64,
    /// Of those, acknowledged (logged) and refused by admission or the rules.
    pub acknowledged: u64,
    pub refused: u64,
    /// Tries that got no answer and were asked again.
    pub retried: u64,
    pub kills: u64,
    /// Of those, the database server's (PostgreSQL only).
    pub database_kills: u64,
    pub duration: Duration,
    /// Clusters left creating, updating or deleting after the run (see `changing_left`).
    pub changing_left: Vec<String>,
    /// `gpufleet-agent check`'s verdict: whether it exited 0, and what it printed.
    pub check_passed: bool,
    pub check_output: String,
    /// Its violation lines (empty when it passed).
    pub violations: Vec<String>,
    /// The same check without the answers, run half-way through the budget while the
    /// clients write (and serve may be down): whether it exited 0, and what it printed.
    pub mid_run_passed: bool,
    pub mid_run_output: String,
    /// The answers log (removed with the outcome).
    pub answers_log: PathBuf,
    _answers_dir: tempfile::TempDir,
    /// The control plane the run checked, still running (stopped with the outcome).
    pub plane: Plane,
}

/// The seed of `GPUFLEET_CHECKER_SEED`, else one from the clock; printed either way.
pub fn seed() -> u64 {
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("concurrent checker: {SEED_ENV}={seed}");
    seed
}

/// xorshift64*: small, and the same sequence for the same seed everywhere.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = high.saturating_sub(low).as_millis() as u64;
        low + Duration::from_millis(self.below(span + 1))
    }
}

/// The answers log, shared by the clients: one line per acknowledged answer.
#[derive(Clone)]
struct Answers(Arc<Mutex<std::fs::File>>);

impl Answers {
    fn log(&self, line: serde_json::Value) {
        let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(file, "{line}").expect("write the answers log");
    }
}

/// Tallies of one client.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    operations: u64,
    acknowledged: u64,
    refused: u64,
    retried: u64,
}

/// Runs the checker against a new control plane on [`FLEET`] and checks the store at the
/// end.
pub async fn run(settings: Settings) -> Outcome {
    let mut plane = Plane::start(settings.engine).await;
    let answers_dir = tempfile::tempdir().expect("a temp dir");
    let answers_log = answers_dir.path().join("answers.jsonl");
    let answers = Answers(Arc::new(Mutex::new(
        std::fs::File::create(&answers_log).expect("create the answers log"),
    )));
    let mut admin = plane.admin().await;
    let mut tenants = Vec::new();
    for t in 0..settings.tenants {
        let (tenant, token) = create_tenant(&mut admin, &format!("team-{t}")).await;
        create_quota(&mut admin, &tenant.id, H100, GUARANTEED, BURST).await;
        tenants.push((tenant.id, token));
    }
    let started = Instant::now();
    let deadline = started + settings.budget;
    let store = plane.store();
    let half_way = (started + settings.budget / 2).into();
    let mid_run = tokio::spawn(async move {
        tokio::time::sleep_until(half_way).await;
        tokio::task::spawn_blocking(move || store.check(None))
            .await
            .expect("the mid-run check")
    });
    let mut clients = Vec::new();
    for (t, (tenant_id, token)) in tenants.iter().enumerate() {
        for c in 0..settings.clients_per_tenant {
            let api = plane.clients(token, clients.len()).await;
            let client = Client {
                name: format!("t{t}c{c}"),
                tenant_id: tenant_id.clone(),
                api,
                rng: Rng((settings.seed ^ ((t * 31 + c + 1) as u64).wrapping_mul(0x9E37_79B9)) | 1),
                answers: answers.clone(),
                reservations: Vec::new(),
                clusters: Vec::new(),
                next_request: 0,
                tally: Tally::default(),
            };
            clients.push(tokio::spawn(client.run(deadline)));
        }
    }
    // The faults: kill -9 and start again, at random moments, until the budget is spent.
    let mut rng = Rng(settings.seed);
    let (mut kills, mut database_kills) = (0, 0);
    let mut down = None;
    if let Some((low, high)) = settings.kills_every {
        loop {
            let at = Instant::now() + rng.between(low, high);
            if at >= deadline {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
            let killed = tokio::task::block_in_place(|| plane.fault(kills, &mut rng, &mut down));
            kills += 1;
            database_kills += u64::from(killed == Killed::Database);
        }
    }
    // Every replica serves the end of the run and the check.
    tokio::task::block_in_place(|| plane.heal(&mut down));
    let mut tally = Tally::default();
    for client in clients {
        let t = client.await.expect("a client panicked");
        tally.operations += t.operations;
        tally.acknowledged += t.acknowledged;
        tally.refused += t.refused;
        tally.retried += t.retried;
    }
    let duration = started.elapsed();
    let changing_left = changing_left(&plane).await;
    let (mid_run_passed, mid_run_output) = mid_run.await.expect("the mid-run check");
    // Checked while serve runs: the check reads one snapshot (on SQLite as a WAL reader).
    let (check_passed, check_output) = plane.store().check(Some(&answers_log));
    let violations = if check_passed {
        Vec::new()
    } else {
        check_output
            .lines()
            .filter(|l| {
                ["capacity:", "quota:", "membership:", "sequence:", "answer:"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .map(str::to_string)
            .collect()
    };
    Outcome {
        seed: settings.seed,
        operations: tally.operations,
        acknowledged: tally.acknowledged,
        refused: tally.refused,
        retried: tally.retried,
        kills,
        database_kills,
        duration,
        changing_left,
        check_passed,
        check_output,
        violations,
        mid_run_passed,
        mid_run_output,
        answers_log,
        _answers_dir: answers_dir,
        plane,
    }
}

/// What one client does next.
enum Op {
    CreateReservation,
    CreateCluster,
    Resize,
    Delete,
}

/// One client: its tenant's token, its own objects, its share of the log.
struct Client {
    name: String,
    tenant_id: String,
    api: Clients,
    rng: Rng,
    answers: Answers,
    /// Its live objects: (id, the window's start and end) of reservations, ids of clusters.
    reservations: Vec<(String, i64, i64)>,
    clusters: Vec<String>,
    next_request: u64,
    tally: Tally,
}

/// A call's end: answered (Ok: acknowledged; Err: refused), never unanswered.
type Answered<T> = Result<T, tonic::Status>;

/// Whether a status says the call may not have been answered by serve at all (it was
/// killed under the call, or is starting): the call is asked again.
fn unanswered(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Internal
    )
}

impl Client {
    async fn run(mut self, deadline: Instant) -> Tally {
        while Instant::now() < deadline {
            let op = match self.rng.below(10) {
                0..=2 => Op::CreateReservation,
                3..=5 => Op::CreateCluster,
                6..=7 => Op::Resize,
                _ => Op::Delete,
            };
            self.tally.operations += 1;
            match op {
                Op::CreateReservation => self.create_reservation().await,
                Op::CreateCluster => self.create_cluster().await,
                Op::Resize => self.resize().await,
                Op::Delete => self.delete().await,
            }
        }
        self.tally
    }

    fn request_id(&mut self) -> String {
        self.next_request += 1;
        format!("{}-{}", self.name, self.next_request)
    }

    /// Asks `call` until it is answered, counting the tries that were not.
    async fn answered<T, F, Fut>(&mut self, what: &str, mut call: F) -> Answered<T>
    where
        F: FnMut(Clients) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let give_up = Instant::now() + RETRY_LIMIT;
        loop {
            let tried = tokio::time::timeout(CALL_LIMIT, call(self.api.clone())).await;
            let Ok(answer) = tried else {
                panic!(
                    "{}: {what} neither answered nor failed in {CALL_LIMIT:?}: a call hangs",
                    self.name
                )
            };
            match answer {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(status) if unanswered(&status) => {
                    assert!(
                        Instant::now() < give_up,
                        "{}: {what} still unanswered after {RETRY_LIMIT:?}: {status}",
                        self.name
                    );
                    self.tally.retried += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(status) => return Err(status),
            }
        }
    }

    fn acknowledge(&mut self, request_id: &str, op: &str, kind: &str, object: serde_json::Value) {
        self.tally.acknowledged += 1;
        self.answers.log(json!({
            "request_id": request_id, "op": op, "kind": kind, "object": object,
        }));
    }

    fn refused(&mut self) {
        self.tally.refused += 1;
    }

    async fn create_reservation(&mut self) {
        let request_id = self.request_id();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        // Half start now (clusters can then draw from them), half within the hour.
        let start = now + (self.rng.below(2) * self.rng.below(3600)) as i64;
        let end = start + 600 + self.rng.below(7200) as i64;
        let request = CreateReservationRequest {
            request_id: request_id.clone(),
            tenant_id: self.tenant_id.clone(),
            gpu_type: H100.into(),
            node_count: 1 + self.rng.below(3) as i64,
            start_time: Some(from_unix(start)),
            end_time: Some(from_unix(end)),
            allow_on_demand: self.rng.below(2) == 0,
            ..Default::default()
        };
        let answer = self
            .answered("CreateReservation", |mut api| {
                let request = request.clone();
                async move { api.reservations.create_reservation(request).await }
            })
            .await;
        match answer {
            Ok(r) => {
                let (start, end) = window(&r);
                self.reservations.push((r.id.clone(), start, end));
                self.acknowledge(&request_id, "create", "reservation", reservation_json(&r));
            }
            Err(_) => self.refused(),
        }
    }

    async fn create_cluster(&mut self) {
        let request_id = self.request_id();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        // Half draw from one of its reservations that is active now, when it has one.
        let active: Vec<String> = self
            .reservations
            .iter()
            .filter(|(_, start, end)| *start <= now && now + 60 < *end)
            .map(|(id, _, _)| id.clone())
            .collect();
        let reservation_id = if !active.is_empty() && self.rng.below(2) == 0 {
            active[self.rng.below(active.len() as u64) as usize].clone()
        } else {
            String::new()
        };
        let request = CreateTenantClusterRequest {
            request_id: request_id.clone(),
            tenant_id: self.tenant_id.clone(),
            name: format!("{}-{}", self.name, self.next_request),
            orchestrator: "kubernetes".into(),
            gpu_type: H100.into(),
            node_count: 1 + self.rng.below(2) as i64,
            reservation_id,
            // No acceptance run: the checker is about admission, not health checks.
            set_acceptance: true,
            acceptance_level: "quick".into(),
            run_acceptance_on_create: false,
            ..Default::default()
        };
        let answer = self
            .answered("CreateTenantCluster", |mut api| {
                let request = request.clone();
                async move { api.clusters.create_tenant_cluster(request).await }
            })
            .await;
        match answer {
            Ok(c) => {
                self.clusters.push(c.id.clone());
                self.acknowledge(&request_id, "create", "cluster", cluster_json(&c));
            }
            Err(_) => self.refused(),
        }
    }

    async fn resize(&mut self) {
        let request_id = self.request_id();
        let pick_cluster =
            !self.clusters.is_empty() && (self.reservations.is_empty() || self.rng.below(2) == 0);
        if pick_cluster {
            let id = self.clusters[self.rng.below(self.clusters.len() as u64) as usize].clone();
            let request = UpdateTenantClusterRequest {
                id: id.clone(),
                node_count: 1 + self.rng.below(3) as i64,
                ..Default::default()
            };
            let answer = self
                .answered("UpdateTenantCluster", |mut api| {
                    let request = request.clone();
                    async move { api.clusters.update_tenant_cluster(request).await }
                })
                .await;
            match answer {
                Ok(c) => self.acknowledge(&request_id, "resize", "cluster", cluster_json(&c)),
                Err(_) => self.refused(),
            }
        } else if !self.reservations.is_empty() {
            let i = self.rng.below(self.reservations.len() as u64) as usize;
            let request = UpdateReservationRequest {
                id: self.reservations[i].0.clone(),
                node_count: 1 + self.rng.below(4) as i64,
                ..Default::default()
            };
            let answer = self
                .answered("UpdateReservation", |mut api| {
                    let request = request.clone();
                    async move { api.reservations.update_reservation(request).await }
                })
                .await;
            match answer {
                Ok(r) => {
                    self.acknowledge(&request_id, "resize", "reservation", reservation_json(&r))
                }
                Err(_) => self.refused(),
            }
        } else {
            self.create_reservation().await;
        }
    }

    async fn delete(&mut self) {
        let request_id = self.request_id();
        let pick_cluster =
            !self.clusters.is_empty() && (self.reservations.is_empty() || self.rng.below(2) == 0);
        let (kind, id) = if pick_cluster {
            let i = self.rng.below(self.clusters.len() as u64) as usize;
            ("cluster", self.clusters[i].clone())
        } else if !self.reservations.is_empty() {
            let i = self.rng.below(self.reservations.len() as u64) as usize;
            ("reservation", self.reservations[i].0.clone())
        } else {
            return self.create_cluster().await;
        };
        let target = id.clone();
        let answer = if kind == "cluster" {
            self.answered("DeleteTenantCluster", |mut api| {
                let request = DeleteTenantClusterRequest { id: target.clone() };
                async move { api.clusters.delete_tenant_cluster(request).await }
            })
            .await
        } else {
            self.answered("DeleteReservation", |mut api| {
                let request = DeleteReservationRequest { id: target.clone() };
                async move { api.reservations.delete_reservation(request).await }
            })
            .await
        };
        // NOT_FOUND: an earlier try, unanswered, deleted it.
        let gone = match answer {
            Ok(_) => true,
            Err(status) => status.code() == Code::NotFound,
        };
        if gone {
            self.clusters.retain(|c| *c != id);
            self.reservations.retain(|(r, _, _)| *r != id);
            self.acknowledge(&request_id, "delete", kind, json!({ "id": id }));
        } else {
            self.refused();
        }
    }
}

fn window(r: &Reservation) -> (i64, i64) {
    let seconds = |t: &Option<prost_types::Timestamp>| t.as_ref().map_or(0, |t| t.seconds);
    (seconds(&r.start_time), seconds(&r.end_time))
}

fn reservation_json(r: &Reservation) -> serde_json::Value {
    let (start, end) = window(r);
    json!({
        "id": r.id, "tenant_id": r.tenant_id, "gpu_type": r.gpu_type,
        "node_count": r.node_count, "start_time": start, "end_time": end,
    })
}

fn cluster_json(c: &TenantCluster) -> serde_json::Value {
    json!({
        "id": c.id, "tenant_id": c.tenant_id, "gpu_type": c.gpu_type,
        "node_count": c.node_count, "name": c.name, "reservation_id": c.reservation_id,
    })
}
