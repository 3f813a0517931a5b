//! TenantClusterService: Kubernetes or Slurm clusters on dedicated nodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpufleet_proto::v1::{self, tenant_cluster_service_server::TenantClusterService};
use rusqlite::Connection;
use tonic::{Request, Response, Status};

use super::reservations::{held_by_clusters, visible_reservation};
use super::{
    capacity, demand, fingerprint, gpus_per_node, holdings, invalid, list_scope, node_messages,
    not_found, precondition, request_id_conflict, target_tenant, Exclude,
};
use crate::auth::{authenticate, Caller};
use crate::rules::{self, QuotaSubject, Span};
use crate::state::{db_error, now, rfc3339, AppState};
use crate::store::{
    self,
    clusters::ClusterRow,
    idempotency::Prior,
    nodes::{NodeRow, NODE_UNREACHABLE, ON_DEMAND, POOL},
};
use crate::{access, catalog, volumes};

/// storage_gib when the request leaves it 0.
pub const DEFAULT_STORAGE_GIB: i64 = 100;

pub struct Clusters {
    pub state: Arc<AppState>,
}

fn visible_cluster(conn: &Connection, caller: &Caller, id: &str) -> Result<ClusterRow, Status> {
    match store::clusters::get(conn, id).map_err(db_error)? {
        Some(c) if caller.sees(&c.tenant_id) => Ok(c),
        _ => Err(not_found("tenant cluster", id)),
    }
}

fn message(conn: &Connection, caller: &Caller, c: ClusterRow) -> Result<v1::TenantCluster, Status> {
    let nodes = store::nodes::list(conn, None, Some(&c.id)).map_err(db_error)?;
    Ok(v1::TenantCluster {
        nodes: node_messages(conn, None, caller, nodes)?,
        mig_layout: c
            .mig_layout
            .iter()
            .map(|(k, v)| (k.clone(), *v as i32))
            .collect(),
        id: c.id,
        tenant_id: c.tenant_id,
        name: c.name,
        orchestrator: c.orchestrator,
        gpu_type: c.gpu_type,
        node_count: c.node_count,
        reservation_id: c.reservation_id.unwrap_or_default(),
        storage_gib: c.storage_gib,
        status: c.status,
        status_reason: c.status_reason,
        endpoint: c.endpoint,
        credentials: c.credentials,
        storage_path: c.storage_path,
    })
}

/// Picks the nodes that take `cluster` from the nodes it holds (`current`) to
/// `cluster.node_count`, after the capacity and quota checks. Nothing is written.
fn nodes_to_add(
    conn: &Connection,
    tenant_name: &str,
    cluster: &ClusterRow,
    current: usize,
    t: i64,
) -> Result<Vec<NodeRow>, Status> {
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
            let r = visible_reservation(conn, &Caller::Tenant(cluster.tenant_id.clone()), rid)
                .map_err(|_| invalid(format!("reservation_id: reservation '{rid}' not found")))?;
            if r.gpu_type != *gpu {
                return Err(invalid(format!(
                    "reservation_id: reservation {rid} holds {} nodes, not {gpu}",
                    r.gpu_type
                )));
            }
            let status = rules::reservation_status(r.start_time, r.end_time, t);
            if status != "active" {
                return Err(precondition(format!(
                    "reservation_id: reservation {rid} is {status} ({} to {}); clusters can draw from it only while it is active",
                    rfc3339(r.start_time),
                    rfc3339(r.end_time)
                )));
            }
            let used = held_by_clusters(conn, rid)?;
            let free = r.node_count - used.pool - used.on_demand;
            if wanted > free {
                return Err(precondition(format!(
                    "node_count: needs {wanted} more nodes from reservation {rid}, which has {} nodes of which its clusters hold {}",
                    r.node_count,
                    used.pool + used.on_demand
                )));
            }
            let take_pool = wanted.min(r.pool_nodes - used.pool).max(0);
            (take_pool, wanted - take_pool, r.end_time)
        }
        None => (wanted, 0, t),
    };
    // The cluster holds its nodes from `from` on (after its reservation's end, if any).
    let own_pool = store::nodes::list(conn, None, Some(&cluster.id))
        .map_err(db_error)?
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
    .map_err(precondition)?;

    let when = if cluster.reservation_id.is_some() {
        format!("after its reservation ends at {}", rfc3339(from))
    } else {
        "from now on".into()
    };
    if cap.free_pool(from, None) < need_pool || cap.free_on_demand(from, None) < need_od {
        return Err(precondition(format!(
            "node_count: needs {} {gpu} nodes {when}, pool has {} free (on-demand {} free); reservations hold the rest",
            cluster.node_count,
            cap.free_pool(from, None),
            cap.free_on_demand(from, None)
        )));
    }
    let mut picked = Vec::new();
    for (kind, count) in [(POOL, take_pool), (ON_DEMAND, take_od)] {
        let free = store::nodes::free(conn, gpu, kind).map_err(db_error)?;
        if (free.len() as i64) < count {
            return Err(precondition(format!(
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
struct Scaling {
    added: Vec<NodeRow>,
    to_release: Vec<NodeRow>,
}

fn scale(
    conn: &Connection,
    tenant_name: &str,
    cluster: &ClusterRow,
    t: i64,
) -> Result<Scaling, Status> {
    let mut current = store::nodes::list(conn, None, Some(&cluster.id)).map_err(db_error)?;
    let target = cluster.node_count as usize;
    let mut out = Scaling::default();
    if target > current.len() {
        for n in nodes_to_add(conn, tenant_name, cluster, current.len(), t)? {
            if !store::nodes::assign(conn, &n.id, &cluster.id).map_err(db_error)? {
                return Err(precondition(format!(
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
fn layout_changes(
    conn: &Connection,
    cluster: &ClusterRow,
    to_release: &[NodeRow],
) -> Result<Vec<crate::mig::Change>, Status> {
    let keep: Vec<NodeRow> = store::nodes::list(conn, None, Some(&cluster.id))
        .map_err(db_error)?
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
const CHANGING: [&str; 3] = ["creating", "updating", "deleting"];

fn refuse_while_changing(c: &ClusterRow) -> Result<(), Status> {
    if CHANGING.contains(&c.status.as_str()) {
        return Err(precondition(format!(
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
fn settled_status(conn: &Connection, cluster_id: &str) -> Result<(String, String), Status> {
    let down: Vec<String> = store::nodes::list(conn, None, Some(cluster_id))
        .map_err(db_error)?
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

fn positive_or_unset(field: &str, value: i64) -> Result<(), Status> {
    if value < 0 {
        return Err(invalid(format!(
            "{field}: must be at least 1 (got {value})"
        )));
    }
    Ok(())
}

/// A create after its checks: the answer to a retried request, or the new cluster (in
/// the store, status "creating") with the MIG changes its nodes need.
enum Prepared {
    Existing(v1::TenantCluster),
    New {
        caller: Caller,
        cluster: ClusterRow,
        changes: Vec<crate::mig::Change>,
        tenant_name: String,
    },
}

/// Takes back a create whose nodes could not be partitioned: nodes released, the
/// cluster, its request id and its storage gone.
fn undo_create(conn: &Connection, cluster: &ClusterRow) -> rusqlite::Result<()> {
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

impl Clusters {
    fn prepare_create(
        &self,
        request: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<Prepared, Status> {
        let mut conn = self.state.db();
        let tx = conn.transaction().map_err(db_error)?;
        let caller = authenticate(&self.state, &tx, &request)?;
        let req = request.into_inner();
        rules::required("request_id", &req.request_id).map_err(invalid)?;
        let tenant = target_tenant(&tx, &caller, &req.tenant_id)?;
        rules::dns_label("name", &req.name).map_err(invalid)?;
        rules::orchestrator(&req.orchestrator).map_err(invalid)?;
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        rules::at_least("node_count", req.node_count, 1).map_err(invalid)?;
        positive_or_unset("storage_gib", req.storage_gib)?;
        let storage_gib = if req.storage_gib == 0 {
            DEFAULT_STORAGE_GIB
        } else {
            req.storage_gib
        };
        let layout: BTreeMap<String, i32> = req.mig_layout.clone().into_iter().collect();
        let print = fingerprint(&[
            &tenant.id,
            &req.name,
            &req.orchestrator,
            &req.gpu_type,
            &req.node_count,
            &req.reservation_id,
            &storage_gib,
            &layout,
        ]);
        match store::idempotency::lookup(&tx, "cluster", &tenant.id, &req.request_id, &print)
            .map_err(db_error)?
        {
            Prior::Same(id) => {
                let c = store::clusters::get(&tx, &id)
                    .map_err(db_error)?
                    .ok_or_else(|| not_found("tenant cluster", &id))?;
                return message(&tx, &caller, c).map(Prepared::Existing);
            }
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "tenant cluster")),
            Prior::New => {}
        }
        if let Some(existing) =
            store::clusters::by_name(&tx, &tenant.id, &req.name).map_err(db_error)?
        {
            return Err(Status::already_exists(format!(
                "name: tenant '{}' already has a cluster named '{}' (id {})",
                tenant.name, req.name, existing.id
            )));
        }
        if !req.reservation_id.is_empty() {
            visible_reservation(&tx, &Caller::Tenant(tenant.id.clone()), &req.reservation_id)
                .map_err(|_| {
                    invalid(format!(
                        "reservation_id: reservation '{}' not found",
                        req.reservation_id
                    ))
                })?;
        }
        let mig_layout = crate::mig::validate(&req.gpu_type, &req.mig_layout)?;
        let dir = volumes::path(&self.state.volumes_root(), &tenant.name, &req.name);
        let cluster = ClusterRow {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.id.clone(),
            endpoint: access::endpoint(&req.orchestrator, &tenant.name, &req.name),
            credentials: access::credentials(&req.orchestrator, &tenant.name, &req.name),
            name: req.name,
            orchestrator: req.orchestrator,
            gpu_type: req.gpu_type,
            node_count: req.node_count,
            reservation_id: Some(req.reservation_id).filter(|r| !r.is_empty()),
            storage_gib,
            status: "creating".into(),
            storage_path: dir.display().to_string(),
            mig_layout,
            status_reason: String::new(),
        };
        store::clusters::insert(&tx, &cluster).map_err(db_error)?;
        scale(&tx, &tenant.name, &cluster, now())?;
        store::idempotency::record(
            &tx,
            "cluster",
            &tenant.id,
            &req.request_id,
            &print,
            &cluster.id,
        )
        .map_err(db_error)?;
        let changes = layout_changes(&tx, &cluster, &[])?;
        // Every check passed: now the side effects outside the database.
        volumes::create(
            &self.state.volumes_root(),
            &tenant.name,
            &cluster.name,
            storage_gib,
        )
        .map_err(|e| {
            Status::internal(format!(
                "cannot create the storage directory {}: {e}",
                dir.display()
            ))
        })?;
        if let Err(e) = tx.commit() {
            let _ = volumes::remove(&dir);
            return Err(db_error(e));
        }
        Ok(Prepared::New {
            caller,
            cluster,
            changes,
            tenant_name: tenant.name,
        })
    }

    async fn create(
        &self,
        request: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let (caller, cluster, changes, tenant_name) = match self.prepare_create(request)? {
            Prepared::Existing(c) => return Ok(c),
            Prepared::New {
                caller,
                cluster,
                changes,
                tenant_name,
            } => (caller, cluster, changes, tenant_name),
        };
        // The agents partition the nodes; no lock is held while they work.
        if let Err(e) = crate::mig::converge(&self.state, &changes).await {
            let conn = self.state.db();
            if let Err(db) = undo_create(&conn, &cluster) {
                tracing::error!(cluster = %cluster.name, error = %db, "cannot undo a failed cluster create");
            }
            return Err(e);
        }
        let conn = self.state.db();
        let (status, reason) = settled_status(&conn, &cluster.id)?;
        store::clusters::set_status(&conn, &cluster.id, &status, &reason).map_err(db_error)?;
        tracing::info!(cluster = %cluster.name, tenant = %tenant_name, nodes = cluster.node_count, "created cluster");
        let created = store::clusters::get(&conn, &cluster.id)
            .map_err(db_error)?
            .ok_or_else(|| not_found("tenant cluster", &cluster.id))?;
        message(&conn, &caller, created)
    }

    fn get(
        &self,
        request: Request<v1::GetTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let conn = self.state.db();
        let caller = authenticate(&self.state, &conn, &request)?;
        let c = visible_cluster(&conn, &caller, &request.get_ref().id)?;
        message(&conn, &caller, c)
    }

    fn list(
        &self,
        request: Request<v1::ListTenantClustersRequest>,
    ) -> Result<v1::ListTenantClustersResponse, Status> {
        let conn = self.state.db();
        let caller = authenticate(&self.state, &conn, &request)?;
        let scope = list_scope(&conn, &caller, &request.get_ref().tenant_id)?;
        let rows = store::clusters::list(&conn, scope.as_deref(), None, None).map_err(db_error)?;
        let clusters = rows
            .into_iter()
            .map(|c| message(&conn, &caller, c))
            .collect::<Result<_, _>>()?;
        Ok(v1::ListTenantClustersResponse { clusters })
    }

    async fn update(
        &self,
        request: Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let (caller, old, c, scaling, changes) = {
            let mut conn = self.state.db();
            let tx = conn.transaction().map_err(db_error)?;
            let caller = authenticate(&self.state, &tx, &request)?;
            let req = request.into_inner();
            let mut c = visible_cluster(&tx, &caller, &req.id)?;
            refuse_while_changing(&c)?;
            let old = c.clone();
            let tenant = super::visible_tenant(&tx, &Caller::Admin, &c.tenant_id)?;
            // 0 leaves node_count / storage_gib unchanged (proto3 int64 has no presence).
            positive_or_unset("node_count", req.node_count)?;
            positive_or_unset("storage_gib", req.storage_gib)?;
            if req.storage_gib > 0 && req.storage_gib < c.storage_gib {
                return Err(precondition(format!(
                    "storage_gib cannot shrink from {} to {}",
                    c.storage_gib, req.storage_gib
                )));
            }
            if req.node_count > 0 {
                c.node_count = req.node_count;
            }
            if req.storage_gib > 0 {
                c.storage_gib = req.storage_gib;
            }
            if req.set_mig_layout {
                c.mig_layout = crate::mig::validate(&c.gpu_type, &req.mig_layout)?;
            }
            let scaling = scale(&tx, &tenant.name, &c, now())?;
            let changes = layout_changes(&tx, &c, &scaling.to_release)?;
            c.status = "updating".into();
            store::clusters::update(&tx, &c).map_err(db_error)?;
            let dir = std::path::PathBuf::from(&c.storage_path);
            volumes::resize(&dir, c.storage_gib).map_err(|e| {
                Status::internal(format!(
                    "cannot resize the storage directory {}: {e}",
                    dir.display()
                ))
            })?;
            tx.commit().map_err(db_error)?;
            (caller, old, c, scaling, changes)
        };
        let converged = crate::mig::converge(&self.state, &changes).await;
        let mut conn = self.state.db();
        let tx = conn.transaction().map_err(db_error)?;
        if let Err(e) = converged {
            // Back to the cluster as it was: new nodes released, the old row restored.
            for n in &scaling.added {
                store::nodes::release(&tx, &n.id).map_err(db_error)?;
            }
            store::clusters::update(&tx, &old).map_err(db_error)?;
            tx.commit().map_err(db_error)?;
            if let Err(io) =
                volumes::resize(std::path::Path::new(&old.storage_path), old.storage_gib)
            {
                tracing::warn!(path = %old.storage_path, error = %io, "cannot restore the storage size of a failed update");
            }
            return Err(e);
        }
        for n in &scaling.to_release {
            store::nodes::release(&tx, &n.id).map_err(db_error)?;
        }
        let (status, reason) = settled_status(&tx, &c.id)?;
        store::clusters::set_status(&tx, &c.id, &status, &reason).map_err(db_error)?;
        tx.commit().map_err(db_error)?;
        let c = store::clusters::get(&conn, &c.id)
            .map_err(db_error)?
            .ok_or_else(|| not_found("tenant cluster", &c.id))?;
        message(&conn, &caller, c)
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<v1::DeleteResponse, Status> {
        let (c, nodes, changes) = {
            let mut conn = self.state.db();
            let tx = conn.transaction().map_err(db_error)?;
            let caller = authenticate(&self.state, &tx, &request)?;
            let c = visible_cluster(&tx, &caller, &request.get_ref().id)?;
            refuse_while_changing(&c)?;
            let nodes = store::nodes::list(&tx, None, Some(&c.id)).map_err(db_error)?;
            // Released nodes go back to whole GPUs before anyone else can get them.
            let changes = layout_changes(&tx, &c, &nodes)?;
            store::clusters::set_status(&tx, &c.id, "deleting", "").map_err(db_error)?;
            tx.commit().map_err(db_error)?;
            (c, nodes, changes)
        };
        let converged = crate::mig::converge(&self.state, &changes).await;
        let mut conn = self.state.db();
        if let Err(e) = converged {
            store::clusters::set_status(&conn, &c.id, &c.status, &c.status_reason)
                .map_err(db_error)?;
            return Err(e);
        }
        let tx = conn.transaction().map_err(db_error)?;
        for n in &nodes {
            store::nodes::release(&tx, &n.id).map_err(db_error)?;
        }
        store::clusters::delete(&tx, &c.id).map_err(db_error)?;
        store::idempotency::forget(&tx, &c.id).map_err(db_error)?;
        tx.commit().map_err(db_error)?;
        if let Err(e) = volumes::remove(std::path::Path::new(&c.storage_path)) {
            tracing::warn!(path = %c.storage_path, error = %e, "cluster deleted but its storage directory could not be removed");
        }
        tracing::info!(cluster = %c.name, "deleted cluster");
        Ok(v1::DeleteResponse {})
    }
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
pub async fn replace_unreachable(state: &AppState, node_id: &str) -> Result<(), String> {
    let (cluster, dead, added, changes) = {
        let mut conn = state.db();
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        let Some(dead) = store::nodes::get(&tx, node_id).map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let Some(cluster_id) = dead.cluster_id.clone() else {
            return Ok(());
        };
        let Some(cluster) = store::clusters::get(&tx, &cluster_id).map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        if CHANGING.contains(&cluster.status.as_str()) {
            return Ok(()); // a request is changing it; try again on the next round
        }
        let tenant = store::tenants::get(&tx, &cluster.tenant_id)
            .map_err(|e| e.to_string())?
            .ok_or("the cluster's tenant is gone")?;
        store::nodes::release(&tx, &dead.id).map_err(|e| e.to_string())?;
        let held = store::nodes::list(&tx, None, Some(&cluster.id))
            .map_err(|e| e.to_string())?
            .len();
        let picked = match nodes_to_add(&tx, &tenant.name, &cluster, held, now()) {
            Ok(p) => p,
            Err(why) => {
                drop(tx); // the dead node stays in the cluster
                let reason = format!(
                    "node {} unreachable; no replacement: {}",
                    dead.hostname,
                    why.message()
                );
                if cluster.status_reason != reason {
                    store::clusters::set_status(&conn, &cluster.id, "degraded", &reason)
                        .map_err(|e| e.to_string())?;
                    tracing::warn!(cluster = %cluster.name, %reason, "cannot replace an unreachable node");
                }
                return Err(reason);
            }
        };
        for n in &picked {
            if !store::nodes::assign(&tx, &n.id, &cluster.id).map_err(|e| e.to_string())? {
                return Err(format!("node {} was taken meanwhile; retrying", n.hostname));
            }
        }
        let changes =
            crate::mig::changes(&tx, &cluster.gpu_type, &picked, &cluster.mig_layout, &[])
                .map_err(|e| e.message().to_string())?;
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
        )
        .map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        (cluster, dead, picked, changes)
    };
    let converged = crate::mig::converge(state, &changes).await;
    let mut conn = state.db();
    let tx = conn.transaction().map_err(|e| e.to_string())?;
    let result = match converged {
        Ok(()) => {
            let (status, reason) =
                settled_status(&tx, &cluster.id).map_err(|e| e.message().to_string())?;
            store::clusters::set_status(&tx, &cluster.id, &status, &reason)
                .map_err(|e| e.to_string())?;
            tracing::info!(cluster = %cluster.name, node = %dead.hostname, "replaced an unreachable node");
            Ok(())
        }
        Err(e) => {
            for n in &added {
                store::nodes::release(&tx, &n.id).map_err(|e| e.to_string())?;
            }
            store::nodes::assign(&tx, &dead.id, &cluster.id).map_err(|e| e.to_string())?;
            let reason = format!(
                "node {} unreachable; its replacement failed: {}",
                dead.hostname,
                e.message()
            );
            store::clusters::set_status(&tx, &cluster.id, "degraded", &reason)
                .map_err(|e| e.to_string())?;
            Err(reason)
        }
    };
    tx.commit().map_err(|e| e.to_string())?;
    result
}

#[tonic::async_trait]
impl TenantClusterService for Clusters {
    async fn create_tenant_cluster(
        &self,
        r: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        self.create(r).await.map(Response::new)
    }
    async fn get_tenant_cluster(
        &self,
        r: Request<v1::GetTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        self.get(r).map(Response::new)
    }
    async fn list_tenant_clusters(
        &self,
        r: Request<v1::ListTenantClustersRequest>,
    ) -> Result<Response<v1::ListTenantClustersResponse>, Status> {
        self.list(r).map(Response::new)
    }
    async fn update_tenant_cluster(
        &self,
        r: Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        self.update(r).await.map(Response::new)
    }
    async fn delete_tenant_cluster(
        &self,
        r: Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        self.delete(r).await.map(Response::new)
    }
}
