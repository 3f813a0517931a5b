//! What a local user can read of a running backend: nothing. The state database (every
//! tenant's munge keys and kubeconfig client keys), its WAL and shared memory, the tokens
//! and the agents' journals are the serving user's alone, on a fresh data dir and on one
//! an earlier release left readable. The walk runs after every kind of create.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// What group or others may reach under `dir`, with its mode: `dir` itself unless it is
/// 0700 (then nothing below it is reachable at all), and every file they may read or
/// write wherever it is (should the dir ever be opened). Folders below `dir` may be
/// opened by the daemons that need them (slurmd makes its spool 0755), sockets too
/// (munged's): both sit behind `dir`. Tenants' storage (`volumes/`) is the tenants' and
/// holds none of the platform's secrets: it is left as they keep it.
fn readable_by_others(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        if kind.is_symlink() || kind.is_socket() || path == dir.join("volumes") {
            continue;
        }
        let mode = meta.permissions().mode() & 0o777;
        let checked = path == dir || kind.is_file();
        if checked && mode & 0o077 != 0 {
            found.push((path.clone(), mode));
        }
        if kind.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
        }
    }
    found
}

fn assert_private(dir: &Path, after: &str) {
    let open = readable_by_others(dir);
    assert!(
        open.is_empty(),
        "after {after}, readable by others: {open:?}"
    );
}

/// Makes `path` and what is below it readable by everyone, as an earlier release left it.
fn loosen(path: &Path) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    let mode = if meta.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            loosen(&entry.unwrap().path());
        }
    }
}

#[tokio::test]
async fn the_control_planes_data_dir_is_private_after_every_create_and_after_an_upgrade() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let agent = Agent::start(&dir);
    assert_private(&dir, "start");
    let mut admin = agent.admin().await;
    let (team, _token) = admin.tenant("team-a").await;
    assert_private(&dir, "a tenant create");
    admin.quota(&team.id, "H100-80GB", 24, 0).await;
    assert_private(&dir, "a quota create");
    let t = now();
    admin
        .create_reservation(&team.id, "H100-80GB", 1, t + HOUR, t + 2 * HOUR)
        .await;
    assert_private(&dir, "a reservation create");
    let cluster = admin
        .create_pool_cluster(&team.id, "train", "H100-80GB", 1)
        .await;
    assert!(!cluster.credentials.is_empty(), "a kubeconfig was issued");
    assert_private(&dir, "a cluster create (kubeconfig issued)");
    // A Slurm cluster: its controller's configuration, munge key and daemons' files.
    if ["/usr/sbin/slurmctld", "/usr/sbin/munged"]
        .iter()
        .all(|p| Path::new(p).exists())
    {
        let mut req = Clients::cluster(&team.id, "hpc", "H100-80GB", 1);
        req.orchestrator = "slurm".into();
        admin.create_cluster(req).await;
        assert_private(&dir, "a Slurm cluster create");
    }
    drop(admin);
    agent.stop();

    // An earlier release's data dir: everything world-readable. The next start fixes it
    // before it serves.
    loosen(&dir);
    assert!(!readable_by_others(&dir).is_empty());
    let agent = Agent::start(&dir);
    assert_private(&dir, "a restart on a data dir left readable");
    drop(agent);
}

#[tokio::test]
async fn a_node_agents_data_dir_is_private() {
    let root = tempfile::tempdir().unwrap();
    let cp_dir = root.path().join("control");
    let agent = Agent::start_with(
        &cp_dir,
        &["--admin-token", ADMIN, "--node-agents", "external"],
    );
    let join = std::fs::read_to_string(cp_dir.join("join.token")).unwrap();
    let node_dir = root.path().join("node");
    let mut node = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["node", "--control-plane", &agent.endpoint, "--name", "n1"])
        .args(["--join-token", join.trim(), "--data-dir"])
        .arg(&node_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a node agent");
    // Registered and settled: the agent writes its own view of the node.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !node_dir.join("status.json").exists() {
        assert!(
            Instant::now() < deadline,
            "the node agent never wrote its status"
        );
        assert!(node.try_wait().unwrap().is_none(), "the node agent exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The secret that binds the name to this host is kept, and private.
    use std::os::unix::fs::PermissionsExt;
    let secret = node_dir.join("node.secret");
    let mode = std::fs::metadata(&secret)
        .expect("node.secret")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(std::fs::read_to_string(&secret)
        .unwrap()
        .starts_with("gfn_"));
    assert_private(&node_dir, "a node agent's start");
    assert_private(&cp_dir, "a node agent's registration");
    let _ = node.kill();
    let _ = node.wait();
    drop(agent);
}
