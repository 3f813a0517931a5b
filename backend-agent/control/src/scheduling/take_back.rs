//! The preemption loop: every round, takes back from preemptible clusters the pool nodes
//! that started reservation windows need, and gives those clusters replacements where
//! there are any (the rules it follows are `super::preemption`'s).

use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::watch;

use super::sharing::{self, Borrower, Share};
use super::{capacity, holdings, Exclude};
use crate::cluster_status::{settled_status, CHANGING};
use crate::error::{Error, Result};
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

/// One round: every model whose preemptible clusters hold pool nodes.
pub async fn round(state: &AppState) -> Result<()> {
    let models = state
        .read(|conn| Ok::<_, Error>(store::preemption::models(conn)?))
        .await?;
    for gpu_type in models {
        let t = state.now();
        let plan = state
            .apply(move |conn| plan_take_back(conn, &gpu_type, t))
            .await?;
        for work in plan {
            carry_out(state, work).await?;
        }
    }
    Ok(())
}

/// Nodes one preemptible cluster gives back, and what replaces them.
struct TakeBack {
    cluster: ClusterRow,
    taken: Vec<NodeRow>,
    replacements: Vec<NodeRow>,
    changes: Vec<crate::mig::Change>,
    why: String,
}

/// Decides (and records: replacements assigned, clusters "updating") which nodes go back.
fn plan_take_back(tx: &Connection, gpu_type: &str, t: i64) -> Result<Vec<TakeBack>> {
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
    let (order, shares) = fair_share_victims(tx, gpu_type, (&held, gpn), excess, t)?;
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
        let reachable: Vec<NodeRow> = taken
            .iter()
            .filter(|n| n.state != NODE_UNREACHABLE)
            .cloned()
            .collect();
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
/// a request is changing are left to the next round.
fn fair_share_victims(
    tx: &Connection,
    gpu_type: &str,
    (held, gpn): (&[super::Holding], i64),
    excess: i64,
    t: i64,
) -> Result<(Vec<(ClusterRow, i64)>, Shares)> {
    let shares = sharing::shares(tx, gpu_type, held, t, gpn)?;
    let mut borrowers: Vec<Borrower> = Vec::new();
    let mut rows: Vec<ClusterRow> = Vec::new();
    // Newest first: among equal shares, the last to come gives back first.
    for (cluster_id, _) in store::preemption::holding_pool(tx, gpu_type)? {
        let Some(cluster) = store::clusters::get(tx, &cluster_id)? else {
            continue;
        };
        if CHANGING.contains(&cluster.status.as_str()) {
            continue; // a request is changing it; the next round decides
        }
        let pool = store::nodes::list(tx, None, Some(&cluster.id))?
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
/// whole GPUs, then hands the taken nodes back and says what happened.
async fn carry_out(state: &AppState, work: TakeBack) -> Result<()> {
    let TakeBack {
        cluster,
        taken,
        replacements,
        changes,
        why,
    } = work;
    let failed = if cluster.driver_version.is_empty() {
        Vec::new()
    } else {
        super::drivers::install(state, &replacements, &cluster.driver_version).await
    };
    let converged = match failed.first() {
        Some((n, reason)) => Err(Error::Aborted(format!(
            "replacement {} failed its driver install: {reason}",
            n.hostname
        ))),
        None => crate::mig::converge(state, &changes).await,
    };
    let (t, replace_after) = (state.now(), state.agents.replace_after);
    state
        .apply(move |tx| {
            record_take_back(
                tx,
                cluster,
                taken,
                replacements,
                why,
                converged,
                (t, replace_after),
            )
        })
        .await?
}

/// Records what a take-back did: the nodes handed back and the cluster's new size and
/// status, or (when its orders failed) the replacements released again and that failure
/// (inside: the records are kept either way).
fn record_take_back(
    tx: &Connection,
    mut cluster: ClusterRow,
    taken: Vec<NodeRow>,
    replacements: Vec<NodeRow>,
    why: String,
    converged: Result<()>,
    // Now, and how long an unreachable node waits for its replacement (for the status).
    (t, replace_after): (i64, std::time::Duration),
) -> Result<Result<()>> {
    if let Err(e) = converged {
        // Replacements go back; the taken nodes stay until the next round retries.
        for n in &replacements {
            store::nodes::release(tx, &n.id, t)?;
        }
        let (status, _) = settled_status(tx, &cluster.id, replace_after)?;
        store::clusters::set_status(
            tx,
            &cluster.id,
            &status,
            &format!("giving nodes back to a reservation failed ({e}); retrying"),
        )?;
        return Ok(Err(e));
    }
    for n in &taken {
        store::nodes::release(tx, &n.id, t)?;
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
    Ok(Ok(()))
}

#[cfg(test)]
mod sharing_tests;
