//! The engine seam on a real PostgreSQL server (Debian's, started by the test): the same
//! statements and values as on SQLite, and serializable writes that race and retry.

use gpufleet_sql::test_server::TestServer;
use gpufleet_sql::{params, Database, Engine, Error};

fn server() -> TestServer {
    TestServer::start().unwrap_or_else(|e| panic!("{e}"))
}

const SCHEMA: &str = "CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT NOT NULL, \
                      share DOUBLE PRECISION, data BYTEA, flag BIGINT NOT NULL DEFAULT 0)";

/// The same statements on both engines read back the same values.
#[test]
fn the_same_statements_read_the_same_values_on_both_engines() {
    let pg = server();
    let url = pg.database("values").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engines = [
        Database::sqlite(rusqlite::Connection::open(dir.path().join("t.db")).unwrap()),
        Database::postgres(&url).unwrap(),
    ];
    let mut seen = Vec::new();
    for mut db in engines {
        db.conn().execute_batch(SCHEMA).unwrap();
        let inserted = db
            .write(|c| {
                c.execute(
                    "INSERT INTO t (id, name, share, data, flag) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![1i64, "it's ?1", 0.25f64, vec![0u8, 255], true],
                )?;
                c.execute(
                    "INSERT INTO t (id, name, share, data) VALUES (?1, ?2, ?3, ?4)",
                    params![2u32, String::from("b"), None::<f64>, None::<Vec<u8>>],
                )
            })
            .unwrap();
        assert_eq!(inserted, 1);
        let rows = db
            .read(|c| {
                c.query_map(
                    "SELECT id, name, share, data, flag FROM t WHERE id >= ?1 ORDER BY id",
                    params![1i64],
                    |r| {
                        Ok((
                            r.get::<u32>(0)?,
                            r.get::<String>(1)?,
                            r.get::<Option<f64>>(2)?,
                            r.get::<Option<Vec<u8>>>(3)?,
                            r.get::<bool>(4)?,
                        ))
                    },
                )
            })
            .unwrap();
        let missing = db
            .read(|c| {
                c.query_opt("SELECT id FROM t WHERE id = ?1", params![9i64], |r| {
                    r.get::<i64>(0)
                })
            })
            .unwrap();
        assert_eq!(missing, None);
        assert!(matches!(
            db.read(
                |c| c.query_row("SELECT id FROM t WHERE id = ?1", params![9i64], |r| r
                    .get::<i64>(0))
            ),
            Err(Error::NoRows)
        ));
        // A column that does not fit is an error naming it, not a wrapped number.
        let wrong = db
            .read(|c| c.query_row("SELECT -1", params![], |r| r.get::<u32>(0)))
            .unwrap_err();
        assert!(
            wrong
                .to_string()
                .starts_with("column 0: -1 does not fit u32"),
            "{wrong}"
        );
        seen.push((db.engine(), rows));
    }
    assert_eq!(seen[0].0, Engine::Sqlite);
    assert_eq!(seen[1].0, Engine::Postgres);
    assert_eq!(seen[0].1, seen[1].1);
    assert_eq!(
        seen[1].1,
        vec![
            (
                1,
                "it's ?1".to_string(),
                Some(0.25),
                Some(vec![0, 255]),
                true
            ),
            (2, "b".to_string(), None, None, false),
        ]
    );
}

/// Many writers increment one counter by read-then-write: every increment lands exactly
/// once, because PostgreSQL fails the writes that raced and they run again.
#[test]
fn racing_read_then_write_transactions_lose_no_update() {
    let pg = server();
    let url = pg.database("race").unwrap();
    let mut db = Database::postgres(&url).unwrap();
    db.conn()
        .execute_batch("CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL); INSERT INTO counter VALUES (1, 0)")
        .unwrap();
    const WRITERS: usize = 6;
    const EACH: usize = 25;
    let attempts = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..WRITERS {
            let url = url.clone();
            let attempts = &attempts;
            s.spawn(move || {
                let mut db = Database::postgres(&url).unwrap();
                for _ in 0..EACH {
                    db.write(|c| {
                        attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let n: i64 =
                            c.query_row("SELECT n FROM counter WHERE id = 1", params![], |r| {
                                r.get(0)
                            })?;
                        c.execute("UPDATE counter SET n = ?1 WHERE id = 1", params![n + 1])
                    })
                    .unwrap();
                }
            });
        }
    });
    let n: i64 = db
        .read(|c| {
            c.query_row("SELECT n FROM counter WHERE id = 1", params![], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert_eq!(n, (WRITERS * EACH) as i64);
    let attempts = attempts.into_inner();
    eprintln!("{} increments in {attempts} attempts", WRITERS * EACH);
    assert!(attempts >= WRITERS * EACH);
}

/// A failed write leaves nothing; the error is the statement's, with the server's words.
#[test]
fn a_failed_write_leaves_nothing_and_says_why() {
    let pg = server();
    let url = pg.database("failed").unwrap();
    let mut db = Database::postgres(&url).unwrap();
    db.conn().execute_batch(SCHEMA).unwrap();
    let e = db
        .write(|c| {
            c.execute(
                "INSERT INTO t (id, name) VALUES (?1, ?2)",
                params![1i64, "a"],
            )?;
            c.execute(
                "INSERT INTO t (id, name) VALUES (?1, ?2)",
                params![1i64, "again"],
            )
        })
        .unwrap_err();
    assert_eq!(e.sqlstate(), Some("23505"), "{e}");
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("duplicate key"), "{e}");
    let n: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM t", params![], |r| r.get(0)))
        .unwrap();
    assert_eq!(n, 0);
}

/// Savepoints behave on PostgreSQL as on SQLite: a dropped one, nested or not, leaves
/// nothing; a committed one keeps its rows with the transaction.
#[test]
fn savepoints_keep_or_drop_their_rows_on_postgres() {
    let pg = server();
    let url = pg.database("savepoints").unwrap();
    let mut db = Database::postgres(&url).unwrap();
    db.conn().execute_batch(SCHEMA).unwrap();
    db.write(|c| {
        let insert = |sp: &gpufleet_sql::Savepoint<'_>, id: i64| {
            sp.execute("INSERT INTO t (id, name) VALUES (?1, 'x')", params![id])
        };
        let kept = gpufleet_sql::Savepoint::begin(*c)?;
        insert(&kept, 1)?;
        kept.commit()?;
        {
            let dropped = gpufleet_sql::Savepoint::begin(*c)?;
            insert(&dropped, 2)?;
        }
        let mut outer = gpufleet_sql::Savepoint::begin(*c)?;
        insert(&outer, 3)?;
        {
            let inner = outer.savepoint()?;
            insert(&inner, 4)?;
        }
        let inner = outer.savepoint()?;
        insert(&inner, 5)?;
        inner.commit()?;
        outer.commit()?;
        // A statement that fails inside a savepoint spoils only the savepoint.
        {
            let failing = gpufleet_sql::Savepoint::begin(*c)?;
            assert!(insert(&failing, 1).is_err());
        }
        // One dropped at the end of its own statement leaves nothing either.
        insert(&gpufleet_sql::Savepoint::begin(*c)?, 6).map(|_| ())
    })
    .unwrap();
    let ids = db
        .read(|c| {
            c.query_map("SELECT id FROM t ORDER BY id", params![], |r| {
                r.get::<i64>(0)
            })
        })
        .unwrap();
    assert_eq!(ids, vec![1, 3, 5]);
}

/// Writers under the exclusive writer's lock run one at a time across connections: each
/// read-then-write lands once, none is run again, and none fails.
#[test]
fn writers_under_the_exclusive_lock_lose_no_update_and_never_retry() {
    let pg = server();
    let url = pg.database("exclusive").unwrap();
    let mut db = Database::postgres(&url).unwrap();
    db.conn()
        .execute_batch("CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL); INSERT INTO counter VALUES (1, 0)")
        .unwrap();
    const WRITERS: usize = 6;
    const EACH: usize = 25;
    std::thread::scope(|s| {
        for _ in 0..WRITERS {
            let url = url.clone();
            s.spawn(move || {
                let mut db = Database::postgres(&url).unwrap();
                for _ in 0..EACH {
                    db.write_exclusive(41, |c| {
                        let n: i64 =
                            c.query_row("SELECT n FROM counter WHERE id = 1", params![], |r| {
                                r.get(0)
                            })?;
                        c.execute("UPDATE counter SET n = ?1 WHERE id = 1", params![n + 1])
                    })
                    .unwrap();
                }
            });
        }
    });
    let n: i64 = db
        .read(|c| {
            c.query_row("SELECT n FROM counter WHERE id = 1", params![], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert_eq!(n, (WRITERS * EACH) as i64);
}

/// The pool lends at most its bound at once: a fourth reader waits for one of three to
/// come back, and connections are reused rather than opened anew.
#[test]
fn the_pool_lends_at_most_its_bound_and_reuses_connections() {
    let pg = server();
    let url = pg.database("pool").unwrap();
    let pool = gpufleet_sql::Pool::new(&url, 3);
    let backends = |db: &mut Database| -> i64 {
        db.read(|c| {
            c.query_row("SELECT CAST(pg_backend_pid() AS BIGINT)", params![], |r| {
                r.get(0)
            })
        })
        .unwrap()
    };
    let held: Vec<_> = (0..3).map(|_| pool.get().unwrap()).collect();
    let mut pids: Vec<i64> = Vec::new();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let mut db = pool.get().unwrap();
            backends(&mut db)
        });
        // The fourth waits: no fourth connection is opened while three are lent.
        let open = |pg_url: &str| -> i64 {
            let mut admin = Database::postgres(pg_url).unwrap();
            admin
                .read(|c| {
                    c.query_row(
                        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = 'pool' AND pid <> pg_backend_pid()",
                        params![],
                        |r| r.get(0),
                    )
                })
                .unwrap()
        };
        assert_eq!(open(&url), 3);
        let mut held = held;
        pids = held.iter_mut().map(|db| backends(db)).collect();
        drop(held);
        let got = waiting.join().unwrap();
        assert!(pids.contains(&got), "{got} is not one of {pids:?}");
    });
}

/// A server killed (SIGKILL to every process of it) and started again has every commit it
/// acknowledged; a pooled connection that broke with it fails its next use once, and the
/// pool then connects anew.
#[test]
fn acknowledged_commits_outlive_a_crash_and_the_pool_connects_again() {
    let mut pg = server();
    let url = pg.database("crash").unwrap();
    let pool = gpufleet_sql::Pool::new(&url, 1);
    let count = |pool: &gpufleet_sql::Pool| -> gpufleet_sql::Result<i64> {
        pool.get()?
            .read(|c| c.query_row("SELECT COUNT(*) FROM t", params![], |r| r.get(0)))
    };
    pool.get()
        .unwrap()
        .conn()
        .execute_batch("CREATE TABLE t (id BIGINT PRIMARY KEY)")
        .unwrap();
    for i in 0..50i64 {
        pool.get()
            .unwrap()
            .write(|c| c.execute("INSERT INTO t (id) VALUES (?1)", params![i]))
            .unwrap();
    }
    pg.crash_and_restart().unwrap_or_else(|e| panic!("{e}"));
    let broken = count(&pool);
    assert!(broken.is_err(), "{broken:?}");
    assert_eq!(count(&pool).unwrap(), 50);
    // And it takes writes again.
    pool.get()
        .unwrap()
        .write(|c| c.execute("INSERT INTO t (id) VALUES (?1)", params![50i64]))
        .unwrap();
    assert_eq!(count(&pool).unwrap(), 51);
}
