//! Stopping and restarting on the same data dir while clients hold connections: a
//! SIGTERM ends the process promptly even with idle, half-open or busy connections, and
//! a SIGKILL at any point leaves a database the next process opens (WAL recovery).

mod common;

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use gpufleet_proto::v1::*;

/// Far above a clean shutdown (the grace for open connections is a few seconds); only
/// there so a hang fails the test instead of the suite.
const HANG: Duration = Duration::from_secs(30);

fn host_port(agent: &Agent) -> String {
    agent.endpoint.trim_start_matches("http://").to_string()
}

async fn tenant_names(c: &mut Clients) -> Vec<String> {
    c.tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tenants
        .into_iter()
        .map(|t| t.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_open_connections_exits_and_a_second_process_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    c.tenant("team-a").await;
    // An idle HTTP/2 connection (the client is kept), a TCP connection that never sends
    // the HTTP/2 preface, and one that sent half of it.
    let silent = TcpStream::connect(host_port(&agent)).unwrap();
    let mut partial = TcpStream::connect(host_port(&agent)).unwrap();
    partial.write_all(b"PRI * HTTP/2.0\r\n").unwrap();

    let status = agent.signal_and_wait(libc::SIGTERM, HANG);
    assert!(status.success(), "{status:?}");

    let second = Agent::start(&data);
    let mut c2 = second.admin().await;
    assert_eq!(tenant_names(&mut c2).await, vec!["team-a"]);
    c2.tenant("team-b").await;
    // The first process's client sees its server gone, not a hang.
    assert!(c
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .is_err());
    drop((silent, partial));
    let status = second.signal_and_wait(libc::SIGTERM, HANG);
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_then_restart_recovers_every_committed_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 16, 0).await;
    let k = c.create_pool_cluster(&t.id, "k", "H100-80GB", 1).await;
    let before = c.snapshot().await;
    // Committed but still in the WAL: nothing checkpointed it into the main file.
    assert!(data.join("state.db-wal").exists());

    let status = agent.signal_and_wait(libc::SIGKILL, HANG);
    assert!(!status.success());

    let second = Agent::start(&data);
    let mut c2 = second.admin().await;
    c2.assert_unchanged(&before, "every committed write is recovered")
        .await;
    let got = c2.get_cluster(&k.id).await;
    assert_eq!(got.nodes.len(), 1);
    // And it keeps working: a write after recovery, then a clean stop.
    c2.tenant("team-b").await;
    drop((c, c2));
    let status = second.signal_and_wait(libc::SIGTERM, HANG);
    assert!(status.success(), "{status:?}");

    let db = rusqlite::Connection::open(data.join("state.db")).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_the_listening_line_is_a_clean_shutdown() {
    // The handlers are installed before the line is printed; otherwise SIGTERM's default
    // action would kill the process mid-start.
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start(&dir.path().join("data"));
        let status = agent.signal_and_wait(libc::SIGTERM, HANG);
        assert!(status.success(), "round {round}: {status:?}");
    }
}

/// A gRPC client on its own runtime, which stops running after one call: like a caller
/// that blocks its thread (a synchronous restart inside an async test) or a hung client.
/// Its connection stays open and never answers the server's shutdown PING.
fn frozen_client(endpoint: String) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let channel = tonic::transport::Channel::from_shared(endpoint)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = tenant_service_client::TenantServiceClient::new(channel);
            // Unauthenticated, but the HTTP/2 connection is up and has served a call.
            let _ = client.list_tenants(ListTenantsRequest::default()).await;
            client
        });
        ready_tx.send(()).unwrap();
        let _ = release_rx.recv();
        drop(client);
    });
    ready_rx.recv().unwrap();
    (release_tx, thread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_refuses_new_clients_while_open_connections_drain() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&dir.path().join("data"));
    let addr = host_port(&agent);
    let (release, client_thread) = frozen_client(agent.endpoint.clone());
    unsafe { libc::kill(agent.pid() as i32, libc::SIGTERM) };
    let refused_while_draining = loop {
        match TcpStream::connect(&addr) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => break agent.running(),
            Err(e) => panic!("unexpected connect error {e}"),
            Ok(_) if !agent.running() => break false,
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    assert!(
        refused_while_draining,
        "the port must refuse new clients while the frozen client's connection drains"
    );
    // The frozen client cannot hold the shutdown past its grace period.
    assert!(agent.signal_and_wait(libc::SIGTERM, HANG).success());
    release.send(()).unwrap();
    client_thread.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_a_data_dir_in_use_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let out_path = dir.path().join("second.out");
    let err_path = dir.path().join("second.err");
    let mut second = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN,
            "--data-dir",
        ])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run a second gpufleet-agent");
    // It must exit on its own; one that serves instead is killed so the test fails.
    let deadline = std::time::Instant::now() + HANG;
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second gpufleet-agent on the same data dir kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    assert!(stdout.is_empty(), "it must not announce a port: {stdout}");
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        stderr.contains(&format!(
            "is in use by another gpufleet-agent (pid {}); stop it first",
            agent.pid()
        )),
        "{stderr}"
    );
    // The first one is unaffected and, once stopped, frees the data dir.
    let mut c = agent.admin().await;
    c.tenant("team-a").await;
    drop(c);
    assert!(agent.signal_and_wait(libc::SIGTERM, HANG).success());
    let again = Agent::start(&data);
    let mut c = again.admin().await;
    assert_eq!(tenant_names(&mut c).await, vec!["team-a"]);
}

/// A service manager's restart: the next process starts while the old one is still
/// stopping, waits for the data dir instead of failing on the lock, and serves what the
/// old one acknowledged. An agent's session keeps the old one in its 3s grace period after
/// it has said it is stopping, so the new one meets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_right_after_a_stop_waits_for_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = Agent::start(&data);
    let mut c = agent.admin().await;
    c.tenant("team-a").await;
    drop(c);
    // A node agent's session is a request in flight: the old process waits out its grace
    // period for it after the stop.
    let session = common::rogue::Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        common::rogue::registration("held-01", "H100-80GB", 1),
    )
    .await
    .unwrap();
    let old = agent.pid() as i32;
    unsafe { libc::kill(old, libc::SIGTERM) };
    let lock = data.join("agent.lock");
    let marked = || {
        std::fs::read_to_string(&lock)
            .unwrap_or_default()
            .ends_with("stopping")
    };
    let log = data.with_extension("log");
    let deadline = std::time::Instant::now() + HANG;
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait("the old process never said it was stopping", &marked);
    let second = Agent::start(&data);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("waiting for the process that is stopping to release the data dir"),
        "{said}"
    );
    let mut c2 = second.admin().await;
    assert_eq!(tenant_names(&mut c2).await, vec!["team-a"]);
    // The node the join token registered (as `sim`) is in the store, but it is not the
    // fleet file's: the new process runs no embedded agent for it, nor waited for one.
    let held = node(&mut c2, "held-01").await.expect("held-01 is recorded");
    assert_ne!(held.state, "ready", "{held:?}");
    drop((agent, c2, session));
    let status = second.signal_and_wait(libc::SIGTERM, HANG);
    assert!(status.success(), "{status:?}");
}

/// A port in use (another process took it while this one was down): serve fails at once
/// saying so, with its embedded node agents stopped, instead of hanging on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_fails_the_start_at_once_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let err_path = dir.path().join("serve.err");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-token",
            ADMIN,
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + HANG;
    let status = loop {
        if let Some(status) = serve.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = serve.kill();
            let _ = serve.wait();
            panic!(
                "serve kept running on a port in use:\n{}",
                std::fs::read_to_string(&err_path).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}"))
            && !stderr.contains("did not stop within"),
        "{stderr}"
    );
}

/// The highest epoch of the singletons' lease each embedded node agent kept (its
/// `<data-dir>/agents/<node>/epoch`), by node; nodes that have seen no order yet are absent.
fn agents_epochs(data: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let Ok(dirs) = std::fs::read_dir(data.join("agents")) else {
        return Default::default();
    };
    dirs.filter_map(|d| {
        let d = d.ok()?;
        let text = std::fs::read_to_string(d.path().join("epoch")).ok()?;
        Some((
            d.file_name().to_string_lossy().into(),
            text.trim().parse().ok()?,
        ))
    })
    .collect()
}

/// Polls (bounded) until every one of `nodes` embedded agents has kept an epoch above
/// `above`; returns them.
fn agents_past(
    data: &std::path::Path,
    nodes: usize,
    above: u64,
) -> std::collections::BTreeMap<String, u64> {
    let deadline = std::time::Instant::now() + HANG;
    loop {
        let epochs = agents_epochs(data);
        if epochs.len() == nodes && epochs.values().all(|e| *e > above) {
            return epochs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agents' epochs stayed at {epochs:?}, not all {nodes} above {above}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The singletons' lease (issue 41): each start takes it over with a higher epoch before
/// anything else runs, its work orders carry it (the admission check every registering
/// node gets), and every node agent keeps the newest it saw on disk, so a former leader's
/// older orders would be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_start_leads_with_a_higher_epoch_that_the_node_agents_keep() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = Agent::start(&data);
    let nodes = first.admin().await.nodes().await.len();
    assert!(nodes > 0);
    let epochs = agents_past(&data, nodes, 0);
    let one: std::collections::BTreeSet<u64> = epochs.values().copied().collect();
    assert_eq!(one.len(), 1, "one start, one epoch: {epochs:?}");
    let e1 = *one.first().unwrap();
    assert!(first.signal_and_wait(libc::SIGTERM, HANG).success());

    let second = Agent::start(&data);
    let epochs = agents_past(&data, nodes, e1);
    let two: std::collections::BTreeSet<u64> = epochs.values().copied().collect();
    assert_eq!(two.len(), 1, "{epochs:?}");
    assert!(second.signal_and_wait(libc::SIGTERM, HANG).success());
}
