//! A full disk under the data dir (issue 19): a write that hits ENOSPC answers
//! RESOURCE_EXHAUSTED with the database's own text, not INTERNAL, and the same request
//! works once there is room again. The data dir is a small tmpfs mounted for the test,
//! which needs root (as the Slurm tests do; CI runs as root); without it the test fails
//! saying so.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// A tmpfs mounted at a path, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the file system has no room left (down to single blocks).
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    for chunk in [1 << 20, 64 << 10, 4 << 10, 512] {
        let bytes = vec![0u8; chunk];
        while file.write_all(&bytes).is_ok() {}
    }
    let _ = file.sync_all();
}

/// A tenant with as many long labels as allowed: each is one large write.
fn big_tenant(name: &str) -> CreateTenantRequest {
    let max = gpufleet_proto::limits::MAX_LABELS;
    let value = "v".repeat(gpufleet_proto::limits::MAX_LABEL_VALUE_CHARS);
    CreateTenantRequest {
        request_id: format!("create-{name}"),
        name: name.into(),
        labels: (0..max)
            .map(|i| (format!("label-{i}"), value.clone()))
            .collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_resource_exhausted_and_the_same_request_works_once_there_is_room() {
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test mounts a tmpfs, which needs root (CI runs as root)");
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _mounted = Tmpfs::mount(&data, "8m");
    let agent = Agent::start_with(
        &data,
        &["--admin-token", ADMIN, "--node-agents", "external"],
    );
    let mut c = agent.admin().await;
    c.tenant("before").await;

    let filler = data.join("filler");
    fill(&filler);
    // The WAL reuses the room it had; writes go on until one needs more.
    let mut refused = None;
    for i in 0..1000 {
        match c
            .tenants
            .create_tenant(big_tenant(&format!("full-{i}")))
            .await
        {
            Ok(_) => continue,
            Err(status) => {
                refused = Some((i, status));
                break;
            }
        }
    }
    let (i, status) = refused.expect("a write on a full disk must fail");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "state database error: database or disk is full",
        "{status:?}"
    );

    std::fs::remove_file(&filler).unwrap();
    let again = c
        .tenants
        .create_tenant(big_tenant(&format!("full-{i}")))
        .await
        .expect("the same request once there is room")
        .into_inner();
    assert_eq!(again.tenant.unwrap().name, format!("full-{i}"));
    drop(c);
    let status = agent.signal_and_wait(libc::SIGTERM, std::time::Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
}
