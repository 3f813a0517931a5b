//! A cluster's controller on this node: `slurmctld -D` with the cluster's shared
//! slurm.conf, this node's munged, and its own lines: `StateSaveLocation` (the directory
//! the order names: on the shared storage, where the other controller of the cluster
//! finds the same state, or under this agent's data dir), and its pid and log in the
//! agent's private `<data-dir>/slurm/<cluster>/ctld/`.
//!
//! Each head gets a state directory of its own (the order's): a new one is seeded with a
//! copy of the one before ([`seed`]), after this node's former controller stopped and
//! saved, so a head that moved keeps the queue, and a former head cut off from the fleet,
//! whose controller runs on and saves until its host is back, writes into a directory no
//! controller reads any more.
//!
//! The primary is verified answering `sinfo` before the order is answered; a backup
//! (standby until the primary stops answering for `SlurmctldTimeout`) is verified
//! listening. A change of nodes or GRES rewrites slurm.conf and restarts the controller,
//! which keeps its state (jobs survive): Slurm 22.05's `scontrol reconfigure` refuses to
//! change a node's GRES count and cannot add nodes. A controller that dies is started
//! again by its supervisor.
//!
//! slurmctld runs outside any sandbox: it starts nothing of the team (no job runs on the
//! controller), and no session of the team runs beside it but in the login's sandbox.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpufleet_slurm::account;
use gpufleet_slurm::conf;
use gpufleet_slurm::daemon::{Daemon, Spec as DaemonSpec};

/// How long a started controller may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

pub struct Running {
    slurmctld: Daemon,
    conf: String,
}

impl Running {
    pub fn stop(self) {
        self.slurmctld.stop();
    }
}

/// What this node's controller of one cluster should run.
pub struct Spec<'a> {
    pub cluster: &'a str,
    /// Its private dir (configuration, pid, log).
    pub dir: &'a Path,
    /// StateSaveLocation.
    pub state: PathBuf,
    /// Where `state` is copied from when it does not exist: the first that exists.
    pub seed_from: &'a [PathBuf],
    pub shared_conf: &'a str,
    /// The node's munged socket.
    pub socket: &'a Path,
    /// Its job credentials' lifetime (see `conf::auth_info`).
    pub cred_expire: u32,
    pub backup: bool,
    /// FirstJobId (checked by the caller; 0: Slurm's default).
    pub first_job_id: u64,
    /// Where it is reached (this node's address) and on which port.
    pub address: Ipv4Addr,
    pub port: u16,
}

/// Runs (or verifies, or adopts from a former agent) the controller as `want` says.
pub fn ensure(current: Option<Running>, want: &Spec) -> Result<Running, String> {
    let conf_text = format!(
        "{}{}",
        want.shared_conf,
        conf::controller_lines(
            want.dir,
            &want.state,
            want.socket,
            want.cred_expire,
            want.first_job_id
        )
    );
    let conf_path = want.dir.join("slurm.conf");
    let name = format!("slurmctld/{}", want.cluster);
    let spec = DaemonSpec {
        program: "slurmctld".into(),
        // -D: foreground (supervised); -i: keep going past state of nodes that are
        // gone from the new configuration.
        args: vec![
            "-D".into(),
            "-i".into(),
            "-f".into(),
            conf_path.display().to_string(),
        ],
        env: vec![("SLURM_CONF".into(), conf_path.display().to_string())],
        log: want.dir.join("slurmctld.out"),
        config: format!("{conf_text}{}", conf::cgroup()),
    };
    match current {
        Some(r) if r.conf == conf_text && r.slurmctld.alive() => return Ok(r),
        Some(r) => r.stop(),
        // The controller a former agent started with this configuration runs on, with
        // the queue it holds.
        None => {
            if let Some(slurmctld) = Daemon::adopt(&name, &spec, None) {
                return Ok(Running {
                    slurmctld,
                    conf: conf_text,
                });
            }
        }
    }
    account::own_dir(want.dir, 0, 0, 0o700)?;
    // The state is root's alone, and so is the folder holding every cluster's on the
    // shared storage (no one lists which clusters there are): slurmctld trusts what it
    // reads there (a job's record names the uid its job runs as).
    if let Some(parent) = want.state.parent() {
        account::own_dir(parent, 0, 0, 0o700)?;
    }
    // After the former controller's stop above: its last save is in what is copied.
    seed(&want.state, want.seed_from)?;
    account::own_dir(&want.state, 0, 0, 0o700)?;
    super::write(&conf_path, &conf_text)?;
    super::write(&want.dir.join("cgroup.conf"), &conf::cgroup())?;
    let slurmctld =
        Daemon::start(&name, spec).map_err(|e| format!("cannot start slurmctld: {e}"))?;
    let verified = match want.backup {
        false => wait_answering(&conf_path),
        true => wait_listening(want.address, want.port, &slurmctld),
    };
    if let Err(why) = verified {
        let log = std::fs::read_to_string(want.dir.join("slurmctld.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        slurmctld.stop();
        return Err(format!(
            "slurmctld of cluster {} ({}) on {}:{}: {why}; its log ends: {}",
            want.cluster,
            if want.backup { "backup" } else { "primary" },
            want.address,
            want.port,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    Ok(Running {
        slurmctld,
        conf: conf_text,
    })
}

/// Creates `state` as a copy of the first of `from` that exists, unless `state` exists:
/// copied beside it, then renamed into place, so a copy cut short is never taken for the
/// state.
fn seed(state: &Path, from: &[PathBuf]) -> Result<(), String> {
    if state.exists() {
        return Ok(());
    }
    let Some(source) = from.iter().find(|d| d.is_dir()) else {
        return Ok(());
    };
    let mut partial = state.as_os_str().to_owned();
    partial.push(".seeding");
    let partial = PathBuf::from(partial);
    let copied = remove_all(&partial)
        .and_then(|()| copy_tree(source, &partial))
        .and_then(|()| std::fs::rename(&partial, state));
    copied.map_err(|e| {
        format!(
            "cannot seed the controller's state {} from {}: {e}",
            state.display(),
            source.display()
        )
    })?;
    tracing::info!(state = %state.display(), from = %source.display(), "the controller's state seeded from the head's before");
    Ok(())
}

fn remove_all(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A copy of the directory tree `from` at `to` (files and directories, with their modes;
/// slurmctld's state has nothing else). An entry gone while it is copied is left out: a
/// cut-off controller may still save there (each file written apart and renamed into
/// place, so what is copied is whole).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let copied = match entry.file_type()? {
            kind if kind.is_dir() => copy_tree(&entry.path(), &target),
            kind if kind.is_file() => std::fs::copy(entry.path(), &target).map(|_| ()),
            _ => Ok(()),
        };
        match copied {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

/// Waits until the controller answers `sinfo` (with its own configuration: its munged).
fn wait_answering(conf_path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + ANSWER_WITHIN;
    let mut last = String::new();
    while Instant::now() < deadline {
        match gpufleet_slurm::status::nodes(conf_path) {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("did not answer within {ANSWER_WITHIN:?} ({last})"))
}

/// Waits until a standby controller listens on its port.
fn wait_listening(address: Ipv4Addr, port: u16, daemon: &Daemon) -> Result<(), String> {
    let deadline = Instant::now() + ANSWER_WITHIN;
    let at = std::net::SocketAddr::from((address, port));
    while std::net::TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline || !daemon.alive() && daemon.starts() > 3 {
            return Err(format!("did not listen within {ANSWER_WITHIN:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_state_is_a_copy_of_the_first_state_before_that_exists_and_an_old_one_stays() {
        let root = tempfile::tempdir().unwrap();
        let before = root.path().join("gf1@g1");
        std::fs::create_dir_all(before.join("hash.7/job.17")).unwrap();
        std::fs::write(before.join("job_state"), "jobs").unwrap();
        std::fs::write(before.join("hash.7/job.17/script"), "#!/bin/sh").unwrap();
        std::fs::set_permissions(&before, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(
            before.join("job_state"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let state = root.path().join("gf1@g2");
        // A copy an earlier start left half made is not the state.
        std::fs::create_dir_all(root.path().join("gf1@g2.seeding/stale")).unwrap();
        let missing = root.path().join("gf1@g0");
        seed(&state, &[missing, before.clone()]).unwrap();
        assert_eq!(
            std::fs::read_to_string(state.join("job_state")).unwrap(),
            "jobs"
        );
        assert_eq!(
            std::fs::read_to_string(state.join("hash.7/job.17/script")).unwrap(),
            "#!/bin/sh"
        );
        assert_eq!(
            (mode(&state), mode(&state.join("job_state"))),
            (0o700, 0o600)
        );
        assert!(!root.path().join("gf1@g2.seeding").exists());
        assert!(!state.join("stale").exists());
        // A state that exists is this head's own: never seeded again.
        std::fs::write(state.join("job_state"), "newer").unwrap();
        seed(&state, &[before]).unwrap();
        assert_eq!(
            std::fs::read_to_string(state.join("job_state")).unwrap(),
            "newer"
        );
        // Nothing to seed from: the controller starts with an empty state.
        let fresh = root.path().join("gf2@g1");
        seed(&fresh, &[root.path().join("none")]).unwrap();
        assert!(!fresh.exists());
    }
}
