//! The mount namespace a tenant-facing daemon runs in: a cluster's login `sshd` (and so
//! every session of its account) and each node's `slurmd` (and so every job step it
//! starts, whose own per-job namespace `job_container/tmpfs` makes inside this one).
//!
//! What it separates, on a host shared by several clusters (embedded nodes, or one
//! control plane's host running every team's login):
//! - `/proc` is a procfs instance of its own mounted `hidepid=invisible`: the account
//!   sees its own processes only, not another team's, not root's (daemons' command lines
//!   and environments included);
//! - `/etc` is a read-only overlay whose top layer holds copies of `passwd` and `group`
//!   (and their `-` backups) that list the host's own users and groups and this cluster's
//!   account, and no other cluster's (whose names would tell which teams the host
//!   serves). An overlay on the directory rather than bind mounts on the files: useradd
//!   and userdel replace those files by rename, which detaches a file's bind mounts in
//!   every other namespace;
//! - a private tmpfs on the host-shared writable directories: `/var/tmp` and `/run/lock`
//!   for both, and the login's `/tmp` and `/dev/shm` too (a job gets its own `/tmp` and
//!   `/dev/shm` from `job_container/tmpfs`). The cluster's sessions (or a node's jobs)
//!   share them, no one else sees them, and they go when the daemon's last process ends;
//! - its own System V IPC and POSIX message queues (an IPC namespace): `ipcs` shows no
//!   other team's segments, keys or owners;
//! - a cgroupfs of its own (a cgroup namespace rooted at the cgroups it joins, see
//!   `crate::cgroup_view`): `/sys/fs/cgroup` shows those hierarchies from that root, so a
//!   session or job reads its own limits and usage and nothing of another team's cgroups
//!   (their names hold the cluster's account, uid and job ids);
//! - of the team volume mounts under `/run/gpufleet/volumes`, its own tenant's alone (see
//!   `crate::volume_view`): another tenant's id or cluster name is in no mount it lists;
//!   likewise, of the homes under `/run/gpufleet/homes`, its own cluster's alone (see
//!   `crate::home_fs`);
//! - for a node's slurmd, the base of its jobs' `/tmp` is a file system of its own, of a
//!   bounded size (see `crate::job_tmp`).
//!
//! The daemon enters the namespace between fork and exec (`unshare(CLONE_NEWNS)`, then
//! the mounts), so its pid is the supervisor's child as before, and everything it starts
//! inherits it. Nothing is mounted on the host: when the last process of the namespace
//! ends, its mounts and tmpfs contents go with it. Needs root (as the daemons do).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use super::account::{FIRST_UID, UIDS};
pub use super::job_tmp::JobTmp;
use super::mount::{cpath, cstring, Mount};
pub use super::volume_view::Volumes;

/// What a daemon's namespace holds; see the module's doc.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sandbox {
    /// A fresh procfs with `hidepid=invisible` on `/proc`.
    pub hide_processes: bool,
    /// A private tmpfs (mode 1777, of at most `tmp_size`) on each of these.
    pub private_dirs: Vec<PathBuf>,
    /// The tmpfs size (`mount -o size=`), e.g. "1g".
    pub tmp_size: String,
    /// A directory laid read-only over `/etc` (see [`user_databases`]).
    pub etc_layer: Option<PathBuf>,
    /// Directories the daemon itself needs that stay at their paths when they are under
    /// one of `private_dirs` (a data dir in `/tmp`, as the tests have): bound back in.
    pub keep: Vec<PathBuf>,
    /// The `cgroup.procs` files of the cgroups the daemon (and all it starts) runs in,
    /// joined first (see `crate::login_limits`, `crate::node_cgroup`); with a cgroup
    /// namespace rooted at them, the only ones `/sys/fs/cgroup` shows.
    pub cgroups: Vec<PathBuf>,
    /// An IPC namespace of its own.
    pub private_ipc: bool,
    /// The team volume mounts it sees: its own tenant's only. None: the host's, as they
    /// are (a daemon that serves no team).
    pub volumes: Option<Volumes>,
    /// The home mounts it sees, as `volumes` (see `crate::home_fs::view`). None: the
    /// host's, as they are.
    pub homes: Option<Volumes>,
    /// The jobs' `/tmp` space, a bounded file system mounted at its base (a node's
    /// slurmd; see `crate::job_tmp`).
    pub job_tmp: Option<JobTmp>,
}

/// The user databases a sandbox shows instead of the host's.
pub const USER_DATABASES: &[&str] = &["/etc/passwd", "/etc/group", "/etc/passwd-", "/etc/group-"];

impl Sandbox {
    /// The login's: in its `cgroups` (and seeing those only), processes hidden, a user
    /// database without other clusters, its own IPC and its own `/tmp`, `/var/tmp`,
    /// `/dev/shm` and `/run/lock`; `own_dir` (sshd's host key and configuration, which it
    /// reads again for each connection) stays where it is; of the team volumes, `volumes`,
    /// and of the homes, `homes` (None: the host's).
    pub fn login(
        etc_layer: PathBuf,
        own_dir: &Path,
        cgroups: Vec<PathBuf>,
        volumes: Option<Volumes>,
        homes: Option<Volumes>,
    ) -> Sandbox {
        Sandbox {
            cgroups,
            hide_processes: true,
            private_dirs: ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"]
                .iter()
                .map(PathBuf::from)
                .collect(),
            tmp_size: TMP_SIZE.into(),
            etc_layer: Some(etc_layer),
            keep: vec![own_dir.to_path_buf()],
            private_ipc: true,
            volumes,
            homes,
            job_tmp: None,
        }
    }

    /// A node's slurmd: in `cgroups` (the node's, under which Slurm makes its jobs' and
    /// which its jobs see alone), processes hidden, a user database without other
    /// clusters, its own IPC, `/var/tmp` and `/run/lock` (its jobs'); each job gets its own
    /// `/tmp` and `/dev/shm` from `job_container/tmpfs`, made in this namespace under the
    /// bounded file system `job_tmp` mounts at their base. `own_dir` (its spool and
    /// configuration) stays where it is; of the team volumes, `volumes`, and of the homes,
    /// `homes` (None: the host's).
    pub fn slurmd(
        etc_layer: PathBuf,
        own_dir: &Path,
        cgroups: Vec<PathBuf>,
        volumes: Option<Volumes>,
        homes: Option<Volumes>,
        job_tmp: JobTmp,
    ) -> Sandbox {
        Sandbox {
            cgroups,
            hide_processes: true,
            private_dirs: ["/var/tmp", "/run/lock"]
                .iter()
                .map(PathBuf::from)
                .collect(),
            tmp_size: TMP_SIZE.into(),
            etc_layer: Some(etc_layer),
            keep: vec![own_dir.to_path_buf()],
            private_ipc: true,
            volumes,
            homes,
            job_tmp: Some(job_tmp),
        }
    }
}

/// The size of each private tmpfs (`mount -o size=`): what a team's sessions, or a node's
/// jobs, may keep in one of those directories at most (its pages count against the
/// writer's memory cgroup too).
pub const TMP_SIZE: &str = "1g";

/// Writes `<dir>/etc/` (in the cluster's runtime directory: its files are 0644, as the
/// host's are), the layer [`Sandbox::etc_layer`] lays over `/etc`: the host's
/// user databases without other clusters' accounts (those of the cluster accounts' uid
/// range but `keep`). Written again at each start: a new copy for a new account.
pub fn user_databases(dir: &Path, keep: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let layer = dir.join("etc");
    std::fs::create_dir_all(&layer)
        .map_err(|e| format!("cannot create {}: {e}", layer.display()))?;
    std::fs::set_permissions(&layer, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot set the mode of {}: {e}", layer.display()))?;
    for original in USER_DATABASES {
        let original = Path::new(original);
        let Some(name) = original.file_name() else {
            continue;
        };
        let copy = layer.join(name);
        let Ok(text) = std::fs::read_to_string(original) else {
            let _ = std::fs::remove_file(&copy);
            continue;
        };
        let tmp = layer.join(format!(".{}.tmp", name.to_string_lossy()));
        std::fs::write(&tmp, without_other_clusters(&text, keep))
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        std::os::unix::fs::chown(&tmp, Some(0), Some(0))
            .map_err(|e| format!("cannot give {} to root: {e}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("cannot set the mode of {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &copy)
            .map_err(|e| format!("cannot write {}: {e}", copy.display()))?;
    }
    Ok(layer)
}

/// Makes `dir` (created 0711 if missing) a mount of its own (a bind mount of itself) in
/// a peer group of its own, shared, when it is not one yet and nothing is mounted under
/// it (else, with mounts under it already, makes the mount that holds it shared), so that
/// what is mounted under `dir` later (a team volume, mounted when a node joins its
/// cluster) also appears in the sandboxes made from this namespace, which receive the
/// host's shared mounts as slaves. A mount of its own, whose mounts propagate to no other
/// mount of the host, is what lets a sandbox detach every other tenant's volume, those
/// mounted later included (see `crate::volume_view`). Nothing else changes (systemd
/// hosts have their mounts shared already). Idempotent; call it before starting a
/// sandboxed daemon.
pub fn share_with_sandboxes(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    // Each folder made on the way is 0711 (as /run/gpufleet is): no one lists them.
    let mut at = PathBuf::from("/");
    for part in dir.components().skip(1) {
        at.push(part);
        if !at.exists() {
            std::fs::create_dir(&at).map_err(|e| format!("cannot create {}: {e}", at.display()))?;
            let _ = std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o711));
        }
    }
    let c = cpath(dir).map_err(|e| e.to_string())?;
    let mounts = mount_points()?;
    let own = mounts.iter().rev().find(|m| m.target == dir);
    let apart = match own {
        None if !mounts.iter().any(|m| m.target.starts_with(dir)) => {
            mount(Some(&c), &c, libc::MS_BIND)
                .map_err(|e| format!("cannot make {} a mount of its own: {e}", dir.display()))?;
            true
        }
        None => {
            tracing::warn!(dir = %dir.display(), "mounts under it already: the sandboxes started from now on may list the team volumes mounted later");
            let holder = mounts
                .iter()
                .map(|m| m.target.as_path())
                .filter(|p| dir.starts_with(p))
                .max_by_key(|p| p.as_os_str().len())
                .unwrap_or(Path::new("/"));
            let h = cpath(holder).map_err(|e| e.to_string())?;
            return mount(None, &h, libc::MS_SHARED)
                .map_err(|e| format!("cannot make the mount at {} shared: {e}", holder.display()));
        }
        // A bind of a shared mount joins that mount's peer group (as an earlier agent's
        // did): what is mounted on it would propagate to the host's other mounts, and to
        // every sandbox's copy of them.
        Some(own) => {
            own.shared.is_some()
                && mounts
                    .iter()
                    .any(|m| m.id == own.parent && m.shared == own.shared)
        }
    };
    if apart {
        mount(None, &c, libc::MS_PRIVATE)
            .map_err(|e| format!("cannot make the mount at {} private: {e}", dir.display()))?;
    }
    mount(None, &c, libc::MS_SHARED)
        .map_err(|e| format!("cannot make the mount at {} shared: {e}", dir.display()))
}

/// mount(2) with no file system type and no data.
fn mount(source: Option<&CString>, target: &CString, flags: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: NUL-terminated paths, or null where mount(2) allows it.
    let rc = unsafe {
        libc::mount(
            source.map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// One mount as mountinfo lists it: what [`share_with_sandboxes`] reads.
#[derive(Debug, PartialEq)]
struct MountPoint {
    id: u32,
    parent: u32,
    target: PathBuf,
    /// Its peer group (`shared:N`), when shared.
    shared: Option<u32>,
}

/// The mounts in mountinfo's text, in its order.
fn parse_mountinfo(text: &str) -> Vec<MountPoint> {
    text.lines()
        .filter_map(|l| {
            let (fields, _) = l.split_once(" - ")?;
            let f: Vec<&str> = fields.split(' ').collect();
            Some(MountPoint {
                id: f.first()?.parse().ok()?,
                parent: f.get(1)?.parse().ok()?,
                target: PathBuf::from(f.get(4)?),
                shared: f
                    .iter()
                    .skip(6)
                    .find_map(|o| o.strip_prefix("shared:"))
                    .and_then(|n| n.parse().ok()),
            })
        })
        .collect()
}

/// The mounts of this thread's mount namespace (where its mount(2) calls act), as
/// `/proc/thread-self/mountinfo` lists them.
fn mount_points() -> Result<Vec<MountPoint>, String> {
    let mountinfo = std::fs::read_to_string("/proc/thread-self/mountinfo")
        .map_err(|e| format!("reading /proc/thread-self/mountinfo: {e}"))?;
    Ok(parse_mountinfo(&mountinfo))
}

/// `passwd` or `group` lines (NAME:x:ID:...) but those of cluster accounts (ids of the
/// cluster range) other than `keep`.
pub fn without_other_clusters(text: &str, keep: &str) -> String {
    text.lines()
        .filter(|line| {
            let mut fields = line.split(':');
            let name = fields.next().unwrap_or_default();
            let id = fields.nth(1).and_then(|i| i.parse::<u32>().ok());
            let cluster =
                id.is_some_and(|id| (FIRST_UID..FIRST_UID.saturating_add(UIDS)).contains(&id));
            !cluster || name == keep
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A directory bound back in over a private tmpfs: its mount tree is cloned (open_tree)
/// before the tmpfs covers it, the directories to hold it are made in the tmpfs (each
/// ancestor below the tmpfs, 0700), and the clone is moved there (move_mount).
struct Keep {
    make: Vec<CString>,
    target: CString,
}

/// A private tmpfs and the directories bound back in over it.
struct Private {
    tmpfs: Mount,
    keep: Vec<Keep>,
}

// open_tree(2) and move_mount(2) flags (linux/mount.h).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// At most this many kept directories under one private directory.
const MAX_KEEP: usize = 4;

/// The namespace's setup, ready to run in the child between fork and exec.
pub(crate) struct Prepared {
    /// The CPUs this process may run on (sched_getaffinity), and that mask.
    cpus: Vec<usize>,
    mask: libc::cpu_set_t,
    private: Vec<Private>,
    /// The bind mounts and /proc, after them.
    mounts: Vec<Mount>,
    /// `cgroup.procs` files to write "0" to (this process joins each cgroup).
    cgroups: Vec<CString>,
    /// The cgroupfs the process sees, rooted at the cgroups it joined.
    cgroup_view: Option<crate::cgroup_view::View>,
    /// The team volume mounts it sees.
    volume_view: Option<crate::volume_view::View>,
    /// The home mounts it sees.
    home_view: Option<crate::volume_view::View>,
    private_ipc: bool,
    /// The jobs' `/tmp` space, its loop device held until the child has mounted it.
    job_tmp: Option<crate::job_tmp::Attached>,
}

impl Sandbox {
    /// The mounts, in order, with every string made now.
    pub(crate) fn prepare(&self) -> std::io::Result<Prepared> {
        let mut private = Vec::new();
        let mut mounts = Vec::new();
        for dir in self.private_dirs.iter().filter(|d| d.is_dir()) {
            let mut keep = Vec::new();
            for kept in self.keep.iter().filter(|k| k.starts_with(dir) && *k != dir) {
                let below = kept.strip_prefix(dir).unwrap_or(kept);
                let mut at = dir.clone();
                let mut make = Vec::new();
                for part in below.components() {
                    at.push(part);
                    make.push(cpath(&at)?);
                }
                keep.push(Keep {
                    make,
                    target: cpath(kept)?,
                });
            }
            if keep.len() > MAX_KEEP {
                return Err(std::io::Error::other(format!(
                    "at most {MAX_KEEP} directories kept under {}",
                    dir.display()
                )));
            }
            private.push(Private {
                tmpfs: Mount {
                    source: cstring("tmpfs")?,
                    target: cpath(dir)?,
                    fstype: Some(cstring("tmpfs")?),
                    flags: libc::MS_NOSUID | libc::MS_NODEV,
                    data: Some(cstring(&format!("mode=1777,size={}", self.tmp_size))?),
                },
                keep,
            });
        }
        if self.hide_processes {
            mounts.push(Mount {
                source: cstring("proc")?,
                target: cstring("/proc")?,
                fstype: Some(cstring("proc")?),
                flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                data: Some(cstring("hidepid=invisible")?),
            });
        }
        if let Some(layer) = &self.etc_layer {
            let shown = layer.display().to_string();
            if shown.contains([':', ',', '\\']) {
                return Err(std::io::Error::other(format!(
                    "{shown}: an overlay layer's path may hold no ':', ',' or '\\'"
                )));
            }
            mounts.push(Mount {
                source: cstring("overlay")?,
                target: cstring("/etc")?,
                fstype: Some(cstring("overlay")?),
                flags: libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                data: Some(cstring(&format!("lowerdir={}:/etc", layer.display()))?),
            });
        }
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this process.
        let mask = unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mask) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            mask
        };
        let cpus = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: CPU_ISSET reads the mask within its size.
            .filter(|c| unsafe { libc::CPU_ISSET(*c, &mask) })
            .take(MAX_CPUS)
            .collect();
        Ok(Prepared {
            cpus,
            mask,
            private,
            mounts,
            cgroups: self
                .cgroups
                .iter()
                .map(|p| cpath(p))
                .collect::<std::io::Result<_>>()?,
            cgroup_view: match self.cgroups.is_empty() {
                true => None,
                false => Some(crate::cgroup_view::View::prepare(&self.cgroups)?),
            },
            volume_view: self
                .volumes
                .as_ref()
                .map(crate::volume_view::View::prepare)
                .transpose()?,
            home_view: self
                .homes
                .as_ref()
                .map(crate::volume_view::View::prepare)
                .transpose()?,
            private_ipc: self.private_ipc,
            job_tmp: self.job_tmp.as_ref().map(JobTmp::attach).transpose()?,
        })
    }
}

impl Prepared {
    /// In the child, between fork and exec: a mount namespace of its own whose mounts
    /// propagate nowhere, then the mounts. Only system calls (async-signal-safe).
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        // SAFETY: unshare and mount are system calls on this process only; every pointer
        // is a NUL-terminated string owned by `self`, or null where mount(2) allows it.
        unsafe {
            self.join_cgroups()?;
            if self.private_ipc && libc::unshare(libc::CLONE_NEWIPC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            self.new_mount_namespace()?;
            // Slave, not private: mounts the host shares (see [`share_with_sandboxes`]: a
            // team volume mounted on the node after slurmd started) reach the namespace,
            // and nothing mounted in it reaches the host.
            let root = c"/";
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(view) = &self.volume_view {
                view.enter()?;
            }
            if let Some(view) = &self.home_view {
                view.enter()?;
            }
            for p in &self.private {
                let mut trees = [-1 as libc::c_int; MAX_KEEP];
                for (k, tree) in p.keep.iter().zip(trees.iter_mut()) {
                    *tree = libc::syscall(
                        libc::SYS_open_tree,
                        libc::AT_FDCWD,
                        k.target.as_ptr(),
                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE,
                    ) as libc::c_int;
                    if *tree < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                p.tmpfs.run()?;
                for (k, tree) in p.keep.iter().zip(trees) {
                    for dir in &k.make {
                        if libc::mkdir(dir.as_ptr(), 0o700) != 0
                            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    if libc::syscall(
                        libc::SYS_move_mount,
                        tree,
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        k.target.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(tree);
                }
            }
            // At the path the daemon sees, under the private directories and kept ones.
            if let Some(space) = &self.job_tmp {
                space.enter()?;
            }
            for m in &self.mounts {
                m.run()?;
            }
            if let Some(view) = &self.cgroup_view {
                view.enter()?;
            }
        }
        Ok(())
    }
}

impl Prepared {
    /// Moves this process into each cgroup (cgroup v1: "0" names the writer).
    ///
    /// # Safety
    /// Between fork and exec: open, write and close only.
    unsafe fn join_cgroups(&self) -> std::io::Result<()> {
        for procs in &self.cgroups {
            // SAFETY: `procs` is a NUL-terminated path owned by `self`; the buffer is static.
            unsafe {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, c"0".as_ptr().cast(), 1);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// `unshare(CLONE_NEWNS)`, in a namespace whose id is below that of any mount
    /// namespace made later on any CPU of this process.
    ///
    /// Why: `job_container/tmpfs` keeps each job's namespace by bind-mounting its nsfs file
    /// inside slurmd's namespace, and the kernel refuses that (EINVAL, "ns base mount
    /// failed") unless the job's namespace has a higher id than the caller's (a guard
    /// against namespace loops). Linux 6.18 hands out namespace ids from per-CPU batches,
    /// so a namespace made later on another CPU may have a lower id: slurmd's namespace,
    /// made on the CPU whose batch is highest, would fail every job whose namespace is
    /// made on another. The host's first namespace is older than all, which is why plain
    /// Slurm does not meet this. So: sample each CPU's next id (a namespace made there),
    /// then make ours on the CPU of the lowest, and check it is below every sample (each
    /// CPU's ids only grow); the affinity is put back. Where the kernel cannot tell a
    /// namespace's id (NS_GET_MNTNS_ID, before 6.8), ids were a global sequence and one
    /// unshare is all it takes.
    ///
    /// # Safety
    /// Between fork and exec, in a single-threaded process.
    unsafe fn new_mount_namespace(&self) -> std::io::Result<()> {
        // SAFETY: system calls on this process; the arrays are on this stack.
        unsafe {
            let unshare = || {
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            let pin = |cpu: usize| {
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut one);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
            };
            unshare()?;
            let Some(_) = mount_namespace_id() else {
                return Ok(());
            };
            let mut next = [u64::MAX; MAX_CPUS];
            for (i, cpu) in self.cpus.iter().enumerate() {
                if pin(*cpu) == 0 {
                    unshare()?;
                    next[i] = mount_namespace_id().unwrap_or(u64::MAX);
                }
            }
            let n = self.cpus.len();
            for _ in 0..8 {
                let (lowest, _) = next[..n]
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, id)| **id)
                    .unwrap_or((0, &0));
                pin(self.cpus[lowest]);
                unshare()?;
                let ours = mount_namespace_id().unwrap_or(0);
                let below_all = next[..n]
                    .iter()
                    .enumerate()
                    .all(|(i, id)| i == lowest || ours < *id);
                if below_all {
                    break;
                }
                next[lowest] = ours;
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.mask);
        }
        Ok(())
    }
}

/// At most this many CPUs are sampled.
const MAX_CPUS: usize = 1024;

/// ioctl(2) on an nsfs file: the mount namespace's id (linux/nsfs.h, Linux 6.8).
const NS_GET_MNTNS_ID: libc::c_ulong = 0x8008_b705;

/// This process's mount namespace's id; None where the kernel cannot tell.
///
/// # Safety
/// Between fork and exec is fine: open, ioctl and close only.
unsafe fn mount_namespace_id() -> Option<u64> {
    // SAFETY: a NUL-terminated path; the id is written into a local u64.
    unsafe {
        let fd = libc::open(
            c"/proc/self/ns/mnt".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let mut id = 0u64;
        let rc = libc::ioctl(fd, NS_GET_MNTNS_ID as _, &mut id as *mut u64);
        libc::close(fd);
        (rc == 0).then_some(id)
    }
}

#[cfg(test)]
mod job_tmp_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs at `at` (made first) holding a file named `mark`, in this thread's namespace.
    fn tmpfs_with(at: &Path, mark: &str) {
        std::fs::create_dir_all(at).unwrap();
        let (fs, target) = (cstring("tmpfs").unwrap(), cpath(at).unwrap());
        // SAFETY: NUL-terminated strings; a tmpfs takes no data.
        let rc = unsafe {
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "mount {at:?}: {}", std::io::Error::last_os_error());
        std::fs::write(at.join(mark), mark).unwrap();
    }

    /// Team B's daemon, sandboxed on a host holding team A's and B's volumes, lists in
    /// its mountinfo none of A's (neither those mounted before it started nor after) and
    /// all of B's, and reads B's volumes at their paths; the host keeps all of them.
    #[test]
    fn a_sandbox_lists_and_reaches_its_own_tenants_volumes_alone_those_mounted_later_too() {
        use std::io::{BufRead, Write};
        std::thread::spawn(|| {
            // SAFETY: syscalls on this thread (unshare affects it alone) and literals.
            unsafe {
                assert_eq!(
                    libc::unshare(libc::CLONE_NEWNS),
                    0,
                    "unshare (needs root): {}",
                    std::io::Error::last_os_error()
                );
                let none = std::ptr::null();
                let rc = libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    none.cast(),
                );
                assert_eq!(rc, 0);
                // Shared within this namespace, as a systemd host's mounts are: a bind
                // made on them would join their peer group.
                let rc = libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_SHARED,
                    none.cast(),
                );
                assert_eq!(rc, 0);
            }
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("volumes");
            share_with_sandboxes(&root).unwrap();
            share_with_sandboxes(&root).unwrap();
            let mounts = mount_points().unwrap();
            let own = mounts.iter().find(|m| m.target == root).expect("a mount of its own");
            assert!(own.shared.is_some(), "{own:?}");
            assert!(
                !mounts.iter().any(|m| m.id != own.id && m.shared == own.shared),
                "in a peer group of its own: {mounts:?}"
            );
            tmpfs_with(&root.join("tenant-a/train"), "a-train");
            tmpfs_with(&root.join("tenant-b/asr"), "b-asr");
            let sandbox = Sandbox {
                volumes: Some(Volumes::new(&root, Some(&root.join("tenant-b/asr"))).unwrap()),
                ..Sandbox::default()
            };
            let prepared = sandbox.prepare().unwrap();
            let show = format!(
                "cat /proc/self/mountinfo; cat {0}/tenant-b/asr/b-asr {0}/tenant-b/late/b-late; echo; echo END",
                root.display()
            );
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", &format!("{show}; read go; {show}")])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null());
            // SAFETY: enter makes system calls only.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || prepared.enter());
            }
            let mut child = cmd.spawn().unwrap();
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            let shown = |out: &mut std::io::BufReader<_>| {
                let mut text = String::new();
                while !text.ends_with("END\n") {
                    assert_ne!(out.read_line(&mut text).unwrap(), 0, "{text}");
                }
                text
            };
            let before = shown(&mut out);
            // Mounted on the host after the daemon started: one volume of each tenant.
            tmpfs_with(&root.join("tenant-a/late"), "a-late");
            tmpfs_with(&root.join("tenant-b/late"), "b-late");
            writeln!(child.stdin.take().unwrap(), "go").unwrap();
            let after = shown(&mut out);
            assert!(child.wait().unwrap().success());
            for (when, text) in [("before", &before), ("after", &after)] {
                assert!(!text.contains("tenant-a"), "{when}: {text}");
                assert!(text.contains(&format!("{}/tenant-b/asr ", root.display())), "{when}: {text}");
                assert!(text.contains("b-asr"), "{when}: {text}");
            }
            assert!(!before.contains("b-late"), "{before}");
            assert!(
                after.contains(&format!("{}/tenant-b/late ", root.display())) && after.contains("b-late"),
                "{after}"
            );
            let host: Vec<PathBuf> = mount_points().unwrap().into_iter().map(|m| m.target).collect();
            for m in ["tenant-a/train", "tenant-a/late", "tenant-b/asr", "tenant-b/late"] {
                assert!(host.contains(&root.join(m)), "the host lost {m}: {host:?}");
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_sandboxed_user_database_keeps_the_host_and_its_own_cluster_only() {
        let own = FIRST_UID + 5;
        let other = FIRST_UID + 9;
        let passwd = format!(
            "root:x:0:0:root:/root:/bin/bash\nsshd:x:101:65534::/run/sshd:/usr/sbin/nologin\n\
             gfaaaaaaaaaaaa:x:{own}:{own}::/run/gpufleet/gfaaaaaaaaaaaa/home:/bin/sh\n\
             gfbbbbbbbbbbbb:x:{other}:{other}::/run/gpufleet/gfbbbbbbbbbbbb/home:/bin/sh\n"
        );
        let kept = without_other_clusters(&passwd, "gfaaaaaaaaaaaa");
        assert!(kept.contains("root:x:0:") && kept.contains("sshd:x:101:"));
        assert!(kept.contains("gfaaaaaaaaaaaa"), "{kept}");
        assert!(!kept.contains("gfbbbbbbbbbbbb"), "{kept}");
        let group = format!("root:x:0:\ngfbbbbbbbbbbbb:x:{other}:\n");
        assert_eq!(
            without_other_clusters(&group, "gfaaaaaaaaaaaa"),
            "root:x:0:\n"
        );
    }
}
