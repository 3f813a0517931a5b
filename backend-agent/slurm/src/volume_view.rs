//! What a sandboxed daemon (and every session or job it starts) sees of the team volume
//! mounts (`/run/gpufleet/volumes/<tenant id>/<cluster name>` on the host): its own
//! tenant's alone.
//!
//! Why: every team volume on a node is mounted under one root, so a namespace copied
//! from the host lists, in `/proc/self/mountinfo`, every other tenant's id and cluster
//! name on that host (and a shared host has several). So the daemon's namespace gets,
//! before anything else is mounted in it: a clone of its own tenant's folder (with the
//! volumes mounted there now), every mount at or under the root detached, a small tmpfs
//! on the root, and the clone moved into that tmpfs at its own path.
//!
//! Volumes mounted later: the clone is a slave of the host mount holding the tenant's
//! folder, so a volume the node mounts there later (slurmd starts before its cluster's
//! volume is mounted) reaches it, and its unmount too; a mount in another tenant's folder
//! does not. For that the root must be a mount of its own on the host
//! ([`crate::sandbox::share_with_sandboxes`] makes it one): the other tenants' later
//! mounts then land on that mount, which is detached from the namespace, not on the
//! mount that holds it (`/` or `/run`), which the namespace keeps.
//!
//! Prepared before fork (the mounts read from `/proc/thread-self/mountinfo`), entered between
//! fork and exec with system calls only.

use std::ffi::CString;
use std::path::{Component, Path, PathBuf};

use super::mount::{cpath, cstring, Mount};

/// The team volumes a sandbox shows (see the module's doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Volumes {
    /// Where every team volume of the host is mounted (`gpufleet_wire`'s `VOLUME_MOUNTS`).
    pub root: PathBuf,
    /// The cluster's own volume, `<root>/<tenant id>/<cluster name>`; None: the daemon
    /// sees no team volume.
    pub own: Option<PathBuf>,
}

impl Volumes {
    /// The view of `own` (checked to be `<root>/<tenant>/<cluster>`, plain names) under
    /// `root`.
    pub fn new(root: &Path, own: Option<&Path>) -> Result<Volumes, String> {
        if let Some(own) = own {
            let rest = own.strip_prefix(root).ok().filter(|rest| {
                rest.components().count() == 2
                    && rest.components().all(|c| matches!(c, Component::Normal(_)))
            });
            if rest.is_none() {
                return Err(format!(
                    "volume {}: not a path under {} of the form <tenant id>/<cluster name>",
                    own.display(),
                    root.display()
                ));
            }
        }
        Ok(Volumes {
            root: root.to_path_buf(),
            own: own.map(Path::to_path_buf),
        })
    }

    /// The own tenant's folder, `<root>/<tenant id>`.
    fn tenant_dir(&self) -> Option<&Path> {
        self.own.as_deref().and_then(Path::parent)
    }
}

/// The view's system calls, prepared.
pub(crate) struct View {
    /// The own tenant's folder, cloned first (it exists: made here if missing).
    tenant: Option<CString>,
    /// Every mount at or under the root, deepest first.
    detach: Vec<CString>,
    /// The tmpfs on the root.
    tmpfs: Mount,
}

// open_tree(2) and move_mount(2) flags (linux/mount.h).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// The mount points at or under `root` in mountinfo's text, in its order (a mount after
/// the one it is mounted on).
fn mounts_at_or_under(mountinfo: &str, root: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(root))
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8) + (b - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl View {
    pub(crate) fn prepare(volumes: &Volumes) -> std::io::Result<View> {
        let tenant = match volumes.tenant_dir() {
            Some(dir) => {
                make_folders(&volumes.root, volumes.own.as_deref().unwrap_or(dir))?;
                Some(cpath(dir)?)
            }
            None => None,
        };
        // This thread's: the child forks from it.
        let mountinfo = std::fs::read_to_string("/proc/thread-self/mountinfo")?;
        let detach = mounts_at_or_under(&mountinfo, &volumes.root)
            .iter()
            .rev()
            .map(|p| cpath(p))
            .collect::<std::io::Result<_>>()?;
        Ok(View {
            tenant,
            detach,
            tmpfs: Mount {
                source: cstring("tmpfs")?,
                target: cpath(&volumes.root)?,
                fstype: Some(cstring("tmpfs")?),
                flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                data: Some(cstring("mode=0711,size=64k,nr_inodes=16")?),
            },
        })
    }

    /// In the child, in its own mount namespace (a slave of the host's): see the module's
    /// doc. Only system calls.
    ///
    /// # Safety
    /// Between fork and exec.
    pub(crate) unsafe fn enter(&self) -> std::io::Result<()> {
        // SAFETY: system calls on NUL-terminated strings owned by `self`; the clone's fd
        // is closed on every path.
        unsafe {
            let tree = match &self.tenant {
                Some(dir) => {
                    let fd = libc::syscall(
                        libc::SYS_open_tree,
                        libc::AT_FDCWD,
                        dir.as_ptr(),
                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE,
                    ) as libc::c_int;
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Some(fd)
                }
                None => None,
            };
            let close = |e: std::io::Error| {
                if let Some(fd) = tree {
                    libc::close(fd);
                }
                e
            };
            for target in &self.detach {
                if libc::umount2(target.as_ptr(), libc::MNT_DETACH) != 0 {
                    let e = std::io::Error::last_os_error();
                    // Gone with a mount above it, or unmounted on the host meanwhile.
                    if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) {
                        return Err(close(e));
                    }
                }
            }
            self.tmpfs.run().map_err(close)?;
            if let (Some(fd), Some(dir)) = (tree, &self.tenant) {
                if libc::mkdir(dir.as_ptr(), 0o711) != 0 {
                    return Err(close(std::io::Error::last_os_error()));
                }
                let moved = libc::syscall(
                    libc::SYS_move_mount,
                    fd,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    dir.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                );
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                if moved != 0 {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// Makes each missing folder from `root` down to `dir`, 0711 as the node agent makes them
/// (no one lists the volumes of a node): the folder the clone is taken of, and below it
/// the own volume's, which keeps it from being removed as empty by another cluster's
/// unmount.
fn make_folders(root: &Path, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mut at = PathBuf::from("/");
    for part in dir.components().skip(1) {
        at.push(part);
        if !at.starts_with(root) || at.is_dir() {
            continue;
        }
        match std::fs::DirBuilder::new().mode(0o711).create(&at) {
            Ok(()) => std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o711))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "cannot create {}: {e}",
                    at.display()
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mounts_detached_are_those_at_or_under_the_root_deepest_last_in_mountinfo() {
        let info = "\
22 1 0:21 / / rw - ext4 /dev/vda rw
30 22 0:25 / /run rw - tmpfs tmpfs rw
41 30 0:25 /gpufleet/volumes /run/gpufleet/volumes rw shared:5 - tmpfs tmpfs rw
42 41 0:40 / /run/gpufleet/volumes/t-a/train rw shared:9 - ext4 /dev/loop0 rw
43 41 0:41 / /run/gpufleet/volumes/t-b/asr\\040x rw - ext4 /dev/loop1 rw
44 30 0:42 / /run/gpufleet/volumesX rw - tmpfs tmpfs rw
";
        assert_eq!(
            mounts_at_or_under(info, Path::new("/run/gpufleet/volumes")),
            vec![
                PathBuf::from("/run/gpufleet/volumes"),
                PathBuf::from("/run/gpufleet/volumes/t-a/train"),
                PathBuf::from("/run/gpufleet/volumes/t-b/asr x"),
            ]
        );
    }

    #[test]
    fn the_own_volume_is_a_tenant_and_cluster_under_the_root() {
        let root = Path::new("/run/gpufleet/volumes");
        let v = Volumes::new(root, Some(&root.join("t-a/train"))).unwrap();
        assert_eq!(v.tenant_dir(), Some(root.join("t-a").as_path()));
        assert_eq!(Volumes::new(root, None).unwrap().tenant_dir(), None);
        for bad in ["t-a", "t-a/train/x", "../etc/x", "t-a/../x"] {
            let e = Volumes::new(root, Some(&root.join(bad))).unwrap_err();
            assert!(e.contains("<tenant id>/<cluster name>"), "{bad}: {e}");
        }
        assert!(Volumes::new(root, Some(Path::new("/srv/t-a/train"))).is_err());
    }
}
