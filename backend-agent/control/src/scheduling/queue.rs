//! Creates that wait for capacity (issue 42): why a create that does not fit now may
//! wait (`waiting for quota`, `waiting for capacity`) or never fits (`exceeds quota`),
//! and the weighted fair-share order in which waiting clusters are admitted.
//!
//! The order: among the clusters waiting for one GPU model, the next is the one whose
//! tenant's *share after admission*, (pool GPUs it holds beyond its guarantee + the GPUs
//! the cluster asks) / its quota's weight, is lowest; ties go to the one waiting longest.
//! Every admission raises its tenant's share, so a tenant with weight 3 gets about three
//! clusters of a size for every one of a weight-1 tenant while both wait. What it does
//! not promise: a tenant whose share stays higher (a weight-1 tenant against a weight-3
//! tenant that keeps asking for more) waits for as long as the other keeps a lower share
//! by asking; the wait is bounded only by its `wait_seconds`, after which the create is
//! deleted and says why. A cluster that cannot fit blocks the ones after it of the same
//! model (no smaller request overtakes it), so the first in order is never starved by
//! later ones that fit.

use std::cmp::Ordering;
use std::collections::HashMap;

use gpufleet_sql::AsConn;

use super::{capacity, demand, gpus_per_node, holdings, Exclude};
use crate::error::{Error, Result};
use crate::rules::peak;
use crate::store::clusters::ClusterRow;

/// Why a create waits. The text says so with the numbers, and is the queued cluster's
/// `status_reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Its tenant's quota (guaranteed + burst) is held by its other clusters now.
    Quota(String),
    /// The pool (or what other tenants' lending limits leave of it) is short now.
    Capacity(String),
}

impl Wait {
    pub fn reason(&self) -> &str {
        match self {
            Wait::Quota(r) | Wait::Capacity(r) => r,
        }
    }
}

/// Why `cluster` (a pool cluster, not drawing from a reservation) does not fit now: a
/// [`Wait`], or `Err(Error::Precondition)` when waiting cannot help: it asks for more
/// than its tenant's quota could ever give (`exceeds quota`), or more pool nodes than the
/// fleet has (`exceeds capacity`). Nothing is written.
pub fn why_waiting(
    conn: &impl AsConn,
    tenant_name: &str,
    cluster: &ClusterRow,
    t: i64,
) -> Result<Wait> {
    let gpu = &cluster.gpu_type;
    let gpn = gpus_per_node(conn, gpu)?.max(1);
    let asks = cluster.node_count.saturating_mul(gpn);
    let Some(limit) = super::limit(conn, &cluster.tenant_id, gpu)? else {
        return Err(Error::Precondition(format!(
            "node_count: exceeds quota: needs {asks} {gpu} GPUs, tenant '{tenant_name}' has no quota for {gpu} (create a gpu quota first)"
        )));
    };
    if asks > limit.total() {
        return Err(Error::Precondition(format!(
            "node_count: exceeds quota: needs {asks} {gpu} GPUs, more than tenant '{tenant_name}' may ever hold ({} = {} guaranteed + {} burst); waiting cannot help",
            limit.total(),
            limit.gpus,
            limit.burst_gpus
        )));
    }
    let (pool_nodes, _) = super::node_counts(conn, gpu)?;
    if cluster.node_count > pool_nodes {
        return Err(Error::Precondition(format!(
            "node_count: exceeds capacity: needs {} {gpu} pool nodes, the pool has {pool_nodes}; waiting cannot help",
            cluster.node_count
        )));
    }
    let exclude = Exclude {
        cluster: Some(&cluster.id),
        reservation: None,
    };
    let held = holdings(conn, gpu, t, exclude)?;
    let in_use = peak(&demand(&held, &cluster.tenant_id, gpn), t, None);
    if in_use.saturating_add(asks) > limit.total() {
        return Ok(Wait::Quota(format!(
            "waiting for quota: needs {asks} {gpu} GPUs, tenant '{tenant_name}' holds {in_use} of its {} ({} guaranteed + {} burst)",
            limit.total(),
            limit.gpus,
            limit.burst_gpus
        )));
    }
    let cap = capacity(conn, gpu, &held)?;
    let free_now = cap.free_pool(t, None);
    let shares = super::sharing::shares(conn, gpu, &held, t, gpn)?;
    let lendable =
        super::sharing::Lendable::of(free_now.saturating_mul(gpn), &shares, &cluster.tenant_id);
    let usable = free_now.min(lendable.gpus() / gpn);
    Ok(Wait::Capacity(format!(
        "waiting for capacity: needs {} {gpu} nodes ({asks} GPUs), {usable} free for it now ({} GPUs)",
        cluster.node_count,
        usable.saturating_mul(gpn)
    )))
}

/// Where a create's admission leaves its cluster: placed now, or waiting, holding nothing.
pub enum Placed {
    Now(super::clusters::Scaling),
    Waits(Wait),
}

/// A create's admission: `cluster` gets its nodes now (`scale_reclaiming`), or, with a
/// wait (`wait_seconds` > 0) and short only of capacity or burst quota, it waits
/// (everything the attempt wrote is rolled back); otherwise the refusal stands. A cluster
/// drawing from a reservation never waits: its reservation says when it has nodes.
/// `now`: the clock and how soon unreachable nodes are replaced (for victims' statuses).
pub fn place_or_wait(
    conn: &impl AsConn,
    tenant_name: &str,
    cluster: &ClusterRow,
    (t, replace_after): (i64, std::time::Duration),
    wait_seconds: i64,
) -> Result<Placed> {
    let attempt = gpufleet_sql::Savepoint::begin(conn.as_conn())?;
    match super::clusters::scale_reclaiming(&attempt, tenant_name, cluster, t, replace_after) {
        Ok(scaling) => {
            attempt.commit()?;
            Ok(Placed::Now(scaling))
        }
        Err(Error::Precondition(refused))
            if wait_seconds > 0 && cluster.reservation_id.is_none() =>
        {
            drop(attempt); // rolled back
            tracing::debug!(cluster = %cluster.name, %refused, "a create that does not fit now");
            why_waiting(conn, tenant_name, cluster, t).map(Placed::Waits)
        }
        Err(refused) => Err(refused),
    }
}

/// Clusters one tenant may have waiting at once, and the whole fleet: every admission
/// round reads them all in the writer's transaction, and a waiting cluster holds nothing
/// that quotas would bound.
pub const MAX_WAITING_PER_TENANT: i64 = 32;
pub const MAX_WAITING: i64 = 1024;

/// Refuses a new create that would wait past [`MAX_WAITING_PER_TENANT`] or
/// [`MAX_WAITING`] (clusters already waiting are not judged again).
pub fn room_to_wait(conn: &impl AsConn, tenant_name: &str, tenant_id: &str) -> Result<()> {
    let own = crate::store::queue::count(conn, Some(tenant_id))?;
    if own >= MAX_WAITING_PER_TENANT {
        return Err(Error::Precondition(format!(
            "wait_for_capacity: tenant '{tenant_name}' already has {own} clusters waiting for capacity, the most one tenant may; delete one of them or create without waiting"
        )));
    }
    let all = crate::store::queue::count(conn, None)?;
    if all >= MAX_WAITING {
        return Err(Error::Precondition(format!(
            "wait_for_capacity: {all} clusters of the fleet are waiting for capacity, the most it keeps; create without waiting or later"
        )));
    }
    Ok(())
}

/// Records `cluster` (in status "queued") as waiting from `t` for `wait_seconds`, with a
/// `queued` event saying why and until when.
pub fn enqueue(conn: &impl AsConn, cluster: &ClusterRow, t: i64, wait_seconds: i64) -> Result<()> {
    let wait_until = t.saturating_add(wait_seconds.max(1));
    crate::store::queue::insert(
        conn,
        &crate::store::queue::QueuedRow {
            cluster_id: cluster.id.clone(),
            queued_at: t,
            wait_until,
        },
    )?;
    crate::store::events::record(
        conn,
        t,
        &cluster.id,
        &cluster.tenant_id,
        "queued",
        "",
        &format!(
            "{}; waits until {} ({wait_seconds}s), admitted in weighted fair-share order when it fits",
            cluster.status_reason,
            crate::state::rfc3339(wait_until)
        ),
    )?;
    Ok(())
}

/// A queued cluster cannot change: it has nothing to change yet.
pub fn refuse_while_queued(c: &ClusterRow) -> Result<()> {
    if c.status != "queued" {
        return Ok(());
    }
    Err(Error::Precondition(format!(
        "tenant cluster {} is queued ({}): it cannot change before it is admitted; delete it and create it anew instead",
        c.name, c.status_reason
    )))
}

/// Removes a queued cluster (deleted, or its wait ran out): it holds nothing, so its rows
/// go (its wait with it) and an event of `kind` says `message`.
pub fn forget(conn: &impl AsConn, c: &ClusterRow, t: i64, kind: &str, message: &str) -> Result<()> {
    crate::store::idempotency::forget(conn, &c.id)?;
    crate::store::health::forget_cluster(conn, &c.id)?;
    crate::store::clusters::delete(conn, &c.id)?;
    crate::store::events::record(conn, t, &c.id, &c.tenant_id, kind, "", message)?;
    Ok(())
}

/// A queued cluster as the order sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub cluster_id: String,
    pub tenant_id: String,
    /// The GPUs it asks for.
    pub gpus: i64,
    pub queued_at: i64,
    /// Its place in the queue (`store::queue::list`): lower has waited longer, also among
    /// clusters queued in the same second.
    pub position: usize,
}

/// A tenant's standing in the order: pool GPUs it holds beyond its guarantee now, and its
/// quota's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub beyond: i64,
    pub weight: i64,
}

/// The next cluster to admit of `waiting` (all of one GPU model): the lowest (GPUs its
/// tenant holds beyond its guarantee + what it asks) / weight, compared exactly (no
/// division); ties go to the one waiting longest (lowest `position`). A tenant missing
/// from `standings` counts as holding nothing beyond its guarantee, weight 1.
pub fn next(waiting: &[Waiting], standings: &HashMap<String, Standing>) -> Option<usize> {
    let share = |w: &Waiting| {
        let s = standings.get(&w.tenant_id).copied().unwrap_or(Standing {
            beyond: 0,
            weight: 1,
        });
        (s.beyond.saturating_add(w.gpus), s.weight)
    };
    (0..waiting.len()).min_by(|&a, &b| {
        let (wa, wb) = (&waiting[a], &waiting[b]);
        match super::sharing::compare_shares(share(wa), share(wb)) {
            Ordering::Equal => wa.position.cmp(&wb.position),
            other => other,
        }
    })
}

/// Whether a wait that runs until `wait_until` has run out at `now`.
pub fn ran_out(wait_until: i64, now: i64) -> bool {
    now >= wait_until
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue of (id, tenant, queued_at), in its order.
    fn queue(of: &[(&str, &str, i64)]) -> Vec<Waiting> {
        of.iter()
            .enumerate()
            .map(|(position, &(id, tenant, queued_at))| Waiting {
                cluster_id: id.into(),
                tenant_id: tenant.into(),
                gpus: 8,
                queued_at,
                position,
            })
            .collect()
    }

    /// Admits every waiting cluster in order, each raising its tenant's holding.
    fn order(mut queue: Vec<Waiting>, mut standings: HashMap<String, Standing>) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(i) = next(&queue, &standings) {
            let w = queue.remove(i);
            standings
                .entry(w.tenant_id.clone())
                .or_insert(Standing {
                    beyond: 0,
                    weight: 1,
                })
                .beyond += w.gpus;
            out.push(w.cluster_id);
        }
        out
    }

    fn teams(a: (i64, i64), b: (i64, i64)) -> HashMap<String, Standing> {
        HashMap::from([
            (
                "a".to_string(),
                Standing {
                    beyond: a.0,
                    weight: a.1,
                },
            ),
            (
                "b".to_string(),
                Standing {
                    beyond: b.0,
                    weight: b.1,
                },
            ),
        ])
    }

    #[test]
    fn weights_1_and_3_are_admitted_1_to_3_ties_going_to_the_oldest() {
        // a (weight 1) queued first, then b (weight 3), each three 8-GPU clusters; the
        // same when all six were queued in one second (a fast pipeline) and a's ids sort
        // after b's (ids are random UUIDs): a was still queued first.
        for one_second in [false, true] {
            let at = |t: i64| if one_second { 10 } else { t };
            let queue = queue(&[
                ("za1", "a", at(10)),
                ("za2", "a", at(11)),
                ("za3", "a", at(12)),
                ("b1", "b", at(20)),
                ("b2", "b", at(21)),
                ("b3", "b", at(22)),
            ]);
            // b: 8/3, then 16/3, then 24/3 = 8 ties a's 8/1: za1 is older; then b3 (8 < 16).
            let got = order(queue, teams((0, 1), (0, 3)));
            assert_eq!(got, ["b1", "b2", "za1", "b3", "za2", "za3"], "{one_second}");
            // The first four (what a 4-node pool frees) go 1:3.
            let from_b = got[..4].iter().filter(|id| id.starts_with('b')).count();
            assert_eq!((4 - from_b, from_b), (1, 3));
        }
    }

    #[test]
    fn gpus_held_beyond_the_guarantee_count_against_a_tenant() {
        // b already borrows 32 GPUs: 40/3 > 8/1, so a goes first despite its weight.
        let queue = queue(&[("b1", "b", 1), ("a1", "a", 2)]);
        assert_eq!(next(&queue, &teams((0, 1), (32, 3))), Some(1));
        // Without what b holds, b's weight wins.
        assert_eq!(next(&queue, &teams((0, 1), (0, 3))), Some(0));
    }

    #[test]
    fn equal_shares_go_by_place_in_the_queue_not_by_id() {
        // Queued in the same second: x2 was queued first, whatever the ids say.
        let queue = queue(&[("x2", "a", 5), ("x1", "b", 5), ("x0", "a", 6)]);
        assert_eq!(next(&queue, &teams((0, 1), (0, 1))), Some(0));
        assert_eq!(next(&queue[1..], &teams((0, 1), (0, 1))), Some(0));
        assert_eq!(next(&[], &teams((0, 1), (0, 1))), None);
    }

    #[test]
    fn a_wait_runs_out_at_its_end_and_not_before() {
        assert!(!ran_out(1_000, 999));
        assert!(ran_out(1_000, 1_000));
        assert!(ran_out(1_000, 5_000));
    }
}
