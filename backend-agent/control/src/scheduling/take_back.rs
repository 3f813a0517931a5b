//! Taking lent pool nodes back from preemptible clusters, and giving those clusters
//! replacements where there are any (the rules it follows are `super::preemption`'s).
//! Two callers: the preemption loop, which every round takes back what started
//! reservation windows need (a singleton: its writes are fenced by the singletons' lease,
//! `crate::lease`), and an owner's create or scale-up of a guaranteed cluster within its
//! tenant's idle guarantee ([`for_owner`], issue 42), which takes back what it needs in
//! its own request's transaction on the replica serving the request (not a singleton).
//!
//! The loop decides a take-back and records what its orders did in two fenced
//! transactions, with the orders in between. The decision marks each victim with the
//! lease's epoch (`store::take_backs`) and the record clears the mark, so a take-back a
//! former leader decided and never recorded (it lost the lease in between) is found by
//! the next leader's rounds and settled under its own epoch ([`fenced_settle`]): its
//! replacements released, the victim back to its settled status, and the next round
//! decides again. A victim is never recorded twice: the record refuses once its mark
//! is gone.

use std::sync::Arc;

use gpufleet_sql::AsConn;
use tokio::sync::watch;

use super::sharing;
use super::{capacity, holdings, Exclude};
use crate::cluster_status::settled_status;
use crate::error::{Error, Result};
use crate::lease::{Fence, SINGLETONS};
use crate::rules::peak;
use crate::state::{rfc3339, AppState};
use crate::store::{
    self,
    clusters::ClusterRow,
    nodes::{NodeRow, NODE_UNREACHABLE, ON_DEMAND, POOL},
};

/// How often the platform looks for reservation windows that need nodes back.
const EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Takes back, every round, the pool nodes that started reservation windows need.
pub async fn run(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => return,
            _ = tokio::time::sleep(EVERY) => {
                if let Err(e) = round(&state).await {
                    tracing::warn!(error = %e, "taking nodes back from preemptible clusters failed; retrying");
                }
            }
        }
    }
}

/// One round: first the take-backs former leaders left unrecorded, then every model
/// whose preemptible clusters hold pool nodes.
pub async fn round(state: &AppState) -> Result<()> {
    settle_former_leaders(state).await?;
    let models = state
        .read(|conn| Ok::<_, Error>(store::preemption::models(conn)?))
        .await?;
    for gpu_type in models {
        let (t, fence) = (state.now(), Fence::singleton(state.lease().clone()));
        let plan = state
            .apply(move |conn| fenced_plan(&fence, conn, &gpu_type, t))
            .await?;
        for work in plan {
            carry_out(state, work, Fence::singleton(state.lease().clone())).await?;
        }
    }
    Ok(())
}

/// Settles the take-backs decided under an older epoch and never recorded
/// ([`fenced_settle`]); a look on the read pool first, so that a round with none to
/// settle writes nothing.
async fn settle_former_leaders(state: &AppState) -> Result<()> {
    let Some(epoch) = state.lease().epoch() else {
        return Ok(()); // not leading: the fence would refuse, and the loop is stopping
    };
    let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
    let left = state
        .read(move |conn| Ok::<_, Error>(store::take_backs::any_before(conn, epoch)?))
        .await?;
    if !left {
        return Ok(());
    }
    let (now, fence) = (
        (state.now(), state.agents.replace_after),
        Fence::singleton(state.lease().clone()),
    );
    state
        .apply(move |tx| fenced_settle(&fence, tx, now))
        .await?;
    Ok(())
}

/// [`plan_take_back`] behind the singletons' lease: a replica that no longer holds it
/// (or holds an older epoch) decides and writes nothing. Each victim is marked with the
/// epoch that decided it, which its record clears ([`fenced_record`]).
pub(super) fn fenced_plan(
    fence: &Fence,
    tx: &impl AsConn,
    gpu_type: &str,
    t: i64,
) -> Result<Vec<TakeBack>> {
    fence.check(tx)?;
    let mut plan = plan_take_back(tx, gpu_type, t)?;
    let decided_in = match fence.is_singleton() {
        true => store::leases::get(tx, SINGLETONS)?.map(|l| l.epoch),
        false => None,
    };
    if let Some(epoch) = decided_in {
        for work in &mut plan {
            let ids: Vec<String> = work.replacements.iter().map(|n| n.id.clone()).collect();
            store::take_backs::mark(tx, &work.cluster.id, epoch, &ids, t)?;
            work.decided_in = Some(epoch);
        }
    }
    Ok(plan)
}

/// Settles, behind `fence`, the take-backs decided under an epoch older than the one
/// the store's lease holds now and never recorded: the leader that decided each lost the
/// lease before its record. A restart would have settled its victim
/// (`scheduling::clusters::recover_interrupted`: back to its node_count, `running`);
/// this does the same without one, undoing the decision exactly: the replacements it
/// assigned are released (a restart releases the highest-named nodes beyond node_count,
/// which may be a taken one instead), the taken nodes stay (they leave only when a
/// take-back is recorded), the victim's status is its settled one with a reason saying
/// why, and the next round decides the take-back again. A cluster `updating` without a mark (a
/// request's change) is never touched. The names of the clusters settled.
pub(super) fn fenced_settle(
    fence: &Fence,
    tx: &impl AsConn,
    // Now, and how long an unreachable node waits for its replacement (for the status).
    (t, replace_after): (i64, std::time::Duration),
) -> Result<Vec<String>> {
    fence.check(tx)?;
    let Some(epoch) = store::leases::get(tx, SINGLETONS)?.map(|l| l.epoch) else {
        return Ok(Vec::new());
    };
    let mut settled = Vec::new();
    for pending in store::take_backs::decided_before(tx, epoch)? {
        store::take_backs::clear(tx, &pending.cluster_id, pending.epoch)?;
        let Some(cluster) = store::clusters::get(tx, &pending.cluster_id)? else {
            continue;
        };
        if cluster.status != "updating" {
            continue; // settled another way already; nothing of the decision is left
        }
        let mut released = Vec::new();
        for id in &pending.replacements {
            let Some(n) = store::nodes::get(tx, id)? else {
                continue;
            };
            if n.cluster_id.as_deref() == Some(cluster.id.as_str()) {
                store::nodes::release(tx, &n.id, t)?;
                released.push(n.hostname);
            }
        }
        let mut reason = format!(
            "a take-back decided under epoch {} of the singletons' lease was never recorded (its leader lost the lease); settled under epoch {epoch}",
            pending.epoch
        );
        if !released.is_empty() {
            reason.push_str(&format!(
                ", its on-demand replacements {} released",
                released.join(", ")
            ));
        }
        reason.push_str("; the next round takes the nodes back again");
        let (status, down) = settled_status(tx, &cluster.id, replace_after)?;
        if !down.is_empty() {
            reason = format!("{down}; {reason}");
        }
        store::clusters::set_status(tx, &cluster.id, &status, &reason)?;
        tracing::warn!(cluster = %cluster.name, decided_in = pending.epoch, epoch, "settled a take-back a former leader decided and never recorded");
        settled.push(cluster.name);
    }
    Ok(settled)
}

/// An owner's create or scale-up of `cluster` (guaranteed, within its tenant's idle
/// guarantee: `placement::owner_reclaim` says how many nodes) takes `nodes` pool nodes
/// back from other tenants' preemptible clusters in its request's transaction (`owner`:
/// its tenant's name): the taken nodes are released at once, free for the owner's
/// cluster to take in the same transaction; a victim without on-demand replacements is
/// recorded at once (shrunk, `preempted` events naming the owner's tenant and cluster),
/// one with replacements once [`finish`] has brought them up. Not a singleton: it runs on
/// the replica serving the request, and its writes are the request's.
pub fn for_owner(
    tx: &impl AsConn,
    owner: &str,
    cluster: &ClusterRow,
    nodes: i64,
    (t, replace_after): (i64, std::time::Duration),
) -> Result<Reclaimed> {
    let gpu_type = &cluster.gpu_type;
    let held = holdings(tx, gpu_type, t, Exclude::default())?;
    let cap = capacity(tx, gpu_type, &held)?;
    let gpn = super::gpus_per_node(tx, gpu_type)?;
    let why = format!(
        "tenant '{owner}' takes back its lent guarantee for its cluster '{}'",
        cluster.name
    );
    let works = take_back(
        tx,
        (gpu_type, &cap),
        (&held, gpn),
        nodes,
        &why,
        Some(&cluster.tenant_id),
        t,
    )?;
    let mut out = Reclaimed::default();
    let mut each = Vec::new();
    for work in works {
        let names: Vec<&str> = work.taken.iter().map(|n| n.hostname.as_str()).collect();
        each.push(format!(
            "{} from tenant '{}' (preemptible cluster '{}'{})",
            names.join(", "),
            sharing::tenant_name(tx, &work.cluster.tenant_id)?,
            work.cluster.name,
            match work.replacements.len() {
                0 => String::new(),
                n => format!(", which gets {n} on-demand in their place"),
            }
        ));
        if work.replacements.is_empty() {
            record_take_back(tx, work, Ok(()), (t, replace_after))??;
        } else {
            out.pending.push(work);
        }
    }
    if !each.is_empty() {
        out.said = format!(
            "takes back {nodes} {gpu_type} pool {} lent to other tenants, in weighted fair-share order: {}",
            if nodes == 1 { "node" } else { "nodes" },
            each.join("; ")
        );
    }
    Ok(out)
}

/// Brings up the on-demand replacements an owner's take-back gave its victims and
/// records them ([`for_owner`]), after the request committed; a failure shrinks the
/// victim instead and is logged.
pub async fn finish(state: &AppState, reclaimed: Reclaimed) {
    for work in reclaimed.pending {
        let name = work.cluster.name.clone();
        if let Err(e) = carry_out(state, work, Fence::request()).await {
            tracing::warn!(cluster = %name, error = %e, "a preempted cluster's on-demand replacements failed; it shrank instead");
        }
    }
}

/// Nodes one preemptible cluster gives back, and what replaces them.
pub struct TakeBack {
    pub(super) cluster: ClusterRow,
    pub(super) taken: Vec<NodeRow>,
    pub(super) replacements: Vec<NodeRow>,
    changes: Vec<crate::mig::Change>,
    pub(super) why: String,
    /// The taken nodes left the cluster when the take-back was planned (an owner's:
    /// they went to its cluster in the same transaction); else when it is recorded.
    handed_over: bool,
    /// The lease's epoch that decided it, for the preemption loop's (marked in the
    /// store until recorded); None for an owner's.
    decided_in: Option<i64>,
}

/// What an owner's create or scale-up took back ([`for_owner`]): the victims still to
/// get their on-demand replacements (carried out by [`finish`] after the request's
/// commit), and in words, for a dry run's answer.
#[derive(Default)]
pub struct Reclaimed {
    pending: Vec<TakeBack>,
    /// "takes back 1 H100-80GB pool node from tenant 'team-b' (cluster 'b1': 1) ...";
    /// empty when nothing was taken back.
    pub said: String,
}

/// Decides (and records: replacements assigned, clusters "updating") which nodes go back.
pub(super) fn plan_take_back(tx: &impl AsConn, gpu_type: &str, t: i64) -> Result<Vec<TakeBack>> {
    let held = holdings(tx, gpu_type, t, Exclude::default())?;
    let cap = capacity(tx, gpu_type, &held)?;
    // Everything that holds pool nodes now, preemptible clusters included.
    let excess = peak(&cap.pool_used, t, Some(t + 1)) - cap.pool_nodes;
    if excess <= 0 {
        return Ok(Vec::new());
    }
    let why = match held
        .iter()
        .filter(|h| h.is_reservation && h.start <= t && h.end.is_some_and(|e| e > t))
        .max_by_key(|h| h.start)
    {
        None => "reservations need the pool nodes back".to_string(),
        Some(h) => format!(
            "a reservation window from {} to {} (tenant '{}') needs the pool nodes back",
            rfc3339(h.start),
            h.end.map_or_else(String::new, rfc3339),
            sharing::tenant_name(tx, &h.tenant_id)?
        ),
    };
    let gpn = super::gpus_per_node(tx, gpu_type)?;
    take_back(tx, (gpu_type, &cap), (&held, gpn), excess, &why, None, t)
}

/// Takes `nodes` pool nodes of `gpu_type` back from preemptible clusters in weighted
/// fair-share order and records the decision (replacements assigned, victims
/// "updating"). `owner`: a tenant taking back its own idle guarantee, which takes only
/// from other tenants' nodes beyond their guarantees and has the taken nodes released
/// now (handed over); None: reservations, whose take-back releases them when recorded.
fn take_back(
    tx: &impl AsConn,
    (gpu_type, cap): (&str, &crate::rules::Capacity),
    (held, gpn): (&[super::Holding], i64),
    nodes: i64,
    why: &str,
    owner: Option<&str>,
    t: i64,
) -> Result<Vec<TakeBack>> {
    let (order, shares) = fair_share_victims(tx, gpu_type, (held, gpn), nodes, owner, t)?;
    // The nodes each victim gives back, and whether on-demand nodes may replace them.
    let mut victims = Vec::new();
    for (cluster, count) in order {
        let mut pool: Vec<NodeRow> = store::nodes::list(tx, None, Some(&cluster.id))?
            .into_iter()
            .filter(|n| n.capacity == POOL)
            .collect();
        pool.sort_by(|a, b| b.hostname.cmp(&a.hostname));
        let taken: Vec<NodeRow> = pool.into_iter().take(count as usize).collect();
        let allow_on_demand = store::preemption::get(tx, &cluster.id)?.unwrap_or(false);
        victims.push((cluster, taken, allow_on_demand));
    }
    let on_demand_left = cap.free_on_demand(t, None);
    let mut free_on_demand = store::nodes::free(tx, gpu_type, ON_DEMAND)?;
    let available = on_demand_left.min(free_on_demand.len() as i64);
    let grants = on_demand_grants(&victims, &shares, gpn, available);
    let mut out = Vec::new();
    for ((cluster, taken, _), granted) in victims.into_iter().zip(grants) {
        let share = shares
            .get(&cluster.tenant_id)
            .map_or_else(String::new, |(text, _, _)| format!("; {text}"));
        let why = format!("{why}{share}");
        let replacements: Vec<NodeRow> = free_on_demand.drain(..granted as usize).collect();
        for n in &replacements {
            if !store::nodes::assign(tx, &n.id, &cluster.id, t)? {
                return Err(Error::Aborted(format!(
                    "node {} was taken meanwhile; retrying",
                    n.hostname
                )));
            }
        }
        // Handed-over nodes are the owner's now: its cluster's layout is theirs to set.
        let reachable: Vec<NodeRow> = taken
            .iter()
            .filter(|n| owner.is_none() && n.state != NODE_UNREACHABLE)
            .cloned()
            .collect();
        if owner.is_some() {
            for n in &taken {
                store::nodes::release(tx, &n.id, t)?;
            }
        }
        let changes =
            crate::mig::changes(tx, gpu_type, &replacements, &cluster.mig_layout, &reachable)?;
        let names: Vec<&str> = taken.iter().map(|n| n.hostname.as_str()).collect();
        store::clusters::set_status(
            tx,
            &cluster.id,
            "updating",
            &format!("giving back {}: {why}", names.join(", ")),
        )?;
        out.push(TakeBack {
            cluster,
            taken,
            replacements,
            changes,
            why,
            handed_over: owner.is_some(),
            decided_in: None,
        });
    }
    Ok(out)
}

/// How many on-demand nodes replace each victim's taken nodes (those that allow it) when
/// `available` are free: with fewer than they want, the lowest weighted share after the
/// take-back is served first (`sharing::replacement_grants`).
fn on_demand_grants(
    victims: &[(ClusterRow, Vec<NodeRow>, bool)],
    shares: &Shares,
    gpn: i64,
    available: i64,
) -> Vec<i64> {
    let wants: Vec<(i64, (i64, i64))> = victims
        .iter()
        .map(|(cluster, taken, allow)| {
            let given: usize = victims
                .iter()
                .filter(|(c, _, _)| c.tenant_id == cluster.tenant_id)
                .map(|(_, taken, _)| taken.len())
                .sum();
            let after = shares
                .get(&cluster.tenant_id)
                .map_or((0, 1), |(_, borrowed, weight)| {
                    (borrowed - given as i64 * gpn, *weight)
                });
            let want = if *allow { taken.len() as i64 } else { 0 };
            (want, after)
        })
        .collect();
    sharing::replacement_grants(&wants, available)
}

/// Per borrowing tenant: its share in words, and its borrowed GPUs and weight before the
/// take-back.
type Shares = std::collections::HashMap<String, (String, i64, i64)>;

/// The preemptible clusters that give back `excess` pool nodes and how many each, in
/// weighted fair-share order (`sharing::take_back_order`: the borrowing tenant furthest
/// above its weighted share first), and each borrowing tenant's share. Clusters
/// a request is changing are left to the next round. `owner`: only other tenants' nodes
/// beyond their guarantees (`sharing::beyond_guarantee`).
fn fair_share_victims(
    tx: &impl AsConn,
    gpu_type: &str,
    (held, gpn): (&[super::Holding], i64),
    excess: i64,
    owner: Option<&str>,
    t: i64,
) -> Result<(Vec<(ClusterRow, i64)>, Shares)> {
    let shares = sharing::shares(tx, gpu_type, held, t, gpn)?;
    let (mut borrowers, mut rows) = sharing::borrowers(tx, gpu_type, &shares)?;
    if let Some(owner) = owner {
        borrowers = sharing::beyond_guarantee(borrowers, owner, gpn);
    }
    let mut texts = Shares::new();
    for b in &borrowers {
        let Some(s) = shares.iter().find(|s| s.tenant_id == b.tenant_id) else {
            continue;
        };
        let name = match s.tenant_name.is_empty() {
            true => sharing::tenant_name(tx, &s.tenant_id)?,
            false => s.tenant_name.clone(),
        };
        let text = format!(
            "taken in weighted fair-share order: tenant '{name}' held {} pool GPUs against {} guaranteed ({} borrowed, weight {})",
            s.held,
            s.guaranteed,
            s.borrowed(),
            s.weight
        );
        texts.insert(b.tenant_id.clone(), (text, b.borrowed, b.weight));
    }
    let order = sharing::take_back_order(borrowers, excess, gpn)
        .into_iter()
        .filter_map(|(id, n)| {
            let i = rows.iter().position(|c| c.id == id)?;
            Some((rows.swap_remove(i), n))
        })
        .collect();
    Ok((order, texts))
}

/// Brings replacements to the cluster's driver and layout and the taken nodes back to
/// whole GPUs, then hands the taken nodes back and says what happened. `fence`: the
/// preemption loop's is a singleton's; an owner's take-back is a request's.
async fn carry_out(state: &AppState, work: TakeBack, fence: Fence) -> Result<()> {
    let failed = if work.cluster.driver_version.is_empty() {
        Vec::new()
    } else {
        super::drivers::install(state, &work.replacements, &work.cluster.driver_version).await
    };
    let converged = match failed.first() {
        Some((n, reason)) => Err(Error::Aborted(format!(
            "replacement {} failed its driver install: {reason}",
            n.hostname
        ))),
        None => crate::mig::converge(state, &work.changes).await,
    };
    let now = (state.now(), state.agents.replace_after);
    state
        .apply(move |tx| fenced_record(&fence, tx, work, converged, now))
        .await?
}

/// [`record_take_back`] behind `fence`, clearing the decision's mark: a former leader
/// records nothing (its victim stays as it was planned, "updating", until the next
/// leader settles it, [`fenced_settle`]), and neither does a record whose take-back was
/// settled meanwhile (its mark is gone).
pub(super) fn fenced_record(
    fence: &Fence,
    tx: &impl AsConn,
    work: TakeBack,
    converged: Result<()>,
    now: (i64, std::time::Duration),
) -> Result<Result<()>> {
    fence.check(tx)?;
    if let Some(epoch) = work.decided_in {
        if !store::take_backs::clear(tx, &work.cluster.id, epoch)? {
            return Err(Error::Precondition(format!(
                "take-back: cluster {}'s take-back decided under epoch {epoch} was settled since; nothing recorded",
                work.cluster.name
            )));
        }
    }
    record_take_back(tx, work, converged, now)
}

/// Records what a take-back did: the nodes handed back and the cluster's new size and
/// status, or (when its orders failed) the replacements released again and that failure
/// (inside: the records are kept either way). A handed-over take-back whose
/// replacements failed shrinks the cluster instead: its taken nodes are the owner's.
fn record_take_back(
    tx: &impl AsConn,
    work: TakeBack,
    converged: Result<()>,
    // Now, and how long an unreachable node waits for its replacement (for the status).
    (t, replace_after): (i64, std::time::Duration),
) -> Result<Result<()>> {
    let TakeBack {
        mut cluster,
        taken,
        mut replacements,
        why,
        handed_over,
        ..
    } = work;
    let mut failure = None;
    if let Err(e) = converged {
        // Replacements go back; the taken nodes stay until the next round retries.
        for n in &replacements {
            store::nodes::release(tx, &n.id, t)?;
        }
        if handed_over {
            replacements.clear();
            failure = Some(e);
        } else {
            let (status, _) = settled_status(tx, &cluster.id, replace_after)?;
            store::clusters::set_status(
                tx,
                &cluster.id,
                &status,
                &format!("giving nodes back to a reservation failed ({e}); retrying"),
            )?;
            return Ok(Err(e));
        }
    }
    if !handed_over {
        for n in &taken {
            store::nodes::release(tx, &n.id, t)?;
        }
    }
    let shrink = (taken.len() - replacements.len()) as i64;
    cluster.node_count -= shrink;
    let left: Vec<&str> = taken.iter().map(|n| n.hostname.as_str()).collect();
    let mut reason = format!("preempted: {} left the cluster ({why})", left.join(", "));
    if !replacements.is_empty() {
        let joined: Vec<&str> = replacements.iter().map(|n| n.hostname.as_str()).collect();
        reason.push_str(&format!(
            "; on-demand {} replaced {}",
            joined.join(", "),
            if shrink == 0 { "them" } else { "some of them" }
        ));
    }
    if let Some(e) = &failure {
        reason.push_str(&format!("; its on-demand replacements failed ({e})"));
    }
    if shrink > 0 {
        reason.push_str(&format!(
            "; the cluster shrank to {} nodes",
            cluster.node_count
        ));
    }
    let (status, down) = settled_status(tx, &cluster.id, replace_after)?;
    cluster.status = status;
    cluster.status_reason = if down.is_empty() {
        reason
    } else {
        format!("{down}; {reason}")
    };
    store::clusters::update(tx, &cluster)?;
    for (i, n) in taken.iter().enumerate() {
        let what = match replacements.get(i) {
            Some(r) => format!("replaced by on-demand node {}", r.hostname),
            None => "the cluster shrinks".to_string(),
        };
        store::events::record(
            tx,
            t,
            &cluster.id,
            &cluster.tenant_id,
            "preempted",
            &n.hostname,
            &format!("pool node taken back: {why}; {what}"),
        )?;
    }
    for (i, n) in replacements.iter().enumerate() {
        store::events::record(
            tx,
            t,
            &cluster.id,
            &cluster.tenant_id,
            "allocated",
            &n.hostname,
            &format!(
                "on-demand node allocated to the cluster in place of preempted {}",
                taken[i].hostname
            ),
        )?;
    }
    tracing::info!(cluster = %cluster.name, taken = taken.len(), replaced = replacements.len(), "took pool nodes back from a preemptible cluster");
    Ok(failure.map_or(Ok(()), Err))
}

#[cfg(test)]
mod tests;
