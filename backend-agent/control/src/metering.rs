//! GPU-seconds used (issue 42): every [`FLUSH_EVERY`] the node agents' utilisation
//! readings received since the last flush (`telemetry::Telemetry::take_usage`) are counted
//! into the store's usage in one write (`store::usage::record_used`), each reading's
//! time since the previous one capped at the node timeout (the heartbeat gap limit), so
//! that a silence is never counted as use. What a flush counts is in the store, with the
//! last reading counted per holding: a restart loses at most the readings of one flush
//! period and never counts one twice.

use std::sync::Arc;
use std::time::Duration;

use gpufleet_process::signals::stopped;
use tokio::sync::watch;

use crate::error::Error;
use crate::state::AppState;
use crate::store;

/// How often the readings are counted.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// Flushes every [`FLUSH_EVERY`] until `stop`, and once more then.
pub async fn run(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            _ = tokio::time::sleep(FLUSH_EVERY) => flush(&state).await,
        }
    }
    flush(&state).await;
}

/// Counts the readings received since the last flush, and prunes what is past the
/// retention. A failed write loses them (logged): used time is then under-counted, never
/// over-counted.
pub async fn flush(state: &Arc<AppState>) {
    let pending = state.agents.telemetry.take_usage();
    if pending.is_empty() {
        return;
    }
    let max_gap = i64::try_from(state.agents.node_timeout.as_secs())
        .unwrap_or(i64::MAX)
        .max(1);
    let t = state.now();
    let counted = state
        .apply(move |conn| {
            for (node, readings) in &pending {
                store::usage::record_used(conn, node, readings, max_gap)?;
            }
            store::usage::prune(conn, t)?;
            Ok::<_, Error>(())
        })
        .await;
    match counted {
        Ok(()) | Err(Error::Unavailable(_)) => {}
        Err(e) => tracing::error!(error = %e, "cannot count the GPUs' utilisation readings"),
    }
}
