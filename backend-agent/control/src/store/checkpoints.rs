//! WAL checkpoints off the writer. A thread with its own connection copies committed WAL
//! frames into the database file every [`EVERY`] (PASSIVE: it never blocks the writer or
//! the readers), so no write request pays for a checkpoint and its fsync while holding
//! the writer. The writer's own automatic checkpoint stays on, at a much larger WAL
//! ([`BACKSTOP_PAGES`]), only in case this thread falls behind.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;

/// How often the thread checkpoints.
pub const EVERY: Duration = Duration::from_millis(250);
/// The writer's automatic checkpoint once this thread runs (SQLite's default is 1,000).
pub const BACKSTOP_PAGES: i64 = 16_384;

/// What one PASSIVE checkpoint did: WAL frames in the log, and how many of them are now
/// in the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpointed {
    pub log_frames: i64,
    pub checkpointed_frames: i64,
}

/// Copies what it can of the WAL into the database without waiting for anyone.
pub fn checkpoint(conn: &Connection) -> rusqlite::Result<Checkpointed> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(Checkpointed {
            log_frames: r.get(1)?,
            checkpointed_frames: r.get(2)?,
        })
    })
}

/// The checkpoint thread; it stops when this is dropped.
pub struct Checkpoints {
    _stop: mpsc::Sender<()>,
}

impl Checkpoints {
    /// Starts checkpointing the database at `path` and moves `writer`'s automatic
    /// checkpoint out to the backstop.
    pub fn start(path: &Path, writer: &Connection) -> anyhow::Result<Checkpoints> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let (stop, stopped) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("gpufleet-checkpoints".into())
            .spawn(move || run(&conn, &stopped))?;
        writer.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)?;
        Ok(Checkpoints { _stop: stop })
    }
}

fn run(conn: &Connection, stopped: &mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
        if let Err(e) = checkpoint(conn) {
            tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_copies_committed_frames_while_a_reader_holds_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let writer = crate::store::open(&path).unwrap();
        let _checkpoints = Checkpoints::start(&path, &writer).unwrap();
        let backstop: i64 = writer
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(backstop, BACKSTOP_PAGES);
        let other = Connection::open(&path).unwrap();
        let add_tenant = |id: &str| {
            writer
                .execute(
                    "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                     VALUES (?1, ?1, ?1, '{}', ?1, 0)",
                    [id],
                )
                .unwrap();
        };
        add_tenant("t");
        let done = checkpoint(&other).unwrap();
        assert!(done.log_frames > 0);
        assert_eq!(done.checkpointed_frames, done.log_frames);
        // A reader in a transaction does not block it, nor does it block the writer.
        let reader = crate::store::readers::Readers::open(&path, 1).unwrap();
        let held = reader.get().unwrap().unwrap();
        let tenants = |c: &Connection| -> i64 {
            c.query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(tenants(&held), 1);
        add_tenant("u");
        let partial = checkpoint(&other).unwrap();
        assert!(partial.log_frames > 0);
        assert_eq!(tenants(&held), 1);
        drop(held);
        let done = checkpoint(&other).unwrap();
        assert_eq!(done.checkpointed_frames, done.log_frames);
        assert_eq!(tenants(&other), 2);
    }
}
