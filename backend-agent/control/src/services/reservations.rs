//! ReservationService: nodes of one GPU model held for a tenant over a time window.

use std::sync::Arc;

use gpufleet_proto::limits::MAX_DURATION_SECONDS;
use gpufleet_proto::v1::{self, reservation_service_server::ReservationService};
use gpufleet_sql::Savepoint;
use gpufleet_sql::{AsConn, Conn};
use tonic::{Request, Response, Status};

use super::{
    invalid, list_scope, not_found, precondition, request_id_conflict, target_tenant, to_timestamp,
};
use crate::auth::Caller;
use crate::catalog;
use crate::fingerprint::Fingerprint;
use crate::rules::{self, Split};
use crate::scheduling::reservations::{
    held_by_clusters, place, pool_takes_back, refuse_cluster_on_demand,
};
pub use crate::scheduling::reservations::{live_and_ended, remove_ended};
use crate::scheduling::Exclude;
use crate::state::{db_error, rfc3339, AppState};
use crate::store::{self, idempotency::Prior, reservations::ReservationRow, tenants::TenantRow};

#[derive(Clone)]
pub struct Reservations {
    pub state: Arc<AppState>,
}

/// The row a planned sibling reservation would be (its window as a create clamps it);
/// None when its times are missing or its window is empty.
fn planned_row(p: &v1::PlannedReservation, tenant_id: &str, t: i64) -> Option<ReservationRow> {
    let start = p
        .start_time
        .as_ref()
        .map(gpufleet_proto::timestamp::to_unix)
        .unwrap_or(t);
    let end = gpufleet_proto::timestamp::to_unix(p.end_time.as_ref()?);
    (end > start.max(t)).then(|| ReservationRow {
        id: uuid::Uuid::now_v7().to_string(),
        tenant_id: tenant_id.to_string(),
        gpu_type: p.gpu_type.clone(),
        node_count: p.node_count,
        start_time: start.max(t),
        end_time: end,
        allow_on_demand: p.allow_on_demand,
        pool_nodes: 0,
        on_demand_nodes: 0,
    })
}

pub fn message(conn: &impl AsConn, r: ReservationRow, now: i64) -> Result<v1::Reservation, Status> {
    Ok(v1::Reservation {
        tenant_name: super::tenant_name(conn, &r.tenant_id)?,
        status: rules::reservation_status(r.start_time, r.end_time, now).into(),
        id: r.id,
        tenant_id: r.tenant_id,
        gpu_type: r.gpu_type,
        node_count: r.node_count,
        start_time: to_timestamp(r.start_time),
        end_time: to_timestamp(r.end_time),
        allow_on_demand: r.allow_on_demand,
        pool_nodes: r.pool_nodes,
        on_demand_nodes: r.on_demand_nodes,
    })
}

pub fn visible_reservation(
    conn: &impl AsConn,
    caller: &Caller,
    id: &str,
) -> Result<ReservationRow, Status> {
    match store::reservations::get(conn, id).map_err(db_error)? {
        Some(r) if caller.sees(&r.tenant_id) => Ok(r),
        _ => Err(not_found("reservation", id)),
    }
}

/// A reservation lasts at most [`MAX_DURATION_SECONDS`] (ten years): a window longer than
/// any contract is a typo, and it would hold the pool for everyone else.
fn longest_window(start: i64, end: i64) -> Result<(), Status> {
    if end - start > MAX_DURATION_SECONDS {
        return Err(invalid(format!(
            "end_time: a reservation lasts at most {} days (this one {} days, {} to {})",
            MAX_DURATION_SECONDS / 86_400,
            (end - start) / 86_400,
            rfc3339(start),
            rfc3339(end)
        )));
    }
    Ok(())
}

impl Reservations {
    fn create(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::CreateReservationRequest>,
    ) -> Result<v1::Reservation, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        if !req.validate_only {
            rules::required("request_id", &req.request_id).map_err(invalid)?;
        }
        let tenant = target_tenant(&tx, &caller, &req.tenant_id)?;
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        rules::at_least("node_count", req.node_count, 1).map_err(invalid)?;
        let t = self.state.now();
        let start = req
            .start_time
            .as_ref()
            .map(gpufleet_proto::timestamp::to_unix)
            .unwrap_or(t);
        let end = req
            .end_time
            .as_ref()
            .map(gpufleet_proto::timestamp::to_unix)
            .ok_or_else(|| invalid("end_time: required"))?;
        if end <= start {
            return Err(invalid(format!(
                "end_time: must be after start_time ({} is not after {})",
                rfc3339(end),
                rfc3339(start)
            )));
        }
        longest_window(start, end)?;
        if end <= t {
            return Err(invalid(format!(
                "end_time: must be in the future (got {})",
                rfc3339(end)
            )));
        }
        let print = Fingerprint::of(&[
            &tenant.id,
            &req.gpu_type,
            &req.node_count,
            &start,
            &end,
            &req.allow_on_demand,
        ]);
        // A dry run is always a new request: it neither finds nor leaves a request id.
        let prior = if req.validate_only {
            Prior::New
        } else {
            store::idempotency::lookup(&tx, "reservation", &tenant.id, &req.request_id, &print)
                .map_err(db_error)?
        };
        let r = match prior {
            Prior::Same(id) => store::reservations::get(&tx, &id)
                .map_err(db_error)?
                .ok_or_else(|| not_found("reservation", &id))?,
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "reservation")),
            Prior::New => {
                let mut r = ReservationRow {
                    // Time-ordered (UUIDv7): new ids append to the id index instead of
                    // landing on a random page of it.
                    id: uuid::Uuid::now_v7().to_string(),
                    tenant_id: tenant.id.clone(),
                    gpu_type: req.gpu_type,
                    node_count: req.node_count,
                    // A window that began in the past starts now.
                    start_time: start.max(t),
                    end_time: end,
                    allow_on_demand: req.allow_on_demand,
                    pool_nodes: 0,
                    on_demand_nodes: 0,
                };
                if req.validate_only {
                    // Same admission as the real create; dropping `tx` rolls it back.
                    return self.dry_run(tx, &caller, &tenant, r, &req.also_planned, t);
                }
                if !req.also_planned.is_empty() {
                    return Err(invalid("also_planned: only with validate_only"));
                }
                self.admit(&tx, &tenant, &mut r, t)?;
                store::reservations::insert(&tx, &r).map_err(db_error)?;
                store::idempotency::record(
                    &tx,
                    "reservation",
                    &tenant.id,
                    &req.request_id,
                    &print,
                    &r.id,
                )
                .map_err(db_error)?;
                tracing::info!(id = %r.id, tenant = %tenant.name, nodes = r.node_count, "created reservation");
                r
            }
        };
        let answer = message(&tx, r, t)?;
        tx.commit().map_err(db_error)?;
        Ok(answer)
    }

    /// A create's admission: room among the tenant's open reservations, then its nodes
    /// and quota over its window (`r`'s split filled in).
    fn admit(
        &self,
        conn: &impl AsConn,
        tenant: &TenantRow,
        r: &mut ReservationRow,
        t: i64,
    ) -> Result<(), Status> {
        let max = self.state.max_open_reservations;
        super::fairness::room_for_reservation(conn, tenant, max, t)?;
        let none = Split {
            pool: 0,
            on_demand: 0,
        };
        place(conn, &tenant.name, r, Exclude::default(), none, t)?;
        Ok(())
    }

    /// A create's dry run: admitted alone, then again after the reservations the same
    /// plan creates beside it (`siblings`, each placed as its create would be and
    /// recorded in a savepoint that is rolled back). A refusal that only the siblings
    /// cause names them, so a plan whose reservations cannot all fit is refused at plan
    /// rather than half-applied. Siblings that no longer fit alone are left out (their own
    /// dry runs say so).
    fn dry_run(
        &self,
        mut tx: Savepoint<'_>,
        caller: &Caller,
        tenant: &TenantRow,
        r: ReservationRow,
        siblings: &[v1::PlannedReservation],
        t: i64,
    ) -> Result<v1::Reservation, Status> {
        let mut alone = r.clone();
        self.admit(&tx, tenant, &mut alone, t)?;
        let same_model: Vec<&v1::PlannedReservation> = siblings
            .iter()
            .filter(|p| p.gpu_type == r.gpu_type)
            .collect();
        if same_model.is_empty() {
            return message(&tx, alone, t);
        }
        let beside = tx.savepoint().map_err(db_error)?;
        let mut placed = Vec::new();
        for p in same_model {
            let Ok(owner) = target_tenant(&beside, caller, &p.tenant_id) else {
                continue;
            };
            let Some(mut sibling) = planned_row(p, &owner.id, t) else {
                continue;
            };
            if self.admit(&beside, &owner, &mut sibling, t).is_err() {
                continue;
            }
            store::reservations::insert(&beside, &sibling).map_err(db_error)?;
            placed.push(format!(
                "{} {} node(s) for tenant '{}' from {} to {}",
                sibling.node_count,
                sibling.gpu_type,
                owner.name,
                rfc3339(sibling.start_time),
                rfc3339(sibling.end_time)
            ));
        }
        let mut r = r;
        match self.admit(&beside, tenant, &mut r, t) {
            Ok(()) => message(&beside, r, t),
            Err(refused) => Err(Status::new(
                refused.code(),
                format!(
                    "{}; with the reservation(s) this plan creates beside it ({}), they do not all fit: shrink or move one of them, or apply them in separate changes",
                    refused.message(),
                    placed.join("; ")
                ),
            )),
        }
    }

    fn get(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetReservationRequest>,
    ) -> Result<v1::Reservation, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let r = visible_reservation(&conn, &caller, &req.id)?;
        message(&conn, r, self.state.now())
    }

    fn list(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListReservationsRequest>,
    ) -> Result<v1::ListReservationsResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let scope = list_scope(&conn, &caller, &req.tenant_id)?;
        let t = self.state.now();
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let rows = store::reservations::list(&conn, scope.as_deref(), None).map_err(db_error)?;
        let (reservations, next_page_token) = super::paging::page(
            rows,
            &page,
            |r| format!("{}\u{0}{}", super::paging::int_key(r.start_time), r.id),
            |r| message(&conn, r, t),
        )?;
        Ok(v1::ListReservationsResponse {
            reservations,
            next_page_token,
        })
    }

    fn update(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::UpdateReservationRequest>,
    ) -> Result<v1::Reservation, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        let mut r = visible_reservation(&tx, &caller, &req.id)?;
        let tenant = super::visible_tenant(&tx, &Caller::Admin, &r.tenant_id)?;
        let t = self.state.now();
        // 0 / absent leave a field unchanged (proto3 has no presence for int64).
        if req.node_count < 0 {
            return Err(invalid(format!(
                "node_count: must be at least 1 (got {})",
                req.node_count
            )));
        }
        if req.node_count > 0 {
            r.node_count = req.node_count;
        }
        if let Some(end) = req
            .end_time
            .as_ref()
            .map(gpufleet_proto::timestamp::to_unix)
        {
            if end <= r.start_time {
                return Err(invalid(format!(
                    "end_time: must be after start_time ({} is not after {})",
                    rfc3339(end),
                    rfc3339(r.start_time)
                )));
            }
            longest_window(r.start_time, end)?;
            if end <= t {
                return Err(invalid(format!(
                    "end_time: must be in the future (got {})",
                    rfc3339(end)
                )));
            }
            r.end_time = end;
        }
        let resized = req.node_count > 0 || req.end_time.is_some();
        let held = held_by_clusters(&tx, &r.id)?;
        match req.allow_on_demand {
            None => {}
            Some(true) if !resized => {
                // Allowed from now on; what the reservation holds stays where it is.
                r.allow_on_demand = true;
                if req.validate_only {
                    return message(&tx, r, t);
                }
                store::reservations::update(&tx, &r).map_err(db_error)?;
                let answer = message(&tx, r, t)?;
                tx.commit().map_err(db_error)?;
                return Ok(answer);
            }
            Some(true) => r.allow_on_demand = true,
            Some(false) => {
                refuse_cluster_on_demand(&tx, &r.id)?;
                r.allow_on_demand = false;
                if !resized && r.on_demand_nodes > 0 {
                    pool_takes_back(&tx, &r, t)?;
                }
            }
        }
        if r.node_count < held.pool + held.on_demand {
            return Err(precondition(format!(
                "node_count: cannot shrink to {} while its clusters hold {} nodes; scale or delete them first",
                r.node_count,
                held.pool + held.on_demand
            )));
        }
        let id = r.id.clone();
        let exclude = Exclude {
            cluster: None,
            reservation: Some((&id, r.end_time)),
        };
        place(&tx, &tenant.name, &mut r, exclude, held, t)?;
        if req.validate_only {
            // Same admission as the real update; dropping `tx` rolls it back.
            return message(&tx, r, t);
        }
        store::reservations::update(&tx, &r).map_err(db_error)?;
        let answer = message(&tx, r, t)?;
        tx.commit().map_err(db_error)?;
        Ok(answer)
    }

    fn delete(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::DeleteReservationRequest>,
    ) -> Result<v1::DeleteResponse, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        let r = visible_reservation(&tx, &caller, &req.id)?;
        let clusters = store::clusters::list(&tx, None, None, Some(&r.id)).map_err(db_error)?;
        if !clusters.is_empty() {
            let names: Vec<String> = clusters.iter().map(|c| format!("'{}'", c.name)).collect();
            return Err(precondition(format!(
                "reservation {} still has clusters drawing from it: {}; delete them first",
                r.id,
                names.join(", ")
            )));
        }
        store::reservations::delete(&tx, &r.id).map_err(db_error)?;
        store::idempotency::forget(&tx, &r.id).map_err(db_error)?;
        tx.commit().map_err(db_error)?;
        Ok(v1::DeleteResponse {})
    }
}

#[tonic::async_trait]
impl ReservationService for Reservations {
    async fn create_reservation(
        &self,
        r: Request<v1::CreateReservationRequest>,
    ) -> Result<Response<v1::Reservation>, Status> {
        super::writing(&self.state, self, r, Self::create).await
    }
    async fn get_reservation(
        &self,
        r: Request<v1::GetReservationRequest>,
    ) -> Result<Response<v1::Reservation>, Status> {
        super::reading(&self.state, self, r, Self::get).await
    }
    async fn list_reservations(
        &self,
        r: Request<v1::ListReservationsRequest>,
    ) -> Result<Response<v1::ListReservationsResponse>, Status> {
        super::reading(&self.state, self, r, Self::list).await
    }
    async fn update_reservation(
        &self,
        r: Request<v1::UpdateReservationRequest>,
    ) -> Result<Response<v1::Reservation>, Status> {
        super::writing(&self.state, self, r, Self::update).await
    }
    async fn delete_reservation(
        &self,
        r: Request<v1::DeleteReservationRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        super::writing(&self.state, self, r, Self::delete).await
    }
}
