//! Which nodes a cluster gets: the capacity, quota, reservation and preemption checks
//! that pick them. Nothing here writes.

use gpufleet_sql::AsConn;

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
    conn: &impl AsConn,
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
    let free_now = cap.free_pool(t, Some(t + 1));
    if preemptible && free_now < need_pool {
        return Err(Error::Precondition(format!(
            "node_count: needs {} {gpu} pool nodes now ({} GPUs), the pool has {free_now} free now ({} GPUs): no idle capacity to borrow; clusters and reservations hold the rest",
            cluster.node_count,
            need_pool.saturating_mul(gpn),
            free_now.saturating_mul(gpn),
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
    if take_pool > 0 && cluster.reservation_id.is_none() {
        within_lending_limits(conn, tenant_name, cluster, (&held, gpn), need_pool, t)?;
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

/// How many pool nodes a guaranteed cluster (not preemptible, not drawing from a
/// reservation) growing from `current` nodes to `cluster.node_count` takes back from
/// other tenants' preemptible clusters (issue 42): 0 unless the pool (or what other
/// tenants' lending limits leave of it) is short for it now or later, and then only when
/// the tenant's idle guarantee (its guaranteed GPUs less the pool GPUs it holds, this
/// cluster's included) covers every node taken back, and other tenants' preemptible
/// clusters hold that many nodes beyond their own guarantees. Otherwise the usual
/// refusal of [`nodes_to_add`] stands: burst never preempts. Nothing is written.
pub fn owner_reclaim(
    conn: &impl AsConn,
    cluster: &ClusterRow,
    current: usize,
    t: i64,
) -> Result<i64> {
    let wanted = cluster.node_count - current as i64;
    if wanted <= 0
        || cluster.reservation_id.is_some()
        || super::preemption::is_preemptible(conn, &cluster.id)?
    {
        return Ok(0);
    }
    let gpu = &cluster.gpu_type;
    let exclude = Exclude {
        cluster: Some(&cluster.id),
        reservation: None,
    };
    let held = holdings(conn, gpu, t, exclude)?;
    let cap = capacity(conn, gpu, &held)?;
    let gpn = gpus_per_node(conn, gpu)?.max(1);
    let shares = super::sharing::shares(conn, gpu, &held, t, gpn)?;
    let Some(own) = shares.iter().find(|s| s.tenant_id == cluster.tenant_id) else {
        return Ok(0);
    };
    let own_pool = store::nodes::list(conn, None, Some(&cluster.id))?
        .iter()
        .filter(|n| n.capacity == POOL)
        .count() as i64;
    let need_pool = own_pool + wanted;
    let free_now = cap.free_pool(t, Some(t + 1));
    let lendable =
        super::sharing::Lendable::of(free_now.saturating_mul(gpn), &shares, &cluster.tenant_id);
    // Short now (of the free pool, or of what the others' limits leave of it), or later
    // (a reservation window ahead): nodes taken back now count for ever after.
    let usable_now = free_now.min(lendable.gpus() / gpn);
    let short = (need_pool - usable_now).max(need_pool - cap.free_pool(t, None));
    if short <= 0 {
        return Ok(0);
    }
    let idle_nodes = (own.guaranteed - own.held - own_pool.saturating_mul(gpn)).max(0) / gpn;
    if short > idle_nodes {
        return Ok(0);
    }
    let (borrowers, _) = super::sharing::borrowers(conn, gpu, &shares)?;
    let borrowers = super::sharing::beyond_guarantee(borrowers, &cluster.tenant_id, gpn);
    if super::sharing::nodes_held(&borrowers) < short {
        return Ok(0);
    }
    Ok(short)
}

/// Refuses pool nodes that other tenants' lending limits keep idle for them: `need_pool`
/// nodes (of `gpus_per_node` GPUs) fit only in the free pool GPUs now less what those
/// limits keep (see [`super::sharing`]).
fn within_lending_limits(
    conn: &impl AsConn,
    tenant_name: &str,
    cluster: &ClusterRow,
    (held, gpus_per_node): (&[super::Holding], i64),
    need_pool: i64,
    t: i64,
) -> Result<()> {
    let gpu = &cluster.gpu_type;
    let cap = capacity(conn, gpu, held)?;
    let free_now = cap.free_pool(t, Some(t + 1));
    let shares = super::sharing::shares(conn, gpu, held, t, gpus_per_node)?;
    let lendable = super::sharing::Lendable::of(
        free_now.saturating_mul(gpus_per_node),
        &shares,
        &cluster.tenant_id,
    );
    let need = need_pool.saturating_mul(gpus_per_node);
    if need <= lendable.gpus() {
        return Ok(());
    }
    let nodes = lendable.gpus() / gpus_per_node.max(1);
    Err(Error::Precondition(format!(
        "node_count: needs {need_pool} {gpu} pool nodes now ({need} GPUs), the pool has {free_now} free now ({} GPUs), but lending limits keep {} of them idle for their tenants ({}): tenant '{tenant_name}' may borrow {} GPUs ({nodes} {}); no idle capacity for the rest",
        lendable.free,
        lendable.kept(),
        lendable.limits_text(),
        lendable.gpus(),
        if nodes == 1 { "node" } else { "nodes" },
    )))
}
