//! Scheduling: who holds which nodes when, and whether a request fits the pool, the
//! on-demand capacity and the tenant's quota. Returns the domain's typed errors.

pub mod breaker;
pub mod clusters;
pub mod drivers;
pub mod earliest;
pub mod guarantees;
pub mod health;
pub mod placement;
pub mod preemption;
pub mod queue;
pub mod reservations;
pub mod sharing;
#[cfg(test)]
mod sharing_tests;
pub mod take_back;

use gpufleet_sql::AsConn;

use crate::error::{Error, Result};
use crate::rules::{Capacity, Span};
use crate::store;

pub fn gpus_per_node(conn: &impl AsConn, gpu_type: &str) -> Result<i64> {
    store::nodes::gpus_per_node(conn, gpu_type).map_err(Error::from)
}

/// Who holds nodes of one model, and when.
#[derive(Debug, Clone)]
pub struct Holding {
    pub tenant_id: String,
    pub start: i64,
    pub end: Option<i64>,
    pub pool: i64,
    pub on_demand: i64,
    /// A cluster that does not draw from a live reservation (counts as "used" now).
    pub unreserved_cluster: bool,
    pub is_reservation: bool,
}

/// What to leave out when computing holdings, because the request replaces it.
#[derive(Default, Clone, Copy)]
pub struct Exclude<'a> {
    pub cluster: Option<&'a str>,
    /// A reservation being updated, and its new end (its clusters outlive it from then).
    pub reservation: Option<(&'a str, i64)>,
}

/// Everything that holds nodes of `gpu_type` from `now` on:
/// - reservations hold their pool/on-demand nodes over their window;
/// - clusters drawing from a reservation hold their nodes from the reservation's end on
///   (the reservation covers them until then);
/// - other clusters hold their nodes from now on (open-ended).
pub fn holdings(
    conn: &impl AsConn,
    gpu_type: &str,
    now: i64,
    exclude: Exclude,
) -> Result<Vec<Holding>> {
    holdings_during(conn, gpu_type, now, (now, None), exclude)
}

/// The holdings of [`holdings`] that overlap `window` = `[from, until)` (`until = None`:
/// for ever). Capacity over that window, and a quota check of a request inside it, see
/// exactly what they would see with every holding; the reservations come from the
/// store's window index, so the cost follows what overlaps, not history.
pub fn holdings_during(
    conn: &impl AsConn,
    gpu_type: &str,
    now: i64,
    window: (i64, Option<i64>),
    exclude: Exclude,
) -> Result<Vec<Holding>> {
    let (from, until) = (window.0.max(now), window.1);
    let mut out = Vec::new();
    for r in store::holdings::overlapping(conn, gpu_type, from, until)? {
        if exclude.reservation.is_some_and(|(id, _)| id == r.id) {
            continue;
        }
        out.push(Holding {
            tenant_id: r.tenant_id,
            start: r.start_time,
            end: Some(r.end_time),
            pool: r.pool_nodes,
            on_demand: r.on_demand_nodes,
            unreserved_cluster: false,
            is_reservation: true,
        });
    }
    for c in store::holdings::clusters(conn, gpu_type)? {
        if exclude.cluster == Some(c.id.as_str()) {
            continue;
        }
        let reservation_end = match (exclude.reservation, c.reservation_id.as_deref()) {
            (Some((id, new_end)), Some(rid)) if id == rid => Some(new_end),
            _ => c.reservation_end,
        };
        let live_end = reservation_end.filter(|&end| end > now);
        // Open-ended: it overlaps the window unless it starts after it.
        let start = live_end.unwrap_or(now);
        if until.is_some_and(|u| start >= u) {
            continue;
        }
        out.push(Holding {
            tenant_id: c.tenant_id,
            start,
            end: None,
            pool: c.pool,
            on_demand: c.on_demand,
            unreserved_cluster: live_end.is_none(),
            is_reservation: false,
        });
    }
    Ok(out)
}

pub fn node_counts(conn: &impl AsConn, gpu_type: &str) -> Result<(i64, i64)> {
    store::nodes::counts(conn, gpu_type).map_err(Error::from)
}

pub fn capacity(conn: &impl AsConn, gpu_type: &str, holdings: &[Holding]) -> Result<Capacity> {
    let (pool_nodes, on_demand_nodes) = node_counts(conn, gpu_type)?;
    let span = |h: &Holding, amount: i64| Span {
        start: h.start,
        end: h.end,
        amount,
    };
    Ok(Capacity {
        pool_nodes,
        on_demand_nodes,
        pool_used: holdings.iter().map(|h| span(h, h.pool)).collect(),
        on_demand_used: holdings.iter().map(|h| span(h, h.on_demand)).collect(),
    })
}

/// A tenant's GPU demand over time, from its holdings.
pub fn demand(holdings: &[Holding], tenant_id: &str, gpus_per_node: i64) -> Vec<Span> {
    holdings
        .iter()
        .filter(|h| h.tenant_id == tenant_id)
        .map(|h| Span {
            start: h.start,
            end: h.end,
            amount: (h.pool + h.on_demand) * gpus_per_node,
        })
        .collect()
}

/// The store's quota limit for a tenant and model, for the rules.
pub fn limit(
    conn: &impl AsConn,
    tenant_id: &str,
    gpu_type: &str,
) -> Result<Option<crate::rules::Limit>> {
    Ok(
        store::quotas::for_model(conn, tenant_id, gpu_type)?.map(|q| crate::rules::Limit {
            gpus: q.gpus,
            burst_gpus: q.burst_gpus,
        }),
    )
}
