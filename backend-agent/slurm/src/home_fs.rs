//! The home of a cluster's account on a host whose cluster has no team volume to be it
//! (no shared storage, or embedded agents): a file system of its own, of a bounded size,
//! so that a team that fills its home fills that alone, not the host's `/run` or disk.
//!
//! - What: an ext4 on a sparse file of the agent's `--home-mib`, `<agent data
//!   dir>/slurm/<cluster>/home.img` (on disk: a file on a tmpfs `/run` would be memory
//!   again), loop-mounted on the host at `/run/gpufleet/homes/<cluster>/home`; the
//!   account's home `/run/gpufleet/<cluster>/home` links there. Past the bound a write
//!   fails with ENOSPC ("No space left on device") in the home alone; the host's disk
//!   holds only what is written (the file is sparse and mounted with `discard`). It keeps
//!   a journal: unlike the jobs' `/tmp` (`crate::job_tmp`), it holds the team's files.
//! - One per cluster and host: every node of the cluster on the host (each agent with its
//!   own data dir) and the login share it. The first agent that finds nothing mounted
//!   there mounts its own file (made on first use, kept after); the others use that
//!   mount as it is. Every mount and unmount here holds [`lock_homes`]: two agents that
//!   found the place empty at once would each mount there, one over the other.
//! - Seen: the mount is on the host (the agent, an operator and the tests read the home
//!   there), under a mount of its own ([`HOME_MOUNTS`], made shared like the team volumes'
//!   root), and each daemon's namespace shows its own cluster's home alone ([`view`], see
//!   `crate::volume_view`): no other cluster's name in what it lists.
//! - Lifetime: the mount outlives daemons and agents (a restart, a `kill -9`, an upgrade):
//!   the team's files stay. It is unmounted (lazily) when the host's last node of the
//!   cluster leaves ([`release`]); each agent's file goes with its cluster directory when
//!   its node leaves, the one still mounted then with its last mount (the loop device is
//!   autoclear). After the host restarts, the first agent to start a node of the cluster
//!   mounts its own file again: the team's files are back when that file is the one that
//!   was mounted (always, with one agent per host). The bound applies to homes made after
//!   a change of `--home-mib` (a home is not resized). A home an earlier agent made (a
//!   directory of `/run`) is left as it is until the host's last node of the cluster
//!   leaves: the daemons adopted from that agent would not see a mount made now.
//!
//! Blocking (mkfs.ext4, mount, the host lock): called where the daemons are started,
//! off the async workers.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use crate::account::Account;
use crate::ext4_image::{self, mount};
use crate::host_lock::HostLock;
use crate::volume_view::Volumes;

/// Where the bounded homes are mounted on a host: `<root>/<cluster>/home`.
pub const HOME_MOUNTS: &str = "/run/gpufleet/homes";
/// The default bound of a cluster's home on a host (`node --home-mib`).
pub const DEFAULT_MIB: u64 = 16 * 1024;
/// The smallest bound the flag takes: an ext4 of less is mostly its own metadata.
pub const MIN_MIB: u64 = 64;
/// The largest bound the flag takes (64 TiB).
pub const MAX_MIB: u64 = 64 << 20;
/// The name of the home's file in the cluster's directory of the agent.
pub const IMAGE: &str = "home.img";
/// The lock file of this host's home mounts.
const HOST_LOCK: &str = "/run/gpufleet/homes.lock";
/// At most this many mounts stacked at one home are unmounted (one is usual).
const MAX_STACKED: usize = 8;

/// Where cluster `cluster`'s bounded home is mounted on a host.
pub fn mount_point(cluster: &str) -> PathBuf {
    Path::new(HOME_MOUNTS).join(cluster).join("home")
}

/// What a daemon of `cluster` sees of the homes' mounts: its own cluster's (`bounded`:
/// the cluster's home is one of them), or none. The homes' root is made a mount of its
/// own here too, for a cluster whose home is its team volume: the sandbox lays its tmpfs
/// there (which needs the folder), and other clusters' homes mounted on this host later
/// must reach it only as mounts it detaches.
pub fn view(cluster: &str, bounded: bool) -> Result<Volumes, String> {
    crate::sandbox::share_with_sandboxes(Path::new(HOME_MOUNTS))?;
    view_of(cluster, bounded)
}

/// [`view`] without making the homes' root.
fn view_of(cluster: &str, bounded: bool) -> Result<Volumes, String> {
    let own = bounded.then(|| mount_point(cluster));
    Volumes::new(Path::new(HOME_MOUNTS), own.as_deref())
}

/// A cluster's bounded home on this host, as this agent would make it.
#[derive(Clone, Debug, PartialEq)]
pub struct HomeFs {
    /// This agent's file for it (used when this agent mounts it).
    pub image: PathBuf,
    /// Where it is mounted.
    pub target: PathBuf,
    pub bytes: u64,
}

impl HomeFs {
    /// The home of `cluster` whose file would be in `dir`, the cluster's directory of the
    /// agent (canonical: loop devices name their file by its full path), of `mib` MiB.
    pub fn new(dir: &Path, cluster: &str, mib: u64) -> HomeFs {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        HomeFs {
            image: dir.join(IMAGE),
            target: mount_point(cluster),
            bytes: mib.saturating_mul(1 << 20),
        }
    }

    /// Mounts the home unless something is mounted there (this agent's or another's),
    /// made first when this agent has no file for it; its root is the account's, 0700.
    /// Call it holding [`lock_homes`]. Answers the mount point.
    pub fn ensure(&self, account: &Account) -> Result<PathBuf, String> {
        crate::sandbox::share_with_sandboxes(Path::new(HOME_MOUNTS))?;
        let folder = self.target.parent().unwrap_or(&self.target);
        crate::account::own_dir(folder, 0, account.uid, 0o750)?;
        crate::account::own_dir(&self.target, 0, 0, 0o700)?;
        if mounted_at(&self.target)? == 0 {
            if !self.image.exists() {
                self.make()?;
                tracing::info!(image = %self.image.display(), mib = self.bytes >> 20, "made a cluster's home file system");
            }
            mount(&self.image, &self.target)?;
            tracing::info!(home = %self.target.display(), image = %self.image.display(), "mounted a cluster's home");
        }
        // The file system's root (the directory below it when nothing could be mounted).
        crate::account::own_dir(&self.target, account.uid, account.uid, 0o700)?;
        Ok(self.target.clone())
    }

    /// A sparse file of `bytes` with an empty ext4 on it, at `image`.
    fn make(&self) -> Result<(), String> {
        ext4_image::make(&self.image, self.bytes)
            .map_err(|e| format!("making the home file system {}: {e}", self.image.display()))
    }
}

/// Unmounts (lazily: a process still in it keeps it until it lets go) whatever is mounted
/// at `cluster`'s home, and removes its folders. For the host's last node of the cluster
/// leaving; call it holding [`lock_homes`].
pub fn release(cluster: &str) -> Result<(), String> {
    let target = mount_point(cluster);
    for _ in 0..MAX_STACKED {
        if mounted_at(&target)? == 0 {
            break;
        }
        let t = CString::new(target.as_os_str().as_encoded_bytes())
            .map_err(|e| format!("{}: {e}", target.display()))?;
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("unmounting the home {}: {e}", target.display()));
        }
        tracing::info!(home = %target.display(), "unmounted a cluster's home");
    }
    let left = mounted_at(&target)?;
    if left > 0 {
        return Err(format!(
            "unmounting the home {}: {left} mounts still there",
            target.display()
        ));
    }
    for dir in [&target, &Path::new(HOME_MOUNTS).join(cluster)] {
        match std::fs::remove_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing {}: {e}", dir.display())),
        }
    }
    Ok(())
}

/// How many mounts this namespace has at `target`.
fn mounted_at(target: &Path) -> Result<usize, String> {
    let info = std::fs::read_to_string("/proc/thread-self/mountinfo")
        .map_err(|e| format!("reading /proc/thread-self/mountinfo: {e}"))?;
    Ok(count_at(&info, target))
}

/// The mounts at `target` in mountinfo's text (a home's path needs no escapes: cluster
/// names are lower-case letters, digits and '-').
fn count_at(mountinfo: &str, target: &Path) -> usize {
    mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|t| Path::new(t) == target))
        .count()
}

/// This host's lock on its home mounts, held until dropped: a node's start holds it from
/// before its part of the runtime directory exists (which counts it as the cluster's on
/// this host) until the home is mounted, a node's leaving from its count to the unmount.
pub fn lock_homes() -> Result<HostLock, String> {
    HostLock::acquire(Path::new(HOST_LOCK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_is_one_mount_per_cluster_and_its_file_is_in_the_agents_cluster_dir() {
        let home = HomeFs::new(
            Path::new("/nonexistent/slurm/gf0123456789ab"),
            "gf0123456789ab",
            64,
        );
        assert_eq!(
            home.image,
            Path::new("/nonexistent/slurm/gf0123456789ab/home.img")
        );
        assert_eq!(
            home.target,
            Path::new("/run/gpufleet/homes/gf0123456789ab/home")
        );
        assert_eq!(home.bytes, 64 << 20);
        assert_eq!(HomeFs::new(Path::new("/d"), "gf1", MAX_MIB).bytes, 1 << 46);
        // The view: the own cluster's folder when its home is bounded, else none.
        let v = view_of("gf0123456789ab", true).unwrap();
        assert_eq!(v.own.as_deref(), Some(home.target.as_path()));
        assert_eq!(v.root, Path::new(HOME_MOUNTS));
        assert_eq!(view_of("gf0123456789ab", false).unwrap().own, None);
    }

    /// Gives the calling thread (and what it runs) a mount namespace of its own with a
    /// fresh `/run` (the machine's mounts under it detached: an agent's homes' root is
    /// one): nothing it mounts reaches the machine, and its mounts (with their loop
    /// devices) go when the thread ends, also when the test fails.
    fn private_run() {
        let none = std::ptr::null();
        // SAFETY: plain syscalls on NUL-terminated strings; unshare affects this thread.
        unsafe {
            assert_eq!(
                libc::unshare(libc::CLONE_NEWNS),
                0,
                "unshare (needs root, as CI runs): {}",
                std::io::Error::last_os_error()
            );
            let root = c"/".as_ptr();
            let private = libc::MS_REC | libc::MS_PRIVATE;
            assert_eq!(libc::mount(none, root, none, private, none.cast()), 0);
            let info = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
            let under_run: Vec<&str> = info
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|t| t.starts_with("/run/"))
                .collect();
            for target in under_run.iter().rev() {
                let t = CString::new(*target).unwrap();
                libc::umount2(t.as_ptr(), libc::MNT_DETACH);
            }
            let run = c"/run".as_ptr();
            let tmpfs = c"tmpfs".as_ptr();
            assert_eq!(libc::mount(tmpfs, run, tmpfs, 0, none.cast()), 0);
        }
    }

    /// Whether a loop device still holds `image`.
    fn held(image: &Path) -> bool {
        std::fs::read_dir("/sys/block").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| Path::new(b.trim_end_matches('\n')) == image)
        })
    }

    /// Needs root, mkfs.ext4 and loop devices (CI runs as root): a home's life on a host
    /// with two agents of its cluster.
    #[test]
    fn a_home_is_bounded_shared_by_the_hosts_agents_and_unmounted_by_release() {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        std::thread::spawn(|| {
            private_run();
            let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let uid = crate::account::FIRST_UID + 7;
            let account = Account::new("gf0123456789ab", uid).unwrap();
            let (a, b) = (
                HomeFs::new(da.path(), &account.name, MIN_MIB),
                HomeFs::new(db.path(), &account.name, MIN_MIB),
            );
            let lock = lock_homes().unwrap();
            assert_eq!(a.ensure(&account).unwrap(), mount_point(&account.name));
            assert!(a.image.exists());
            // The second agent finds the first one's mount and uses it: no file of its
            // own, no second mount.
            assert_eq!(b.ensure(&account).unwrap(), a.target);
            assert!(!b.image.exists());
            assert_eq!(mounted_at(&a.target).unwrap(), 1);
            drop(lock);
            let meta = std::fs::metadata(&a.target).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o777),
                (uid, uid, 0o700)
            );
            let folder = std::fs::metadata(a.target.parent().unwrap()).unwrap();
            assert_eq!(
                (folder.uid(), folder.gid(), folder.mode() & 0o777),
                (0, uid, 0o750)
            );
            // Bounded: writing past 64 MiB fails with ENOSPC, and the host's disk holds at
            // most the bound meanwhile.
            let mut big = std::fs::File::create(a.target.join("big")).unwrap();
            let chunk = vec![7u8; 1 << 20];
            let full = (0..2 * MIN_MIB)
                .find_map(|_| big.write_all(&chunk).err())
                .expect("128 MiB written to a 64 MiB home");
            assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "{full}");
            let _ = big.sync_all();
            drop(big);
            let held_bytes = std::fs::metadata(&a.image).unwrap().blocks() * 512;
            assert!(
                (40 << 20..=MIN_MIB << 20).contains(&held_bytes),
                "the file holds {held_bytes} bytes"
            );
            std::fs::remove_file(a.target.join("big")).unwrap();
            std::fs::write(a.target.join("kept"), "the team's").unwrap();
            // Released: unmounted, its folders gone, its loop device with it; mounted
            // again (a host whose last node came back), the team's files are there.
            let lock = lock_homes().unwrap();
            release(&account.name).unwrap();
            assert_eq!(mounted_at(&a.target).unwrap(), 0);
            assert!(!a.target.parent().unwrap().exists());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while held(&a.image) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "a loop device holds the home"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            a.ensure(&account).unwrap();
            assert_eq!(
                std::fs::read_to_string(a.target.join("kept")).unwrap(),
                "the team's"
            );
            release(&account.name).unwrap();
            release(&account.name).unwrap();
            drop(lock);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn mounts_at_a_home_are_counted_at_that_path_alone() {
        let info = "\
22 1 0:21 / / rw shared:1 - ext4 /dev/vda rw
41 22 0:21 /run/gpufleet/homes /run/gpufleet/homes rw shared:5 - ext4 /dev/vda rw
42 41 7:3 / /run/gpufleet/homes/gfa/home rw shared:9 - ext4 /dev/loop3 rw
43 42 7:4 / /run/gpufleet/homes/gfa/home rw shared:9 - ext4 /dev/loop4 rw
44 41 7:5 / /run/gpufleet/homes/gfab/home rw shared:9 - ext4 /dev/loop5 rw
45 41 7:6 / /run/gpufleet/homes/gfa/home/x rw shared:9 - ext4 /dev/loop6 rw
";
        assert_eq!(count_at(info, &mount_point("gfa")), 2);
        assert_eq!(count_at(info, &mount_point("gfab")), 1);
        assert_eq!(count_at(info, &mount_point("gfb")), 0);
    }
}
