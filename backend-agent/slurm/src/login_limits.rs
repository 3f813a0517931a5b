//! A login's share of its node. The login runs on one of the team's own nodes (its head),
//! beside the node's agent, slurmd, controller and the team's jobs; without a bound a
//! build or a runaway process in a session could take the node's memory (and the kernel's
//! OOM killer then picks any process, the agent's or a job's) or fork until the host can
//! start nothing. So the login's sshd, and with it every session, runs in one cgroup of
//! its own, `gpufleet_login_<cluster>_<node>` under the cgroup v1 `memory`, `pids` and `cpu`
//! controllers (v1, as Slurm's `task/cgroup` on these hosts), held to a memory limit (swap
//! included where the kernel accounts it), a number of processes and a CPU quota: past
//! them the team's own sessions are slowed, refused a fork or OOM-killed, and nothing
//! else.
//!
//! Job steps started from the login run under slurmd on the nodes, in their jobs' cgroups:
//! these limits are the login's alone. Blocking (file writes): callers are on blocking
//! threads.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup v1 hierarchies, one per controller.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The controllers a login is held by.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// The CFS period a CPU quota is counted in (the kernel's default), in microseconds.
const CPU_PERIOD_US: u64 = 100_000;

/// What every login of a node may use, all its sessions together (`gpufleet-agent node
/// --login-memory-mib`, `--login-cpus`, `--login-pids`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginLimits {
    /// Memory, swap included where accounted, in MiB.
    pub memory_mib: u64,
    /// CPUs' worth of time (a CFS quota), not pinned CPUs.
    pub cpus: u32,
    /// Processes and threads.
    pub pids: u32,
}

impl Default for LoginLimits {
    /// Enough to edit, build and submit; far below a GPU node's memory and cores.
    fn default() -> Self {
        LoginLimits {
            memory_mib: 8192,
            cpus: host_default_cpus(),
            pids: 4096,
        }
    }
}

/// The most CPUs' worth of time a login gets by default.
const MAX_DEFAULT_CPUS: u32 = 4;

/// A login's default CPUs on a host of `host` CPUs: a quarter of them, at least one and
/// at most [`MAX_DEFAULT_CPUS`], so that the limit binds on small hosts too (a flat 4
/// would let a login take all of a 4-CPU host).
pub fn default_cpus(host: u32) -> u32 {
    (host / 4).clamp(1, MAX_DEFAULT_CPUS)
}

/// [`default_cpus`] of this host.
pub fn host_default_cpus() -> u32 {
    default_cpus(online_cpus())
}

/// The CPUs online on this host.
fn online_cpus() -> u32 {
    // SAFETY: sysconf only reads system configuration.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// The cgroups of one cluster's login on this host.
#[derive(Clone, Debug, PartialEq)]
pub struct LoginCgroup {
    /// One directory per controller.
    dirs: Vec<PathBuf>,
}

impl LoginCgroup {
    /// The cgroups of `cluster`'s login on the node whose runtime part is `node` (made or
    /// not). Named by node too: nodes of one cluster may share a host (embedded nodes),
    /// and what one node removes must never be another's login.
    pub fn of(cluster: &str, node: &str) -> LoginCgroup {
        LoginCgroup::under(Path::new(CGROUP_ROOT), &format!("{cluster}_{node}"))
    }

    /// Every login cgroup of `cluster` on this host, whichever node's (what a test that
    /// stopped its agents without destroying their clusters leaves).
    pub fn every_of(cluster: &str) -> Vec<LoginCgroup> {
        let prefix = format!("gpufleet_login_{cluster}_");
        std::fs::read_dir(Path::new(CGROUP_ROOT).join(CONTROLLERS[0]))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let owner = name.strip_prefix("gpufleet_login_")?.to_string();
                name.starts_with(&prefix)
                    .then(|| LoginCgroup::under(Path::new(CGROUP_ROOT), &owner))
            })
            .collect()
    }

    /// `owner`: the cluster and node, `<cluster>_<node>`.
    fn under(root: &Path, owner: &str) -> LoginCgroup {
        LoginCgroup {
            dirs: CONTROLLERS
                .iter()
                .map(|c| root.join(c).join(format!("gpufleet_login_{owner}")))
                .collect(),
        }
    }

    /// Makes the cgroups (or keeps them) and writes `limits` into them: a login that runs
    /// on gets changed limits at once. Fails naming a controller that is not mounted.
    pub fn apply(&self, limits: &LoginLimits) -> Result<(), String> {
        for dir in &self.dirs {
            crate::make_cgroup(dir, |hierarchy| {
                format!(
                    "the login's limits need the cgroup v1 controller mounted at {} (as Slurm's task/cgroup does)",
                    hierarchy.display()
                )
            })?;
        }
        let [memory, pids, cpu] = [&self.dirs[0], &self.dirs[1], &self.dirs[2]];
        let bytes = limits.memory_mib.saturating_mul(1 << 20).to_string();
        set_memory(memory, &bytes)?;
        write(pids, "pids.max", &limits.pids.to_string())?;
        write(cpu, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
        let quota = u64::from(limits.cpus).saturating_mul(CPU_PERIOD_US);
        write(cpu, "cpu.cfs_quota_us", &quota.to_string())
    }

    /// The files a process writes "0" to, to move itself into the cgroups (between fork
    /// and exec: see `Sandbox::cgroups`).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Ends every process left in the cgroups (sessions that outlived their sshd) and
    /// removes them, for a few seconds while the killed processes leave.
    pub fn remove(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for dir in self.dirs.iter().filter(|d| d.is_dir()) {
            loop {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                    // SAFETY: kill only sends a signal.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                if Instant::now() > deadline {
                    tracing::warn!(cgroup = %dir.display(), "cannot remove a login's cgroup");
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The memory limit, and the memory+swap limit set to the same where the kernel
/// accounts swap (so swap gives no more): memsw must never be below memory, so the order
/// of the two writes depends on whether the limit grows or shrinks.
fn set_memory(dir: &Path, bytes: &str) -> Result<(), String> {
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if !memsw.exists() {
        return write(dir, "memory.limit_in_bytes", bytes);
    }
    if write(dir, "memory.limit_in_bytes", bytes).is_ok() {
        return write(dir, "memory.memsw.limit_in_bytes", bytes);
    }
    write(dir, "memory.memsw.limit_in_bytes", bytes)?;
    write(dir, "memory.limit_in_bytes", bytes)
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    let path = dir.join(file);
    std::fs::write(&path, value)
        .map_err(|e| format!("cannot write {value} to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_login_has_one_cgroup_per_controller() {
        let c = LoginCgroup::under(Path::new("/cg"), "gfabc_n0123abcd");
        assert_eq!(
            c.procs_files(),
            ["memory", "pids", "cpu"].map(|k| PathBuf::from(format!(
                "/cg/{k}/gpufleet_login_gfabc_n0123abcd/cgroup.procs"
            )))
        );
    }

    #[test]
    fn the_default_cpu_limit_is_a_share_of_the_host_that_binds_on_small_hosts() {
        let cases = [(1, 1), (2, 1), (4, 1), (8, 2), (12, 3), (16, 4), (128, 4)];
        for (host, login) in cases {
            assert_eq!(default_cpus(host), login, "a host of {host} CPUs");
            assert!(login < host || host == 1, "a host of {host} CPUs");
        }
    }

    #[test]
    fn a_controller_that_is_not_mounted_is_named() {
        let root = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu"] {
            std::fs::create_dir(root.path().join(c)).unwrap();
            std::fs::write(root.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        let err = LoginCgroup::under(root.path(), "gfabc_n0123abcd")
            .apply(&LoginLimits::default())
            .unwrap_err();
        assert!(
            err.contains("cgroup v1 controller mounted at") && err.contains("/pids"),
            "{err}"
        );
    }
}
