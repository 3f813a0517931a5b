//! HealthService: a cluster's health checks on demand, and its latest report. A tenant
//! sees only its own clusters' reports (another tenant's cluster is NOT_FOUND).

use std::sync::Arc;
use std::time::Duration;

use gpufleet_proto::v1::{self, health_service_server::HealthService};
use gpufleet_sql::{AsConn, Conn};
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::scheduling::health;
use crate::state::{db_error, AppState};
use crate::store::{self, clusters::ClusterRow, health::ResultRow};

#[derive(Clone)]
pub struct Health {
    pub state: Arc<AppState>,
}

fn visible_cluster(conn: &impl AsConn, caller: &Caller, id: &str) -> Result<ClusterRow, Status> {
    match store::clusters::get(conn, id).map_err(db_error)? {
        Some(c) if caller.sees(&c.tenant_id) => Ok(c),
        _ => Err(super::not_found("tenant cluster", id)),
    }
}

fn node_health(r: ResultRow, with_checks: bool) -> v1::NodeHealth {
    v1::NodeHealth {
        node: r.node,
        level: r.level,
        verdict: r.verdict,
        checked_at: super::to_timestamp(r.finished_at),
        summary: r.summary,
        checks: if with_checks {
            r.checks
                .into_iter()
                .map(|c| v1::HealthCheckResult {
                    name: c.name,
                    gpu_uuid: c.gpu_uuid,
                    verdict: c.verdict,
                    value: c.value,
                    threshold: c.threshold,
                    detail: c.detail,
                    peer: c.peer,
                    gbps: c.gbps,
                })
                .collect()
        } else {
            Vec::new()
        },
        action: r.action,
    }
}

/// The cluster's acceptance settings and each node's latest result: the nodes it has
/// now, and those its latest run took out.
pub fn report(
    conn: &impl AsConn,
    cluster_id: &str,
    with_checks: bool,
) -> Result<v1::ClusterHealthReport, Status> {
    let a = store::health::acceptance(conn, cluster_id).map_err(db_error)?;
    let members: Vec<String> = store::nodes::list(conn, None, Some(cluster_id))
        .map_err(db_error)?
        .into_iter()
        .map(|n| n.id)
        .collect();
    let nodes = store::health::latest_for_cluster(conn, cluster_id)
        .map_err(db_error)?
        .into_iter()
        .filter(|r| members.contains(&r.node_id) || (!a.run_id.is_empty() && r.run_id == a.run_id))
        .map(|r| node_health(r, with_checks))
        .collect();
    Ok(v1::ClusterHealthReport {
        cluster_id: cluster_id.to_string(),
        level: if a.run_level.is_empty() {
            a.level.clone()
        } else {
            a.run_level.clone()
        },
        status: a.status,
        checked_at: (a.checked_at > 0)
            .then(|| super::to_timestamp(a.checked_at))
            .flatten(),
        nodes,
        alg_bandwidth_gbps: a.alg_bandwidth_gbps,
        bus_bandwidth_gbps: a.bus_bandwidth_gbps,
        min_bus_bandwidth_gbps: a.min_bus_bandwidth_gbps,
        run_id: a.run_id,
    })
}

/// The acceptance fields of a TenantCluster message.
pub struct ClusterAcceptance {
    pub level: String,
    pub min_bus_bandwidth_gbps: f64,
    pub run_on_create: bool,
    pub status: String,
    pub nodes: Vec<v1::NodeHealth>,
}

/// The per-node summary is the cluster's latest run's (acceptance or on demand): it
/// stays the same across restarts and periodic checks, which the report shows.
pub fn cluster_acceptance(
    conn: &impl AsConn,
    cluster_id: &str,
) -> Result<ClusterAcceptance, Status> {
    let a = store::health::acceptance(conn, cluster_id).map_err(db_error)?;
    let nodes = if a.run_id.is_empty() {
        Vec::new()
    } else {
        store::health::run_results(conn, cluster_id, &a.run_id)
            .map_err(db_error)?
            .into_iter()
            .map(|r| node_health(r, false))
            .collect()
    };
    Ok(ClusterAcceptance {
        level: a.level,
        min_bus_bandwidth_gbps: a.min_bus_bandwidth_gbps,
        run_on_create: a.run_on_create,
        status: a.status,
        nodes,
    })
}

/// Bandwidth-test duration from the wire: 0 is the server's default.
fn duration(state: &AppState, ms: u32) -> Result<Duration, Status> {
    match ms {
        0 => Ok(state.health.bandwidth_duration),
        50..=60_000 => Ok(Duration::from_millis(ms.into())),
        _ => Err(super::invalid(format!(
            "bandwidth_duration_ms: must be between 50 and 60000 (got {ms})"
        ))),
    }
}

impl Health {
    async fn run_health_check(
        &self,
        request: Request<v1::RunHealthCheckRequest>,
    ) -> Result<v1::ClusterHealthReport, Status> {
        let state = self.state.clone();
        let (cluster, level, every) = self
            .state
            .read(move |conn| -> Result<_, Status> {
                let (caller, req) = super::enter(&state, conn, request)?;
                let c = visible_cluster(conn, &caller, &req.cluster_id)?;
                crate::cluster_status::refuse_while_changing(&c)?;
                let level = if req.level.is_empty() {
                    store::health::acceptance(conn, &c.id)
                        .map_err(db_error)?
                        .level
                } else {
                    health::level("level", &req.level)?
                };
                let every = duration(&state, req.bandwidth_duration_ms)?;
                Ok((c, level, every))
            })
            .await?;
        health::check_now(&self.state, &cluster, &level, every).await?;
        self.state
            .read(move |conn| report(conn, &cluster.id, true))
            .await
    }

    fn get_health_report(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetHealthReportRequest>,
    ) -> Result<v1::ClusterHealthReport, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let c = visible_cluster(&conn, &caller, &req.cluster_id)?;
        report(&conn, &c.id, true)
    }
}

#[tonic::async_trait]
impl HealthService for Health {
    async fn run_health_check(
        &self,
        r: Request<v1::RunHealthCheckRequest>,
    ) -> Result<Response<v1::ClusterHealthReport>, Status> {
        Health::run_health_check(self, r).await.map(Response::new)
    }
    async fn get_health_report(
        &self,
        r: Request<v1::GetHealthReportRequest>,
    ) -> Result<Response<v1::ClusterHealthReport>, Status> {
        super::reading(&self.state, self, r, Self::get_health_report).await
    }
}

/// A create's acceptance settings, checked (before the cluster has an id).
pub fn create_settings(
    state: &AppState,
    req: &v1::CreateTenantClusterRequest,
) -> Result<store::health::Acceptance, Status> {
    Ok(health::acceptance_settings(
        store::health::Acceptance::default_for(""),
        req.set_acceptance,
        &req.acceptance_level,
        req.min_bus_bandwidth_gbps,
        req.run_acceptance_on_create,
        &req.gpu_type,
        &state.delivers,
    )?)
}

/// Stores them with the new cluster (same transaction).
pub fn store_created(
    conn: &impl AsConn,
    cluster_id: &str,
    mut settings: store::health::Acceptance,
) -> Result<(), Status> {
    settings.cluster_id = cluster_id.to_string();
    store::health::put_acceptance(conn, &settings).map_err(db_error)
}

/// An update's acceptance settings (when it sets them), for nodes that join later and
/// for checks run without a level.
pub fn store_updated(
    state: &AppState,
    conn: &impl AsConn,
    cluster: &ClusterRow,
    req: &v1::UpdateTenantClusterRequest,
) -> Result<(), Status> {
    if !req.set_acceptance {
        return Ok(());
    }
    let current = store::health::acceptance(conn, &cluster.id).map_err(db_error)?;
    let a = health::acceptance_settings(
        current,
        true,
        &req.acceptance_level,
        req.min_bus_bandwidth_gbps,
        req.run_acceptance_on_create,
        &cluster.gpu_type,
        &state.delivers,
    )?;
    store::health::put_acceptance(conn, &a).map_err(db_error)
}
