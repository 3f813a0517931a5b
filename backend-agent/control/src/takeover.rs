//! What a replica does when it takes the singletons' lease over from another after its
//! own start: the former leader's half-done changes are settled, as a restart settles its
//! own (`scheduling::clusters::recover_interrupted`), and every node waits for its agent to
//! register here, since the agents' sessions were the former leader's.
//!
//! At start `serve` does this itself before serving, for the epoch it starts with; this
//! runs for any later one. It is one fenced write: a replica that lost the lease again
//! meanwhile settles nothing. While it did not lead, this replica forwarded every call
//! (`services::to_leader`), so no change of its own is under way to be taken for the
//! former leader's.

use std::sync::Arc;

use gpufleet_process::signals::stopped;
use tokio::sync::watch;

use crate::lease::Fence;
use crate::state::AppState;
use crate::store;

/// Runs while this replica leads (a singleton): settles once for a lease taken over after
/// start (an epoch other than `started_with`), then waits for `stop`.
pub async fn settle(
    state: Arc<AppState>,
    started_with: Option<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let epoch = state.lease().epoch();
    if epoch.is_some() && epoch != started_with {
        let (fence, now, volumes) = (
            Fence::singleton(state.lease().clone()),
            state.now(),
            state.volumes.clone(),
        );
        let settled = state
            .apply(move |conn| -> crate::error::Result<()> {
                fence.check(conn)?;
                crate::scheduling::clusters::recover_interrupted(conn, &volumes, now)?;
                store::take_backs::clear_all(conn)?;
                store::nodes::await_agents(conn, now)?;
                Ok(())
            })
            .await;
        match settled {
            Ok(()) => tracing::info!(
                epoch,
                "took the lease over: settled the former leader's interrupted changes; nodes wait for their agents to register here"
            ),
            Err(e) => tracing::error!(epoch, error = %e, "cannot settle what the former leader left"),
        }
    }
    stopped(&mut stop).await;
}
