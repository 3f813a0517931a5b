//! FleetService: nodes, GPU types, availability over a window, MIG layout checks.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpufleet_proto::v1::{self, fleet_service_server::FleetService};
use gpufleet_sql::Savepoint;
use gpufleet_sql::{AsConn, Conn};
use tonic::{Request, Response, Status};

use super::{invalid, node_messages};

use crate::catalog;
use crate::scheduling::{capacity, holdings_during, Exclude};
use crate::state::{db_error, rfc3339, AppState};
use crate::store::{self, nodes::POOL};

#[derive(Clone)]
pub struct Fleet {
    pub state: Arc<AppState>,
}

impl Fleet {
    fn list_nodes(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListNodesRequest>,
    ) -> Result<v1::ListNodesResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let gpu_type = Some(req.gpu_type.as_str()).filter(|s| !s.is_empty());
        let cluster = Some(req.cluster_id.as_str()).filter(|s| !s.is_empty());
        // Filtering by another tenant's cluster answers like an unknown cluster: nothing.
        if let Some(c) = cluster {
            let visible = store::clusters::get(&conn, c)
                .map_err(db_error)?
                .is_some_and(|c| caller.sees(&c.tenant_id));
            if !visible {
                return Ok(v1::ListNodesResponse::default());
            }
        }
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        // A tenant sees the nodes of its own clusters and no other: which nodes other teams
        // run on, and how they are split, is theirs (capacity is in ListGpuTypes' counts).
        let rows = match &caller {
            crate::auth::Caller::Admin => store::nodes::list(&conn, gpu_type, cluster),
            crate::auth::Caller::Tenant(tenant) => {
                store::nodes::list_of_tenant(&conn, tenant, gpu_type, cluster)
            }
        }
        .map_err(db_error)?;
        let (nodes, next_page_token) = super::paging::page_batch(
            rows,
            &page,
            |n| n.hostname.clone(),
            |page_rows| node_messages(&conn, Some(&self.state.agents), &caller, page_rows),
        )?;
        Ok(v1::ListNodesResponse {
            nodes,
            next_page_token,
        })
    }

    fn list_gpu_types(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListGpuTypesRequest>,
    ) -> Result<v1::ListGpuTypesResponse, Status> {
        super::enter(&self.state, &conn, request)?;
        let mut types: BTreeMap<String, v1::GpuType> = BTreeMap::new();
        for n in store::nodes::list(&conn, None, None).map_err(db_error)? {
            let t = types
                .entry(n.gpu_type.clone())
                .or_insert_with(|| v1::GpuType {
                    name: n.gpu_type.clone(),
                    gpus_per_node: n.gpu_count as i32,
                    memory_mib: catalog::memory_mib(&n.gpu_type).unwrap_or(0) as i64,
                    mig_capable: catalog::mig_capable(&n.gpu_type),
                    mig_profiles: catalog::mig_profiles(&n.gpu_type),
                    ..Default::default()
                });
            // Free: in no cluster, whoever's, and in service (a quarantined node is nobody's).
            let free = n.cluster_id.is_none() && n.state != store::nodes::NODE_QUARANTINED;
            if n.capacity == POOL {
                t.pool_nodes += 1;
                t.free_pool_nodes += i64::from(free);
            } else {
                t.on_demand_nodes += 1;
                t.free_on_demand_nodes += i64::from(free);
            }
        }
        Ok(v1::ListGpuTypesResponse {
            gpu_types: types.into_values().collect(),
        })
    }

    fn availability(
        &self,
        conn: Conn<'_>,
        request: Request<v1::AvailabilityRequest>,
    ) -> Result<v1::Availability, Status> {
        let (_, req) = super::enter(&self.state, &conn, request)?;
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        let t = self.state.now();
        let start = req
            .start_time
            .as_ref()
            .map(gpufleet_proto::timestamp::to_unix)
            .unwrap_or(t)
            .max(t);
        let wanted = crate::scheduling::earliest::wanted(req.node_count, req.duration_seconds)
            .map_err(invalid)?;
        let end = req
            .end_time
            .as_ref()
            .map(gpufleet_proto::timestamp::to_unix)
            .or_else(|| wanted.and_then(|(_, duration)| start.checked_add(duration)));
        if let Some(end) = end {
            if end <= start {
                return Err(invalid(format!(
                    "end_time: must be after start_time and in the future ({} is not after {})",
                    rfc3339(end),
                    rfc3339(start)
                )));
            }
        }
        // Only what overlaps the window asked about (from `start` on for an earliest
        // window) counts, so only that is read.
        let until = if wanted.is_some() { None } else { end };
        let held = holdings_during(&conn, &req.gpu_type, t, (start, until), Exclude::default())?;
        let mut cap = capacity(&conn, &req.gpu_type, &held)?;
        // What a reservation could have: preemptible clusters' pool nodes yield to it.
        crate::scheduling::preemption::yield_to_reservations(&conn, &req.gpu_type, t, &mut cap)?;
        // "Never" is an answer, not an error: a plan (or the pre-destroy plan of `terraform
        // destroy`) reading this after its own apply used the pool must not fail.
        let (earliest_start, earliest_start_reason) = match wanted {
            None => (None, String::new()),
            Some((nodes, duration)) => {
                match crate::scheduling::earliest::earliest_start(&cap, nodes, duration, start) {
                    Some(at) => (
                        Some(gpufleet_proto::timestamp::from_unix(at)),
                        String::new(),
                    ),
                    None => (
                        None,
                        crate::scheduling::earliest::never(&req.gpu_type, nodes, duration, &cap),
                    ),
                }
            }
        };
        Ok(v1::Availability {
            earliest_start_reason,
            free_pool_nodes: cap.free_pool(start, end),
            free_on_demand_nodes: cap.free_on_demand(start, end),
            gpu_type: req.gpu_type,
            earliest_start,
        })
    }

    fn check_mig_layout(
        &self,
        conn: Conn<'_>,
        request: Request<v1::CheckMigLayoutRequest>,
    ) -> Result<v1::CheckMigLayoutResponse, Status> {
        let (_, req) = super::enter(&self.state, &conn, request)?;
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        crate::mig::check(&req.gpu_type, &req.layout).map_err(Into::into)
    }

    fn metrics_endpoint(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetMetricsEndpointRequest>,
    ) -> Result<v1::MetricsEndpoint, Status> {
        super::enter(&self.state, &conn, request)?;
        Ok(v1::MetricsEndpoint {
            address: self
                .state
                .metrics_address
                .get()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        })
    }
}

fn driver_message(r: &crate::drivers::Release) -> v1::DriverVersion {
    v1::DriverVersion {
        version: r.version.into(),
        branch: r.branch.into(),
        cuda_version: r.cuda.into(),
        end_of_life: r.end_of_life.into(),
    }
}

/// The node named `name` (its hostname), or NOT_FOUND.
fn node_named(conn: &impl AsConn, name: &str) -> Result<store::nodes::NodeRow, Status> {
    store::nodes::by_hostname(conn, name)
        .map_err(db_error)?
        .ok_or_else(|| super::not_found("node", name))
}

impl Fleet {
    /// Takes a quarantined node back: `busy` until its agent has reset it, then ready.
    fn return_node(
        &self,
        conn: Savepoint<'_>,
        request: Request<v1::ReturnNodeRequest>,
    ) -> Result<v1::Node, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        caller.require_admin("returning a node to service")?;
        let name = req.name;
        let node = node_named(&conn, &name)?;
        if node.state != store::nodes::NODE_QUARANTINED {
            return Err(super::precondition(format!(
                "name: node {name} is {}, not quarantined",
                node.state
            )));
        }
        store::nodes::set_state(
            &conn,
            &node.id,
            store::nodes::NODE_BUSY,
            "returned by an operator; being reset",
            self.state.now(),
        )
        .map_err(db_error)?;
        tracing::info!(node = %name, "node returned to service by an operator");
        let row = node_named(&conn, &name)?;
        self.answer_committed(conn, &caller, row)
    }

    /// The node's answer, once the change to it is committed.
    fn answer_committed(
        &self,
        conn: Savepoint<'_>,
        caller: &crate::auth::Caller,
        row: store::nodes::NodeRow,
    ) -> Result<v1::Node, Status> {
        let answer = node_messages(&conn, Some(&self.state.agents), caller, vec![row])?
            .pop()
            .ok_or_else(|| Status::internal("node vanished"))?;
        conn.commit().map_err(db_error)?;
        Ok(answer)
    }

    fn forget_node_secret(
        &self,
        conn: Savepoint<'_>,
        request: Request<v1::ForgetNodeSecretRequest>,
    ) -> Result<v1::Node, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        caller.require_admin("forgetting a node's secret")?;
        let name = req.name;
        let node = node_named(&conn, &name)?;
        if self.state.agents.is_live(&node.id) {
            return Err(super::precondition(format!(
                "name: node {name} is held by a connected agent; stop it first"
            )));
        }
        store::nodes::set_secret_hash(&conn, &node.id, "").map_err(db_error)?;
        tracing::warn!(node = %name, "an operator released the node's name: the next registration takes it");
        self.answer_committed(conn, &caller, node)
    }

    fn list_driver_versions(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListDriverVersionsRequest>,
    ) -> Result<v1::ListDriverVersionsResponse, Status> {
        let (_, req) = super::enter(&self.state, &conn, request)?;
        let drivers = self.state.drivers.list(&req.gpu_type, &req.cuda_version)?;
        Ok(v1::ListDriverVersionsResponse {
            drivers: drivers.into_iter().map(driver_message).collect(),
        })
    }

    fn resolve_driver(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ResolveDriverRequest>,
    ) -> Result<v1::ResolveDriverResponse, Status> {
        let (_, req) = super::enter(&self.state, &conn, request)?;
        let r = self.state.drivers.resolve(
            &req.gpu_type,
            &req.cuda_version,
            &req.driver_version,
            req.mig,
        )?;
        Ok(v1::ResolveDriverResponse {
            driver: Some(driver_message(r)),
        })
    }

    fn list_events(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListEventsRequest>,
    ) -> Result<v1::ListEventsResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let id = req.object_id;
        if id.is_empty() {
            return event_stream(&conn, &caller, &page);
        }
        let visible = store::clusters::get(&conn, &id)
            .map_err(db_error)?
            .is_some_and(|c| caller.sees(&c.tenant_id));
        let events = store::events::list(&conn, &id).map_err(db_error)?;
        // A deleted cluster's events stay readable by the tenant they belong to.
        let visible = visible || events.first().is_some_and(|e| caller.sees(&e.tenant_id));
        if !visible {
            return Err(super::not_found("object", &id));
        }
        let (events, next_page_token) = super::paging::page(
            events,
            &page,
            |e| super::paging::int_key(seen_seq(&caller, e)),
            |e| Ok(event_message(&caller, e)),
        )?;
        Ok(v1::ListEventsResponse {
            events,
            next_page_token,
        })
    }
}

/// The sequence number the caller sees: a tenant its own (issue 30: the fleet-wide one's
/// gaps would show how busy other tenants are).
fn seen_seq(caller: &crate::auth::Caller, e: &store::events::EventRow) -> i64 {
    match caller {
        crate::auth::Caller::Admin => e.seq,
        crate::auth::Caller::Tenant(_) => e.tenant_seq.unwrap_or(0),
    }
}

fn event_message(caller: &crate::auth::Caller, e: store::events::EventRow) -> v1::Event {
    v1::Event {
        seq: seen_seq(caller, &e),
        time: super::to_timestamp(e.at),
        object_id: e.object_id,
        kind: e.kind,
        node: e.node,
        message: e.message,
        tenant_id: e.tenant_id,
    }
}

/// ListEvents without an object: every event the caller may see, oldest first (the
/// admin's is the whole fleet's: a quarantine traced to the cluster and tenant whose
/// work it came from). Read a page at a time from the store.
fn event_stream(
    conn: &impl AsConn,
    caller: &crate::auth::Caller,
    page: &crate::limits::Page,
) -> Result<v1::ListEventsResponse, Status> {
    let tenant = match caller {
        crate::auth::Caller::Admin => None,
        crate::auth::Caller::Tenant(id) => Some(id.as_str()),
    };
    let after = match &page.after {
        Some(key) => super::paging::int_of_key(key)
            .ok_or_else(|| Status::invalid_argument("page_token: not a token of this list"))?,
        None => 0,
    };
    // One more than a page, so that the paging knows whether another follows.
    let rows =
        store::events::stream(conn, tenant, after, page.size as i64 + 1).map_err(db_error)?;
    let (events, next_page_token) = super::paging::page(
        rows,
        page,
        |e| super::paging::int_key(seen_seq(caller, e)),
        |e| Ok(event_message(caller, e)),
    )?;
    Ok(v1::ListEventsResponse {
        events,
        next_page_token,
    })
}

#[tonic::async_trait]
impl FleetService for Fleet {
    async fn list_quarantine_breakers(
        &self,
        r: Request<v1::ListQuarantineBreakersRequest>,
    ) -> Result<Response<v1::ListQuarantineBreakersResponse>, Status> {
        super::reading(&self.state, self, r, Self::list_quarantine_breakers).await
    }
    async fn reset_quarantine_breaker(
        &self,
        r: Request<v1::ResetQuarantineBreakerRequest>,
    ) -> Result<Response<v1::QuarantineBreaker>, Status> {
        super::writing(&self.state, self, r, Self::reset_quarantine_breaker).await
    }
    async fn return_node(
        &self,
        r: Request<v1::ReturnNodeRequest>,
    ) -> Result<Response<v1::Node>, Status> {
        let this = self.clone();
        let node = self.state.write(move |sp| this.return_node(sp, r)).await?;
        // The medium health checks first: it stays quarantined when it fails them.
        crate::scheduling::health::return_checked(self.state.clone(), &node.id).await?;
        Ok(Response::new(node))
    }
    async fn drain_node(
        &self,
        r: Request<v1::DrainNodeRequest>,
    ) -> Result<Response<v1::Node>, Status> {
        let state = self.state.clone();
        let drained = self
            .state
            .write(move |sp| super::drain::drain_node(&state, sp, r))
            .await?;
        super::drain::replace_drained(&self.state, &drained).await;
        Ok(Response::new(drained.node))
    }
    async fn forget_node_secret(
        &self,
        r: Request<v1::ForgetNodeSecretRequest>,
    ) -> Result<Response<v1::Node>, Status> {
        let this = self.clone();
        let node = self
            .state
            .write(move |sp| this.forget_node_secret(sp, r))
            .await?;
        Ok(Response::new(node))
    }
    async fn list_driver_versions(
        &self,
        r: Request<v1::ListDriverVersionsRequest>,
    ) -> Result<Response<v1::ListDriverVersionsResponse>, Status> {
        super::reading(&self.state, self, r, Self::list_driver_versions).await
    }
    async fn resolve_driver(
        &self,
        r: Request<v1::ResolveDriverRequest>,
    ) -> Result<Response<v1::ResolveDriverResponse>, Status> {
        super::reading(&self.state, self, r, Self::resolve_driver).await
    }
    async fn list_events(
        &self,
        r: Request<v1::ListEventsRequest>,
    ) -> Result<Response<v1::ListEventsResponse>, Status> {
        super::reading(&self.state, self, r, Self::list_events).await
    }
    async fn list_nodes(
        &self,
        r: Request<v1::ListNodesRequest>,
    ) -> Result<Response<v1::ListNodesResponse>, Status> {
        super::reading(&self.state, self, r, Fleet::list_nodes).await
    }
    async fn list_gpu_types(
        &self,
        r: Request<v1::ListGpuTypesRequest>,
    ) -> Result<Response<v1::ListGpuTypesResponse>, Status> {
        super::reading(&self.state, self, r, Fleet::list_gpu_types).await
    }
    async fn get_availability(
        &self,
        r: Request<v1::AvailabilityRequest>,
    ) -> Result<Response<v1::Availability>, Status> {
        super::reading(&self.state, self, r, Self::availability).await
    }
    async fn check_mig_layout(
        &self,
        r: Request<v1::CheckMigLayoutRequest>,
    ) -> Result<Response<v1::CheckMigLayoutResponse>, Status> {
        super::reading(&self.state, self, r, Fleet::check_mig_layout).await
    }
    async fn get_metrics_endpoint(
        &self,
        r: Request<v1::GetMetricsEndpointRequest>,
    ) -> Result<Response<v1::MetricsEndpoint>, Status> {
        super::reading(&self.state, self, r, Fleet::metrics_endpoint).await
    }
}
