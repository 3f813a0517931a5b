//! How a gpufleet process learns it should stop: SIGINT/SIGTERM, and a watch flag that its
//! tasks wait on.

use anyhow::Context;
use tokio::sync::watch;

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

/// Resolves once `stop` is true (or its sender is gone), holding no borrow of it.
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
