//! The agents' bandwidth test on loopback against plain baselines measured in the same
//! run (`cargo bench -p gpufleet-agent --bench bandwidth`), and the node side of a medium
//! health check for 1 and 64 simulated nodes at once.
//!
//! Prints two markdown tables:
//! - loopback throughput: the bandwidth test (`node::bandwidth::measure` to a real
//!   `Listener`), a plain socket copy (write 256 KiB chunks, the receiver discards), and
//!   `iperf3` when it is on PATH; each the median of a few runs of the same duration;
//! - a medium health check (every GPU check of the level on an 8-GPU simulated node) for
//!   1 node, and for 64 nodes checked at once on 64 threads.
//!
//! Numbers only: nothing here asserts a timing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_gpu::hardware::SimulatedNode;
use gpufleet_node::bandwidth::{self, Listener};
use gpufleet_node::health::{self, Level, Plan};

const RUNS: usize = 3;
const DURATION: Duration = Duration::from_secs(1);
const TOKEN: &str = "bench-token-0123456789";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The bandwidth test itself, to a real listener.
fn agent_test(l: &Listener) -> f64 {
    bandwidth::measure(
        &l.addr().to_string(),
        TOKEN,
        DURATION,
        None,
        Duration::from_secs(5),
    )
    .expect("loopback bandwidth test")
    .gbps()
}

/// A receiver that reads and discards, then answers with its count.
fn copy_server() -> std::net::SocketAddr {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in server.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                let mut n: u64 = 0;
                while let Ok(k) = s.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                }
                let _ = s.write_all(&n.to_be_bytes());
            });
        }
    });
    addr
}

/// A plain copy: the sender writes for the duration (the same accounting as the
/// bandwidth test, without its protocol).
fn socket_copy(addr: std::net::SocketAddr) -> f64 {
    let data = vec![0x5au8; 256 * 1024];
    let mut s = TcpStream::connect(addr).unwrap();
    let start = Instant::now();
    while start.elapsed() < DURATION {
        s.write_all(&data).unwrap();
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack).unwrap();
    u64::from_be_bytes(ack) as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// One iperf3 run over loopback (its own one-off server); None when it fails.
fn iperf3() -> Option<f64> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // The server is ready when a client gets through; retry on "connection refused".
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J"])
            .args(["-t", &DURATION.as_secs().to_string()])
            .output()
            .ok()?;
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = server.kill();
    let _ = server.wait();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let bps = doc["end"]["sum_received"]["bits_per_second"].as_f64()?;
    Some(bps / 1e9)
}

/// A medium check on `nodes` simulated 8-GPU nodes at once; wall time.
fn medium_check(nodes: usize) -> Duration {
    let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
    let sims: Vec<Arc<SimulatedNode>> = (0..nodes)
        .map(|i| Arc::new(SimulatedNode::new(&format!("n{i}"), model, 8, "550.54.15")))
        .collect();
    let start = Instant::now();
    let threads: Vec<_> = sims
        .into_iter()
        .map(|sim| {
            std::thread::spawn(move || {
                let plan = Plan {
                    level: Level::Medium,
                    driver: Ok("550.54.15".into()),
                    expected_driver: Some("550.54.15"),
                    expected_layout: &[],
                    simulated: true,
                };
                health::run(&*sim, "H100-80GB", &plan).len()
            })
        })
        .collect();
    let checks: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(checks > 0);
    start.elapsed()
}

fn main() {
    let listener = Listener::start("127.0.0.1:0".parse().unwrap(), bandwidth::unthrottled())
        .expect("bandwidth listener");
    listener.arm(TOKEN, Duration::from_secs(600));
    let copy_addr = copy_server();
    let has_iperf = on_path("iperf3");
    // Rounds interleave the methods, so load from elsewhere hits them alike.
    let (mut agent, mut copy, mut iperf) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        agent.push(agent_test(&listener));
        copy.push(socket_copy(copy_addr));
        if has_iperf {
            iperf.extend(iperf3());
        }
    }
    let (agent, copy) = (median(agent), median(copy));
    let iperf = (!iperf.is_empty()).then(|| median(iperf));
    println!(
        "| loopback, {}s per run, median of {RUNS} | Gbit/s | vs socket copy |",
        DURATION.as_secs()
    );
    println!("|---|---:|---:|");
    println!(
        "| gpufleet bandwidth test | {agent:.2} | {:.0}% |",
        agent / copy * 100.0
    );
    println!("| plain socket copy | {copy:.2} | 100% |");
    match iperf {
        Some(g) => println!("| iperf3 | {g:.2} | {:.0}% |", g / copy * 100.0),
        None => println!("| iperf3 | not installed (or failed) | |"),
    }
    println!();
    println!("| medium health check (simulated 8-GPU nodes) | wall time |");
    println!("|---|---:|");
    for n in [1, 64] {
        println!(
            "| {n} node(s) at once | {:.2} ms |",
            medium_check(n).as_secs_f64() * 1e3
        );
    }
}
