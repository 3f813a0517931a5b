//! What every service shares: the database, the data dir, the tokens and the registry
//! of node agents.
//!
//! The connection sits behind one mutex: requests that read-check-write (capacity,
//! quota) run one at a time, so a check and the write it guards can never interleave
//! with another request's. Each such request is one SQLite transaction, or one
//! savepoint of a transaction it shares with requests that arrived with it
//! ([`AppState::write`], group commit). Requests that only read take a pooled read-only
//! connection instead ([`AppState::read`]): WAL lets them read the last committed state
//! without waiting for the writer.

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, Savepoint};
use tonic::Status;

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

pub struct AppState {
    db: Arc<Mutex<Connection>>,
    writes: crate::group_commit::GroupCommit,
    /// WAL checkpoints on their own thread (none for a database without a file).
    _checkpoints: Option<crate::store::checkpoints::Checkpoints>,
    readers: crate::store::readers::Readers,
    pub data_dir: PathBuf,
    pub admin_token: String,
    /// What node agents present to join.
    pub join_token: String,
    /// Connected node agents and the work orders waiting for their answers.
    pub agents: crate::registry::Registry,
    /// The drivers clusters may choose.
    pub drivers: crate::drivers::Offer,
    /// Reservations not yet ended that one tenant may hold (`--max-open-reservations`).
    pub max_open_reservations: u32,
    /// When health checks run and how long bandwidth tests take.
    pub health: HealthSettings,
}

impl AppState {
    pub fn new(
        db: Connection,
        data_dir: PathBuf,
        admin_token: String,
        join_token: String,
        agents: crate::registry::Registry,
        drivers: crate::drivers::Offer,
    ) -> Self {
        let readers = open_readers(&db);
        let checkpoints = start_checkpoints(&db);
        let db = Arc::new(Mutex::new(db));
        Self {
            writes: crate::group_commit::GroupCommit::start(db.clone()),
            _checkpoints: checkpoints,
            db,
            readers,
            data_dir,
            admin_token,
            join_token,
            agents,
            drivers,
            max_open_reservations: DEFAULT_MAX_OPEN_RESERVATIONS,
            health: Default::default(),
        }
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

    pub fn db(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves an uncommitted transaction that SQLite
        // rolls back, so the connection stays usable.
        self.db
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a read-check-write request in its own savepoint of a transaction shared with
    /// the requests that arrived with it, answering once that transaction has committed
    /// (see [`crate::group_commit`]). `work` keeps its writes with `Savepoint::commit`.
    /// It runs on the writer thread, which holds the writer connection: it must do all
    /// its reads through the savepoint, never through [`AppState::db`] or
    /// [`AppState::read`], which would wait for that connection forever.
    pub async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(Savepoint<'_>) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        self.writes.write(work).await
    }

    /// A connection for a request that only reads: a pooled read-only one (never
    /// waiting for the writer), or the writer's for a database without a file.
    pub fn read(&self) -> Db<'_> {
        match self.readers.get() {
            Some(Ok(reader)) => Db::Reader(reader),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "read connection unusable; reading through the writer");
                Db::Writer(self.db())
            }
            None => Db::Writer(self.db()),
        }
    }

    pub fn volumes_root(&self) -> PathBuf {
        self.data_dir.join("volumes")
    }
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

/// A connection to read through: see [`AppState::read`].
pub enum Db<'a> {
    Reader(crate::store::readers::Reader<'a>),
    Writer(MutexGuard<'a, Connection>),
}

impl Deref for Db<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        match self {
            Db::Reader(r) => r,
            Db::Writer(w) => w,
        }
    }
}

pub use crate::clock::{now, rfc3339};
pub use crate::error::db_error;
