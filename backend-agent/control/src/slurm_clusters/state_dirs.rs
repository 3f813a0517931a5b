//! Where a Slurm cluster's controllers keep their state on the platform's shared storage:
//! `<shared>/.slurm/<cluster>@<head node>`, one directory per head the cluster has had.
//!
//! Why not one directory for the cluster's life: a head cut off from the fleet is moved
//! once it is replaced, but its controller runs on until its host is back, saving what it
//! sees (nodes down, jobs requeued) and once more when it is stopped. In a directory of
//! its own that goes nowhere; in a shared one it would overwrite the state of the
//! controllers that took over, which read it back at their next restart (Slurm's own
//! failover does not help here: a primary that still writes its heartbeat keeps the backup
//! standby). So a new head's directory is seeded by its agent with a copy of the head's
//! before (after its own former controller, the backup, stopped and saved), and the
//! directories of the heads before are removed once the new head runs.
//!
//! `<shared>/.slurm/<cluster>`, the one directory of clusters from before, stays theirs
//! while their head stays (an agent from before would not seed a new one: upgraded in any
//! order, nothing is lost), and is the seed of the next head's directory, then removed
//! like the others.

use std::path::{Path, PathBuf};

/// Where the controllers' state lives on the shared storage, per cluster and head.
const STATE_DIRS: &str = ".slurm";

/// The state directory of cluster `name` with node `head` its head (`recorded_head` the
/// head before): the head's own, or the cluster's directory from before while it stays.
/// Blocking (it looks at the shared storage).
pub(super) fn current(shared: &Path, name: &str, recorded_head: &str, head: &str) -> PathBuf {
    let legacy = legacy(shared, name);
    if recorded_head == head && legacy.is_dir() {
        return legacy;
    }
    of_head(shared, name, head)
}

/// The state directory of cluster `name` while node `head` is its head.
fn of_head(shared: &Path, name: &str, head: &str) -> PathBuf {
    shared.join(STATE_DIRS).join(format!("{name}@{head}"))
}

/// The cluster's one directory from before heads had their own.
fn legacy(shared: &Path, name: &str) -> PathBuf {
    shared.join(STATE_DIRS).join(name)
}

/// What a new state directory of the cluster is seeded from, in order: the recorded head's
/// (when the head is another node now), then the directory from before.
pub(super) fn seeds(shared: &Path, name: &str, recorded_head: &str, head: &str) -> Vec<PathBuf> {
    let mut seeds = Vec::new();
    if !recorded_head.is_empty() && recorded_head != head {
        seeds.push(of_head(shared, name, recorded_head));
    }
    seeds.push(legacy(shared, name));
    seeds
}

/// Every state directory of the cluster on the shared storage but `keep`.
pub(super) fn others(shared: &Path, name: &str, keep: Option<&Path>) -> Vec<PathBuf> {
    let prefix = format!("{name}@");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(shared.join(STATE_DIRS))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    dirs.push(legacy(shared, name));
    dirs.retain(|d| Some(d.as_path()) != keep);
    dirs.sort();
    dirs
}

/// Removes `dirs` (blocking); those that were not there are no error.
pub(super) fn remove(dirs: &[PathBuf]) -> Result<(), String> {
    for dir in dirs {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", dir.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_has_its_own_state_but_a_cluster_from_before_keeps_its_own_until_it_moves() {
        let shared = tempfile::tempdir().unwrap();
        let at = |d: &str| shared.path().join(".slurm").join(d);
        assert_eq!(current(shared.path(), "gf7", "", "g1"), at("gf7@g1"));
        assert_eq!(current(shared.path(), "gf7", "g1", "g1"), at("gf7@g1"));
        std::fs::create_dir_all(at("gf7")).unwrap();
        assert_eq!(current(shared.path(), "gf7", "g1", "g1"), at("gf7"));
        assert_eq!(current(shared.path(), "gf7", "g1", "g2"), at("gf7@g2"));
    }

    #[test]
    fn a_new_head_is_seeded_from_the_head_before_then_the_clusters_old_directory() {
        let shared = Path::new("/srv/shared");
        assert_eq!(
            seeds(shared, "gf7", "g1", "g2"),
            [
                PathBuf::from("/srv/shared/.slurm/gf7@g1"),
                PathBuf::from("/srv/shared/.slurm/gf7")
            ]
        );
        // The same head, or a first one: only a directory from before, if any.
        for recorded in ["g2", ""] {
            assert_eq!(
                seeds(shared, "gf7", recorded, "g2"),
                [PathBuf::from("/srv/shared/.slurm/gf7")]
            );
        }
    }

    #[test]
    fn the_others_are_every_directory_of_the_cluster_but_the_one_kept() {
        let shared = tempfile::tempdir().unwrap();
        for d in ["gf7", "gf7@g1", "gf7@g2", "gf70@g1", "gf8@g1"] {
            std::fs::create_dir_all(shared.path().join(".slurm").join(d)).unwrap();
        }
        let keep = current(shared.path(), "gf7", "g1", "g2");
        let names = |dirs: Vec<PathBuf>| -> Vec<String> {
            dirs.iter()
                .map(|d| d.file_name().unwrap().to_string_lossy().to_string())
                .collect()
        };
        assert_eq!(
            names(others(shared.path(), "gf7", Some(&keep))),
            ["gf7", "gf7@g1"]
        );
        assert_eq!(
            names(others(shared.path(), "gf7", None)),
            ["gf7", "gf7@g1", "gf7@g2"]
        );
        remove(&others(shared.path(), "gf7", Some(&keep))).unwrap();
        assert!(keep.exists() && shared.path().join(".slurm/gf70@g1").exists());
        assert!(!shared.path().join(".slurm/gf7@g1").exists());
        assert!(!shared.path().join(".slurm/gf7").exists());
    }
}
