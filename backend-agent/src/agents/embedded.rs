//! `--node-agents embedded`: the fleet's nodes run as agents inside the control plane's
//! process, each the same agent as `gpufleet-agent node`, speaking the same protocol to
//! a loopback listener of its own. One code path: the demo and the tests of the embedded
//! mode exercise registration, orders and answers exactly as external agents do.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, SimulatedNode};
use gpufleet_proto::v1::node_agent_service_server::NodeAgentServiceServer;
use tokio::sync::watch;

use super::service::Agents;
use crate::node::{self, session::Link};
use crate::state::AppState;
use crate::store::{self, nodes::NODE_READY};

/// One in-process node: its name, capacity, model and hardware.
pub struct Host {
    pub name: String,
    pub capacity: String,
    pub gpu_type: String,
    pub backend: Arc<dyn GpuBackend>,
    /// Set for simulated hardware (which `<data-dir>/sim-faults.toml` can then reach).
    pub sim: Option<Arc<SimulatedNode>>,
    /// The driver a simulated node runs now (its record's).
    pub driver_version: String,
}

/// Every node of the store as an embedded host with simulated GPUs (its recorded MIG
/// state and driver).
pub fn simulated_hosts(conn: &rusqlite::Connection) -> anyhow::Result<Vec<Host>> {
    Ok(crate::hardware::simulated_nodes(conn)?
        .into_iter()
        .map(|(row, sim)| {
            let sim = Arc::new(sim);
            Host {
                name: row.hostname,
                capacity: row.capacity,
                gpu_type: row.gpu_type,
                backend: sim.clone(),
                sim: Some(sim),
                driver_version: row.driver_version,
            }
        })
        .collect())
}

/// How long the embedded agents may take to register and settle at start.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// Starts the loopback listener and one agent per host, and returns once every one is
/// registered and ready.
pub async fn start(
    state: Arc<AppState>,
    hosts: Vec<Host>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot open the embedded agents' loopback listener")?;
    let addr = listener.local_addr()?;
    let service = NodeAgentServiceServer::new(Agents {
        state: state.clone(),
        require_client_cert: false,
    });
    {
        let mut stop = stop.clone();
        tokio::spawn(async move {
            use tokio_stream::StreamExt;
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
                s.inspect(|s| {
                    let _ = s.set_nodelay(true);
                })
            });
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
            {
                tracing::error!(error = %e, "the embedded agents' listener failed");
            }
        });
    }
    let url = format!("http://{addr}");
    let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    for host in hosts {
        let faults_file = host
            .sim
            .as_ref()
            .map(|_| state.data_dir.join("sim-faults.toml"));
        let installer = match &host.sim {
            Some(_) => node::driver::Installer::Sim(node::driver::SimDriver::new(
                &host.driver_version,
                None,
                Duration::ZERO,
            )),
            None => node::driver::Installer::Command(None),
        };
        // Each embedded agent takes part in bandwidth tests like an external one.
        let listener = node::bandwidth::Listener::start(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            node::fault_throttle(faults_file.clone(), &host.name),
        )
        .with_context(|| format!("node {}: cannot open its bandwidth listener", host.name))?;
        let agent = node::assemble(node::Parts {
            bandwidth: Some(listener),
            bandwidth_advertise: None,
            installer,
            data_dir: agent_dir(&state.data_dir, &host.name),
            name: host.name,
            capacity: host.capacity,
            gpu_type: host.gpu_type,
            backend: host.backend,
            sim: host.sim,
            faults_file,
            link: Link {
                endpoint: tonic::transport::Endpoint::from_shared(url.clone())?.tcp_nodelay(true),
                join_token: state.join_token.clone(),
            },
        })?;
        let stop = stop.clone();
        tokio::spawn(async move {
            let name = agent.name.clone();
            if let Err(e) = node::session::run(agent, stop).await {
                tracing::error!(node = %name, error = %e, "embedded node agent stopped");
            }
        });
    }
    // Wait on the condition itself: every embedded node registered and ready.
    let deadline = tokio::time::Instant::now() + SETTLE_WITHIN;
    loop {
        let waiting: Vec<String> = {
            let conn = state.db();
            let mut w = Vec::new();
            for name in &names {
                // Ready, or settled out of service (quarantined by a failed check).
                let ready = store::nodes::by_hostname(&conn, name)?.is_some_and(|n| {
                    n.state == NODE_READY || n.state == store::nodes::NODE_QUARANTINED
                });
                if !ready {
                    w.push(name.clone());
                }
            }
            w
        };
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "embedded node agents not ready within {SETTLE_WITHIN:?}: {}",
                waiting.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An embedded agent's own directory (its order journal and status).
fn agent_dir(data_dir: &Path, name: &str) -> std::path::PathBuf {
    data_dir.join("agents").join(name)
}
