//! Cluster scheduling: which nodes a cluster gets (and gives back), the MIG changes that
//! brings, its status around a change, settling changes a restart cut short, and
//! replacing unreachable nodes.

use rusqlite::Connection;

use super::reservations::held_by_clusters;
use super::{capacity, demand, gpus_per_node, holdings, Exclude};
use crate::error::{Error, Result};
use crate::rules::{self, QuotaSubject, Span};
use crate::state::{now, rfc3339, AppState};
use crate::store::{
    self,
    clusters::ClusterRow,
    nodes::{NodeRow, NODE_UNREACHABLE, ON_DEMAND, POOL},
};
use crate::volumes;

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

/// What scaling to `cluster.node_count` does: nodes assigned now (scale up, inside the
/// caller's transaction), or the highest-numbered nodes to release once their GPUs are
/// back to whole (scale down).
#[derive(Default)]
pub struct Scaling {
    pub added: Vec<NodeRow>,
    pub to_release: Vec<NodeRow>,
}

pub fn scale(
    conn: &Connection,
    tenant_name: &str,
    cluster: &ClusterRow,
    t: i64,
) -> Result<Scaling> {
    let mut current = store::nodes::list(conn, None, Some(&cluster.id))?;
    let target = cluster.node_count as usize;
    let mut out = Scaling::default();
    if target > current.len() {
        for n in nodes_to_add(conn, tenant_name, cluster, current.len(), t)? {
            if !store::nodes::assign(conn, &n.id, &cluster.id)? {
                return Err(Error::Precondition(format!(
                    "node {} was taken by another cluster; retry",
                    n.hostname
                )));
            }
            out.added.push(n);
        }
    } else {
        current.sort_by(|a, b| b.hostname.cmp(&a.hostname));
        out.to_release = current.drain(..current.len() - target).collect();
    }
    Ok(out)
}

/// The MIG changes that take the cluster's nodes (less `to_release`) to its layout and
/// `to_release` back to whole GPUs. Unreachable nodes being released are left out: their
/// agents reset them when they come back, before anyone else can have them.
pub fn layout_changes(
    conn: &Connection,
    cluster: &ClusterRow,
    to_release: &[NodeRow],
) -> Result<Vec<crate::mig::Change>> {
    let keep: Vec<NodeRow> = store::nodes::list(conn, None, Some(&cluster.id))?
        .into_iter()
        .filter(|n| !to_release.iter().any(|r| r.id == n.id))
        .collect();
    let release: Vec<NodeRow> = to_release
        .iter()
        .filter(|n| n.state != NODE_UNREACHABLE)
        .cloned()
        .collect();
    crate::mig::changes(
        conn,
        &cluster.gpu_type,
        &keep,
        &cluster.mig_layout,
        &release,
    )
}

/// Statuses in which a request is already changing the cluster.
pub const CHANGING: [&str; 3] = ["creating", "updating", "deleting"];

pub fn refuse_while_changing(c: &ClusterRow) -> Result<()> {
    if CHANGING.contains(&c.status.as_str()) {
        return Err(Error::Precondition(format!(
            "tenant cluster {} is {} by another request; retry when its status is running",
            c.name,
            match c.status.as_str() {
                "creating" => "being created",
                "updating" => "being updated",
                _ => "being deleted",
            }
        )));
    }
    Ok(())
}

/// Its status once a change is through: degraded while a node is unreachable.
pub fn settled_status(conn: &Connection, cluster_id: &str) -> Result<(String, String)> {
    let down: Vec<String> = store::nodes::list(conn, None, Some(cluster_id))?
        .into_iter()
        .filter(|n| n.state == NODE_UNREACHABLE)
        .map(|n| n.hostname)
        .collect();
    Ok(if down.is_empty() {
        ("running".into(), String::new())
    } else {
        (
            "degraded".into(),
            format!("node(s) {} unreachable", down.join(", ")),
        )
    })
}

/// Takes back a create whose nodes could not be partitioned: nodes released, the
/// cluster, its request id and its storage gone.
pub fn undo_create(conn: &Connection, cluster: &ClusterRow) -> rusqlite::Result<()> {
    for n in store::nodes::list(conn, None, Some(&cluster.id))? {
        store::nodes::release(conn, &n.id)?;
    }
    store::idempotency::forget(conn, &cluster.id)?;
    store::clusters::delete(conn, &cluster.id)?;
    if let Err(e) = volumes::remove(std::path::Path::new(&cluster.storage_path)) {
        tracing::warn!(path = %cluster.storage_path, error = %e, "cannot remove the storage of an undone create");
    }
    Ok(())
}

/// After a restart: settles the changes a stopped control plane left half-way. A create
/// is taken back (its client never got an answer), an update is carried forward (its
/// layout is in the store; agents converge when they register), a delete is finished.
pub fn recover_interrupted(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for c in store::clusters::with_status(&tx, &CHANGING)? {
        tracing::warn!(cluster = %c.name, status = %c.status, "settling a change interrupted by a restart");
        match c.status.as_str() {
            "creating" => undo_create(&tx, &c)?,
            "updating" => {
                let mut held = store::nodes::list(&tx, None, Some(&c.id))?;
                held.sort_by(|a, b| b.hostname.cmp(&a.hostname));
                let extra = held.len().saturating_sub(c.node_count as usize);
                for n in held.iter().take(extra) {
                    store::nodes::release(&tx, &n.id)?;
                }
                store::clusters::set_status(&tx, &c.id, "running", "")?;
            }
            _ => {
                for n in store::nodes::list(&tx, None, Some(&c.id))? {
                    store::nodes::release(&tx, &n.id)?;
                }
                store::idempotency::forget(&tx, &c.id)?;
                store::clusters::delete(&tx, &c.id)?;
                let _ = volumes::remove(std::path::Path::new(&c.storage_path));
            }
        }
    }
    tx.commit()
}

/// Replaces an unreachable node of a cluster from the same source (its reservation, the
/// pool or on-demand) under the same quota and capacity rules as a scale-up. Without a
/// replacement the cluster stays degraded and its status says why.
pub async fn replace_unreachable(state: &AppState, node_id: &str) -> Result<()> {
    let (cluster, dead, added, changes) = {
        let mut conn = state.db();
        let tx = conn.transaction()?;
        let Some(dead) = store::nodes::get(&tx, node_id)? else {
            return Ok(());
        };
        let Some(cluster_id) = dead.cluster_id.clone() else {
            return Ok(());
        };
        let Some(cluster) = store::clusters::get(&tx, &cluster_id)? else {
            return Ok(());
        };
        if CHANGING.contains(&cluster.status.as_str()) {
            return Ok(()); // a request is changing it; try again on the next round
        }
        let tenant = store::tenants::get(&tx, &cluster.tenant_id)?
            .ok_or_else(|| Error::Internal("the cluster's tenant is gone".into()))?;
        store::nodes::release(&tx, &dead.id)?;
        let held = store::nodes::list(&tx, None, Some(&cluster.id))?.len();
        let picked = match nodes_to_add(&tx, &tenant.name, &cluster, held, now()) {
            Ok(p) => p,
            Err(why) => {
                drop(tx); // the dead node stays in the cluster
                let reason = format!(
                    "node {} unreachable; no replacement: {}",
                    dead.hostname, why
                );
                if cluster.status_reason != reason {
                    store::clusters::set_status(&conn, &cluster.id, "degraded", &reason)?;
                    tracing::warn!(cluster = %cluster.name, %reason, "cannot replace an unreachable node");
                }
                return Err(Error::Precondition(reason));
            }
        };
        for n in &picked {
            if !store::nodes::assign(&tx, &n.id, &cluster.id)? {
                return Err(Error::Aborted(format!(
                    "node {} was taken meanwhile; retrying",
                    n.hostname
                )));
            }
        }
        let changes =
            crate::mig::changes(&tx, &cluster.gpu_type, &picked, &cluster.mig_layout, &[])?;
        let names: Vec<&str> = picked.iter().map(|n| n.hostname.as_str()).collect();
        store::clusters::set_status(
            &tx,
            &cluster.id,
            "degraded",
            &format!(
                "replacing unreachable node {} with {}",
                dead.hostname,
                names.join(", ")
            ),
        )?;
        tx.commit()?;
        (cluster, dead, picked, changes)
    };
    // The replacement gets the cluster's driver first, then its layout.
    let failed = if cluster.driver_version.is_empty() {
        Vec::new()
    } else {
        super::drivers::install(state, &added, &cluster.driver_version).await
    };
    let converged = if let Some((n, why)) = failed.first() {
        super::drivers::quarantine(state, &cluster, n, why)?;
        Err(Error::Aborted(format!(
            "replacement {} failed its driver install: {why}",
            n.hostname
        )))
    } else {
        crate::mig::converge(state, &changes).await
    };
    let mut conn = state.db();
    let tx = conn.transaction()?;
    let result = match converged {
        Ok(()) => {
            let (status, reason) = settled_status(&tx, &cluster.id)?;
            store::clusters::set_status(&tx, &cluster.id, &status, &reason)?;
            for n in &added {
                store::events::record(
                    &tx,
                    now(),
                    &cluster.id,
                    &cluster.tenant_id,
                    "node_replaced",
                    &n.hostname,
                    &format!("{} replaces unreachable {}", n.hostname, dead.hostname),
                )?;
            }
            tracing::info!(cluster = %cluster.name, node = %dead.hostname, "replaced an unreachable node");
            Ok(())
        }
        Err(e) => {
            for n in &added {
                store::nodes::release(&tx, &n.id)?;
            }
            store::nodes::assign(&tx, &dead.id, &cluster.id)?;
            let reason = format!(
                "node {} unreachable; its replacement failed: {}",
                dead.hostname, e
            );
            store::clusters::set_status(&tx, &cluster.id, "degraded", &reason)?;
            Err(Error::Aborted(reason))
        }
    };
    tx.commit()?;
    result
}
