//! `serve --postgres` (issue 41): the control plane serves its store from a real
//! PostgreSQL server (Debian's, started by the test) instead of the data dir's SQLite
//! file: admission admits and refuses as on SQLite, no SQLite file is made, a restart
//! finds everything in the database (the fleet seeded once; the embedded agents' node
//! secrets are the data dir's, so it is the same data dir), and `check --postgres` finds
//! what it wrote sound.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;
use gpufleet_sql::test_server::TestServer;

fn database_file(dir: &Path, url: &str) -> String {
    let file = dir.join("database.url");
    std::fs::write(&file, url).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file.to_str().unwrap().to_string()
}

// Synchronous: the postgres client runs its own runtime; the API calls get theirs below.
#[test]
fn serve_runs_its_store_on_postgres_and_a_restart_finds_it() {
    let pg = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = pg.database("gpufleet").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = database_file(dir.path(), &url);
    let flags = [
        "--admin-token",
        ADMIN,
        "--postgres",
        "--database-file",
        &file,
    ];
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let first = dir.path().join("first");
    let agent = Agent::start_with(&first, &flags);
    let (team, kept) = runtime.block_on(async {
        let mut admin = agent.admin().await;
        let (a, _) = admin.tenant("team-a").await;
        admin.quota(&a.id, "H100-80GB", 16, 0).await;
        let kept = admin
            .create_pool_cluster(&a.id, "train", "H100-80GB", 1)
            .await;
        let gone = admin
            .create_pool_cluster(&a.id, "scratch", "H100-80GB", 1)
            .await;
        admin.delete_cluster(&gone.id).await;
        // Admission refuses on PostgreSQL as on SQLite: 16 GPUs of quota, 8 held, 16 asked.
        let refused = status(
            admin
                .clusters
                .create_tenant_cluster(Clients::cluster(&a.id, "big", "H100-80GB", 2))
                .await,
        );
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(refused.message().contains("quota"), "{refused:?}");
        (a, kept)
    });
    agent.stop();
    // The store is the database's: no SQLite file was made.
    assert!(!first.join("state.db").exists());

    // Started again: everything is there, the fleet seeded once.
    let agent = Agent::start_with(&first, &flags);
    runtime.block_on(async {
        let mut admin = agent.admin().await;
        assert_eq!(admin.get_cluster(&kept.id).await.name, "train");
        let nodes = admin.nodes().await;
        assert_eq!(nodes.len(), 12, "the fleet was seeded once");
        let held: Vec<_> = nodes.iter().filter(|n| n.cluster_id == kept.id).collect();
        assert_eq!(held.len(), 1);
        let usage = admin.usage(&team.id, "H100-80GB").await;
        assert_eq!(usage.used, 8, "{usage:?}");
    });
    agent.stop();

    let check = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["check", "--postgres", "--database-file", &file])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{out}");
    assert!(out.contains("no violation"), "{out}");
}
