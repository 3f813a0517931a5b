//! Drivers on a cluster's nodes: installing the cluster's driver on nodes that join it,
//! and rolling a new driver through its nodes, `max_unavailable` at a time. A node whose
//! install fails (or that reports another version afterwards, or fails the quick health
//! check) is quarantined and replaced from the same source when capacity allows. Every
//! step is an event of the cluster.

use gpufleet_proto::v1;

use super::placement::nodes_to_add;
use crate::error::{Error, Result};
use crate::lease::Fence;
use crate::registry::Outcome;
use crate::state::AppState;
use crate::store::{
    self,
    clusters::ClusterRow,
    nodes::{NodeRow, NODE_BUSY, NODE_QUARANTINED, NODE_READY},
};

/// Records an event of `cluster` (best effort: a failed write is logged, not fatal).
pub async fn event(
    state: &AppState,
    fence: &Fence,
    cluster: &ClusterRow,
    kind: &'static str,
    node: &str,
    message: &str,
) {
    events(state, fence, cluster, vec![Event::new(kind, node, message)]).await;
}

/// One event of a cluster, to record with others in [`events`].
pub struct Event {
    kind: &'static str,
    node: String,
    message: String,
}

impl Event {
    pub fn new(kind: &'static str, node: &str, message: &str) -> Event {
        Event {
            kind,
            node: node.to_string(),
            message: message.to_string(),
        }
    }
}

/// Records `events` of `cluster` in one transaction on the writer thread, so a change to
/// many nodes commits once and no async worker waits on SQLite (best effort, as [`event`]).
/// `fence`: a singleton's records nothing once its replica lost the lease.
pub async fn events(state: &AppState, fence: &Fence, cluster: &ClusterRow, events: Vec<Event>) {
    if events.is_empty() {
        return;
    }
    let (id, tenant) = (cluster.id.clone(), cluster.tenant_id.clone());
    let (clock_now, fence) = (state.now(), fence.clone());
    let recorded = state
        .write(move |sp| -> Result<()> {
            fence.check(&sp)?;
            let t = clock_now;
            for e in &events {
                store::events::record(&sp, t, &id, &tenant, e.kind, &e.node, &e.message)?;
            }
            Ok(sp.commit()?)
        })
        .await;
    if let Err(e) = recorded {
        tracing::error!(cluster = %cluster.name, error = %e, "cannot record events");
    }
}

fn order(version: &str) -> v1::WorkOrder {
    v1::WorkOrder {
        id: uuid::Uuid::new_v4().to_string(),
        epoch: 0, // stamped by Registry::dispatch
        kind: Some(v1::work_order::Kind::InstallDriver(v1::InstallDriver {
            version: version.to_string(),
        })),
    }
}

/// Installs `version` on every node of `nodes` that runs another driver, all at once,
/// and returns the nodes that failed with why. Success is the agent's verified answer
/// and the version its inventory then reports. An install cut short by the agent's
/// restart (answered "interrupted" once the agent is back) is ordered again, under a new
/// order id: the old order is never run twice.
pub async fn install(state: &AppState, nodes: &[NodeRow], version: &str) -> Vec<(NodeRow, String)> {
    let mut pending: Vec<NodeRow> = nodes
        .iter()
        .filter(|n| n.driver_version != version)
        .cloned()
        .collect();
    let mut failed = Vec::new();
    for attempt in 1..=MAX_ATTEMPTS {
        let waits: Vec<_> = pending
            .iter()
            .map(|n| state.agents.dispatch(&n.id, order(version)))
            .collect();
        let mut again = Vec::new();
        for (n, wait) in pending.into_iter().zip(waits) {
            let answer = wait.await;
            if let Ok(o) = &answer {
                crate::counters::work_order(crate::counters::ORDER_DRIVER, o);
                crate::counters::driver_install_check(o);
            }
            let why = match answer {
                Ok(Outcome::Answered(r)) if r.ok => {
                    let reported = r.inventory.map(|i| i.driver_version).unwrap_or_default();
                    if reported == version {
                        continue;
                    }
                    format!("after installing driver {version} it reports {reported}")
                }
                Ok(Outcome::Answered(r))
                    if r.error_kind == "interrupted" && attempt < MAX_ATTEMPTS =>
                {
                    tracing::warn!(node = %n.hostname, "driver install cut short by an agent restart; ordering it again");
                    again.push(n);
                    continue;
                }
                Ok(Outcome::Answered(r)) => r.error,
                Ok(Outcome::Unreachable(why)) => why,
                Err(_) => "the control plane is stopping".into(),
            };
            failed.push((n, why));
        }
        if again.is_empty() {
            break;
        }
        pending = again;
    }
    failed
}

/// Orders per node for one install: the first, and new ones after agent restarts.
const MAX_ATTEMPTS: u32 = 3;

/// Takes a node out of service: quarantined with the reason, out of its cluster.
pub async fn quarantine(
    state: &AppState,
    fence: &Fence,
    cluster: &ClusterRow,
    node: &NodeRow,
    why: &str,
) -> Result<()> {
    let (id, reason, f) = (node.id.clone(), why.to_string(), fence.clone());
    let clock_now = state.now();
    state
        .apply(move |conn| -> Result<()> {
            f.check(conn)?;
            store::nodes::set_state(conn, &id, NODE_QUARANTINED, &reason, clock_now)?;
            store::nodes::release(conn, &id, clock_now)?;
            Ok(())
        })
        .await?;
    tracing::warn!(node = %node.hostname, cluster = %cluster.name, %why, "node quarantined");
    crate::counters::quarantine(&node.gpu_type, crate::counters::CAUSE_DRIVER_INSTALL);
    event(
        state,
        fence,
        cluster,
        "node_quarantined",
        &node.hostname,
        why,
    )
    .await;
    Ok(())
}

/// Replaces a node that left `cluster` with a free one from the same source, brought to
/// the cluster's driver and MIG layout and given the cluster's volume; a replacement that
/// fails its install is quarantined too and the next one tried. The node that left
/// unmounts the volume. Returns the new node's hostname.
pub async fn replace(
    state: &AppState,
    fence: &Fence,
    cluster: &ClusterRow,
    gone: &str,
) -> Result<String> {
    // A replica that cannot send orders takes no node: the refused install would be
    // blamed on it.
    state.agents.refuse_without_epoch()?;
    for _attempt in 0..3 {
        let (cluster_id, f) = (cluster.id.clone(), fence.clone());
        let clock_now = state.now();
        let picked = state
            .write(move |tx| -> Result<Vec<NodeRow>> {
                f.check(&tx)?;
                let c = store::clusters::get(&tx, &cluster_id)?.ok_or_else(|| {
                    Error::NotFound(format!("tenant cluster '{cluster_id}' not found"))
                })?;
                let tenant = store::tenants::get(&tx, &c.tenant_id)?
                    .ok_or_else(|| Error::Internal("the cluster's tenant is gone".into()))?;
                let held = store::nodes::list(&tx, None, Some(&c.id))?.len();
                let picked = nodes_to_add(&tx, &tenant.name, &c, held, clock_now)?;
                for n in &picked {
                    if !store::nodes::assign(&tx, &n.id, &c.id, clock_now)? {
                        return Err(Error::Aborted(format!(
                            "node {} was taken meanwhile",
                            n.hostname
                        )));
                    }
                }
                tx.commit()?;
                Ok(picked)
            })
            .await?;
        let Some(new) = picked.first().cloned() else {
            return Err(Error::Precondition(format!(
                "no free node to replace {gone}"
            )));
        };
        if !cluster.driver_version.is_empty() {
            if let Some((n, why)) = install(state, &picked, &cluster.driver_version).await.pop() {
                quarantine(state, fence, cluster, &n, &why).await?;
                continue;
            }
        }
        let (gpu_type, layout) = (cluster.gpu_type.clone(), cluster.mig_layout.clone());
        let changes = state
            .read(move |conn| crate::mig::changes(conn, &gpu_type, &picked, &layout, &[]))
            .await?;
        crate::mig::converge(state, &changes).await?;
        unmount_left(state, gone).await;
        crate::node_volumes::sync(state, vec![new.id.clone()])
            .await
            .map_err(|e| {
                Error::Aborted(format!(
                    "{} replaces {gone} but cannot mount the cluster's volume: {e}",
                    new.hostname
                ))
            })?;
        event(
            state,
            fence,
            cluster,
            "node_replaced",
            &new.hostname,
            &format!("{} replaces {gone}", new.hostname),
        )
        .await;
        return Ok(new.hostname);
    }
    Err(Error::Aborted(format!(
        "no replacement for {gone}: three candidates failed their driver install"
    )))
}

/// The node named `gone` has left its cluster: it keeps nothing of the cluster's volume.
/// Only logged when it cannot: the node is out of service, and one that is unreachable now
/// unmounts when it rejoins (`mig::mark_reconciled`).
async fn unmount_left(state: &AppState, gone: &str) {
    let hostname = gone.to_string();
    let node = state
        .read(move |conn| Ok::<_, Error>(store::nodes::by_hostname(conn, &hostname)?))
        .await;
    let id = match node {
        Ok(Some(n)) if n.cluster_id.is_none() => n.id,
        Ok(_) => return,
        Err(e) => {
            tracing::error!(node = %gone, error = %e, "cannot look up the node that left");
            return;
        }
    };
    if let Err(e) = crate::node_volumes::sync(state, vec![id]).await {
        tracing::error!(node = %gone, error = %e, "the node that left keeps its cluster's volume");
    }
}

/// Rolls `cluster.driver_version` through its nodes, `max_unavailable` at a time: each
/// node is drained (taken out of service), installed, verified and returned. Returns
/// what went wrong on the way (empty when nothing did); the cluster's nodes all run the
/// driver afterwards unless a replacement was impossible.
pub async fn roll(state: &AppState, cluster: &ClusterRow) -> Result<Vec<String>> {
    state.agents.refuse_without_epoch()?;
    let version = cluster.driver_version.clone();
    let id = cluster.id.clone();
    let nodes = state
        .read(move |conn| Ok::<_, Error>(store::nodes::list(conn, None, Some(&id))?))
        .await?;
    let stale: Vec<NodeRow> = nodes
        .into_iter()
        .filter(|n| n.driver_version != version)
        .collect();
    let step = usize::try_from(cluster.max_unavailable.max(1)).unwrap_or(1);
    // A request's update rolls drivers (a refill asks for no new driver): not fenced.
    let fence = Fence::request();
    let mut problems = Vec::new();
    for chunk in stale.chunks(step) {
        for n in chunk {
            set_node_state(
                state,
                &n.id,
                NODE_BUSY,
                &format!("installing driver {version}"),
            )
            .await?;
            event(
                state,
                &fence,
                cluster,
                "node_draining",
                &n.hostname,
                &format!(
                    "out of service to install driver {version} (was {})",
                    n.driver_version
                ),
            )
            .await;
        }
        // A Slurm cluster's nodes are drained in Slurm first: running jobs finish.
        crate::slurm_clusters::drain_all(
            state,
            cluster,
            chunk,
            &format!("installing driver {version}"),
        )
        .await;
        let failed = install(state, chunk, &version).await;
        for n in chunk {
            if let Some((_, why)) = failed.iter().find(|(f, _)| f.id == n.id) {
                let why = format!("driver {version}: {why}");
                quarantine(state, &fence, cluster, n, &why).await?;
                match replace(state, &fence, cluster, &n.hostname).await {
                    Ok(new) => problems.push(format!(
                        "node {} failed ({why}); quarantined and replaced by {new}",
                        n.hostname
                    )),
                    Err(e) => {
                        let reason = format!(
                            "node {} failed ({why}) and was quarantined; no replacement: {e}",
                            n.hostname
                        );
                        let (id, why) = (cluster.id.clone(), reason.clone());
                        state
                            .apply(move |conn| {
                                Ok::<_, Error>(store::clusters::set_status(
                                    conn, &id, "degraded", &why,
                                )?)
                            })
                            .await?;
                        problems.push(reason);
                    }
                }
                continue;
            }
            set_node_state(state, &n.id, NODE_READY, "").await?;
            crate::slurm_clusters::resume(state, cluster, &n.hostname).await;
            event(
                state,
                &fence,
                cluster,
                "node_returned",
                &n.hostname,
                &format!("driver {version} installed and verified"),
            )
            .await;
        }
    }
    Ok(problems)
}

/// Records a node's state (on the writer thread).
pub(crate) async fn set_node_state(
    state: &AppState,
    node_id: &str,
    to: &'static str,
    why: &str,
) -> Result<()> {
    let (id, why) = (node_id.to_string(), why.to_string());
    let clock_now = state.now();
    state
        .apply(move |conn| Ok::<_, Error>(store::nodes::set_state(conn, &id, to, &why, clock_now)?))
        .await
}
