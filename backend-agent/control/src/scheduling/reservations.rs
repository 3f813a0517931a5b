//! Reservation scheduling: placing a reservation's nodes in the pool and on demand under
//! the tenant's quota, and what its clusters hold.

use gpufleet_sql::AsConn;

use super::{capacity, demand, gpus_per_node, holdings, holdings_during, Exclude};
use crate::error::{Error, Result};
use crate::rules::{self, QuotaSubject, Span, Split};
use crate::state::rfc3339;
use crate::store::{self, nodes::POOL, reservations::ReservationRow};

/// A tenant's reservations (of one model, or all), split into those not ended at `t`
/// and those ended. Ended reservations hold nothing: they never block a delete.
pub fn live_and_ended(
    conn: &impl AsConn,
    tenant_id: &str,
    gpu_type: Option<&str>,
    t: i64,
) -> Result<(Vec<ReservationRow>, Vec<ReservationRow>)> {
    Ok(store::reservations::list(conn, Some(tenant_id), gpu_type)?
        .into_iter()
        .partition(|r| r.end_time > t))
}

/// Removes ended reservations together with the quota or tenant they belong to (in the
/// caller's transaction). Clusters that drew from them block that delete first: a
/// cluster has its reservation's tenant and model.
pub fn remove_ended(conn: &impl AsConn, ended: &[ReservationRow]) -> Result<()> {
    for r in ended {
        store::reservations::delete(conn, &r.id)?;
        store::idempotency::forget(conn, &r.id)?;
    }
    Ok(())
}

/// Pool and on-demand nodes the clusters of a reservation hold.
pub fn held_by_clusters(conn: &impl AsConn, reservation_id: &str) -> Result<Split> {
    let mut held = Split {
        pool: 0,
        on_demand: 0,
    };
    for c in store::clusters::list(conn, None, None, Some(reservation_id))? {
        for n in store::nodes::list(conn, None, Some(&c.id))? {
            if n.capacity == POOL {
                held.pool += 1;
            } else {
                held.on_demand += 1;
            }
        }
    }
    Ok(held)
}

/// Turning allow_on_demand off cannot take nodes away from running clusters.
pub fn refuse_cluster_on_demand(conn: &impl AsConn, reservation_id: &str) -> Result<()> {
    for c in store::clusters::list(conn, None, None, Some(reservation_id))? {
        let on_demand = store::nodes::list(conn, None, Some(&c.id))?
            .iter()
            .filter(|n| n.capacity != POOL)
            .count();
        if on_demand > 0 {
            return Err(Error::Precondition(format!(
                "allow_on_demand: cluster '{}' ({}) holds {on_demand} on-demand nodes of this reservation; scale it down or delete it first",
                c.name, c.id
            )));
        }
    }
    Ok(())
}

/// Checks that the pool can hold all of `r`'s nodes over the rest of its window (the
/// same arithmetic as a create, leaving `r` itself out), so its on-demand nodes can move.
pub fn pool_takes_back(conn: &impl AsConn, r: &ReservationRow, t: i64) -> Result<()> {
    let exclude = Exclude {
        cluster: None,
        reservation: Some((&r.id, r.end_time)),
    };
    let held = holdings(conn, &r.gpu_type, t, exclude)?;
    let mut cap = capacity(conn, &r.gpu_type, &held)?;
    super::preemption::yield_to_reservations(conn, &r.gpu_type, t, &mut cap)?;
    let from = r.start_time.max(t);
    // What the pool has besides the nodes the reservation already holds there.
    let free = cap.free_pool(from, Some(r.end_time)) - r.pool_nodes;
    if free >= r.on_demand_nodes {
        return Ok(());
    }
    let free = free.max(0);
    let fits = r.pool_nodes + free;
    let shrink = if fits > 0 {
        format!(" or shrink node_count to {fits}")
    } else {
        String::new()
    };
    Err(Error::Precondition(format!(
        "allow_on_demand: the pool has {free} free {} {} from {} to {}, the reservation holds {} on-demand nodes; keep allow_on_demand{shrink}",
        r.gpu_type,
        if free == 1 { "node" } else { "nodes" },
        rfc3339(from),
        rfc3339(r.end_time),
        r.on_demand_nodes,
    )))
}

/// Places `r` (its node_count and window) against everything else, and checks the quota.
pub fn place(
    conn: &impl AsConn,
    tenant_name: &str,
    r: &mut ReservationRow,
    exclude: Exclude,
    min: Split,
    t: i64,
) -> Result<()> {
    // A create adds holdings only inside its window, so what overlaps the window decides
    // both checks (the tenant is within its quota everywhere else already). An update can
    // move its clusters' start (its end moves), so it looks at everything.
    let window = match exclude {
        Exclude {
            cluster: None,
            reservation: None,
        } => (r.start_time.max(t), Some(r.end_time)),
        _ => (t, None),
    };
    let held = holdings_during(conn, &r.gpu_type, t, window, exclude)?;
    let mut cap = capacity(conn, &r.gpu_type, &held)?;
    super::preemption::yield_to_reservations(conn, &r.gpu_type, t, &mut cap)?;
    let from = r.start_time.max(t);
    // Quota first: it is the tenant's own limit, the more useful answer.
    let gpn = gpus_per_node(conn, &r.gpu_type)?;
    let subject = QuotaSubject {
        tenant: tenant_name,
        gpu_type: &r.gpu_type,
        holds: 0,
    };
    let limit = super::limit(conn, &r.tenant_id, &r.gpu_type)?;
    let new = Span {
        start: r.start_time,
        end: Some(r.end_time),
        amount: r.node_count * gpn,
    };
    rules::check_quota(&subject, limit, &demand(&held, &r.tenant_id, gpn), new, t)
        .map_err(Error::Precondition)?;
    let window = format!("from {} to {}", rfc3339(from), rfc3339(r.end_time));
    let want = rules::Placing {
        nodes: r.node_count,
        start: from,
        end: r.end_time,
        allow_on_demand: r.allow_on_demand,
        window_text: &window,
    };
    let split =
        rules::split_reservation(&r.gpu_type, &cap, &want, min).map_err(Error::Precondition)?;
    r.pool_nodes = split.pool;
    r.on_demand_nodes = split.on_demand;
    Ok(())
}
