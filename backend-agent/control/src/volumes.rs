//! Tenant clusters' volumes: `<root>/<tenant id>/<cluster name>` (by id: a later tenant
//! that takes a deleted tenant's name never finds its data), where `root` is either
//!
//! - the platform's **shared storage** (`serve --shared-storage DIR`): a btrfs file system
//!   that every host mounts at the same path. Each volume is a btrfs subvolume with a
//!   qgroup limit of exactly `storage_gib` on what it references: writing past it fails
//!   with EDQUOT ("Disk quota exceeded") for that volume only, growing raises the limit
//!   online, and the qgroup's referenced bytes are the volume's use. The volume's root is
//!   owned by the cluster's account (Slurm) or root, mode 0700; a tenant's folder is
//!   0711 (no listing of other teams' volume names). Volumes never together promise more
//!   than the file system holds, so a full volume is only its team's problem.
//! - without shared storage and with external node agents, **node-local**: each node of
//!   the cluster makes and mounts a volume of its own of `storage_gib` at `storage_path`
//!   (`gpufleet_node::local_volumes`; not shared between the nodes), and the control
//!   plane keeps nothing of it here: it only names the size and owner in `SetVolumes`
//!   and reads the use the agents report (`volume_use`). No `storage_retention = "keep"`
//!   (a node's volume goes with the node).
//! - without shared storage and with embedded node agents (all on this host), the data
//!   dir's `volumes/`: a plain directory holding a `volume.json` with its size, unsized
//!   (development and tests without root).
//!
//! Why not an ext4 image per cluster loop-mounted on every node: ext4 (and XFS) are
//! single-host file systems, and mounting one image read-write on several hosts corrupts
//! it. One shared file system with a quota per directory is what NFS, Lustre (project
//! quotas) and GPFS (filesets) give on real hosts; btrfs qgroups are that model on the
//! machines gpufleet is tested on, whose kernel has neither ext4 project quotas
//! (CONFIG_QFMT_V2) nor XFS quotas (CONFIG_XFS_QUOTA).
//!
//! Every function here runs `btrfs` or touches the file system: call them off the async
//! workers (the store's write closure, or `spawn_blocking`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GIB: u64 = 1 << 30;
/// btrfs's magic in `statfs.f_type`.
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// The inode number of every btrfs subvolume's root directory.
const SUBVOLUME_ROOT_INODE: u64 = 256;

#[derive(Debug, Clone)]
pub struct Volumes {
    root: PathBuf,
    shared: bool,
    /// Volumes are mounted on each node of their cluster (external node agents), at
    /// `gpufleet_wire::volumes::mount_path`: bind-mounted from the shared storage, or
    /// without it made on each node (node-local); otherwise used in place at their path.
    node_mounts: bool,
}

impl Volumes {
    /// Unsized directories under `root` (no shared storage configured).
    pub fn in_data_dir(root: PathBuf) -> Volumes {
        // The paths handed out are canonical (`create`), and are checked against the root.
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        Volumes {
            root,
            shared: false,
            node_mounts: false,
        }
    }

    /// Sized volumes on the shared storage at `root`: a btrfs file system (or a directory
    /// on one), with quotas enabled here when they are not yet. Refused, saying what is
    /// missing, when `root` is not on btrfs, `btrfs` is not on the PATH or quotas cannot
    /// be enabled.
    pub fn shared(root: &Path) -> Result<Volumes, String> {
        let root = std::fs::canonicalize(root)
            .map_err(|e| format!("--shared-storage {}: {e}", root.display()))?;
        if !root.is_dir() {
            return Err(format!(
                "--shared-storage {}: not a directory",
                root.display()
            ));
        }
        let kind =
            fs_type(&root).map_err(|e| format!("--shared-storage {}: {e}", root.display()))?;
        if kind != BTRFS_SUPER_MAGIC {
            return Err(format!(
                "--shared-storage {}: not on btrfs (file system type {kind:#x}); volumes need a file system with a quota per directory (btrfs qgroups)",
                root.display()
            ));
        }
        btrfs(&["quota", "enable", &root.display().to_string()]).map_err(|e| {
            format!(
                "--shared-storage {}: cannot enable quotas: {e}",
                root.display()
            )
        })?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("--shared-storage {}: {e}", root.display()))?;
        Ok(Volumes {
            root,
            shared: true,
            node_mounts: false,
        })
    }

    /// Volumes mounted on their clusters' nodes (external node agents), not used in
    /// place: shared ones bind-mounted (each host mounting the shared storage at the same
    /// path), else node-local ones each node makes.
    pub fn with_node_mounts(mut self, on: bool) -> Volumes {
        self.node_mounts = on;
        self
    }

    /// Whether nodes mount the volumes (`SetVolumes`), shared or node-local.
    pub fn mounts_on_nodes(&self) -> bool {
        self.node_mounts
    }

    /// Whether every node of a cluster sees the same volume through the shared storage
    /// (what a Slurm cluster's home and controller state need).
    pub fn shared_on_nodes(&self) -> bool {
        self.shared && self.node_mounts
    }

    /// Whether each node of a cluster has a volume of its own (no shared storage,
    /// external node agents): nothing of it is on this host.
    pub fn is_node_local(&self) -> bool {
        !self.shared && self.node_mounts
    }

    /// A cluster's `storage_path`: where its nodes see its volume.
    pub fn storage_path(&self, tenant_id: &str, name: &str) -> String {
        match self.node_mounts {
            true => gpufleet_wire::volumes::mount_path(tenant_id, name),
            false => self.path(tenant_id, name).display().to_string(),
        }
    }

    /// The volume's directory here of the cluster `name` of `tenant_id` whose
    /// `storage_path` is `storage_path` (a cluster made before volumes were kept by
    /// tenant id has its own path there).
    pub fn dir_of(&self, tenant_id: &str, name: &str, storage_path: &str) -> PathBuf {
        let on_nodes = storage_path.starts_with(gpufleet_wire::volumes::VOLUME_MOUNTS);
        match self.shared || on_nodes {
            true => self.path(tenant_id, name),
            false => PathBuf::from(storage_path),
        }
    }

    pub fn is_shared(&self) -> bool {
        self.shared
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the volume of cluster `name` of `tenant` lives (on shared storage: the same
    /// path on every host).
    pub fn path(&self, tenant: &str, name: &str) -> PathBuf {
        self.root.join(tenant).join(name)
    }

    /// The size in GiB of a volume kept at `dir` by a deleted cluster, if there is one.
    pub fn kept_size_gib(&self, dir: &Path) -> std::io::Result<Option<i64>> {
        if !dir.exists() || self.is_node_local() {
            return Ok(None);
        }
        if !self.shared {
            return Ok(read_meta(dir).ok());
        }
        let Some(id) = subvolume_id(dir)? else {
            return Ok(None);
        };
        let limit = qgroups(&self.root)?
            .into_iter()
            .find(|q| q.id == id)
            .and_then(|q| q.limit);
        Ok(limit.map(|b| (b / GIB) as i64))
    }

    /// Whether the shared storage has room to promise `gib` to the volume at `dir`
    /// (counting what it promises already, less what `dir` holds now). Unsized volumes
    /// always have room.
    pub fn check_room(&self, dir: &Path, gib: i64) -> Result<(), String> {
        if !self.shared {
            return Ok(());
        }
        let io = |e: std::io::Error| format!("storage_gib: cannot read the shared storage: {e}");
        let own = match dir.exists() {
            true => subvolume_id(dir).map_err(io)?,
            false => None,
        };
        let promised: u64 = qgroups(&self.root)
            .map_err(io)?
            .iter()
            .filter(|q| Some(q.id) != own)
            .filter_map(|q| q.limit)
            .sum();
        let capacity = capacity_bytes(&self.root).map_err(io)?;
        let asked = u64::try_from(gib).unwrap_or(0).saturating_mul(GIB);
        if promised.saturating_add(asked) > capacity {
            return Err(format!(
                "storage_gib: the shared storage holds {} GiB and {} GiB of it are promised to other volumes: {gib} GiB do not fit",
                capacity / GIB,
                promised.div_ceil(GIB)
            ));
        }
        Ok(())
    }

    /// Makes the volume at `dir` (or attaches the one a deleted cluster kept there) with a
    /// limit of `gib` GiB, owned by `owner` (root when None), mode 0700; returns its path.
    pub fn create(&self, dir: &Path, gib: i64, owner: Option<u32>) -> std::io::Result<PathBuf> {
        if self.is_node_local() {
            // Each node makes its own when it is told to mount it.
            return Ok(dir.to_path_buf());
        }
        let tenant_dir = dir.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(tenant_dir)?;
        if self.shared {
            std::fs::set_permissions(tenant_dir, std::fs::Permissions::from_mode(0o711))?;
        }
        let kept = dir.exists();
        if !kept {
            if self.shared {
                btrfs(&["subvolume", "create", &dir.display().to_string()])?;
            } else {
                std::fs::create_dir(dir)?;
            }
        }
        let made = self
            .resize(dir, gib)
            .and_then(|()| own(dir, owner.unwrap_or(0), kept));
        if let Err(e) = made {
            if !kept {
                let _ = self.remove(dir);
            }
            return Err(e);
        }
        std::fs::canonicalize(dir)
    }

    /// Sets the volume's limit to `gib` GiB (online: nothing is unmounted or copied).
    pub fn resize(&self, dir: &Path, gib: i64) -> std::io::Result<()> {
        if !dir.starts_with(&self.root) || (self.is_node_local() && !dir.exists()) {
            // Node-local: the nodes grow theirs when they are next told their volumes.
            return Ok(());
        }
        if !self.shared {
            return write_meta(dir, gib);
        }
        let bytes = u64::try_from(gib).unwrap_or(0).saturating_mul(GIB);
        btrfs(&[
            "qgroup",
            "limit",
            &bytes.to_string(),
            &dir.display().to_string(),
        ])
        .map(drop)
    }

    /// GiB in use on the volume, rounded up; 0 for unsized volumes.
    pub fn used_gib(&self, dir: &Path) -> std::io::Result<i64> {
        self.used_gib_all(&[dir.to_path_buf()])
            .pop()
            .unwrap_or(Ok(0))
    }

    /// [`Volumes::used_gib`] of each of `dirs`, with one quota report for all of them.
    pub fn used_gib_all(&self, dirs: &[PathBuf]) -> Vec<std::io::Result<i64>> {
        if !self.shared {
            return dirs.iter().map(|_| Ok(0)).collect();
        }
        let ids: Vec<std::io::Result<Option<u64>>> = dirs
            .iter()
            .map(|d| match d.exists() {
                true => subvolume_id(d),
                false => Ok(None),
            })
            .collect();
        if ids.iter().all(|id| matches!(id, Ok(None))) {
            return dirs.iter().map(|_| Ok(0)).collect();
        }
        // --sync: what was written until now, not at the last commit.
        let report = btrfs(&[
            "qgroup",
            "show",
            "-re",
            "--raw",
            "--sync",
            &self.root.display().to_string(),
        ])
        .map(|out| parse_qgroups(&out));
        ids.into_iter()
            .map(|id| {
                let Some(id) = id? else { return Ok(0) };
                let groups = report
                    .as_ref()
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let used = groups
                    .iter()
                    .find(|q| q.id == id)
                    .map_or(0, |q| q.referenced);
                // An empty subvolume references its root's 16 KiB of metadata: no use.
                Ok(used.saturating_sub(16 * 1024).div_ceil(GIB) as i64)
            })
            .collect()
    }

    /// Whether the volume holds anything besides its own `volume.json`.
    pub fn holds_data(&self, dir: &Path) -> std::io::Result<bool> {
        if !dir.starts_with(&self.root) {
            return Ok(false);
        }
        match std::fs::read_dir(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
            Ok(entries) => {
                for e in entries {
                    if e?.file_name() != "volume.json" {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }

    /// Removes the volume, its data and (on shared storage) its quota group; an already
    /// missing one is fine, and so is a path outside the volumes' root (a node-local
    /// volume's mount point: the nodes remove theirs), which is left alone.
    pub fn remove(&self, dir: &Path) -> std::io::Result<()> {
        if !dir.exists() || !dir.starts_with(&self.root) {
            return Ok(());
        }
        if !self.shared {
            return std::fs::remove_dir_all(dir);
        }
        let Some(id) = subvolume_id(dir)? else {
            return std::fs::remove_dir_all(dir);
        };
        let root = self.root.display().to_string();
        btrfs(&[
            "subvolume",
            "delete",
            "--commit-after",
            &dir.display().to_string(),
        ])?;
        // The subvolume's quota group goes once btrfs has dropped its data.
        btrfs(&["subvolume", "sync", &root, &id.to_string()])?;
        if qgroups(&self.root)?.iter().any(|q| q.id == id) {
            if let Err(e) = btrfs(&["qgroup", "destroy", &format!("0/{id}"), &root]) {
                if qgroups(&self.root)?.iter().any(|q| q.id == id) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The names of the volumes in tenant `tenant`'s folder (kept volumes, once the
    /// tenant has no cluster), sorted.
    pub fn kept_in(&self, tenant: &str) -> std::io::Result<Vec<String>> {
        let mut names = Vec::new();
        match std::fs::read_dir(self.root.join(tenant)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
            Ok(entries) => {
                for e in entries {
                    names.push(e?.file_name().to_string_lossy().into_owned());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Removes a deleted tenant's folder once its clusters' volumes are gone: only when
    /// empty (a kept volume stays, and is logged), and a missing one is fine.
    pub fn remove_tenant(&self, tenant: &str) {
        let dir = self.root.join(tenant);
        match std::fs::remove_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %dir.display(), error = %e, "kept a deleted tenant's volumes folder");
            }
            _ => {}
        }
    }
}

fn read_meta(dir: &Path) -> std::io::Result<i64> {
    let text = std::fs::read_to_string(dir.join("volume.json"))?;
    let meta: serde_json::Value = serde_json::from_str(&text).map_err(std::io::Error::other)?;
    meta["size_gib"]
        .as_i64()
        .ok_or_else(|| std::io::Error::other("volume.json has no size_gib"))
}

fn write_meta(dir: &Path, size_gib: i64) -> std::io::Result<()> {
    let meta = serde_json::json!({ "size_gib": size_gib });
    std::fs::write(dir.join("volume.json"), format!("{meta}\n"))
}

/// Gives the volume to `uid` (its group too), mode 0700. A kept volume attached by a new
/// cluster (another account) gives every file to the new account.
fn own(dir: &Path, uid: u32, walk: bool) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if walk && meta.uid() != uid {
        chown_tree(dir, uid)?;
    } else {
        std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn chown_tree(dir: &Path, uid: u32) -> std::io::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid))?;
        if std::fs::symlink_metadata(&p)?.is_dir() {
            for entry in std::fs::read_dir(&p)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

fn fs_type(path: &Path) -> std::io::Result<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: a zeroed statfs is a valid out-parameter; `c` is a NUL-terminated path.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s.f_type as i64)
}

/// The file system's size in bytes.
fn capacity_bytes(path: &Path) -> std::io::Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((s.f_blocks as u64).saturating_mul(s.f_frsize as u64))
}

/// `BTRFS_IOC_INO_LOOKUP`'s argument (`struct btrfs_ioctl_ino_lookup_args`).
#[repr(C)]
struct InoLookup {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `_IOWR(BTRFS_IOCTL_MAGIC, 18, struct btrfs_ioctl_ino_lookup_args)`.
const BTRFS_IOC_INO_LOOKUP: libc::c_ulong = 0xD000_9412;

/// The btrfs subvolume id of `dir` when it is a subvolume's root (one ioctl: asked with
/// tree 0, the lookup answers the tree, i.e. the subvolume, the file lives in).
fn subvolume_id(dir: &Path) -> std::io::Result<Option<u64>> {
    if std::fs::symlink_metadata(dir)?.ino() != SUBVOLUME_ROOT_INODE {
        return Ok(None);
    }
    let file = std::fs::File::open(dir)?;
    let mut args = InoLookup {
        treeid: 0,
        objectid: SUBVOLUME_ROOT_INODE,
        name: [0; 4080],
    };
    // SAFETY: `file` is an open directory and `args` the ioctl's argument, alive for the
    // call; the kernel writes only within it.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            BTRFS_IOC_INO_LOOKUP as _,
            &mut args as *mut InoLookup,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::other(format!(
            "the subvolume of {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(Some(args.treeid))
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Qgroup {
    /// The subvolume id (qgroup 0/id).
    id: u64,
    referenced: u64,
    limit: Option<u64>,
}

fn qgroups(root: &Path) -> std::io::Result<Vec<Qgroup>> {
    btrfs(&[
        "qgroup",
        "show",
        "-re",
        "--raw",
        &root.display().to_string(),
    ])
    .map(|o| parse_qgroups(&o))
}

/// Rows of `btrfs qgroup show -re --raw`: `0/ID REFERENCED EXCLUSIVE MAX_RFER MAX_EXCL ...`.
fn parse_qgroups(out: &str) -> Vec<Qgroup> {
    out.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let id = cols.first()?.strip_prefix("0/")?.parse().ok()?;
            Some(Qgroup {
                id,
                referenced: cols.get(1)?.parse().ok()?,
                limit: cols.get(3)?.parse().ok(),
            })
        })
        .collect()
}

/// Runs `btrfs args`, failing with its stderr.
fn btrfs(args: &[&str]) -> std::io::Result<String> {
    let out = Command::new("btrfs")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| std::io::Error::other(format!("btrfs {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "btrfs {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsized_create_resize_remove() {
        let root = tempfile::tempdir().unwrap();
        let v = Volumes::in_data_dir(root.path().to_path_buf());
        let dir = v.create(&v.path("t", "c"), 100, None).unwrap();
        assert!(dir.is_absolute());
        assert_eq!(read_meta(&dir).unwrap(), 100);
        v.resize(&dir, 200).unwrap();
        assert_eq!(v.kept_size_gib(&dir).unwrap(), Some(200));
        v.remove(&dir).unwrap();
        assert!(!dir.exists());
        v.remove(&dir).unwrap();
        v.remove_tenant("t");
        assert!(!root.path().join("t").exists());
    }

    #[test]
    fn node_local_volumes_keep_nothing_here_and_touch_no_mount_point() {
        let root = tempfile::tempdir().unwrap();
        let v = Volumes::in_data_dir(root.path().to_path_buf()).with_node_mounts(true);
        assert!(v.is_node_local() && v.mounts_on_nodes() && !v.shared_on_nodes());
        let path = v.storage_path("t", "c");
        assert_eq!(path, gpufleet_wire::volumes::mount_path("t", "c"));
        let dir = v.dir_of("t", "c", &path);
        assert_eq!(dir, v.path("t", "c"));
        v.create(&dir, 100, Some(4242)).unwrap();
        v.resize(&dir, 200).unwrap();
        assert!(!root.path().join("t").exists(), "nothing made on this host");
        assert_eq!(v.kept_size_gib(&dir).unwrap(), None);
        // A mount point elsewhere (a node's, on a host that is also a node) is never
        // emptied from here.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("data"), "team").unwrap();
        assert!(!v.holds_data(elsewhere.path()).unwrap());
        v.remove(elsewhere.path()).unwrap();
        assert!(elsewhere.path().join("data").exists());
    }

    #[test]
    fn qgroup_rows_parse_with_and_without_limits() {
        let out = "Qgroupid    Referenced    Exclusive  Max referenced  Max exclusive   Path \n\
                   --------    ----------    ---------  --------------  -------------   ---- \n\
                   0/5              16384        16384            none           none   <toplevel>\n\
                   0/256        104841216    104841216       104857600           none   t1\n";
        assert_eq!(
            parse_qgroups(out),
            vec![
                Qgroup {
                    id: 5,
                    referenced: 16384,
                    limit: None
                },
                Qgroup {
                    id: 256,
                    referenced: 104_841_216,
                    limit: Some(104_857_600)
                },
            ]
        );
    }

    #[test]
    fn shared_storage_off_btrfs_is_refused_naming_the_flag() {
        let root = tempfile::tempdir().unwrap();
        if fs_type(root.path()).unwrap() == BTRFS_SUPER_MAGIC {
            return;
        }
        let e = Volumes::shared(root.path()).unwrap_err();
        assert!(
            e.starts_with("--shared-storage") && e.contains("not on btrfs"),
            "{e}"
        );
    }
}
