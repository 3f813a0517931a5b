//! Admitting queued clusters (issue 42): a singleton that, every round, deletes the
//! queued clusters whose wait ran out and admits those that fit now, in weighted
//! fair-share order (`scheduling::queue`). Its decision and first write are fenced by
//! the singletons' lease in one transaction (a former leader admits and deletes
//! nothing); an admitted cluster then goes on exactly as a create does
//! (`Clusters::complete_create`, not fenced: stopped half-way it would leave the cluster
//! `creating` with nobody to finish it).

use std::collections::HashMap;
use std::sync::Arc;

use gpufleet_sql::AsConn;
use gpufleet_sql::Savepoint;
use tokio::sync::watch;

use super::clusters::Clusters;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::lease::Fence;
use crate::scheduling::queue::{self, Placed, Standing, Wait, Waiting};
use crate::state::AppState;
use crate::store::{self, clusters::ClusterRow};
use crate::volumes::Volumes;

/// How often queued clusters are looked at.
const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A cluster admitted by a round, its nodes assigned and its volume made: what its
/// create still has to do.
pub struct Admitted {
    pub cluster: ClusterRow,
    pub changes: Vec<crate::mig::Change>,
    pub tenant_name: String,
    pub taken_back: crate::scheduling::take_back::Reclaimed,
}

/// Runs a round every [`EVERY`] until `stop` turns true.
pub async fn run(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let clusters = Clusters {
        state: state.clone(),
    };
    loop {
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        // Most rounds find nothing queued: a read, not the writer, says so.
        let queued = state
            .read(|conn| Ok::<_, Error>(store::queue::count(conn, None)?))
            .await;
        if matches!(queued, Ok(0)) {
            continue;
        }
        let (t, fence) = (state.now(), Fence::singleton(state.lease().clone()));
        let (volumes, replace_after) = (state.volumes.clone(), state.agents.replace_after);
        let admitted = state
            .write(move |sp| round(sp, &fence, &volumes, (t, replace_after)))
            .await;
        let admitted: Vec<Admitted> = match admitted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "admitting queued clusters failed; retrying");
                continue;
            }
        };
        for a in admitted {
            // Each goes on as its own create, like a request's (see `detached`).
            let clusters = clusters.clone();
            tokio::spawn(async move {
                let name = a.cluster.name.clone();
                crate::scheduling::take_back::finish(&clusters.state, a.taken_back).await;
                let done = clusters
                    .complete_create(Caller::Admin, a.cluster, a.changes, a.tenant_name)
                    .await;
                if let Err(e) = done {
                    tracing::warn!(cluster = %name, error = %e.message(), "an admitted queued cluster's create failed; it was taken back");
                }
            });
        }
    }
}

/// One round in one transaction behind the fence: queued clusters whose wait ran out at
/// `t` are deleted (holding nothing, with a `queue_expired` event), then, per GPU model,
/// the waiting ones are admitted in fair-share order while they fit; the first that does
/// not fit for capacity stops its model's round (none after it overtakes it), one waiting
/// for its own tenant's quota is passed over. A cluster still waiting gets its current
/// reason. Returns the admitted clusters, committed as `creating`.
pub fn round(
    sp: Savepoint<'_>,
    fence: &Fence,
    volumes: &Volumes,
    now: (i64, std::time::Duration),
) -> Result<Vec<Admitted>> {
    fence.check(&sp)?;
    let t = now.0;
    let mut by_model: HashMap<String, Vec<(ClusterRow, Waiting)>> = HashMap::new();
    for (position, q) in store::queue::list(&sp)?.into_iter().enumerate() {
        let Some(c) = store::clusters::get(&sp, &q.cluster_id)? else {
            continue;
        };
        if queue::ran_out(q.wait_until, t) {
            expire(&sp, &c, t, t - q.queued_at)?;
            continue;
        }
        let gpus = c
            .node_count
            .saturating_mul(crate::scheduling::gpus_per_node(&sp, &c.gpu_type)?);
        let waiting = Waiting {
            cluster_id: c.id.clone(),
            tenant_id: c.tenant_id.clone(),
            gpus,
            queued_at: q.queued_at,
            position,
        };
        by_model
            .entry(c.gpu_type.clone())
            .or_default()
            .push((c, waiting));
    }
    let mut admitted = Vec::new();
    let mut models: Vec<_> = by_model.into_iter().collect();
    models.sort_by(|a, b| a.0.cmp(&b.0));
    for (gpu_type, mut waiting) in models {
        loop {
            let standings = standings(&sp, &gpu_type, t)?;
            let order: Vec<Waiting> = waiting.iter().map(|(_, w)| w.clone()).collect();
            let Some(i) = queue::next(&order, &standings) else {
                break;
            };
            let (c, w) = waiting.remove(i);
            let standing = standings.get(&c.tenant_id).copied();
            match admit(&sp, &c, w.queued_at, standing, now)? {
                Ok(a) => admitted.push(a),
                Err(Wait::Quota(_)) => continue,
                Err(Wait::Capacity(_)) => {
                    behind(&sp, &waiting, t)?;
                    break;
                }
            }
        }
    }
    // The volumes before the commit, as a create makes its own: an admitted cluster's
    // nodes mount it first thing.
    let mut made = Vec::new();
    for a in &admitted {
        made.extend(make_volume(&sp, volumes, &a.cluster)?);
    }
    if let Err(e) = sp.commit() {
        for dir in made {
            let _ = volumes.remove(&dir);
        }
        return Err(e.into());
    }
    Ok(admitted)
}

/// Each tenant's pool GPUs beyond its guarantee of `gpu_type` now, and its weight.
fn standings(conn: &impl AsConn, gpu_type: &str, t: i64) -> Result<HashMap<String, Standing>> {
    let gpn = crate::scheduling::gpus_per_node(conn, gpu_type)?.max(1);
    let held = crate::scheduling::holdings(conn, gpu_type, t, Default::default())?;
    Ok(
        crate::scheduling::sharing::shares(conn, gpu_type, &held, t, gpn)?
            .into_iter()
            .map(|s| {
                let standing = Standing {
                    beyond: s.borrowed(),
                    weight: s.weight,
                };
                (s.tenant_id, standing)
            })
            .collect(),
    )
}

/// Admits `c` if it fits now: its nodes assigned (and lent nodes taken back, as a
/// create's), status `creating`, no longer waiting, an `admitted` event. Otherwise its
/// status_reason says why it still waits, and the [`Wait`] is returned.
fn admit(
    sp: &impl AsConn,
    c: &ClusterRow,
    queued_at: i64,
    standing: Option<Standing>,
    (t, replace_after): (i64, std::time::Duration),
) -> Result<std::result::Result<Admitted, Wait>> {
    let tenant_name = crate::scheduling::sharing::tenant_name(sp, &c.tenant_id)?;
    // Any wait: a cluster that no longer could ever fit (its quota lowered) stays queued
    // saying so, until its wait runs out.
    let placed = queue::place_or_wait(sp, &tenant_name, c, (t, replace_after), i64::MAX);
    let scaling = match placed {
        Ok(Placed::Now(scaling)) => scaling,
        Ok(Placed::Waits(wait)) => {
            still_waiting(sp, c, wait.reason())?;
            return Ok(Err(wait));
        }
        Err(Error::Precondition(never)) => {
            still_waiting(sp, c, &never)?;
            return Ok(Err(Wait::Capacity(never)));
        }
        Err(e) => return Err(e),
    };
    let changes = crate::scheduling::clusters::layout_changes(sp, c, &[])?;
    store::queue::remove(sp, &c.id)?;
    store::clusters::set_status(sp, &c.id, "creating", "")?;
    let (beyond, weight) = standing.map_or((0, 1), |s| (s.beyond, s.weight));
    store::events::record(
        sp,
        t,
        &c.id,
        &c.tenant_id,
        "admitted",
        "",
        &format!(
            "admitted after waiting {}s, in weighted fair-share order: tenant '{tenant_name}' held {beyond} pool GPUs beyond its guarantee, weight {weight}",
            t - queued_at
        ),
    )?;
    let mut cluster = c.clone();
    (cluster.status, cluster.status_reason) = ("creating".into(), String::new());
    tracing::info!(cluster = %c.name, tenant = %tenant_name, waited = t - queued_at, "admitted a queued cluster");
    Ok(Ok(Admitted {
        cluster,
        changes,
        tenant_name,
        taken_back: scaling.taken_back,
    }))
}

/// The clusters of a model behind one that does not fit: each says why it waits, and
/// that one comes first (not which: it may be another tenant's).
fn behind(conn: &impl AsConn, waiting: &[(ClusterRow, Waiting)], t: i64) -> Result<()> {
    for (c, _) in waiting {
        let tenant_name = crate::scheduling::sharing::tenant_name(conn, &c.tenant_id)?;
        let reason = match queue::why_waiting(conn, &tenant_name, c, t) {
            Ok(Wait::Capacity(why)) => {
                format!("{why}; a cluster before it in weighted fair-share order waits first")
            }
            Ok(Wait::Quota(why)) => why,
            Err(Error::Precondition(never)) => never,
            Err(e) => return Err(e),
        };
        still_waiting(conn, c, &reason)?;
    }
    Ok(())
}

/// A cluster that still waits says why now (written only when that changed).
fn still_waiting(conn: &impl AsConn, c: &ClusterRow, reason: &str) -> Result<()> {
    if c.status_reason != reason {
        store::clusters::set_status(conn, &c.id, "queued", reason)?;
    }
    Ok(())
}

/// A queued cluster whose wait ran out goes, holding nothing; its event says why it was
/// never admitted.
fn expire(conn: &impl AsConn, c: &ClusterRow, t: i64, waited: i64) -> Result<()> {
    let message = format!(
        "not admitted within its wait ({waited}s): {}; the queued cluster was deleted, it held nothing",
        c.status_reason
    );
    tracing::info!(cluster = %c.name, %message, "a queued cluster's wait ran out");
    queue::forget(conn, c, t, "queue_expired", &message)
}

/// The admitted cluster's volume, as its create would have made it (a kept volume of the
/// same name is attached). Returns the directory when it is new.
fn make_volume(
    conn: &impl AsConn,
    volumes: &Volumes,
    c: &ClusterRow,
) -> Result<Option<std::path::PathBuf>> {
    let dir = volumes.dir_of(&c.tenant_id, &c.name, &c.storage_path);
    let kept = dir.exists();
    let owner = store::slurm_access::get(conn, &c.id)?.map(|a| a.uid);
    volumes.create(&dir, c.storage_gib, owner).map_err(|e| {
        Error::Internal(format!(
            "cannot create the cluster's volume {}: {e}",
            dir.display()
        ))
    })?;
    Ok((!kept).then_some(dir))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rusqlite::Connection;

    use crate::lease::testing;
    use crate::store::{self, clusters::ClusterRow};
    use crate::volumes::Volumes;

    const T0: i64 = 1_900_000_000;
    const REPLACE_AFTER: Duration = Duration::from_secs(300);

    /// Four 8-GPU H100 pool nodes held by team-c's cluster `blk`; team-a (weight 1) and
    /// team-b (weight 3) with 32 burst GPUs each and nothing guaranteed.
    fn seed(conn: &Connection) {
        conn.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('a', 'team-a', '', '{}', 'ha', 0), ('b', 'team-b', '', '{}', 'hb', 0),
                        ('c', 'team-c', '', '{}', 'hc', 0);",
        )
        .unwrap();
        for (id, tenant, gpus, burst, weight) in [
            ("qa", "a", 0, 32, 1),
            ("qb", "b", 0, 32, 3),
            ("qc", "c", 32, 0, 1),
        ] {
            let q = store::quotas::QuotaRow {
                weight,
                ..store::quotas::QuotaRow::new(
                    id.into(),
                    tenant.into(),
                    "H100-80GB".into(),
                    gpus,
                    burst,
                )
            };
            store::quotas::insert(conn, &q).unwrap();
        }
        store::clusters::insert(conn, &cluster("blk", "c", 4, "running")).unwrap();
        for id in ["p1", "p2", "p3", "p4"] {
            conn.execute(
                "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                    cuda_version, state, cluster_id)
                 VALUES (?1, ?1, 'H100-80GB', 'pool', 8, '550', '12.4', 'ready', 'blk')",
                [id],
            )
            .unwrap();
        }
    }

    fn cluster(id: &str, tenant: &str, nodes: i64, status: &str) -> ClusterRow {
        ClusterRow {
            id: id.into(),
            tenant_id: tenant.into(),
            name: id.into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: nodes,
            reservation_id: None,
            storage_gib: 1,
            status: status.into(),
            endpoint: String::new(),
            credentials: String::new(),
            storage_path: String::new(),
            mig_layout: Default::default(),
            status_reason: String::new(),
            cuda_version: String::new(),
            driver_version: String::new(),
            max_unavailable: 1,
            storage_retention: "delete".into(),
        }
    }

    /// A 1-node cluster of `tenant` queued at `at` for `wait` seconds.
    fn queue(conn: &Connection, volumes: &Volumes, (id, tenant): (&str, &str), at: i64, wait: i64) {
        let mut c = cluster(id, tenant, 1, "queued");
        c.status_reason = "waiting for capacity".into();
        c.storage_path = volumes.storage_path(tenant, id);
        store::clusters::insert(conn, &c).unwrap();
        crate::scheduling::queue::enqueue(conn, &c, at, wait).unwrap();
    }

    fn round(
        conn: &mut Connection,
        fence: &crate::lease::Fence,
        volumes: &Volumes,
        t: i64,
    ) -> crate::error::Result<Vec<String>> {
        let tx = conn.transaction().unwrap();
        let sp = gpufleet_sql::Savepoint::begin(gpufleet_sql::Conn::sqlite(&tx)).unwrap();
        let admitted = super::round(sp, fence, volumes, (t, REPLACE_AFTER))?;
        tx.commit().unwrap();
        Ok(admitted.into_iter().map(|a| a.cluster.id).collect())
    }

    fn status(conn: &Connection, id: &str) -> Option<(String, String)> {
        store::clusters::get(conn, id)
            .unwrap()
            .map(|c| (c.status, c.status_reason))
    }

    fn kinds(conn: &Connection, id: &str) -> Vec<String> {
        store::events::list(conn, id)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    #[test]
    fn freed_capacity_goes_to_weights_1_and_3_as_1_to_3_and_a_wait_runs_out_by_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("state.db")).unwrap();
        let volumes = Volumes::in_data_dir(dir.path().join("volumes"));
        seed(&conn);
        for (i, id) in ["a1", "a2", "a3"].iter().enumerate() {
            queue(&conn, &volumes, (id, "a"), T0 + i as i64, 600);
        }
        for (i, id) in ["b1", "b2", "b3"].iter().enumerate() {
            queue(&conn, &volumes, (id, "b"), T0 + 10 + i as i64, 600);
        }
        queue(&conn, &volumes, ("short", "a"), T0 + 20, 30);
        let (stale, current) = testing::stale_and_current(&mut conn);

        // Nothing is free: nothing admitted; each says why with the numbers.
        assert_eq!(
            round(&mut conn, &current, &volumes, T0 + 49).unwrap(),
            Vec::<String>::new()
        );
        let (queued, reason) = status(&conn, "b1").unwrap();
        assert_eq!(queued, "queued");
        assert_eq!(
            reason,
            "waiting for capacity: needs 1 H100-80GB nodes (8 GPUs), 0 free for it now (0 GPUs)"
        );
        assert!(
            status(&conn, "short").is_some(),
            "a wait runs until its end"
        );

        // The injected clock passes the short wait's end: it goes, holding nothing.
        assert_eq!(
            round(&mut conn, &current, &volumes, T0 + 50).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(status(&conn, "short"), None);
        assert_eq!(kinds(&conn, "short"), ["queued", "queue_expired"]);
        let expired = store::events::list(&conn, "short").unwrap().pop().unwrap();
        assert!(
            expired.message.starts_with("not admitted within its wait (30s): waiting for capacity: needs 1 H100-80GB nodes (8 GPUs), 0 free for it now (0 GPUs); a cluster before it in weighted fair-share order waits first; the queued cluster was deleted"),
            "{expired:?}"
        );
        assert_eq!(store::queue::get(&conn, "short").unwrap(), None);

        // The blocker goes: its 4 nodes are free.
        for id in ["p1", "p2", "p3", "p4"] {
            store::nodes::release(&conn, id, T0 + 60).unwrap();
        }
        store::clusters::delete(&conn, "blk").unwrap();

        // A former leader admits nothing.
        assert!(round(&mut conn, &stale, &volumes, T0 + 61).is_err());
        assert_eq!(status(&conn, "b1").unwrap().0, "queued");

        // b: 8/3, 16/3, then 24/3 = 8 ties a's 8/1 (a1 waited longer), then the pool is full.
        let admitted = round(&mut conn, &current, &volumes, T0 + 61).unwrap();
        assert_eq!(admitted, ["b1", "b2", "a1", "b3"]);
        for id in &admitted {
            assert_eq!(
                status(&conn, id).unwrap(),
                ("creating".into(), String::new())
            );
            assert_eq!(store::nodes::list(&conn, None, Some(id)).unwrap().len(), 1);
            assert_eq!(kinds(&conn, id), ["queued", "admitted"]);
        }
        let a1 = store::events::list(&conn, "a1").unwrap().pop().unwrap();
        assert_eq!(
            a1.message,
            "admitted after waiting 61s, in weighted fair-share order: tenant 'team-a' held 0 pool GPUs beyond its guarantee, weight 1"
        );
        let (queued, reason) = status(&conn, "a2").unwrap();
        assert_eq!(queued, "queued");
        assert!(reason.starts_with("waiting for capacity: "), "{reason}");
        assert_eq!(store::queue::list(&conn).unwrap().len(), 2);
    }

    #[test]
    fn a_cluster_waiting_for_its_quota_does_not_hold_up_another_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("state.db")).unwrap();
        let volumes = Volumes::in_data_dir(dir.path().join("volumes"));
        seed(&conn);
        for id in ["p1", "p2", "p3", "p4"] {
            store::nodes::release(&conn, id, T0).unwrap();
        }
        store::clusters::delete(&conn, "blk").unwrap();
        // team-a holds 24 of its 32 GPUs; its 2-node cluster waits for quota.
        store::clusters::insert(&conn, &cluster("own", "a", 3, "running")).unwrap();
        for id in ["p1", "p2", "p3"] {
            assert!(store::nodes::assign(&conn, id, "own", T0).unwrap());
        }
        let mut big = cluster("big", "a", 2, "queued");
        big.status_reason = "waiting".into();
        big.storage_path = volumes.storage_path("a", "big");
        store::clusters::insert(&conn, &big).unwrap();
        crate::scheduling::queue::enqueue(&conn, &big, T0, 600).unwrap();
        queue(&conn, &volumes, ("b1", "b"), T0 + 1, 600);
        let leader = testing::replica("r");
        testing::take(&leader, &mut conn, T0);
        let fence = crate::lease::Fence::singleton(leader);
        let admitted = round(&mut conn, &fence, &volumes, T0 + 2).unwrap();
        assert_eq!(admitted, ["b1"]);
        assert_eq!(
            status(&conn, "big").unwrap(),
            (
                "queued".into(),
                "waiting for quota: needs 16 H100-80GB GPUs, tenant 'team-a' holds 24 of its 32 (0 guaranteed + 32 burst)".into()
            )
        );
    }

    /// A tenant's waiting clusters are bounded: a new one past the bound is refused,
    /// naming the attribute and the bound, while another tenant may still wait; the
    /// clusters already waiting are admitted as before.
    #[test]
    fn a_tenant_waits_with_at_most_its_bound_of_clusters() {
        use crate::scheduling::queue::{room_to_wait, MAX_WAITING_PER_TENANT};
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("state.db")).unwrap();
        let volumes = Volumes::in_data_dir(dir.path().join("volumes"));
        seed(&conn);
        for i in 0..MAX_WAITING_PER_TENANT {
            queue(&conn, &volumes, (&format!("a{i}"), "a"), T0 + i, 600);
        }
        match room_to_wait(&conn, "team-a", "a") {
            Err(crate::error::Error::Precondition(why)) => assert_eq!(
                why,
                format!("wait_for_capacity: tenant 'team-a' already has {MAX_WAITING_PER_TENANT} clusters waiting for capacity, the most one tenant may; delete one of them or create without waiting")
            ),
            other => panic!("{other:?}"),
        }
        assert!(room_to_wait(&conn, "team-b", "b").is_ok());
        // A node frees: the first of team-a's waiting clusters is admitted.
        store::nodes::release(&conn, "p1", T0).unwrap();
        let leader = testing::replica("r");
        testing::take(&leader, &mut conn, T0);
        let fence = crate::lease::Fence::singleton(leader);
        assert_eq!(
            round(&mut conn, &fence, &volumes, T0 + 100).unwrap(),
            ["a0"]
        );
    }
}
