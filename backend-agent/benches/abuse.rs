//! A tenant's API latency under abuse, against the same without, in one run
//! (`cargo bench -p gpufleet-agent --bench abuse`): the real `serve` process, a tenant
//! client doing reads (GetTenant) and writes (create and delete a reservation), measured
//! - alone (the baseline);
//! - while an attacker holds the global connection cap with idle connections from
//!   loopback, the tenant coming from this host's own non-loopback address (another
//!   peer), as a remote client would;
//! - while an agent holding the join token floods heartbeats, reconnecting each time its
//!   session is cut.
//!
//! Prints a markdown table of p50 and p99 per scenario and kind. Numbers only: nothing
//! here asserts a timing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rogue::{registration, Rogue};
use common::*;
use gpufleet_proto::v1::*;

/// Calls of each kind per scenario.
const CALLS: usize = 400;
/// The global connection cap, and how many of it the attacker holds.
const CAP: usize = 1000;

/// This host's first IPv4 address that is not loopback (`ip -4 -o addr`), if any.
fn own_address() -> Option<Ipv4Addr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next()?.parse().ok())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// p50 and p99 (ms) of the tenant's reads and writes.
async fn measure(tenant: &mut Clients, tenant_id: &str, round: &str) -> [(f64, f64); 2] {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    let start = now() + 30 * 24 * HOUR;
    for i in 0..CALLS {
        let t = Instant::now();
        tenant
            .tenants
            .get_tenant(GetTenantRequest::default())
            .await
            .expect("read");
        reads.push(t.elapsed().as_secs_f64() * 1e3);
        let mut req = Clients::reservation(tenant_id, "A100-40GB", 1, start, start + HOUR);
        req.request_id = format!("{round}-{i}");
        let t = Instant::now();
        let r = tenant
            .reservations
            .create_reservation(req)
            .await
            .expect("create")
            .into_inner();
        tenant.delete_reservation(&r.id).await;
        writes.push(t.elapsed().as_secs_f64() * 1e3 / 2.0);
    }
    [reads, writes].map(|mut v| {
        v.sort_by(f64::total_cmp);
        (percentile(&v, 0.5), percentile(&v, 0.99))
    })
}

/// Floods heartbeats until `stop`, registering again after each cut; counts the cuts.
async fn flood_heartbeats(
    endpoint: String,
    data_dir: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
) {
    let mut secret = String::new();
    while !stop.load(Ordering::Relaxed) {
        let mut reg = registration("flood-01", "H100-80GB", 1);
        reg.node_secret = secret.clone();
        let Ok(mut rogue) = Rogue::register(&endpoint, &data_dir, reg).await else {
            // The previous session is still held: try again.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if !rogue.secret.is_empty() {
            secret = rogue.secret.clone();
        }
        rogue.silence();
        for seq in 1_000_000..1_100_000u64 {
            if !rogue.send(agent_message::Msg::Heartbeat(Heartbeat {
                seq,
                orders_queued: 0,
                gpus: Vec::new(),
                ..Default::default()
            })) {
                break;
            }
        }
        rogue.ended(Duration::from_secs(30)).await;
        cuts.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let own = own_address();
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(&fleet, "[[pool]]\ngpu_type = \"A100-40GB\"\nnodes = 1\n").unwrap();
    let listen = if own.is_some() {
        "0.0.0.0:0"
    } else {
        "127.0.0.1:0"
    };
    let cap = CAP.to_string();
    let agent = Agent::start_limited(
        &dir.path().join("data"),
        &[
            "--listen",
            listen,
            "--insecure",
            "--admin-token",
            ADMIN,
            "--fleet",
            fleet.to_str().unwrap(),
            "--max-connections",
            &cap,
            "--max-connections-per-peer",
            &cap,
            "--first-request-within",
            "10m",
            "--health-interval",
            "0",
        ],
        None,
    );
    let port = agent.endpoint.rsplit(':').next().unwrap().to_string();
    let mut admin = agent.admin().await;
    let (team, token) = admin.tenant("bench").await;
    admin.quota(&team.id, "A100-40GB", 8, 0).await;
    // The tenant connects from this host's own address where there is one: another peer
    // than the loopback flood.
    let tenant_endpoint = match own {
        Some(ip) => format!("http://{ip}:{port}"),
        None => agent.endpoint.clone(),
    };
    let mut tenant = clients_at(&tenant_endpoint, &token).await;

    let mut rows = Vec::new();
    rows.push((
        "alone (baseline)",
        measure(&mut tenant, &team.id, "a").await,
    ));

    let held = if own.is_some() {
        let addr = format!("127.0.0.1:{port}");
        let mut held = Vec::new();
        while held.len() < CAP - 2 {
            match tokio::net::TcpStream::connect(&addr).await {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        rows.push((
            "attacker holds the connection cap (loopback)",
            measure(&mut tenant, &team.id, "b").await,
        ));
        held.len()
    } else {
        0
    };

    let stop = Arc::new(AtomicBool::new(false));
    let cuts = Arc::new(AtomicU64::new(0));
    let flooder = {
        let (endpoint, data_dir) = (agent.endpoint.clone(), agent.data_dir.clone());
        tokio::spawn(flood_heartbeats(
            endpoint,
            data_dir,
            stop.clone(),
            cuts.clone(),
        ))
    };
    rows.push((
        "an agent floods heartbeats",
        measure(&mut tenant, &team.id, "c").await,
    ));
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(30), flooder).await;
    rows.push(("alone again", measure(&mut tenant, &team.id, "d").await));

    println!("\n| scenario | read p50 | read p99 | write p50 | write p99 |");
    println!("|---|---:|---:|---:|---:|");
    for (name, [(r50, r99), (w50, w99)]) in &rows {
        println!("| {name} | {r50:.2} ms | {r99:.2} ms | {w50:.2} ms | {w99:.2} ms |");
    }
    println!(
        "\n{CALLS} reads and {CALLS} reservation creates and deletes per scenario; {} build; the attacker held {held} of {CAP} connections{}; the flooding agent's session was cut {} times.",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        if own.is_none() {
            " (skipped: this host has no non-loopback address for the tenant to come from)"
        } else {
            ""
        },
        cuts.load(Ordering::Relaxed)
    );
}
