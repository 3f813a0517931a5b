//! The node agent's Slurm daemons: for each Slurm tenant cluster its node is in, a munged
//! holding the cluster's key and `slurmd -N <node>`, with the key, logs and kept order under
//! `<data-dir>/slurm/<cluster>/` (private), and what the cluster's jobs must reach (the
//! munged socket, slurm.conf, gres.conf, slurmd's spool) in the node's part of the
//! cluster's runtime directory, `/run/gpufleet/<cluster>/n<hash>/`, which only root and the
//! cluster's account can enter. Jobs run as that account (created here with the uid the
//! control plane gives), never as root (`DisableRootJobs`). gres.conf comes from the GPUs as the agent finds them
//! (whole GPUs as `gpu:<model>`, MIG slices as `gpu:<profile>`), so Slurm schedules what
//! the node really has.
//!
//! Devices: with simulated GPUs each GPU and MIG slice is a character device of its own
//! the agent creates in the node's runtime directory (`dev/`, which the cluster's jobs can
//! reach), numbered in the kernel's range for local use (major 120, no driver: opening
//! one that the job's device cgroup allows fails with "No such device or address", one it
//! does not with "Operation not permitted"), so `ConstrainDevices` can tell them apart as
//! it tells real GPUs apart; with NVML, Slurm finds the real /dev/nvidia* and MIG devices
//! itself (`AutoDetect=nvml`, which needs a Slurm built with NVML).
//!
//! Confinement: slurmd runs in its cluster's node [`Sandbox`] (a `/proc` that shows a job
//! its own account's processes only, and a user database without other clusters'
//! accounts); each job gets a private `/tmp` and `/dev/shm` from `job_container/tmpfs`
//! (under `<data-dir>/slurm/<cluster>/jobs/`) and a cgroup holding it to its cores,
//! memory and devices (cgroup.conf, written here: cores are left unconfined on a
//! simulated node that declares more CPUs than its host has).
//!
//! Starting is idempotent (a slurmd running the same configuration is verified and left
//! alone) and the last order per cluster is kept on disk: an agent that restarts reports
//! those clusters at registration, and the control plane orders each started again or
//! stopped. Blocking: the executor runs on a blocking thread.
//!
//! Whenever the agent stops a cluster's daemons for good (the cluster leaves the node, or
//! the agent stops), the slurmstepd of the cluster's jobs on the node and their processes
//! end too: they hold the node's `SLURM_CONF` and would outlive slurmd.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_gpu::hardware::GpuInfo;
use gpufleet_proto::v1;

use gpufleet_slurm::account::{self, Account};
use gpufleet_slurm::conf::{self, Device};
use gpufleet_slurm::daemon::{Daemon, Spec};
use gpufleet_slurm::munge;
use gpufleet_slurm::sandbox::{self, Sandbox};
use gpufleet_wire::volumes::VOLUME_MOUNTS;

struct Running {
    munged: Daemon,
    slurmd: Daemon,
    key: Vec<u8>,
    conf: String,
    gres_conf: String,
}

#[derive(Clone)]
pub struct Slurmd {
    /// `<data-dir>/slurm`.
    root: PathBuf,
    node: String,
    /// Simulated GPUs: device files made here; otherwise NVML's real devices.
    simulated: bool,
    running: Arc<Mutex<HashMap<String, Running>>>,
}

/// The order as kept on disk, to start the daemons again after a restart.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    slurm_conf: String,
    cgroup_conf: String,
    /// The cluster account's uid (0 in orders kept before accounts: not started again).
    #[serde(default)]
    uid: u32,
}

impl Slurmd {
    pub fn new(data_dir: &Path, node: &str, simulated: bool) -> Slurmd {
        // Team volumes mounted later must reach the sandboxes of the slurmd started
        // later (see `start`).
        if let Err(e) = sandbox::share_with_sandboxes(Path::new(VOLUME_MOUNTS)) {
            tracing::warn!(error = %e, "team volumes will not reach the jobs' namespaces");
        }
        Slurmd {
            root: data_dir.join("slurm"),
            node: node.to_string(),
            simulated,
            running: Arc::new(Mutex::new(HashMap::new())),
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

    /// Runs (or verifies) this node's slurmd for the order's cluster with the GPUs as they
    /// are now; returns the GRES it declared.
    pub fn start(&self, order: &v1::StartSlurmd, gpus: &[GpuInfo]) -> Result<String, String> {
        munge::check_key(&order.munge_key)?;
        let missing = gpufleet_slurm::missing();
        if !missing.is_empty() {
            return Err(format!(
                "this host lacks {} (install slurm-wlm and munge)",
                missing.join(", ")
            ));
        }
        let dir = self.dir(&order.cluster)?;
        Account::new(&order.cluster, order.uid)?;
        let port = *conf::node_ports(&order.slurm_conf)
            .get(&self.node)
            .ok_or_else(|| {
                format!(
                    "slurm_conf: node {} is not in cluster {}'s slurm.conf",
                    self.node, order.cluster
                )
            })?;
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
        let paths = munge::Paths::in_dir(&dir);
        munge::write_key(&paths.key, &order.munge_key)
            .map_err(|e| format!("cannot write the munge key: {e}"))?;
        self.run(&order.cluster, &dir, &kept, &order.munge_key, port, gpus)
    }

    fn run(
        &self,
        cluster: &str,
        dir: &Path,
        kept: &Kept,
        key: &[u8],
        port: u16,
        gpus: &[GpuInfo],
    ) -> Result<String, String> {
        let account = Account::new(cluster, kept.uid)?;
        account.ensure(&account::runtime_dir(cluster).join(account::HOME))?;
        account::prepare_runtime(&account)?;
        account::node_home(&account)?;
        let shared = self.shared_dir(cluster);
        let spool = shared.join("spool");
        // Refused here, clearly, rather than every batch job held at launch.
        gpufleet_slurm::check_step_sockets(&spool, &self.node)?;
        account::own_dir(&shared, 0, account.uid, 0o750)?;
        account::own_dir(&spool, 0, 0, 0o755)?;
        let paths = munge::Paths {
            socket: shared.join("munge.sock"),
            ..munge::Paths::in_dir(dir)
        };
        let full = format!(
            "{}{}",
            kept.slurm_conf,
            conf::slurmd_lines(&spool, dir, &paths.socket)
        );
        let gres_conf = if self.simulated {
            conf::gres(&self.node, &self.sim_devices(&shared, gpus)?)
        } else {
            "AutoDetect=nvml\n".to_string()
        };
        let gres = conf::gres_of(gpus);
        let mut all = self.lock();
        let (munged, old) = match all.remove(cluster) {
            Some(r)
                if r.key == key
                    && r.conf == full
                    && r.gres_conf == gres_conf
                    && r.munged.alive()
                    && r.slurmd.alive() =>
            {
                all.insert(cluster.to_string(), r);
                return Ok(gres);
            }
            Some(r) if r.key == key && r.munged.alive() => (Some(r.munged), Some(r.slurmd)),
            Some(r) => {
                r.slurmd.stop();
                r.munged.stop();
                (None, None)
            }
            None => (None, None),
        };
        if let Some(old) = old {
            old.stop();
        }
        let munged = match munged {
            Some(m) => m,
            None => munge::start(&format!("munged/{cluster}"), &paths)?,
        };
        // Slurm reads cgroup.conf and gres.conf next to slurm.conf; jobs read slurm.conf.
        let conf_path = shared.join("slurm.conf");
        let gid = account.uid;
        account::write_shared(&conf_path, &full, gid, 0o640)?;
        account::write_shared(
            &shared.join("cgroup.conf"),
            &self.cgroup_conf(kept),
            gid,
            0o640,
        )?;
        let jobs = jobs_base(dir, &shared);
        account::own_dir(&jobs, 0, 0, 0o700)?;
        account::write_shared(
            &shared.join("job_container.conf"),
            &conf::job_container(&jobs),
            gid,
            0o640,
        )?;
        let etc_layer = sandbox::user_databases(&shared, cluster)?;
        // Team volumes are mounted on the node after slurmd starts (and unmounted when it
        // leaves): they reach slurmd's namespace, and its jobs', from a shared mount.
        sandbox::share_with_sandboxes(Path::new(VOLUME_MOUNTS))?;
        account::write_shared(&shared.join("gres.conf"), &gres_conf, gid, 0o640)?;
        let slurmd = Daemon::start_sandboxed(
            &format!("slurmd/{cluster}/{}", self.node),
            Spec {
                program: "slurmd".into(),
                args: vec![
                    "-D".into(),
                    "-N".into(),
                    self.node.clone(),
                    "-f".into(),
                    conf_path.display().to_string(),
                ],
                env: vec![("SLURM_CONF".into(), conf_path.display().to_string())],
                log: dir.join("slurmd.out"),
            },
            Sandbox::slurmd(etc_layer),
        )
        .map_err(|e| format!("cannot start slurmd: {e}"))?;
        // Verified: slurmd listens on its port (it has read its configuration and GRES).
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_millis(200),
        )
        .is_err()
        {
            if Instant::now() > deadline || !slurmd.alive() && slurmd.starts() > 3 {
                let log = std::fs::read_to_string(dir.join("slurmd.log")).unwrap_or_default();
                slurmd.stop();
                munged.stop();
                return Err(format!(
                    "slurmd of cluster {cluster} did not listen on port {port}: {}",
                    log.lines().last().unwrap_or("no log")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        all.insert(
            cluster.to_string(),
            Running {
                munged,
                slurmd,
                key: key.to_vec(),
                conf: full,
                gres_conf,
            },
        );
        Ok(gres)
    }

    /// cgroup.conf for this node: the control plane's confinement, with cores left
    /// unconfined where the node declares more CPUs than its host has (a simulated node).
    fn cgroup_conf(&self, kept: &Kept) -> String {
        let declared = conf::node_cpus(&kept.slurm_conf, &self.node).unwrap_or(1);
        let host = crate::host::cpus();
        if declared > host {
            tracing::info!(node = %self.node, declared, host, "the node declares more CPUs than its host has: jobs are not pinned to cores");
        }
        conf::node_cgroup(declared <= host)
    }

    /// One character device per GPU and MIG slice, in the node's runtime `dev/`: major
    /// [`SIM_MAJOR`], minors from 0 in the order of the GPUs and their slices.
    fn sim_devices(&self, shared: &Path, gpus: &[GpuInfo]) -> Result<Vec<Device>, String> {
        let dev = shared.join("dev");
        account::own_dir(&dev, 0, 0, 0o755)?;
        let mut out = Vec::new();
        let mut minor = 0u32;
        for g in gpus {
            let mut add = |file: String, gres_type: String| -> Result<(), String> {
                let path = dev.join(&file);
                mknod(&path, minor)?;
                minor += 1;
                out.push(Device {
                    gres_type,
                    file: path.display().to_string(),
                });
                Ok(())
            };
            if g.mig_enabled {
                for i in &g.instances {
                    add(
                        format!("nvidia{}-mig{}", g.index, i.start),
                        i.profile.clone(),
                    )?;
                }
            } else {
                add(format!("nvidia{}", g.index), conf::gpu_type(&g.model))?;
            }
        }
        Ok(out)
    }

    /// This node's part of the cluster's runtime directory: named by a short hash of the
    /// node's name, as slurmd's spool holds sockets named `<node>_<job>.<step>` and a Unix
    /// socket's path has at most 108 bytes.
    fn shared_dir(&self, cluster: &str) -> PathBuf {
        account::runtime_dir(cluster).join(node_part(&self.node))
    }

    /// Stops the cluster's daemons on this node and removes their files (and the cluster's
    /// account, when nothing else of the cluster is left on this host).
    pub fn stop(&self, cluster: &str) -> Result<(), String> {
        let dir = self.dir(cluster)?;
        let r = self.lock().remove(cluster);
        if let Some(r) = r {
            r.slurmd.stop();
            r.munged.stop();
        }
        // The slurmstepd of every job still running here, and the job's processes: they
        // outlive slurmd, and nothing of the cluster may stay on a node it gives back.
        self.end_steps(cluster);
        remove_cgroups(&self.node);
        let removed = match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
        };
        account::release_node(cluster, &node_part(&self.node)).and(removed)
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

    /// Stops every cluster's daemons on this node (the agent is stopping), and the
    /// slurmstepd of every job still running here with their jobs' processes: nothing of a
    /// cluster outlives the agent that ran it. Their order and key stay for the next start.
    pub fn stop_all(&self) {
        let all: Vec<(String, Running)> = self.lock().drain().collect();
        let mut clusters = self.kept();
        for (cluster, r) in all {
            r.slurmd.stop();
            r.munged.stop();
            clusters.push(cluster);
        }
        clusters.sort();
        clusters.dedup();
        for cluster in clusters {
            self.end_steps(&cluster);
        }
    }

    /// SIGKILL to the slurmstepd of every job of `cluster` still running on this node, and
    /// to the job's processes: they outlive slurmd.
    fn end_steps(&self, cluster: &str) {
        let conf = self.shared_dir(cluster).join("slurm.conf");
        account::kill_environ_holders(&format!("SLURM_CONF={}", conf.display()));
    }
}

/// Where `job_container/tmpfs` makes each job's private `/tmp` and `/dev/shm` (root's,
/// 0700): the node's private dir, `<data-dir>/slurm/<cluster>/jobs`, unless that is under
/// `/tmp` or `/dev/shm`, which the plugin refuses (a data dir in `/tmp`, as tests have);
/// then the node's runtime directory, `/run/gpufleet/<cluster>/n<hash>/jobs`.
fn jobs_base(dir: &Path, shared: &Path) -> PathBuf {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    if ["/tmp", "/dev/shm"].iter().any(|t| dir.starts_with(t)) {
        shared.join("jobs")
    } else {
        dir.join("jobs")
    }
}

/// `n` and 8 hex digits of an FNV-1a hash of the node's name.
fn node_part(node: &str) -> String {
    let hash = node.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("n{hash:08x}")
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The major number of simulated GPU devices: one of the kernel's "local/experimental
/// use" majors (Documentation/admin-guide/devices.txt), which no driver registers.
pub const SIM_MAJOR: u32 = 120;

/// A character device `SIM_MAJOR:minor` (mode 0666: the device cgroup decides who opens
/// it), unless one is there already.
fn mknod(path: &Path, minor: u32) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let rdev = libc::makedev(SIM_MAJOR, minor);
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == rdev) {
        return Ok(());
    }
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: not a valid path", path.display()))?;
    // SAFETY: c is a valid NUL-terminated path; mknod only creates the file.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, rdev) };
    if rc != 0 {
        return Err(format!(
            "cannot create the device file {} for Slurm's GRES: {} (creating device files needs root)",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // mknod's mode is masked by the umask.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))
}

/// Ends every process still in `node`'s cgroups and removes them: what Slurm's cgroup
/// v1 plugin keeps of the node, `/sys/fs/cgroup/<controller>/slurm_<node>/` (a killed
/// slurmstepd leaves its job's cgroups, and a job process that dropped its environment
/// is found there and nowhere else), deepest first, for a few seconds while the killed
/// processes leave them.
fn remove_cgroups(node: &str) {
    let roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| c.path().join(format!("slurm_{node}")))
        .filter(|p| p.is_dir())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    for root in roots {
        loop {
            let mut dirs = Vec::new();
            let mut stack = vec![root.clone()];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
                dirs.push(d);
            }
            for d in &dirs {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                    // SAFETY: kill only sends a signal.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            // Children come after their parents: remove from the end.
            let failed = dirs
                .iter()
                .rev()
                .filter(|d| std::fs::remove_dir(d).is_err())
                .count();
            if failed == 0 || Instant::now() > deadline {
                if failed > 0 {
                    tracing::warn!(cgroup = %root.display(), "cannot remove a node's cgroups");
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
