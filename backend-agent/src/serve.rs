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
    let config = args.config(fleet);
    let mut control = tokio::task::spawn_blocking(move || ControlPlane::open(config)).await??;
    // Watch for signals before announcing the port: a SIGTERM right after the listening
    // line must shut down cleanly, not kill the process by the default action.
    let signals = Signals::watch()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signals.recv().await;
        let _ = stop_tx.send(true);
    });
    control.start_tasks(&stop_rx).await?;
    let hosts = control.embedded_hosts();
    if !hosts.is_empty() {
        let count = hosts.len();
        crate::embedded::start(&control, hosts, stop_rx.clone()).await?;
        tracing::info!(nodes = count, "embedded node agents registered");
    }
    control.serve(stop_rx).await
}

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
