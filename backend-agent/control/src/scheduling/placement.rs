//! Which nodes a cluster gets: the capacity, quota, reservation and preemption checks
//! that pick them. Nothing here writes.

use rusqlite::Connection;

use super::reservations::held_by_clusters;
use super::{capacity, demand, gpus_per_node, holdings, Exclude};
use crate::error::{Error, Result};
use crate::rules::{self, QuotaSubject, Span};
use crate::state::rfc3339;
use crate::store::{
    self,
    clusters::ClusterRow,
    nodes::{NodeRow, ON_DEMAND, POOL},
};

/// Picks the nodes that take `cluster` from the nodes it holds (`current`) to
/// `cluster.node_count`, after the capacity and quota checks. Nothing is written.
pub fn nodes_to_add(
    conn: &Connection,
    tenant_name: &str,
    cluster: &ClusterRow,
    current: usize,
    t: i64,
) -> Result<Vec<NodeRow>> {
    let wanted = cluster.node_count - current as i64;
    let gpu = &cluster.gpu_type;
    let held = holdings(
        conn,
        gpu,
        t,
        Exclude {
            cluster: Some(&cluster.id),
            reservation: None,
        },
    )?;
    let cap = capacity(conn, gpu, &held)?;
    let gpn = gpus_per_node(conn, gpu)?;
    let (take_pool, take_od, from) = match &cluster.reservation_id {
        Some(rid) => {
            let r = store::reservations::get(conn, rid)?
                .filter(|r| r.tenant_id == cluster.tenant_id)
                .ok_or_else(|| {
                    Error::Invalid(format!("reservation_id: reservation '{rid}' not found"))
                })?;
            if r.gpu_type != *gpu {
                return Err(Error::Invalid(format!(
                    "reservation_id: reservation {rid} holds {} nodes, not {gpu}",
                    r.gpu_type
                )));
            }
            let status = rules::reservation_status(r.start_time, r.end_time, t);
            if status != "active" {
                return Err(Error::Precondition(format!(
                    "reservation_id: reservation {rid} is {status} ({} to {}); clusters can draw from it only while it is active",
                    rfc3339(r.start_time),
                    rfc3339(r.end_time)
                )));
            }
            let used = held_by_clusters(conn, rid)?;
            let free = r.node_count - used.pool - used.on_demand;
            if wanted > free {
                // What other clusters hold: this cluster's own nodes are its to keep.
                let others = used.pool + used.on_demand - current as i64;
                return Err(Error::Precondition(format!(
                    "node_count: needs {} nodes from reservation {rid}, which has {} nodes of which other clusters hold {others} ({} left)",
                    cluster.node_count,
                    r.node_count,
                    r.node_count - others
                )));
            }
            let take_pool = wanted.min(r.pool_nodes - used.pool).max(0);
            (take_pool, wanted - take_pool, r.end_time)
        }
        None => (wanted, 0, t),
    };
    // The cluster holds its nodes from `from` on (after its reservation's end, if any).
    let own_pool = store::nodes::list(conn, None, Some(&cluster.id))?
        .iter()
        .filter(|n| n.capacity == POOL)
        .count() as i64;
    let need_pool = own_pool + take_pool;
    let need_od = cluster.node_count - need_pool;
    // Quota first: it is the tenant's own limit, the more useful answer.
    let subject = QuotaSubject {
        tenant: tenant_name,
        gpu_type: gpu,
        holds: current as i64 * gpn,
    };
    let limit = super::limit(conn, &cluster.tenant_id, gpu)?;
    let new = Span {
        start: from,
        end: None,
        amount: cluster.node_count * gpn,
    };
    rules::check_quota(
        &subject,
        limit,
        &demand(&held, &cluster.tenant_id, gpn),
        new,
        t,
    )
    .map_err(Error::Precondition)?;

    let when = if cluster.reservation_id.is_some() {
        format!("after its reservation ends at {}", rfc3339(from))
    } else {
        "from now on".into()
    };
    // A preemptible cluster needs its pool nodes free now only: reservations take them
    // back when their windows start.
    let preemptible = super::preemption::is_preemptible(conn, &cluster.id)?;
    if preemptible && cap.free_pool(t, Some(t + 1)) < need_pool {
        return Err(Error::Precondition(format!(
            "node_count: needs {} {gpu} pool nodes now, the pool has {} free now; clusters and reservations hold the rest",
            cluster.node_count,
            cap.free_pool(t, Some(t + 1))
        )));
    }
    let pool_short = !preemptible && cap.free_pool(from, None) < need_pool;
    if pool_short && cluster.reservation_id.is_none() {
        if let Some(why) = super::preemption::blocked_later(gpu, cluster, &held, &cap, need_pool, t)
        {
            return Err(Error::Precondition(why));
        }
    }
    if pool_short || cap.free_on_demand(from, None) < need_od {
        return Err(Error::Precondition(format!(
            "node_count: needs {} {gpu} nodes {when}, pool has {} free (on-demand {} free); reservations hold the rest",
            cluster.node_count,
            cap.free_pool(from, None),
            cap.free_on_demand(from, None)
        )));
    }
    let mut picked = Vec::new();
    for (kind, count) in [(POOL, take_pool), (ON_DEMAND, take_od)] {
        let free = store::nodes::free(conn, gpu, kind)?;
        if (free.len() as i64) < count {
            return Err(Error::Precondition(format!(
                "needs {count} free {kind} {gpu} nodes, {} are free",
                free.len()
            )));
        }
        picked.extend(free.into_iter().take(count as usize));
    }
    Ok(picked)
}
