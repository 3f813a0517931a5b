//! `FleetService.DrainNode`: an operator takes a node out of service (admin only). The
//! node is quarantined with the operator's reason in one transaction, out of its cluster;
//! then the cluster gets a replacement from the same source (`drivers::replace`, as a
//! failed driver install does), or is degraded, saying why, when none is free. An operator's
//! drain is not counted by the quarantine breaker: it is no failure of the model.

use gpufleet_proto::v1;
use rusqlite::Savepoint;
use tonic::{Request, Status};

use super::fleet::Fleet;
use crate::scheduling::drivers;
use crate::state::db_error;
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

impl Fleet {
    pub(super) fn drain_node(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::DrainNodeRequest>,
    ) -> Result<Drained, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("draining a node")?;
        let node = super::fleet::node_named(&tx, &req.name)?;
        let said = if req.reason.is_empty() {
            "maintenance"
        } else {
            req.reason.as_str()
        };
        let reason = format!("drained by an operator: {said}");
        if node.state == NODE_QUARANTINED {
            let node = self.answer_committed(tx, &caller, node)?;
            return Ok(Drained {
                node,
                left: None,
                reason,
            });
        }
        let left = match &node.cluster_id {
            Some(id) => store::clusters::get(&tx, id).map_err(db_error)?,
            None => None,
        };
        store::nodes::set_state(&tx, &node.id, NODE_QUARANTINED, &reason, self.state.now())
            .map_err(db_error)?;
        store::nodes::release(&tx, &node.id).map_err(db_error)?;
        tracing::warn!(node = %node.hostname, %reason, "node drained by an operator");
        crate::counters::quarantine(&node.gpu_type, CAUSE_OPERATOR);
        let row = super::fleet::node_named(&tx, &req.name)?;
        let node = self.answer_committed(tx, &caller, row)?;
        Ok(Drained { node, left, reason })
    }
}

/// After the commit: the cluster the node left is told, and made whole again if a node is
/// free (else degraded with why). The drain itself stands either way.
pub(super) async fn replace_drained(fleet: &Fleet, drained: &Drained) {
    let Some(cluster) = &drained.left else {
        return;
    };
    let state = &fleet.state;
    let hostname = &drained.node.hostname;
    drivers::event(state, cluster, "node_drained", hostname, &drained.reason).await;
    if let Err(e) = drivers::replace(state, cluster, hostname).await {
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
