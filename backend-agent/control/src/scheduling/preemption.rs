//! Preemptible clusters: idle capacity used without breaking promises. A preemptible
//! cluster takes pool nodes free now even when a reservation holds them later; when that
//! reservation's window starts, the platform takes them back: the cluster shrinks, or
//! (with `allow_on_demand`) gets on-demand nodes in their place. Its status and events
//! say which nodes left and why. Reservations never count preemptible clusters' pool
//! nodes: they yield.

use gpufleet_sql::AsConn;

use crate::error::{Error, Result};
use crate::rules::{Capacity, Span};
use crate::state::rfc3339;
use crate::store::{self, clusters::ClusterRow};

/// Records a new cluster's preemptibility (inside its create's transaction).
pub fn mark(conn: &impl AsConn, c: &ClusterRow, preemptible: bool, on_demand: bool) -> Result<()> {
    if on_demand && !preemptible {
        return Err(Error::Invalid(
            "allow_on_demand: only with preemptible = true (on-demand nodes then replace the pool nodes a reservation takes back)".into(),
        ));
    }
    if !preemptible {
        return Ok(());
    }
    if c.reservation_id.is_some() {
        return Err(Error::Invalid(
            "preemptible: a cluster drawing from a reservation keeps its nodes for the window; leave out preemptible or reservation_id".into(),
        ));
    }
    store::preemption::insert(conn, &c.id, on_demand)?;
    Ok(())
}

/// Whether `cluster_id` is preemptible.
pub fn is_preemptible(conn: &impl AsConn, cluster_id: &str) -> Result<bool> {
    Ok(store::preemption::get(conn, cluster_id)?.is_some())
}

/// Capacity as reservations see it from `t` on: preemptible clusters' pool nodes are free
/// to them (those clusters give them back when the window starts).
pub fn yield_to_reservations(
    conn: &impl AsConn,
    gpu_type: &str,
    t: i64,
    cap: &mut Capacity,
) -> Result<()> {
    let yielding = store::preemption::pool_nodes(conn, gpu_type)?;
    if yielding > 0 {
        // Cancels their open-ended holdings from `t` on.
        cap.pool_used.push(Span {
            start: t,
            end: None,
            amount: -yielding,
        });
    }
    Ok(())
}

/// The refusal of a cluster without a reservation that the pool has nodes for now but
/// not for ever: it names the reservation window that needs them and what would work.
pub fn blocked_later(
    gpu_type: &str,
    cluster: &ClusterRow,
    held: &[super::Holding],
    cap: &Capacity,
    need_pool: i64,
    t: i64,
) -> Option<String> {
    let free_now = cap.free_pool(t, Some(t + 1));
    if free_now < need_pool {
        return None;
    }
    // The first reservation window from whose start the pool is short.
    let mut starts: Vec<&super::Holding> = held
        .iter()
        .filter(|h| h.is_reservation && h.start > t)
        .collect();
    starts.sort_by_key(|h| h.start);
    let blocking = starts
        .into_iter()
        .find(|h| cap.free_pool(t, Some(h.start + 1)) < need_pool)?;
    let free_then = cap.free_pool(blocking.start, Some(blocking.start + 1));
    Some(format!(
        "node_count: needs {} {gpu_type} pool nodes from now on with no end; {free_now} are free now, but a reservation window from {} to {} needs them (the pool has {free_then} free then); set preemptible = true to use the idle nodes until that window starts, or draw the nodes from a reservation (reservation_id)",
        cluster.node_count,
        rfc3339(blocking.start),
        blocking.end.map_or_else(|| "no end".to_string(), rfc3339),
    ))
}
