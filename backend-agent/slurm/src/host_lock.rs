//! A lock of the whole host, held while one of its agents changes mounts that several
//! agents of the host share (the team volumes' without shared storage, the clusters'
//! homes): an flock on a file under `/run/gpufleet`, so it goes with its holder however
//! that ends.

use std::os::fd::AsRawFd;
use std::path::Path;

/// Held until dropped.
pub struct HostLock {
    _file: std::fs::File,
}

impl HostLock {
    /// Waits for the lock on `path` (made 0600, its folders 0711, when missing).
    pub fn acquire(path: &Path) -> Result<HostLock, String> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(HostLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("locking {}: {e}", path.display()));
            }
        }
    }
}
