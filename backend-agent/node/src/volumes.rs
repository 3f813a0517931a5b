//! Team volumes on this node: a `SetVolumes` order lists every volume the node should
//! have (its cluster's, or none). A shared volume is bind-mounted from the shared storage
//! (`node --shared-storage`, the path every host mounts it at); without shared storage
//! the node's own volume of the cluster is made and loop-mounted (`local_volumes`). Each
//! goes at its target under [`VOLUME_MOUNTS`], and every mount there that is not listed is
//! unmounted (another agent's node-local volume on the same host excepted): a node that
//! leaves its cluster keeps nothing of the team's storage. Declarative and idempotent.
//!
//! Runs mount(2) and umount(2), and the node-local volumes' commands: call it off the
//! async workers (the executor's thread). In the multi-host tier each namespace host's
//! agent mounts in that host's own mount namespace.

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use gpufleet_proto::v1;
use gpufleet_wire::volumes::VOLUME_MOUNTS;

use crate::local_volumes::{self, LocalVolumes};

/// What one listed volume is made of.
#[derive(Debug, PartialEq)]
enum Source {
    /// A directory on the shared storage, bind-mounted.
    Shared(PathBuf),
    /// This node's own volume of `gib` GiB, its root `owner`'s.
    Local { gib: i64, owner: u32 },
}

/// Brings this node's volume mounts to `order`; answers what it did.
pub fn apply(
    shared: Option<&Path>,
    local: &LocalVolumes,
    order: &v1::SetVolumes,
) -> Result<String, String> {
    let _host = local_volumes::lock_volumes()?;
    let wanted = order
        .volumes
        .iter()
        .map(|v| checked(shared, v))
        .collect::<Result<Vec<_>, _>>()?;
    let listed = |target: &Path| wanted.iter().any(|(_, t)| t == target);
    let mut said = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for m in crate::mountinfo::under(Path::new(VOLUME_MOUNTS))? {
        if listed(&m.target) || seen.contains(&m.target) || local.of_another_agent(&m) {
            continue;
        }
        seen.push(m.target.clone());
        // Detached at once even while a process still uses it: the node has left the
        // cluster.
        local_volumes::unmount(&m.target, "a team volume")?;
        said.push(format!("unmounted {}", m.target.display()));
    }
    let keep: Vec<PathBuf> = wanted
        .iter()
        .filter(|(s, _)| matches!(s, Source::Local { .. }))
        .map(|(_, t)| t.clone())
        .collect();
    said.extend(local.remove_except(&keep)?);
    let now = mounted()?;
    for (source, target) in &wanted {
        match source {
            Source::Shared(source) => {
                if now.contains(target) {
                    continue;
                }
                mount(source, target)?;
                said.push(format!(
                    "mounted {} at {}",
                    source.display(),
                    target.display()
                ));
            }
            Source::Local { gib, owner } => {
                if !now.contains(target) {
                    make_folders(target)?;
                }
                said.extend(local.attach(target, *gib, *owner)?);
            }
        }
    }
    Ok(said.join("; "))
}

/// A volume's source and target, refused unless the target is a plain path under
/// [`VOLUME_MOUNTS`] and the source a directory under this node's shared storage, or
/// (node-local) a size within bounds and no source.
fn checked(shared: Option<&Path>, v: &v1::VolumeMount) -> Result<(Source, PathBuf), String> {
    let plain = |p: &Path| {
        p.is_absolute()
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    };
    if v.local_size_gib != 0 {
        let target = PathBuf::from(&v.target);
        let depth = target
            .strip_prefix(VOLUME_MOUNTS)
            .map(|rest| rest.components().count());
        if !plain(&target) || depth != Ok(2) {
            return Err(format!(
                "volume target {}: not a path under {VOLUME_MOUNTS} of the form <tenant id>/<cluster name>",
                v.target
            ));
        }
        if !v.source.is_empty() {
            return Err(format!(
                "volume {}: a node-local volume has no source (got {})",
                v.target, v.source
            ));
        }
        if !(1..=local_volumes::MAX_GIB).contains(&v.local_size_gib) {
            return Err(format!(
                "volume {}: local_size_gib must be between 1 and {} (got {})",
                v.target,
                local_volumes::MAX_GIB,
                v.local_size_gib
            ));
        }
        return Ok((
            Source::Local {
                gib: v.local_size_gib,
                owner: v.owner_uid,
            },
            target,
        ));
    }
    let Some(shared) = shared else {
        return Err(format!(
            "volume {}: this node has no shared storage (node --shared-storage), so it cannot mount team volumes",
            v.target
        ));
    };
    let (source, target) = (PathBuf::from(&v.source), PathBuf::from(&v.target));
    if !plain(&target) || !target.starts_with(VOLUME_MOUNTS) || target == Path::new(VOLUME_MOUNTS) {
        return Err(format!(
            "volume target {}: not a path under {VOLUME_MOUNTS}",
            v.target
        ));
    }
    if !plain(&source) || !source.starts_with(shared) || source == shared {
        return Err(format!(
            "volume source {}: not under this node's shared storage {}",
            v.source,
            shared.display()
        ));
    }
    if !source.is_dir() {
        return Err(format!(
            "volume source {}: not a directory on this node (is the shared storage mounted at {}?)",
            v.source,
            shared.display()
        ));
    }
    Ok((Source::Shared(source), target))
}

/// The mount points under [`VOLUME_MOUNTS`] in this mount namespace.
fn mounted() -> Result<Vec<PathBuf>, String> {
    let mut out: Vec<PathBuf> = crate::mountinfo::under(Path::new(VOLUME_MOUNTS))?
        .into_iter()
        .map(|m| m.target)
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

fn c_path(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|e| format!("{}: {e}", p.display()))
}

/// How often [`make_folders`] starts again when another agent removed a folder it had
/// just made or found (its unmount of a last volume there).
const FOLDER_TRIES: usize = 5;

/// Makes every missing folder of `target`, each 0711: no one lists the volumes of this
/// node. Other agents on this host may make or remove the same folders at the same time
/// (nodes of one host mounting their teams' volumes at once): a folder that appears
/// meanwhile is taken as it is, and a parent that vanishes meanwhile is made again.
fn make_folders(target: &Path) -> Result<(), String> {
    use std::io::ErrorKind;
    use std::os::unix::fs::DirBuilderExt;
    let mut tries = 0;
    'again: loop {
        tries += 1;
        let mut dir = PathBuf::from("/");
        for c in target.components().skip(1) {
            dir.push(c);
            match std::fs::DirBuilder::new().mode(0o711).create(&dir) {
                // The umask may have taken bits off the mode.
                Ok(()) => {
                    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711));
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) if e.kind() == ErrorKind::NotFound && tries < FOLDER_TRIES => {
                    continue 'again;
                }
                Err(e) => return Err(format!("creating {}: {e}", dir.display())),
            }
        }
        return Ok(());
    }
}

fn mount(source: &Path, target: &Path) -> Result<(), String> {
    make_folders(target)?;
    let (s, t) = (c_path(source)?, c_path(target)?);
    // SAFETY: both are NUL-terminated paths; a bind mount takes no type and no data.
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mounting {} at {}: {}",
            source.display(),
            target.display(),
            std::io::Error::last_os_error()
        ));
    }
    tracing::info!(source = %source.display(), target = %target.display(), "mounted a team volume");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(source: &str, target: &str) -> v1::VolumeMount {
        v1::VolumeMount {
            source: source.into(),
            target: target.into(),
            ..Default::default()
        }
    }

    #[test]
    fn node_local_volumes_need_no_shared_storage_and_are_bounded() {
        let local = |gib: i64, source: &str, target: &str| v1::VolumeMount {
            source: source.into(),
            target: target.into(),
            local_size_gib: gib,
            owner_uid: 4242,
        };
        let target = format!("{VOLUME_MOUNTS}/t/c");
        assert_eq!(
            checked(None, &local(5, "", &target)).unwrap(),
            (
                Source::Local {
                    gib: 5,
                    owner: 4242
                },
                PathBuf::from(&target)
            )
        );
        for (v, says) in [
            (local(5, "/srv/x", &target), "has no source"),
            (local(-1, "", &target), "between 1 and"),
            (
                local(local_volumes::MAX_GIB + 1, "", &target),
                "between 1 and",
            ),
            (local(5, "", "relative/c"), "not a path under"),
            (local(5, "", "/etc/t/c"), "not a path under"),
            (
                local(5, "", &format!("{VOLUME_MOUNTS}/c")),
                "not a path under",
            ),
            (
                local(5, "", &format!("{VOLUME_MOUNTS}/../c")),
                "not a path under",
            ),
        ] {
            let e = checked(None, &v).unwrap_err();
            assert!(e.contains(says), "{v:?}: {e}");
        }
    }

    #[test]
    fn only_volumes_under_the_shared_storage_and_the_mount_root_are_taken() {
        let shared = tempfile::tempdir().unwrap();
        let vol = shared.path().join("t").join("c");
        std::fs::create_dir_all(&vol).unwrap();
        let good = order(vol.to_str().unwrap(), &format!("{VOLUME_MOUNTS}/t/c"));
        assert!(checked(Some(shared.path()), &good).is_ok());
        let e = checked(None, &good).unwrap_err();
        assert!(e.contains("no shared storage"), "{e}");
        for (source, target, says) in [
            (
                "/etc",
                &format!("{VOLUME_MOUNTS}/t/c") as &str,
                "not under this node's shared storage",
            ),
            (vol.to_str().unwrap(), "/etc/x", "not a path under"),
            (
                vol.to_str().unwrap(),
                &format!("{VOLUME_MOUNTS}/../../etc"),
                "not a path under",
            ),
            (vol.to_str().unwrap(), VOLUME_MOUNTS, "not a path under"),
        ] {
            let e = checked(Some(shared.path()), &order(source, target)).unwrap_err();
            assert!(e.contains(says), "{source} -> {target}: {e}");
        }
    }

    #[test]
    fn agents_racing_to_make_the_same_mount_folders_all_succeed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("volumes");
        for round in 0..20 {
            let tenant = root.join(format!("tenant-{round}"));
            let threads = 8;
            let start = std::sync::Arc::new(std::sync::Barrier::new(threads));
            let made: Vec<_> = (0..threads)
                .map(|i| {
                    // Half the agents mount the same cluster's volume, half their own.
                    let target = tenant.join(format!("cluster-{}", i % 2 * i));
                    let start = start.clone();
                    std::thread::spawn(move || {
                        start.wait();
                        make_folders(&target).map(|()| target)
                    })
                })
                .collect();
            for thread in made {
                let target = thread.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
                assert!(target.is_dir(), "{}", target.display());
                let mode = std::fs::metadata(&target).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o711, "{}", target.display());
            }
            let mode = std::fs::metadata(&tenant).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o711);
        }
        // A file in the way is still an error naming it.
        std::fs::write(root.join("file"), "").unwrap();
        let e = make_folders(&root.join("file/cluster")).unwrap_err();
        assert!(
            e.starts_with(&format!("creating {}", root.join("file").display())),
            "{e}"
        );
    }
}
