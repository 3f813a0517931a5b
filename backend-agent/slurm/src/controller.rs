//! The controllers of Slurm tenant clusters: one `slurmctld` per cluster, run and
//! supervised by the control plane (it plays each cluster's head node), with its own
//! munged, state directory (`<data-dir>/slurm/<cluster>/`), port and ClusterName.
//!
//! A change of nodes or GRES rewrites slurm.conf and restarts the controller, which keeps
//! its state (jobs survive): Slurm 22.05's `scontrol reconfigure` refuses to change a
//! node's GRES count and cannot add nodes. A controller that dies is started again by its
//! supervisor. Blocking: async callers go through spawn_blocking.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::conf;
use super::daemon::{Daemon, Spec};
use super::munge;

/// What the controller of one cluster should run.
#[derive(Clone, Debug)]
pub struct Desired {
    pub controller: conf::Controller,
    pub nodes: Vec<conf::Node>,
    pub key: Vec<u8>,
    pub slurm_user: String,
}

struct Running {
    munged: Daemon,
    slurmctld: Daemon,
    key: Vec<u8>,
    conf: String,
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
    std::net::TcpListener::bind("127.0.0.1:0")
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

/// Brings the cluster's controller to `want`: files written, munged and slurmctld running
/// (restarted when their key or configuration changed), and the controller answering.
pub fn ensure(data_dir: &Path, want: &Desired) -> Result<(), String> {
    let cluster = &want.controller.cluster;
    let dir = dir(data_dir, cluster);
    std::fs::create_dir_all(dir.join("state"))
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let paths = munge::Paths::in_dir(&dir);
    let conf_text = format!(
        "{}{}",
        conf::shared(&want.controller, &want.nodes, &want.slurm_user),
        conf::controller_lines(&dir, &paths.socket)
    );
    let conf_path = dir.join("slurm.conf");
    let mut all = running().lock().unwrap_or_else(|p| p.into_inner());
    let current = all.remove(&dir);
    let (munged, slurmctld) = match current {
        Some(r)
            if r.key == want.key
                && r.conf == conf_text
                && r.munged.alive()
                && r.slurmctld.alive() =>
        {
            (r.munged, r.slurmctld)
        }
        other => {
            let (munged, old_ctld) = match other {
                Some(r) if r.key == want.key && r.munged.alive() => {
                    (Some(r.munged), Some(r.slurmctld))
                }
                Some(r) => {
                    r.slurmctld.stop();
                    r.munged.stop();
                    (None, None)
                }
                None => (None, None),
            };
            if let Some(ctld) = old_ctld {
                ctld.stop();
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
            (munged, slurmctld)
        }
    };
    all.insert(
        dir.clone(),
        Running {
            munged,
            slurmctld,
            key: want.key.clone(),
            conf: conf_text,
        },
    );
    drop(all);
    wait_answering(&dir, &want.controller)
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
    all.get(&dir(data_dir, cluster))
        .is_some_and(|r| r.slurmctld.alive() && r.munged.alive())
}

/// Stops the cluster's controller and munged, and removes their state.
pub fn remove(data_dir: &Path, cluster: &str) -> Result<(), String> {
    let dir = dir(data_dir, cluster);
    let r = running()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&dir);
    if let Some(r) = r {
        r.slurmctld.stop();
        r.munged.stop();
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
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
        r.slurmctld.stop();
        r.munged.stop();
    }
}
