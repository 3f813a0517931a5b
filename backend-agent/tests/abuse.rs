//! The control plane under abuse from outside, as an attacker with a shell on its host or
//! the join token would try it:
//! - a connection flood past the process's own file limit never ends the API's listener:
//!   once the flood is gone a normal call succeeds, and the process never stopped;
//! - connections past the per-peer cap make room by closing the peer's oldest on which no
//!   caller proved who it is, those that ask nothing are closed at the first-request
//!   deadline, idle ones at the idle timeout, and a node agent's session (always in
//!   flight) is never closed for idling;
//! - one local process holding more connections than the per-peer cap, each refused once,
//!   shuts out neither the CLI nor the API;
//! - a join-token client's failing nodes are candidates: quarantined, never ready, counted
//!   by no breaker, bounded in number, and forgotten after `--candidate-ttl`;
//! - one join-token holder filling the candidate slots from its address keeps no more than
//!   `--max-candidates-per-source`: a host at another address still joins, and live fake
//!   nodes past `--candidate-ttl` are evicted, their sessions ended;
//! - a heartbeat flood is cut and reconnecting to flood again is paced per name,
//!   heartbeats out of sequence or out of bounds end the session naming the field, and
//!   registrations out of bounds are refused naming the field;
//! - a node whose agent vanishes in the middle of a layout change is `unreachable`.

mod common;

use std::time::{Duration, Instant};

use common::rogue::{registration, Rogue};
use common::*;
use gpufleet_proto::v1::*;
use tokio::io::AsyncReadExt;
use tonic::Code;

/// The longest any wait on a condition here may take before the test fails.
const BOUND: Duration = Duration::from_secs(60);

fn series(agent: &Agent, line_start: &str) -> f64 {
    let text = scrape(agent, &metrics_addr(agent));
    metric_value(&text, line_start).unwrap_or_else(|| panic!("no {line_start} in:\n{text}"))
}

/// Waits until the series reaches `at_least`.
fn wait_series(agent: &Agent, line_start: &str, at_least: f64) -> f64 {
    let deadline = Instant::now() + BOUND;
    loop {
        let v = series(agent, line_start);
        if v >= at_least {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{line_start} stayed at {v}, below {at_least}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tcp_addr(agent: &Agent) -> String {
    agent.endpoint.trim_start_matches("http://").to_string()
}

/// A normal admin call on a fresh connection; the time it took to first succeed, trying
/// again (each try bounded) until [`BOUND`].
async fn first_success(agent: &Agent) -> Duration {
    let started = Instant::now();
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(3), async {
            let channel = tonic::transport::Channel::from_shared(agent.endpoint.clone())
                .unwrap()
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            let mut tenants = tenant_service_client::TenantServiceClient::with_interceptor(
                channel,
                Bearer::new(ADMIN).unwrap(),
            );
            tenants
                .list_tenants(ListTenantsRequest::default())
                .await
                .map_err(|s| s.to_string())
        })
        .await;
        if let Ok(Ok(_)) = attempt {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < BOUND,
            "the API did not answer within {BOUND:?} after the flood: {attempt:?}"
        );
    }
}

/// Opens up to `most` connections to `addr` (each connect bounded), stopping at the
/// first that fails; they stay open until dropped.
async fn flood(addr: &str, most: usize) -> Vec<tokio::net::TcpStream> {
    let mut open = Vec::with_capacity(most);
    while open.len() < most {
        match tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await
        {
            Ok(Ok(s)) => open.push(s),
            _ => break,
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_past_the_file_limit_never_takes_the_listener_down() {
    const OPEN_FILES: u64 = 256;
    const FLOOD: usize = 1500;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Caps above what the file limit allows, and no first-request deadline within the
    // test: the kernel's limit, not the caps, is what the flood meets.
    let mut agent = Agent::start_limited(
        &data,
        &[
            "--admin-token",
            ADMIN,
            "--max-connections",
            "4000",
            "--max-connections-per-peer",
            "4000",
            "--first-request-within",
            "10m",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        Some(OPEN_FILES),
    );
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    assert!(
        log.contains("open_files=256") && log.contains("API connection limits"),
        "serve says what it runs with:\n{log}"
    );
    assert!(
        log.contains("is above what the open-file limit leaves"),
        "{log}"
    );

    let held = flood(&tcp_addr(&agent), FLOOD).await;
    assert!(
        held.len() as u64 > OPEN_FILES,
        "the flood held {} connections, not more than the server's {OPEN_FILES} descriptors",
        held.len()
    );
    drop(held);

    let took = first_success(&agent).await;
    eprintln!("the API answered {took:?} after a flood of {FLOOD} connections ended");
    assert!(agent.running(), "serve must not exit");
    let exhausted = series(
        &agent,
        "gpufleet_api_accept_errors_total{kind=\"exhausted\"}",
    );
    assert!(
        exhausted >= 1.0,
        "the flood ran the process out of descriptors"
    );
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    assert!(
        log.contains("cannot accept a connection; the listener goes on"),
        "{log}"
    );
    assert!(!log.contains("stopped accepting connections"), "{log}");
}

/// Reads until the server closes the connection; true when it did within [`BOUND`].
async fn closed_by_server(mut s: tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_peer_cap_silent_or_idle_are_closed_but_an_agents_session_is_not() {
    const CAP: usize = 32;
    const FLOOD: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let agent = start_for_rogues(
        dir.path(),
        &[
            "--max-connections-per-peer",
            "32",
            "--first-request-within",
            "1s",
            "--idle-connection-timeout",
            "1s",
        ],
    );
    let held = flood(&tcp_addr(&agent), FLOOD).await;
    assert_eq!(held.len(), FLOOD);
    let closed = futures_closed(held).await;
    assert_eq!(
        closed, FLOOD,
        "every flood connection is closed by the server"
    );
    let evicted = series(
        &agent,
        "gpufleet_api_connections_closed_total{reason=\"evicted\"}",
    );
    let silent = series(
        &agent,
        "gpufleet_api_connections_closed_total{reason=\"no_request\"}",
    );
    assert!(evicted >= 1.0, "past the cap of {CAP}: {evicted}");
    assert_eq!(
        evicted + silent,
        FLOOD as f64,
        "each made room at the cap or was closed for asking nothing"
    );

    // The API serves once the flood is gone, and an agent's session outlives the idle
    // timeout (a session is always in flight).
    first_success(&agent).await;
    let mut admin = agent.admin().await;
    let mut rogue = ready_rogue(&agent, &mut admin, "steady-01", 1).await;
    // The admin's own connection, kept and unused, idles past the timeout and is closed...
    wait_series(
        &agent,
        "gpufleet_api_connections_closed_total{reason=\"idle\"}",
        1.0,
    );
    // ...while the session, three idle timeouts on, is open and its node ready.
    let open = tokio::time::timeout(Duration::from_secs(3), rogue.ended(BOUND)).await;
    assert!(open.is_err(), "the agent's session was ended: {open:?}");
    let mut again = agent.admin().await;
    assert_eq!(node(&mut again, "steady-01").await.unwrap().state, "ready");
    drop(admin);
}

/// A connection of its own that made one call with a token that is none: refused, and
/// held open by the returned channel.
async fn refused_connection(endpoint: &str) -> tonic::transport::Channel {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let refused = tenant_service_client::TenantServiceClient::with_interceptor(
        channel.clone(),
        Bearer::new("gft_not-a-token").unwrap(),
    )
    .list_tenants(ListTenantsRequest::default())
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    channel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_process_holding_refused_connections_past_the_cap_shuts_out_neither_the_cli_nor_the_api(
) {
    // The probe's shape (300 loopback connections against the default cap of 256 per
    // peer, all of loopback being one, each refused once and held), scaled down so that
    // this process keeps descriptors for the flood test beside it.
    const CAP: usize = 32;
    const HELD: usize = 48;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &[
            "--admin-token",
            ADMIN,
            "--metrics-listen",
            "127.0.0.1:0",
            "--max-connections-per-peer",
            "32",
        ],
    );
    let mut admin = agent.admin().await;
    admin
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap();
    let mut held = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        held.push(refused_connection(&agent.endpoint).await);
    }

    // The CLI, a fresh client and the admin's connection from before are all served.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .arg("fleet")
        .env("GPUFLEET_ENDPOINT", &agent.endpoint)
        .env("GPUFLEET_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpufleet-agent fleet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    first_success(&agent).await;
    admin
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .unwrap();
    let refused = metric_value(
        &scrape(&agent, &metrics_addr(&agent)),
        "gpufleet_api_connections_refused_total{reason=\"max_connections_per_peer\"}",
    );
    let evicted = series(
        &agent,
        "gpufleet_api_connections_closed_total{reason=\"evicted\"}",
    );
    assert_eq!(
        refused.unwrap_or(0.0),
        0.0,
        "no connection was refused at the cap"
    );
    assert!(
        evicted >= (HELD + 1 - CAP) as f64,
        "the oldest refused connections made room: {evicted}"
    );
    drop(held);
}

/// How many of `streams` the server closes within [`BOUND`].
async fn futures_closed(streams: Vec<tokio::net::TcpStream>) -> usize {
    let mut set = tokio::task::JoinSet::new();
    for s in streams {
        set.spawn(closed_by_server(s));
    }
    let mut closed = 0;
    while let Some(done) = set.join_next().await {
        closed += usize::from(done.unwrap());
    }
    closed
}

async fn breaker(admin: &mut Clients, gpu_type: &str) -> QuarantineBreaker {
    admin
        .fleet
        .list_quarantine_breakers(ListQuarantineBreakersRequest {})
        .await
        .unwrap()
        .into_inner()
        .breakers
        .into_iter()
        .find(|b| b.gpu_type == gpu_type)
        .unwrap_or_else(|| panic!("no breaker for {gpu_type}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_client_cannot_open_the_breaker_nor_be_handed_out_and_its_names_expire() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    let t0 = now();
    std::fs::write(&clock, t0.to_string()).unwrap();
    let fleet = dir.path().join("fleet.toml");
    // Five real H100 nodes and the default breaker (2 per 10 minutes).
    std::fs::write(&fleet, "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 5\n").unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &[
            "--admin-token",
            ADMIN,
            "--fleet",
            fleet.to_str().unwrap(),
            "--clock-file",
            clock.to_str().unwrap(),
            "--node-timeout",
            "2s",
            "--health-interval",
            "0",
            "--max-candidates",
            "3",
            "--candidate-ttl",
            "60s",
        ],
    );
    let mut admin = agent.admin().await;
    // Three names, each answering its admission check with failing ECC.
    let mut fakes = Vec::new();
    for i in 1..=3 {
        let name = format!("fake-{i:02}");
        let mut rogue = Rogue::register(
            &agent.endpoint,
            &agent.data_dir,
            registration(&name, "H100-80GB", 8),
        )
        .await
        .unwrap();
        let check = rogue.next_order().await;
        rogue.fail_check(&check, "ecc_uncorrected_volatile");
        let n = wait_state(&mut admin, &name, "quarantined", &["ready"]).await;
        assert!(
            n.state_reason.contains("a candidate (never in service)")
                || n.state_reason.contains("ecc_uncorrected_volatile"),
            "{}",
            n.state_reason
        );
        fakes.push(rogue);
    }
    let b = breaker(&mut admin, "H100-80GB").await;
    assert!(!b.open, "the candidates opened the breaker: {b:?}");
    assert_eq!(b.quarantines_in_window, 0, "{b:?}");

    // The candidates are bounded: a fourth new name is refused, naming the flag.
    let refused = Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        registration("fake-04", "H100-80GB", 8),
    )
    .await
    .err()
    .expect("a fourth candidate is refused");
    assert_eq!(
        refused.code(),
        Code::ResourceExhausted,
        "{}",
        refused.message()
    );
    assert!(
        refused
            .message()
            .starts_with("name: 3 nodes are waiting to be admitted")
            && refused.message().contains("--max-candidates"),
        "{}",
        refused.message()
    );

    // A team's cluster of every H100 node gets the five real ones, none of the fakes.
    let (team, token) = admin.tenant("vision").await;
    admin.quota(&team.id, "H100-80GB", 40, 0).await;
    let mut tenant = agent.clients(&token).await;
    let cluster = tenant
        .clusters
        .create_tenant_cluster(Clients::cluster(&team.id, "all", "H100-80GB", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cluster.nodes.len(), 5);
    for n in &cluster.nodes {
        assert!(n.hostname.starts_with("h100-80gb-pool-"), "{n:?}");
    }

    // Gone and past --candidate-ttl, the fake names leave no record; a new name joins.
    drop(fakes);
    for i in 1..=3 {
        wait_state(&mut admin, &format!("fake-{i:02}"), "quarantined", &[]).await;
    }
    std::fs::write(&clock, (t0 + 120).to_string()).unwrap();
    let deadline = Instant::now() + BOUND;
    while admin
        .nodes()
        .await
        .iter()
        .any(|n| n.hostname.starts_with("fake-"))
    {
        assert!(
            Instant::now() < deadline,
            "the fake names were never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        registration("fake-04", "H100-80GB", 8),
    )
    .await
    .expect("room for a candidate again");
}

/// An IPv4 address of this host other than loopback: where a second source connects
/// from. A host without one cannot run the test, and it says so.
fn other_address() -> std::net::Ipv4Addr {
    let mut found = None;
    // SAFETY: getifaddrs fills a list freed below; each entry's address is read only
    // when it is an AF_INET sockaddr.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        assert_eq!(libc::getifaddrs(&mut list), 0, "getifaddrs");
        let mut at = list;
        while !at.is_null() {
            let a = (*at).ifa_addr;
            if !a.is_null() && i32::from((*a).sa_family) == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && found.is_none() {
                    found = Some(ip);
                }
            }
            at = (*at).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    found.expect("this test needs an IPv4 address besides loopback to connect from")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_join_token_holder_keeps_only_its_share_of_candidates_and_idle_ones_are_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    let t0 = now();
    std::fs::write(&clock, t0.to_string()).unwrap();
    let agent = Agent::start_with(
        &dir.path().join("data"),
        &[
            "--admin-token",
            ADMIN,
            "--listen",
            "0.0.0.0:0",
            "--insecure",
            "--clock-file",
            clock.to_str().unwrap(),
            "--node-timeout",
            "2s",
            "--health-interval",
            "0",
            "--max-candidates",
            "4",
            "--max-candidates-per-source",
            "2",
            "--candidate-ttl",
            "60s",
        ],
    );
    let port = agent.endpoint.rsplit(':').next().unwrap().to_string();
    let loopback = format!("http://127.0.0.1:{port}");
    let elsewhere = format!("http://{}:{port}", other_address());
    let data_dir = agent.data_dir.clone();
    let join = |endpoint: &String, name: &str| {
        let (endpoint, data_dir) = (endpoint.clone(), data_dir.clone());
        let reg = registration(name, "H100-80GB", 8);
        async move { Rogue::register(&endpoint, &data_dir, reg).await }
    };
    // One holder of the join token fills what one source may hold, with live fake nodes.
    let mut fakes = vec![
        join(&loopback, "fake-1").await.unwrap(),
        join(&loopback, "fake-2").await.unwrap(),
    ];
    let refused = join(&loopback, "fake-3")
        .await
        .err()
        .expect("a third from one source");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("name: 2 nodes registered from 127.0.0.1 are waiting")
            && refused.message().contains("--max-candidates-per-source 2"),
        "{}",
        refused.message()
    );
    // A host at another address still joins.
    let real = join(&elsewhere, "real-1")
        .await
        .expect("a join from another source");

    // Past --candidate-ttl the live fakes (and the host that never passed) are evicted:
    // their sessions end, their names are forgotten, and their slots are free again. (The
    // TTL counts from a candidate's last change: the checks of each have begun first.)
    let mut admin = agent.admin().await;
    let deadline = Instant::now() + BOUND;
    while !admin.nodes().await.iter().all(|n| {
        !(n.hostname.starts_with("fake-") || n.hostname == "real-1")
            || n.state_reason.starts_with("acceptance checks")
    }) {
        assert!(Instant::now() < deadline, "the checks never began");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(&clock, (t0 + 120).to_string()).unwrap();
    for fake in &mut fakes {
        let ended = fake.ended(BOUND).await;
        assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
        assert!(ended.message().contains("--candidate-ttl"), "{ended:?}");
    }
    let deadline = Instant::now() + BOUND;
    loop {
        let left: Vec<Node> = admin
            .nodes()
            .await
            .into_iter()
            .filter(|n| n.hostname.starts_with("fake-") || n.hostname == "real-1")
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle candidates were never forgotten: {left:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((fakes, real));
    join(&loopback, "fake-3")
        .await
        .expect("room for the source again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_flood_is_cut_and_heartbeats_out_of_sequence_or_bounds_end_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_for_rogues(dir.path(), &[]);
    let mut admin = agent.admin().await;

    let beat = |seq: u64, orders_queued: u32| {
        agent_message::Msg::Heartbeat(Heartbeat {
            seq,
            orders_queued,
            gpus: Vec::new(),
            ..Default::default()
        })
    };

    // 200,000 heartbeats as fast as the stream takes them: cut.
    let mut flooder = ready_rogue(&agent, &mut admin, "flood-01", 1).await;
    flooder.silence();
    let mut sent = 0u64;
    for seq in 1_000_000..1_200_000u64 {
        if !flooder.send(beat(seq, 0)) {
            break;
        }
        sent += 1;
    }
    let ended = flooder.ended(BOUND).await;
    assert_eq!(ended.code(), Code::ResourceExhausted, "{}", ended.message());
    assert!(
        ended.message().contains("messages a second"),
        "{}",
        ended.message()
    );
    eprintln!("the flooding session was cut after {sent} heartbeats were queued");
    // Reconnecting to flood again is paced: the name registers in a burst, then is held
    // back, naming it.
    let secret = flooder.secret.clone();
    drop(flooder);
    let mut registrations = 1;
    let deadline = Instant::now() + BOUND;
    let held_back = loop {
        let mut reg = registration("flood-01", "H100-80GB", 1);
        reg.node_secret = secret.clone();
        match Rogue::register(&agent.endpoint, &agent.data_dir, reg).await {
            Ok(again) => {
                registrations += 1;
                drop(again);
            }
            // The session just dropped may still look live for a moment.
            Err(s) if s.code() == Code::AlreadyExists => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(s) => break s,
        }
        assert!(Instant::now() < deadline, "never held back");
    };
    assert_eq!(
        held_back.code(),
        Code::ResourceExhausted,
        "{}",
        held_back.message()
    );
    assert!(
        held_back
            .message()
            .starts_with("name: node flood-01 registered 5 times in a row; retry in"),
        "{}",
        held_back.message()
    );
    assert_eq!(registrations, 5);
    assert!(series(&agent, "gpufleet_agent_sessions_cut_total{reason=\"rate\"}") >= 1.0);
    assert!(
        series(
            &agent,
            "gpufleet_agent_messages_dropped_total{reason=\"rate\"}"
        ) >= 250.0
    );

    // A sequence number that goes back, and a queue out of bounds, end the session
    // naming the field.
    for (name, beats, field) in [
        (
            "backwards-01",
            vec![beat(1_000_000, 0), beat(5, 0)],
            "heartbeat.seq: must increase within a session (got 5 after 1000000)",
        ),
        (
            "queued-01",
            vec![beat(1_000_000, u32::MAX)],
            "heartbeat.orders_queued: at most 1024 (got 4294967295)",
        ),
    ] {
        let mut rogue = ready_rogue(&agent, &mut admin, name, 1).await;
        rogue.silence();
        for b in beats {
            rogue.send(b);
        }
        let ended = rogue.ended(BOUND).await;
        assert_eq!(ended.code(), Code::InvalidArgument, "{}", ended.message());
        assert_eq!(ended.message(), field);
    }
    assert!(
        series(
            &agent,
            "gpufleet_agent_sessions_cut_total{reason=\"protocol\"}"
        ) >= 2.0
    );

    // Registration fields out of bounds are refused naming them.
    let mut quantum = registration("quantum-01", "H100-80GB", 1);
    quantum.hardware = "quantum".into();
    let mut long_addr = registration("long-01", "H100-80GB", 1);
    long_addr.bandwidth_addr = "a".repeat(5000);
    for (reg, field) in [(quantum, "hardware: "), (long_addr, "bandwidth_addr: ")] {
        let s = Rogue::register(&agent.endpoint, &agent.data_dir, reg)
            .await
            .err()
            .expect("refused");
        assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
        assert!(s.message().starts_with(field), "{}", s.message());
        assert!(s.message().len() < 300, "{}", s.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_agent_vanishes_mid_layout_change_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_for_rogues(dir.path(), &["--order-deadline", "mig_layout=5m"]);
    let mut admin = agent.admin().await;
    let mut rogue = ready_rogue(&agent, &mut admin, "vanish-01", 2).await;
    let (team, _) = admin.tenant("vision").await;
    admin.quota(&team.id, "H100-80GB", 2, 0).await;
    let mut req = Clients::cluster(&team.id, "cv", "H100-80GB", 1);
    req.mig_layout = mig_layout(&[("3g.40gb", 2)]);
    let mut clusters = admin.clusters.clone();
    let create = tokio::spawn(async move { clusters.create_tenant_cluster(req).await });
    let order = rogue.next_order().await;
    assert!(
        matches!(order.kind, Some(work_order::Kind::ApplyMigLayout(_))),
        "{order:?}"
    );
    // The agent vanishes with the order unanswered.
    rogue.leave();
    let failed = create.await.unwrap().expect_err("the create fails");
    eprintln!("the create failed: {}", failed.message());
    // Whatever the failed change wrote, the node is unreachable, and stays so.
    wait_state(&mut admin, "vanish-01", "unreachable", &[]).await;
    let n = node(&mut admin, "vanish-01").await.unwrap();
    assert_eq!(n.state, "unreachable", "{}", n.state_reason);
}
