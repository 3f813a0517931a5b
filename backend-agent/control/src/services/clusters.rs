//! TenantClusterService: Kubernetes or Slurm clusters on dedicated nodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpufleet_proto::v1::{self, tenant_cluster_service_server::TenantClusterService};
use gpufleet_sql::Savepoint;
use gpufleet_sql::{AsConn, Conn};
use tonic::{Request, Response, Status};

use super::reservations::visible_reservation;
use super::{invalid, list_scope, node_messages, not_found, request_id_conflict, target_tenant};
use crate::auth::{authenticate, Caller};
use crate::cluster_status::{refuse_while_changing, settled_status};
use crate::fingerprint::Fingerprint;
use crate::lease::Fence;
use crate::rules;
use crate::scheduling::clusters::{layout_changes, scale, scale_reclaiming, undo_create};
use crate::scheduling::queue::Placed;
use crate::state::{db_error, AppState};
use crate::store::{self, clusters::ClusterRow, idempotency::Prior, nodes::NodeRow};
use crate::volumes::Volumes;
use crate::{access, catalog};

/// storage_gib when the request leaves it 0.
pub const DEFAULT_STORAGE_GIB: i64 = 100;

#[derive(Clone)]
pub struct Clusters {
    pub state: Arc<AppState>,
}

fn visible_cluster(conn: &impl AsConn, caller: &Caller, id: &str) -> Result<ClusterRow, Status> {
    match store::clusters::get(conn, id).map_err(db_error)? {
        Some(c) if caller.sees(&c.tenant_id) => Ok(c),
        _ => Err(not_found("tenant cluster", id)),
    }
}

fn message(
    conn: &impl AsConn,
    caller: &Caller,
    c: ClusterRow,
) -> Result<v1::TenantCluster, Status> {
    let mut nodes = store::nodes::list(conn, None, Some(&c.id)).map_err(db_error)?;
    let nodes_omitted = super::paging::shown_nodes(&mut nodes);
    let acceptance = super::health::cluster_acceptance(conn, &c.id)?;
    let preemption = store::preemption::get(conn, &c.id).map_err(db_error)?;
    let ssh_public_keys = match crate::slurm_clusters::is_slurm(&c) {
        true => store::slurm_access::get(conn, &c.id)
            .map_err(db_error)?
            .map(|a| a.ssh_public_keys)
            .unwrap_or_default(),
        false => Vec::new(),
    };
    Ok(v1::TenantCluster {
        ssh_public_keys,
        preemptible: preemption.is_some(),
        allow_on_demand: preemption.unwrap_or(false),
        acceptance_level: acceptance.level,
        min_bus_bandwidth_gbps: acceptance.min_bus_bandwidth_gbps,
        run_acceptance_on_create: acceptance.run_on_create,
        acceptance_status: acceptance.status,
        acceptance_nodes: acceptance.nodes,
        tenant_name: super::tenant_name(conn, &c.tenant_id)?,
        nodes: node_messages(conn, None, caller, nodes)?,
        nodes_omitted,
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
        cuda_version: c.cuda_version,
        driver_version: c.driver_version,
        max_unavailable: c.max_unavailable as i32,
        endpoint: c.endpoint,
        credentials: c.credentials,
        storage_path: c.storage_path,
        storage_retention: c.storage_retention,
        // Filled in from the storage by Get and List (see `with_used`), off this thread.
        storage_used_gib: 0,
    })
}

/// [`with_used`] of one cluster.
async fn with_used_one(
    state: &AppState,
    c: v1::TenantCluster,
) -> Result<v1::TenantCluster, Status> {
    let mut filled = with_used(state, vec![c]).await?;
    filled
        .pop()
        .ok_or_else(|| Status::internal("a read cluster went missing"))
}

/// The clusters' `storage_used_gib`, read from the storage off the async workers (or,
/// node-local, from what the nodes' agents last reported). A volume that cannot be read
/// answers 0 and is logged: the rest of the answer stands.
async fn with_used(
    state: &AppState,
    mut clusters: Vec<v1::TenantCluster>,
) -> Result<Vec<v1::TenantCluster>, Status> {
    if state.volumes.is_node_local() {
        for c in clusters.iter_mut() {
            c.storage_used_gib = state.agents.volume_use.used_gib(&c.storage_path);
        }
        return Ok(clusters);
    }
    if !state.volumes.is_shared() {
        return Ok(clusters);
    }
    let volumes = state.volumes.clone();
    super::blocking(move || {
        let dirs: Vec<_> = clusters
            .iter()
            .map(|c| volumes.dir_of(&c.tenant_id, &c.name, &c.storage_path))
            .collect();
        for (c, used) in clusters.iter_mut().zip(volumes.used_gib_all(&dirs)) {
            match used {
                Ok(used) => c.storage_used_gib = used,
                Err(e) => {
                    tracing::warn!(path = %c.storage_path, error = %e, "cannot read a volume's use")
                }
            }
        }
        Ok(clusters)
    })
    .await
}

fn positive_or_unset(field: &str, value: i64) -> Result<(), Status> {
    if value < 0 {
        return Err(invalid(format!(
            "{field}: must be at least 1 (got {value})"
        )));
    }
    Ok(())
}

/// Node-local volumes (no shared storage, external node agents) go with their nodes:
/// nothing can keep one for a later cluster.
fn check_retention(volumes: &Volumes, retention: &str) -> Result<(), Status> {
    if retention == "keep" && volumes.is_node_local() {
        return Err(super::error_details::refusal_on(
            tonic::Code::FailedPrecondition,
            "storage_retention",
            "storage_retention: \"keep\" needs the platform's shared storage (serve --shared-storage): without it each node of the cluster has a volume of its own, which goes with the node".to_string(),
        ));
    }
    Ok(())
}

/// Whether a volume of `gib` GiB can be at `dir`: a volume a deleted cluster kept there
/// (which the cluster attaches) is never shrunk, and the shared storage has room.
fn admit_volume(volumes: &Volumes, dir: &std::path::Path, gib: i64) -> Result<(), Status> {
    let refuse = |m: String| {
        super::error_details::refusal_on(tonic::Code::FailedPrecondition, "storage_gib", m)
    };
    let kept = volumes.kept_size_gib(dir).map_err(|e| {
        Status::internal(format!("cannot read the volume at {}: {e}", dir.display()))
    })?;
    if let Some(size) = kept.filter(|size| *size > gib) {
        return Err(refuse(format!(
            "storage_gib: volumes only grow: the volume kept at {} holds {size} GiB, which a cluster attaching it cannot shrink to {gib} GiB",
            dir.display()
        )));
    }
    volumes.check_room(dir, gib).map_err(refuse)
}

/// A validate_only answer: the cluster as the request would make it (nodes included), no
/// credentials issued.
fn dry_run_answer(
    conn: &impl AsConn,
    caller: &Caller,
    c: ClusterRow,
) -> Result<v1::TenantCluster, Status> {
    let mut answer = message(conn, caller, c)?;
    answer.credentials.clear();
    Ok(answer)
}

/// A create after its checks: the answer to give at once (a retried request's, or a
/// validate_only dry run's), or the new cluster (in the store, status "creating") with
/// the MIG changes its nodes need.
enum Prepared {
    Existing(v1::TenantCluster),
    New {
        caller: Caller,
        cluster: ClusterRow,
        changes: Vec<crate::mig::Change>,
        tenant_name: String,
        /// What it took back from other tenants' preemptible clusters, still to finish.
        taken_back: crate::scheduling::take_back::Reclaimed,
    },
}

/// An update after its checks: a dry run's answer, or the change committed as "updating".
enum PreparedUpdate {
    DryRun(Box<v1::TenantCluster>),
    Change(Box<UpdateChange>),
}

/// What an update decided: the cluster before and after, the nodes it adds and releases
/// and the MIG changes they need.
struct UpdateChange {
    caller: Caller,
    old: ClusterRow,
    /// The nodes the cluster held before (a failed update gives back any other).
    members_before: Vec<String>,
    c: ClusterRow,
    scaling: crate::scheduling::clusters::Scaling,
    changes: Vec<crate::mig::Change>,
    new_driver: bool,
    /// How long a Slurm cluster's nodes may take to finish their jobs before a layout
    /// change: the request's deadline, less time to answer.
    drain_within: std::time::Duration,
}

/// Events for nodes that joined (`allocated`, with the cluster's layout when it has one)
/// and left (`released`) the cluster.
fn record_membership(
    conn: &impl AsConn,
    c: &ClusterRow,
    joined: &[NodeRow],
    left: &[NodeRow],
    t: i64,
) -> gpufleet_sql::Result<()> {
    for n in joined {
        let layout = if c.mig_layout.is_empty() {
            "whole GPUs".to_string()
        } else {
            format!(
                "every GPU partitioned as {}",
                gpufleet_gpu::mig::render_layout(&c.mig_layout)
            )
        };
        let message = format!("{} node allocated to the cluster; {layout}", n.capacity);
        store::events::record(
            conn,
            t,
            &c.id,
            &c.tenant_id,
            "allocated",
            &n.hostname,
            &message,
        )?;
    }
    for n in left {
        store::events::record(
            conn,
            t,
            &c.id,
            &c.tenant_id,
            "released",
            &n.hostname,
            "node released, back to whole GPUs",
        )?;
    }
    Ok(())
}

/// The ids of the nodes `cluster_id` holds.
fn members(conn: &impl AsConn, cluster_id: &str) -> Result<Vec<String>, Status> {
    Ok(store::nodes::list(conn, None, Some(cluster_id))
        .map_err(db_error)?
        .into_iter()
        .map(|n| n.id)
        .collect())
}

/// max_unavailable from the wire: 0 means the default, 1.
fn max_unavailable_or_default(value: i32) -> Result<i64, Status> {
    match value {
        0 => Ok(1),
        1..=1000 => Ok(value.into()),
        _ => Err(invalid(format!(
            "max_unavailable: must be between 1 and 1000 (got {value})"
        ))),
    }
}

impl Clusters {
    /// The driver a cluster asks for (None: its nodes keep theirs).
    fn resolve_driver(
        &self,
        gpu_type: &str,
        cuda: &str,
        driver: &str,
        mig: bool,
    ) -> Result<Option<String>, Status> {
        if cuda.is_empty() && driver.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            self.state
                .drivers
                .resolve(gpu_type, cuda, driver, mig)?
                .version
                .to_string(),
        ))
    }

    /// Drains a Slurm cluster's `nodes` for a layout change and waits for their jobs, at
    /// most `limit`: a job still running then fails the update (nothing changed) rather
    /// than being killed by the new layout.
    async fn drain_for_layout(
        &self,
        c: &ClusterRow,
        nodes: &[NodeRow],
        limit: std::time::Duration,
    ) -> Result<(), crate::error::Error> {
        if nodes.is_empty() {
            return Ok(());
        }
        let reason = "changing the MIG layout";
        let draining = nodes
            .iter()
            .map(|n| {
                crate::scheduling::drivers::Event::new(
                    "node_draining",
                    &n.hostname,
                    "changing the MIG layout: running jobs finish first",
                )
            })
            .collect();
        crate::scheduling::drivers::events(&self.state, &Fence::request(), c, draining).await;
        crate::slurm_clusters::drain_nodes(&self.state, c, nodes, reason, limit)
            .await
            .map_err(|e| {
                crate::error::Error::Aborted(format!(
                    "mig_layout: the nodes were drained in Slurm for the new layout and waited for: {e}; the layout was not changed and the nodes are back in service: retry once their jobs are done (or cancelled), or give the update a longer timeouts.update"
                ))
            })
    }

    /// New nodes to the cluster's driver (a node that fails is quarantined, and the
    /// request fails), then the MIG changes.
    async fn bring_up(
        &self,
        cluster: &ClusterRow,
        joining: &[NodeRow],
        changes: &[crate::mig::Change],
    ) -> Result<(), crate::error::Error> {
        if !cluster.driver_version.is_empty() && !joining.is_empty() {
            // A replica that cannot send orders blames no node for their refusal.
            self.state.agents.refuse_without_epoch()?;
            super::progress::driver_installs(
                &self.state,
                cluster,
                joining,
                &cluster.driver_version,
            )
            .await;
            let failed =
                crate::scheduling::drivers::install(&self.state, joining, &cluster.driver_version)
                    .await;
            if !failed.is_empty() {
                let mut why = Vec::new();
                for (n, reason) in &failed {
                    crate::scheduling::drivers::quarantine(
                        &self.state,
                        &Fence::request(),
                        cluster,
                        n,
                        reason,
                    )
                    .await?;
                    why.push(format!("{}: {reason}", n.hostname));
                }
                return Err(crate::error::Error::Aborted(format!(
                    "driver_version: installing {} failed on {}; the node(s) were quarantined, retry to get others",
                    cluster.driver_version,
                    why.join("; ")
                )));
            }
        }
        super::progress::partitioning(&self.state, cluster, changes).await;
        crate::mig::converge(&self.state, changes).await?;
        // Then the acceptance checks (failed nodes are quarantined and replaced).
        crate::scheduling::health::accept_new_nodes(
            &self.state,
            &Fence::request(),
            cluster,
            joining,
        )
        .await
    }

    fn prepare_create(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<Prepared, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        // A dry run (validate_only) needs no request id: "" was never recorded.
        if !req.validate_only {
            rules::required("request_id", &req.request_id).map_err(invalid)?;
        }
        let tenant = target_tenant(&tx, &caller, &req.tenant_id)?;
        // Quotas the same plan raises or creates count as they will be (a dry run only).
        super::quotas::assume_planned(
            &tx,
            &caller,
            "planned_quotas",
            &req.planned_quotas,
            req.validate_only,
            None,
        )?;
        // A dry run whose name is taken still runs every other check (quota, capacity,
        // layout, driver), under a stand-in name, and says all it found at once.
        let taken = match req.validate_only {
            true => store::clusters::by_name(&tx, &tenant.id, &req.name).map_err(db_error)?,
            false => None,
        };
        let Some(existing) = taken else {
            return self.admit_create(tx, caller, tenant, req, false);
        };
        let name_taken = super::error_details::already_exists(
            "name",
            format!(
                "name: tenant '{}' already has a cluster named '{}' (id {})",
                tenant.name, req.name, existing.id
            ),
            &existing.id,
        );
        match self.admit_create(tx, caller, tenant, req, true) {
            // A retry of the create that made it (the same request id): the apply gets it.
            Ok(Prepared::Existing(c)) if c.id == existing.id => Ok(Prepared::Existing(c)),
            Ok(_) => Err(name_taken),
            // The taken name first (ALREADY_EXISTS): importing the existing cluster is the
            // answer, whatever the quota or capacity would say of a second one.
            Err(other) => Err(super::error_details::together(name_taken, other)),
        }
    }

    /// The create's checks and, unless it is a dry run, its writes. `stand_in_name`: a dry
    /// run whose name is taken, checked (and rolled back) under a name no cluster has.
    fn admit_create(
        &self,
        tx: Savepoint<'_>,
        caller: Caller,
        tenant: store::tenants::TenantRow,
        mut req: v1::CreateTenantClusterRequest,
        stand_in_name: bool,
    ) -> Result<Prepared, Status> {
        gpufleet_wire::names::dns_label("name", &req.name).map_err(invalid)?;
        rules::orchestrator(&req.orchestrator).map_err(invalid)?;
        crate::slurm_clusters::require(&self.state, &req.orchestrator)?;
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        rules::at_least("node_count", req.node_count, 1).map_err(invalid)?;
        positive_or_unset("storage_gib", req.storage_gib)?;
        let storage_gib = if req.storage_gib == 0 {
            DEFAULT_STORAGE_GIB
        } else {
            req.storage_gib
        };
        let max_unavailable = max_unavailable_or_default(req.max_unavailable)?;
        let storage_retention = match req.storage_retention.as_str() {
            "" => "delete".to_string(),
            r => {
                rules::storage_retention(r).map_err(invalid)?;
                check_retention(&self.state.volumes, r)?;
                r.to_string()
            }
        };
        let layout: BTreeMap<String, i32> = req.mig_layout.clone().into_iter().collect();
        let print = Fingerprint::of(&[
            &tenant.id,
            &req.name,
            &req.orchestrator,
            &req.gpu_type,
            &req.node_count,
            &req.reservation_id,
            &storage_gib,
            &layout,
            &req.cuda_version,
            &req.driver_version,
            &max_unavailable,
            &req.preemptible,
            &req.allow_on_demand,
            &storage_retention,
        ]);
        match store::idempotency::lookup(&tx, "cluster", &tenant.id, &req.request_id, &print)
            .map_err(db_error)?
        {
            Prior::Same(id) => match store::clusters::get(&tx, &id).map_err(db_error)? {
                // Done or still under way (a retry after a deadline): the same cluster.
                Some(c) => return message(&tx, &caller, c).map(Prepared::Existing),
                // Its cluster is gone since: the same request makes a new one.
                None => {
                    store::idempotency::forget_request(&tx, "cluster", &tenant.id, &req.request_id)
                        .map_err(db_error)?
                }
            },
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "tenant cluster")),
            Prior::New => {}
        }
        if stand_in_name {
            // After the request id's lookup, which knows the request by its real name.
            req.name = format!("{}.dry-run", req.name);
        }
        if let Some(existing) =
            store::clusters::by_name(&tx, &tenant.id, &req.name).map_err(db_error)?
        {
            return Err(super::error_details::already_exists(
                "name",
                format!(
                    "name: tenant '{}' already has a cluster named '{}' (id {})",
                    tenant.name, req.name, existing.id
                ),
                &existing.id,
            ));
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
        let driver = self.resolve_driver(
            &req.gpu_type,
            &req.cuda_version,
            &req.driver_version,
            !mig_layout.is_empty(),
        )?;
        let acceptance = super::health::create_settings(&self.state, &req)?;
        let dir = self.state.volumes.path(&tenant.id, &req.name);
        let storage_path = self.state.volumes.storage_path(&tenant.id, &req.name);
        admit_volume(&self.state.volumes, &dir, storage_gib)?;
        let mut cluster = ClusterRow {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.id.clone(),
            endpoint: access::endpoint(&req.orchestrator, &tenant.name, &req.name),
            credentials: access::credentials(&req.orchestrator, &tenant.name, &req.name).map_err(
                |e| Status::internal(format!("cannot issue the cluster's credentials: {e:#}")),
            )?,
            name: req.name,
            orchestrator: req.orchestrator,
            gpu_type: req.gpu_type,
            node_count: req.node_count,
            reservation_id: Some(req.reservation_id).filter(|r| !r.is_empty()),
            storage_gib,
            status: "creating".into(),
            storage_path,
            mig_layout,
            status_reason: String::new(),
            cuda_version: req.cuda_version,
            driver_version: driver.unwrap_or_default(),
            max_unavailable,
            storage_retention,
        };
        // A Slurm cluster's own controller and login ports, munge key and account.
        crate::slurm_clusters::check_ssh_public_keys(&cluster.orchestrator, &req.ssh_public_keys)?;
        let slurm = crate::slurm_clusters::prepare(&mut cluster)?;
        store::clusters::insert(&tx, &cluster).map_err(db_error)?;
        if let Some(new) = slurm {
            crate::slurm_clusters::record(
                &tx,
                &cluster.id,
                new,
                &req.ssh_public_keys,
                self.state.slurm_ports,
            )?;
        }
        super::health::store_created(&tx, &cluster.id, acceptance)?;
        crate::scheduling::preemption::mark(&tx, &cluster, req.preemptible, req.allow_on_demand)?;
        // Within the tenant's idle guarantee, pool nodes lent to other tenants' preemptible
        // clusters come back for it (`scheduling::take_back::for_owner`).
        let (now, replace_after) = (self.state.now(), self.state.agents.replace_after);
        let placed = crate::scheduling::queue::place_or_wait(
            &tx,
            &tenant.name,
            &cluster,
            (now, replace_after),
            req.wait_seconds,
        )?;
        let taken_back = match placed {
            Placed::Now(scaling) => scaling.taken_back,
            Placed::Waits(wait) => {
                crate::scheduling::queue::room_to_wait(&tx, &tenant.name, &cluster.tenant_id)?;
                cluster.status = "queued".into();
                cluster.status_reason = wait.reason().to_string();
                store::clusters::set_status(&tx, &cluster.id, "queued", wait.reason())
                    .map_err(db_error)?;
                if req.validate_only {
                    // The plan says the create will wait, and why.
                    return dry_run_answer(&tx, &caller, cluster).map(Prepared::Existing);
                }
                store::idempotency::record(
                    &tx,
                    "cluster",
                    &tenant.id,
                    &req.request_id,
                    &print,
                    &cluster.id,
                )
                .map_err(db_error)?;
                crate::scheduling::queue::enqueue(&tx, &cluster, now, req.wait_seconds)?;
                let answer = message(&tx, &caller, cluster)?;
                tx.commit().map_err(db_error)?;
                return Ok(Prepared::Existing(answer));
            }
        };
        // Refused before anything is sent or kept when a placed node's agent cannot make
        // the node-local volume (an agent of the previous release).
        if self.state.volumes.mounts_on_nodes() && self.state.volumes.is_node_local() {
            let placed = store::nodes::list(&tx, None, Some(&cluster.id)).map_err(db_error)?;
            let nodes = placed.iter().map(|n| (n.id.as_str(), n.hostname.as_str()));
            if let Some(why) = crate::node_volumes::unsupported(&self.state.agents, nodes) {
                return Err(super::error_details::refusal_on(
                    tonic::Code::FailedPrecondition,
                    "storage_path",
                    why,
                ));
            }
        }
        if req.validate_only {
            // The real create's admission passed; dropping `tx` rolls back the row and its
            // nodes, and nothing outside the database was touched. Its status_reason says
            // whom the create would preempt.
            cluster.status_reason = taken_back.said.clone();
            return dry_run_answer(&tx, &caller, cluster).map(Prepared::Existing);
        }
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
        // The volume belongs to the cluster's account (a Slurm cluster's), else to root.
        let owner = store::slurm_access::get(&tx, &cluster.id)
            .map_err(db_error)?
            .map(|a| a.uid);
        // Every check passed: now the side effects outside the database.
        let kept = dir.exists();
        self.state
            .volumes
            .create(&dir, storage_gib, owner)
            .map_err(|e| {
                Status::internal(format!(
                    "cannot create the cluster's volume {}: {e}",
                    dir.display()
                ))
            })?;
        if let Err(e) = tx.commit() {
            if !kept {
                let _ = self.state.volumes.remove(&dir);
            }
            return Err(db_error(e));
        }
        if kept {
            tracing::info!(cluster = %cluster.name, path = %dir.display(), "attached a kept volume");
        }
        Ok(Prepared::New {
            caller,
            cluster,
            changes,
            tenant_name: tenant.name,
            taken_back,
        })
    }

    async fn create(
        &self,
        request: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let this = self.clone();
        let prepared = self
            .state
            .write(move |sp| this.prepare_create(sp, request))
            .await?;
        let (caller, cluster, changes, tenant_name, taken_back) = match prepared {
            Prepared::Existing(c) => return Ok(c),
            Prepared::New {
                caller,
                cluster,
                changes,
                tenant_name,
                taken_back,
            } => (caller, cluster, changes, tenant_name, taken_back),
        };
        // The rest runs to the end even when the caller leaves (see `detached`).
        let this = self.clone();
        let id = cluster.id.clone();
        super::detached::run(self.state.clone(), id, "creating", async move {
            // The preempted clusters' on-demand replacements first: they lost their nodes
            // to this create when it committed.
            crate::scheduling::take_back::finish(&this.state, taken_back).await;
            this.complete_create(caller, cluster, changes, tenant_name)
                .await
        })
        .await
    }

    /// A create's orders to the agents and its record (or undo) of what they did.
    pub(super) async fn complete_create(
        &self,
        caller: Caller,
        cluster: ClusterRow,
        changes: Vec<crate::mig::Change>,
        tenant_name: String,
    ) -> Result<v1::TenantCluster, Status> {
        // The agents bring the nodes to the cluster's driver, then partition them; no lock
        // is held while they work.
        let joining: Vec<NodeRow> = changes.iter().map(|c| c.node.clone()).collect();
        if let Err(e) = self.bring_up(&cluster, &joining, &changes).await {
            self.undo_create(cluster).await;
            return Err(e.into());
        }
        // Every node mounts the cluster's volume before anything runs on it.
        let ids = joining.iter().map(|n| n.id.clone()).collect();
        if let Err(e) = crate::node_volumes::sync(&self.state, ids).await {
            self.undo_create(cluster).await;
            return Err(e.into());
        }
        // A Slurm cluster's controller and slurmd, once the nodes have their layout.
        let slurm = match crate::slurm_clusters::apply(&self.state, &cluster.id, &[]).await {
            Ok(why) => why,
            Err(e) => {
                crate::slurm_clusters::remove(&self.state, &cluster, &joining).await;
                self.undo_create(cluster).await;
                return Err(e.into());
            }
        };
        // The record in one transaction on the writer thread: a large cluster's events
        // commit once, and no async worker waits on SQLite.
        let (name, nodes) = (cluster.name.clone(), cluster.node_count);
        let (clock_now, replace_after) = (self.state.now(), self.state.agents.replace_after);
        let created = self
            .state
            .write(move |sp| -> Result<_, Status> {
                let (status, reason) = crate::slurm_clusters::overlay(
                    settled_status(&sp, &cluster.id, replace_after)?,
                    slurm,
                );
                store::clusters::set_status(&sp, &cluster.id, &status, &reason)
                    .map_err(db_error)?;
                let held = store::nodes::list(&sp, None, Some(&cluster.id)).map_err(db_error)?;
                if cluster.driver_version.is_empty() {
                    // No driver asked for: the cluster reads back what its nodes run.
                    if let Some(first) = held.first() {
                        let mut c = cluster.clone();
                        c.driver_version = first.driver_version.clone();
                        c.status = status.clone();
                        c.status_reason = reason.clone();
                        store::clusters::update(&sp, &c).map_err(db_error)?;
                    }
                }
                record_membership(&sp, &cluster, &held, &[], clock_now).map_err(db_error)?;
                let created = store::clusters::get(&sp, &cluster.id)
                    .map_err(db_error)?
                    .ok_or_else(|| not_found("tenant cluster", &cluster.id))?;
                let answer = message(&sp, &caller, created)?;
                sp.commit().map_err(db_error)?;
                Ok(answer)
            })
            .await?;
        tracing::info!(cluster = %name, tenant = %tenant_name, nodes, "created cluster");
        Ok(created)
    }

    /// Takes back a create that could not be completed, in one transaction. Its nodes are
    /// then brought back to whole GPUs where they are not (a node whose agent restarted
    /// may have finished the create's change after it failed).
    async fn undo_create(&self, cluster: ClusterRow) {
        let name = cluster.name.clone();
        let this_volumes = self.state.volumes.clone();
        let now = self.state.now();
        let undone = self
            .state
            .write(move |sp| -> Result<_, Status> {
                let held = members(&sp, &cluster.id)?;
                undo_create(&sp, &this_volumes, &cluster, now).map_err(db_error)?;
                sp.commit().map_err(db_error)?;
                Ok(held)
            })
            .await;
        match undone {
            Ok(held) => {
                for id in held {
                    tokio::spawn(crate::mig::reconcile_after_failure(self.state.clone(), id));
                }
            }
            Err(e) => {
                tracing::error!(cluster = %name, error = %e, "cannot undo a failed cluster create")
            }
        }
    }

    fn get(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let c = visible_cluster(&conn, &caller, &req.id)?;
        message(&conn, &caller, c)
    }

    fn list(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListTenantClustersRequest>,
    ) -> Result<v1::ListTenantClustersResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let scope = list_scope(&conn, &caller, &req.tenant_id)?;
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let rows = store::clusters::list(&conn, scope.as_deref(), None, None).map_err(db_error)?;
        let (clusters, next_page_token) = super::paging::page(
            rows,
            &page,
            |c| format!("{}\u{0}{}", c.tenant_id, c.name),
            |c| message(&conn, &caller, c),
        )?;
        Ok(v1::ListTenantClustersResponse {
            clusters,
            next_page_token,
        })
    }

    /// `c` with an update's changes applied (checked as they are taken in), and whether
    /// they give it another driver.
    fn updated(
        &self,
        c: &ClusterRow,
        req: &v1::UpdateTenantClusterRequest,
    ) -> Result<(ClusterRow, bool), Status> {
        let mut c = c.clone();
        // 0 leaves node_count / storage_gib unchanged (proto3 int64 has no presence).
        positive_or_unset("node_count", req.node_count)?;
        positive_or_unset("storage_gib", req.storage_gib)?;
        if req.storage_gib > 0 && req.storage_gib < c.storage_gib {
            return Err(super::error_details::refusal_on(
                tonic::Code::FailedPrecondition,
                "storage_gib",
                format!(
                    "storage_gib: volumes only grow: cannot shrink from {} to {} GiB",
                    c.storage_gib, req.storage_gib
                ),
            ));
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
        if req.max_unavailable != 0 {
            c.max_unavailable = max_unavailable_or_default(req.max_unavailable)?;
        }
        if !req.storage_retention.is_empty() {
            rules::storage_retention(&req.storage_retention).map_err(invalid)?;
            check_retention(&self.state.volumes, &req.storage_retention)?;
            c.storage_retention = req.storage_retention.clone();
        }
        let mut new_driver = false;
        if req.set_driver {
            c.cuda_version = req.cuda_version.clone();
            if let Some(v) = self.resolve_driver(
                &c.gpu_type,
                &req.cuda_version,
                &req.driver_version,
                !c.mig_layout.is_empty(),
            )? {
                new_driver = v != c.driver_version;
                c.driver_version = v;
            }
        }
        Ok((c, new_driver))
    }

    /// An update's checks and its decision, committed with status "updating" (or, for a
    /// validate_only dry run, the answer it would give).
    fn prepare_update(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<PreparedUpdate, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        let c = visible_cluster(&tx, &caller, &req.id)?;
        crate::scheduling::queue::refuse_while_queued(&c)?;
        if !req.validate_only {
            // A dry run asks about admission only; the apply joins a change under way.
            refuse_while_changing(&c)?;
        }
        let old = c.clone();
        let members_before = members(&tx, &c.id)?;
        let tenant = super::visible_tenant(&tx, &Caller::Admin, &c.tenant_id)?;
        super::quotas::assume_planned(
            &tx,
            &caller,
            "planned_quotas",
            &req.planned_quotas,
            req.validate_only,
            None,
        )?;
        let (mut c, new_driver) = self.updated(&old, &req)?;
        super::health::store_updated(&self.state, &tx, &c, &req)?;
        if req.set_ssh_public_keys {
            crate::slurm_clusters::check_ssh_public_keys(&c.orchestrator, &req.ssh_public_keys)?;
            store::slurm_access::set_ssh_public_keys(&tx, &c.id, &req.ssh_public_keys)
                .map_err(db_error)?;
        }
        if c.storage_gib > old.storage_gib {
            self.state
                .volumes
                .check_room(
                    &self
                        .state
                        .volumes
                        .dir_of(&c.tenant_id, &c.name, &c.storage_path),
                    c.storage_gib,
                )
                .map_err(|m| {
                    super::error_details::refusal_on(
                        tonic::Code::FailedPrecondition,
                        "storage_gib",
                        m,
                    )
                })?;
        }
        let (now, replace_after) = (self.state.now(), self.state.agents.replace_after);
        let scaling = scale_reclaiming(&tx, &tenant.name, &c, now, replace_after)?;
        if req.validate_only {
            // Admission passed; dropping `tx` rolls back the nodes it took (and took back).
            c.status_reason = scaling.taken_back.said.clone();
            return dry_run_answer(&tx, &caller, c).map(|a| PreparedUpdate::DryRun(Box::new(a)));
        }
        let changes = layout_changes(&tx, &c, &scaling.to_release)?;
        c.status = "updating".into();
        store::clusters::update(&tx, &c).map_err(db_error)?;
        // A new layout cuts the GPUs held into its profiles from now (usage per profile).
        store::usage::relayout(&tx, &c.id, now).map_err(db_error)?;
        let dir = self
            .state
            .volumes
            .dir_of(&c.tenant_id, &c.name, &c.storage_path);
        if c.storage_gib != old.storage_gib {
            // Online: the volume's limit rises; nothing is unmounted or copied.
            self.state
                .volumes
                .resize(&dir, c.storage_gib)
                .map_err(|e| {
                    Status::internal(format!(
                        "cannot grow the cluster's volume {}: {e}",
                        dir.display()
                    ))
                })?;
        }
        tx.commit().map_err(db_error)?;
        Ok(PreparedUpdate::Change(Box::new(UpdateChange {
            caller,
            old,
            members_before,
            c,
            scaling,
            changes,
            new_driver,
            drain_within: crate::slurm_clusters::DRAIN_WITHIN,
        })))
    }

    async fn update(
        &self,
        request: Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<v1::TenantCluster, Status> {
        let this = self.clone();
        let drain_within = drain_within(request.metadata());
        let mut u = match self
            .state
            .write(move |sp| this.prepare_update(sp, request))
            .await?
        {
            PreparedUpdate::DryRun(answer) => return Ok(*answer),
            PreparedUpdate::Change(u) => *u,
        };
        u.drain_within = drain_within;
        // The rest runs to the end even when the caller leaves (see `detached`).
        let this = self.clone();
        let id = u.c.id.clone();
        super::detached::run(self.state.clone(), id, "updating", async move {
            this.complete_update(u).await
        })
        .await
    }

    /// An update's orders to the agents (driver, layout, then the driver roll) and its
    /// record of what they did, or its undo.
    async fn complete_update(&self, u: UpdateChange) -> Result<v1::TenantCluster, Status> {
        let UpdateChange {
            caller,
            old,
            members_before,
            c,
            mut scaling,
            changes,
            new_driver,
            drain_within,
        } = u;
        // The preempted clusters' on-demand replacements first: they lost their nodes to
        // this growth when it committed.
        let taken_back = std::mem::take(&mut scaling.taken_back);
        crate::scheduling::take_back::finish(&self.state, taken_back).await;
        // A Slurm cluster's leaving nodes are drained first: their running jobs finish
        // before their GPUs go back to whole GPUs and their slurmd stops.
        if crate::slurm_clusters::is_slurm(&c) {
            let draining = scaling
                .to_release
                .iter()
                .map(|n| {
                    crate::scheduling::drivers::Event::new(
                        "node_draining",
                        &n.hostname,
                        "leaving the cluster (scale down): running jobs finish first",
                    )
                })
                .collect();
            crate::scheduling::drivers::events(&self.state, &Fence::request(), &c, draining).await;
            crate::slurm_clusters::drain_all(
                &self.state,
                &c,
                &scaling.to_release,
                "leaving the cluster (scale down)",
            )
            .await;
        }
        // A Slurm cluster's nodes that stay and change layout are drained too: their jobs
        // finish on the slices they run on, then the layout changes.
        let relayout: Vec<NodeRow> = if crate::slurm_clusters::is_slurm(&c) {
            changes
                .iter()
                .filter(|ch| ch.needed() && members_before.contains(&ch.node.id))
                .filter(|ch| !scaling.to_release.iter().any(|n| n.id == ch.node.id))
                .map(|ch| ch.node.clone())
                .collect()
        } else {
            Vec::new()
        };
        let drained = self.drain_for_layout(&c, &relayout, drain_within).await;
        // Joining nodes get the cluster's driver first, then every node its layout.
        let converged = match drained {
            Ok(()) => self.bring_up(&c, &scaling.added, &changes).await,
            Err(e) => Err(e),
        };
        if let Err(e) = converged {
            for n in &relayout {
                crate::slurm_clusters::resume(&self.state, &c, &n.hostname).await;
            }
            // Back to the cluster as it was: every node it did not hold before released
            // (the new ones, and replacements of new ones that failed their checks), the
            // old row restored.
            let restore = old.clone();
            let now = self.state.now();
            self.state
                .write(move |sp| -> Result<_, Status> {
                    for n in store::nodes::list(&sp, None, Some(&restore.id)).map_err(db_error)? {
                        if !members_before.contains(&n.id) {
                            store::nodes::release(&sp, &n.id, now).map_err(db_error)?;
                        }
                    }
                    store::clusters::update(&sp, &restore).map_err(db_error)?;
                    store::usage::relayout(&sp, &restore.id, now).map_err(db_error)?;
                    sp.commit().map_err(db_error)
                })
                .await?;
            // A node whose change failed part-way (its agent restarted and finished it,
            // or left it half-way) is brought to the restored layout once its orders end.
            for ch in &changes {
                tokio::spawn(crate::mig::reconcile_after_failure(
                    self.state.clone(),
                    ch.node.id.clone(),
                ));
            }
            let (path, gib) = (
                self.state
                    .volumes
                    .dir_of(&old.tenant_id, &old.name, &old.storage_path),
                old.storage_gib,
            );
            let volumes = self.state.volumes.clone();
            super::blocking(move || {
                if let Err(io) = volumes.resize(&path, gib) {
                    tracing::warn!(path = %path.display(), error = %io, "cannot restore the storage size of a failed update");
                }
                Ok(())
            })
            .await?;
            return Err(e.into());
        }
        let leaving = scaling.to_release.clone();
        let now = self.state.now();
        self.state
            .write(move |sp| -> Result<_, Status> {
                for n in &leaving {
                    store::nodes::release(&sp, &n.id, now).map_err(db_error)?;
                }
                sp.commit().map_err(db_error)
            })
            .await?;
        // Joining nodes mount the cluster's volume, leaving ones unmount it; with
        // node-local volumes, every node grows its own to a larger storage_gib.
        let grown = match c.storage_gib > old.storage_gib && self.state.volumes.is_node_local() {
            true => members_before.clone(),
            false => Vec::new(),
        };
        let mut moved: Vec<String> = scaling
            .added
            .iter()
            .chain(&scaling.to_release)
            .map(|n| n.id.clone())
            .collect();
        for id in grown {
            if !scaling.to_release.iter().any(|n| n.id == id) && !moved.contains(&id) {
                moved.push(id);
            }
        }
        if let Err(e) = crate::node_volumes::sync(&self.state, moved).await {
            tracing::warn!(cluster = %c.name, error = %e, "an update's nodes did not all get their volumes");
        }
        // A Slurm cluster's controller and slurmd follow its new nodes and layout.
        let slurm = crate::slurm_clusters::apply_resuming(
            &self.state,
            &c.id,
            &scaling.to_release,
            &relayout,
        )
        .await
        .unwrap_or_else(|e| Some(format!("Slurm: {e}")));
        {
            let (c, relayout) = (c.clone(), c.mig_layout != old.mig_layout);
            let clock_now = self.state.now();
            self.state
                .write(move |sp| -> Result<_, Status> {
                    record_membership(&sp, &c, &scaling.added, &scaling.to_release, clock_now)
                        .map_err(db_error)?;
                    if relayout {
                        let layout = if c.mig_layout.is_empty() {
                            "whole GPUs".to_string()
                        } else {
                            gpufleet_gpu::mig::render_layout(&c.mig_layout)
                        };
                        store::events::record(
                            &sp,
                            clock_now,
                            &c.id,
                            &c.tenant_id,
                            "partitioned",
                            "",
                            &format!("every GPU re-partitioned as {layout}"),
                        )
                        .map_err(db_error)?;
                    }
                    sp.commit().map_err(db_error)
                })
                .await?;
        }
        // A new driver rolls through the nodes, max_unavailable at a time.
        let problems = if new_driver {
            crate::scheduling::drivers::roll(&self.state, &c).await?
        } else {
            Vec::new()
        };
        let (driver, replace_after) = (c.driver_version.clone(), self.state.agents.replace_after);
        let answer = self
            .state
            .write(move |sp| -> Result<_, Status> {
                let now_row = store::clusters::get(&sp, &c.id)
                    .map_err(db_error)?
                    .ok_or_else(|| not_found("tenant cluster", &c.id))?;
                if now_row.status != "degraded" {
                    let (status, reason) = crate::slurm_clusters::overlay(
                        settled_status(&sp, &c.id, replace_after)?,
                        slurm,
                    );
                    store::clusters::set_status(&sp, &c.id, &status, &reason).map_err(db_error)?;
                }
                let c = store::clusters::get(&sp, &c.id)
                    .map_err(db_error)?
                    .ok_or_else(|| not_found("tenant cluster", &c.id))?;
                let answer = message(&sp, &caller, c)?;
                sp.commit().map_err(db_error)?;
                Ok(answer)
            })
            .await?;
        if !problems.is_empty() {
            return Err(Status::aborted(format!(
                "driver_version: the cluster now runs {driver} where it could; {}",
                problems.join("; ")
            )));
        }
        Ok(answer)
    }

    /// Brings a settled cluster that holds fewer nodes than its node_count (quarantines
    /// with no replacement left) back to it when capacity allows: an update of its own,
    /// under the same admission, checks and undo as a tenant's scale-up. Without a node
    /// to add, its status says how short it is and why.
    async fn refill(&self, id: String) -> Result<(), Status> {
        let now = self.state.now();
        // A singleton's decision: a former leader of the singletons' lease takes no nodes.
        let fence = Fence::singleton(self.state.lease().clone());
        let prepared = self
            .state
            .write(move |sp| prepare_refill(sp, &fence, &id, now))
            .await?;
        match prepared {
            Some(u) => self.complete_update(u).await.map(|_| ()),
            None => Ok(()),
        }
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<v1::DeleteResponse, Status> {
        let this = self.clone();
        let now = self.state.now();
        let deleting = self
            .state
            .write(move |tx| -> Result<_, Status> {
                let (caller, req) = super::enter(&this.state, &tx, request)?;
                let c = visible_cluster(&tx, &caller, &req.id)?;
                if c.status == "queued" {
                    // It holds nothing: it just goes.
                    crate::scheduling::queue::forget(
                        &tx,
                        &c,
                        now,
                        "deleted",
                        "the queued cluster was deleted before it was admitted; it held nothing",
                    )?;
                    tx.commit().map_err(db_error)?;
                    return Ok(None);
                }
                refuse_while_changing(&c)?;
                let nodes = store::nodes::list(&tx, None, Some(&c.id)).map_err(db_error)?;
                // Released nodes go back to whole GPUs before anyone else can get them.
                let changes = layout_changes(&tx, &c, &nodes)?;
                store::clusters::set_status(&tx, &c.id, "deleting", "").map_err(db_error)?;
                tx.commit().map_err(db_error)?;
                Ok(Some((c, nodes, changes)))
            })
            .await?;
        let Some((c, nodes, changes)) = deleting else {
            return Ok(v1::DeleteResponse {});
        };
        // The rest runs to the end even when the caller leaves (see `detached`).
        let this = self.clone();
        let id = c.id.clone();
        super::detached::run(self.state.clone(), id, "deleting", async move {
            this.complete_delete(c, nodes, changes).await
        })
        .await
    }

    /// A delete's orders to the agents (back to whole GPUs) and its record, or its undo.
    async fn complete_delete(
        &self,
        c: ClusterRow,
        nodes: Vec<NodeRow>,
        changes: Vec<crate::mig::Change>,
    ) -> Result<v1::DeleteResponse, Status> {
        // A Slurm cluster's daemons stop first (a delete that fails later gets them back
        // from the Slurm supervisor).
        crate::slurm_clusters::remove(&self.state, &c, &nodes).await;
        super::progress::partitioning(&self.state, &c, &changes).await;
        let converged = crate::mig::converge(&self.state, &changes).await;
        if let Err(e) = converged {
            let (id, status, reason) = (c.id.clone(), c.status.clone(), c.status_reason.clone());
            self.state
                .write(move |sp| -> Result<_, Status> {
                    store::clusters::set_status(&sp, &id, &status, &reason).map_err(db_error)?;
                    sp.commit().map_err(db_error)
                })
                .await?;
            return Err(e.into());
        }
        // Nodes released, the cluster gone, and its events, in one transaction.
        let freed: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
        let deleted = c.clone();
        let clock_now = self.state.now();
        self.state
            .write(move |sp| -> Result<_, Status> {
                for n in &nodes {
                    store::nodes::release(&sp, &n.id, clock_now).map_err(db_error)?;
                }
                store::clusters::delete(&sp, &deleted.id).map_err(db_error)?;
                store::idempotency::forget(&sp, &deleted.id).map_err(db_error)?;
                store::health::forget_cluster(&sp, &deleted.id).map_err(db_error)?;
                record_membership(&sp, &deleted, &[], &nodes, clock_now).map_err(db_error)?;
                store::events::record(
                    &sp,
                    clock_now,
                    &deleted.id,
                    &deleted.tenant_id,
                    "deleted",
                    "",
                    &match deleted.storage_retention.as_str() {
                        "keep" => format!(
                            "the cluster was deleted; its nodes went back to whole GPUs; its volume is kept at {} for a later cluster named {}",
                            deleted.storage_path, deleted.name
                        ),
                        _ => "the cluster was deleted; its nodes went back to whole GPUs".to_string(),
                    },
                )
                .map_err(db_error)?;
                sp.commit().map_err(db_error)
            })
            .await?;
        // The freed nodes unmount the volume before it goes (or is kept).
        if let Err(e) = crate::node_volumes::sync(&self.state, freed).await {
            tracing::warn!(cluster = %c.name, error = %e, "a deleted cluster's nodes did not all unmount its volume");
        }
        let (path, keep) = (
            self.state
                .volumes
                .dir_of(&c.tenant_id, &c.name, &c.storage_path),
            c.storage_retention == "keep",
        );
        let volumes = self.state.volumes.clone();
        super::blocking(move || {
            if keep {
                // storage_retention = "keep": the team's data stays for a later cluster.
                tracing::info!(path = %path.display(), "cluster deleted; its volume is kept");
            } else if let Err(e) = volumes.remove(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cluster deleted but its volume could not be removed");
            }
            Ok(())
        })
        .await?;
        tracing::info!(cluster = %c.name, "deleted cluster");
        Ok(v1::DeleteResponse {})
    }
}

/// How long an update may wait for a Slurm cluster's jobs before its layout changes: the
/// caller's deadline (`grpc-timeout`), less a tenth (at most 10 s) to answer in time;
/// without one, [`crate::slurm_clusters::DRAIN_WITHIN`].
fn drain_within(metadata: &tonic::metadata::MetadataMap) -> std::time::Duration {
    let Some(timeout) = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(grpc_timeout)
    else {
        return crate::slurm_clusters::DRAIN_WITHIN;
    };
    timeout.saturating_sub((timeout / 10).min(std::time::Duration::from_secs(10)))
}

/// A `grpc-timeout` header's value: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(text: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Retries that find their change under way (a caller back after its deadline): they wait
/// for that change rather than being refused.
impl Clusters {
    /// The caller and the cluster `id`, read on a blocking thread.
    async fn look_up<T: Clone + Send + 'static + crate::intent::Intent>(
        &self,
        request: &Request<T>,
        id: String,
    ) -> Result<(Caller, ClusterRow), Status> {
        let mut probe = Request::new(request.get_ref().clone());
        *probe.metadata_mut() = request.metadata().clone();
        // A call that joins a change under way is recorded like one that made it.
        if let Some(note) = request.extensions().get::<crate::audit::Note>() {
            probe.extensions_mut().insert(note.clone());
        }
        if let Some(method) = request.extensions().get::<tonic::GrpcMethod>() {
            probe.extensions_mut().insert(method.clone());
        }
        let this = self.clone();
        self.state
            .read(move |conn| -> Result<_, Status> {
                let caller = authenticate(&this.state, conn, &probe)?;
                let c = visible_cluster(conn, &caller, &id)?;
                Ok((caller, c))
            })
            .await
    }

    /// An update of a cluster already being updated (or created) to just what it asks: the
    /// answer once that change settles. None: an update of its own (nothing under way,
    /// another target, or the first one did not take), which answers every other case.
    async fn join_update(
        &self,
        request: &Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<Option<v1::TenantCluster>, Status> {
        if request.get_ref().validate_only {
            return Ok(None); // a dry run never waits
        }
        let Ok((caller, c)) = self.look_up(request, request.get_ref().id.clone()).await else {
            return Ok(None);
        };
        // (A cluster still being created counts too: an update that asks for nothing new
        // from it waits for the create.)
        if !["creating", "updating"].contains(&c.status.as_str()) {
            return Ok(None);
        }
        let Ok((target, _)) = self.updated(&c, request.get_ref()) else {
            return Ok(None);
        };
        if !super::detached::same_target(&c, &target) {
            return Ok(None);
        }
        match super::detached::settled(&self.state, &c.id, &c.status).await? {
            Some(now) if super::detached::same_target(&now, &target) => self
                .state
                .read(move |conn| message(conn, &caller, now))
                .await
                .map(Some),
            _ => Ok(None),
        }
    }

    /// A delete of a cluster already being deleted: done once that delete is. None: a
    /// delete of its own (nothing under way, or the first one failed).
    async fn join_delete(
        &self,
        request: &Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<Option<v1::DeleteResponse>, Status> {
        let Ok((_, c)) = self.look_up(request, request.get_ref().id.clone()).await else {
            return Ok(None);
        };
        if c.status != "deleting" {
            return Ok(None);
        }
        Ok(super::detached::settled(&self.state, &c.id, "deleting")
            .await?
            .is_none()
            .then_some(v1::DeleteResponse {}))
    }
}

#[tonic::async_trait]
impl TenantClusterService for Clusters {
    async fn create_tenant_cluster(
        &self,
        r: Request<v1::CreateTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        let created = self.create(r).await?;
        with_used_one(&self.state, created).await.map(Response::new)
    }
    async fn get_tenant_cluster(
        &self,
        r: Request<v1::GetTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        let answer = super::reading(&self.state, self, r, Self::get).await?;
        with_used_one(&self.state, answer.into_inner())
            .await
            .map(Response::new)
    }
    async fn list_tenant_clusters(
        &self,
        r: Request<v1::ListTenantClustersRequest>,
    ) -> Result<Response<v1::ListTenantClustersResponse>, Status> {
        let mut answer = super::reading(&self.state, self, r, Self::list)
            .await?
            .into_inner();
        answer.clusters = with_used(&self.state, std::mem::take(&mut answer.clusters)).await?;
        Ok(Response::new(answer))
    }
    async fn update_tenant_cluster(
        &self,
        r: Request<v1::UpdateTenantClusterRequest>,
    ) -> Result<Response<v1::TenantCluster>, Status> {
        let updated = match self.join_update(&r).await? {
            Some(settled) => settled,
            None => self.update(r).await?,
        };
        with_used_one(&self.state, updated).await.map(Response::new)
    }
    async fn delete_tenant_cluster(
        &self,
        r: Request<v1::DeleteTenantClusterRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        if let Some(done) = self.join_delete(&r).await? {
            return Ok(Response::new(done));
        }
        self.delete(r).await.map(Response::new)
    }
}

/// A refill's decision and its first write, in one transaction after the fence: the
/// nodes it adds (the cluster `updating`), or the cluster's reason saying why none yet.
/// Its change then runs to the end as a tenant's update does (`complete_update`, not
/// fenced): stopped half-way it would leave the cluster `updating` with nobody to finish.
fn prepare_refill(
    mut sp: Savepoint<'_>,
    fence: &Fence,
    id: &str,
    now: i64,
) -> Result<Option<UpdateChange>, Status> {
    fence.check(&sp)?;
    let Some(mut c) = store::clusters::get(&sp, id).map_err(db_error)? else {
        return Ok(None);
    };
    if c.status != "degraded" {
        return Ok(None); // a request is changing it, or it is whole again
    }
    let tenant = super::visible_tenant(&sp, &Caller::Admin, &c.tenant_id)?;
    let old = c.clone();
    let members_before = members(&sp, &c.id)?;
    let scaling = match scale(&sp, &tenant.name, &c, now) {
        Ok(s) if !s.added.is_empty() => s,
        Ok(_) => return Ok(None),
        Err(why) => {
            sp.rollback().map_err(db_error)?;
            let reason = format!(
                "short of node_count: {} of {} nodes; none to add yet: {}",
                members_before.len(),
                c.node_count,
                Status::from(why).message()
            );
            if c.status_reason != reason {
                store::clusters::set_status(&sp, &c.id, "degraded", &reason).map_err(db_error)?;
                sp.commit().map_err(db_error)?;
            }
            return Ok(None);
        }
    };
    let changes = layout_changes(&sp, &c, &[])?;
    c.status = "updating".into();
    store::clusters::update(&sp, &c).map_err(db_error)?;
    sp.commit().map_err(db_error)?;
    tracing::info!(cluster = %c.name, adding = scaling.added.len(), "refilling a cluster short of its node_count");
    Ok(Some(UpdateChange {
        caller: Caller::Admin,
        old,
        members_before,
        c,
        scaling,
        changes,
        new_driver: false,
        drain_within: crate::slurm_clusters::DRAIN_WITHIN,
    }))
}

/// How often clusters short of their node_count look for nodes again.
const REFILL_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Refills clusters short of their node_count, retrying every [`REFILL_EVERY`] until
/// `stop` turns true: a node returned or freed is taken as soon as it is ready.
pub async fn run_refills(state: Arc<AppState>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let clusters = Clusters {
        state: state.clone(),
    };
    loop {
        tokio::select! {
            _ = gpufleet_process::signals::stopped(&mut stop) => return,
            _ = tokio::time::sleep(REFILL_EVERY) => {}
        }
        let short = state
            .read(|conn| Ok::<_, crate::error::Error>(store::clusters::short_of_nodes(conn)?))
            .await;
        let short = match short {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot list clusters short of nodes");
                continue;
            }
        };
        for c in short {
            if let Err(e) = clusters.refill(c.id.clone()).await {
                tracing::warn!(cluster = %c.name, error = %e.message(), "refilling the cluster failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store;

    #[test]
    fn a_former_leaders_refill_takes_no_node_and_the_leaders_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = store::open(&dir.path().join("state.db")).unwrap();
        crate::lease::testing::seed(&conn);
        let mut c1 = store::clusters::get(&conn, "c1").unwrap().unwrap();
        (c1.node_count, c1.status) = (2, "degraded".into());
        store::clusters::update(&conn, &c1).unwrap();
        let (stale, current) = crate::lease::testing::stale_and_current(&mut conn);
        let tx = conn.transaction().unwrap();
        let refused = super::prepare_refill(
            gpufleet_sql::Savepoint::begin(gpufleet_sql::Conn::sqlite(&tx)).unwrap(),
            &stale,
            "c1",
            2000,
        )
        .err()
        .expect("a former leader's refill was not refused");
        drop(tx);
        assert!(refused.message().contains("writes nothing"), "{refused:?}");
        let after = store::clusters::get(&conn, "c1").unwrap().unwrap();
        assert_eq!(
            (after.status.as_str(), after.status_reason.as_str()),
            ("degraded", "")
        );
        assert_eq!(
            store::nodes::get(&conn, "n2").unwrap().unwrap().cluster_id,
            None
        );
        let tx = conn.transaction().unwrap();
        let refill = super::prepare_refill(
            gpufleet_sql::Savepoint::begin(gpufleet_sql::Conn::sqlite(&tx)).unwrap(),
            &current,
            "c1",
            2000,
        )
        .unwrap();
        tx.commit().unwrap();
        // The leader's takes the free node; the change goes on as an update's.
        let added: Vec<String> = refill
            .expect("the leader's refill added nothing")
            .scaling
            .added
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(added, ["n2"]);
        let after = store::clusters::get(&conn, "c1").unwrap().unwrap();
        assert_eq!(after.status, "updating");
        let n2 = store::nodes::get(&conn, "n2").unwrap().unwrap();
        assert_eq!(n2.cluster_id.as_deref(), Some("c1"));
    }

    #[test]
    fn a_drain_waits_for_the_callers_deadline_less_time_to_answer() {
        assert_eq!(super::grpc_timeout("30S"), Some(Duration::from_secs(30)));
        assert_eq!(super::grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            super::grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        for bad in ["", "S", "123456789S", "10x", "-1S", "1.5S"] {
            assert_eq!(super::grpc_timeout(bad), None, "{bad}");
        }
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(
            super::drain_within(&md),
            crate::slurm_clusters::DRAIN_WITHIN
        );
        md.insert("grpc-timeout", "30M".parse().unwrap());
        assert_eq!(super::drain_within(&md), Duration::from_secs(1790));
        md.insert("grpc-timeout", "20S".parse().unwrap());
        assert_eq!(super::drain_within(&md), Duration::from_secs(18));
    }
}
