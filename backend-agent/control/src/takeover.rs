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
use crate::store::{
    self,
    nodes::{NODE_BUSY, NODE_QUARANTINED, NODE_READY},
};

/// How long a takeover waits for the former leader's node agents before it serves (at
/// most the node timeout): calls meanwhile are answered "not run", and a client sends
/// them again, so that they meet the fleet as it was, not nodes still on their way.
const AGENTS_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

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
            .apply(move |conn| -> crate::error::Result<Vec<String>> {
                fence.check(conn)?;
                crate::scheduling::clusters::recover_interrupted(conn, &volumes, now)?;
                store::take_backs::clear_all(conn)?;
                // The nodes in service: their agents are on their way from the former
                // leader.
                let in_service: Vec<String> = store::nodes::list(conn, None, None)?
                    .into_iter()
                    .filter(|n| [NODE_READY, NODE_BUSY].contains(&n.state.as_str()))
                    .map(|n| n.id)
                    .collect();
                store::nodes::await_agents(conn, now)?;
                Ok(in_service)
            })
            .await;
        match settled {
            Ok(in_service) => {
                tracing::info!(
                    epoch,
                    nodes = in_service.len(),
                    "took the lease over: settled the former leader's interrupted changes; waiting for the node agents to register here"
                );
                leadership.welcome_agents(epoch);
                let back = agents_back(&state, in_service, &mut stop).await;
                leadership.settled(epoch);
                tracing::info!(epoch, back, "this replica serves as the leader");
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

/// Waits until every node of `in_service` is settled again (ready, busy, or quarantined
/// by its admission checks), for the node timeout at most ([`AGENTS_WITHIN`] at most);
/// whether all were.
async fn agents_back(
    state: &Arc<AppState>,
    in_service: Vec<String>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let deadline = tokio::time::Instant::now() + state.agents.node_timeout.min(AGENTS_WITHIN);
    let mut waiting = in_service;
    loop {
        let ids = waiting.clone();
        let still = state
            .read(move |conn| -> crate::error::Result<Vec<String>> {
                let mut still = Vec::new();
                for id in ids {
                    let back = store::nodes::get(conn, &id)?.is_none_or(|n| {
                        [NODE_READY, NODE_BUSY, NODE_QUARANTINED].contains(&n.state.as_str())
                    });
                    if !back {
                        still.push(id);
                    }
                }
                Ok(still)
            })
            .await;
        if let Ok(still) = still {
            waiting = still;
        }
        if waiting.is_empty() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(nodes = ?waiting, "serving without these nodes: their agents did not register within the node timeout");
            return false;
        }
        tokio::select! {
            _ = stopped(stop) => return false,
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
    }
}
