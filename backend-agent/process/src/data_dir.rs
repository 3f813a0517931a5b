//! A data dir: private to the process that serves it, and one process per data dir.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// What group and others may do with anything in a data dir: nothing. It holds the
/// state database (every tenant's keys and kubeconfigs), tokens and journals.
const NOT_FOR_OTHERS: u32 = 0o077;

/// Writes `line` and a newline to `path` for this user only (0600) and durably, replacing
/// the old file at once: written beside it first (`<name>.tmp`), then renamed over it, so
/// a stop half-way leaves the old file whole.
pub fn keep_private(path: &Path, line: &str) -> std::io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    writeln!(f, "{line}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Makes `dir` private and returns its canonical path. From here on this process creates
/// files for its own user only (umask 077: SQLite's database, WAL and shared-memory
/// files, tokens, journals, configurations); the dir itself becomes 0700 and what an
/// earlier release left readable in it loses its group and other bits, except under the
/// `skip` subfolders (tenants' storage, which is theirs to share). Call it before
/// anything is written.
pub fn private(dir: &Path, skip: &[&str]) -> anyhow::Result<PathBuf> {
    // SAFETY: umask only sets this process's file-mode creation mask.
    unsafe {
        libc::umask(NOT_FOR_OTHERS as libc::mode_t);
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--data-dir: cannot create {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)?;
    tighten(&dir, skip)?;
    Ok(dir)
}

/// Removes group and other bits from `path` and everything below it (links are left as
/// they are: they may point outside).
fn tighten(path: &Path, skip: &[&str]) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    if mode & NOT_FOR_OTHERS != 0 {
        std::fs::set_permissions(
            path,
            std::fs::Permissions::from_mode(mode & !NOT_FOR_OTHERS),
        )
        .with_context(|| format!("cannot make {} private", path.display()))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            let name = entry.file_name();
            if skip.iter().any(|s| name == *s) {
                continue;
            }
            tighten(&entry.path(), &[])?;
        }
    }
    Ok(())
}

/// An exclusive lock on `<data-dir>/agent.lock`: two processes serving one data dir would
/// each hold their own simulated hardware and allocate the same nodes. The lock is the
/// open file's flock, so it goes with the process however it ends (no stale lock after a
/// crash or SIGKILL).
///
/// The file says who holds it (`PID`), and `PID stopping` once the holder has begun a
/// clean stop: a process started meanwhile (a service manager's restart) waits up to
/// [`WAIT_FOR_STOPPING`] for it instead of failing, while one started beside a holder that
/// is not stopping is refused (after [`WAIT_FOR_MARK`], in case the holder was signalled
/// just before and has not said so yet).
pub struct DataDirLock {
    file: std::fs::File,
}

/// How long a start waits for a holder that is stopping (it closes connections and stops
/// its agents first).
pub const WAIT_FOR_STOPPING: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a start waits for a holder to say it is stopping before it is refused.
pub const WAIT_FOR_MARK: std::time::Duration = std::time::Duration::from_secs(1);
const STOPPING: &str = "stopping";

impl DataDirLock {
    pub fn acquire(data_dir: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd;
        let path = data_dir.join("agent.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let started = std::time::Instant::now();
        let mut told = false;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let stopping = holder.ends_with(STOPPING);
            let waited = started.elapsed();
            let limit = if stopping {
                WAIT_FOR_STOPPING
            } else {
                WAIT_FOR_MARK
            };
            if waited >= limit {
                let pid = holder.trim_end_matches(STOPPING).trim();
                if stopping {
                    anyhow::bail!(
                        "--data-dir: {} is still held by gpufleet-agent pid {pid}, stopping for over {WAIT_FOR_STOPPING:?}; stop it first ({err})",
                        data_dir.display()
                    );
                }
                anyhow::bail!(
                    "--data-dir: {} is in use by another gpufleet-agent (pid {pid}); stop it first ({err})",
                    data_dir.display()
                );
            }
            if stopping && !told {
                tracing::info!(holder, data_dir = %data_dir.display(), "waiting for the process that is stopping to release the data dir");
                told = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(Self { file })
    }

    /// Says in the lock file that this process has begun a clean stop, so that the next
    /// start on the data dir waits for it rather than failing.
    pub fn mark_stopping(&self) {
        use std::os::unix::fs::FileExt;
        let text = format!("{} {STOPPING}", std::process::id());
        if let Err(e) = self.file.write_all_at(text.as_bytes(), 0) {
            tracing::warn!(error = %e, "cannot mark the data dir's lock as stopping");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_waits_for_a_holder_that_is_stopping_and_refuses_one_that_is_not() {
        let dir = tempfile::tempdir().unwrap();
        // Another open of the lock file conflicts as another process's would.
        let held = DataDirLock::acquire(dir.path()).unwrap();
        let started = std::time::Instant::now();
        let refused = DataDirLock::acquire(dir.path()).err().unwrap().to_string();
        assert!(
            refused.contains("is in use by another gpufleet-agent"),
            "{refused}"
        );
        assert!(started.elapsed() >= WAIT_FOR_MARK);
        held.mark_stopping();
        let path = dir.path().to_path_buf();
        let waiting = std::thread::spawn(move || DataDirLock::acquire(&path));
        // Released past the time a holder that is not stopping gets: it was waited for.
        std::thread::sleep(WAIT_FOR_MARK * 2);
        assert!(
            !waiting.is_finished(),
            "it gave up on a holder that is stopping"
        );
        drop(held);
        assert!(waiting.join().unwrap().is_ok());
    }

    #[test]
    fn an_open_data_dir_becomes_private_except_what_it_skips() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("agents/n1")).unwrap();
        std::fs::create_dir_all(dir.join("volumes/team-a")).unwrap();
        for (file, mode) in [
            ("state.db", 0o644),
            ("admin.token", 0o640),
            ("agents/n1/orders.json", 0o666),
            ("volumes/team-a/data", 0o644),
        ] {
            std::fs::write(dir.join(file), "x").unwrap();
            std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o777;
        private(&dir, &["volumes"]).unwrap();
        assert_eq!(mode(""), 0o700);
        assert_eq!(mode("state.db"), 0o600);
        assert_eq!(mode("admin.token"), 0o600);
        assert_eq!(mode("agents/n1"), 0o700);
        assert_eq!(mode("agents/n1/orders.json"), 0o600);
        assert_eq!(mode("volumes/team-a/data"), 0o644);
        // What this process creates from now on is its own.
        std::fs::write(dir.join("new"), "x").unwrap();
        assert_eq!(mode("new"), 0o600);
    }
}
