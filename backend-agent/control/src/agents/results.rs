//! An agent's answer to an order, before the control plane believes it. Only an answer
//! the registry let it claim (an order this control plane sent to that node and still
//! waits for) gets here. Its text is cut to bounds, and an inventory it carries must be
//! the node's own: the bounds of a registration, and the model and GPUs on record. An
//! answer that breaks them is recorded as nothing and counts as a failed order.

use std::collections::BTreeSet;

use gpufleet_proto::v1;
use gpufleet_sql::AsConn;

use super::admission::{self, Refusal};
use crate::message_cut::cut;
use crate::store;

/// Bytes of an order's error text kept.
pub const MAX_ERROR_BYTES: usize = 4096;
/// Bytes of any other text field of a result (a check's name, value, detail...).
const MAX_FIELD_BYTES: usize = 1024;
/// Health checks one report may carry: a few per GPU and per bandwidth peer.
const MAX_CHECKS: usize = 1024;

/// `error_kind` of an answer the control plane refused to believe.
pub use crate::counters::OUT_OF_BOUNDS;

/// The result with every text field cut to its bound and at most [`MAX_CHECKS`] checks.
fn bounded(mut r: v1::OrderResult) -> v1::OrderResult {
    r.error = cut(&r.error, MAX_ERROR_BYTES);
    r.error_kind = cut(&r.error_kind, 64);
    if let Some(h) = &mut r.health {
        h.level = cut(&h.level, 16);
        h.checks.truncate(MAX_CHECKS);
        for c in &mut h.checks {
            for f in [
                &mut c.name,
                &mut c.gpu_uuid,
                &mut c.verdict,
                &mut c.value,
                &mut c.threshold,
                &mut c.detail,
                &mut c.peer,
            ] {
                *f = cut(f, MAX_FIELD_BYTES);
            }
        }
    }
    r
}

/// Why `inv` cannot be this node's: out of a registration's bounds, or not the model
/// and GPUs the control plane recorded for it.
fn foreign_inventory(
    conn: &impl AsConn,
    node: &store::nodes::NodeRow,
    inv: &v1::NodeInventory,
) -> crate::error::Result<Option<String>> {
    if let Err(refused) = admission::check_inventory(inv) {
        return match refused {
            Refusal::Store(e) => Err(e.into()),
            other => Ok(Some(other.to_string())),
        };
    }
    if inv.gpu_type != node.gpu_type {
        return Ok(Some(format!(
            "inventory.gpu_type: node {} is a {} node, the answer says {}",
            node.hostname, node.gpu_type, inv.gpu_type
        )));
    }
    let recorded: BTreeSet<String> = store::nodes::gpus(conn, &node.id)?
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let reported: BTreeSet<String> = inv.gpus.iter().map(|g| g.uuid.clone()).collect();
    if recorded != reported {
        return Ok(Some(format!(
            "inventory.gpus: node {} has {} recorded GPUs; the answer reports {} others",
            node.hostname,
            recorded.len(),
            reported.difference(&recorded).count()
        )));
    }
    Ok(None)
}

/// Records what a claimed answer verified about the node (its driver and its GPUs' MIG
/// state) and returns the answer as its sender should see it: bounded, or failed when
/// its inventory is not the node's.
pub fn record(conn: &impl AsConn, node_id: &str, result: v1::OrderResult) -> v1::OrderResult {
    let mut result = bounded(result);
    let Some(inv) = result.inventory.take() else {
        return result;
    };
    let node = match store::nodes::get(conn, node_id) {
        Ok(Some(n)) => n,
        Ok(None) => return result,
        Err(e) => {
            tracing::error!(node = %node_id, error = %e, "cannot read the node an answer is for");
            return result;
        }
    };
    match foreign_inventory(conn, &node, &inv) {
        Ok(None) => {}
        Ok(Some(why)) => {
            tracing::warn!(node = %node.hostname, %why, "an order's answer is out of bounds; not believed");
            crate::counters::refused_result(OUT_OF_BOUNDS);
            return v1::OrderResult {
                order_id: result.order_id,
                ok: false,
                error: cut(
                    &format!("the agent's answer was not believed: {why}"),
                    MAX_ERROR_BYTES,
                ),
                error_kind: OUT_OF_BOUNDS.into(),
                ..Default::default()
            };
        }
        Err(e) => {
            tracing::error!(node = %node_id, error = %e, "cannot check an order's answer");
            return result;
        }
    }
    if let Err(e) =
        store::nodes::set_versions(conn, node_id, &inv.driver_version, &inv.cuda_version)
    {
        tracing::error!(node = %node_id, error = %e, "cannot record the node's driver");
    }
    for g in &inv.gpus {
        // Checked above: every GPU reads.
        let Ok(info) = gpufleet_wire::inventory::gpu_info(g) else {
            continue;
        };
        if let Err(e) = store::nodes::set_mig_state(
            conn,
            node_id,
            info.index as i64,
            info.mig_enabled,
            &crate::recorded::mig_device_rows(&info),
        ) {
            tracing::error!(node = %node_id, error = %e, "cannot record an order's result");
        }
    }
    result.inventory = Some(inv);
    result
}
