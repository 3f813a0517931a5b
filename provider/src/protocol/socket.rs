//! Where the plugin listens: a unix socket that only this user (or, when
//! `PLUGIN_UNIX_SOCKET_GROUP` names one, this group) can open.
//!
//! The socket is made inside a fresh directory of its own (mode 0700, or 0750 for a group)
//! under `PLUGIN_UNIX_SOCKET_DIR` (else the temporary directory), then given mode 0600
//! (0660): no other user can reach it even in the moment between bind and chmod. Mutual
//! TLS still guards every connection. Both are removed when the server stops.
//!
//! The old TCP listener needed TCP_NODELAY set by hand (every reply otherwise waited on
//! Terraform's delayed ACK, ~40 ms per call); a unix socket has no such delay, so that
//! workaround is gone with TCP.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tokio::net::UnixListener;

/// The socket's path and directory, removed when this is dropped.
pub struct SocketFiles {
    pub path: PathBuf,
    dir: PathBuf,
}

/// Binds the socket (reading `PLUGIN_UNIX_SOCKET_DIR` and `PLUGIN_UNIX_SOCKET_GROUP`
/// through `env`).
pub fn bind(env: impl Fn(&str) -> Option<String>) -> anyhow::Result<(UnixListener, SocketFiles)> {
    let parent = env("PLUGIN_UNIX_SOCKET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let group = match env("PLUGIN_UNIX_SOCKET_GROUP").filter(|g| !g.is_empty()) {
        Some(name) => Some(group_id(&name)?),
        None => None,
    };
    let (dir_mode, socket_mode) = if group.is_some() {
        (0o750, 0o660)
    } else {
        (0o700, 0o600)
    };
    let dir = private_dir(&parent, dir_mode)?;
    let path = dir.join("plugin.sock");
    let socket = (|| {
        let listener =
            UnixListener::bind(&path).with_context(|| format!("listen on {}", path.display()))?;
        if let Some(gid) = group {
            chown_group(&dir, gid)?;
            chown_group(&path, gid)?;
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(socket_mode))?;
        Ok(listener)
    })();
    match socket {
        Ok(listener) => Ok((listener, SocketFiles { path, dir })),
        Err(e) => {
            let _ = fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

impl Drop for SocketFiles {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_dir(&self.dir);
    }
}

/// A new directory under `parent` that no one else created (mkdir fails on a name that
/// exists, so a planted directory or link is never used).
fn private_dir(parent: &Path, mode: u32) -> anyhow::Result<PathBuf> {
    for _ in 0..8 {
        let dir = parent.join(format!("gpufleet-plugin-{}", uuid::Uuid::new_v4().simple()));
        match fs::DirBuilder::new().mode(mode).create(&dir) {
            Ok(()) => {
                // The umask may have taken bits away; set exactly what is meant.
                fs::set_permissions(&dir, fs::Permissions::from_mode(mode))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("create a directory in {}", parent.display()))
            }
        }
    }
    bail!(
        "could not create a private directory in {}",
        parent.display()
    )
}

/// The group `name` (a name or a numeric id) as a gid.
fn group_id(name: &str) -> anyhow::Result<libc::gid_t> {
    if let Ok(gid) = name.parse::<libc::gid_t>() {
        return Ok(gid);
    }
    let c_name = std::ffi::CString::new(name).context("PLUGIN_UNIX_SOCKET_GROUP")?;
    // SAFETY: getgrnam takes a NUL-terminated name and returns a pointer into static
    // storage (or null), read at once before any other call could overwrite it.
    let entry = unsafe { libc::getgrnam(c_name.as_ptr()) };
    if entry.is_null() {
        bail!("PLUGIN_UNIX_SOCKET_GROUP: no group {name:?}");
    }
    // SAFETY: non-null, pointing to a valid `group` struct (see above).
    Ok(unsafe { (*entry).gr_gid })
}

fn chown_group(path: &Path, gid: libc::gid_t) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
        .with_context(|| format!("give {} to group {gid}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn the_socket_and_its_directory_are_for_this_user_only_and_go_away() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().to_string_lossy().into_owned();
        let (_listener, socket) =
            bind(|k| (k == "PLUGIN_UNIX_SOCKET_DIR").then(|| dir.clone())).unwrap();
        let path = socket.path.clone();
        assert!(path.starts_with(parent.path()));
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        drop(socket);
        assert!(!path.exists());
        assert!(!path.parent().unwrap().exists());
    }

    #[tokio::test]
    async fn a_group_opens_it_to_that_group() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().to_string_lossy().into_owned();
        // SAFETY: getgid cannot fail.
        let gid = unsafe { libc::getgid() }.to_string();
        let (_listener, socket) = bind(|k| match k {
            "PLUGIN_UNIX_SOCKET_DIR" => Some(dir.clone()),
            "PLUGIN_UNIX_SOCKET_GROUP" => Some(gid.clone()),
            _ => None,
        })
        .unwrap();
        assert_eq!(fs::metadata(&socket.path).unwrap().mode() & 0o777, 0o660);
        assert!(group_id("no-such-group-here").is_err());
    }
}
