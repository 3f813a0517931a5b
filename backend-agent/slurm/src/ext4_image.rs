//! A bounded file system of a host's own, on a sparse file: the team volumes without
//! shared storage (the node agent's `local_volumes`) and the clusters' homes
//! (`crate::home_fs`) are each an ext4 on such a file, loop-mounted.

use std::path::Path;
use std::process::{Command, Stdio};

/// A sparse file of `bytes` (0600) with an empty ext4 on it, at `image` once whole (made
/// under another name first: a stop during mkfs leaves no file that looks made).
pub fn make(image: &Path, bytes: u64) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let new = image.with_extension("img.new");
    let made = (|| {
        let _ = std::fs::remove_file(&new);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&new)
            .map_err(|e| format!("{}: {e}", new.display()))?;
        file.set_len(bytes)
            .map_err(|e| format!("sizing {}: {e}", new.display()))?;
        drop(file);
        // No blocks reserved for root (the team's account is not root); the inode tables
        // and journal are not written out now (the file stays sparse).
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                &new.display().to_string(),
            ],
        )?;
        std::fs::rename(&new, image).map_err(|e| format!("{}: {e}", image.display()))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&new);
    }
    made
}

/// Loop-mounts `image` at `target`; the loop device goes with the mount (autoclear).
pub fn mount(image: &Path, target: &Path) -> Result<(), String> {
    // noinit_itable: no background zeroing of inode tables, which would fill the sparse
    // file; nosuid, nodev: nothing on a team's file system grants more than its account
    // has; discard: what the team deletes goes back to the host's disk.
    run(
        "mount",
        &[
            "-t",
            "ext4",
            "-o",
            "loop,noinit_itable,nosuid,nodev,discard",
            &image.display().to_string(),
            &target.display().to_string(),
        ],
    )
    .map(drop)
}

/// Runs `program args`, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
