//! Read-only connections for requests that only read (gets, lists, availability), so
//! they never wait behind the one writer connection and its read-check-write
//! transactions. WAL lets them read the last committed state while a write is under way.

use std::ops::Deref;
use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// A small pool of read-only connections to one database file.
pub struct Readers {
    idle: Mutex<Vec<Connection>>,
    returned: Condvar,
    size: usize,
}

impl Readers {
    /// `count` read-only connections to `path` (a WAL database the writer has opened).
    pub fn open(path: &Path, count: usize) -> rusqlite::Result<Readers> {
        let mut idle = Vec::with_capacity(count);
        for _ in 0..count {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )?;
            conn.busy_timeout(Duration::from_secs(5))?;
            conn.set_prepared_statement_cache_capacity(super::STATEMENT_CACHE);
            super::tune_reads(&conn)?;
            idle.push(conn);
        }
        Ok(Readers {
            size: idle.len(),
            idle: Mutex::new(idle),
            returned: Condvar::new(),
        })
    }

    /// No connections: every read goes to the writer (an in-memory database).
    pub fn none() -> Readers {
        Readers {
            idle: Mutex::new(Vec::new()),
            returned: Condvar::new(),
            size: 0,
        }
    }

    /// A connection inside a read transaction (one consistent snapshot for the whole
    /// request), waiting for one to come back when all are busy; `None` without any.
    pub fn get(&self) -> Option<rusqlite::Result<Reader<'_>>> {
        if self.size == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let conn = loop {
            match idle.pop() {
                Some(conn) => break conn,
                None => idle = self.returned.wait(idle).unwrap_or_else(|p| p.into_inner()),
            }
        };
        drop(idle);
        let reader = Reader {
            pool: self,
            conn: Some(conn),
        };
        Some(reader.begin().map(|()| reader))
    }
}

/// A pooled read-only connection; goes back to the pool on drop.
pub struct Reader<'a> {
    pool: &'a Readers,
    conn: Option<Connection>,
}

impl Reader<'_> {
    fn begin(&self) -> rusqlite::Result<()> {
        self.execute_batch("BEGIN DEFERRED")
    }
}

impl Deref for Reader<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a reader holds its connection until dropped")
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // Ends the read transaction (nothing to commit). The connection always goes back,
        // so the pool never shrinks; one left in a transaction fails its next BEGIN and
        // that read goes through the writer instead.
        if !conn.is_autocommit() {
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %e, "a read connection could not end its transaction");
            }
        }
        let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.push(conn);
        drop(idle);
        self.pool.returned.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_committed_writes_and_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let writer = crate::store::open(&path).unwrap();
        let readers = Readers::open(&path, 2).unwrap();
        writer
            .execute(
                "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t', 't', 't', '{}', 'h', 0)",
                [],
            )
            .unwrap();
        let count = |r: &Connection| -> i64 {
            r.query_row("SELECT COUNT(*) FROM tenants", [], |row| row.get(0))
                .unwrap()
        };
        {
            let a = readers.get().unwrap().unwrap();
            let b = readers.get().unwrap().unwrap();
            assert_eq!(count(&a), 1);
            assert_eq!(count(&b), 1);
            assert!(a.execute("DELETE FROM tenants", []).is_err());
        }
        // Both went back: two more can be taken without waiting.
        let _a = readers.get().unwrap().unwrap();
        let _b = readers.get().unwrap().unwrap();
        assert!(Readers::none().get().is_none());
    }
}
