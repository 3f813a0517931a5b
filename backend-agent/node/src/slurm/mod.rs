//! The node agent's part in Slurm tenant clusters. For each cluster its node is in, the
//! control plane's `StartSlurmd` order says everything this node runs for the cluster,
//! and the agent brings the node to exactly that, one module per daemon kind:
//!
//! - [`munge`]: a munged holding the cluster's key, on a socket in the node's part of the
//!   cluster's runtime directory; every daemon of the cluster here, the login's sessions
//!   and the jobs authenticate through it;
//! - [`slurmd`]: `slurmd -N <node>`, with gres.conf from the GPUs as they are now;
//! - [`slurmctld`]: on the cluster's head node the primary controller, and on a second
//!   node the backup, their state in the directory the order names (on the shared storage,
//!   which both controllers reach and which outlives a node, or under this agent's data
//!   dir);
//! - [`login`]: on the head node, the cluster's login sshd, with the cluster's own host
//!   key;
//!
//! and [`query`]: what the control plane asks the cluster's controller, asked here with
//! this node's Slurm commands and munged, so that the control plane keeps no munged and
//! runs nothing of any team.
//!
//! A controller or login this node ran that the order no longer names is stopped
//! (another node took it over); `StopSlurmd` stops everything of the cluster here.
//!
//! Files: the key, logs, the kept order, the controller's local state and the login's
//! configuration under `<data-dir>/slurm/<cluster>/` (private); what the cluster's account
//! must reach (the munged socket, slurm.conf, gres.conf, slurmd's spool, the login's client
//! configuration and authorized keys) in the node's part of the cluster's runtime
//! directory, `/run/gpufleet/<cluster>/n<hash>/`, which only root and the cluster's account
//! can enter. Jobs and sessions run as that account (created here with the uid the control
//! plane gives), never as root (`DisableRootJobs`). The account's home is
//! `/run/gpufleet/<cluster>/home`: a link to the team volume when the cluster's volume is
//! mounted on its nodes (the same home on every node), else to the cluster's home file
//! system on this host, of the agent's `--home-mib` (see `gpufleet_slurm::home_fs`).
//!
//! Starting is idempotent (a daemon running the same configuration, this agent's or a
//! former one's, is verified and left alone) and the last order per cluster is kept on
//! disk: an agent that restarts reports those clusters at registration, and the control
//! plane orders each started again or stopped. Blocking: the executor runs on a blocking
//! thread.
//!
//! The daemons outlive the agent (see `gpufleet_slurm::daemon`): an agent that stops,
//! crashes or is upgraded leaves them and the jobs running, and the next one adopts those
//! its orders still name (the same process, running the same configuration) and ends the
//! rest. Only an agent told so (`node --stop-workloads`) ends them when it stops.
//!
//! Whenever the agent stops a cluster's daemons for good (the cluster leaves the node, or
//! the agent stops with its workloads), the slurmstepd of the cluster's jobs on the node
//! and their processes end too: they hold the node's `SLURM_CONF` and would outlive
//! slurmd; and the login's sessions end with the login.

mod login;
mod munge;
mod orphans;
mod query;
mod slurmctld;
mod slurmd;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpufleet_gpu::hardware::GpuInfo;
use gpufleet_proto::v1;

use gpufleet_slurm::account::{self, Account};
use gpufleet_slurm::conf;
use gpufleet_slurm::home_fs::{self, HomeFs};
use gpufleet_slurm::login_limits::{LoginCgroup, LoginLimits};
use gpufleet_slurm::node_cgroup::NodeCgroup;
use gpufleet_slurm::sandbox;
use gpufleet_wire::volumes::VOLUME_MOUNTS;

/// The most directories an order may name to seed a controller's state from.
const MAX_SEEDS: usize = 4;

/// What this node runs for one cluster now.
#[derive(Default)]
struct Running {
    munged: Option<munge::Munged>,
    slurmd: Option<slurmd::Running>,
    slurmctld: Option<slurmctld::Running>,
    login: Option<login::Running>,
}

impl Running {
    /// Stops everything, the login first (its sessions end with it), munged last.
    fn stop(self) {
        if let Some(l) = self.login {
            l.stop();
        }
        if let Some(c) = self.slurmctld {
            c.stop();
        }
        if let Some(d) = self.slurmd {
            d.stop();
        }
        if let Some(m) = self.munged {
            m.stop();
        }
    }
}

#[derive(Clone)]
pub struct Slurm {
    /// `<data-dir>/slurm`.
    root: PathBuf,
    node: String,
    /// Simulated GPUs: device files made here; otherwise NVML's real devices.
    simulated: bool,
    /// Where this node's controller and login listen (the address it declares to Slurm).
    address: Ipv4Addr,
    /// Where this host mounts the platform's shared storage: a controller's state
    /// directory must be under it.
    shared_storage: Option<PathBuf>,
    /// What each login on this node may use, all its sessions together.
    login_limits: LoginLimits,
    /// What a cluster's jobs' `/tmp` and home may take of this host's disk.
    disk: DiskBounds,
    /// The daemons' job credential lifetime, and so how long a requeued job waits before
    /// it may start again (`--slurm-cred-expire`, see `conf::auth_info`).
    cred_expire: u32,
    running: Arc<Mutex<HashMap<String, Running>>>,
}

/// What each Slurm cluster's files may take of this host's disk, in MiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiskBounds {
    /// Its jobs' `/tmp` on this node, all together (`--job-tmp-mib`, see
    /// `gpufleet_slurm::job_tmp`).
    pub job_tmp_mib: u64,
    /// Its home on this host, when this agent makes it (`--home-mib`, see `home_fs`).
    pub home_mib: u64,
}

impl Default for DiskBounds {
    fn default() -> DiskBounds {
        DiskBounds {
            job_tmp_mib: gpufleet_slurm::job_tmp::DEFAULT_MIB,
            home_mib: home_fs::DEFAULT_MIB,
        }
    }
}

/// The order as kept on disk, to report the cluster again after a restart.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    slurm_conf: String,
    cgroup_conf: String,
    /// The cluster account's uid (0 in orders kept before accounts: not started again).
    #[serde(default)]
    uid: u32,
}

impl Slurm {
    pub fn new(
        data_dir: &Path,
        node: &str,
        simulated: bool,
        address: Ipv4Addr,
        shared_storage: Option<PathBuf>,
        login_limits: LoginLimits,
        disk: DiskBounds,
    ) -> Slurm {
        // Team volumes mounted later must reach the sandboxes of the daemons started
        // later (see `slurmd`).
        if let Err(e) = sandbox::share_with_sandboxes(Path::new(VOLUME_MOUNTS)) {
            tracing::warn!(error = %e, "team volumes will not reach the jobs' namespaces");
        }
        Slurm {
            root: data_dir.join("slurm"),
            node: node.to_string(),
            simulated,
            address,
            shared_storage,
            login_limits,
            disk,
            cred_expire: conf::DEFAULT_CRED_EXPIRE_SECS,
            running: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The same, its daemons' credentials living `secs` (see `conf::auth_info`).
    pub fn with_cred_expire(self, secs: u32) -> Slurm {
        Slurm {
            cred_expire: secs,
            ..self
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dir(&self, cluster: &str) -> Result<PathBuf, String> {
        if !gpufleet_slurm::valid_cluster_name(cluster) {
            return Err(format!(
                "cluster: {cluster:?} is not a Slurm cluster name (lower-case letters, digits and '-', at most 40)"
            ));
        }
        Ok(self.root.join(cluster))
    }

    /// This node's part of the cluster's runtime directory: named by a short hash of the
    /// node's name, as slurmd's spool holds sockets named `<node>_<job>.<step>` and a Unix
    /// socket's path has at most 108 bytes.
    fn shared_dir(&self, cluster: &str) -> PathBuf {
        account::runtime_dir(cluster).join(node_part(&self.node))
    }

    /// Brings this node's part in the order's cluster to the order (its slurmd always; the
    /// controller and login when named, else none) with the GPUs as they are now; returns
    /// the GRES its slurmd declared.
    pub fn start(&self, order: &v1::StartSlurmd, gpus: &[GpuInfo]) -> Result<String, String> {
        gpufleet_slurm::munge::check_key(&order.munge_key)?;
        let missing = gpufleet_slurm::missing();
        if !missing.is_empty() {
            return Err(format!(
                "this host lacks {} (install slurm-wlm, munge, openssh-server and e2fsprogs)",
                missing.join(", ")
            ));
        }
        // Checked before slurmd starts: slurmd itself says only "initialization failed".
        if let Some(why) =
            gpufleet_slurm::cgroup_controllers_problem(Path::new(gpufleet_slurm::CGROUP_ROOT))
        {
            return Err(why);
        }
        let cluster = order.cluster.as_str();
        let dir = self.dir(cluster)?;
        let account = Account::new(cluster, order.uid)?;
        let port = *conf::node_ports(&order.slurm_conf)
            .get(&self.node)
            .ok_or_else(|| {
                format!(
                    "slurm_conf: node {} is not in cluster {cluster}'s slurm.conf",
                    self.node
                )
            })?;
        let volume = match order.home.as_str() {
            "" => None,
            home => Some(under("home", home, Path::new(VOLUME_MOUNTS))?),
        };
        // The only team volume mounts its namespaces show: its own tenant's.
        // An older control plane names no volume: the home's, when it has that shape.
        let root = Path::new(VOLUME_MOUNTS);
        let volumes = match (order.volume.as_str(), volume.as_deref()) {
            ("", None) => None,
            ("", Some(home)) => sandbox::Volumes::new(root, Some(home))
                .inspect_err(|e| tracing::warn!(%cluster, error = %e, "the cluster's namespaces show every team volume mount"))
                .ok(),
            (own, _) => Some(sandbox::Volumes::new(
                root,
                Some(&under("volume", own, root)?),
            )?),
        };
        if let Some(c) = order
            .controller
            .as_ref()
            .filter(|c| c.first_job_id > conf::MAX_FIRST_JOB_ID)
        {
            return Err(format!(
                "controller.first_job_id: {} is past {}",
                c.first_job_id,
                conf::MAX_FIRST_JOB_ID
            ));
        }
        let (state_dir, seed_from) = match &order.controller {
            Some(c) if !c.state_dir.is_empty() => {
                let Some(shared) = &self.shared_storage else {
                    return Err(format!(
                        "controller.state_dir {}: this node has no shared storage (node --shared-storage)",
                        c.state_dir
                    ));
                };
                if c.seed_from.len() > MAX_SEEDS {
                    return Err(format!(
                        "controller.seed_from: {} directories, at most {MAX_SEEDS}",
                        c.seed_from.len()
                    ));
                }
                let seeds = c
                    .seed_from
                    .iter()
                    .map(|s| under("controller.seed_from", s, shared))
                    .collect::<Result<Vec<_>, _>>()?;
                (
                    Some(under("controller.state_dir", &c.state_dir, shared)?),
                    seeds,
                )
            }
            _ => (None, Vec::new()),
        };
        let ctl_port =
            conf::controller_port(&order.slurm_conf).ok_or("slurm_conf: no SlurmctldPort")?;
        if let Some(l) = &order.login {
            gpufleet_slurm::login::check_public_keys(&l.ssh_public_keys)?;
            if l.port == 0 || l.port > u32::from(u16::MAX) {
                return Err(format!("login.port: {} is not a TCP port", l.port));
            }
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let kept = Kept {
            slurm_conf: order.slurm_conf.clone(),
            cgroup_conf: order.cgroup_conf.clone(),
            uid: order.uid,
        };
        write(
            &dir.join("order.json"),
            &serde_json::to_string(&kept).unwrap_or_default(),
        )?;
        account.ensure(&account::runtime_dir(cluster).join(account::HOME))?;
        let shared = self.shared_dir(cluster);
        // Under the host's lock on homes: this node's part of the runtime directory (which
        // counts it as the cluster's on this host), then the home it links to; a node of
        // the cluster leaving this host meanwhile counts this one (see `stop`).
        let host = home_fs::lock_homes()?;
        account::prepare_runtime(&account)?;
        account::own_dir(&shared, 0, account.uid, 0o750)?;
        let home = match &volume {
            Some(volume) => Some(volume.clone()),
            // A home an older agent made, a directory of this host: the daemons adopted
            // from it run in namespaces made before any mount made now, which they would
            // not see. Kept as it is (unbounded) until the host's last node of the
            // cluster leaves.
            None if account::home_is_directory(cluster) => None,
            None => Some(HomeFs::new(&dir, cluster, self.disk.home_mib).ensure(&account)?),
        };
        if let Some(home) = &home {
            account::node_home(&account, home)?;
        }
        drop(host);
        let bounded = volume.is_none() && home.is_some();
        let homes = Some(home_fs::view(cluster, bounded)?);

        let mut all = self.lock();
        let running = all.entry(cluster.to_string()).or_default();
        let munged = munge::ensure(
            running.munged.take(),
            cluster,
            &dir,
            &shared,
            &order.munge_key,
        );
        let socket = match munged {
            Ok(m) => {
                let socket = m.socket().to_path_buf();
                running.munged = Some(m);
                socket
            }
            Err(e) => return Err(e),
        };
        // The controller first: the node's slurmd registers with it at once.
        running.slurmctld = match &order.controller {
            Some(c) => Some(slurmctld::ensure(
                running.slurmctld.take(),
                &slurmctld::Spec {
                    cluster,
                    dir: &dir.join("ctld"),
                    state: state_dir.unwrap_or_else(|| dir.join("ctld").join("state")),
                    seed_from: &seed_from,
                    shared_conf: &order.slurm_conf,
                    socket: &socket,
                    cred_expire: self.cred_expire,
                    backup: c.backup,
                    first_job_id: c.first_job_id,
                    address: self.address,
                    port: ctl_port,
                },
            )?),
            None => {
                if let Some(old) = running.slurmctld.take() {
                    tracing::info!(%cluster, "this node runs the cluster's controller no more");
                    old.stop();
                }
                None
            }
        };
        let (slurmd, gres) = slurmd::ensure(
            running.slurmd.take(),
            &slurmd::Spec {
                cluster,
                node: &self.node,
                simulated: self.simulated,
                dir: &dir,
                shared: &shared,
                socket: &socket,
                slurm_conf: &kept.slurm_conf,
                cgroup_conf: &kept.cgroup_conf,
                account: &account,
                port,
                cgroup: &NodeCgroup::of(cluster, &node_part(&self.node)),
                volumes: volumes.clone(),
                homes: homes.clone(),
                job_tmp_mib: self.disk.job_tmp_mib,
                cred_expire: self.cred_expire,
            },
            gpus,
        )?;
        running.slurmd = Some(slurmd);
        running.login = match &order.login {
            Some(l) => Some(login::ensure(
                running.login.take(),
                &login::Spec {
                    cluster,
                    dir: &dir.join("login"),
                    runtime: &shared.join("login"),
                    account: &account,
                    address: self.address,
                    port: l.port as u16,
                    keys: &l.ssh_public_keys,
                    host_key: &l.host_key,
                    limits: &self.login_limits,
                    node: &node_part(&self.node),
                    client_conf: format!(
                        "{}{}",
                        order.slurm_conf,
                        conf::auth_info(&socket, self.cred_expire)
                    ),
                    volumes,
                    homes,
                },
            )?),
            None => {
                if let Some(old) = running.login.take() {
                    tracing::info!(%cluster, "this node runs the cluster's login no more");
                    old.stop();
                }
                None
            }
        };
        Ok(gres)
    }

    /// Stops the cluster's daemons on this node and removes their files (and the cluster's
    /// account and home, when nothing else of the cluster is left on this host).
    pub fn stop(&self, cluster: &str) -> Result<(), String> {
        let dir = self.dir(cluster)?;
        let uid = self.kept_order(cluster).map(|k| k.uid).filter(|u| *u != 0);
        let r = self.lock().remove(cluster);
        if let Some(r) = r {
            r.stop();
        }
        // What a former agent left running for the cluster and this one never adopted.
        gpufleet_slurm::daemon::end_kept_under(&dir);
        // The slurmstepd of every job still running here, and the job's processes: they
        // outlive slurmd, and nothing of the cluster may stay on a node it gives back.
        self.end_steps(cluster);
        NodeCgroup::of(cluster, &node_part(&self.node)).remove();
        slurmd::remove_cgroups(&self.node, uid);
        // A login an earlier run of this agent started leaves its cgroup (and any session
        // that outlived its sshd) behind.
        LoginCgroup::of(cluster, &node_part(&self.node)).remove();
        let removed = match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
        };
        // Counted and unmounted under the host's lock on homes (see `start`): the runtime
        // directory goes with the host's last node of the cluster, and the home with it,
        // also when the account's removal after it failed (a process that would not end):
        // nothing else would unmount it.
        let host = home_fs::lock_homes()?;
        let released = account::release_node(cluster, &node_part(&self.node));
        if !account::runtime_dir(cluster).exists() {
            home_fs::release(cluster)?;
        }
        drop(host);
        released.and(removed)
    }

    /// The clusters whose daemons this node kept from before (an order and key in its
    /// data dir), for its registration: the control plane orders each started again or
    /// stopped.
    pub fn kept(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut kept: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|c| gpufleet_slurm::valid_cluster_name(c))
            .filter(|c| self.root.join(c).join("order.json").exists())
            .collect();
        kept.sort();
        kept
    }

    /// Stops every cluster's daemons on this node (the agent is stopping, told to end its
    /// node's workloads: `node --stop-workloads`), and the slurmstepd of every job still
    /// running here with their jobs' processes. Their order and key stay for the next start.
    pub fn stop_all(&self) {
        let all: Vec<(String, Running)> = self.lock().drain().collect();
        let mut clusters = self.kept();
        for (cluster, r) in all {
            r.stop();
            clusters.push(cluster);
        }
        clusters.sort();
        clusters.dedup();
        for cluster in clusters {
            if let Ok(dir) = self.dir(&cluster) {
                gpufleet_slurm::daemon::end_kept_under(&dir);
            }
            self.end_steps(&cluster);
            NodeCgroup::of(&cluster, &node_part(&self.node)).remove();
            LoginCgroup::of(&cluster, &node_part(&self.node)).remove();
        }
    }

    /// Leaves every cluster's daemons running (the agent is stopping: a restart or an
    /// upgrade), with their jobs and the login's sessions: the next agent adopts them. Returns
    /// how many clusters it leaves.
    pub fn leave_all(&self) -> usize {
        let all: Vec<(String, Running)> = self.lock().drain().collect();
        // Dropped, not stopped: each daemon's identity stays kept for the next agent.
        all.len()
    }

    /// Asks the cluster's controller, through this node's slurm.conf and munged.
    pub fn query(&self, q: &v1::SlurmQuery) -> Result<v1::SlurmAnswer, String> {
        let dir = self.dir(&q.cluster)?;
        let conf = self.shared_dir(&q.cluster).join("slurm.conf");
        if !conf.exists() {
            return Err(format!(
                "node {} runs no slurmd of cluster {}",
                self.node, q.cluster
            ));
        }
        let probe = match q.action.as_str() {
            "probe" => {
                // The account as the node's kept order names it; the login if it runs here.
                let kept: Kept =
                    std::fs::read_to_string(self.root.join(&q.cluster).join("order.json"))
                        .ok()
                        .and_then(|t| serde_json::from_str(&t).ok())
                        .ok_or_else(|| {
                            format!("node {} keeps no order of cluster {}", self.node, q.cluster)
                        })?;
                let login = self
                    .lock()
                    .get(&q.cluster)
                    .and_then(|r| r.login.as_ref().map(|l| l.at()));
                Some(query::ProbeWith {
                    uid: Account::new(&q.cluster, kept.uid)?.uid,
                    login,
                })
            }
            _ => None,
        };
        let mut answer = query::run(&conf, q, probe)?;
        if q.action == "status" {
            // Under the daemons' lock: one reader of the controller's log at a time, so
            // that each orphan job is reported once.
            let running = self.lock();
            if running
                .get(&q.cluster)
                .is_some_and(|r| r.slurmctld.is_some())
            {
                answer.orphans = orphans::since_last(&dir.join("ctld"));
            }
        }
        Ok(answer)
    }

    /// The cluster's last order as this node keeps it on disk.
    fn kept_order(&self, cluster: &str) -> Option<Kept> {
        let text = std::fs::read_to_string(self.root.join(cluster).join("order.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// SIGKILL to the slurmstepd of every job of `cluster` still running on this node, and
    /// to the job's processes: they outlive slurmd.
    fn end_steps(&self, cluster: &str) {
        let conf = self.shared_dir(cluster).join("slurm.conf");
        account::kill_environ_holders(&format!("SLURM_CONF={}", conf.display()));
    }
}

/// `path` (the order's `field`) as a plain absolute path under `root`, or why not.
fn under(field: &str, path: &str, root: &Path) -> Result<PathBuf, String> {
    let p = PathBuf::from(path);
    let plain = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !plain || !p.starts_with(root) || p == root {
        return Err(format!(
            "{field} {path}: not a path under {}",
            root.display()
        ));
    }
    Ok(p)
}

/// `n` and 8 hex digits of an FNV-1a hash of the node's name.
fn node_part(node: &str) -> String {
    let hash = node.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("n{hash:08x}")
}

/// Writes `text` to `path` unless it holds it already.
fn write(path: &Path, text: &str) -> Result<(), String> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_an_order_names_must_be_plain_and_under_their_root() {
        let root = Path::new("/srv/shared");
        assert_eq!(
            under("state_dir", "/srv/shared/.slurm/gf1", root).unwrap(),
            PathBuf::from("/srv/shared/.slurm/gf1")
        );
        for bad in [
            "/srv/shared",
            "/srv/shared/../etc",
            "srv/shared/x",
            "/srv/other/x",
        ] {
            let e = under("state_dir", bad, root).unwrap_err();
            assert!(
                e.starts_with(&format!("state_dir {bad}: not a path under /srv/shared")),
                "{e}"
            );
        }
        assert_eq!(node_part("n1"), node_part("n1"));
        assert_ne!(node_part("n1"), node_part("n2"));
    }
}
