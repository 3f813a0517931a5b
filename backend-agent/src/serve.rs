//! `gpufleet-agent serve`: opens the state, seeds the fleet, serves the gRPC API until
//! SIGINT/SIGTERM.
//!
//! `--hardware sim` (default) serves the simulated fleet of the fleet file (or the
//! built-in one). `--hardware nvml` serves this host alone as one pool node: seeded on
//! first start from what NVML reports (see `crate::host`), with cluster MIG layouts
//! applied to its real GPUs; `--fleet` does not apply and is refused.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use gpufleet_gpu::hardware::GpuBackend;
use gpufleet_proto::limits::MAX_MESSAGE_BYTES;
use gpufleet_proto::v1::{
    fleet_service_server::FleetServiceServer, gpu_quota_service_server::GpuQuotaServiceServer,
    node_agent_service_server::NodeAgentServiceServer,
    reservation_service_server::ReservationServiceServer,
    tenant_cluster_service_server::TenantClusterServiceServer,
    tenant_service_server::TenantServiceServer,
};

use crate::agents::{embedded::Host, service::Agents};
use crate::cli::{Hardware, NodeAgents, ServeArgs};
use crate::services::{
    clusters::Clusters, fleet::Fleet, quotas::Quotas, reservations::Reservations, tenants::Tenants,
};
use crate::state::AppState;
use crate::{auth, fleet, store};

/// How long open connections may linger after a shutdown signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // A bad certificate or key fails before the data dir is touched.
    let tls_server = crate::tls::server_config(
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
        args.agent_ca.as_deref(),
    )?;
    if tls_server.is_none() && !args.listen.ip().is_loopback() && !args.insecure {
        anyhow::bail!(
            "--listen: {} is not a loopback address and TLS is off, so tokens would cross the network in clear text; give --tls-cert/--tls-key (and --agent-ca for node agents), or --insecure to accept that",
            args.listen
        );
    }
    if args.node_agents == NodeAgents::External {
        if let Some(fleet) = &args.fleet {
            anyhow::bail!(
                "--fleet (GPUFLEET_FLEET): not used with --node-agents external, whose fleet is the node agents that register (got {}); drop one of them",
                fleet.display()
            );
        }
        if args.hardware == Hardware::Nvml {
            anyhow::bail!("--hardware nvml: with --node-agents external the hardware belongs to each node agent (gpufleet-agent node --hardware nvml)");
        }
    }
    let scheme = if tls_server.is_some() {
        "https"
    } else {
        "http"
    };
    // Checked before the data dir is touched: a misconfigured start leaves nothing behind.
    let nvml = match args.hardware {
        Hardware::Sim => None,
        Hardware::Nvml => {
            if let Some(fleet) = &args.fleet {
                anyhow::bail!(
                    "--fleet (GPUFLEET_FLEET): not used with --hardware nvml, whose fleet is this host's GPUs (got {}); drop one of them",
                    fleet.display()
                );
            }
            Some(Arc::new(crate::hardware::require_nvml(
                args.nvml_lib.as_deref(),
            )?))
        }
    };
    if let Some(clock) = &args.clock_file {
        crate::clock::use_file(clock.clone());
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create the data dir {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    // Held until the process exits (the kernel drops it even on SIGKILL).
    let _lock = DataDirLock::acquire(&data_dir)?;
    let mut conn = store::open(&data_dir.join("state.db"))
        .with_context(|| format!("cannot open the state database in {}", data_dir.display()))?;
    // The drivers on offer: --drivers, else the fleet file's, else every known release.
    let mut offered = args.drivers.clone();
    // The embedded agents' hardware: this host through NVML, or the simulated fleet.
    let hosts: Vec<Host> = match (args.node_agents, nvml) {
        (NodeAgents::External, _) => Vec::new(),
        (NodeAgents::Embedded, Some(nvml)) => {
            let (node_id, created) = crate::host::seed(&mut conn, &*nvml)?;
            if created {
                tracing::info!(node = %node_id, "seeded this host as the fleet's one node");
            }
            let gpus = nvml
                .gpus()
                .map_err(|e| anyhow::anyhow!("--hardware nvml: {e}"))?;
            vec![Host {
                name: node_id,
                capacity: store::nodes::POOL.into(),
                gpu_type: crate::host::host_model(&gpus)?.name.clone(),
                backend: nvml,
                sim: None,
                driver_version: String::new(),
            }]
        }
        (NodeAgents::Embedded, None) => {
            let fleet_def = fleet::load(args.fleet.as_deref())?;
            if offered.is_empty() {
                offered = fleet_def.drivers.clone();
            }
            let seeded = fleet::seed(&mut conn, &fleet_def)?;
            if seeded > 0 {
                tracing::info!(nodes = seeded, "seeded the simulated fleet");
            }
            crate::agents::embedded::simulated_hosts(&conn)?
        }
    };
    crate::scheduling::clusters::recover_interrupted(&mut conn)?;
    // Every agent registers anew with this process.
    store::nodes::await_agents(&conn, crate::state::now())?;
    let admin_token = match args.admin_token.filter(|t| !t.is_empty()) {
        Some(t) => t,
        None => token_file(&data_dir, "admin.token", "gfa_")?,
    };
    let join_token = match args
        .join_token
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
    {
        Some(t) => t,
        None => token_file(&data_dir, "join.token", "gfj_")?,
    };
    let drivers = if offered.is_empty() {
        crate::drivers::Offer::all()
    } else {
        crate::drivers::Offer::only(&offered).map_err(|e| anyhow::anyhow!("--{e}"))?
    };
    let registry = crate::agents::registry::Registry::new(args.node_timeout, args.replace_after);
    let state = Arc::new(
        AppState::new(
            conn,
            data_dir.clone(),
            admin_token,
            join_token,
            registry,
            drivers,
        )
        .with_health(crate::scheduling::health::Settings {
            interval: args.health_interval,
            bandwidth_duration: args.bandwidth_duration,
        })
        .with_max_open_reservations(args.max_open_reservations),
    );

    // Watch for signals before announcing the port: a SIGTERM right after the listening
    // line must shut down cleanly, not kill the process by the default action.
    let signals = Signals::watch()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signals.recv().await;
        let _ = stop_tx.send(true);
    });
    tokio::spawn(crate::agents::monitor::run(state.clone(), stop_rx.clone()));
    tokio::spawn(crate::scheduling::preemption::run(
        state.clone(),
        stop_rx.clone(),
    ));
    tokio::spawn(crate::scheduling::health::run_periodic(
        state.clone(),
        stop_rx.clone(),
    ));
    tokio::spawn(crate::slurm::cluster::supervise(
        state.clone(),
        stop_rx.clone(),
    ));
    if let Some(addr) = args.metrics_listen {
        let state = state.clone();
        let render = move || crate::metrics::control::render(state.clone());
        crate::metrics::listen(addr, "control plane", render, stop_rx.clone()).await?;
    }
    if !hosts.is_empty() {
        let count = hosts.len();
        crate::agents::embedded::start(state.clone(), hosts, stop_rx.clone()).await?;
        tracing::info!(nodes = count, "embedded node agents registered");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // The one line on stdout: tests and scripts read the real port from it.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "gpufleet-agent listening on {scheme}://{addr}")?;
    stdout.flush()?;
    drop(stdout);
    tracing::info!(%addr, scheme, data_dir = %data_dir.display(), "serving");

    // On SIGINT/SIGTERM: close the listening socket at once (new clients are refused, not
    // left waiting in the backlog), let in-flight calls finish, and give connections that
    // stay open (idle clients, clients that never speak) a bounded grace period.
    let incoming = accept_until_stopped(listener, stop_rx.clone());
    let stopped = {
        let mut stop_rx = stop_rx.clone();
        async move { until_true(&mut stop_rx).await }
    };
    let grace = {
        let mut stop_rx = stop_rx;
        async move {
            until_true(&mut stop_rx).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    let server = tls_server
        .unwrap_or_else(tonic::transport::Server::builder)
        .layer(crate::metrics::api::ApiMetricsLayer)
        .layer(crate::services::short_errors::ShortErrorsLayer)
        .add_service(
            TenantServiceServer::new(Tenants {
                state: state.clone(),
            })
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            GpuQuotaServiceServer::new(Quotas {
                state: state.clone(),
            })
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            ReservationServiceServer::new(Reservations {
                state: state.clone(),
            })
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            FleetServiceServer::new(Fleet {
                state: state.clone(),
            })
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            TenantClusterServiceServer::new(Clusters {
                state: state.clone(),
            })
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            gpufleet_proto::v1::health_service_server::HealthServiceServer::new(
                crate::services::health::Health {
                    state: state.clone(),
                },
            )
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(NodeAgentServiceServer::new(Agents {
            state: state.clone(),
            require_client_cert: args.agent_ca.is_some(),
        }))
        .serve_with_incoming_shutdown(incoming, stopped);
    tokio::select! {
        result = server => result?,
        _ = grace => tracing::info!("closing connections still open after the grace period"),
    }
    tracing::info!("shut down cleanly");
    Ok(())
}

/// Reads `<data-dir>/<name>`, or creates it (mode 0600) with a fresh token.
fn token_file(data_dir: &Path, name: &str, prefix: &str) -> anyhow::Result<String> {
    let path = data_dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let token = auth::new_token(prefix);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(file, "{token}")?;
    tracing::info!(path = %path.display(), "generated a token");
    Ok(token)
}

/// Resolves once the stop flag is true (or its sender is gone).
async fn until_true(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Accepted connections until `stop` turns true; then the listener is dropped, so the
/// port refuses new connections while open ones drain. (tonic keeps the incoming stream,
/// and with it the socket, until every connection has closed.)
fn accept_until_stopped(
    listener: tokio::net::TcpListener,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<tokio::net::TcpStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = until_true(&mut stop) => break,
                accepted = listener.accept() => {
                    let sent = match accepted {
                        Ok((stream, _)) => {
                            // Answers over ~600 bytes would otherwise wait ~40 ms for a
                            // delayed ACK (tonic does not set it on sockets it is given).
                            if let Err(e) = stream.set_nodelay(true) {
                                tracing::warn!(error = %e, "cannot set TCP_NODELAY");
                            }
                            tx.send(Ok(stream)).await
                        }
                        // tonic logs and skips accept errors (e.g. out of file descriptors).
                        Err(e) => tx.send(Err(e)).await,
                    };
                    if sent.is_err() {
                        break;
                    }
                }
            }
        }
        tracing::info!("stopped accepting connections");
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// SIGINT and SIGTERM handlers, installed when created.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn watch() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot watch SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot watch SIGTERM")?,
        })
    }

    pub async fn recv(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => tracing::info!("SIGINT: shutting down"),
            _ = self.terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        }
    }
}

/// An exclusive lock on `<data-dir>/agent.lock`: two processes serving one data dir would
/// each hold their own simulated hardware and allocate the same nodes. The lock is the
/// open file's flock, so it goes with the process however it ends (no stale lock after a
/// crash or SIGKILL).
pub struct DataDirLock {
    _file: std::fs::File,
}

impl DataDirLock {
    pub fn acquire(data_dir: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd;
        let path = data_dir.join("agent.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            anyhow::bail!(
                "--data-dir: {} is in use by another gpufleet-agent (pid {}); stop it first ({err})",
                data_dir.display(),
                holder.trim()
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(Self { _file: file })
    }
}
