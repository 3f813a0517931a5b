//! Health checks, measured in-process through the library (`cargo bench -p
//! gpufleet-agent --bench health_checks`): a control plane (store, registry,
//! NodeAgentService) with embedded agents, each a full node agent speaking gRPC to a
//! loopback listener, with simulated GPUs and its own bandwidth listener.
//!
//! Prints one markdown table: the time a medium check takes, ordered through the registry
//! and answered by every agent, for 1 node and for 64 nodes at once; and the same with a
//! ring bandwidth test among the nodes (each sends to the next for 200 ms), with the
//! slowest pair and its bus-bandwidth equivalent.
//!
//! Numbers only: nothing here asserts a timing.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufleet_agent::embedded;
use gpufleet_control::error::Error;
use gpufleet_control::scheduling::health::{self, Request};
use gpufleet_control::serve::ControlPlane as Control;
use gpufleet_control::state::AppState;
use gpufleet_control::store::{self, nodes::NodeRow};
use tokio::sync::watch;

const MODEL: &str = "H100-80GB";
const ROUNDS: usize = 5;
const BANDWIDTH: Duration = Duration::from_millis(200);

struct ControlPlane {
    state: Arc<AppState>,
    _control: Control,
    _stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

/// `nodes` simulated 8-GPU nodes with embedded agents, registered and ready (each ran
/// its admission checks).
async fn control_plane(nodes: u32) -> (ControlPlane, Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut control = simulated(dir.path(), nodes);
    let hosts = control.embedded_hosts();
    let (stop, rx) = watch::channel(false);
    let t = Instant::now();
    embedded::start(&control, hosts, true, rx, &mut Vec::new())
        .await
        .expect("embedded agents ready");
    (
        ControlPlane {
            state: control.state.clone(),
            _control: control,
            _stop: stop,
            _dir: dir,
        },
        t.elapsed(),
    )
}

/// The control plane as `serve` opens it, over `nodes` simulated 8-GPU pool nodes.
fn simulated(dir: &std::path::Path, nodes: u32) -> Control {
    Control::open(common::simulated_pool(dir, MODEL, nodes)).expect("open the control plane")
}

async fn nodes(state: &AppState) -> Vec<NodeRow> {
    state
        .read(|conn| Ok::<_, Error>(store::nodes::list(conn, None, None)?))
        .await
        .expect("nodes")
}

/// The median of `ROUNDS` medium checks of every node at once, and the last run's
/// slowest bandwidth pair (Gbit/s) when a ring test ran.
async fn medium(state: &AppState, ring: bool) -> (Duration, Option<f64>) {
    let all = nodes(state).await;
    let req = Request {
        level: "medium",
        expected_driver: "",
        check_layout: true,
        bandwidth: ring.then_some(0.0),
        bandwidth_duration: BANDWIDTH,
    };
    let mut times = Vec::new();
    let mut slowest = None;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let answers = health::run(state, &all, &req)
            .await
            .expect("checks ordered");
        times.push(t.elapsed());
        let verdicts = health::attribute_bandwidth(answers);
        assert!(
            verdicts.iter().all(|v| !v.failed),
            "a healthy simulated node failed: {:?}",
            verdicts.iter().find(|v| v.failed).map(|v| &v.summary)
        );
        slowest = verdicts
            .iter()
            .flat_map(|v| v.checks.iter())
            .filter(|c| c.name == "bandwidth")
            .map(|c| c.gbps)
            .reduce(f64::min);
    }
    times.sort();
    (times[ROUNDS / 2], slowest)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut rows = Vec::new();
    for n in [1u32, 64] {
        let (cp, ready) = control_plane(n).await;
        rows.push(format!(
            "| {n} node(s): registration to ready (incl. the admission medium check) | {} |",
            ms(ready)
        ));
        let (t, _) = medium(&cp.state, false).await;
        rows.push(format!(
            "| {n} node(s) at once: medium check, median of {ROUNDS} | {} |",
            ms(t)
        ));
        if n >= 2 {
            let (t, slowest) = medium(&cp.state, true).await;
            let slowest = slowest.unwrap_or(0.0);
            rows.push(format!(
                "| {n} nodes at once: medium check + ring bandwidth test ({} per pair), median of {ROUNDS} | {} |",
                ms(BANDWIDTH),
                ms(t)
            ));
            rows.push(format!(
                "| {n} nodes: slowest loopback pair (algbw) / busbw = algbw x 2(n-1)/n | {slowest:.2} / {:.2} Gbit/s |",
                health::bus_bandwidth(slowest, n as usize)
            ));
        }
    }
    println!("| health checks (simulated GPUs, embedded agents over loopback gRPC) | result |");
    println!("|---|---|");
    for r in rows {
        println!("{r}");
    }
}
