//! `--node-agents embedded`: the fleet's nodes run as agents inside the control plane's
//! process, each the same agent as `gpufleet-agent node`, speaking the same protocol to
//! a loopback listener of its own. One code path: the demo and the tests of the embedded
//! mode exercise registration, orders and answers exactly as external agents do. Composed
//! here, in the binary: neither the control plane nor the node agent knows the other.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use gpufleet_control::connections::{accept::accept, activity::ActivityLayer, Limits, Table};
use gpufleet_control::serve::{ControlPlane, EmbeddedHost};
use gpufleet_node::link::Link;
use tokio::sync::watch;

/// How long the embedded agents may take to register and settle at start.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// The embedded agents' tasks: each ends once its agent has stopped (its Slurm daemons
/// left running, or ended with their job steps under --stop-workloads), after the stop
/// signal.
pub type Agents = Vec<tokio::task::JoinHandle<()>>;

/// Starts the loopback listener and one agent per host, and returns once every one is
/// registered and ready. `agents` gets each agent's task as it starts, so that the caller
/// can wait for them to stop even when this fails.
pub async fn start(
    control: &ControlPlane,
    hosts: Vec<EmbeddedHost>,
    stop_workloads: bool,
    stop: watch::Receiver<bool>,
    agents: &mut Agents,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot open the embedded agents' loopback listener")?;
    let addr = listener.local_addr()?;
    let service = control.agent_service();
    {
        // Bounded like the API's listener (anyone on this host can connect to it): room
        // for every embedded agent twice over (a reconnect overlaps its old session).
        let room = hosts.len() * 2 + 64;
        let table = Table::new(Limits {
            max_connections: room,
            max_per_peer: room,
            ..Limits::default()
        });
        let (incoming, accepting) = accept(listener, table.clone(), stop.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let stopped = async move { gpufleet_process::signals::stopped(&mut stop).await };
            if let Err(e) = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .layer(ActivityLayer::new(table))
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
            {
                tracing::error!(error = %e, "the embedded agents' listener failed");
            }
            accepting.abort();
        });
    }
    let url = format!("http://{addr}");
    let state = &control.state;
    let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    // The embedded nodes run on this host: Slurm reaches them where it reaches the
    // controllers.
    let address = match state.slurm_address {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(_) => std::net::Ipv4Addr::LOCALHOST,
    };
    for host in hosts {
        let join_token = {
            let state = state.clone();
            std::sync::Arc::new(move || state.join_tokens.current())
        };
        let agent = agent(
            host,
            address,
            &state.data_dir,
            &url,
            join_token,
            stop_workloads,
        )?;
        let stop = stop.clone();
        agents.push(tokio::spawn(async move {
            let name = agent.name.clone();
            if let Err(e) = gpufleet_node::session::run(agent, stop).await {
                tracing::error!(node = %name, error = %e, "embedded node agent stopped");
            }
        }));
    }
    control.await_nodes_settled(&names, SETTLE_WITHIN).await
}

/// The node agent of one embedded host, linked to the control plane at `url`.
fn agent(
    host: EmbeddedHost,
    address: std::net::Ipv4Addr,
    data_dir: &Path,
    url: &str,
    join_token: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    stop_workloads: bool,
) -> anyhow::Result<std::sync::Arc<gpufleet_node::session::Agent>> {
    use gpufleet_node::{bandwidth, driver};
    let faults_file = host.sim.as_ref().map(|_| data_dir.join("sim-faults.toml"));
    let installer = match &host.sim {
        Some(_) => driver::Installer::Sim(driver::SimDriver::new(
            &host.driver_version,
            None,
            Duration::ZERO,
        )),
        None => driver::Installer::Command(None),
    };
    // Each embedded agent takes part in bandwidth tests like an external one.
    let listener = bandwidth::Listener::start(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        gpufleet_node::fault_throttle(faults_file.clone(), &host.name),
    )
    .with_context(|| format!("node {}: cannot open its bandwidth listener", host.name))?;
    let declared = declared(&host, address)?;
    gpufleet_node::assemble(gpufleet_node::Parts {
        host: declared,
        // Embedded nodes are the control plane's host, which has the shared storage
        // itself: volumes are used in place there, never mounted per node.
        shared_storage: None,
        login_limits: Default::default(),
        job_tmp_mib: gpufleet_slurm::job_tmp::DEFAULT_MIB,
        home_mib: gpufleet_slurm::home_fs::DEFAULT_MIB,
        slurm_cred_expire: gpufleet_slurm::conf::DEFAULT_CRED_EXPIRE_SECS,
        stop_workloads,
        // A Slurm cluster is checked against this host at plan (`slurm_clusters`).
        cgroup_root: None,
        bandwidth: Some(listener),
        bandwidth_advertise: None,
        installer,
        data_dir: agent_dir(data_dir, &host.name),
        name: host.name,
        capacity: host.capacity,
        gpu_type: host.gpu_type,
        backend: host.backend,
        sim: host.sim,
        faults_file,
        link: Link::following(
            tonic::transport::Endpoint::from_shared(url.to_string())?.tcp_nodelay(true),
            join_token,
        ),
    })
}

/// The host as an embedded node declares it to Slurm: this host's values for real GPUs;
/// for simulated ones its fleet group's CPUs and memory as recorded, else
/// `fleet::SIM_CPUS_PER_GPU` and `fleet::SIM_MEMORY_MIB_PER_GPU` per GPU.
fn declared(
    host: &EmbeddedHost,
    address: std::net::Ipv4Addr,
) -> anyhow::Result<gpufleet_node::host::Declared> {
    use gpufleet_control::fleet::{SIM_CPUS_PER_GPU, SIM_MEMORY_MIB_PER_GPU};
    let mut declared = gpufleet_node::host::Declared::real(address);
    if host.sim.is_some() {
        let (cpus, memory_mib) = match host.declared {
            Some(d) => d,
            None => {
                let gpus = host
                    .backend
                    .gpus()
                    .map_err(|e| anyhow::anyhow!("node {}: {e}", host.name))?
                    .len()
                    .max(1) as u32;
                (
                    SIM_CPUS_PER_GPU * gpus,
                    SIM_MEMORY_MIB_PER_GPU * u64::from(gpus),
                )
            }
        };
        (declared.cpus, declared.memory_mib) = (cpus, memory_mib);
    }
    Ok(declared)
}

/// An embedded agent's own directory (its order journal and status).
fn agent_dir(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("agents").join(name)
}
