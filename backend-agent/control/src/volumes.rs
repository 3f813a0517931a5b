//! Dedicated storage of tenant clusters: a real directory per cluster,
//! `<data-dir>/volumes/<tenant>/<cluster>`, holding a `volume.json` with its size.

use std::path::{Path, PathBuf};

pub fn path(root: &Path, tenant: &str, cluster: &str) -> PathBuf {
    root.join(tenant).join(cluster)
}

fn write_meta(dir: &Path, size_gib: i64) -> std::io::Result<()> {
    let meta = serde_json::json!({ "size_gib": size_gib });
    std::fs::write(dir.join("volume.json"), format!("{meta}\n"))
}

/// Creates the directory and returns its absolute path.
pub fn create(root: &Path, tenant: &str, cluster: &str, size_gib: i64) -> std::io::Result<PathBuf> {
    let dir = path(root, tenant, cluster);
    std::fs::create_dir_all(&dir)?;
    if let Err(e) = write_meta(&dir, size_gib) {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    std::fs::canonicalize(&dir)
}

/// Records the new size (the directory itself has no fixed size in the simulation).
pub fn resize(dir: &Path, size_gib: i64) -> std::io::Result<()> {
    write_meta(dir, size_gib)
}

/// Removes a deleted tenant's folder once its clusters' volumes are gone: only when empty
/// (anything left there is kept, and logged), and a missing one is fine.
pub fn remove_tenant(root: &Path, tenant: &str) {
    let dir = root.join(tenant);
    match std::fs::remove_dir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!(dir = %dir.display(), error = %e, "kept a deleted tenant's volumes folder");
        }
        _ => {}
    }
}

/// Removes the directory; an already missing one is fine.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn create_resize_remove() {
        let root = tempfile::tempdir().unwrap();
        let dir = super::create(root.path(), "t", "c", 100).unwrap();
        assert!(dir.is_absolute());
        let meta = std::fs::read_to_string(dir.join("volume.json")).unwrap();
        assert!(meta.contains("\"size_gib\":100"), "{meta}");
        super::resize(&dir, 200).unwrap();
        assert!(std::fs::read_to_string(dir.join("volume.json"))
            .unwrap()
            .contains("200"));
        super::remove(&dir).unwrap();
        assert!(!dir.exists());
        super::remove(&dir).unwrap();
    }
}
