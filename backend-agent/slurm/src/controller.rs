//! The controllers of Slurm tenant clusters: one `slurmctld` per cluster, run and
//! supervised by the control plane (it plays each cluster's head node), with its own
//! munged, state directory (`<data-dir>/slurm/<cluster>/`), port and ClusterName, and its
//! login: an sshd that lets the team in as the cluster's own account (`login`), whose
//! sessions reach the munged's socket and the client slurm.conf in the cluster's runtime
//! directory (`/run/gpufleet/<cluster>/login/`, the cluster's group only).
//!
//! A change of nodes or GRES rewrites slurm.conf and restarts the controller, which keeps
//! its state (jobs survive): Slurm 22.05's `scontrol reconfigure` refuses to change a
//! node's GRES count and cannot add nodes. A controller that dies is started again by its
//! supervisor. Blocking: async callers go through spawn_blocking.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::account::{self, Account};
use super::conf;
use super::daemon::{Daemon, Spec};
use super::login::{self, Login};
use super::munge;

/// What the controller of one cluster should run.
#[derive(Clone, Debug)]
pub struct Desired {
    pub controller: conf::Controller,
    pub nodes: Vec<conf::Node>,
    pub key: Vec<u8>,
    pub slurm_user: String,
    /// The account the team's sessions and jobs run as.
    pub account: Account,
    pub login_port: u16,
    pub ssh_public_keys: Vec<String>,
}

/// What a team needs to log in, once the controller and its login run.
#[derive(Clone, Debug, PartialEq)]
pub struct Access {
    /// The login's host key, `TYPE BASE64`.
    pub host_key: String,
    /// The account's home on the login host (where sessions start).
    pub home: PathBuf,
}

struct Running {
    munged: Daemon,
    slurmctld: Daemon,
    sshd: Daemon,
    key: Vec<u8>,
    conf: String,
    sshd_config: String,
}

impl Running {
    fn alive(&self) -> bool {
        self.munged.alive() && self.slurmctld.alive() && self.sshd.alive()
    }

    fn stop(self) {
        // The team's sessions end with the login (they run as the cluster's account).
        account::kill_descendants(self.sshd.pid());
        self.sshd.stop();
        self.slurmctld.stop();
        self.munged.stop();
    }
}

/// Every running controller of this process, by its directory (unique per data dir and
/// cluster, so several control planes in one test process never meet).
fn running() -> &'static Mutex<HashMap<PathBuf, Running>> {
    static RUNNING: OnceLock<Mutex<HashMap<PathBuf, Running>>> = OnceLock::new();
    RUNNING.get_or_init(Default::default)
}

pub fn dir(data_dir: &Path, cluster: &str) -> PathBuf {
    data_dir.join("slurm").join(cluster)
}

/// The controller's slurm.conf (its AuthInfo names its own munged): what the control
/// plane's own `sinfo`/`scontrol` use.
pub fn conf_path(data_dir: &Path, cluster: &str) -> PathBuf {
    dir(data_dir, cluster).join("slurm.conf")
}

/// The node ports the controller's slurm.conf gives now (empty when it has none yet).
pub fn node_ports(data_dir: &Path, cluster: &str) -> std::collections::BTreeMap<String, u16> {
    std::fs::read_to_string(conf_path(data_dir, cluster))
        .map(|c| conf::node_ports(&c))
        .unwrap_or_default()
}

/// A TCP port free on this host now.
pub fn free_port() -> Result<u16, String> {
    // Every address: slurmctld and slurmd listen on all of them.
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

fn write_if_changed(path: &Path, text: &str) -> Result<bool, String> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(false);
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(true)
}

/// Brings the cluster's controller to `want`: its account, files and runtime directory,
/// munged, slurmctld and the login's sshd running (restarted when their key or
/// configuration changed), and the controller answering. The team's keys are rewritten
/// in place (sshd reads them at every login).
pub fn ensure(data_dir: &Path, want: &Desired) -> Result<Access, String> {
    let cluster = &want.controller.cluster;
    let dir = dir(data_dir, cluster);
    std::fs::create_dir_all(dir.join("state"))
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (uid, runtime) = (want.account.uid, account::runtime_dir(cluster));
    let (login_dir, home) = (runtime.join(account::LOGIN), runtime.join(account::HOME));
    want.account.ensure(&home)?;
    account::prepare_runtime(&want.account)?;
    account::own_dir(&login_dir, 0, uid, 0o750)?;
    account::own_dir(&home, uid, uid, 0o700)?;
    // The key stays in the private dir; the socket is where the account can reach it.
    let paths = munge::Paths {
        socket: login_dir.join("munge.sock"),
        ..munge::Paths::in_dir(&dir)
    };
    let shared = conf::shared(&want.controller, &want.nodes, &want.slurm_user);
    let conf_text = format!("{shared}{}", conf::controller_lines(&dir, &paths.socket));
    let client_conf = login_dir.join("slurm.conf");
    account::write_shared(
        &client_conf,
        &format!("{shared}{}", conf::auth_info(&paths.socket)),
        uid,
        0o640,
    )?;
    let keys_file = login_dir.join("authorized_keys");
    account::write_shared(
        &keys_file,
        &login::authorized_keys(&want.ssh_public_keys),
        uid,
        0o640,
    )?;
    let files = login::Files::in_dir(&dir);
    let host_key = login::host_key(&files)?;
    let login = Login {
        addr: want.controller.addr.clone(),
        port: want.login_port,
        user: want.account.name.clone(),
        slurm_conf: client_conf,
        authorized_keys: keys_file,
    };
    let sshd_config = login::sshd_config(&login, &files);
    let conf_path = dir.join("slurm.conf");
    let mut all = running().lock().unwrap_or_else(|p| p.into_inner());
    let current = all.remove(&dir);
    let running = match current {
        Some(r)
            if r.key == want.key
                && r.conf == conf_text
                && r.sshd_config == sshd_config
                && r.alive() =>
        {
            r
        }
        other => {
            let (munged, old_ctld, old_sshd) = match other {
                Some(r) if r.key == want.key && r.munged.alive() => {
                    (Some(r.munged), Some(r.slurmctld), Some(r.sshd))
                }
                Some(r) => {
                    r.stop();
                    (None, None, None)
                }
                None => (None, None, None),
            };
            if let Some(ctld) = old_ctld {
                ctld.stop();
            }
            if let Some(sshd) = old_sshd {
                sshd.stop();
            }
            let munged = match munged {
                Some(m) => m,
                None => {
                    munge::write_key(&paths.key, &want.key)
                        .map_err(|e| format!("cannot write the munge key: {e}"))?;
                    munge::start(&format!("munged/{cluster}"), &paths)?
                }
            };
            write_if_changed(&conf_path, &conf_text)?;
            write_if_changed(&dir.join("cgroup.conf"), &conf::cgroup())?;
            let slurmctld = Daemon::start(
                &format!("slurmctld/{cluster}"),
                Spec {
                    program: "slurmctld".into(),
                    // -D: foreground (supervised); -i: keep going past state of nodes that
                    // are gone from the new configuration.
                    args: vec![
                        "-D".into(),
                        "-i".into(),
                        "-f".into(),
                        conf_path.display().to_string(),
                    ],
                    env: vec![("SLURM_CONF".into(), conf_path.display().to_string())],
                    log: dir.join("slurmctld.out"),
                },
            )
            .map_err(|e| format!("cannot start slurmctld: {e}"))?;
            write_if_changed(&files.config, &sshd_config)?;
            let sshd = match login::start(&format!("sshd/{cluster}"), &login, &files) {
                Ok(d) => d,
                Err(e) => {
                    slurmctld.stop();
                    munged.stop();
                    return Err(e);
                }
            };
            Running {
                munged,
                slurmctld,
                sshd,
                key: want.key.clone(),
                conf: conf_text,
                sshd_config,
            }
        }
    };
    all.insert(dir.clone(), running);
    drop(all);
    wait_answering(&dir, &want.controller)?;
    Ok(Access { host_key, home })
}

/// Waits until the controller accepts connections and answers `sinfo`.
fn wait_answering(dir: &Path, ctl: &conf::Controller) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let conf_path = dir.join("slurm.conf");
    let mut last = String::new();
    while Instant::now() < deadline {
        let addr = format!("{}:{}", ctl.addr, ctl.port);
        let open = addr
            .parse()
            .ok()
            .and_then(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok())
            .is_some();
        if open {
            match super::status::nodes(&conf_path) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(dir.join("slurmctld.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(3).collect();
    Err(format!(
        "slurmctld of cluster {} did not answer on {}:{} within 30 s ({last}); its log ends: {}",
        ctl.cluster,
        ctl.addr,
        ctl.port,
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    ))
}

/// Whether this process runs the cluster's controller (and it is alive).
pub fn is_running(data_dir: &Path, cluster: &str) -> bool {
    let all = running().lock().unwrap_or_else(|p| p.into_inner());
    all.get(&dir(data_dir, cluster)).is_some_and(Running::alive)
}

/// Stops the cluster's controller, munged and login, and removes their state, the login's
/// runtime files and home (and the account, when no node of the cluster is left on this
/// host).
pub fn remove(data_dir: &Path, cluster: &str) -> Result<(), String> {
    let dir = dir(data_dir, cluster);
    let r = running()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&dir);
    if let Some(r) = r {
        r.stop();
    }
    let removed = match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    };
    account::release(cluster, &[account::LOGIN, account::HOME]).and(removed)
}

/// Stops every controller of `data_dir` (the control plane is shutting down); their state
/// stays for the next start.
pub fn stop_all(data_dir: &Path) {
    let root = data_dir.join("slurm");
    let mine: Vec<Running> = {
        let mut all = running().lock().unwrap_or_else(|p| p.into_inner());
        let keys: Vec<PathBuf> = all
            .keys()
            .filter(|k| k.starts_with(&root))
            .cloned()
            .collect();
        keys.into_iter().filter_map(|k| all.remove(&k)).collect()
    };
    for r in mine {
        r.stop();
    }
}
