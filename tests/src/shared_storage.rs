//! The platform's shared storage for tests: a sparse btrfs image, loop-mounted once on
//! this machine, standing for the file system every host mounts (see
//! `docs/resources/tenant_cluster.md#storage`). Mounted before a [`crate::netns::Network`]
//! is made, it is visible at the same path in every namespace host (each copies this
//! machine's mounts when its mount namespace is made).
//!
//! Needs root, `mkfs.btrfs` and `btrfs` (Debian's `btrfs-progs`, installed by
//! `scripts/bootstrap.sh`) and a loop device; [`SharedStorage::new`] fails naming what is
//! missing. `Drop` (which runs on a panic too) unmounts it (lazily when something still
//! holds it), which frees its loop device (`mount -o loop` sets autoclear), and removes the
//! image.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub struct SharedStorage {
    /// Holds the image and the mount point.
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "shared storage: cannot run {program} {}: {e}",
                args.join(" ")
            )
        })
}

fn must(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "shared storage: {program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What this machine lacks to make the shared storage, if anything.
pub fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("root (to loop-mount the shared storage's btrfs image)".into());
    }
    for tool in ["mkfs.btrfs", "btrfs", "losetup", "mount", "umount"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!(
                "`{tool}` on PATH (scripts/bootstrap.sh installs btrfs-progs)"
            ));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control (loop devices)".into());
    }
    None
}

impl SharedStorage {
    /// A fresh btrfs of `gib` GiB (sparse: it takes only what is written), mounted.
    pub fn new(gib: u64) -> SharedStorage {
        if let Some(what) = missing() {
            panic!("the shared storage tests need {what}");
        }
        let dir = tempfile::Builder::new()
            .prefix("gf-shared-")
            .tempdir()
            .expect("a temp dir for the shared storage");
        let image = dir.path().join("shared.img");
        let mount = dir.path().join("shared");
        std::fs::create_dir(&mount).expect("the shared storage's mount point");
        let file = std::fs::File::create(&image).expect("the shared storage's image");
        file.set_len(gib << 30).expect("size the image");
        drop(file);
        let image_s = image.display().to_string();
        must("mkfs.btrfs", &["-q", "-f", &image_s]);
        must(
            "mount",
            &["-o", "loop", &image_s, &mount.display().to_string()],
        );
        SharedStorage { _dir: dir, mount }
    }

    /// Where every host mounts it (`serve --shared-storage`).
    pub fn path(&self) -> &Path {
        &self.mount
    }

    pub fn arg(&self) -> String {
        self.mount.display().to_string()
    }

    /// Mounts it at `at` on `host` too (a bind mount in the host's mount namespace), as a
    /// platform mounts its shared storage at one path on every host. `at`'s parent must be
    /// the host's own ([`crate::netns::Host::private_copies`]): `at` is made there.
    pub fn mount_on(&self, host: &crate::netns::Host, at: &Path) {
        let out = host.run(
            "sh",
            &[
                "-c",
                r#"mkdir -p "$2" && mount --bind "$1" "$2""#,
                "sh",
                &self.arg(),
                &at.display().to_string(),
            ],
        );
        assert!(
            out.status.success(),
            "shared storage: mount at {} on {}: {}",
            at.display(),
            host.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The subvolumes on it (`btrfs subvolume list`), by path relative to it.
    pub fn subvolumes(&self) -> Vec<String> {
        must("btrfs", &["subvolume", "list", "-o", &self.arg()])
            .lines()
            .filter_map(|l| l.split(" path ").nth(1).map(str::to_string))
            .collect()
    }

    /// The quota groups of subvolumes on it other than its top level (`0/5`).
    pub fn quota_groups(&self) -> Vec<String> {
        let out = run("btrfs", &["qgroup", "show", "-re", "--raw", &self.arg()]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|id| id.starts_with("0/") && *id != "0/5")
            .map(str::to_string)
            .collect()
    }

    /// Mounts of this machine at or under the shared storage, other than itself.
    pub fn mounts_under(&self) -> Vec<String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let own = self.arg();
        mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|p| p.starts_with(&own) && *p != own)
            .map(str::to_string)
            .collect()
    }
}

impl Drop for SharedStorage {
    fn drop(&mut self) {
        let mount = self.arg();
        if !run("umount", &[&mount]).status.success() {
            // Something (a test's process) still holds it: detach now, freed when let go.
            let _ = run("umount", &["-l", &mount]);
        }
        // The temp dir (image and mount point) goes with `self._dir`.
    }
}
