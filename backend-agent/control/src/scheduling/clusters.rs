//! Cluster scheduling: which nodes a cluster gets (and gives back), the MIG changes that
//! brings, its status around a change, settling changes a restart cut short, and
//! replacing unreachable nodes.

use gpufleet_sql::AsConn;

use super::placement::nodes_to_add;
use crate::cluster_status::{settled_status, CHANGING};
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::store::{
    self,
    clusters::ClusterRow,
    nodes::{NodeRow, NODE_UNREACHABLE},
};
use crate::volumes::Volumes;

/// What scaling to `cluster.node_count` does: nodes assigned now (scale up, inside the
/// caller's transaction), or the highest-numbered nodes to release once their GPUs are
/// back to whole (scale down).
#[derive(Default)]
pub struct Scaling {
    pub added: Vec<NodeRow>,
    pub to_release: Vec<NodeRow>,
    /// What a guaranteed cluster's growth took back from other tenants' preemptible
    /// clusters ([`scale_reclaiming`]).
    pub taken_back: super::take_back::Reclaimed,
}

/// [`scale`] for a create or update request: a guaranteed cluster growing within its
/// tenant's idle guarantee first takes back, in the same transaction, the pool nodes it
/// lacks from other tenants' preemptible clusters (`placement::owner_reclaim`,
/// `take_back::for_owner`); the caller hands `taken_back` to `take_back::finish` after
/// its commit. `replace_after`: for the victims' statuses.
pub fn scale_reclaiming(
    conn: &impl AsConn,
    tenant_name: &str,
    cluster: &ClusterRow,
    t: i64,
    replace_after: std::time::Duration,
) -> Result<Scaling> {
    let current = store::nodes::list(conn, None, Some(&cluster.id))?.len();
    let reclaim = super::placement::owner_reclaim(conn, cluster, current, t)?;
    let taken_back = match reclaim {
        0 => Default::default(),
        n => super::take_back::for_owner(conn, tenant_name, cluster, n, (t, replace_after))?,
    };
    Ok(Scaling {
        taken_back,
        ..scale(conn, tenant_name, cluster, t)?
    })
}

pub fn scale(
    conn: &impl AsConn,
    tenant_name: &str,
    cluster: &ClusterRow,
    t: i64,
) -> Result<Scaling> {
    let mut current = store::nodes::list(conn, None, Some(&cluster.id))?;
    let target = cluster.node_count as usize;
    let mut out = Scaling::default();
    if target > current.len() {
        for n in nodes_to_add(conn, tenant_name, cluster, current.len(), t)? {
            if !store::nodes::assign(conn, &n.id, &cluster.id, t)? {
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
    conn: &impl AsConn,
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

/// Takes back a create whose nodes could not be partitioned: nodes released, the
/// cluster, its request id and its storage gone. A volume that holds data (a kept
/// volume the create attached) stays: nothing the team wrote is deleted by a create.
pub fn undo_create(
    conn: &impl AsConn,
    volumes: &Volumes,
    cluster: &ClusterRow,
    t: i64,
) -> gpufleet_sql::Result<()> {
    for n in store::nodes::list(conn, None, Some(&cluster.id))? {
        store::nodes::release(conn, &n.id, t)?;
    }
    store::idempotency::forget(conn, &cluster.id)?;
    store::clusters::delete(conn, &cluster.id)?;
    let dir = &volumes.dir_of(&cluster.tenant_id, &cluster.name, &cluster.storage_path);
    match volumes.holds_data(dir) {
        Ok(false) => {
            if let Err(e) = volumes.remove(dir) {
                tracing::warn!(path = %cluster.storage_path, error = %e, "cannot remove the storage of an undone create");
            }
        }
        Ok(true) => {
            tracing::warn!(path = %cluster.storage_path, "an undone create leaves its volume, which holds data")
        }
        Err(e) => {
            tracing::warn!(path = %cluster.storage_path, error = %e, "an undone create leaves its volume, which cannot be read")
        }
    }
    Ok(())
}

/// After a restart: settles the changes a stopped control plane left half-way. A create
/// is taken back (its client never got an answer), an update is carried forward (its
/// layout is in the store; agents converge when they register), a delete is finished.
/// `t`: now, when the nodes it releases stop being held.
pub fn recover_interrupted(
    conn: &impl AsConn,
    volumes: &Volumes,
    t: i64,
) -> gpufleet_sql::Result<()> {
    // A transaction of its own where `conn` is in none (on SQLite an outermost savepoint
    // is a `BEGIN DEFERRED`, its release the commit), a savepoint inside the caller's else.
    let tx = gpufleet_sql::Savepoint::begin(conn.as_conn())?;
    for c in store::clusters::with_status(&tx, &CHANGING)? {
        tracing::warn!(cluster = %c.name, status = %c.status, "settling a change interrupted by a restart");
        settle_interrupted(&tx, volumes, &c, t)?;
    }
    tx.commit()
}

/// Settles one cluster `c` left in a changing status by a change nobody carries on (a
/// restart, or a change whose record the store did not take): as
/// [`recover_interrupted`] says.
pub fn settle_interrupted(
    conn: &impl AsConn,
    volumes: &Volumes,
    c: &ClusterRow,
    t: i64,
) -> gpufleet_sql::Result<()> {
    match c.status.as_str() {
        "creating" => undo_create(conn, volumes, c, t)?,
        "updating" => {
            let mut held = store::nodes::list(conn, None, Some(&c.id))?;
            held.sort_by(|a, b| b.hostname.cmp(&a.hostname));
            let extra = held.len().saturating_sub(c.node_count as usize);
            for n in held.iter().take(extra) {
                store::nodes::release(conn, &n.id, t)?;
            }
            store::clusters::set_status(conn, &c.id, "running", "")?;
        }
        "deleting" => {
            for n in store::nodes::list(conn, None, Some(&c.id))? {
                store::nodes::release(conn, &n.id, t)?;
            }
            store::idempotency::forget(conn, &c.id)?;
            store::clusters::delete(conn, &c.id)?;
            if c.storage_retention != "keep" {
                let _ = volumes.remove(&volumes.dir_of(&c.tenant_id, &c.name, &c.storage_path));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Replaces an unreachable node of a cluster from the same source (its reservation, the
/// pool or on-demand) under the same quota and capacity rules as a scale-up. Without a
/// replacement the cluster stays degraded and its status says why.
pub async fn replace_unreachable(state: &AppState, node_id: &str) -> Result<()> {
    /// What the first transaction decided.
    enum Plan {
        Nothing,
        Refused(Error),
        Replace(Box<(ClusterRow, NodeRow, Vec<NodeRow>, Vec<crate::mig::Change>)>),
    }
    let node_id = node_id.to_string();
    let clock_now = state.now();
    let lease = state.lease().clone();
    let plan = state
        .write(move |mut tx| -> Result<Plan> {
            // A singleton's work: a former leader of the singletons' lease replaces
            // nothing (`crate::lease`).
            lease.fence(&tx)?;
            let Some(dead) = store::nodes::get(&tx, &node_id)? else {
                return Ok(Plan::Nothing);
            };
            let Some(cluster_id) = dead.cluster_id.clone() else {
                return Ok(Plan::Nothing);
            };
            let Some(cluster) = store::clusters::get(&tx, &cluster_id)? else {
                return Ok(Plan::Nothing);
            };
            if CHANGING.contains(&cluster.status.as_str()) {
                return Ok(Plan::Nothing); // a request is changing it; try again on the next round
            }
            let tenant = store::tenants::get(&tx, &cluster.tenant_id)?
                .ok_or_else(|| Error::Internal("the cluster's tenant is gone".into()))?;
            store::nodes::release(&tx, &dead.id, clock_now)?;
            let held = store::nodes::list(&tx, None, Some(&cluster.id))?.len();
            let picked = match nodes_to_add(&tx, &tenant.name, &cluster, held, clock_now) {
                Ok(p) => p,
                Err(why) => {
                    tx.rollback()?; // the dead node stays in the cluster
                    let reason = format!(
                        "node {} unreachable; no replacement: {}",
                        dead.hostname, why
                    );
                    if cluster.status_reason != reason {
                        store::clusters::set_status(&tx, &cluster.id, "degraded", &reason)?;
                        tx.commit()?;
                        tracing::warn!(cluster = %cluster.name, %reason, "cannot replace an unreachable node");
                    }
                    return Ok(Plan::Refused(Error::Precondition(reason)));
                }
            };
            for n in &picked {
                if !store::nodes::assign(&tx, &n.id, &cluster.id, clock_now)? {
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
            Ok(Plan::Replace(Box::new((cluster, dead, picked, changes))))
        })
        .await?;
    let (cluster, dead, added, changes) = match plan {
        Plan::Nothing => return Ok(()),
        Plan::Refused(why) => return Err(why),
        Plan::Replace(planned) => *planned,
    };
    // The replacement gets the cluster's driver first, then its layout.
    let failed = if cluster.driver_version.is_empty() {
        Vec::new()
    } else {
        super::drivers::install(state, &added, &cluster.driver_version).await
    };
    let converged = if let Some((n, why)) = failed.first() {
        // Node replacement is the heartbeat watch's: a singleton's write.
        let fence = crate::lease::Fence::singleton(state.lease().clone());
        super::drivers::quarantine(state, &fence, &cluster, n, why).await?;
        Err(Error::Aborted(format!(
            "replacement {} failed its driver install: {why}",
            n.hostname
        )))
    } else {
        crate::mig::converge(state, &changes).await
    };
    // The replacement mounts the cluster's volume like every node of the cluster.
    let converged = match converged {
        Ok(()) => {
            crate::node_volumes::sync(state, added.iter().map(|n| n.id.clone()).collect()).await
        }
        failed => failed,
    };
    let (clock_now, replace_after) = (state.now(), state.agents.replace_after);
    state
        .apply(move |tx| match converged {
            Ok(()) => {
                let (status, reason) = settled_status(tx, &cluster.id, replace_after)?;
                store::clusters::set_status(tx, &cluster.id, &status, &reason)?;
                for n in &added {
                    store::events::record(
                        tx,
                        clock_now,
                        &cluster.id,
                        &cluster.tenant_id,
                        "node_replaced",
                        &n.hostname,
                        &format!("{} replaces unreachable {}", n.hostname, dead.hostname),
                    )?;
                }
                tracing::info!(cluster = %cluster.name, node = %dead.hostname, "replaced an unreachable node");
                Ok(Ok(()))
            }
            Err(e) => {
                for n in &added {
                    store::nodes::release(tx, &n.id, clock_now)?;
                }
                store::nodes::assign(tx, &dead.id, &cluster.id, clock_now)?;
                let reason = format!(
                    "node {} unreachable; its replacement failed: {}",
                    dead.hostname, e
                );
                store::clusters::set_status(tx, &cluster.id, "degraded", &reason)?;
                Ok::<_, Error>(Err(Error::Aborted(reason)))
            }
        })
        .await?
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::recover_interrupted;
    use crate::store;
    use crate::volumes::Volumes;

    const T0: i64 = 1_900_000_000;

    /// Tenant `a`; pool nodes n1 to n4; a create (`c1`: n1), an update down to one node
    /// (`u1`: n2, n3) and a delete (`d1`: n4) a restart cut short, and a running `r1`.
    fn seed() -> (tempfile::TempDir, Connection, Volumes) {
        let dir = tempfile::tempdir().unwrap();
        let conn = store::open(&dir.path().join("state.db")).unwrap();
        conn.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('a', 'team-a', '', '{}', 'ha', 0);
             INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                cuda_version, state)
                 VALUES ('n1', 'n1', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready'),
                        ('n2', 'n2', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready'),
                        ('n3', 'n3', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready'),
                        ('n4', 'n4', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready');
             INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                   storage_gib, status, status_reason, endpoint, credentials,
                                   storage_path, mig_layout)
                 VALUES ('c1', 'a', 'c1', 'kubernetes', 'H100-80GB', 1, 1, 'creating', '', '',
                         '', 'c1', '{}'),
                        ('u1', 'a', 'u1', 'kubernetes', 'H100-80GB', 1, 1, 'updating', '', '',
                         '', 'u1', '{}'),
                        ('d1', 'a', 'd1', 'kubernetes', 'H100-80GB', 1, 1, 'deleting', '', '',
                         '', 'd1', '{}'),
                        ('r1', 'a', 'r1', 'kubernetes', 'H100-80GB', 0, 1, 'running', '', '',
                         '', 'r1', '{}');",
        )
        .unwrap();
        for (node, cluster) in [("n1", "c1"), ("n2", "u1"), ("n3", "u1"), ("n4", "d1")] {
            assert!(store::nodes::assign(&conn, node, cluster, T0 - 60).unwrap());
        }
        let volumes = Volumes::in_data_dir(dir.path().join("volumes"));
        (dir, conn, volumes)
    }

    /// Each cluster (id, status, nodes), and the nodes no cluster holds.
    type State = (Vec<(String, String, Vec<String>)>, Vec<String>);

    fn state(conn: &Connection) -> State {
        let mut clusters = Vec::new();
        for id in ["c1", "u1", "d1", "r1"] {
            if let Some(c) = store::clusters::get(conn, id).unwrap() {
                let mut nodes: Vec<String> = store::nodes::list(conn, None, Some(id))
                    .unwrap()
                    .into_iter()
                    .map(|n| n.hostname)
                    .collect();
                nodes.sort();
                clusters.push((c.id, c.status, nodes));
            }
        }
        let mut free: Vec<String> = store::nodes::free(conn, "H100-80GB", "pool")
            .unwrap()
            .into_iter()
            .map(|n| n.hostname)
            .collect();
        free.sort();
        (clusters, free)
    }

    #[test]
    fn a_restart_takes_back_creates_carries_updates_forward_and_finishes_deletes() {
        let (_dir, conn, volumes) = seed();
        recover_interrupted(&conn, &volumes, T0).unwrap();
        let (clusters, free) = state(&conn);
        assert_eq!(
            clusters,
            vec![
                (
                    "u1".to_string(),
                    "running".to_string(),
                    vec!["n2".to_string()]
                ),
                ("r1".to_string(), "running".to_string(), vec![]),
            ]
        );
        assert_eq!(free, ["n1", "n3", "n4"]);
        // Its own transaction, committed: the connection is in none after it.
        assert!(conn.is_autocommit());
    }

    #[test]
    fn a_failure_part_way_writes_nothing_and_leaves_no_transaction_open() {
        let (_dir, conn, volumes) = seed();
        let before = state(&conn);
        // The delete fails after its node was released.
        conn.execute_batch(
            "CREATE TEMP TRIGGER refuse BEFORE DELETE ON clusters WHEN old.id = 'd1'
             BEGIN SELECT RAISE(ABORT, 'refused'); END;",
        )
        .unwrap();
        let err = recover_interrupted(&conn, &volumes, T0).unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert_eq!(state(&conn), before);
        assert!(conn.is_autocommit());
    }
}
