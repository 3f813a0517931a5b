//! The store's schema on PostgreSQL (issue 41), as far as its modules run on both engines
//! (`gpufleet_sql`): each ported module's tables, in PostgreSQL's types (every integer a
//! `BIGINT`, as SQLite's `INTEGER` is 64-bit), applied in order and recorded in
//! `schema_version` as the SQLite store records its own. `serve` does not yet run on
//! PostgreSQL: the modules not listed here still speak only SQLite.

use gpufleet_sql::{params, Conn, Database};

/// One migration: what it is for, and its statements.
pub struct Migration {
    pub what: &'static str,
    pub sql: &'static str,
}

pub const MIGRATIONS: &[Migration] = &[Migration {
    what: "leases: the singletons' lease and its epoch (store::leases)",
    sql: "CREATE TABLE leases (
              name TEXT PRIMARY KEY,
              holder TEXT NOT NULL,
              epoch BIGINT NOT NULL CHECK (epoch >= 1),
              expires_at BIGINT NOT NULL
          )",
}];

/// Applies the migrations the database has not had, each in its own transaction; a
/// database newer than this binary is refused. Replicas starting at once on one empty
/// database race here: the loser's transaction fails and is run again, and finds the
/// version applied.
pub fn migrate(db: &mut Database, now: i64) -> anyhow::Result<usize> {
    db.conn().execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )?;
    let mut applied = 0;
    for (i, m) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        let ran = db.write(|c| {
            if current(c)? >= version {
                return Ok(false);
            }
            c.execute_batch(m.sql)?;
            c.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
                params![version, now],
            )?;
            Ok(true)
        })?;
        if ran {
            tracing::info!(
                version,
                what = m.what,
                "applied PostgreSQL schema migration"
            );
            applied += 1;
        }
    }
    let current = db.read(current)?;
    if current > MIGRATIONS.len() as i64 {
        anyhow::bail!(
            "the database has schema version {current}, newer than this binary knows ({}); use a newer gpufleet-agent",
            MIGRATIONS.len()
        );
    }
    Ok(applied)
}

fn current(c: &Conn<'_>) -> gpufleet_sql::Result<i64> {
    c.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        params![],
        |r| r.get(0),
    )
}

/// The store's tests on both engines: an SQLite store opened as `serve` opens it, and a
/// fresh database on a PostgreSQL server of the test's own, migrated.
#[cfg(test)]
pub mod engines {
    use gpufleet_sql::test_server::TestServer;
    use gpufleet_sql::Database;

    /// What keeps a test's database alive: its folder, or its server.
    pub enum Guard {
        Sqlite(#[allow(dead_code)] tempfile::TempDir),
        Postgres(#[allow(dead_code)] TestServer),
    }

    /// A migrated SQLite store.
    pub fn sqlite() -> (Guard, Database) {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open(&dir.path().join("state.db")).unwrap();
        (Guard::Sqlite(dir), Database::Sqlite(conn))
    }

    /// A migrated PostgreSQL database, and its address for more connections.
    pub fn postgres() -> (Guard, Database, String) {
        let server = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
        let url = server
            .database("gpufleet")
            .unwrap_or_else(|e| panic!("{e}"));
        let mut db = Database::postgres(&url).unwrap();
        super::migrate(&mut db, 1).unwrap();
        (Guard::Postgres(server), db, url)
    }

    /// Both, SQLite first.
    pub fn both() -> Vec<(Guard, Database)> {
        let (pg_guard, pg, _) = postgres();
        let (lite_guard, lite) = sqlite();
        vec![(lite_guard, lite), (pg_guard, pg)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_applies_nothing_the_second_time() {
        let (_guard, mut db, _) = engines::postgres();
        assert_eq!(migrate(&mut db, 2).unwrap(), 0);
        let version = db.read(current).unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused() {
        let (_guard, mut db, _) = engines::postgres();
        db.conn()
            .execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?1, 1)",
                params![MIGRATIONS.len() as i64 + 1],
            )
            .unwrap();
        let e = migrate(&mut db, 2).unwrap_err().to_string();
        assert!(e.contains("newer than this binary knows"), "{e}");
    }
}
