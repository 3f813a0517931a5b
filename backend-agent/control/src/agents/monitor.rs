//! The control plane's watch over its nodes: a node not heard from within the node
//! timeout becomes unreachable and its cluster degraded; one still unreachable after
//! `--replace-after` is replaced when capacity and quota allow; an order past its
//! deadline fails. It is a singleton: it runs on the replica that holds the singletons'
//! lease, and each of its writes checks the lease's epoch in its own transaction
//! (`crate::lease`), so a former leader marks and replaces nothing.

use std::sync::Arc;
use std::time::Duration;

use gpufleet_process::signals::stopped;
use gpufleet_sql::AsConn;
use tokio::sync::watch;

use crate::error::Error;
use crate::state::AppState;
use crate::store::{
    self,
    nodes::{NODE_BUSY, NODE_QUARANTINED, NODE_READY, NODE_UNREACHABLE},
};

/// How long a node that could not be brought to its layout waits before another try.
const RETRY_AFTER_SECS: i64 = 5;

fn mark_unreachable(
    conn: &impl AsConn,
    node_id: &str,
    why: &str,
    replace_after: Duration,
    t: i64,
) -> crate::error::Result<()> {
    store::nodes::set_state(conn, node_id, NODE_UNREACHABLE, why, t)?;
    tracing::warn!(node = %node_id, %why, "node unreachable");
    let Some(node) = store::nodes::get(conn, node_id)? else {
        return Ok(());
    };
    if let Some(cluster) = &node.cluster_id {
        if let Some(c) = store::clusters::get(conn, cluster)? {
            store::events::record(
                conn,
                t,
                &c.id,
                &c.tenant_id,
                "node_unreachable",
                &node.hostname,
                why,
            )?;
        }
        // Every unreachable node of the cluster, each with since when and from when it is
        // replaced.
        let (_, reason) = crate::cluster_status::settled_status(conn, cluster, replace_after)?;
        store::clusters::set_status(conn, cluster, "degraded", &reason)?;
    }
    Ok(())
}

/// A free node whose agent's stream ended is out of service at once: a node is ready only
/// while an agent holds it (one that registers and leaves must never be handed to a
/// cluster or tested against). A cluster's node keeps the node timeout's grace, so that
/// an agent restart does not degrade its cluster.
pub async fn agent_gone(state: &Arc<AppState>, node_id: &str) {
    let (id, t) = (node_id.to_string(), state.now());
    let live = state.clone();
    let marked = state
        .apply(move |conn| {
            let Some(node) = store::nodes::get(conn, &id)? else {
                return Ok::<_, Error>(());
            };
            // A new session may have come meanwhile: then the node is its again.
            let free = node.cluster_id.is_none();
            if free
                && [NODE_READY, NODE_BUSY].contains(&node.state.as_str())
                && !live.agents.is_live(&id)
            {
                store::nodes::set_state(conn, &id, NODE_UNREACHABLE, "its agent disconnected", t)?;
            }
            Ok(())
        })
        .await;
    match marked {
        Ok(()) => {}
        // Stopping: every node waits for its agent at the next start anyway.
        Err(Error::Unavailable(_)) => {}
        Err(e) => tracing::error!(node = %node_id, error = %e, "cannot record a disconnected node"),
    }
}

/// Forgets the candidates (never in service) that have been in their state longer than
/// `--candidate-ttl`: a name registered with the join token and never admitted leaves no
/// permanent record, and holds its slot no longer (a live agent's session is ended, so a
/// fake node kept alive cannot keep it: a real agent registers again). Returns the names
/// forgotten.
pub async fn forget_stale_candidates(state: &Arc<AppState>) -> Vec<String> {
    let ttl = i64::try_from(state.candidates.expire_after.as_secs()).unwrap_or(i64::MAX);
    let before = state.now().saturating_sub(ttl);
    let stale = state
        .read(move |conn| Ok::<_, Error>(store::nodes::stale_candidates(conn, before)?))
        .await
        .unwrap_or_default();
    if stale.is_empty() {
        return stale;
    }
    let lease = state.lease().clone();
    let forgotten = state
        .apply(move |conn| {
            lease.fence(conn)?;
            let mut forgotten = Vec::new();
            for id in stale {
                // Put in service meanwhile: then it stays.
                if store::nodes::forget_candidate(conn, &id)? {
                    forgotten.push(id);
                }
            }
            Ok::<_, Error>(forgotten)
        })
        .await;
    match forgotten {
        Ok(forgotten) => {
            for id in &forgotten {
                state.agents.evict(
                    id,
                    tonic::Status::unavailable(format!(
                        "name: node {id} waited longer than the control plane's --candidate-ttl without being admitted, and was forgotten; register again to be checked anew"
                    )),
                );
                state.agents.forget(id);
                tracing::info!(node = %id, "forgot a candidate node that was never admitted");
            }
            forgotten
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot forget stale candidate nodes");
            Vec::new()
        }
    }
}

/// A node whose agent said it is stopping (a planned stop, not a crash): unreachable at
/// once, with why, its cluster degraded; the replacement counts from now.
pub async fn agent_left(state: &Arc<AppState>, node_id: &str, why: &str) {
    let (id, why, t) = (node_id.to_string(), why.to_string(), state.now());
    let replace_after = state.agents.replace_after;
    let marked = state
        .apply(move |conn| {
            let Some(node) = store::nodes::get(conn, &id)? else {
                return Ok::<_, Error>(());
            };
            if [NODE_READY, NODE_BUSY].contains(&node.state.as_str()) {
                mark_unreachable(conn, &id, &why, replace_after, t)?;
            }
            Ok(())
        })
        .await;
    match marked {
        Ok(()) | Err(Error::Unavailable(_)) => {}
        Err(e) => {
            tracing::error!(node = %node_id, error = %e, "cannot record a node whose agent left")
        }
    }
}

/// One round: expire silent nodes, then replace those unreachable long enough.
pub async fn round(state: &Arc<AppState>) {
    forget_stale_candidates(state).await;
    let nodes = match state
        .read(|conn| Ok::<_, Error>(store::nodes::list(conn, None, None)?))
        .await
    {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "cannot list nodes");
            return;
        }
    };
    let watched: Vec<String> = nodes
        .iter()
        .filter(|n| n.state != NODE_QUARANTINED)
        .map(|n| n.id.clone())
        .collect();
    // A node that could not be brought to its layout is tried again, now and then.
    for n in nodes.iter().filter(|n| {
        n.state == NODE_BUSY
            && !n.state_reason.is_empty()
            && state.now() - n.state_since >= RETRY_AFTER_SECS
            && state.agents.is_live(&n.id)
            && !state.agents.has_pending(&n.id)
    }) {
        // Restarting the clock first keeps the next round from starting a second try.
        let (id, t, lease) = (n.id.clone(), state.now(), state.lease().clone());
        let restarted = state
            .apply(move |conn| {
                lease.fence(conn)?;
                Ok::<_, Error>(store::nodes::set_state(conn, &id, NODE_BUSY, "", t)?)
            })
            .await;
        if let Err(e) = restarted {
            tracing::warn!(node = %n.hostname, error = %e, "cannot try a node's layout again");
            continue;
        }
        let fence = crate::lease::Fence::singleton(state.lease().clone());
        tokio::spawn(crate::mig::reconcile_node(
            state.clone(),
            fence,
            n.id.clone(),
        ));
    }
    // Orders past their deadline fail; their senders treat the node as broken for them.
    for (node, kind, why) in state.agents.fail_overdue() {
        tracing::warn!(node = %node, kind, "a work order passed its deadline unanswered");
        // A hung check or driver install is quarantined by the check or the install that
        // waited for it; a hung layout change or Slurm order by nobody else.
        if ["mig_layout", "slurmd"].contains(&kind) {
            let state = state.clone();
            tokio::spawn(async move {
                let fence = crate::lease::Fence::singleton(state.lease().clone());
                if let Err(e) =
                    crate::scheduling::health::quarantine_unanswered(&state, &fence, &node, &why)
                        .await
                {
                    tracing::error!(node = %node, error = %e, "cannot quarantine a node that does not answer");
                }
            });
        }
    }
    let (timeout, replace_after) = (state.agents.node_timeout, state.agents.replace_after);
    for node in state.agents.expire(&watched) {
        let (id, t, lease) = (node.clone(), state.now(), state.lease().clone());
        let marked = state
            .apply(move |conn| {
                lease.fence(conn)?;
                let why = format!("no heartbeat within {timeout:?}");
                mark_unreachable(conn, &id, &why, replace_after, t)
            })
            .await;
        if let Err(e) = marked {
            tracing::error!(node = %node, error = %e, "cannot record an unreachable node");
        }
    }
    // A node whose agent is gone is unreachable whatever it was doing: what a change
    // wrote after the node was declared (its undo, a reconcile) does not stand.
    for n in nodes.iter().filter(|n| {
        [NODE_BUSY, NODE_READY].contains(&n.state.as_str())
            && state.agents.unreachable_for(&n.id).is_some()
    }) {
        let (id, t, live) = (n.id.clone(), state.now(), state.clone());
        let marked = state
            .apply(move |conn| {
                live.lease().fence(conn)?;
                let still = store::nodes::get(conn, &id)?.is_some_and(|n| {
                    [NODE_BUSY, NODE_READY].contains(&n.state.as_str())
                        && live.agents.unreachable_for(&id).is_some()
                });
                if still {
                    store::nodes::set_state(
                        conn,
                        &id,
                        NODE_UNREACHABLE,
                        &format!("no heartbeat within {timeout:?}"),
                        t,
                    )?;
                }
                Ok::<_, Error>(())
            })
            .await;
        if let Err(e) = marked {
            tracing::error!(node = %n.hostname, error = %e, "cannot record an unreachable node");
        }
    }
    for n in nodes.iter().filter(|n| n.cluster_id.is_some()) {
        let due = state
            .agents
            .unreachable_for(&n.id)
            .is_some_and(|d| d >= state.agents.replace_after);
        if due {
            if let Err(why) = crate::scheduling::clusters::replace_unreachable(state, &n.id).await {
                tracing::debug!(node = %n.hostname, %why, "no replacement yet");
            }
        }
    }
}

/// Runs rounds until `stop` turns true.
pub async fn run(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let every = (state.agents.node_timeout / 4).clamp(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_secs(1),
    );
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(every) => round(&state).await,
        }
    }
}
