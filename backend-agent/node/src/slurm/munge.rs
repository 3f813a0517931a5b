//! The node's munged of one cluster: the cluster's key in the agent's private dir, the
//! socket in the node's part of the cluster's runtime directory (which the cluster's
//! account, and no other, can enter). The node's slurmd, controller and login all use it;
//! the daemons open the socket at each credential, so it is restarted alone (a changed
//! key, or by its supervisor) without them.

use std::path::Path;

use gpufleet_slurm::daemon::Daemon;
use gpufleet_slurm::munge::{self, Paths};

pub struct Munged {
    daemon: Daemon,
    key: Vec<u8>,
    socket: std::path::PathBuf,
}

impl Munged {
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn stop(self) {
        self.daemon.stop();
    }
}

/// The cluster's munged with `key`: `current` when it holds that key and runs, else the
/// one a former agent left running with that key, else a new one (the key written to
/// `<dir>/munge.key`, the socket `<shared>/munge.sock`).
pub fn ensure(
    current: Option<Munged>,
    cluster: &str,
    dir: &Path,
    shared: &Path,
    key: &[u8],
) -> Result<Munged, String> {
    let paths = Paths {
        socket: shared.join("munge.sock"),
        ..Paths::in_dir(dir)
    };
    match current {
        Some(m) if m.key == key && m.socket == paths.socket && m.daemon.alive() => return Ok(m),
        Some(m) => m.stop(),
        None => {}
    }
    let name = format!("munged/{cluster}");
    // A munged a former agent started with this key runs on: its clients keep their socket.
    if let Some(daemon) = munge::adopt(&name, &paths, key) {
        return Ok(Munged {
            daemon,
            key: key.to_vec(),
            socket: paths.socket,
        });
    }
    munge::write_key(&paths.key, key).map_err(|e| format!("cannot write the munge key: {e}"))?;
    let daemon = munge::start(&name, &paths, key)?;
    Ok(Munged {
        daemon,
        key: key.to_vec(),
        socket: paths.socket,
    })
}
