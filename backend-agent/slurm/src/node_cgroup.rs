//! The cgroup a node's slurmd runs in, `gpufleet_slurmd_<cluster>_<node>` in each cgroup
//! v1 hierarchy Slurm uses ([`crate::CGROUP_CONTROLLERS`]), with no limit of its own.
//!
//! It is the root of slurmd's cgroup namespace (see `crate::cgroup_view`): Slurm's cgroup
//! plugin makes its `slurm_<node>/uid_<uid>/job_<id>/...` below it, so on a host shared
//! by several clusters each cluster's jobs see their own cgroups alone, and everything a
//! cluster's node left in cgroupfs is one tree to end and remove. Named by node too:
//! nodes of one cluster may share a host (embedded nodes).
//!
//! Blocking (file writes): callers are on blocking threads.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::CGROUP_ROOT;

/// How long the killed processes of a removed tree are waited for.
const REMOVE_WITHIN: Duration = Duration::from_secs(5);

/// One node's slurmd cgroup of one cluster on this host.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCgroup {
    /// One directory per controller.
    dirs: Vec<PathBuf>,
}

impl NodeCgroup {
    /// `cluster`'s slurmd cgroup of the node whose runtime part is `node` (made or not).
    pub fn of(cluster: &str, node: &str) -> NodeCgroup {
        NodeCgroup::under(Path::new(CGROUP_ROOT), &format!("{cluster}_{node}"))
    }

    /// Every slurmd cgroup of `cluster` on this host, whichever node's (what an agent
    /// stopped without destroying its clusters leaves).
    pub fn every_of(cluster: &str) -> Vec<NodeCgroup> {
        let prefix = format!("gpufleet_slurmd_{cluster}_");
        std::fs::read_dir(Path::new(CGROUP_ROOT).join("memory"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let owner = name.strip_prefix("gpufleet_slurmd_")?.to_string();
                name.starts_with(&prefix)
                    .then(|| NodeCgroup::under(Path::new(CGROUP_ROOT), &owner))
            })
            .collect()
    }

    fn under(root: &Path, owner: &str) -> NodeCgroup {
        NodeCgroup {
            dirs: crate::CGROUP_CONTROLLERS
                .iter()
                .map(|c| root.join(c).join(format!("gpufleet_slurmd_{owner}")))
                .collect(),
        }
    }

    /// Makes the cgroups (or keeps them): readable and passable by all (inside the
    /// namespace a job reads its own limits through them), a cpuset of all its parent's
    /// CPUs and memory nodes (a new cpuset cgroup has none: no process could join).
    pub fn ensure(&self) -> Result<(), String> {
        for dir in &self.dirs {
            crate::make_cgroup(dir, |hierarchy| {
                format!(
                    "slurmd needs the cgroup v1 controller mounted at {} (Slurm's task/cgroup and proctrack/cgroup)",
                    hierarchy.display()
                )
            })?;
            let hierarchy = dir.parent().unwrap_or(dir);
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let own = dir.join(file);
                if !own.exists() || !read(&own).is_empty() {
                    continue;
                }
                let parent = read(&hierarchy.join(file));
                std::fs::write(&own, &parent)
                    .map_err(|e| format!("cannot write {parent} to {}: {e}", own.display()))?;
            }
        }
        Ok(())
    }

    /// The files a process writes "0" to, to move itself into the cgroups.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Ends every process left in the trees (a killed slurmstepd's job, a process that
    /// dropped its environment) and removes them, deepest first, waiting a few seconds
    /// for the killed processes to leave. Returns what could not be removed.
    pub fn remove(&self) -> Vec<PathBuf> {
        let deadline = Instant::now() + REMOVE_WITHIN;
        self.dirs
            .iter()
            .filter(|d| d.is_dir())
            .filter(|d| !remove_tree(d, deadline))
            .cloned()
            .collect()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// SIGKILL to every process in the cgroup tree at `root`, then its directories removed
/// from the deepest up, again until `deadline`; whether it is gone.
pub fn remove_tree(root: &Path, deadline: Instant) -> bool {
    loop {
        let mut dirs = Vec::new();
        let mut stack = vec![root.to_path_buf()];
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
            .filter(|d| std::fs::remove_dir(d).is_err() && d.exists())
            .count();
        if failed == 0 {
            return true;
        }
        if Instant::now() > deadline {
            tracing::warn!(cgroup = %root.display(), "cannot remove a cgroup tree: processes stay in it");
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_slurmd_cgroup_is_one_per_controller_named_by_cluster_and_node() {
        let c = NodeCgroup::under(Path::new("/cg"), "gfabc_n0123abcd");
        assert_eq!(c.procs_files().len(), crate::CGROUP_CONTROLLERS.len());
        assert_eq!(
            c.procs_files()[4],
            PathBuf::from("/cg/memory/gpufleet_slurmd_gfabc_n0123abcd/cgroup.procs")
        );
    }

    /// A real cgroup (this machine mounts cgroup v1, as CI does): a process moved into a
    /// child cgroup is killed and the tree removed.
    #[test]
    fn removing_a_tree_ends_its_processes_and_removes_its_cgroups() {
        let root = Path::new(CGROUP_ROOT)
            .join("pids")
            .join(format!("gpufleet_test_{}", std::process::id()));
        std::fs::create_dir_all(root.join("child")).unwrap();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        std::fs::write(root.join("child/cgroup.procs"), sleeper.id().to_string()).unwrap();
        assert!(remove_tree(&root, Instant::now() + REMOVE_WITHIN));
        assert!(!root.exists());
        let status = sleeper.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
