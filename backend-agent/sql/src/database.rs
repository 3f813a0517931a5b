//! A connection the caller owns, and the transactions it runs: serializable writes on
//! both engines, run again when PostgreSQL says they raced another, and reads from one
//! snapshot.

use std::time::Duration;

use postgres::IsolationLevel;

use crate::conn::{Conn, Pg, Statements};
use crate::error::{Error, Result};

/// How many times a write that lost a race is run, in all, before its error is returned.
pub const MAX_ATTEMPTS: u32 = 40;

/// The longest wait between two attempts of a write.
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// An open connection of either engine.
pub struct Database {
    engine: Owned,
}

enum Owned {
    Sqlite(rusqlite::Connection),
    // In a cell, so that [`Database::conn`] lends it as a shared [`Conn`].
    // Boxed: a client and its statements are larger than an SQLite connection.
    Postgres(Box<Pg<postgres::Client, Statements>>),
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Database({:?})", self.engine())
    }
}

/// Whether `address` names a PostgreSQL server (`postgres://` or `postgresql://`, as
/// libpq's URIs), rather than an SQLite file.
pub fn is_postgres(address: &str) -> bool {
    address.starts_with("postgres://") || address.starts_with("postgresql://")
}

impl Database {
    /// Connects to the PostgreSQL server at `url` (libpq's URI: several hosts and
    /// `target_session_attrs=read-write` find a cluster's primary; `sslmode=verify-full`
    /// with `sslrootcert=FILE` connects with TLS, verifying the server: [`crate::tls`]).
    pub fn postgres(url: &str) -> Result<Self> {
        if !is_postgres(url) {
            return Err(Error::Address(format!(
                "'{}' is not a postgres:// or postgresql:// address",
                redacted(url)
            )));
        }
        let client = match crate::tls::split(url)? {
            (url, crate::tls::Transport::Plain) => {
                postgres::Client::connect(&url, postgres::NoTls)?
            }
            (url, crate::tls::Transport::Tls(tls)) => postgres::Client::connect(&url, tls)?,
        };
        Ok(Database {
            engine: Owned::Postgres(Box::new(Pg::new(client, Statements::default()))),
        })
    }

    /// An SQLite connection the caller opened (and set up) itself.
    pub fn sqlite(conn: rusqlite::Connection) -> Self {
        Database {
            engine: Owned::Sqlite(conn),
        }
    }

    /// The SQLite connection back, for what only SQLite has (a commit record, WAL
    /// readers); None on PostgreSQL.
    pub fn into_sqlite(self) -> Option<rusqlite::Connection> {
        match self.engine {
            Owned::Sqlite(c) => Some(c),
            Owned::Postgres(_) => None,
        }
    }

    pub fn engine(&self) -> crate::Engine {
        match self.engine {
            Owned::Sqlite(_) => crate::Engine::Sqlite,
            Owned::Postgres(_) => crate::Engine::Postgres,
        }
    }

    /// Statements outside any transaction (each its own on PostgreSQL).
    pub fn conn(&self) -> Conn<'_> {
        match &self.engine {
            Owned::Sqlite(c) => Conn::sqlite(c),
            Owned::Postgres(c) => Conn::postgres(&**c),
        }
    }

    /// Runs `f` in a serializable write transaction and commits what it wrote; an error
    /// from `f` rolls everything back. On PostgreSQL a transaction that failed only for
    /// racing another (see [`Error::is_retryable`]) is run again from the start, up to
    /// [`MAX_ATTEMPTS`] times, so `f` must do nothing outside the transaction. A refusal
    /// that should still commit what was written is `f`'s `Ok` value.
    pub fn write<T>(&mut self, mut f: impl FnMut(&Conn<'_>) -> Result<T>) -> Result<T> {
        match &mut self.engine {
            Owned::Sqlite(c) => {
                // IMMEDIATE: the writer's lock at the start, so that what f read stays true.
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let v = f(&Conn::sqlite(&tx))?;
                tx.commit()?;
                Ok(v)
            }
            Owned::Postgres(pg) => {
                let Pg { cell, statements } = &mut **pg;
                let c = cell.get_mut();
                let mut attempt = 1;
                loop {
                    match postgres_transaction(
                        c,
                        statements,
                        IsolationLevel::Serializable,
                        false,
                        &mut f,
                    ) {
                        Err(e) if e.is_retryable() && attempt < MAX_ATTEMPTS => {
                            tracing::debug!(attempt, error = %e, "write raced another; again");
                            std::thread::sleep(backoff(attempt));
                            attempt += 1;
                        }
                        done => return done,
                    }
                }
            }
        }
    }

    /// Runs `f` in a write transaction that holds the exclusive writer's lock `key` from
    /// its first statement to its commit, and commits what it wrote: SQLite's `BEGIN
    /// IMMEDIATE`; on PostgreSQL `pg_advisory_xact_lock(key)` in a `READ COMMITTED`
    /// transaction, so that every statement after the lock sees every write committed
    /// before it. Writers that all take the lock run one at a time across every
    /// connection and process, as SQLite's writers do: their read-check-writes are exact
    /// without being run again, so `f` runs once. An error from `f` rolls back.
    pub fn write_exclusive<T>(
        &mut self,
        key: i64,
        f: impl FnOnce(&Conn<'_>) -> Result<T>,
    ) -> Result<T> {
        match &mut self.engine {
            Owned::Sqlite(c) => {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let v = f(&Conn::sqlite(&tx))?;
                tx.commit()?;
                Ok(v)
            }
            Owned::Postgres(pg) => {
                let Pg { cell, statements } = &mut **pg;
                let tx = cell
                    .get_mut()
                    .build_transaction()
                    .isolation_level(IsolationLevel::ReadCommitted)
                    .start()?;
                let tx = Pg::new(tx, &*statements);
                let conn = Conn::postgres(&tx);
                conn.execute("SELECT pg_advisory_xact_lock(?1)", crate::params![key])?;
                let v = f(&conn)?;
                tx.cell.into_inner().commit()?;
                Ok(v)
            }
        }
    }

    /// Whether the connection is gone for good (PostgreSQL's server closed it, or the
    /// network did): a new one is needed.
    pub fn is_closed(&self) -> bool {
        match &self.engine {
            Owned::Sqlite(_) => false,
            Owned::Postgres(c) => c.cell.borrow().is_closed(),
        }
    }

    /// Runs `f` on one consistent snapshot, writing nothing.
    pub fn read<T>(&mut self, mut f: impl FnMut(&Conn<'_>) -> Result<T>) -> Result<T> {
        match &mut self.engine {
            Owned::Sqlite(c) => {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)?;
                let v = f(&Conn::sqlite(&tx))?;
                tx.commit()?;
                Ok(v)
            }
            // A read-only snapshot never fails for racing a write.
            Owned::Postgres(pg) => {
                let Pg { cell, statements } = &mut **pg;
                postgres_transaction(
                    cell.get_mut(),
                    statements,
                    IsolationLevel::RepeatableRead,
                    true,
                    &mut f,
                )
            }
        }
    }
}

fn postgres_transaction<T>(
    client: &mut postgres::Client,
    statements: &Statements,
    isolation: IsolationLevel,
    read_only: bool,
    f: &mut impl FnMut(&Conn<'_>) -> Result<T>,
) -> Result<T> {
    let tx = client
        .build_transaction()
        .isolation_level(isolation)
        .read_only(read_only)
        .start()?;
    let tx = Pg::new(tx, statements);
    let v = f(&Conn::postgres(&tx))?;
    tx.cell.into_inner().commit()?;
    Ok(v)
}

/// Exponential, with jitter so that two writers that raced do not race again in step.
fn backoff(attempt: u32) -> Duration {
    let ceiling = Duration::from_millis(1u64 << attempt.min(16)).min(MAX_BACKOFF);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = u64::from(nanos) % (ceiling.as_micros() as u64).max(1);
    ceiling / 2 + Duration::from_micros(jitter / 2)
}

/// An address with any password hidden, for errors and logs.
pub fn redacted(address: &str) -> String {
    // scheme://user:password@host...: everything between the first ':' after the scheme
    // and the '@' is the password.
    let Some((scheme, rest)) = address.split_once("://") else {
        return address.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => address.to_string(),
        },
        None => address.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_hide_their_password() {
        assert_eq!(
            redacted("postgres://gpufleet:s3cret@db-1:5432,db-2/gpufleet"),
            "postgres://gpufleet:***@db-1:5432,db-2/gpufleet"
        );
        assert_eq!(
            redacted("postgres://db-1/gpufleet"),
            "postgres://db-1/gpufleet"
        );
        let e = Database::postgres("mysql://a:b@c/d")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mysql://a:***@c/d") && !e.contains(":b@"), "{e}");
    }

    #[test]
    fn backoff_stays_under_its_ceiling() {
        for attempt in 1..40 {
            assert!(backoff(attempt) <= MAX_BACKOFF, "{attempt}");
        }
    }

    #[test]
    fn an_sqlite_write_commits_and_a_failed_one_leaves_nothing() {
        let mut db = Database::sqlite(rusqlite::Connection::open_in_memory().unwrap());
        db.conn()
            .execute_batch("CREATE TABLE t (a INTEGER NOT NULL)")
            .unwrap();
        db.write(|c| c.execute("INSERT INTO t (a) VALUES (?1)", crate::params![1i64]))
            .unwrap();
        let failed: Result<()> = db.write(|c| {
            c.execute("INSERT INTO t (a) VALUES (?1)", crate::params![2i64])?;
            Err(Error::NoRows)
        });
        assert!(failed.is_err());
        let all = db
            .read(|c| c.query_map("SELECT a FROM t", crate::params![], |r| r.get::<i64>(0)))
            .unwrap();
        assert_eq!(all, vec![1]);
    }
}
