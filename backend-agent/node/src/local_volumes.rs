//! Node-local team volumes: without the platform's shared storage, each node of a cluster
//! on an external agent gets a volume of its own of the cluster's `storage_gib`, a sparse
//! file `<data dir>/volumes/<tenant id>/<cluster name>.img` holding an ext4 file system,
//! loop-mounted at the cluster's `storage_path` (under [`VOLUME_MOUNTS`]). Not shared: a
//! file a job writes on one node is not on the others.
//!
//! - Sized: the file system is `storage_gib` GiB (ext4's metadata comes out of it, no
//!   blocks reserved for root); writing past it fails with ENOSPC on this volume alone.
//!   The file is sparse: the host's disk holds only what is written. Grown online (the
//!   file, the loop device's capacity, then `resize2fs`), never shrunk.
//! - Loop devices: `mount -o loop` attaches the image with autoclear, so the loop device
//!   goes with its last mount: an unmount (lazy ones too, once the last process lets go)
//!   or the end of the mount namespace. No loop device is held apart from a mount.
//! - Whose: a mount is this agent's when its loop device's backing file is one of its
//!   images. Several agents on one host (the tests) each keep to their own; the second
//!   node of a cluster on a host whose volume another agent mounted there uses that one.
//! - Lifetime: an agent that stops or is upgraded leaves its volumes mounted (the team's
//!   jobs use them); a host that restarts loses the mount, not the image, and the next
//!   `SetVolumes` mounts it again with its data. The image is deleted when an order no
//!   longer lists its volume (the node left the cluster, or the cluster was deleted), and
//!   by `node --clean`.
//!
//! - One at a time per host: every change of this host's volume mounts (an order's
//!   [`crate::volumes::apply`], `node --clean`) holds [`lock_volumes`]. Two agents of one host
//!   that found the same target empty at once would each mount there, one over the other,
//!   and the one underneath could then never be unmounted by its path.
//!
//! Blocking (mkfs.ext4, mount, losetup, resize2fs, statvfs, the host lock): call it off
//! the async workers (the executor's thread, the telemetry sampler's).

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use gpufleet_proto::v1;
use gpufleet_slurm::ext4_image::{self, run};
use gpufleet_slurm::host_lock::HostLock;
use gpufleet_wire::volumes::VOLUME_MOUNTS;

use crate::mountinfo::{self, Mount};

const GIB: u64 = 1 << 30;
/// The lock file of this host's volume mounts, beside [`VOLUME_MOUNTS`].
const HOST_LOCK: &str = "/run/gpufleet/volumes.lock";
/// The largest node-local volume (`storage_gib`'s own bound, 1 PiB).
pub const MAX_GIB: i64 = 1 << 20;
/// The most volumes a heartbeat reports (a node is in one cluster at a time).
pub const MAX_REPORTED: usize = 16;

/// This agent's node-local volumes: their images under `<data dir>/volumes`.
#[derive(Debug, Clone)]
pub struct LocalVolumes {
    root: PathBuf,
}

impl LocalVolumes {
    pub fn in_data_dir(data_dir: &Path) -> LocalVolumes {
        // Loop devices name their backing file by its full path.
        let data_dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.into());
        LocalVolumes {
            root: data_dir.join("volumes"),
        }
    }

    /// The image of the volume whose mount point is `target`, refused unless `target` is
    /// `VOLUME_MOUNTS/<tenant id>/<cluster name>`.
    pub fn image_of(&self, target: &Path) -> Result<PathBuf, String> {
        let parts: Vec<Component> = target
            .strip_prefix(VOLUME_MOUNTS)
            .map(|rest| rest.components().collect())
            .unwrap_or_default();
        match parts.as_slice() {
            [Component::Normal(tenant), Component::Normal(cluster)] => Ok(self
                .root
                .join(tenant)
                .join(format!("{}.img", cluster.to_string_lossy()))),
            _ => Err(format!(
                "volume target {}: a node-local volume is mounted at {VOLUME_MOUNTS}/<tenant id>/<cluster name>",
                target.display()
            )),
        }
    }

    fn owns(&self, m: &Mount) -> bool {
        m.fstype == "ext4" && backing_file(&m.source).is_some_and(|b| b.starts_with(&self.root))
    }

    /// Whether `m` is the node-local volume of another agent of this host: not this
    /// agent's to unmount.
    pub fn of_another_agent(&self, m: &Mount) -> bool {
        m.fstype == "ext4" && backing_file(&m.source).is_some_and(|b| !b.starts_with(&self.root))
    }

    /// This agent's volume mounts: (mount point, loop device).
    fn mounted(&self) -> Result<Vec<Mount>, String> {
        Ok(mountinfo::under(Path::new(VOLUME_MOUNTS))?
            .into_iter()
            .filter(|m| self.owns(m))
            .collect())
    }

    /// Brings the volume at `target` to `gib` GiB, mounted, its root `owner`'s and 0700:
    /// made when it has no image, mounted when nothing is mounted there (the folders
    /// above `target` exist), grown when smaller. Says what it did.
    pub fn attach(&self, target: &Path, gib: i64, owner: u32) -> Result<Vec<String>, String> {
        let image = self.image_of(target)?;
        let bytes = u64::try_from(gib).unwrap_or(0).saturating_mul(GIB);
        let mut said = Vec::new();
        if !image.exists() {
            make(&image, bytes)?;
            said.push(format!(
                "made a {gib} GiB node-local volume for {}",
                target.display()
            ));
        }
        let at_target = || -> Result<Vec<Mount>, String> {
            Ok(mountinfo::under(Path::new(VOLUME_MOUNTS))?
                .into_iter()
                .filter(|m| m.target == target)
                .collect())
        };
        let size = |image: &Path| {
            std::fs::metadata(image)
                .map(|m| m.len())
                .map_err(|e| format!("{}: {e}", image.display()))
        };
        let mut here = at_target()?;
        if here.is_empty() {
            if size(&image)? < bytes {
                grow_offline(&image, bytes)?;
                said.push(format!("grew it to {gib} GiB"));
            }
            mount(&image, target)?;
            said.push(format!("mounted it at {}", target.display()));
            here = at_target()?;
        }
        let Some(device) = here
            .iter()
            .find(|m| backing_file(&m.source).as_deref() == Some(image.as_path()))
            .map(|m| m.source.clone())
        else {
            // Another agent of this host mounted its own volume of the cluster there.
            said.push(format!(
                "{} holds another agent's volume of this host: used as it is",
                target.display()
            ));
            return Ok(said);
        };
        let was = size(&image)?;
        if was < bytes {
            grow_online(&image, &device, was, bytes)?;
            said.push(format!("grew it to {gib} GiB"));
        }
        own(target, owner)?;
        Ok(said)
    }

    /// Unmounts (lazily) and deletes every volume of this agent whose mount point is not
    /// in `keep`, with its data. Says what it removed.
    pub fn remove_except(&self, keep: &[PathBuf]) -> Result<Vec<String>, String> {
        for m in self.mounted()? {
            if !keep.contains(&m.target) {
                unmount_mine(&m)?;
            }
        }
        let mut said = Vec::new();
        for (image, target) in self.images()? {
            if keep.contains(&target) {
                continue;
            }
            std::fs::remove_file(&image)
                .map_err(|e| format!("removing {}: {e}", image.display()))?;
            if let Some(tenant) = image.parent() {
                let _ = std::fs::remove_dir(tenant);
            }
            tracing::info!(image = %image.display(), "removed a node-local team volume");
            said.push(format!(
                "removed the node-local volume of {}",
                target.display()
            ));
        }
        Ok(said)
    }

    /// Every image of this agent with the mount point it belongs at (half-made ones, left
    /// by an agent stopped during mkfs, with the target of their volume).
    fn images(&self) -> Result<Vec<(PathBuf, PathBuf)>, String> {
        let mut out = Vec::new();
        let tenants = match std::fs::read_dir(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            other => other.map_err(|e| format!("{}: {e}", self.root.display()))?,
        };
        for tenant in tenants.flatten() {
            let Ok(files) = std::fs::read_dir(tenant.path()) else {
                continue;
            };
            for file in files.flatten() {
                let name = file.file_name().to_string_lossy().into_owned();
                let Some(cluster) = name
                    .strip_suffix(".img")
                    .or_else(|| name.strip_suffix(".img.new"))
                else {
                    continue;
                };
                let target = Path::new(VOLUME_MOUNTS)
                    .join(tenant.file_name())
                    .join(cluster);
                out.push((file.path(), target));
            }
        }
        Ok(out)
    }

    /// The bytes used on each of this agent's mounted volumes, for the heartbeat (at most
    /// [`MAX_REPORTED`]). Nothing to read when the agent never made a volume.
    pub fn usage(&self) -> Vec<v1::VolumeUse> {
        if !self.root.exists() {
            return Vec::new();
        }
        let mounted = match self.mounted() {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "cannot list the node-local volumes");
                return Vec::new();
            }
        };
        mounted
            .into_iter()
            .filter_map(|m| {
                let used = used_bytes(&m.target).ok()?;
                Some(v1::VolumeUse {
                    target: m.target.display().to_string(),
                    used_bytes: used,
                })
            })
            .take(MAX_REPORTED)
            .collect()
    }

    /// `node --clean`: unmounts and deletes every volume of this agent; answers how many
    /// images it removed.
    pub fn clean(&self) -> Result<usize, String> {
        let _host = lock_volumes()?;
        let removed = self.remove_except(&[])?;
        if self.root.exists() {
            std::fs::remove_dir_all(&self.root)
                .map_err(|e| format!("removing {}: {e}", self.root.display()))?;
        }
        Ok(removed.len())
    }
}

/// Unmounts this agent's volume mount `m`. An unmount by path takes the mount on top: if
/// another was mounted over `m` (by a release without [`lock_volumes`]), that one goes first,
/// and its agent mounts it again at its next order.
fn unmount_mine(m: &Mount) -> Result<(), String> {
    let still_there = || -> Result<bool, String> {
        Ok(mountinfo::under(Path::new(VOLUME_MOUNTS))?
            .iter()
            .any(|o| o.target == m.target && o.source == m.source))
    };
    let stacked = mountinfo::under(Path::new(VOLUME_MOUNTS))?
        .iter()
        .filter(|o| o.target == m.target)
        .count();
    for _ in 0..stacked.max(1) {
        unmount(&m.target, "a node-local team volume")?;
        if !still_there()? {
            return Ok(());
        }
    }
    Err(format!(
        "unmounting {}: {} is still mounted there",
        m.target.display(),
        m.source
    ))
}

/// This host's lock on its volume mounts (see the module's notes), held until dropped.
pub fn lock_volumes() -> Result<HostLock, String> {
    HostLock::acquire(Path::new(HOST_LOCK))
}

/// The file behind loop device `device` (`/dev/loopN`), if it is one.
fn backing_file(device: &str) -> Option<PathBuf> {
    let name = device.strip_prefix("/dev/")?;
    if !name.starts_with("loop") {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let path = text.trim_end_matches('\n');
    Some(PathBuf::from(
        path.strip_suffix(" (deleted)").unwrap_or(path),
    ))
}

/// A sparse file of `bytes` with an empty ext4 on it, at `image` once whole (made under
/// another name first: a stop during mkfs leaves no image that looks made).
fn make(image: &Path, bytes: u64) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = image.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    ext4_image::make(image, bytes)
}

/// Loop-mounts `image` at `target`; the loop device goes with the mount (autoclear).
fn mount(image: &Path, target: &Path) -> Result<(), String> {
    ext4_image::mount(image, target)?;
    tracing::info!(image = %image.display(), target = %target.display(), "mounted a node-local team volume");
    Ok(())
}

fn set_len(image: &Path, bytes: u64) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .and_then(|f| f.set_len(bytes))
        .map_err(|e| format!("growing {}: {e}", image.display()))
}

/// Grows the volume of `image`, not mounted, to `bytes` (checked first, as resize2fs
/// asks).
fn grow_offline(image: &Path, bytes: u64) -> Result<(), String> {
    if let Some(device) = loop_of(image) {
        // Unmounted lazily and still held by a process: not to be touched from outside.
        return Err(format!(
            "growing {}: still in use through {device}",
            image.display()
        ));
    }
    set_len(image, bytes)?;
    let path = image.display().to_string();
    // e2fsck -p: 0 is clean, 1 is errors corrected.
    let checked = Command::new("e2fsck")
        .args(["-f", "-p", &path])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("e2fsck {path}: {e}"))?;
    if !matches!(checked.status.code(), Some(0 | 1)) {
        return Err(format!(
            "e2fsck -f -p {path}: {} {}",
            checked.status,
            String::from_utf8_lossy(&checked.stdout).trim()
        ));
    }
    run("resize2fs", &[&path]).map(drop)
}

/// The loop device whose backing file is `image`, if one is.
fn loop_of(image: &Path) -> Option<String> {
    std::fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .find(|device| backing_file(device).as_deref() == Some(image))
}

/// Grows the mounted volume of `image` (`was` bytes) on loop device `device` to `bytes`,
/// online: the file, the device's capacity, then the file system. The kernel lets only a
/// process with CAP_SYS_RESOURCE grow a mounted ext4; refused, the file and the device
/// go back to their size and the error says so (the volume then grows when it is next
/// mounted, e.g. after the host restarts).
fn grow_online(image: &Path, device: &str, was: u64, bytes: u64) -> Result<(), String> {
    set_len(image, bytes)?;
    run("losetup", &["--set-capacity", device])?;
    if let Err(e) = run("resize2fs", &[device]) {
        let back = set_len(image, was)
            .and_then(|()| run("losetup", &["--set-capacity", device]).map(drop));
        if let Err(b) = back {
            tracing::warn!(image = %image.display(), error = %b, "cannot put a volume back to its size");
        }
        return Err(format!(
            "{e} (growing a mounted volume needs CAP_SYS_RESOURCE; it grows when next mounted)"
        ));
    }
    Ok(())
}

/// Gives the volume's root to `uid` (its group too), mode 0700.
fn own(target: &Path, uid: u32) -> Result<(), String> {
    std::os::unix::fs::lchown(target, Some(uid), Some(uid))
        .and_then(|()| std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("giving {} to uid {uid}: {e}", target.display()))
}

/// Detaches the mount at `target` at once, even while a process still uses it (a loop
/// device follows when the last one lets go), and removes the folders under
/// [`VOLUME_MOUNTS`] it leaves empty; logs "unmounted `what`". Every team volume's
/// unmount, node-local or bind-mounted from the shared storage (`crate::volumes`).
pub(crate) fn unmount(target: &Path, what: &str) -> Result<(), String> {
    let t = CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|e| format!("{}: {e}", target.display()))?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(format!("unmounting {}: {e}", target.display()));
        }
    }
    let mut dir = target.to_path_buf();
    while dir.starts_with(VOLUME_MOUNTS) && dir != Path::new(VOLUME_MOUNTS) {
        if std::fs::remove_dir(&dir).is_err() {
            break;
        }
        dir.pop();
    }
    tracing::info!(target = %target.display(), "unmounted {what}");
    Ok(())
}

/// Bytes in use on the file system mounted at `target`.
fn used_bytes(target: &Path) -> std::io::Result<u64> {
    let c = CString::new(target.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let blocks = (s.f_blocks as u64).saturating_sub(s.f_bfree as u64);
    Ok(blocks.saturating_mul(s.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives the calling thread (and what it runs) a mount namespace of its own with a
    /// fresh `/run`: nothing it mounts reaches the machine, and its mounts (with their
    /// loop devices) go when the thread ends, also when the test fails.
    fn private_mounts() {
        let none = std::ptr::null();
        // SAFETY: plain syscalls on NUL-terminated literals; unshare affects this thread.
        unsafe {
            assert_eq!(
                libc::unshare(libc::CLONE_NEWNS),
                0,
                "unshare (needs root): {}",
                std::io::Error::last_os_error()
            );
            let root = c"/".as_ptr();
            assert_eq!(
                libc::mount(
                    none,
                    root,
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    none.cast()
                ),
                0
            );
            let run = c"/run".as_ptr();
            assert_eq!(
                libc::mount(c"tmpfs".as_ptr(), run, c"tmpfs".as_ptr(), 0, none.cast()),
                0
            );
        }
    }

    /// Whether this process may grow a mounted ext4 (CAP_SYS_RESOURCE, capability 24).
    fn may_resize() -> bool {
        const CAP_SYS_RESOURCE: u32 = 24;
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap();
        u64::from_str_radix(eff.trim(), 16).unwrap() & (1 << CAP_SYS_RESOURCE) != 0
    }

    /// Waits until no loop device is backed by `image` (autoclear runs as the last
    /// user lets go), for at most 10 s.
    fn detached(image: &Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Some(device) = loop_of(image) {
            assert!(
                std::time::Instant::now() < deadline,
                "{device} still holds {}",
                image.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn statvfs(p: &Path) -> libc::statvfs {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: as in `used_bytes`.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
        s
    }

    /// Needs root (CI runs as root), mkfs.ext4 and loop devices: a real volume's life.
    #[test]
    fn a_volume_is_made_sized_owned_grown_and_removed_with_its_loop_device() {
        std::thread::spawn(|| {
            private_mounts();
            let data = tempfile::tempdir().unwrap();
            let v = LocalVolumes::in_data_dir(data.path());
            let target = Path::new(VOLUME_MOUNTS).join("tenant-1/train");
            std::fs::create_dir_all(&target).unwrap();
            let said = v.attach(&target, 1, 4242).unwrap();
            assert_eq!(said.len(), 2, "{said:?}");
            let image = v.image_of(&target).unwrap();
            // This agent's mounts only: the host may have other agents' volumes, which
            // the private mount namespace inherits.
            let mounts = v.mounted().unwrap();
            assert_eq!(mounts.len(), 1, "{mounts:?}");
            assert_eq!(mounts[0].fstype, "ext4");
            let device = mounts[0].source.clone();
            assert_eq!(backing_file(&device).as_deref(), Some(image.as_path()));
            // Sized: a file system of (a little less than, its metadata) 1 GiB, owned by
            // the account, 0700, and empty.
            let fs = statvfs(&target);
            let size = fs.f_blocks * fs.f_frsize;
            assert!(size > GIB * 9 / 10 && size <= GIB, "{size}");
            let meta = std::fs::metadata(&target).unwrap();
            use std::os::unix::fs::MetadataExt;
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o777),
                (4242, 4242, 0o700)
            );
            let used = |v: &LocalVolumes| v.usage()[0].used_bytes;
            assert!(used(&v) < 1 << 20, "{}", used(&v));
            let mut f = std::fs::File::create(target.join("data")).unwrap();
            std::io::Write::write_all(&mut f, &vec![7u8; 8 << 20]).unwrap();
            f.sync_all().unwrap();
            drop(f);
            // Sparse: the image holds what was written (and the journal's part), not 1 GiB.
            let held = std::fs::metadata(&image).unwrap().blocks() * 512;
            assert!((8 << 20..64 << 20).contains(&held), "{held}");
            assert!(used(&v) >= 8 << 20, "{}", used(&v));
            // Again: nothing to do. Larger while mounted: grown online where the agent may
            // (CAP_SYS_RESOURCE), else refused saying so and left as it was.
            assert_eq!(v.attach(&target, 1, 4242).unwrap(), Vec::<String>::new());
            let fs_size = |t: &Path| {
                let fs = statvfs(t);
                fs.f_blocks * fs.f_frsize
            };
            match v.attach(&target, 2, 4242) {
                Ok(said) => {
                    assert_eq!(said, vec!["grew it to 2 GiB"]);
                    assert!(may_resize(), "grown without CAP_SYS_RESOURCE?");
                    assert!(fs_size(&target) > GIB * 19 / 10);
                }
                Err(e) => {
                    assert!(!may_resize(), "{e}");
                    assert!(e.contains("needs CAP_SYS_RESOURCE"), "{e}");
                    assert_eq!(std::fs::metadata(&image).unwrap().len(), GIB);
                    assert!(fs_size(&target) <= GIB);
                    // As after the host restarted: not mounted, it grows before it is.
                    unmount(&target, "a node-local team volume").unwrap();
                    detached(&image);
                    std::fs::create_dir_all(&target).unwrap();
                    let said = v.attach(&target, 2, 4242).unwrap();
                    let mounted = format!("mounted it at {}", target.display());
                    assert_eq!(said, vec!["grew it to 2 GiB".to_string(), mounted]);
                    assert!(fs_size(&target) > GIB * 19 / 10);
                }
            }
            assert_eq!(std::fs::read(target.join("data")).unwrap().len(), 8 << 20);
            assert_eq!(v.mounted().unwrap().len(), 1);
            // Removed: unmounted, its image gone, and its loop device detached.
            let said = v.remove_except(&[]).unwrap();
            assert_eq!(said.len(), 1, "{said:?}");
            assert!(!image.exists());
            assert!(v.mounted().unwrap().is_empty());
            detached(&image);
            assert_eq!(v.clean().unwrap(), 0);
            assert!(!data.path().join("volumes").exists());
        })
        .join()
        .unwrap();
    }

    /// Two agents of one host, one cluster's target: the second uses the first's mount.
    /// Had one been mounted over the other (as two agents racing without the host lock
    /// did), removing the one underneath still leaves no mount and no loop device: what
    /// left a volume mounted on CI's machine, its image deleted.
    #[test]
    fn agents_of_one_host_never_leave_a_volume_mounted_under_another() {
        std::thread::spawn(|| {
            private_mounts();
            let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let (a, b) = (
                LocalVolumes::in_data_dir(da.path()),
                LocalVolumes::in_data_dir(db.path()),
            );
            let target = Path::new(VOLUME_MOUNTS).join("tenant-stacked/train");
            std::fs::create_dir_all(&target).unwrap();
            a.attach(&target, 1, 4242).unwrap();
            let said = b.attach(&target, 1, 4242).unwrap();
            assert!(
                said.iter().any(|s| s.contains("another agent's volume")),
                "{said:?}"
            );
            assert_eq!(
                (a.mounted().unwrap().len(), b.mounted().unwrap().len()),
                (1, 0)
            );
            // Stacked by hand: b's volume over a's.
            let b_image = b.image_of(&target).unwrap();
            mount(&b_image, &target).unwrap();
            assert_eq!(b.mounted().unwrap().len(), 1);
            let a_image = a.image_of(&target).unwrap();
            assert_eq!(a.remove_except(&[]).unwrap().len(), 1);
            assert!(a.mounted().unwrap().is_empty());
            assert!(!a_image.exists());
            detached(&a_image);
            // b's went on the way down (its agent mounts it again at its next order).
            assert_eq!(b.clean().unwrap(), 1);
            detached(&b_image);
            let left: Vec<Mount> = mountinfo::under(Path::new(VOLUME_MOUNTS))
                .unwrap()
                .into_iter()
                .filter(|m| m.target == target)
                .collect();
            assert!(left.is_empty(), "{left:?}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn images_are_named_by_tenant_and_cluster_and_nothing_else() {
        let v = LocalVolumes {
            root: "/d/volumes".into(),
        };
        assert_eq!(
            v.image_of(&Path::new(VOLUME_MOUNTS).join("t1/train"))
                .unwrap(),
            Path::new("/d/volumes/t1/train.img")
        );
        for bad in ["t1", "t1/train/x", "t1/../x"] {
            let e = v.image_of(&Path::new(VOLUME_MOUNTS).join(bad)).unwrap_err();
            assert!(e.contains("<tenant id>/<cluster name>"), "{bad}: {e}");
        }
        assert!(v.image_of(Path::new("/etc/t/c")).is_err());
    }
}
