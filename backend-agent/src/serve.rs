//! `gpufleet-agent serve`: opens the state, seeds the fleet, serves the gRPC API until
//! SIGINT/SIGTERM.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use gpufleet_proto::v1::{
    fleet_service_server::FleetServiceServer, gpu_quota_service_server::GpuQuotaServiceServer,
    reservation_service_server::ReservationServiceServer,
    tenant_cluster_service_server::TenantClusterServiceServer,
    tenant_service_server::TenantServiceServer,
};

use crate::cli::{Hardware, ServeArgs};
use crate::services::{
    clusters::Clusters, fleet::Fleet, quotas::Quotas, reservations::Reservations, tenants::Tenants,
};
use crate::state::AppState;
use crate::{auth, fleet, store};

/// How long open connections may linger after a shutdown signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.hardware == Hardware::Nvml {
        // The fleet's nodes stay simulated; this host's GPUs must at least be reachable.
        crate::hardware::require_nvml()?;
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create the data dir {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let fleet_def = fleet::load(args.fleet.as_deref())?;
    let mut conn = store::open(&data_dir.join("state.db"))
        .with_context(|| format!("cannot open the state database in {}", data_dir.display()))?;
    let seeded = fleet::seed(&mut conn, &fleet_def)?;
    if seeded > 0 {
        tracing::info!(nodes = seeded, "seeded the simulated fleet");
    }
    let admin_token = match args.admin_token.filter(|t| !t.is_empty()) {
        Some(t) => t,
        None => admin_token_file(&data_dir)?,
    };
    let hardware = crate::hardware::SimFleet::load(&conn)?;
    let state = Arc::new(AppState::new(conn, data_dir.clone(), admin_token, hardware));

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // The one line on stdout: tests and scripts read the real port from it.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "gpufleet-agent listening on http://{addr}")?;
    stdout.flush()?;
    drop(stdout);
    tracing::info!(%addr, data_dir = %data_dir.display(), "serving");

    // On SIGINT/SIGTERM stop accepting and let in-flight calls finish; clients that keep
    // idle connections open get a bounded grace period instead of holding shutdown forever.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let signalled = async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    let grace = async move {
        let _ = stop_rx.wait_for(|stopped| *stopped).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let server = tonic::transport::Server::builder()
        .add_service(TenantServiceServer::new(Tenants {
            state: state.clone(),
        }))
        .add_service(GpuQuotaServiceServer::new(Quotas {
            state: state.clone(),
        }))
        .add_service(ReservationServiceServer::new(Reservations {
            state: state.clone(),
        }))
        .add_service(FleetServiceServer::new(Fleet {
            state: state.clone(),
        }))
        .add_service(TenantClusterServiceServer::new(Clusters {
            state: state.clone(),
        }))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            signalled,
        );
    tokio::select! {
        result = server => result?,
        _ = grace => tracing::info!("closing connections still open after the grace period"),
    }
    tracing::info!("shut down cleanly");
    Ok(())
}

/// Reads `<data-dir>/admin.token`, or creates it (mode 0600) with a fresh token.
fn admin_token_file(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("admin.token");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let token = auth::new_token("gfa_");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(file, "{token}")?;
    tracing::info!(path = %path.display(), "generated the admin token");
    Ok(token)
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
    }
}
