//! A data dir: private to the process that serves it, and one process per data dir.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// What group and others may do with anything in a data dir: nothing. It holds the
/// state database (every tenant's keys and kubeconfigs), tokens and journals.
const NOT_FOR_OTHERS: u32 = 0o077;

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
pub struct DataDirLock {
    _file: std::fs::File,
}

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
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            anyhow::bail!(
                "--data-dir: {} is in use by another gpufleet-agent (pid {}); stop it first ({err})",
                data_dir.display(),
                holder.trim()
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
