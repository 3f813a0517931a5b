//! One process per data dir.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;

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
