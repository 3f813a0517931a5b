//! Several `serve --postgres` replicas on one database (issue 41): the one that holds the
//! singletons' lease leads and serves; the others pass every call on to it, so a client
//! may call any of them, and turn node agents away, so that agents find the leader
//! through their list of addresses. Killed (SIGKILL: it releases nothing), the leader's
//! lease expires and another replica takes it over: it settles what the former leader
//! left, the agents move to it, and the fleet is served again from the same database.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gpufleet_sql::test_server::TestServer;

const JOIN: &str = "gfj_the-replicas-shared-join-token";
/// Short, so that the takeover comes quickly; the test waits on it, never sleeps for it.
const TTL: &str = "3s";

fn database_file(dir: &Path, url: &str) -> String {
    let file = dir.join("database.url");
    std::fs::write(&file, url).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file.to_str().unwrap().to_string()
}

fn replica(dir: &Path, id: &str, database_file: &str) -> Agent {
    replica_with(dir, id, database_file, &["--lease-ttl", TTL])
}

/// Replica `id` of the database in `database_file`, with the tokens every replica shares
/// and `extra` flags.
fn replica_with(dir: &Path, id: &str, database_file: &str, extra: &[&str]) -> Agent {
    let mut flags = vec![
        "--admin-token",
        ADMIN,
        "--join-token",
        JOIN,
        "--node-agents",
        "external",
        "--postgres",
        "--database-file",
        database_file,
        "--replica-id",
        id,
    ];
    flags.extend_from_slice(extra);
    Agent::start_with(&dir.join(id), &flags)
}

/// Processes killed when dropped, also when the test fails half-way.
struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A simulated node agent of 8 H100s that knows every replica's address.
fn node_agent(dir: &Path, name: &str, control_planes: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["node", "--control-plane", control_planes, "--name", name])
        .args(["--gpus", "8", "--data-dir"])
        .arg(dir.join(name))
        .env("GPUFLEET_JOIN_TOKEN", JOIN)
        .env_remove("GPUFLEET_JOIN_TOKEN_FILE")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .spawn()
        .expect("start a node agent")
}

/// Waits until both nodes are ready, as `at` answers, asking every 50 ms; a call that
/// fails (a replica between leaders answers UNAVAILABLE) is asked again.
async fn until_ready(at: &Agent, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    let mut last: String;
    loop {
        let mut admin = at.admin().await;
        match admin
            .fleet
            .list_nodes(gpufleet_proto::v1::ListNodesRequest::default())
            .await
        {
            Ok(r) => {
                let mut ready: Vec<String> = r
                    .into_inner()
                    .nodes
                    .into_iter()
                    .filter(|n| n.state == "ready")
                    .map(|n| n.hostname)
                    .collect();
                ready.sort();
                if ready == ["gpu-1", "gpu-2"] {
                    return;
                }
                last = format!("ready: {ready:?}");
            }
            Err(e) => last = format!("{e:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks `admin`'s replica to list the tenants until it answers, every 50 ms: a follower
/// that does not know yet where the leader serves answers UNAVAILABLE, not run.
async fn until_forwarding(admin: &mut Clients, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let answer = admin
            .tenants
            .list_tenants(gpufleet_proto::v1::ListTenantsRequest::default())
            .await;
        match answer {
            Ok(_) => return,
            Err(e) => assert!(
                e.code() == tonic::Code::Unavailable && Instant::now() < deadline,
                "the follower does not pass calls on: {e:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn log_of(agent: &Agent) -> String {
    std::fs::read_to_string(agent.data_dir.with_extension("log")).unwrap_or_default()
}

#[test]
fn replicas_share_one_database_and_another_takes_over_when_the_leader_dies() {
    let pg = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = pg.database("gpufleet").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = database_file(dir.path(), &url);
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // a starts first and leads; b finds a's lease and follows.
    let a = replica(dir.path(), "a", &file);
    let b = replica(dir.path(), "b", &file);
    let (a_url, b_url) = (a.endpoint.clone(), b.endpoint.clone());
    // The agents try b first: b turns them away, and they move on to a.
    let both = format!("{b_url},{a_url}");
    let agents = Killed(vec![
        node_agent(dir.path(), "gpu-1", &both),
        node_agent(dir.path(), "gpu-2", &both),
    ]);

    let (team, first) = runtime.block_on(async {
        // Every call below goes to b, which does not lead: it passes them on to a.
        let mut admin = b.admin().await;
        until_ready(&b, Duration::from_secs(60), "both nodes ready").await;
        let (team, _) = admin.tenant("team-a").await;
        admin.quota(&team.id, "H100-80GB", 16, 0).await;
        // A create sends orders to its node's agent: only the leader can, and it did.
        let first = admin
            .create_pool_cluster(&team.id, "train", "H100-80GB", 1)
            .await;
        assert_eq!(admin.get_cluster(&first.id).await.status, "running");
        // Admission is the store's, whichever replica is called: 8 of 16 GPUs held, 16
        // more asked.
        let refused = status(
            admin
                .clusters
                .create_tenant_cluster(Clients::cluster(&team.id, "big", "H100-80GB", 2))
                .await,
        );
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        (team, first)
    });
    let turned_away = std::fs::read_to_string(dir.path().join("gpu-1.log")).unwrap();
    assert!(
        turned_away.contains("replica b does not lead; replica a does"),
        "b never turned gpu-1's agent away:\n{turned_away}"
    );
    let b_log = log_of(&b);
    assert!(
        !b_log.contains("this replica leads"),
        "b led beside a:\n{b_log}"
    );

    // The leader dies without releasing anything.
    a.signal_and_wait(libc::SIGKILL, Duration::from_secs(10));
    runtime.block_on(async {
        let mut admin = b.admin().await;
        // b takes the lease over once it expires, the agents find it, and the nodes come
        // back ready under it.
        until_ready(&b, Duration::from_secs(60), "the nodes ready under b").await;
        assert_eq!(admin.get_cluster(&first.id).await.status, "running");
        // b leads now, and sends orders itself.
        admin.delete_cluster(&first.id).await;
        let second = admin
            .create_pool_cluster(&team.id, "eval", "H100-80GB", 2)
            .await;
        assert_eq!(admin.get_cluster(&second.id).await.status, "running");
        let usage = admin.usage(&team.id, "H100-80GB").await;
        assert_eq!(usage.used, 16, "{usage:?}");
        // Deleted before the agents are killed: a killed agent leaves its cluster's
        // volume mounted on this machine.
        admin.delete_cluster(&second.id).await;
    });
    let b_log = log_of(&b);
    assert!(b_log.contains("this replica leads"), "{b_log}");
    assert!(b_log.contains("took the lease over"), "{b_log}");

    drop(agents);
    b.stop();
    let check = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["check", "--postgres", "--database-file", &file])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{out}");
}

/// A replica that does not lead passes calls on, but it still counts its own callers'
/// connections: one whose token is good is proven there too, so a flood past the peer's
/// cap closes the flood's oldest connection to make room, not the pipeline's.
#[test]
fn a_followers_caller_with_a_good_token_keeps_its_connection_through_a_flood() {
    let pg = TestServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = pg.database("gpufleet").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = database_file(dir.path(), &url);
    let _leader = replica(dir.path(), "a", &file);
    let follower = replica_with(
        dir.path(),
        "b",
        &file,
        &[
            "--max-connections-per-peer",
            "3",
            "--first-request-within",
            "10m",
        ],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // The pipeline's connection, its call carried out by the leader. Until the
        // follower has read where the leader serves (the leader's lease row says it once
        // its listener is up), it answers "not run, retry": asked again, as clients do.
        let mut admin = follower.admin().await;
        until_forwarding(&mut admin, Duration::from_secs(60)).await;
        admin.tenant("team-a").await;
        // Three silent connections from the same peer: the third is past the cap of 3.
        let addr = follower.endpoint.trim_start_matches("http://").to_string();
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
        }
        // The oldest unproven one made room: the flood's first, not the pipeline's.
        let mut first = flood.remove(0);
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match tokio::io::AsyncReadExt::read(&mut first, &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "the flood's first connection was not closed: the pipeline's made room instead"
        );
        assert_eq!(admin.tenant_count().await, 1);
    });
}
