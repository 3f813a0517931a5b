//! Group commit: write requests that arrive together share one transaction.
//!
//! One writer thread takes queued requests, runs each inside its own savepoint of the
//! open transaction, and commits once for all of them. Each request's read-check-write
//! sees every earlier request's writes (they still run one at a time), a refusal rolls
//! back only its own savepoint, and nobody is answered before the COMMIT that makes its
//! write durable. Under load one commit serves many requests instead of one each, and
//! requests no longer queue on the connection's mutex in separate threads.
//!
//! On SQLite the writer is the store's one writer connection. With a commit record
//! (`store::commit_record`), each transaction also counts itself in the database, and the
//! new count is written to the record after the COMMIT and before any answer: what was
//! acknowledged is never more than the record says.
//!
//! On PostgreSQL each replica has a writer, and every batch holds the database's writer
//! lock from its first statement to its commit (`Database::write_exclusive`): batches of
//! every replica run one at a time and each statement sees every batch committed before,
//! as SQLite's one writer does, so a request's read-check-write is exact across replicas
//! and runs once. A connection the server closed (a failover) is opened again for the
//! next batch; the requests of the batch it failed are answered with the error.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use gpufleet_sql::{Conn, Database, Savepoint};
use rusqlite::{Connection, Transaction};

use crate::error::Error;
use crate::store::commit_record::{self, CommitRecord};

/// How many requests one transaction takes at most, so a commit never waits long.
const MAX_BATCH: usize = 64;

/// The key of the PostgreSQL advisory lock every replica's writer takes for a batch.
pub const WRITER_LOCK: i64 = 0x0067_7066_6c65_6574; // "gpfleet"

/// Why a batch's COMMIT failed, told to each of its requests: the domain's error for it
/// (a full disk, an unreachable database, or an internal error), made anew for each.
#[derive(Clone)]
struct CommitFailed {
    kind: Failure,
    text: String,
}

#[derive(Clone, Copy)]
enum Failure {
    DiskFull,
    Unreachable,
    Internal,
}

impl CommitFailed {
    fn of(e: &gpufleet_sql::Error) -> CommitFailed {
        tracing::error!(error = %e, "database error");
        let kind = match e {
            gpufleet_sql::Error::Sqlite(e) if crate::error::is_disk_full(e) => Failure::DiskFull,
            gpufleet_sql::Error::Postgres(e) if e.is_closed() || e.as_db_error().is_none() => {
                Failure::Unreachable
            }
            _ => Failure::Internal,
        };
        CommitFailed {
            kind,
            text: format!("state database error: {e}"),
        }
    }

    fn error(self) -> Error {
        match self.kind {
            Failure::DiskFull => Error::DiskFull(self.text),
            Failure::Unreachable => Error::Unavailable(self.text),
            Failure::Internal => Error::Internal(self.text),
        }
    }
}

/// What a request does once its transaction has committed (or failed to).
type Reply = Box<dyn FnOnce(Result<(), CommitFailed>) + Send>;
/// A queued request: runs in the open transaction and leaves its reply for later; given
/// no transaction (the database could not be reached), it answers that at once.
type Job = Box<dyn FnOnce(Option<Conn<'_>>) -> Reply + Send>;

/// The database a writer writes.
pub enum Writer {
    /// The store's writer connection, and its commit record when it has one.
    Sqlite {
        db: Arc<Mutex<Connection>>,
        record: Option<CommitRecord>,
    },
    /// A PostgreSQL database's address; the writer holds its own connection.
    Postgres { url: String },
}

/// The queue in front of the writer thread.
pub struct GroupCommit {
    queue: mpsc::Sender<Job>,
}

impl GroupCommit {
    /// Starts the writer thread over SQLite's `db`, keeping `record` (when given) one step
    /// behind each commit; it stops when this is dropped.
    pub fn start(db: Arc<Mutex<Connection>>, record: Option<CommitRecord>) -> GroupCommit {
        Self::start_writer(Writer::Sqlite { db, record })
    }

    /// Starts the writer thread over `writer`.
    pub fn start_writer(writer: Writer) -> GroupCommit {
        let (queue, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("gpufleet-writer".into())
            .spawn(move || match writer {
                Writer::Sqlite { db, record } => run_sqlite(&db, record.as_ref(), &jobs),
                Writer::Postgres { url } => run_postgres(&url, &jobs),
            })
            .expect("start the state writer thread");
        GroupCommit { queue }
    }

    /// Runs `work` in a savepoint of the next transaction and answers once that
    /// transaction has committed. `work` keeps its writes with `Savepoint::commit`;
    /// dropping the savepoint (a refusal, a dry run) rolls back only its own.
    /// Its error is the caller's: the domain's [`Error`], or anything made from one (a
    /// gRPC status at the API edge).
    pub async fn write<T: Send + 'static, E: From<Error> + Send + 'static>(
        &self,
        work: impl FnOnce(Savepoint<'_>) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let outcome = match conn {
                Some(conn) => Savepoint::begin(conn)
                    .map_err(|e| E::from(Error::from(e)))
                    .and_then(work),
                None => Err(E::from(Error::Unavailable(
                    "the state database cannot be reached; try again".into(),
                ))),
            };
            Box::new(move |committed: Result<(), CommitFailed>| {
                let committed = committed.map_err(|f| E::from(f.error()));
                // The caller may have gone away; the write stands either way.
                let _ = reply.send(outcome.and_then(|value| committed.map(|()| value)));
            })
        });
        self.queue
            .send(job)
            .map_err(|_| Error::Unavailable("the state writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| E::from(Error::Internal("request worker failed".into())))?
    }
}

fn run_sqlite(db: &Mutex<Connection>, record: Option<&CommitRecord>, jobs: &mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut conn = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let tx = match conn.transaction() {
            Ok(tx) => tx,
            Err(e) => {
                // Dropping the job answers its caller with an error.
                tracing::error!(error = %e, "cannot begin a write transaction");
                continue;
            }
        };
        let changes_before = tx.total_changes();
        let replies = run_batch(first, Conn::sqlite(&tx), jobs);
        // A batch of refusals and reads changed no row: it writes nothing, so it counts
        // no commit (and, under synchronous=FULL, costs no fsync).
        let record = record.filter(|_| tx.total_changes() != changes_before);
        let committed = commit(tx, record);
        drop(conn);
        for reply in replies {
            reply(committed.clone());
        }
    }
}

fn run_postgres(url: &str, jobs: &mpsc::Receiver<Job>) {
    let mut db: Option<Database> = None;
    while let Ok(first) = jobs.recv() {
        if db.as_ref().is_none_or(Database::is_closed) {
            db = match Database::postgres(url) {
                Ok(db) => Some(db),
                Err(e) => {
                    tracing::error!(error = %e, "cannot connect the state writer to its database");
                    first(None)(Ok(()));
                    continue;
                }
            };
        }
        let Some(conn) = db.as_mut() else { continue };
        let mut replies = Vec::new();
        let committed = conn
            .write_exclusive(WRITER_LOCK, |c| {
                replies = run_batch(first, *c, jobs);
                Ok(())
            })
            .map_err(|e| CommitFailed::of(&e));
        for reply in replies {
            reply(committed.clone());
        }
    }
}

/// Runs `first` and whatever else is queued, up to [`MAX_BATCH`], in the open transaction.
fn run_batch(first: Job, conn: Conn<'_>, jobs: &mpsc::Receiver<Job>) -> Vec<Reply> {
    let mut replies = vec![run_one(first, conn)];
    while replies.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => replies.push(run_one(job, conn)),
            Err(_) => break,
        }
    }
    replies
}

/// Commits the batch, counted in the database and then in `record` when there is one.
fn commit(tx: Transaction<'_>, record: Option<&CommitRecord>) -> Result<(), CommitFailed> {
    let failed = |e: rusqlite::Error| CommitFailed::of(&gpufleet_sql::Error::Sqlite(e));
    let Some(record) = record else {
        return tx.commit().map_err(failed);
    };
    // A batch that cannot be counted is not committed (dropping it rolls it back).
    let count = commit_record::advance(&tx).map_err(failed)?;
    tx.commit().map_err(failed)?;
    // The commit stands either way; a record left behind only weakens the next start's
    // check, it never fails it.
    if let Err(e) = record.write(count) {
        tracing::error!(error = %e, path = %record.path().display(), "cannot update the commit record");
    }
    Ok(())
}

/// One request; a panic in it rolls back its savepoint (dropped while unwinding) and
/// answers its caller with an internal error, and the others carry on.
fn run_one(job: Job, conn: Conn<'_>) -> Reply {
    std::panic::catch_unwind(AssertUnwindSafe(|| job(Some(conn)))).unwrap_or_else(|_| {
        tracing::error!("a write request panicked; its changes were rolled back");
        Box::new(|_| {})
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::db_error;
    use gpufleet_sql::params;
    use tonic::Status;

    fn db() -> Arc<Mutex<Connection>> {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
            .unwrap();
        Arc::new(Mutex::new(conn))
    }

    fn rows(db: &Mutex<Connection>) -> Vec<(String, i64)> {
        let conn = db.lock().unwrap();
        let mut stmt = conn.prepare("SELECT k, v FROM t ORDER BY k").unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap();
        rows
    }

    /// Inserts `k` unless a row has it already (a read-check-write), keeping it.
    fn insert(k: &'static str) -> impl FnOnce(Savepoint<'_>) -> Result<i64, Status> + Send {
        move |sp| {
            let taken: i64 = sp
                .query_row("SELECT COUNT(*) FROM t WHERE k = ?1", params![k], |r| {
                    r.get(0)
                })
                .map_err(db_error)?;
            if taken > 0 {
                return Err(Status::already_exists(k));
            }
            sp.execute("INSERT INTO t (k, v) VALUES (?1, 1)", params![k])
                .map_err(db_error)?;
            let n = sp
                .query_row("SELECT COUNT(*) FROM t", params![], |r| r.get(0))
                .map_err(db_error)?;
            sp.commit().map_err(db_error)?;
            Ok(n)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_each_see_the_others_and_refusals_roll_back_alone() {
        let db = db();
        let writer = Arc::new(GroupCommit::start(db.clone(), None));
        let keys = ["a", "b", "c", "d", "a", "e", "b", "f"];
        let mut tasks = Vec::new();
        for k in keys {
            let w = writer.clone();
            tasks.push(tokio::spawn(async move { w.write(insert(k)).await }));
        }
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        // Each key is written once; the repeat of a key is refused, whichever came first.
        assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 6);
        for refused in answers.iter().filter_map(|a| a.as_ref().err()) {
            assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        }
        // Each kept write counted the rows before it: 1..=6, none twice.
        let mut counts: Vec<i64> = answers.iter().filter_map(|a| a.clone().ok()).collect();
        counts.sort();
        assert_eq!(counts, vec![1, 2, 3, 4, 5, 6]);
        let keys: Vec<String> = rows(&db).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec!["a", "b", "c", "d", "e", "f"]);
    }

    #[tokio::test]
    async fn a_dry_run_and_a_panic_leave_nothing_and_the_writer_carries_on() {
        let db = db();
        let writer = GroupCommit::start(db.clone(), None);
        let dry = writer
            .write(|sp| -> Result<(), Status> {
                sp.execute("INSERT INTO t (k, v) VALUES ('dry', 1)", params![])
                    .map_err(db_error)?;
                // Dropped without commit: rolled back.
                Ok(())
            })
            .await;
        assert!(dry.is_ok());
        let panicked = writer
            .write(|sp| -> Result<(), Status> {
                sp.execute("INSERT INTO t (k, v) VALUES ('boom', 1)", params![])
                    .map_err(db_error)?;
                panic!("a bug in a handler");
            })
            .await
            .unwrap_err();
        assert_eq!(panicked.code(), tonic::Code::Internal);
        assert_eq!(writer.write(insert("kept")).await.unwrap(), 1);
        assert_eq!(rows(&db), vec![("kept".to_string(), 1)]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_commit_is_counted_in_the_database_and_then_in_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = crate::store::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
            .unwrap();
        let start = commit_record::in_database(&conn).unwrap();
        let record_path = commit_record::path_for(&path);
        let record = CommitRecord::reset(&record_path, &start).unwrap();
        let db = Arc::new(Mutex::new(conn));
        let writer = Arc::new(GroupCommit::start(db.clone(), Some(record)));
        let mut tasks = Vec::new();
        for k in ["a", "b", "c", "d", "e"] {
            let w = writer.clone();
            tasks.push(tokio::spawn(async move { w.write(insert(k)).await }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let counted = commit_record::in_database(&db.lock().unwrap()).unwrap();
        // One count per transaction, however the five were batched.
        assert!((start.commits + 1..=start.commits + 5).contains(&counted.commits));
        assert_eq!(
            commit_record::read(&record_path).unwrap(),
            commit_record::Recorded::Count(counted.clone())
        );
        // A refusal writes nothing, and counts nothing.
        let refused = writer.write(insert("a")).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        assert_eq!(
            commit_record::in_database(&db.lock().unwrap()).unwrap(),
            counted
        );
    }

    #[tokio::test]
    async fn a_write_with_no_room_left_is_resource_exhausted_and_the_writer_carries_on() {
        let db = db();
        // SQLite's own bound on the file: past it a write fails as on a full disk.
        let pages: i64 = db
            .lock()
            .unwrap()
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        db.lock()
            .unwrap()
            .pragma_update(None, "max_page_count", pages + 1)
            .unwrap();
        let writer = GroupCommit::start(db.clone(), None);
        let full = writer
            .write(|sp| -> Result<(), Status> {
                sp.execute(
                    "INSERT INTO t (k, v) VALUES (hex(randomblob(100000)), 1)",
                    params![],
                )
                .map_err(db_error)?;
                sp.commit().map_err(db_error)
            })
            .await
            .unwrap_err();
        assert_eq!(full.code(), tonic::Code::ResourceExhausted, "{full:?}");
        assert_eq!(
            full.message(),
            "state database error: database or disk is full"
        );
        assert_eq!(writer.write(insert("small")).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_failed_commit_answers_every_request_of_the_batch_with_its_error() {
        let db = db();
        // A deferred foreign key fails at COMMIT, after the savepoint was released.
        db.lock()
            .unwrap()
            .execute_batch(
                "PRAGMA foreign_keys = ON;
                 CREATE TABLE parent (id TEXT PRIMARY KEY);
                 CREATE TABLE child (p TEXT REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);",
            )
            .unwrap();
        let writer = GroupCommit::start(db.clone(), None);
        let failed = writer
            .write(|sp| -> Result<(), Status> {
                sp.execute("INSERT INTO child (p) VALUES ('missing')", params![])
                    .map_err(db_error)?;
                sp.commit().map_err(db_error)
            })
            .await
            .unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Internal);
        assert!(failed.message().contains("FOREIGN KEY"), "{failed:?}");
        let children: i64 = db
            .lock()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM child", [], |r| r.get(0))
            .unwrap();
        assert_eq!(children, 0);
        // The connection is usable afterwards.
        assert_eq!(writer.write(insert("after")).await.unwrap(), 1);
    }
}
