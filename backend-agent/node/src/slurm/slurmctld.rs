//! A cluster's controller on this node: `slurmctld -D` with the cluster's shared
//! slurm.conf, this node's munged, and its own lines: `StateSaveLocation` (the directory
//! the order names: on the shared storage, where the other controller of the cluster and
//! any later head node find the same state, or under this agent's data dir), and its pid
//! and log in the agent's private `<data-dir>/slurm/<cluster>/ctld/`.
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
    pub shared_conf: &'a str,
    /// The node's munged socket.
    pub socket: &'a Path,
    pub backup: bool,
    /// Where it is reached (this node's address) and on which port.
    pub address: Ipv4Addr,
    pub port: u16,
}

/// Runs (or verifies) the controller as `want` says.
pub fn ensure(current: Option<Running>, want: &Spec) -> Result<Running, String> {
    let conf_text = format!(
        "{}{}",
        want.shared_conf,
        conf::controller_lines(want.dir, &want.state, want.socket)
    );
    match current {
        Some(r) if r.conf == conf_text && r.slurmctld.alive() => return Ok(r),
        Some(r) => r.stop(),
        None => {}
    }
    account::own_dir(want.dir, 0, 0, 0o700)?;
    // The state is root's alone, and so is the folder holding every cluster's on the
    // shared storage (no one lists which clusters there are): slurmctld trusts what it
    // reads there (a job's record names the uid its job runs as).
    if let Some(parent) = want.state.parent() {
        account::own_dir(parent, 0, 0, 0o700)?;
    }
    account::own_dir(&want.state, 0, 0, 0o700)?;
    let conf_path = want.dir.join("slurm.conf");
    super::write(&conf_path, &conf_text)?;
    super::write(&want.dir.join("cgroup.conf"), &conf::cgroup())?;
    let slurmctld = Daemon::start(
        &format!("slurmctld/{}", want.cluster),
        DaemonSpec {
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
        },
    )
    .map_err(|e| format!("cannot start slurmctld: {e}"))?;
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
