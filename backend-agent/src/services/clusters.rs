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
    nodes::{NodeRow, ON_DEMAND, POOL},
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
        nodes: node_messages(conn, caller, nodes)?,
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

/// Assigns nodes to the cluster or releases its highest-numbered ones, to reach node_count.
/// Returns the released nodes.
fn scale(
    conn: &Connection,
    tenant_name: &str,
    cluster: &ClusterRow,
    t: i64,
) -> Result<Vec<NodeRow>, Status> {
    let mut current = store::nodes::list(conn, None, Some(&cluster.id)).map_err(db_error)?;
    let target = cluster.node_count as usize;
    if target > current.len() {
        for n in nodes_to_add(conn, tenant_name, cluster, current.len(), t)? {
            if !store::nodes::assign(conn, &n.id, &cluster.id).map_err(db_error)? {
                return Err(precondition(format!(
                    "node {} was taken by another cluster; retry",
                    n.hostname
                )));
            }
        }
    } else {
        current.sort_by(|a, b| b.hostname.cmp(&a.hostname));
        let released: Vec<NodeRow> = current.drain(..current.len() - target).collect();
        for n in &released {
            store::nodes::release(conn, &n.id).map_err(db_error)?;
        }
        return Ok(released);
    }
    Ok(Vec::new())
}

/// Puts the cluster's MIG layout on its nodes and whole GPUs back on released ones.
fn sync_layout(
    state: &AppState,
    conn: &Connection,
    cluster: &ClusterRow,
    released: &[NodeRow],
) -> Result<(), Status> {
    let nodes = store::nodes::list(conn, None, Some(&cluster.id)).map_err(db_error)?;
    crate::mig::sync(
        state,
        conn,
        &cluster.gpu_type,
        &nodes,
        &cluster.mig_layout,
        released,
    )
}

fn positive_or_unset(field: &str, value: i64) -> Result<(), Status> {
    if value < 0 {
        return Err(invalid(format!(
            "{field}: must be at least 1 (got {value})"
        )));
    }
    Ok(())
}

impl Clusters {
    fn create(
        &self,
        request: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
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
                return message(&tx, &caller, c);
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
            status: "running".into(),
            storage_path: dir.display().to_string(),
            mig_layout,
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
        if let Err(e) = sync_layout(&self.state, &tx, &cluster, &[]) {
            let _ = volumes::remove(&dir);
            return Err(e);
        }
        if let Err(e) = tx.commit() {
            let _ = volumes::remove(&dir);
            return Err(db_error(e));
        }
        tracing::info!(cluster = %cluster.name, tenant = %tenant.name, nodes = cluster.node_count, "created cluster");
        let conn = &*conn;
        let created = store::clusters::get(conn, &cluster.id)
            .map_err(db_error)?
            .ok_or_else(|| not_found("tenant cluster", &cluster.id))?;
        message(conn, &caller, created)
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

    fn update(
        &self,
        request: Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let mut conn = self.state.db();
        let tx = conn.transaction().map_err(db_error)?;
        let caller = authenticate(&self.state, &tx, &request)?;
        let req = request.into_inner();
        let mut c = visible_cluster(&tx, &caller, &req.id)?;
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
        let released = scale(&tx, &tenant.name, &c, now())?;
        store::clusters::update(&tx, &c).map_err(db_error)?;
        let dir = std::path::PathBuf::from(&c.storage_path);
        volumes::resize(&dir, c.storage_gib).map_err(|e| {
            Status::internal(format!(
                "cannot resize the storage directory {}: {e}",
                dir.display()
            ))
        })?;
        sync_layout(&self.state, &tx, &c, &released)?;
        tx.commit().map_err(db_error)?;
        let conn = &*conn;
        message(conn, &caller, c)
    }

    fn delete(
        &self,
        request: Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<v1::DeleteResponse, Status> {
        let mut conn = self.state.db();
        let tx = conn.transaction().map_err(db_error)?;
        let caller = authenticate(&self.state, &tx, &request)?;
        let c = visible_cluster(&tx, &caller, &request.get_ref().id)?;
        let nodes = store::nodes::list(&tx, None, Some(&c.id)).map_err(db_error)?;
        // Released nodes go back to whole GPUs before anyone else can get them.
        crate::mig::sync(&self.state, &tx, &c.gpu_type, &[], &c.mig_layout, &nodes)?;
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

#[tonic::async_trait]
impl TenantClusterService for Clusters {
    async fn create_tenant_cluster(
        &self,
        r: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        self.create(r).map(Response::new)
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
        self.update(r).map(Response::new)
    }
    async fn delete_tenant_cluster(
        &self,
        r: Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        self.delete(r).map(Response::new)
    }
}
