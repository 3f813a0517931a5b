//! `gpufleet-agent serve`: the control plane, with embedded node agents for its fleet
//! unless `--node-agents external`, until SIGINT/SIGTERM.
//!
//! `--hardware sim` (default) serves the simulated fleet of the fleet file (or the
//! built-in one). `--hardware nvml` serves this host alone as one pool node, with cluster
//! MIG layouts applied to its real GPUs; `--fleet` does not apply and is refused.

use std::sync::Arc;

use gpufleet_control::serve::{ControlPlane, Fleet};
use gpufleet_process::signals::Signals;

use crate::cli::{Hardware, NodeAgents, ServeArgs};

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Checked before the data dir is touched: a misconfigured start leaves nothing behind.
    let fleet = fleet(&args)?;
    advertised(&args)?;
    slurm_ports(&args);
    let args_stop_workloads = args.stop_workloads;
    let database = match args.postgres {
        true => Some(crate::database_url::read(args.database_file.as_deref())?),
        false => None,
    };
    let mut config = args.config(fleet);
    config.database = database;
    let mut control = tokio::task::spawn_blocking(move || ControlPlane::open(config)).await??;
    // Watch for signals before announcing the port: a SIGTERM right after the listening
    // line must shut down cleanly, not kill the process by the default action.
    let signals = Signals::watch()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            signals.recv().await;
            let _ = stop_tx.send(true);
        });
    }
    control.start_tasks(&stop_rx).await?;
    let hosts = control.embedded_hosts();
    let mut agents = crate::embedded::Agents::new();
    let served = if hosts.is_empty() {
        control.serve(stop_rx).await
    } else {
        let count = hosts.len();
        let stop_workloads = args_stop_workloads;
        match crate::embedded::start(
            &control,
            hosts,
            stop_workloads,
            stop_rx.clone(),
            &mut agents,
        )
        .await
        {
            Ok(()) => {
                tracing::info!(nodes = count, "embedded node agents registered");
                control.serve(stop_rx).await
            }
            Err(e) => {
                // The agents that started stop too.
                let _ = stop_tx.send(true);
                Err(e)
            }
        }
    };
    // The embedded agents leave their Slurm daemons and jobs running for the next serve
    // (or, with --stop-workloads, stop them and end their job steps before the process
    // exits, which would leave the job steps running). A serve that failed (its
    // port taken, say) stops them too: they would otherwise wait for a signal, and the
    // process would hang without saying why.
    if let Err(e) = &served {
        tracing::error!(error = %format!("{e:#}"), "serve failed; stopping the embedded node agents");
    }
    let _ = stop_tx.send(true);
    for a in agents {
        if tokio::time::timeout(AGENTS_STOP_WITHIN, a).await.is_err() {
            tracing::warn!("an embedded node agent did not stop within {AGENTS_STOP_WITHIN:?}");
        }
    }
    served
}

/// Where teams and the embedded nodes reach this host's Slurm controllers and logins,
/// logged, with a warning for loopback offered while listening beyond it. With external
/// node agents the controllers and logins run on the clusters' own nodes, at the addresses
/// their agents declare: nothing of Slurm is advertised here, and a wildcard `--listen`
/// needs no `--advertise-address`.
fn advertised(args: &ServeArgs) -> anyhow::Result<()> {
    if args.node_agents == NodeAgents::External {
        if let Some(address) = args.advertise_address {
            tracing::info!(%address, "--advertise-address is not used with external node agents: Slurm controllers and logins run on the clusters' nodes, at the addresses their agents declare");
        }
        return Ok(());
    }
    let address = crate::cli::advertise_address(args.advertise_address, args.listen);
    tracing::info!(%address, "Slurm controllers and logins of the embedded nodes are advertised at this address");
    if address.is_loopback() && !args.listen.ip().is_loopback() {
        tracing::warn!(%address, listen = %args.listen, "a loopback address is advertised while serve listens beyond loopback: teams on other hosts cannot reach the embedded nodes' Slurm logins; give --advertise-address");
    }
    Ok(())
}

/// Says so when the Slurm port range reaches into this host's ephemeral ports: a
/// daemon's port may then be held by any outgoing connection when it starts (the GPU
/// hosts' own ranges are theirs to check; docs/guides/slurm.md, "Ports").
fn slurm_ports(args: &ServeArgs) {
    let ports = args.slurm_ports;
    tracing::info!(%ports, "Slurm controllers, slurmds and logins listen on ports of this range");
    if let Some(ephemeral) = gpufleet_slurm::PortRange::ephemeral() {
        if let Some(both) = ports.overlap(ephemeral) {
            tracing::warn!(%ports, %ephemeral, overlap = %both, "the Slurm port range overlaps this host's ephemeral ports (net.ipv4.ip_local_port_range): an outgoing connection may hold a daemon's port; choose a range below them");
        }
    }
}

/// How long serve waits for its embedded agents to stop.
const AGENTS_STOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The fleet the flags ask for; NVML is opened (and the host checked) here.
fn fleet(args: &ServeArgs) -> anyhow::Result<Fleet> {
    match (args.node_agents, args.hardware) {
        (NodeAgents::External, hardware) => {
            if let Some(fleet) = &args.fleet {
                anyhow::bail!(
                    "--fleet (GPUFLEET_FLEET): not used with --node-agents external, whose fleet is the node agents that register (got {}); drop one of them",
                    fleet.display()
                );
            }
            if hardware == Hardware::Nvml {
                anyhow::bail!("--hardware nvml: with --node-agents external the hardware belongs to each node agent (gpufleet-agent node --hardware nvml)");
            }
            Ok(Fleet::External)
        }
        (NodeAgents::Embedded, Hardware::Sim) => Ok(Fleet::Simulated {
            fleet_file: args.fleet.clone(),
        }),
        (NodeAgents::Embedded, Hardware::Nvml) => {
            if let Some(fleet) = &args.fleet {
                anyhow::bail!(
                    "--fleet (GPUFLEET_FLEET): not used with --hardware nvml, whose fleet is this host's GPUs (got {}); drop one of them",
                    fleet.display()
                );
            }
            let nvml = gpufleet_node::hardware::require_nvml(args.nvml_lib.as_deref())?;
            Ok(Fleet::ThisHost(Arc::new(nvml)))
        }
    }
}
