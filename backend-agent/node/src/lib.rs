//! `gpufleet-agent node`: the agent on one GPU host. It registers the host's GPUs with the
//! control plane, keeps one stream open to it, and carries out the work orders it sends
//! on its own hardware (simulated, or real GPUs through NVML), answering with the state
//! it verified. The binary's embedded mode runs the same agent in-process, over the same
//! protocol. This crate knows the control plane only as the far end of that protocol.

pub mod bandwidth;
pub mod driver;
pub mod executor;
pub mod faults;
pub mod fence;
pub mod hardware;
pub mod health;
pub mod host;
pub mod journal;
pub mod link;
pub mod local_volumes;
pub mod metrics;
pub mod mountinfo;
#[cfg(test)]
mod order_tests;
pub mod session;
pub mod sim_disk;
pub mod slurm;
pub mod telemetry;
pub mod volumes;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use gpufleet_gpu::hardware::{GpuBackend, SimulatedNode};

use executor::Executor;
use hardware::Hardware;
use journal::Journal;
use link::Link;
use session::Agent;

/// `gpufleet-agent node`'s settings (its flags, checked by [`run`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// `--control-plane`: the control plane's addresses as given (checked by
    /// [`link::control_plane_urls`]); the agent moves to the next when one fails.
    pub control_planes: Vec<String>,
    pub join_token: String,
    /// Where the join token is read at every connection (instead of `join_token`).
    pub join_token_file: Option<PathBuf>,
    /// The node's name; the host's name when `None`.
    pub name: Option<String>,
    pub data_dir: PathBuf,
    pub hardware: Hardware,
    pub nvml_lib: Option<PathBuf>,
    /// `pool` or `on-demand`.
    pub capacity: String,
    pub gpu_type: String,
    pub gpus: u32,
    pub sim_op_delay: std::time::Duration,
    pub driver_install_cmd: Option<String>,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub ca_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Where peers' bandwidth-test streams are taken (default: this host's address on
    /// the route to the control plane, a free port).
    pub bandwidth_listen: Option<std::net::SocketAddr>,
    pub bandwidth_advertise: Option<String>,
    /// HTTP/2 keepalive on the control plane's connection: a PING this often, and the
    /// connection given up when one goes unanswered for as long.
    pub keepalive: std::time::Duration,
    /// Where the Slurm controller reaches this host's slurmd (default: see
    /// [`host::default_address`]).
    pub address: Option<std::net::Ipv4Addr>,
    /// With simulated GPUs: the CPUs and memory (MiB) the node declares to Slurm instead of
    /// the host's.
    pub cpus: Option<u32>,
    pub memory_mib: Option<u64>,
    /// Where this host mounts the platform's shared storage (`--shared-storage`): team
    /// volumes are bind-mounted from it on the nodes of their clusters.
    pub shared_storage: Option<PathBuf>,
    /// What each Slurm login on this node may use (`--login-memory-mib`, `--login-cpus`,
    /// `--login-pids`).
    pub login_limits: gpufleet_slurm::login_limits::LoginLimits,
    /// What each Slurm cluster's jobs on this node may keep in their `/tmp`, all together,
    /// in MiB (`--job-tmp-mib`).
    pub job_tmp_mib: u64,
    /// The size of each Slurm cluster's home this agent makes on this host, in MiB
    /// (`--home-mib`).
    pub home_mib: u64,
    /// The Slurm daemons' job credential lifetime in seconds (`--slurm-cred-expire`).
    pub slurm_cred_expire: u32,
    /// End the node's Slurm daemons and jobs when the agent stops (else they run on, and
    /// the next agent adopts them).
    pub stop_workloads: bool,
    /// Do not serve: end and remove everything of every cluster the node's agent kept,
    /// then exit (`node --clean`).
    pub clean: bool,
}

/// The pieces an agent is made of, whichever process it runs in.
pub struct Parts {
    pub name: String,
    pub capacity: String,
    pub gpu_type: String,
    pub backend: Arc<dyn GpuBackend>,
    pub sim: Option<Arc<SimulatedNode>>,
    pub faults_file: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub link: Link,
    pub installer: driver::Installer,
    /// The bandwidth-test listener, and the host:port peers reach it at when that differs
    /// from its bound address.
    pub bandwidth: Option<Arc<bandwidth::Listener>>,
    pub bandwidth_advertise: Option<String>,
    /// The host as the node declares it to Slurm.
    pub host: host::Declared,
    /// Where this host mounts the platform's shared storage (team volumes come from it).
    pub shared_storage: Option<PathBuf>,
    /// What each Slurm login on this node may use, all its sessions together.
    pub login_limits: gpufleet_slurm::login_limits::LoginLimits,
    /// What each Slurm cluster's jobs on this node may keep in their `/tmp`, in MiB.
    pub job_tmp_mib: u64,
    /// The size of each Slurm cluster's home this agent makes on this host, in MiB.
    pub home_mib: u64,
    /// The Slurm daemons' job credential lifetime in seconds, and so how long a requeued
    /// job waits before it may start again (`--slurm-cred-expire`).
    pub slurm_cred_expire: u32,
    /// End the node's Slurm daemons and jobs when the agent stops (else they run on, and
    /// the next agent adopts them).
    pub stop_workloads: bool,
    /// Where this host's cgroup v1 hierarchies are, checked at each registration (what
    /// is missing is reported as the host's `isolation_problem`: the control plane then
    /// places no cluster here); None: not checked (the embedded agents of `serve`, whose
    /// host a Slurm cluster is checked against at plan).
    pub cgroup_root: Option<PathBuf>,
}

/// The slow-network fault of `name` read from `faults_file` at each stream (simulated
/// nodes); no limit without a faults file.
pub fn fault_throttle(faults_file: Option<PathBuf>, name: &str) -> bandwidth::Throttle {
    match faults_file {
        None => bandwidth::unthrottled(),
        Some(file) => {
            let name = name.to_string();
            Arc::new(move || {
                faults::Faults::read(&file)
                    .ok()
                    .and_then(|f| f.slow_network(&name))
            })
        }
    }
}

/// Builds the agent (opening its journal) from its parts.
pub fn assemble(parts: Parts) -> anyhow::Result<Arc<Agent>> {
    std::fs::create_dir_all(&parts.data_dir)
        .with_context(|| format!("cannot create {}", parts.data_dir.display()))?;
    let journal = Journal::open(&parts.data_dir)?;
    let hardware = if parts.sim.is_some() { "sim" } else { "nvml" };
    let bandwidth_addr = match (&parts.bandwidth_advertise, &parts.bandwidth) {
        (Some(a), _) => a.clone(),
        (None, Some(l)) => l.addr().to_string(),
        (None, None) => String::new(),
    };
    let load: Arc<dyn gpufleet_gpu::load::LoadRunner> = match &parts.sim {
        Some(sim) => Arc::new(gpufleet_gpu::load::SimRunner::new(sim.clone())),
        None => Arc::new(gpufleet_gpu::load::cuda::CudaRunner::new()),
    };
    // Every reading of the GPUs goes through the tap, so the XIDs telemetry drains still
    // reach the health checks.
    let telemetry = telemetry::XidTap::wrap(parts.backend);
    let address = parts.host.address;
    Ok(Arc::new(Agent {
        telemetry: telemetry.clone(),
        host: parts.host,
        bandwidth_addr,
        exec: Arc::new(Executor {
            name: parts.name.clone(),
            gpu_type: parts.gpu_type,
            backend: telemetry,
            sim: parts.sim,
            faults_file: parts.faults_file,
            journal: Mutex::new(journal),
            installer: parts.installer,
            running: Mutex::new(()),
            slurm: slurm::Slurm::new(
                &parts.data_dir,
                &parts.name,
                hardware == "sim",
                address,
                parts.shared_storage.clone(),
                parts.login_limits,
                slurm::DiskBounds {
                    job_tmp_mib: parts.job_tmp_mib,
                    home_mib: parts.home_mib,
                },
            )
            .with_cred_expire(parts.slurm_cred_expire),
            bandwidth: parts.bandwidth,
            shared_storage: parts.shared_storage,
            local_volumes: local_volumes::LocalVolumes::in_data_dir(&parts.data_dir),
            load,
            fence: fence::Fence::open(&parts.data_dir)?,
        }),
        stop_workloads: parts.stop_workloads,
        cgroup_root: parts.cgroup_root,
        name: parts.name,
        capacity: parts.capacity,
        hardware,
        link: parts.link,
        status_file: parts.data_dir.join("status.json"),
        secret_file: parts.data_dir.join("node.secret"),
    }))
}

/// `gpufleet-agent node --clean`: with no agent running on `data_dir` (refused while one
/// does), ends and removes everything of every cluster its agent kept on this host: the
/// daemons it left running, the jobs' steps, the logins' cgroups, the clusters' files and
/// keys in the data dir, each cluster's account and runtime directory once nothing else
/// of it is here, and its node-local team volumes (unmounted, their data deleted). For a host whose agent cannot reach the control plane any more (a
/// revoked certificate, a node removed from the fleet) or is retired.
fn clean(data_dir: &std::path::Path, name: &str) -> anyhow::Result<()> {
    if !data_dir.is_dir() {
        anyhow::bail!("--data-dir {}: no such directory", data_dir.display());
    }
    let _lock = gpufleet_process::data_dir::DataDirLock::acquire(data_dir)
        .context("--clean: stop the node agent on this data dir first")?;
    let slurm = slurm::Slurm::new(
        data_dir,
        name,
        false,
        std::net::Ipv4Addr::LOCALHOST,
        None,
        Default::default(),
        Default::default(),
    );
    let clusters = slurm.kept();
    let mut failed = Vec::new();
    for cluster in &clusters {
        match slurm.stop(cluster) {
            Ok(()) => println!("removed everything of cluster {cluster} from this host"),
            Err(e) => failed.push(format!("{cluster}: {e}")),
        }
    }
    // Its node-local team volumes, unmounted (their loop devices go with the mounts).
    let volumes = match local_volumes::LocalVolumes::in_data_dir(data_dir).clean() {
        Ok(n) => n,
        Err(e) => {
            failed.push(format!("team volumes: {e}"));
            0
        }
    };
    if volumes > 0 {
        println!("removed {volumes} node-local team volume(s) from this host");
    }
    if clusters.is_empty() && volumes == 0 {
        println!("this node's agent kept no cluster here: nothing to clean");
    }
    if !failed.is_empty() {
        anyhow::bail!("--clean: {}", failed.join("; "));
    }
    Ok(())
}

fn default_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into a buffer this function owns.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if ok {
        String::from_utf8_lossy(&buf[..end]).to_string()
    } else {
        String::new()
    };
    // A DNS label: the first component, lower case.
    name.split('.')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// The control plane's endpoints with TLS as the flags say (mutual TLS with --cert/--key).
fn link(args: &Config) -> anyhow::Result<Link> {
    let mut targets = Vec::new();
    for url in link::control_plane_urls(&args.control_planes)? {
        let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
            .with_context(|| format!("--control-plane: not a URL: {url}"))?
            .connect_timeout(std::time::Duration::from_secs(5))
            .tcp_nodelay(true)
            // A partition leaves the stream open and silent (TCP to a black hole retries for
            // many minutes): unanswered PINGs end it, so the agent knows it is cut off and
            // registers again as soon as the network is back.
            .http2_keep_alive_interval(args.keepalive)
            .keep_alive_timeout(args.keepalive)
            .keep_alive_while_idle(true);
        targets.push((url, endpoint));
    }
    Link::from_flags(
        targets,
        args.ca_cert.as_deref(),
        args.cert.as_deref(),
        args.key.as_deref(),
        &args.join_token,
        args.join_token_file.as_deref(),
    )
}

/// `gpufleet-agent node`: runs until SIGINT/SIGTERM, or until the control plane refuses it.
pub async fn run(args: Config) -> anyhow::Result<()> {
    let name = args.name.clone().unwrap_or_else(default_name);
    gpufleet_wire::names::dns_label("--name", &name).map_err(|e| anyhow::anyhow!(e))?;
    if args.clean {
        let data_dir = args.data_dir.clone();
        return tokio::task::spawn_blocking(move || clean(&data_dir, &name)).await?;
    }
    let link = link(&args)?;
    // Private before anything is written: its journal holds the orders it carried out.
    let data_dir = gpufleet_process::data_dir::private(&args.data_dir, &[])?;
    // A restart right after a stop waits (off the async workers) for the old agent.
    let lock = {
        let data_dir = data_dir.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || {
                gpufleet_process::data_dir::DataDirLock::acquire(&data_dir)
            })
            .await??,
        )
    };
    let (gpu_type, backend, sim): (String, Arc<dyn GpuBackend>, _) = match args.hardware {
        Hardware::Sim => {
            let model = gpufleet_gpu::catalog::model(&args.gpu_type).ok_or_else(|| {
                anyhow::anyhow!(
                    "--gpu-type: unknown GPU model '{}' (known: {})",
                    args.gpu_type,
                    gpufleet_gpu::catalog::model_names().join(", ")
                )
            })?;
            if !(1..=16).contains(&args.gpus) {
                anyhow::bail!("--gpus: must be between 1 and 16 (got {})", args.gpus);
            }
            let disk = sim_disk::DiskSim::open(
                &data_dir,
                &name,
                model,
                args.gpus,
                gpufleet_gpu::catalog::DEFAULT_DRIVER,
                args.sim_op_delay,
            )?;
            let sim = disk.node.clone();
            (model.name.clone(), Arc::new(disk), Some(sim))
        }
        Hardware::Nvml => {
            let nvml = crate::hardware::require_nvml(args.nvml_lib.as_deref())?;
            let gpus = nvml
                .gpus()
                .map_err(|e| anyhow::anyhow!("--hardware nvml: reading this host's GPUs: {e}"))?;
            let model = gpufleet_wire::inventory::host_model(&gpus)?;
            (model.name.clone(), Arc::new(nvml), None)
        }
    };
    let faults_file = sim.as_ref().map(|_| data_dir.join("sim-faults.toml"));
    let installer = match sim {
        Some(_) => driver::Installer::Sim(driver::SimDriver::new(
            gpufleet_gpu::catalog::DEFAULT_DRIVER,
            Some(data_dir.join("driver-version")),
            args.sim_op_delay,
        )),
        None => driver::Installer::Command(args.driver_install_cmd.clone()),
    };
    if let Some(a) = &args.bandwidth_advertise {
        let host_port = a
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if a.len() > 255 || !host_port {
            anyhow::bail!("--bandwidth-advertise: '{a}' is not a host:port");
        }
    }
    // What this host offers other hosts defaults to its address on the route to the
    // control plane (its first address that resolves): where that is another host, so
    // are the peers.
    let control_plane = args
        .control_planes
        .iter()
        .flat_map(|given| given.split(','))
        .find_map(|url| host::control_plane_addr(url.trim()));
    let route = control_plane.and_then(host::route_address);
    let bandwidth_listen = args.bandwidth_listen.unwrap_or_else(|| {
        std::net::SocketAddr::from((route.unwrap_or(std::net::Ipv4Addr::LOCALHOST), 0))
    });
    let listener =
        bandwidth::Listener::start(bandwidth_listen, fault_throttle(faults_file.clone(), &name))
            .with_context(|| format!("--bandwidth-listen: cannot listen on {bandwidth_listen}"))?;
    let host = declared_host(&args, sim.is_some(), bandwidth_listen)?;
    let bandwidth_offered = args
        .bandwidth_advertise
        .clone()
        .unwrap_or_else(|| listener.addr().to_string());
    tell_offered(control_plane, &bandwidth_offered, host.address);
    tracing::info!(address = %host.address, hostname = %host.hostname, cpus = host.cpus, memory_mib = host.memory_mib, "the host as Slurm declares it");
    if let Some(why) = gpufleet_slurm::cgroup_controllers_problem(std::path::Path::new(
        gpufleet_slurm::CGROUP_ROOT,
    )) {
        tracing::warn!("a Slurm cluster's slurmd and login cannot start on this host: {why} (docs/guides/node-agents.md, \"Host requirements\")");
    }
    let shared_storage = match &args.shared_storage {
        Some(dir) => Some(std::fs::canonicalize(dir).with_context(|| {
            format!(
                "--shared-storage {}: not a directory on this host",
                dir.display()
            )
        })?),
        None => None,
    };
    let agent = assemble(Parts {
        host,
        shared_storage,
        login_limits: args.login_limits,
        job_tmp_mib: args.job_tmp_mib,
        home_mib: args.home_mib,
        slurm_cred_expire: args.slurm_cred_expire,
        stop_workloads: args.stop_workloads,
        cgroup_root: Some(PathBuf::from(gpufleet_slurm::CGROUP_ROOT)),
        bandwidth: Some(listener),
        bandwidth_advertise: args.bandwidth_advertise.clone(),
        installer,
        name,
        capacity: args.capacity.clone(),
        gpu_type,
        backend,
        sim,
        faults_file,
        data_dir,
        link,
    })?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signals = gpufleet_process::signals::Signals::watch()?;
    {
        let lock = lock.clone();
        tokio::spawn(async move {
            signals.recv().await;
            lock.mark_stopping();
            let _ = stop_tx.send(true);
        });
    }
    if let Some(addr) = args.metrics_listen {
        let (name, backend) = (agent.name.clone(), agent.exec.backend.clone());
        let render = move || crate::metrics::render(name.clone(), backend.clone());
        // The host's own GPUs, no tenant's data: open to whoever reaches the address.
        gpufleet_process::metrics_endpoint::listen(
            addr,
            "node agent",
            gpufleet_process::metrics_endpoint::Access::Open,
            render,
            stop_rx.clone(),
        )
        .await?;
    }
    tracing::info!(node = %agent.name, control_plane = %agent.link.current(), addresses = agent.link.addresses(), "node agent starting");
    session::run(agent, stop_rx).await
}

/// Logs every address this agent offers other hosts, with a warning for a loopback (or
/// unspecified) one when the control plane is on another host: its peers and the Slurm
/// controller would reach themselves, not this host.
fn tell_offered(
    control_plane: Option<std::net::SocketAddr>,
    bandwidth: &str,
    slurm: std::net::Ipv4Addr,
) {
    let remote = control_plane.is_some_and(|a| !a.ip().is_loopback());
    let bandwidth_host = bandwidth
        .rsplit_once(':')
        .and_then(|(h, _)| h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().ok());
    let unreachable =
        |ip: Option<std::net::IpAddr>| ip.is_some_and(|ip| ip.is_loopback() || ip.is_unspecified());
    tracing::info!(bandwidth_test = %bandwidth, slurm_address = %slurm, control_plane = ?control_plane, "addresses this node offers its peers");
    if remote && unreachable(bandwidth_host) {
        tracing::warn!(bandwidth_test = %bandwidth, "the control plane is on another host, but the bandwidth-test address offered to peers is not reachable from other hosts; give --bandwidth-listen (or --bandwidth-advertise) this host's address");
    }
    if remote && unreachable(Some(slurm.into())) {
        tracing::warn!(slurm_address = %slurm, "the control plane is on another host, but the Slurm address offered to the controller is not reachable from other hosts; give --address this host's address");
    }
}

/// The host as this agent declares it to Slurm: its real values, with `--cpus` and
/// `--memory-mib` over them for simulated GPUs (bounded as the control plane bounds them).
fn declared_host(
    args: &Config,
    simulated: bool,
    bandwidth_listen: std::net::SocketAddr,
) -> anyhow::Result<host::Declared> {
    use gpufleet_proto::limits::{MAX_NODE_CPUS, MAX_NODE_MEMORY_MIB};
    let address = match args.address {
        Some(a) if a.is_unspecified() || a.is_broadcast() || a.is_multicast() => {
            anyhow::bail!("--address: {a} is not an address the Slurm controller can reach")
        }
        Some(a) => a,
        None => host::default_address(args.bandwidth_advertise.as_deref(), bandwidth_listen),
    };
    let mut host = host::Declared::real(address);
    if !simulated && (args.cpus.is_some() || args.memory_mib.is_some()) {
        anyhow::bail!(
            "--cpus/--memory-mib: only with --hardware sim (a real host declares its own)"
        );
    }
    if let Some(n) = args.cpus {
        if !(1..=MAX_NODE_CPUS).contains(&n) {
            anyhow::bail!("--cpus: 1 to {MAX_NODE_CPUS} (got {n})");
        }
        host.cpus = n;
    }
    if let Some(m) = args.memory_mib {
        if !(1..=MAX_NODE_MEMORY_MIB).contains(&m) {
            anyhow::bail!("--memory-mib: 1 to {MAX_NODE_MEMORY_MIB} (got {m})");
        }
        host.memory_mib = m;
    }
    Ok(host)
}

/// `gpufleet-agent node-status`: the agent's own view of its node (from its data dir).
pub fn print_status(data_dir: &Path) -> anyhow::Result<()> {
    let path = data_dir.join("status.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--data-dir: no node agent status in {}", path.display()))?;
    println!("{}", text.trim_end());
    Ok(())
}
