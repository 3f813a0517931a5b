//! MIG partitioning of cluster GPUs: layout checks through the planner, and bringing the
//! nodes of a cluster to its layout through work orders to their agents. The control
//! plane decides and waits; each agent changes its own GPUs and answers with the state it
//! verified, which is what the store records (`agents::service`).
//!
//! A failure on one node puts every node this request had already changed back to its
//! previous layout (the failing node's agent puts back its own GPUs).

use std::collections::HashMap;
use std::sync::Arc;

use gpufleet_gpu::hardware::GpuInfo;
use gpufleet_gpu::mig::{self, Layout, Placement};
use gpufleet_proto::v1;
use gpufleet_sql::AsConn;

use crate::error::{Error, Result};
use crate::lease::Fence;
use crate::registry::Outcome;
use crate::state::AppState;
use crate::store::{self, nodes::NodeRow};
use gpufleet_wire::inventory::{gpu_matches, placement_message, placements_of};

fn to_layout(layout: &HashMap<String, i32>) -> Result<Layout> {
    layout
        .iter()
        .map(|(name, &count)| {
            u32::try_from(count)
                .map(|c| (name.clone(), c))
                .map_err(|_| {
                    Error::Invalid(format!(
                        "mig_layout: count of \"{name}\" must be at least 0 (got {count})"
                    ))
                })
        })
        .collect()
}

fn model(gpu_type: &str) -> Result<&'static gpufleet_gpu::catalog::GpuModel> {
    gpufleet_gpu::catalog::model(gpu_type).ok_or_else(|| {
        Error::Invalid(crate::catalog::require_known("gpu_type", gpu_type).unwrap_err())
    })
}

/// FleetService.CheckMigLayout: does the layout fit one GPU, and how.
pub fn check(gpu_type: &str, layout: &HashMap<String, i32>) -> Result<v1::CheckMigLayoutResponse> {
    let layout = to_layout(layout)?;
    let model = model(gpu_type)?;
    Ok(match mig::plan(model, &layout) {
        // Not a layout that does not fit: the question has no answer on this model.
        Err(e) if !model.mig_capable => return Err(Error::Invalid(e.reason)),
        Ok(placements) => v1::CheckMigLayoutResponse {
            fits: true,
            placements: placements
                .into_iter()
                .map(|p| v1::MigPlacement {
                    profile: p.profile,
                    profile_id: p.profile_id as i32,
                    start: p.start as i32,
                    size: p.size as i32,
                })
                .collect(),
            ..Default::default()
        },
        Err(e) => v1::CheckMigLayoutResponse {
            fits: false,
            reason: e.reason,
            suggestions: e.suggestions.iter().map(mig::render_layout).collect(),
            ..Default::default()
        },
    })
}

/// A cluster's per-GPU layout, validated by the planner; empty means whole GPUs.
pub fn validate(gpu_type: &str, layout: &HashMap<String, i32>) -> Result<Layout> {
    let layout = to_layout(layout)?;
    if layout.is_empty() {
        return Ok(layout);
    }
    mig::plan(model(gpu_type)?, &layout).map_err(|e| {
        let text = e.to_string();
        Error::Invalid(if text.starts_with("mig_layout:") {
            text
        } else {
            format!("mig_layout: {text}")
        })
    })?;
    Ok(layout)
}

/// One node's change: every GPU to `target` (None: whole GPUs); `before` is what the
/// store recorded, to put back if the request fails elsewhere.
pub struct Change {
    pub node: NodeRow,
    pub before: Vec<GpuInfo>,
    pub target: Option<Vec<Placement>>,
}

impl Change {
    pub fn needed(&self) -> bool {
        !self
            .before
            .iter()
            .all(|g| gpu_matches(g, self.target.as_deref()))
    }
}

/// The planner's placements for a cluster layout (None: whole GPUs).
pub fn target(gpu_type: &str, layout: &Layout) -> Result<Option<Vec<Placement>>> {
    if layout.is_empty() {
        return Ok(None);
    }
    mig::plan(model(gpu_type)?, layout)
        .map(Some)
        .map_err(|e| Error::Invalid(format!("mig_layout: {e}")))
}

/// `nodes` to `layout`, `released` to whole GPUs.
pub fn changes(
    conn: &impl AsConn,
    gpu_type: &str,
    nodes: &[NodeRow],
    layout: &Layout,
    released: &[NodeRow],
) -> Result<Vec<Change>> {
    let placements = target(gpu_type, layout)?;
    let mut out = Vec::new();
    for (node, t) in nodes
        .iter()
        .map(|n| (n, placements.clone()))
        .chain(released.iter().map(|n| (n, None)))
    {
        out.push(Change {
            before: crate::recorded::recorded_gpus(conn, &node.id)?,
            node: node.clone(),
            target: t,
        });
    }
    Ok(out)
}

fn order(gpus: &[GpuInfo], target: impl Fn(&GpuInfo) -> Option<Vec<Placement>>) -> v1::WorkOrder {
    v1::WorkOrder {
        id: uuid::Uuid::new_v4().to_string(),
        epoch: 0, // stamped by Registry::dispatch
        kind: Some(v1::work_order::Kind::ApplyMigLayout(v1::ApplyMigLayout {
            gpus: gpus
                .iter()
                .map(|g| match target(g) {
                    Some(p) => v1::GpuLayout {
                        index: g.index,
                        whole_gpu: false,
                        placements: p.iter().map(placement_message).collect(),
                    },
                    None => v1::GpuLayout {
                        index: g.index,
                        whole_gpu: true,
                        placements: Vec::new(),
                    },
                })
                .collect(),
        })),
    }
}

/// The order that takes a node from `before` to `target` on every GPU.
fn forward(c: &Change) -> v1::WorkOrder {
    order(&c.before, |_| c.target.clone())
}

/// The order that puts every GPU back as `before` recorded it.
fn backward(c: &Change) -> v1::WorkOrder {
    order(&c.before, |g| g.mig_enabled.then(|| placements_of(g)))
}

fn failure(host: &str, outcome: Outcome) -> Option<Error> {
    let rolled = "the GPUs this request had changed were rolled back to their previous layout";
    match outcome {
        Outcome::Answered(r) if r.ok => None,
        Outcome::Answered(r) => {
            // The agent says when it rolled its own GPUs back: then only the rest is news.
            let text = if r.error.contains("rolled back") {
                format!(
                    "mig_layout: {host} {}; any other node this request had changed was rolled back too",
                    r.error
                )
            } else {
                format!("mig_layout: {host} {}; {rolled}", r.error)
            };
            Some(match r.error_kind.as_str() {
                "in_use" | "rule" => Error::Precondition(text),
                _ => Error::Aborted(text),
            })
        }
        Outcome::Unreachable(why) => Some(Error::Aborted(format!("mig_layout: {why}; {rolled}"))),
    }
}

/// Orders every needed change at once and waits for the agents' verified answers. On any
/// failure, the nodes that did change are ordered back to where they were, and the first
/// failure is returned. No lock is held while waiting.
pub async fn converge(state: &AppState, changes: &[Change]) -> Result<()> {
    let needed: Vec<&Change> = changes.iter().filter(|c| c.needed()).collect();
    let waits: Vec<_> = needed
        .iter()
        .map(|c| state.agents.dispatch(&c.node.id, forward(c)))
        .collect();
    let mut first_failure = None;
    let mut done = Vec::new();
    for (c, wait) in needed.iter().zip(waits) {
        let outcome = wait
            .await
            .unwrap_or_else(|_| Outcome::Unreachable("the control plane is stopping".into()));
        crate::counters::work_order(crate::counters::ORDER_MIG_LAYOUT, &outcome);
        match failure(&c.node.hostname, outcome) {
            None => done.push(*c),
            Some(status) => {
                first_failure.get_or_insert(status);
            }
        }
    }
    let Some(status) = first_failure else {
        return Ok(());
    };
    let undo: Vec<_> = done
        .iter()
        .map(|c| (c, state.agents.dispatch(&c.node.id, backward(c))))
        .collect();
    for (c, wait) in undo {
        let answer = wait.await;
        if let Ok(o) = &answer {
            crate::counters::work_order(crate::counters::ORDER_MIG_LAYOUT, o);
        }
        if let Ok(Outcome::Answered(r)) = answer {
            if r.ok {
                continue;
            }
        }
        tracing::error!(node = %c.node.hostname, "rollback of a MIG change failed");
    }
    Err(status)
}

/// What a node's GPUs should be: its cluster's layout, or whole GPUs when it is free.
fn desired(conn: &impl AsConn, node: &NodeRow) -> Result<Option<Vec<Placement>>> {
    let Some(cluster_id) = &node.cluster_id else {
        return Ok(None);
    };
    match store::clusters::get(conn, cluster_id)? {
        Some(c) => target(&c.gpu_type, &c.mig_layout),
        None => Ok(None),
    }
}

/// Brings a node to what it should be (an order only when its GPUs differ and no
/// request is already changing it). Returns the node as it was read and why it could
/// not be brought there (empty when it is there); None when it cannot be read.
///
/// `verify`: order the layout even when the record says it is there, because the record
/// may be behind the hardware (a change failed part-way: its agent restarted and may have
/// finished it without the answer being taken); the order's verified answer records what
/// the GPUs are.
pub async fn bring_to_recorded(
    state: &AppState,
    node_id: &str,
    verify: bool,
) -> Option<(NodeRow, String)> {
    // Orders already under way (a change the node's agent took up again after it
    // restarted) end first: planned before, this would undo or redo what they do.
    let within = state.agents.deadlines.mig_layout;
    if !state.agents.settled(node_id, within).await {
        tracing::warn!(node = %node_id, "orders to the node still under way; not reconciled now");
    }
    let mut reason = String::new();
    // Planned again after each change: what the node should be may change meanwhile (a
    // failed create or update given back), and the last plan is the one that stands.
    for round in 0..RECONCILE_ROUNDS {
        let change = match plan_for(state, node_id).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(node = %node_id, error = %e, "cannot reconcile the node");
                return None;
            }
        };
        let needed = change.needed() || (verify && round == 0);
        // A request changing the node's cluster owns its change: its orders (sent again
        // to an agent that restarted) finish it, or its undo reconciles the node.
        let owned = cluster_changing(state, &change.node).await;
        if !needed || owned || state.agents.has_pending(node_id) || !reason.is_empty() {
            return Some((change.node, reason));
        }
        tracing::info!(node = %node_id, "bringing the node to its recorded layout");
        let answer = state.agents.dispatch(node_id, forward(&change)).await;
        if let Ok(o) = &answer {
            crate::counters::work_order(crate::counters::ORDER_MIG_LAYOUT, o);
        }
        if let Some(status) = answer.ok().and_then(|o| failure(&change.node.hostname, o)) {
            reason = format!("could not be brought to its layout: {}", status);
        }
    }
    let node = plan_for(state, node_id).await.ok()?.node;
    Some((node, reason))
}

/// Whether a request is changing the node's cluster now.
async fn cluster_changing(state: &AppState, node: &NodeRow) -> bool {
    let Some(id) = node.cluster_id.clone() else {
        return false;
    };
    state
        .read(move |conn| Ok::<_, Error>(store::clusters::get(conn, &id)?))
        .await
        .ok()
        .flatten()
        .is_some_and(|c| crate::cluster_status::CHANGING.contains(&c.status.as_str()))
}

/// How many changes one reconcile makes before it leaves the rest to the next.
const RECONCILE_ROUNDS: usize = 3;

/// The node's recorded GPUs and what they should be, read now.
async fn plan_for(state: &AppState, node_id: &str) -> Result<Change> {
    let id = node_id.to_string();
    state
        .read(move |conn| {
            let node = store::nodes::get(conn, &id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
            change_of(conn, node)
        })
        .await
}

/// What it takes to bring `node` from its recorded GPUs to what they should be.
fn change_of(conn: &impl AsConn, node: NodeRow) -> Result<Change> {
    Ok(Change {
        before: crate::recorded::recorded_gpus(conn, &node.id)?,
        target: desired(conn, &node)?,
        node,
    })
}

/// After [`bring_to_recorded`]: a node that got there is ready (only while its agent is
/// connected: never a ready node without one), and a degraded cluster whose nodes are
/// all back running again; one that did not stays busy with why. A quarantined node
/// stays out of service until an operator returns it.
/// `fence`: a singleton's (the heartbeat watch's, a drift sweep's) writes nothing once its
/// replica lost the lease; a registration's or a request's is not fenced.
pub async fn mark_reconciled(state: &AppState, fence: &Fence, node: NodeRow, reason: String) {
    if node.state == store::nodes::NODE_QUARANTINED {
        return;
    }
    // A node whose agent is gone stays as the heartbeat watch records it (unreachable
    // once the node timeout has passed): neither ready nor busy without an agent.
    if !state.agents.is_live(&node.id) {
        tracing::info!(node = %node.hostname, %reason, "not marked ready or busy: its agent is not connected");
        return;
    }
    // Its cluster's volume mounted, or none when it is free (it may have left while away).
    let reason = match crate::node_volumes::sync(state, vec![node.id.clone()]).await {
        Err(e) if reason.is_empty() => e.to_string(),
        _ => reason,
    };
    let (node_id, cluster, t) = (node.id.clone(), node.cluster_id.clone(), state.now());
    let (hostname, fence) = (node.hostname.clone(), fence.clone());
    let recorded = state
        .apply(move |conn| {
            record_reconciled(
                conn,
                &fence,
                &node_id,
                cluster.as_deref(),
                &hostname,
                &reason,
                t,
            )
        })
        .await;
    if let Err(e) = recorded {
        tracing::error!(error = %e, "cannot record a reconciled node");
    }
}

/// [`mark_reconciled`]'s transaction: the node ready (or busy with `reason`), back in its
/// cluster's log, the cluster's status refreshed; after the fence, nothing when it refuses.
fn record_reconciled(
    conn: &impl AsConn,
    fence: &Fence,
    node_id: &str,
    cluster: Option<&str>,
    hostname: &str,
    reason: &str,
    t: i64,
) -> Result<()> {
    fence.check(conn)?;
    let (state_now, why) = if reason.is_empty() {
        (store::nodes::NODE_READY, "")
    } else {
        (store::nodes::NODE_BUSY, reason)
    };
    if let Err(e) = store::nodes::set_state(conn, node_id, state_now, why, t) {
        tracing::error!(node = %node_id, error = %e, "cannot record the node's state");
    }
    if let (Some(cluster), true) = (cluster, reason.is_empty()) {
        if let Err(e) = record_back(conn, cluster, hostname, t) {
            tracing::error!(cluster = %cluster, error = %e, "cannot record a node that is back");
        }
    }
    if let Some(cluster) = cluster {
        if let Err(e) = crate::cluster_status::refresh_cluster(conn, cluster) {
            tracing::error!(cluster = %cluster, error = %e, "cannot refresh the cluster's status");
        }
    }
    Ok(())
}

/// A cluster's node that is ready again after its cluster recorded it unreachable: the
/// cluster's log says so, so that its latest word on the node is not `node_unreachable`.
fn record_back(conn: &impl AsConn, cluster_id: &str, hostname: &str, t: i64) -> Result<()> {
    let last = store::events::last_of_node(conn, cluster_id, hostname)?;
    if last.as_ref().map(|e| e.kind.as_str()) != Some("node_unreachable") {
        return Ok(());
    }
    let Some(c) = store::clusters::get(conn, cluster_id)? else {
        return Ok(());
    };
    store::events::record(
        conn,
        t,
        &c.id,
        &c.tenant_id,
        "node_reachable",
        hostname,
        &format!("node {hostname} is reachable again: its agent reconnected and the node is ready"),
    )?;
    Ok(())
}

/// Brings a node to what it should be, then marks it (see [`mark_reconciled`], and its
/// `fence`).
pub async fn reconcile_node(state: Arc<AppState>, fence: Fence, node_id: String) {
    if let Some((node, reason)) = bring_to_recorded(&state, &node_id, false).await {
        mark_reconciled(&state, &fence, node, reason).await;
    }
}

/// [`reconcile_node`] for a node whose change just failed: its layout is ordered and
/// verified whatever its record says. A request's (its undo): not fenced.
pub async fn reconcile_after_failure(state: Arc<AppState>, node_id: String) {
    if let Some((node, reason)) = bring_to_recorded(&state, &node_id, true).await {
        mark_reconciled(&state, &Fence::request(), node, reason).await;
    }
}

/// How often nodes are compared with what they should be.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The ready nodes whose recorded GPUs differ from what they should be, outside any
/// change under way (their cluster settled, no order waiting).
fn drifted(state: &AppState, conn: &impl AsConn) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for node in store::nodes::list(conn, None, None)? {
        if node.state != store::nodes::NODE_READY || state.agents.has_pending(&node.id) {
            continue;
        }
        if let Some(cluster) = &node.cluster_id {
            let settled = store::clusters::get(conn, cluster)?
                .is_some_and(|c| !crate::cluster_status::CHANGING.contains(&c.status.as_str()));
            if !settled {
                continue;
            }
        }
        let change = change_of(conn, node)?;
        if change.needed() {
            out.push(change.node.id);
        }
    }
    Ok(out)
}

/// The reconciler's sweep, until `stop`: a node left apart from what it should be by
/// changes that crossed each other (a failed change given back while a restarted agent
/// finished it) is brought there, whoever left it so.
pub async fn run_drift_sweeps(state: Arc<AppState>, mut stop: tokio::sync::watch::Receiver<bool>) {
    // A singleton's: what a sweep records is fenced.
    let fence = Fence::singleton(state.lease().clone());
    loop {
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        let st = state.clone();
        let found = state.read(move |conn| drifted(&st, conn)).await;
        match found {
            Ok(ids) => {
                for id in ids {
                    if state.agents.is_live(&id) {
                        tracing::info!(node = %id, "the node drifted from its layout; reconciling");
                        reconcile_node(state.clone(), fence.clone(), id).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for drifted nodes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_former_leaders_drift_sweep_records_nothing_and_the_leaders_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("state.db")).unwrap();
        crate::lease::testing::seed(&conn);
        let (stale, current) = crate::lease::testing::stale_and_current(&mut conn);
        let why = "could not be brought to its layout: no answer";
        let tx = conn.transaction().unwrap();
        let refused = record_reconciled(&tx, &stale, "n1", Some("c1"), "n1", why, 2000)
            .unwrap_err()
            .to_string();
        drop(tx);
        assert!(refused.contains("writes nothing"), "{refused}");
        let n1 = store::nodes::get(&conn, "n1").unwrap().unwrap();
        assert_eq!(n1.state, store::nodes::NODE_READY);
        record_reconciled(&conn, &current, "n1", Some("c1"), "n1", why, 2000).unwrap();
        let n1 = store::nodes::get(&conn, "n1").unwrap().unwrap();
        assert_eq!(
            (n1.state.as_str(), n1.state_reason.as_str()),
            (store::nodes::NODE_BUSY, why)
        );
    }
}
