//! What every service shares: the database, the data dir, the tokens and the registry
//! of node agents.
//!
//! There are two ways to the database, both off the async workers. Requests that
//! read-check-write (capacity, quota) run one at a time on the writer thread, each in a
//! savepoint of a transaction it shares with the requests that arrived with it
//! ([`AppState::write`], group commit), so a check and the write it guards never
//! interleave with another request's. Requests that only read take a pooled read-only
//! connection on a blocking thread ([`AppState::read`]): on SQLite, WAL lets them read
//! the last committed state without waiting for the writer; on PostgreSQL they read one
//! snapshot each from a bounded pool of connections. Both engines behind `gpufleet_sql`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use gpufleet_sql::{Conn, Savepoint};
use rusqlite::Connection;

use crate::error::Error;

/// The data dir's folder of tenants' storage.
pub const VOLUMES: &str = "volumes";

/// `--max-open-reservations` when not given.
pub const DEFAULT_MAX_OPEN_RESERVATIONS: u32 = 1000;

/// How checks are scheduled (serve flags).
#[derive(Debug, Clone)]
pub struct HealthSettings {
    /// Quick checks on every ready node this often; zero: never.
    pub interval: std::time::Duration,
    /// How long each pair of a bandwidth test exchanges data.
    pub bandwidth_duration: std::time::Duration,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            interval: std::time::Duration::from_secs(600),
            bandwidth_duration: std::time::Duration::from_millis(1000),
        }
    }
}

/// The automatic-quarantine breaker's flags (serve's `--breaker-*`; the rules are
/// `scheduling::breaker`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerSettings {
    /// The window automatic quarantines are counted in; zero turns the breaker off.
    pub window: std::time::Duration,
    /// At most this many automatic quarantines of one model per window...
    pub max_quarantines: u32,
    /// ...or this percentage of the model's nodes, whichever is more.
    pub max_percent: u32,
}

impl Default for BreakerSettings {
    /// At most 2, or 20% of the model's nodes, per 10 minutes.
    fn default() -> Self {
        Self {
            window: std::time::Duration::from_secs(600),
            max_quarantines: 2,
            max_percent: 20,
        }
    }
}

/// Nodes that registered but are not in service yet (serve's `--max-candidates`,
/// `--max-candidates-per-source`, `--candidate-ttl`; the rules are `agents::admission`'s
/// and `agents::monitor`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateSettings {
    /// At most this many candidates at once: a new name past it is refused.
    pub max: u32,
    /// At most this many registered from one source address (an IPv6 /64): one holder
    /// of the join token cannot take every slot.
    pub max_per_source: u32,
    /// A candidate is forgotten this long after it last changed state (registered,
    /// failed its checks), its agent's session ended if it is still open: a live fake
    /// node holds its slot no longer than a gone one.
    pub expire_after: std::time::Duration,
}

impl Default for CandidateSettings {
    /// 64 candidates, 16 per source, forgotten after an hour.
    fn default() -> Self {
        Self {
            max: 64,
            max_per_source: 16,
            expire_after: std::time::Duration::from_secs(3600),
        }
    }
}

/// The database under the state, and how it is read.
enum Backing {
    /// The writer's connection (read through where no read-only one exists), the pool of
    /// read-only ones, and WAL checkpoints on their own thread (none for a database
    /// without a file).
    Sqlite {
        db: Arc<Mutex<Connection>>,
        readers: Arc<crate::store::readers::Readers>,
        _checkpoints: Option<crate::store::checkpoints::Checkpoints>,
    },
    /// Read connections to the database every replica shares.
    Postgres { readers: Arc<gpufleet_sql::Pool> },
}

pub struct AppState {
    backing: Backing,
    writes: crate::group_commit::GroupCommit,
    pub data_dir: PathBuf,
    pub admin_token: String,
    /// The file the admin token was read from (the data dir's `admin.token`); None when it
    /// came from outside (GPUFLEET_ADMIN_TOKEN): then only a restart changes it.
    pub admin_token_file: Option<PathBuf>,
    /// What node agents present to join (rotated by the admin).
    pub join_tokens: crate::join_tokens::JoinTokens,
    /// Connected node agents and the work orders waiting for their answers.
    pub agents: crate::registry::Registry,
    /// The drivers clusters may choose.
    pub drivers: crate::drivers::Offer,
    /// Reservations not yet ended that one tenant may hold (`--max-open-reservations`).
    pub max_open_reservations: u32,
    /// When health checks run and how long bandwidth tests take.
    pub health: HealthSettings,
    /// Where the time comes from.
    pub clock: crate::clock::Clock,
    /// What the fleet says it delivers per GPU model (bounds tenants' thresholds).
    pub delivers: crate::fleet::Delivers,
    /// How many automatic quarantines per model and window (serve's `--breaker-*`).
    pub breaker: BreakerSettings,
    pub candidates: CandidateSettings,
    /// The address this host's embedded node agents declare to Slurm, where their
    /// clusters' daemons (a head node's controller and login among them) are reached
    /// (serve's `--advertise-address`).
    pub slurm_address: std::net::IpAddr,
    /// The ports new Slurm controllers, slurmds and logins get (`serve --slurm-ports`).
    pub slurm_ports: gpufleet_slurm::PortRange,
    /// What the control plane knows of its Slurm clusters between requests.
    pub slurm: crate::slurm_tracker::Tracker,
    /// Tenant clusters' volumes: on the shared storage (serve's `--shared-storage`), else
    /// unsized directories in the data dir's `volumes/`.
    pub volumes: crate::volumes::Volumes,
    /// Where the metrics endpoint is bound, once it is (serve's `--metrics-listen`; port 0
    /// resolved), for GetMetricsEndpoint.
    pub metrics_address: std::sync::OnceLock<std::net::SocketAddr>,
    /// The operator's price list (serve's `--prices`), which prices GetUsage's rows.
    pub prices: Option<Arc<crate::usage_cost::PriceBook>>,
}

impl AppState {
    /// Over a database without a commit record (tests, tools).
    pub fn new(
        db: Connection,
        data_dir: PathBuf,
        admin_token: String,
        join_token: String,
        agents: crate::registry::Registry,
        drivers: crate::drivers::Offer,
    ) -> Self {
        Self::with_commit_record(db, None, data_dir, admin_token, join_token, agents, drivers)
    }

    /// Over the store as `serve` opens it (`store::open_checked`): the writer keeps
    /// `record` up to date after each commit.
    pub fn with_commit_record(
        db: Connection,
        record: Option<crate::store::commit_record::CommitRecord>,
        data_dir: PathBuf,
        admin_token: String,
        join_token: String,
        agents: crate::registry::Registry,
        drivers: crate::drivers::Offer,
    ) -> Self {
        let readers = Arc::new(open_readers(&db));
        let checkpoints = start_checkpoints(&db);
        let db = Arc::new(Mutex::new(db));
        let writes = crate::group_commit::GroupCommit::start(db.clone(), record);
        let backing = Backing::Sqlite {
            db,
            readers,
            _checkpoints: checkpoints,
        };
        Self::over(
            backing,
            writes,
            data_dir,
            admin_token,
            join_token,
            agents,
            drivers,
        )
    }

    /// Over the PostgreSQL database at `url` (migrated): this replica's writer holds one
    /// connection and reads take up to [`READERS`] more.
    pub fn on_postgres(
        url: &str,
        data_dir: PathBuf,
        admin_token: String,
        join_token: String,
        agents: crate::registry::Registry,
        drivers: crate::drivers::Offer,
    ) -> Self {
        let writes =
            crate::group_commit::GroupCommit::start_writer(crate::group_commit::Writer::Postgres {
                url: url.to_string(),
            });
        let backing = Backing::Postgres {
            readers: Arc::new(gpufleet_sql::Pool::new(url, READERS)),
        };
        Self::over(
            backing,
            writes,
            data_dir,
            admin_token,
            join_token,
            agents,
            drivers,
        )
    }

    fn over(
        backing: Backing,
        writes: crate::group_commit::GroupCommit,
        data_dir: PathBuf,
        admin_token: String,
        join_token: String,
        agents: crate::registry::Registry,
        drivers: crate::drivers::Offer,
    ) -> Self {
        Self {
            backing,
            writes,
            volumes: crate::volumes::Volumes::in_data_dir(data_dir.join(VOLUMES)),
            data_dir,
            admin_token,
            admin_token_file: None,
            join_tokens: crate::join_tokens::JoinTokens::fixed(join_token),
            agents,
            drivers,
            max_open_reservations: DEFAULT_MAX_OPEN_RESERVATIONS,
            health: Default::default(),
            clock: Default::default(),
            delivers: Default::default(),
            breaker: Default::default(),
            candidates: Default::default(),
            slurm_address: std::net::IpAddr::from([127, 0, 0, 1]),
            slurm_ports: Default::default(),
            slurm: Default::default(),
            metrics_address: Default::default(),
            prices: None,
        }
    }

    /// Where embedded nodes' Slurm daemons are reached (serve's `--advertise-address`).
    pub fn with_slurm_address(mut self, addr: std::net::IpAddr) -> Self {
        self.slurm_address = addr;
        self
    }

    /// The ports new Slurm daemons and logins get (serve's `--slurm-ports`).
    pub fn with_slurm_ports(mut self, ports: gpufleet_slurm::PortRange) -> Self {
        self.slurm_ports = ports;
        self
    }

    pub fn with_prices(mut self, prices: Option<crate::usage_cost::PriceBook>) -> Self {
        self.prices = prices.map(Arc::new);
        self
    }

    /// Node agents are external (`--node-agents external`): the Slurm clusters' nodes are
    /// other hosts, which check their own Slurm when they start its daemons.
    pub fn with_external_nodes(mut self, external: bool) -> Self {
        self.slurm = crate::slurm_tracker::Tracker::new(external);
        self
    }

    /// Volumes on the platform's shared storage instead of the data dir's.
    pub fn with_volumes(mut self, volumes: crate::volumes::Volumes) -> Self {
        self.volumes = volumes;
        self
    }

    /// The automatic-quarantine breaker's cap and window (serve's `--breaker-*` flags).
    pub fn with_breaker(mut self, breaker: BreakerSettings) -> Self {
        self.breaker = breaker;
        self
    }

    pub fn with_candidates(mut self, candidates: CandidateSettings) -> Self {
        self.candidates = candidates;
        self
    }

    /// What the fleet declares it delivers (its definition's `bus_bandwidth_gbps`).
    pub fn with_delivers(mut self, delivers: crate::fleet::Delivers) -> Self {
        self.delivers = delivers;
        self
    }

    /// The clock (serve's `--clock-file`, for tests).
    pub fn with_clock(mut self, clock: crate::clock::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// This replica's hold on the singletons' lease (`crate::lease`): whether it leads,
    /// with which epoch; a singleton's write calls its `fence` in its transaction.
    pub fn lease(&self) -> &Arc<crate::lease::Leadership> {
        self.agents.leadership()
    }

    /// Seconds since the Unix epoch, by this control plane's clock.
    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// The join token and the data dir's `join.token` it was read from, with the
    /// secrets still retiring beside it.
    pub fn with_join_tokens(mut self, tokens: crate::join_tokens::JoinTokens) -> Self {
        self.join_tokens = tokens;
        self
    }

    /// Where the admin token was read from (see [`AppState::admin_token_file`]).
    pub fn with_admin_token_file(mut self, path: Option<PathBuf>) -> Self {
        self.admin_token_file = path;
        self
    }

    /// The health-check schedule (serve's `--health-*` flags).
    pub fn with_health(mut self, health: HealthSettings) -> Self {
        self.health = health;
        self
    }

    /// serve's `--max-open-reservations`.
    pub fn with_max_open_reservations(mut self, max: u32) -> Self {
        self.max_open_reservations = max;
        self
    }

    /// Runs a read-check-write request in its own savepoint of a transaction shared with
    /// the requests that arrived with it, answering once that transaction has committed
    /// (see [`crate::group_commit`]). `work` keeps its writes with `Savepoint::commit`;
    /// dropping the savepoint (a refusal, a dry run) rolls back only its own. It runs on
    /// the writer thread, which holds the writer connection: it does all its reads
    /// through the savepoint, never through [`AppState::read`].
    pub async fn write<T: Send + 'static, E: From<Error> + Send + 'static>(
        &self,
        work: impl FnOnce(Savepoint<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        self.writes.write(work).await
    }

    /// [`AppState::write`] for work that keeps everything it wrote when it succeeds (the
    /// background bookkeeping: states, statuses, events).
    pub async fn apply<T: Send + 'static, E: From<Error> + Send + 'static>(
        &self,
        work: impl FnOnce(&Conn<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        self.write(move |sp| {
            let value = work(&sp.conn())?;
            sp.commit().map_err(|e| E::from(Error::from(e)))?;
            Ok(value)
        })
        .await
    }

    /// Runs a request that only reads on a blocking thread, with a pooled read-only
    /// connection (never waiting for the writer), or the writer's for a database without
    /// a file. These two, `read` and [`AppState::write`], are the only ways to the
    /// database: no async worker ever waits on SQLite or its lock.
    pub async fn read<T: Send + 'static, E: From<Error> + Send + 'static>(
        &self,
        work: impl FnOnce(&Conn<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let read = match &self.backing {
            Backing::Sqlite { db, readers, .. } => {
                let (db, readers) = (db.clone(), readers.clone());
                tokio::task::spawn_blocking(move || match readers.get() {
                    Some(Ok(reader)) => work(&Conn::sqlite(&reader)),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "read connection unusable; reading through the writer");
                        work(&Conn::sqlite(&lock(&db)))
                    }
                    None => work(&Conn::sqlite(&lock(&db))),
                })
            }
            Backing::Postgres { readers } => {
                let readers = readers.clone();
                tokio::task::spawn_blocking(move || {
                    let mut db = readers.get().map_err(|e| E::from(Error::from(e)))?;
                    // One snapshot for the whole read, run once (a read-only snapshot is
                    // never run again).
                    let mut work = Some(work);
                    db.read(|c| Ok(work.take().map(|w| w(c))))
                        .map_err(|e| E::from(Error::from(e)))?
                        .unwrap_or_else(|| Err(E::from(Error::Internal("a read ran twice".into()))))
                })
            }
        };
        read.await
            .map_err(|e| E::from(Error::Internal(format!("request worker failed: {e}"))))?
    }

    /// Whether the store is PostgreSQL's, shared by replicas, rather than an SQLite file.
    pub fn on_shared_database(&self) -> bool {
        matches!(self.backing, Backing::Postgres { .. })
    }
}

/// The writer connection, for a read where no read-only one exists. A panic while
/// holding the lock leaves an uncommitted transaction that SQLite rolls back, so the
/// connection stays usable.
fn lock(db: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    db.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How many read-only connections serve reads.
const READERS: usize = 4;

fn open_readers(db: &Connection) -> crate::store::readers::Readers {
    use crate::store::readers::Readers;
    match db.path().filter(|p| !p.is_empty()) {
        Some(path) => Readers::open(std::path::Path::new(path), READERS).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot open read connections; reads use the writer");
            Readers::none()
        }),
        None => Readers::none(),
    }
}

fn start_checkpoints(db: &Connection) -> Option<crate::store::checkpoints::Checkpoints> {
    let path = db.path().filter(|p| !p.is_empty())?;
    crate::store::checkpoints::Checkpoints::start(std::path::Path::new(path), db)
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot checkpoint on a thread of its own; the writer does");
        })
        .ok()
}

pub use crate::clock::rfc3339;
pub use crate::error::db_error;
