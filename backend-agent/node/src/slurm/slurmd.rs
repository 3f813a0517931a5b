//! A node's slurmd of one cluster: `slurmd -N <node>` on the node's own port, in the
//! cluster's node [`Sandbox`], with its configuration in the node's part of the cluster's
//! runtime directory and its pid and log in the agent's private dir. gres.conf comes from
//! the GPUs as the agent finds them (whole GPUs as `gpu:<model>`, MIG slices as
//! `gpu:<profile>`), so Slurm schedules what the node really has.
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
//! its own account's processes only, a user database without other clusters' accounts,
//! its own IPC, `/var/tmp` and `/run/lock`) and in the node's cgroup ([`NodeCgroup`]),
//! the root of the only cgroupfs its jobs see; each job gets a private `/tmp` and
//! `/dev/shm` from `job_container/tmpfs` (under `<data-dir>/slurm/<cluster>/jobs/`, in
//! slurmd's namespace a file system of its own of the agent's `--job-tmp-mib`, which the
//! cluster's jobs on this node share: see `gpufleet_slurm::job_tmp`) and a cgroup
//! holding it to its cores, memory and devices (cgroup.conf, written here: cores are
//! left unconfined on a simulated node that declares more CPUs than its host has).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpufleet_gpu::hardware::GpuInfo;

use gpufleet_slurm::account::{self, Account};
use gpufleet_slurm::conf::{self, Device};
use gpufleet_slurm::daemon::{Daemon, Spec as DaemonSpec};
use gpufleet_slurm::node_cgroup::{self, NodeCgroup};
use gpufleet_slurm::sandbox::{self, Sandbox};
use gpufleet_wire::volumes::VOLUME_MOUNTS;

/// A running slurmd and what it was started with.
pub struct Running {
    slurmd: Daemon,
    conf: String,
    gres_conf: String,
    cgroup_conf: String,
}

impl Running {
    pub fn stop(self) {
        self.slurmd.stop();
    }
}

/// What this node's slurmd of one cluster should run.
pub struct Spec<'a> {
    pub cluster: &'a str,
    pub node: &'a str,
    pub simulated: bool,
    /// The cluster's private dir of this agent (pid, log, jobs' containers).
    pub dir: &'a Path,
    /// The node's part of the cluster's runtime directory.
    pub shared: &'a Path,
    /// The node's munged socket.
    pub socket: &'a Path,
    /// slurm.conf as every party shares it, and cgroup.conf, from the order.
    pub slurm_conf: &'a str,
    pub cgroup_conf: &'a str,
    pub account: &'a Account,
    /// This node's slurmd port (its NodeName line's).
    pub port: u16,
    /// The cgroup slurmd runs in (made here).
    pub cgroup: &'a NodeCgroup,
    /// The team volume mounts slurmd and its jobs see (their own tenant's).
    pub volumes: Option<sandbox::Volumes>,
    /// The home mounts its namespace shows (its own cluster's).
    pub homes: Option<sandbox::Volumes>,
    /// What the cluster's jobs on this node may keep in their `/tmp`, all together, in MiB.
    pub job_tmp_mib: u64,
    /// Its job credentials' lifetime (see `conf::auth_info`).
    pub cred_expire: u32,
}

/// Runs (or verifies, or adopts from a former agent) the node's slurmd as `want` says,
/// with the GPUs as they are now; returns it and the GRES it declared.
pub fn ensure(
    current: Option<Running>,
    want: &Spec,
    gpus: &[GpuInfo],
) -> Result<(Running, String), String> {
    let (cluster, node, dir, shared) = (want.cluster, want.node, want.dir, want.shared);
    let spool = shared.join("spool");
    // Refused here, clearly, rather than every batch job held at launch.
    gpufleet_slurm::check_step_sockets(&spool, node)?;
    account::own_dir(&spool, 0, 0, 0o755)?;
    let full = format!(
        "{}{}",
        want.slurm_conf,
        conf::slurmd_lines(&spool, dir, want.socket, want.cred_expire)
    );
    let gres_conf = if want.simulated {
        conf::gres(node, &sim_devices(shared, gpus)?)
    } else {
        "AutoDetect=nvml\n".to_string()
    };
    let gres = conf::gres_of(gpus);
    let cgroup_conf = cgroup_conf(node, want.slurm_conf, want.cgroup_conf);
    match current {
        Some(r)
            if r.conf == full
                && r.gres_conf == gres_conf
                && r.cgroup_conf == cgroup_conf
                && r.slurmd.alive() =>
        {
            return Ok((r, gres));
        }
        Some(r) => r.stop(),
        None => {}
    }
    // Slurm reads cgroup.conf and gres.conf next to slurm.conf; jobs read slurm.conf.
    let conf_path = shared.join("slurm.conf");
    let gid = want.account.uid;
    account::write_shared(&conf_path, &full, gid, 0o640)?;
    account::write_shared(&shared.join("cgroup.conf"), &cgroup_conf, gid, 0o640)?;
    let jobs = jobs_base(dir, shared);
    account::own_dir(&jobs, 0, 0, 0o700)?;
    account::write_shared(
        &shared.join("job_container.conf"),
        &conf::job_container(&jobs),
        gid,
        0o640,
    )?;
    let etc_layer = sandbox::user_databases(shared, cluster)?;
    // Team volumes are mounted on the node after slurmd starts (and unmounted when it
    // leaves): they reach slurmd's namespace, and its jobs', from a shared mount.
    sandbox::share_with_sandboxes(Path::new(VOLUME_MOUNTS))?;
    account::write_shared(&shared.join("gres.conf"), &gres_conf, gid, 0o640)?;
    let name = format!("slurmd/{cluster}/{node}");
    let spec = DaemonSpec {
        program: "slurmd".into(),
        args: vec![
            "-D".into(),
            "-N".into(),
            node.to_string(),
            "-f".into(),
            conf_path.display().to_string(),
        ],
        env: vec![("SLURM_CONF".into(), conf_path.display().to_string())],
        log: dir.join("slurmd.out"),
        config: format!("{full}{gres_conf}{cgroup_conf}"),
    };
    want.cgroup.ensure()?;
    let sandbox = Sandbox::slurmd(
        etc_layer,
        dir,
        want.cgroup.procs_files(),
        want.volumes.clone(),
        want.homes.clone(),
        sandbox::JobTmp::new(dir, &jobs, want.job_tmp_mib),
    );
    // The slurmd a former agent started with this configuration runs on (and its jobs'
    // steps with it, whatever happens to slurmd); else a new one.
    let slurmd = match Daemon::adopt(&name, &spec, Some(sandbox.clone())) {
        Some(slurmd) => slurmd,
        None => Daemon::start_sandboxed(&name, spec, sandbox)
            .map_err(|e| format!("cannot start slurmd: {e}"))?,
    };
    // Verified: slurmd listens on its port (it has read its configuration and GRES).
    let port = want.port;
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
            return Err(format!(
                "slurmd of cluster {cluster} did not listen on port {port}: {}",
                log.lines().last().unwrap_or("no log")
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((
        Running {
            slurmd,
            conf: full,
            gres_conf,
            cgroup_conf,
        },
        gres,
    ))
}

/// cgroup.conf for this node: the control plane's confinement, with cores left
/// unconfined where the node declares more CPUs than its host has (a simulated node).
fn cgroup_conf(node: &str, slurm_conf: &str, ordered: &str) -> String {
    let declared = conf::node_cpus(slurm_conf, node).unwrap_or(1);
    let host = crate::host::cpus();
    if declared > host {
        tracing::info!(%node, declared, host, "the node declares more CPUs than its host has: jobs are not pinned to cores");
        return conf::node_cgroup(false);
    }
    ordered.to_string()
}

/// One character device per GPU and MIG slice, in the node's runtime `dev/`: major
/// [`SIM_MAJOR`], minors from 0 in the order of the GPUs and their slices.
fn sim_devices(shared: &Path, gpus: &[GpuInfo]) -> Result<Vec<Device>, String> {
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

/// What a slurmd started before nodes had their own cgroup (`NodeCgroup`, under which
/// Slurm now keeps its jobs' cgroups) left at the hierarchies' root: ends every process
/// still in the cgroups Slurm's cgroup v1 plugin keeps of `node` for the cluster's
/// account `uid`, `/sys/fs/cgroup/<controller>/slurm_<node>/uid_<uid>/` (a
/// killed slurmstepd leaves its job's cgroups, and a job process that dropped its
/// environment is found there and nowhere else), and removes them, deepest first, for a
/// few seconds while the killed processes leave them; then `slurm_<node>` itself when
/// nothing else is in it. Only the account's: another slurmd of the same node name on this
/// machine (control planes of tests side by side) keeps its jobs. Without a known uid, the
/// whole of `slurm_<node>`.
pub fn remove_cgroups(node: &str, uid: Option<u32>) {
    let nodes: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| c.path().join(format!("slurm_{node}")))
        .filter(|p| p.is_dir())
        .collect();
    let roots: Vec<PathBuf> = match uid {
        Some(uid) => nodes
            .iter()
            .map(|n| n.join(format!("uid_{uid}")))
            .filter(|p| p.is_dir())
            .collect(),
        None => nodes.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    for root in roots {
        node_cgroup::remove_tree(&root, deadline);
    }
    // Fails while another account's jobs are in it: they are not this cluster's.
    for n in &nodes {
        let _ = std::fs::remove_dir(n);
    }
}
