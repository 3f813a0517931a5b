//! Fair sharing of idle pool capacity (issue 42): what each tenant may lend of its idle
//! guarantee (`lending_limit_gpus`), and the weighted fair-share order (`weight`) in which
//! capacity is taken back from borrowers and handed to tenants that wait for it.
//!
//! A tenant's *idle guarantee* of a model is its guaranteed GPUs less the pool GPUs it
//! holds now. With a lending limit, the part of that idle guarantee past the limit stays
//! free for the tenant: no other tenant's cluster is admitted onto it. A tenant's
//! *weighted share* is the pool GPUs it holds now beyond its guarantee, divided by its
//! weight; take-back shrinks the borrower with the highest share first, one node at a
//! time, and when fewer on-demand nodes are free than the preempted clusters may take in
//! their place, those with the lowest share after the take-back get them first.
//!
//! Pool nodes come back from preemptible clusters when a reservation window starts, and
//! when an owner creates or grows a guaranteed cluster within its idle guarantee while
//! the free pool is short (`take_back::for_owner`: only other tenants' nodes beyond
//! their own guarantees, [`beyond_guarantee`]; burst never preempts).
//!
//! Why two tenants cannot preempt each other in a loop: no take-back causes another.
//! A preemptible cluster is admitted onto nodes free now and lendable and never takes
//! nodes from anyone; a reservation takes only from preemptible clusters; an owner takes
//! back only while below its guarantee and only up to it (so it borrows nothing after),
//! and leaves every victim at or above the victim's own guarantee (so it has nothing to
//! reclaim). Within one take-back the victim is always a borrower with the highest
//! share, and giving back a node lowers only its share: a node once taken back is not
//! taken from a borrower with a lower share than one left untouched, so the same set of
//! borrowers is never reshuffled back and forth by the order itself.

use std::cmp::Ordering;
use std::collections::HashMap;

use gpufleet_sql::AsConn;

use super::Holding;
use crate::cluster_status::CHANGING;
use crate::error::Result;
use crate::store::{self, clusters::ClusterRow, nodes::POOL};

/// One tenant's quota of a model as fair sharing sees it, with what it holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub tenant_id: String,
    pub tenant_name: String,
    /// Guaranteed GPUs (the quota's `gpus`).
    pub guaranteed: i64,
    /// Pool GPUs the tenant holds now (clusters and reservations).
    pub held: i64,
    pub weight: i64,
    /// `lending_limit_gpus`: None, no limit.
    pub lending_limit: Option<i64>,
}

impl Share {
    /// Guaranteed GPUs the tenant does not hold now.
    pub fn idle(&self) -> i64 {
        (self.guaranteed - self.held).max(0)
    }

    /// Of the idle guarantee, what its lending limit keeps from other tenants.
    pub fn kept(&self) -> i64 {
        self.lending_limit
            .map_or(0, |limit| (self.idle() - limit).max(0))
    }

    /// Pool GPUs held beyond the guarantee: what the tenant borrows.
    pub fn borrowed(&self) -> i64 {
        (self.held - self.guaranteed).max(0)
    }
}

/// Orders two (borrowed GPUs, weight) shares exactly (no division): `a` above `b` is
/// Greater.
pub fn compare_shares(a: (i64, i64), b: (i64, i64)) -> Ordering {
    let left = i128::from(a.0) * i128::from(b.1.max(1));
    let right = i128::from(b.0) * i128::from(a.1.max(1));
    left.cmp(&right)
}

/// Every quota of `gpu_type` with the pool GPUs its tenant holds at `t` (from `held`,
/// the model's holdings): one pass over the holdings, one query for the quotas. The
/// tenant's name is loaded only where a message may name it (a lending limit that keeps
/// GPUs idle, or GPUs borrowed); it is empty otherwise.
pub fn shares(
    conn: &impl AsConn,
    gpu_type: &str,
    held: &[Holding],
    t: i64,
    gpus_per_node: i64,
) -> Result<Vec<Share>> {
    let mut pool_now: HashMap<&str, i64> = HashMap::new();
    for h in held
        .iter()
        .filter(|h| h.start <= t && h.end.is_none_or(|e| e > t))
    {
        *pool_now.entry(h.tenant_id.as_str()).or_default() += h.pool;
    }
    let mut out = Vec::new();
    for q in store::quotas::of_model(conn, gpu_type)? {
        let nodes = pool_now.get(q.tenant_id.as_str()).copied().unwrap_or(0);
        let mut share = Share {
            tenant_name: String::new(),
            guaranteed: q.gpus,
            held: nodes.saturating_mul(gpus_per_node),
            weight: q.weight,
            lending_limit: q.lending_limit_gpus,
            tenant_id: q.tenant_id,
        };
        if share.kept() > 0 || share.borrowed() > 0 {
            share.tenant_name = tenant_name(conn, &share.tenant_id)?;
        }
        out.push(share);
    }
    Ok(out)
}

/// A tenant's name for a message (its id when it is gone).
pub fn tenant_name(conn: &impl AsConn, tenant_id: &str) -> Result<String> {
    Ok(store::tenants::get(conn, tenant_id)?.map_or_else(|| tenant_id.to_string(), |t| t.name))
}

/// What stops a borrower from taking idle pool GPUs: the free GPUs now, and what other
/// tenants' lending limits keep of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lendable {
    /// Pool GPUs free now.
    pub free: i64,
    /// Tenants (other than the borrower) whose lending limit keeps some of their idle
    /// guarantee: (share, GPUs kept).
    pub keeping: Vec<(Share, i64)>,
}

impl Lendable {
    /// What `borrower` may be given of the `free` pool GPUs now under the others' limits.
    pub fn of(free: i64, shares: &[Share], borrower: &str) -> Self {
        let keeping = shares
            .iter()
            .filter(|s| s.tenant_id != borrower && s.kept() > 0)
            .map(|s| (s.clone(), s.kept()))
            .collect();
        Self { free, keeping }
    }

    /// GPUs the lending limits keep idle.
    pub fn kept(&self) -> i64 {
        self.keeping.iter().map(|(_, k)| k).sum()
    }

    /// Free GPUs the borrower may take.
    pub fn gpus(&self) -> i64 {
        (self.free - self.kept()).max(0)
    }

    /// The lending limits that keep GPUs idle, in words.
    pub fn limits_text(&self) -> String {
        let each: Vec<String> = self
            .keeping
            .iter()
            .map(|(s, k)| {
                format!(
                    "tenant '{}' lends at most {} of its {} idle guaranteed GPUs (lending_limit_gpus = {}), keeping {k}",
                    s.tenant_name,
                    s.lending_limit.unwrap_or(0).min(s.idle()),
                    s.idle(),
                    s.lending_limit.unwrap_or(0)
                )
            })
            .collect();
        each.join("; ")
    }
}

/// A tenant whose preemptible clusters hold pool nodes, for take-back.
#[derive(Debug, Clone)]
pub struct Borrower {
    pub tenant_id: String,
    /// Pool GPUs held beyond the guarantee (see [`Share::borrowed`]).
    pub borrowed: i64,
    pub weight: i64,
    /// Its preemptible clusters that may give nodes back now, newest first, with the
    /// pool nodes each holds.
    pub clusters: Vec<(String, i64)>,
}

/// The tenants whose preemptible clusters of `gpu_type` hold pool nodes that may go
/// back now (a cluster a request is changing is left to the next take-back), with their
/// shares from `shares`: each with its clusters newest first (among equal shares, the
/// last to come gives back first) and the pool nodes each holds; and those clusters' rows.
pub fn borrowers(
    conn: &impl AsConn,
    gpu_type: &str,
    shares: &[Share],
) -> Result<(Vec<Borrower>, Vec<ClusterRow>)> {
    let mut borrowers: Vec<Borrower> = Vec::new();
    let mut rows: Vec<ClusterRow> = Vec::new();
    for (cluster_id, _) in store::preemption::holding_pool(conn, gpu_type)? {
        let Some(cluster) = store::clusters::get(conn, &cluster_id)? else {
            continue;
        };
        if CHANGING.contains(&cluster.status.as_str()) {
            continue;
        }
        let pool = store::nodes::list(conn, None, Some(&cluster.id))?
            .iter()
            .filter(|n| n.capacity == POOL)
            .count() as i64;
        let i = match borrowers
            .iter()
            .position(|b| b.tenant_id == cluster.tenant_id)
        {
            Some(i) => i,
            None => {
                let share = shares.iter().find(|s| s.tenant_id == cluster.tenant_id);
                borrowers.push(Borrower {
                    tenant_id: cluster.tenant_id.clone(),
                    borrowed: share.map_or(0, Share::borrowed),
                    weight: share.map_or(1, |s| s.weight),
                    clusters: Vec::new(),
                });
                borrowers.len() - 1
            }
        };
        borrowers[i].clusters.push((cluster.id.clone(), pool));
        rows.push(cluster);
    }
    Ok((borrowers, rows))
}

/// What an owner (`owner`, a tenant taking back its own idle guarantee) may take from
/// `borrowers`: only other tenants' pool nodes beyond their own guarantees, whole nodes
/// (`borrowed / gpus_per_node`, rounded down), from each one's newest clusters first. A
/// tenant at or below its guarantee gives the owner nothing, so an owner's take-back
/// never leaves a borrower short of its own guarantee.
pub fn beyond_guarantee(
    borrowers: Vec<Borrower>,
    owner: &str,
    gpus_per_node: i64,
) -> Vec<Borrower> {
    borrowers
        .into_iter()
        .filter(|b| b.tenant_id != owner && b.borrowed > 0)
        .map(|mut b| {
            let mut left = b.borrowed / gpus_per_node.max(1);
            for (_, nodes) in &mut b.clusters {
                *nodes = (*nodes).min(left);
                left -= *nodes;
            }
            b
        })
        .collect()
}

/// Pool nodes `borrowers` hold in their clusters.
pub fn nodes_held(borrowers: &[Borrower]) -> i64 {
    borrowers
        .iter()
        .flat_map(|b| b.clusters.iter().map(|(_, n)| n))
        .sum()
}

/// Which clusters give back `nodes` pool nodes, in weighted fair-share order: each node
/// comes from the borrower with the highest borrowed GPUs / weight at that moment (ties:
/// the borrower listed first), from its newest cluster that still holds one; giving it
/// back lowers that borrower's share by `gpus_per_node`. Returns (cluster id, nodes) in
/// the order clusters were first picked; fewer nodes when the borrowers hold fewer.
pub fn take_back_order(
    mut borrowers: Vec<Borrower>,
    nodes: i64,
    gpus_per_node: i64,
) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for _ in 0..nodes.max(0) {
        let mut best: Option<usize> = None;
        for (i, b) in borrowers.iter().enumerate() {
            if !b.clusters.iter().any(|(_, n)| *n > 0) {
                continue;
            }
            let higher = best.is_none_or(|j| {
                let o = &borrowers[j];
                compare_shares((b.borrowed, b.weight), (o.borrowed, o.weight)) == Ordering::Greater
            });
            if higher {
                best = Some(i);
            }
        }
        let Some(i) = best else { break };
        let b = &mut borrowers[i];
        let Some(c) = b.clusters.iter_mut().find(|(_, n)| *n > 0) else {
            break;
        };
        c.1 -= 1;
        b.borrowed -= gpus_per_node;
        match out.iter_mut().find(|(id, _)| *id == c.0) {
            Some(picked) => picked.1 += 1,
            None => out.push((c.0.clone(), 1)),
        }
    }
    out
}

/// How `available` replacement nodes are shared among victims that want `wants[i].0`
/// each, with their tenant's (borrowed GPUs, weight) after the take-back: the lowest
/// weighted share first (ties in the victims' order), each given what it wants while any
/// are left. Returns the grants in the victims' order.
pub fn replacement_grants(wants: &[(i64, (i64, i64))], available: i64) -> Vec<i64> {
    let mut by_share: Vec<usize> = (0..wants.len()).collect();
    by_share.sort_by(|&i, &j| compare_shares(wants[i].1, wants[j].1));
    let mut grants = vec![0; wants.len()];
    let mut left = available.max(0);
    for i in by_share {
        let granted = wants[i].0.max(0).min(left);
        grants[i] = granted;
        left -= granted;
    }
    grants
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(tenant: &str, guaranteed: i64, held: i64, limit: Option<i64>) -> Share {
        Share {
            tenant_id: tenant.into(),
            tenant_name: tenant.into(),
            guaranteed,
            held,
            weight: 1,
            lending_limit: limit,
        }
    }

    #[test]
    fn a_lending_limit_keeps_the_rest_of_the_idle_guarantee() {
        // Guaranteed 16, holds 8: 8 idle; lends at most 2, keeps 6.
        let a = share("a", 16, 8, Some(2));
        assert_eq!((a.idle(), a.kept(), a.borrowed()), (8, 6, 0));
        // No limit keeps nothing; a limit above the idle guarantee keeps nothing.
        assert_eq!(share("a", 16, 8, None).kept(), 0);
        assert_eq!(share("a", 16, 8, Some(10)).kept(), 0);
        // Holding past the guarantee: nothing idle, 8 borrowed.
        let over = share("a", 16, 24, Some(0));
        assert_eq!((over.idle(), over.kept(), over.borrowed()), (0, 0, 8));
    }

    #[test]
    fn a_borrower_gets_the_free_gpus_less_what_others_keep_but_not_its_own() {
        // 32 free: a keeps all 16 idle (limit 0), c keeps 8 - 4 = 4, b's own limit
        // does not count against b.
        let shares = [
            share("a", 16, 0, Some(0)),
            share("b", 8, 0, Some(0)),
            share("c", 8, 0, Some(4)),
        ];
        let lendable = Lendable::of(32, &shares, "b");
        assert_eq!((lendable.kept(), lendable.gpus()), (20, 12));
        assert_eq!(
            lendable.limits_text(),
            "tenant 'a' lends at most 0 of its 16 idle guaranteed GPUs (lending_limit_gpus = 0), keeping 16; tenant 'c' lends at most 4 of its 8 idle guaranteed GPUs (lending_limit_gpus = 4), keeping 4"
        );
        assert_eq!(Lendable::of(8, &shares, "b").gpus(), 0);
    }

    #[test]
    fn shares_compare_exactly_by_borrowed_per_weight() {
        assert_eq!(compare_shares((16, 1), (24, 3)), Ordering::Greater); // 16 > 8
        assert_eq!(compare_shares((8, 1), (24, 3)), Ordering::Equal);
        assert_eq!(compare_shares((0, 1000), (1, 1000)), Ordering::Less);
    }

    fn borrower(tenant: &str, borrowed: i64, weight: i64, clusters: &[(&str, i64)]) -> Borrower {
        Borrower {
            tenant_id: tenant.into(),
            borrowed,
            weight,
            clusters: clusters.iter().map(|(c, n)| (c.to_string(), *n)).collect(),
        }
    }

    #[test]
    fn take_back_shrinks_the_borrower_furthest_above_its_weighted_share_first() {
        // 8 GPUs a node. a borrows 32 with weight 1 (share 32), b borrows 48 with weight 3
        // (share 16). Taking 3 nodes: a (32 -> 24), a (24 -> 16), then a tie at 16 goes to
        // a, listed first (16 -> 8).
        let borrowers = vec![
            borrower("a", 32, 1, &[("a1", 4)]),
            borrower("b", 48, 3, &[("b1", 6)]),
        ];
        assert_eq!(
            take_back_order(borrowers.clone(), 3, 8),
            vec![("a1".to_string(), 3)]
        );
        // A fourth node: a is at 8, b at 16: b gives one.
        assert_eq!(
            take_back_order(borrowers, 4, 8),
            vec![("a1".to_string(), 3), ("b1".to_string(), 1)]
        );
    }

    #[test]
    fn scarce_replacements_go_to_the_lowest_weighted_share_first() {
        // Three victims want 2, 1 and 2 on-demand nodes; 3 are free. Shares after the
        // take-back: 16/1, 8/4 = 2, 0/1: the third (0) gets 2, the second (2) gets 1, the
        // first none. One that does not want any gets none whatever its share.
        let wants = [(2, (16, 1)), (1, (8, 4)), (2, (0, 1)), (0, (-8, 1))];
        assert_eq!(replacement_grants(&wants, 3), vec![0, 1, 2, 0]);
        assert_eq!(replacement_grants(&wants, 9), vec![2, 1, 2, 0]);
        assert_eq!(replacement_grants(&wants, 0), vec![0, 0, 0, 0]);
    }

    #[test]
    fn take_back_takes_a_borrowers_newest_cluster_first_and_stops_when_none_hold_nodes() {
        let borrowers = vec![
            borrower("a", 8, 1, &[("a2", 1), ("a1", 2)]),
            borrower("b", 0, 1, &[("b1", 1)]),
        ];
        // a (8) first, from its newest a2; then a tie at 0 goes to a, listed first (a1);
        // then b (0 against a's -8); then a1's last node (b holds none); then none is left.
        assert_eq!(
            take_back_order(borrowers, 9, 8),
            vec![
                ("a2".to_string(), 1),
                ("a1".to_string(), 2),
                ("b1".to_string(), 1)
            ]
        );
    }
}
