//! Savepoints on either engine, by SQL both take (`SAVEPOINT`, `RELEASE`, `ROLLBACK TO`):
//! a request's work inside a transaction shared with others keeps what it wrote only when
//! it commits its savepoint, and leaves nothing when it drops it (a refusal, a dry run).

use std::ops::Deref;

use crate::conn::{AsConn, Conn};
use crate::error::Result;
use crate::params;

/// An open savepoint; rolled back when dropped without [`Savepoint::commit`].
pub struct Savepoint<'a> {
    conn: Conn<'a>,
    depth: u32,
    open: bool,
}

impl<'a> Savepoint<'a> {
    /// Opens a savepoint on `conn` (inside a transaction, or one of its own outside any).
    pub fn begin(conn: Conn<'a>) -> Result<Self> {
        Self::at_depth(conn, 0)
    }

    fn at_depth(conn: Conn<'a>, depth: u32) -> Result<Self> {
        conn.execute(&format!("SAVEPOINT {}", name(depth)), params![])?;
        Ok(Savepoint {
            conn,
            depth,
            open: true,
        })
    }

    /// A savepoint inside this one; this one is borrowed until it ends.
    pub fn savepoint(&mut self) -> Result<Savepoint<'_>> {
        Savepoint::at_depth(self.conn, self.depth + 1)
    }

    /// Keeps what was written since the savepoint opened (as part of the transaction
    /// around it).
    pub fn commit(mut self) -> Result<()> {
        self.open = false;
        self.conn
            .execute(&format!("RELEASE {}", name(self.depth)), params![])?;
        Ok(())
    }

    /// Undoes what was written since the savepoint opened; it stays open.
    pub fn rollback(&mut self) -> Result<()> {
        self.conn
            .execute(&format!("ROLLBACK TO {}", name(self.depth)), params![])?;
        Ok(())
    }

    pub fn conn(&self) -> Conn<'a> {
        self.conn
    }
}

fn name(depth: u32) -> String {
    format!("gpufleet_sp{depth}")
}

impl Drop for Savepoint<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let name = name(self.depth);
        // A savepoint that cannot be rolled back leaves its transaction failed, which its
        // owner's commit then reports.
        if let Err(e) = self
            .conn
            .execute(&format!("ROLLBACK TO {name}"), params![])
            .and_then(|_| self.conn.execute(&format!("RELEASE {name}"), params![]))
        {
            tracing::error!(error = %e, savepoint = %name, "cannot roll back a savepoint");
        }
    }
}

impl<'a> Deref for Savepoint<'a> {
    type Target = Conn<'a>;
    fn deref(&self) -> &Conn<'a> {
        &self.conn
    }
}

impl AsConn for Savepoint<'_> {
    fn as_conn(&self) -> Conn<'_> {
        self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Database;

    fn count(c: Conn<'_>) -> i64 {
        c.query_row("SELECT COUNT(*) FROM t", params![], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_committed_savepoint_keeps_its_rows_a_dropped_one_none_nested_too() {
        let mut db = Database::sqlite(rusqlite::Connection::open_in_memory().unwrap());
        db.conn()
            .execute_batch("CREATE TABLE t (a INTEGER NOT NULL)")
            .unwrap();
        db.write(|c| {
            let kept = Savepoint::begin(*c)?;
            kept.execute("INSERT INTO t VALUES (1)", params![])?;
            kept.commit()?;
            {
                let dropped = Savepoint::begin(*c)?;
                dropped.execute("INSERT INTO t VALUES (2)", params![])?;
            }
            let mut outer = Savepoint::begin(*c)?;
            outer.execute("INSERT INTO t VALUES (3)", params![])?;
            {
                let inner = outer.savepoint()?;
                inner.execute("INSERT INTO t VALUES (4)", params![])?;
            }
            let inner = outer.savepoint()?;
            inner.execute("INSERT INTO t VALUES (5)", params![])?;
            inner.commit()?;
            outer.commit()?;
            Ok(())
        })
        .unwrap();
        let kept = db
            .read(|c| c.query_map("SELECT a FROM t ORDER BY a", params![], |r| r.get::<i64>(0)))
            .unwrap();
        assert_eq!(kept, vec![1, 3, 5]);
        assert_eq!(count(db.conn()), 3);
    }
}
