//! What a sandboxed daemon (and every session or job it starts) sees of cgroupfs: only
//! the hierarchies of the cgroups it joined, each from that cgroup down.
//!
//! Why: the host's `/sys/fs/cgroup` is readable by everyone, and the names in it say
//! whose work runs there (a login's cgroup holds its cluster's account name, Slurm's
//! `slurm_<node>/uid_<uid>/job_<id>` a job's uid and id) and its files say how much
//! memory and CPU it uses. So the daemon gets a cgroup namespace rooted where it was
//! joined (its `/proc/<pid>/cgroup` reads from there) and a fresh `/sys/fs/cgroup`: a
//! small tmpfs holding a mount of each joined hierarchy, which, mounted from inside the
//! namespace, shows the namespace's root as its own. The host's cgroup mounts are
//! detached from the namespace first. Slurm's cgroup v1 plugin in slurmd's namespace
//! then makes `slurm_<node>/...` under the node's cgroup (`crate::node_cgroup`) and finds
//! its jobs there; a team reads its own limits and usage and no one else's.
//!
//! Prepared before fork (paths and options read from `/proc/self/mountinfo`), entered
//! between fork and exec with system calls only.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use super::mount::{cpath, cstring, Mount};

/// Where the cgroup hierarchies are mounted.
const ROOT: &str = "/sys/fs/cgroup";

/// The view's mounts, prepared.
pub(crate) struct View {
    /// The tmpfs on [`ROOT`].
    tmpfs: Mount,
    /// Each hierarchy's mount point (made in the tmpfs) and mount.
    hierarchies: Vec<(CString, Mount)>,
    /// Links in [`ROOT`] to a hierarchy under another name (`cpu` -> `cpu,cpuacct`):
    /// (target, link).
    links: Vec<(CString, CString)>,
}

/// One cgroup v1 mount as mountinfo lists it.
#[derive(Debug, PartialEq)]
struct Hierarchy {
    at: PathBuf,
    /// Its options for mount(2): the controllers, `name=`, `xattr`... (no rw/ro).
    options: String,
}

/// The cgroup v1 mounts under [`ROOT`] in mountinfo's text.
fn hierarchies(mountinfo: &str) -> Vec<Hierarchy> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let at = mount.split(' ').nth(4)?;
            let mut fs = fs.split(' ');
            (fs.next()? == "cgroup").then_some(())?;
            let options = fs
                .nth(1)?
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro") && !o.starts_with("release_agent="))
                .collect::<Vec<_>>()
                .join(",");
            Path::new(at).starts_with(ROOT).then(|| Hierarchy {
                at: PathBuf::from(at),
                options,
            })
        })
        .collect()
}

impl View {
    /// The view of the hierarchies holding `joined` (`<hierarchy>/<cgroup>/cgroup.procs`
    /// files); fails naming a cgroup whose hierarchy this host does not mount.
    pub(crate) fn prepare(joined: &[PathBuf]) -> std::io::Result<View> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let mounted = hierarchies(&mountinfo);
        let mut shown: Vec<&Hierarchy> = Vec::new();
        for procs in joined {
            let at = procs
                .parent()
                .and_then(Path::parent)
                .map(|h| std::fs::canonicalize(h).unwrap_or_else(|_| h.to_path_buf()))
                .unwrap_or_default();
            let h = mounted.iter().find(|h| h.at == at).ok_or_else(|| {
                std::io::Error::other(format!(
                    "{}: no cgroup v1 hierarchy is mounted at {}",
                    procs.display(),
                    at.display()
                ))
            })?;
            if !shown.iter().any(|s| s.at == h.at) {
                shown.push(h);
            }
        }
        let mut links = Vec::new();
        for e in std::fs::read_dir(ROOT).into_iter().flatten().flatten() {
            let Ok(target) = std::fs::read_link(e.path()) else {
                continue;
            };
            if shown.iter().any(|h| h.at == Path::new(ROOT).join(&target)) {
                links.push((cpath(&target)?, cpath(&e.path())?));
            }
        }
        let hierarchies = shown
            .iter()
            .map(|h| {
                let at = cpath(&h.at)?;
                let mount = Mount {
                    source: cstring("cgroup")?,
                    target: at.clone(),
                    fstype: Some(cstring("cgroup")?),
                    flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    data: Some(cstring(&h.options)?),
                };
                Ok((at, mount))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(View {
            tmpfs: Mount {
                source: cstring("tmpfs")?,
                target: cstring(ROOT)?,
                fstype: Some(cstring("tmpfs")?),
                flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                data: Some(cstring("mode=755,size=64k")?),
            },
            hierarchies,
            links,
        })
    }

    /// In the child, after it joined its cgroups and entered its own mount namespace: a
    /// cgroup namespace rooted there, the host's cgroup mounts detached, the view
    /// mounted.
    ///
    /// # Safety
    /// Between fork and exec: system calls only, on strings owned by `self`.
    pub(crate) unsafe fn enter(&self) -> std::io::Result<()> {
        // SAFETY: system calls on this process; NUL-terminated strings owned by self.
        unsafe {
            if libc::unshare(libc::CLONE_NEWCGROUP) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Not a mount point on every host (EINVAL): then there is nothing to detach.
            if libc::umount2(self.tmpfs.target.as_ptr(), libc::MNT_DETACH) != 0
                && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
            {
                return Err(std::io::Error::last_os_error());
            }
            self.tmpfs.run()?;
            for (at, mount) in &self.hierarchies {
                if libc::mkdir(at.as_ptr(), 0o755) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                mount.run()?;
            }
            for (target, link) in &self.links {
                if libc::symlink(target.as_ptr(), link.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v1_mounts_are_read_with_their_controllers() {
        let info = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,release_agent=/x,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /elsewhere rw,relatime - cgroup cgroup rw,pids
";
        assert_eq!(
            hierarchies(info),
            [
                ("/sys/fs/cgroup/cpu,cpuacct", "cpu,cpuacct"),
                ("/sys/fs/cgroup/memory", "memory"),
                ("/sys/fs/cgroup/systemd", "xattr,name=systemd"),
            ]
            .map(|(at, options)| Hierarchy {
                at: at.into(),
                options: options.into()
            })
        );
    }
}
