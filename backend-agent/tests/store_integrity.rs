//! A damaged store is refused at start, naming the file and what was lost (issue 19): a
//! WAL truncated or deleted after acknowledged writes, a truncated `state.db`; and
//! `serve --accept-rollback` (or a backup put back) then starts it.
//!
//! Real `gpufleet-agent serve` processes on real SQLite files, killed with SIGKILL so
//! nothing checkpoints the WAL on the way out.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use gpufleet_proto::v1::*;
use rusqlite::{Connection, OpenFlags};

/// Far above a start that fails at once; only there so a hang fails the test.
const HANG: Duration = Duration::from_secs(60);
/// Tenants created while the WAL is held: each is one acknowledged commit.
const WRITES: usize = 200;

fn wal(data: &Path) -> PathBuf {
    data.join("state.db-wal")
}

/// A read-only connection inside a read transaction: while it is open, no checkpoint
/// copies later commits into `state.db`, so they stay in the WAL alone (as they would
/// under load, or between two checkpoints). Read-only, it never checkpoints itself, not
/// even when closed.
fn hold_the_wal(data: &Path) -> Connection {
    let conn = Connection::open_with_flags(
        data.join("state.db"),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    conn.execute_batch("BEGIN").unwrap();
    let _: i64 = conn
        .query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get(0))
        .unwrap();
    conn
}

/// The tenants whose name is LIKE `pattern` in a copy of state.db (with its WAL when
/// `with_wal`); 0 when the copy has no tenants table yet.
fn tenants_in_copy(data: &Path, with_wal: bool, pattern: &str) -> i64 {
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(data.join("state.db"), copy.path().join("state.db")).unwrap();
    if with_wal {
        std::fs::copy(wal(data), copy.path().join("state.db-wal")).unwrap();
    }
    let conn = Connection::open(copy.path().join("state.db")).unwrap();
    conn.query_row(
        "SELECT COUNT(*) FROM tenants WHERE name LIKE ?1",
        [pattern],
        |r| r.get(0),
    )
    .unwrap_or(0)
}

fn wal_tenants_in_copy(data: &Path, with_wal: bool) -> i64 {
    tenants_in_copy(data, with_wal, "wal-%")
}

/// Waits until the checkpointer has copied the tenant `name` into state.db itself.
fn await_checkpointed(data: &Path, name: &str) {
    let deadline = std::time::Instant::now() + HANG;
    while tenants_in_copy(data, false, name) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "tenant {name} never reached state.db"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a backend, creates [`WRITES`] tenants while the WAL is held, and kills it with
/// SIGKILL. Checks that the tenants are in the WAL and only there.
async fn acknowledged_writes_only_in_the_wal(data: &Path) {
    let agent = Agent::start(data);
    let mut c = agent.admin().await;
    c.tenant("before").await;
    // From a store whose schema is in state.db, so a copy of it alone can be read.
    await_checkpointed(data, "before");
    let held = hold_the_wal(data);
    for i in 0..WRITES {
        c.tenant(&format!("wal-{i}")).await;
    }
    drop(c);
    let status = agent.signal_and_wait(libc::SIGKILL, HANG);
    assert!(!status.success());
    drop(held);
    assert_eq!(
        wal_tenants_in_copy(data, false),
        0,
        "the acknowledged tenants must not be in state.db itself yet"
    );
    assert_eq!(
        wal_tenants_in_copy(data, true),
        WRITES as i64,
        "every acknowledged tenant is in state.db with its WAL"
    );
}

/// Runs `serve` on `data` expecting it to refuse to start; returns what it printed.
fn refused_start(data: &Path, extra: &[&str]) -> String {
    let log = data.with_extension("refused.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-token", ADMIN])
        .arg("--data-dir")
        .arg(data)
        .args(extra)
        .env_remove("GPUFLEET_ADMIN_TOKEN")
        .env_remove("GPUFLEET_FLEET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run gpufleet-agent");
    // Its stdout ends when it exits, or carries the listening line when it serves.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.contains("listening on") {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "serve started on a damaged store:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    eprintln!("serve refused to start:\n{text}");
    assert!(
        !status.success(),
        "serve must refuse to start; it printed:\n{text}"
    );
    text
}

async fn wal_tenants(c: &mut Clients) -> usize {
    c.tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tenants
        .iter()
        .filter(|t| t.name.starts_with("wal-"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_truncated_to_half_after_acknowledged_writes_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    acknowledged_writes_only_in_the_wal(&data).await;
    let len = std::fs::metadata(wal(&data)).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(wal(&data))
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    assert!(wal_tenants_in_copy(&data, true) < WRITES as i64);

    let text = refused_start(&data, &[]);
    assert!(
        text.contains("state.db is behind its commit record"),
        "{text}"
    );
    assert!(text.contains("acknowledged commits missing"), "{text}");
    assert!(text.contains("--accept-rollback"), "{text}");

    // Accepting the loss starts it, with what survived, and the next start is normal.
    let agent = Agent::start_with(&data, &["--admin-token", ADMIN, "--accept-rollback"]);
    let mut c = agent.admin().await;
    let left = wal_tenants(&mut c).await;
    assert!(left < WRITES, "{left} of {WRITES} tenants left");
    c.tenant("after").await;
    drop(c);
    assert!(agent.signal_and_wait(libc::SIGTERM, HANG).success());
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    assert_eq!(wal_tenants(&mut c).await, left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_wal_after_acknowledged_writes_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    acknowledged_writes_only_in_the_wal(&data).await;
    std::fs::remove_file(wal(&data)).unwrap();
    let _ = std::fs::remove_file(data.join("state.db-shm"));

    let text = refused_start(&data, &[]);
    let missing = format!(
        "state.db is behind its commit record {}",
        data.join("state.db.commits").display()
    );
    assert!(text.contains(&missing), "{text}");
    // Every tenant made while the WAL was held (and the background writes with them).
    let count = text
        .split_once("commit record ")
        .and_then(|(_, rest)| rest.split_once(": "))
        .and_then(|(_, rest)| rest.split_once(' '))
        .and_then(|(n, _)| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no count of missing commits in {text}"));
    assert!(
        count >= WRITES,
        "{count} commits missing, at least {WRITES}: {text}"
    );

    let agent = Agent::start_with(&data, &["--admin-token", ADMIN, "--accept-rollback"]);
    let mut c = agent.admin().await;
    assert_eq!(wal_tenants(&mut c).await, 0);
}

/// Stops `agent` cleanly: its last connection checkpoints the WAL into state.db.
/// `kept` tenants (`kept-N`), then a backup as docs/operations.md says to take one
/// (VACUUM INTO: a consistent copy, WAL included) at `dir/backup.db`, then `later` tenants
/// more (`later-N`); the agent stopped after each. Returns the backup's path.
async fn backup_between(dir: &Path, data: &Path, kept: usize, later: usize) -> PathBuf {
    let agent = Agent::start(data);
    let mut c = agent.admin().await;
    for i in 0..kept {
        c.tenant(&format!("kept-{i}")).await;
    }
    drop(c);
    stop(agent);
    let backup = dir.join("backup.db");
    Connection::open(data.join("state.db"))
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    let agent = Agent::start(data);
    let mut c = agent.admin().await;
    for i in 0..later {
        c.tenant(&format!("later-{i}")).await;
    }
    drop(c);
    stop(agent);
    backup
}

/// `serve --accept-rollback` on a backup put back by [`backup_between`]: it serves the
/// `kept` tenants of the backup and none of the later ones.
async fn accepted_backup(data: &Path, kept: usize) -> Agent {
    let agent = Agent::start_with(data, &["--admin-token", ADMIN, "--accept-rollback"]);
    let mut c = agent.admin().await;
    let names: Vec<String> = c
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tenants
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("kept-")).count(),
        kept
    );
    assert!(!names.iter().any(|n| n.starts_with("later-")));
    agent
}

fn stop(agent: Agent) {
    let status = agent.signal_and_wait(libc::SIGTERM, HANG);
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_state_db_is_refused_and_a_backup_put_back_starts_after_accepting_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let backup = backup_between(dir.path(), &data, 50, 200).await;
    // Everything in state.db itself (the last connection to close removes the WAL), so
    // the truncation below cuts committed pages.
    let conn = Connection::open(data.join("state.db")).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    assert!(!wal(&data).exists());
    let db = data.join("state.db");
    let len = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let text = refused_start(&data, &[]);
    assert!(
        text.contains(&format!("{} is damaged", db.display())),
        "{text}"
    );
    assert!(text.contains("put back a backup"), "{text}");
    // Accepting cannot serve a damaged file.
    let text = refused_start(&data, &["--accept-rollback"]);
    assert!(text.contains("is damaged"), "{text}");

    // The backup is older than the record: refused until the rollback is accepted.
    std::fs::copy(&backup, &db).unwrap();
    let text = refused_start(&data, &[]);
    assert!(
        text.contains("state.db is behind its commit record"),
        "{text}"
    );
    let agent = accepted_backup(&data, 50).await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_emptied_state_db_is_refused_instead_of_starting_empty() {
    for emptied in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let agent = Agent::start(&data);
        let mut c = agent.admin().await;
        c.tenant("team-a").await;
        drop(c);
        stop(agent);
        let db = data.join("state.db");
        for file in [wal(&data), data.join("state.db-shm")] {
            let _ = std::fs::remove_file(file);
        }
        if emptied {
            std::fs::File::create(&db).unwrap();
        } else {
            std::fs::remove_file(&db).unwrap();
        }

        let text = refused_start(&data, &[]);
        assert!(
            text.contains(&format!(
                "{} is missing or empty, but its commit record",
                db.display()
            )),
            "{text}"
        );
        assert_eq!(
            db.exists(),
            emptied,
            "the refused start makes no database in its place"
        );
        let agent = Agent::start_with(&data, &["--admin-token", ADMIN, "--accept-rollback"]);
        let mut c = agent.admin().await;
        assert_eq!(c.tenant_count().await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_backup_without_its_commit_record_or_a_deleted_record_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let backup = backup_between(dir.path(), &data, 20, 40).await;
    let (db, record) = (data.join("state.db"), data.join("state.db.commits"));

    // The record alone deleted: nothing was lost, but nothing could show it; refused.
    std::fs::remove_file(&record).unwrap();
    let text = refused_start(&data, &[]);
    assert!(
        text.contains(&format!("{} holds ", db.display()))
            && text.contains(&format!(
                "but its commit record {} is missing",
                record.display()
            )),
        "{text}"
    );
    assert!(text.contains("--accept-rollback"), "{text}");

    // The older backup put back without the record (the issue's silent rollback): refused.
    for file in [wal(&data), data.join("state.db-shm")] {
        let _ = std::fs::remove_file(file);
    }
    std::fs::copy(&backup, &db).unwrap();
    let text = refused_start(&data, &[]);
    assert!(text.contains("is missing"), "{text}");

    // Accepted, it serves the backup as it is and starts a record again.
    let agent = accepted_backup(&data, 20).await;
    stop(agent);
    assert!(record.exists());
    let agent = Agent::start(&data);
    stop(agent);
}

/// The online backup's commands as docs/operations.md gives them (the fenced block after
/// its `<!-- backup` marker), with the service's data dir and backup folder replaced by
/// the test's.
fn documented_backup(data: &Path, backups: &Path) -> String {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let after = doc
        .split("<!-- backup")
        .nth(1)
        .expect("the backup's marker");
    let block = after
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block after the backup's marker");
    block
        .replace("/var/lib/gpufleet", data.to_str().unwrap())
        .replace("/var/backups/gpufleet", backups.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_online_backup_is_0600_in_a_0700_folder_and_holds_the_commits() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let backups = dir.path().join("backups");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    for i in 0..3 {
        c.tenant(&format!("kept-{i}")).await;
    }
    // As an operator's shell runs it: the usual umask, and a backup folder that exists
    // already, readable by all.
    std::fs::create_dir(&backups).unwrap();
    std::fs::set_permissions(&backups, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "umask 022 && {}",
            documented_backup(&data, &backups)
        ))
        .output()
        .expect("run bash (and sqlite3: scripts/bootstrap.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&backups), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(mode(&files[0]), 0o600, "{}", files[0].display());
    let conn = Connection::open(&files[0]).unwrap();
    let kept: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM tenants WHERE name LIKE 'kept-%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kept, 3, "the backup holds the commits made while serve ran");
    drop(c);
    stop(agent);
}
