//! `FleetService.DrainNode`: an operator takes a node out of service (admin only). The
//! node is quarantined with the operator's reason in one transaction, out of its cluster;
//! then the cluster gets a replacement from the same source (`drivers::replace`, as a
//! failed driver install does), or is degraded, saying why, when none is free. An operator's
//! drain is not counted by the quarantine breaker: it is no failure of the model.

use std::sync::Arc;

use gpufleet_proto::v1;
use gpufleet_sql::AsConn;
use gpufleet_sql::Savepoint;
use tonic::{Request, Status};

use crate::scheduling::drivers;
use crate::state::{db_error, AppState};
use crate::store::{self, clusters::ClusterRow, nodes::NODE_QUARANTINED};

/// `cause` of a quarantine on an operator's word (the quarantines counter's label).
const CAUSE_OPERATOR: &str = "operator";

/// What the transaction did: the node's answer, and the cluster it left (None when it was
/// free or already quarantined: nothing more to do).
pub(super) struct Drained {
    pub node: v1::Node,
    left: Option<ClusterRow>,
    reason: String,
}

/// The node's answer, once the transaction is committed.
fn committed(
    state: &AppState,
    tx: Savepoint<'_>,
    caller: &crate::auth::Caller,
    name: &str,
) -> Result<v1::Node, Status> {
    let row = node_named(&tx, name)?;
    let answer = super::node_messages(&tx, Some(&state.agents), caller, vec![row])?
        .pop()
        .ok_or_else(|| Status::internal("node vanished"))?;
    tx.commit().map_err(db_error)?;
    Ok(answer)
}

fn node_named(conn: &impl AsConn, name: &str) -> Result<store::nodes::NodeRow, Status> {
    store::nodes::by_hostname(conn, name)
        .map_err(db_error)?
        .ok_or_else(|| super::not_found("node", name))
}

/// The transaction of a drain: the node quarantined on the operator's word.
pub(super) fn drain_node(
    state: &Arc<AppState>,
    tx: Savepoint<'_>,
    request: Request<v1::DrainNodeRequest>,
) -> Result<Drained, Status> {
    let (caller, req) = super::enter(state, &tx, request)?;
    caller.require_admin("draining a node")?;
    let node = node_named(&tx, &req.name)?;
    let said = if req.reason.is_empty() {
        "maintenance"
    } else {
        req.reason.as_str()
    };
    let reason = format!("drained by an operator: {said}");
    if node.state == NODE_QUARANTINED {
        return Ok(Drained {
            node: committed(state, tx, &caller, &req.name)?,
            left: None,
            reason,
        });
    }
    let left = match &node.cluster_id {
        Some(id) => store::clusters::get(&tx, id).map_err(db_error)?,
        None => None,
    };
    let now = state.now();
    store::nodes::set_state(&tx, &node.id, NODE_QUARANTINED, &reason, now).map_err(db_error)?;
    store::nodes::release(&tx, &node.id, now).map_err(db_error)?;
    let answer = committed(state, tx, &caller, &req.name)?;
    tracing::warn!(node = %node.hostname, %reason, "node drained by an operator");
    crate::counters::quarantine(&node.gpu_type, CAUSE_OPERATOR);
    Ok(Drained {
        node: answer,
        left,
        reason,
    })
}

/// After the commit: the cluster the node left is told, and made whole again if a node is
/// free (else degraded with why). The drain itself stands either way.
pub(super) async fn replace_drained(state: &AppState, drained: &Drained) {
    let Some(cluster) = &drained.left else {
        return;
    };
    let hostname = &drained.node.hostname;
    // An operator's request: not fenced.
    let fence = crate::lease::Fence::request();
    drivers::event(
        state,
        &fence,
        cluster,
        "node_drained",
        hostname,
        &drained.reason,
    )
    .await;
    if let Err(e) = drivers::replace(state, &fence, cluster, hostname).await {
        let why = format!("node {hostname} was drained by an operator; no replacement: {e}");
        let id = cluster.id.clone();
        let written = state
            .apply(move |conn| {
                Ok::<_, crate::error::Error>(store::clusters::set_status(
                    conn, &id, "degraded", &why,
                )?)
            })
            .await;
        if let Err(e) = written {
            tracing::error!(cluster = %cluster.id, error = %e, "cannot mark the cluster degraded");
        }
    }
}
