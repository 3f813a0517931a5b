//! What a replica does when it takes the singletons' lease over from another after its
//! own start: the former leader's half-done changes are settled, as a restart settles its
//! own (`scheduling::clusters::recover_interrupted`), and every node waits for its agent to
//! register here, since the agents' sessions were the former leader's.
//!
//! At start `serve` does this itself before serving, for the epoch it starts with; this
//! runs for any later one, and until it has, the replica serves nothing as the leader
//! (calls are answered UNAVAILABLE, not run, and node agents are turned away), so no
//! call meets a change of the former leader's that is about to be settled. It is one
//! fenced write: a replica that lost the lease again meanwhile settles nothing. While it did not lead, this replica forwarded every call
//! (`services::to_leader`), so no change of its own is under way to be taken for the
//! former leader's.

use std::sync::Arc;

use gpufleet_process::signals::stopped;
use tokio::sync::watch;

use crate::lease::Fence;
use crate::state::AppState;
use crate::store;

/// Runs while this replica leads (a singleton): settles once for a lease taken over after
/// start ([`crate::lease::Leadership::unsettled`]), trying again each second until it
/// could, then waits for `stop`.
pub async fn settle(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let leadership = state.lease().clone();
    while let (Some(epoch), Some(taken)) = (leadership.epoch(), leadership.unsettled()) {
        if epoch != taken {
            break;
        }
        let (fence, now, volumes) = (
            Fence::singleton(leadership.clone()),
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
            Ok(()) => {
                leadership.settled(epoch);
                tracing::info!(
                    epoch,
                    "took the lease over: settled the former leader's interrupted changes; this replica serves, and nodes wait for their agents to register here"
                );
                break;
            }
            Err(e) => {
                tracing::error!(epoch, error = %e, "cannot settle what the former leader left; trying again");
                tokio::select! {
                    _ = stopped(&mut stop) => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
        }
    }
    stopped(&mut stop).await;
}
