//! What every service shares: the database, the data dir, the tokens and the registry
//! of node agents.
//!
//! The connection sits behind one mutex: requests that read-check-write (capacity,
//! quota) run one at a time, so a check and the write it guards can never interleave
//! with another request's. Each such request is also one SQLite transaction.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;
use tonic::Status;

pub struct AppState {
    db: Mutex<Connection>,
    pub data_dir: PathBuf,
    pub admin_token: String,
    /// What node agents present to join.
    pub join_token: String,
    /// Connected node agents and the work orders waiting for their answers.
    pub agents: crate::agents::registry::Registry,
    /// The drivers clusters may choose.
    pub drivers: crate::drivers::Offer,
}

impl AppState {
    pub fn new(
        db: Connection,
        data_dir: PathBuf,
        admin_token: String,
        join_token: String,
        agents: crate::agents::registry::Registry,
        drivers: crate::drivers::Offer,
    ) -> Self {
        Self {
            db: Mutex::new(db),
            data_dir,
            admin_token,
            join_token,
            agents,
            drivers,
        }
    }

    pub fn db(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves an uncommitted transaction that SQLite
        // rolls back, so the connection stays usable.
        self.db
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn volumes_root(&self) -> PathBuf {
        self.data_dir.join("volumes")
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A storage failure: logged in full, reported as INTERNAL.
pub fn db_error(e: rusqlite::Error) -> Status {
    tracing::error!(error = %e, "database error");
    Status::internal(format!("state database error: {e}"))
}

/// RFC 3339 text for messages.
pub fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}
