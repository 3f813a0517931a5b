//! The commit record: how many commits the writer has acknowledged, kept twice.
//!
//! The database counts its own commits (`commit_counter`, advanced in every transaction of
//! the group-commit writer), and after each COMMIT the writer rewrites the count in a small
//! file beside it, `state.db.commits`, before it answers anyone. The file is outside the
//! WAL, so what damages the WAL (truncated, deleted) or replaces `state.db` (an older
//! backup, a fresh file) leaves it alone: at start a database behind its record has lost
//! acknowledged commits, which SQLite's WAL recovery and `integrity_check` do not see (a
//! shorter WAL is a valid WAL). `serve` then refuses to start, naming the files and how
//! many commits are missing, unless it is given `--accept-rollback`. A database with
//! commits and no record beside it is refused the same way: the record was deleted (or a
//! backup was put back without it), and starting a new one would hide what was lost.
//!
//! The file is written in place with one `pwrite` of a fixed-length line and no fsync: it
//! survives a process crash (the page cache holds it), and after an OS crash it can only
//! be behind what was written, never ahead of a commit that `synchronous=FULL` made
//! durable (the record is written after the COMMIT), so it never raises a false alarm. With
//! `synchronous=NORMAL` an OS crash may lose the last commits and the record may or may
//! not reach the disk before them: the check then catches the loss only when it did.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use rusqlite::Connection;

/// The record of `db` (`state.db` → `state.db.commits`).
pub fn path_for(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".commits");
    db.with_file_name(name)
}

/// Which store, and how many of its commits: the database's own count, or its record's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    /// Random, made with the database (migration 12): a record belongs to one store.
    pub store_id: String,
    pub commits: i64,
}

/// The database's count, as the database (with what its WAL still holds) says.
pub fn in_database(conn: &Connection) -> rusqlite::Result<Count> {
    conn.query_row(
        "SELECT store_id, seq FROM commit_counter WHERE id = 1",
        [],
        |r| {
            Ok(Count {
                store_id: r.get(0)?,
                commits: r.get(1)?,
            })
        },
    )
}

/// Counts one more commit, in the transaction about to commit; the new count.
pub fn advance(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("UPDATE commit_counter SET seq = seq + 1 WHERE id = 1 RETURNING seq")?
        .query_row([], |r| r.get(0))
}

const MAGIC: &str = "gpufleet commit record v1";

/// The file's one line; fixed length (the count has 20 digits), so an in-place rewrite
/// never leaves a longer old line's tail behind.
fn line(count: &Count) -> String {
    format!(
        "{MAGIC} store={} commits={:020}\n",
        count.store_id, count.commits
    )
}

fn parse(text: &str) -> Option<Count> {
    let rest = text.strip_suffix('\n')?.strip_prefix(MAGIC)?;
    let mut fields = rest.split(' ').filter(|f| !f.is_empty());
    let store_id = fields.next()?.strip_prefix("store=")?;
    let commits = fields.next()?.strip_prefix("commits=")?.parse().ok()?;
    let valid_id = !store_id.is_empty() && store_id.bytes().all(|b| b.is_ascii_hexdigit());
    (valid_id && fields.next().is_none() && commits >= 0).then(|| Count {
        store_id: store_id.to_string(),
        commits,
    })
}

/// What the record file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// No file: a store from before the record, or a new one.
    Missing,
    Count(Count),
    /// A file that is not a record (the text, cut).
    Damaged(String),
}

/// Reads the record at `path`.
pub fn read(path: &Path) -> anyhow::Result<Recorded> {
    let mut bytes = Vec::new();
    match File::open(path) {
        // A record is one short line; more is not one.
        Ok(f) => f
            .take(4096)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Recorded::Missing),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let text = String::from_utf8_lossy(&bytes);
    Ok(match parse(&text) {
        Some(count) => Recorded::Count(count),
        None => Recorded::Damaged(text.chars().take(80).collect()),
    })
}

/// The open record file of one store, rewritten after each commit.
pub struct CommitRecord {
    file: File,
    store_id: String,
    path: PathBuf,
}

impl CommitRecord {
    /// Creates or opens the record at `path` (mode 0600) and sets it to `count`, durably
    /// (a start happens once; the writes after each commit are not synced, see the module
    /// doc).
    pub fn reset(path: &Path, count: &Count) -> anyhow::Result<CommitRecord> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let text = line(count);
        file.set_len(text.len() as u64)
            .and_then(|()| file.write_all_at(text.as_bytes(), 0))
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(CommitRecord {
            file,
            store_id: count.store_id.clone(),
            path: path.to_path_buf(),
        })
    }

    /// Records that `commits` commits are acknowledged.
    pub fn write(&self, commits: i64) -> std::io::Result<()> {
        let text = line(&Count {
            store_id: self.store_id.clone(),
            commits,
        });
        self.file.write_all_at(text.as_bytes(), 0)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// How a start treats a store whose record says more than it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLoss {
    /// Refuse to start (the default).
    #[default]
    Refuse,
    /// Serve the store as it is and reset the record (`--accept-rollback`).
    Accept,
}

/// The refusal of a store whose database lost what its record says was acknowledged;
/// `Ok` when the database holds at least that (or `on_loss` accepts it), with what was
/// accepted in the log.
pub fn check(
    db: &Path,
    database: &Count,
    recorded: &Recorded,
    on_loss: OnLoss,
) -> anyhow::Result<()> {
    let record = path_for(db);
    let (db, record) = (db.display(), record.display());
    let refusal = match recorded {
        // A new store (or one from before the record, which migration 12 starts at 0)
        // has no commits; one with commits had its record written after the first.
        Recorded::Missing if database.commits == 0 => return Ok(()),
        Recorded::Missing => format!(
            "{db} holds {} commits but its commit record {record} is missing: the record was deleted, or state.db was put back from a backup without it, so whether acknowledged commits were lost cannot be checked. Put back the record with its state.db, or start with --accept-rollback to serve the database as it is (and start a new record at its count)",
            database.commits
        ),
        Recorded::Count(r) if r.store_id != database.store_id => format!(
            "{db} is not the store its commit record {record} belongs to (the database is store {}, the record is of store {} at commit {}): state.db was replaced or made anew. Put back the state.db of that store (with its state.db-wal), or start with --accept-rollback to serve this one as it is",
            database.store_id, r.store_id, r.commits
        ),
        Recorded::Count(r) if r.commits > database.commits => format!(
            "{db} is behind its commit record {record}: {} acknowledged commits missing (the database is at commit {}, the record at {}); its WAL ({db}-wal) was truncated or deleted, or state.db was put back from an older backup. Put back a newer backup, or start with --accept-rollback to serve it as it is (the missing commits stay lost)",
            r.commits - database.commits, database.commits, r.commits
        ),
        Recorded::Count(_) => return Ok(()),
        Recorded::Damaged(text) => format!(
            "the commit record {record} is damaged (it reads {text:?}), so {db} cannot be checked against it; start with --accept-rollback to take the database's count as it is"
        ),
    };
    match on_loss {
        OnLoss::Refuse => anyhow::bail!("{refusal}. See docs/operations.md, \"A damaged store\""),
        OnLoss::Accept => {
            tracing::warn!("--accept-rollback: serving the store as it is: {refusal}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(id: &str, commits: i64) -> Count {
        Count {
            store_id: id.into(),
            commits,
        }
    }

    #[test]
    fn a_record_reads_back_what_was_written_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("state.db"));
        assert_eq!(path, dir.path().join("state.db.commits"));
        assert_eq!(read(&path).unwrap(), Recorded::Missing);
        let record = CommitRecord::reset(&path, &count("00ff", 12345)).unwrap();
        assert_eq!(read(&path).unwrap(), Recorded::Count(count("00ff", 12345)));
        record.write(7).unwrap();
        assert_eq!(read(&path).unwrap(), Recorded::Count(count("00ff", 7)));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, "store=1 commits=x\n").unwrap();
        assert!(matches!(read(&path).unwrap(), Recorded::Damaged(_)));
    }

    #[test]
    fn a_database_behind_its_record_or_of_another_store_is_refused_unless_accepted() {
        let db = Path::new("/data/state.db");
        let at = |n| Recorded::Count(count("ab", n));
        check(db, &count("ab", 5), &at(5), OnLoss::Refuse).unwrap();
        check(db, &count("ab", 6), &at(5), OnLoss::Refuse).unwrap();
        // No record: only a store without commits starts without one.
        check(db, &count("ab", 0), &Recorded::Missing, OnLoss::Refuse).unwrap();
        let lost = check(db, &count("ab", 9), &Recorded::Missing, OnLoss::Refuse)
            .unwrap_err()
            .to_string();
        assert!(
            lost.starts_with("/data/state.db holds 9 commits but its commit record /data/state.db.commits is missing"),
            "{lost}"
        );
        assert!(lost.contains("--accept-rollback"), "{lost}");
        check(db, &count("ab", 9), &Recorded::Missing, OnLoss::Accept).unwrap();
        let behind = check(db, &count("ab", 2), &at(5), OnLoss::Refuse)
            .unwrap_err()
            .to_string();
        assert!(
            behind.starts_with("/data/state.db is behind its commit record /data/state.db.commits: 3 acknowledged commits missing"),
            "{behind}"
        );
        assert!(behind.contains("--accept-rollback"), "{behind}");
        let other = check(db, &count("cd", 9), &at(5), OnLoss::Refuse)
            .unwrap_err()
            .to_string();
        assert!(
            other.contains("is not the store its commit record"),
            "{other}"
        );
        let damaged = Recorded::Damaged("junk".into());
        let bad = check(db, &count("ab", 9), &damaged, OnLoss::Refuse)
            .unwrap_err()
            .to_string();
        assert!(bad.contains("is damaged"), "{bad}");
        for recorded in [at(5), Recorded::Count(count("cd", 9)), damaged] {
            check(db, &count("ab", 2), &recorded, OnLoss::Accept).unwrap();
        }
    }
}
