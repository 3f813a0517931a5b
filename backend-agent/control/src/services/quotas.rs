//! GpuQuotaService: per-tenant, per-model GPU limits and their usage.

use std::sync::Arc;

use gpufleet_proto::v1::{self, gpu_quota_service_server::GpuQuotaService};
use tonic::{Request, Response, Status};

use super::{invalid, list_scope, not_found, request_id_conflict, visible_tenant};
use crate::auth::Caller;
use crate::fingerprint::Fingerprint;
use crate::rules::{self, Limit, QuotaSubject, Span};
use crate::scheduling::{
    capacity, demand, gpus_per_node, guarantees, holdings, reservations, Exclude,
};
use crate::state::{db_error, AppState};
use crate::{catalog, store};
use gpufleet_sql::Savepoint;
use gpufleet_sql::{AsConn, Conn};
use store::{idempotency::Prior, quotas::QuotaRow};

#[derive(Clone)]
pub struct Quotas {
    pub state: Arc<AppState>,
}

fn message(conn: &impl AsConn, q: QuotaRow) -> Result<v1::GpuQuota, Status> {
    Ok(v1::GpuQuota {
        tenant_name: super::tenant_name(conn, &q.tenant_id)?,
        id: q.id,
        tenant_id: q.tenant_id,
        gpu_type: q.gpu_type,
        gpus: q.gpus,
        burst_gpus: q.burst_gpus,
        weight: q.weight,
        lending_limit_gpus: q.lending_limit_gpus,
    })
}

fn visible_quota(conn: &impl AsConn, caller: &Caller, id: &str) -> Result<QuotaRow, Status> {
    match store::quotas::get(conn, id).map_err(db_error)? {
        Some(q) if caller.sees(&q.tenant_id) => Ok(q),
        _ => Err(not_found("gpu quota", id)),
    }
}

/// A quota is for a model the fleet has: one for a model without nodes could never be
/// used, and reads like a promise.
fn require_in_fleet(conn: &impl AsConn, gpu_type: &str) -> Result<(), Status> {
    // Counts leave quarantined nodes out: they are nobody's capacity until returned.
    if store::nodes::counts(conn, gpu_type).map_err(db_error)? != (0, 0) {
        return Ok(());
    }
    let nodes = store::nodes::list(conn, None, None).map_err(db_error)?;
    let (quarantined, in_service): (Vec<_>, Vec<_>) = nodes
        .into_iter()
        .partition(|n| n.state == store::nodes::NODE_QUARANTINED);
    let held: Vec<String> = quarantined
        .into_iter()
        .filter(|n| n.gpu_type == gpu_type)
        .map(|n| n.hostname)
        .collect();
    if !held.is_empty() {
        const NAMED: usize = 8;
        let more = held.len().saturating_sub(NAMED);
        let mut names = held[..held.len().min(NAMED)].join(", ");
        if more > 0 {
            names.push_str(&format!(" and {more} more"));
        }
        return Err(Status::failed_precondition(format!(
            "gpu_type: every {gpu_type} node of the fleet is quarantined ({names}); return one to service first (gpufleet-agent node-return)"
        )));
    }
    let models: std::collections::BTreeSet<String> =
        in_service.into_iter().map(|n| n.gpu_type).collect();
    let has = match models.is_empty() {
        true => "none in service".to_string(),
        false => models.into_iter().collect::<Vec<_>>().join(", "),
    };
    Err(invalid(format!(
        "gpu_type: the fleet has no {gpu_type} nodes (it has {has})"
    )))
}

/// Refuses (FAILED_PRECONDITION, on `gpus`) a guarantee of `gpus` that the pool of
/// `gpu_type` cannot keep (see [`guarantees::admit`]); the refusal's `ErrorInfo` says so
/// (`over_pool`), for a client that may make room with a lowering it applies beside it.
fn admit_guarantee(
    conn: &impl AsConn,
    gpu_type: &str,
    gpus: i64,
    except: Option<&str>,
    unstored: i64,
) -> Result<(), Status> {
    match guarantees::admit(conn, gpu_type, gpus, except, unstored) {
        Err(crate::error::Error::Precondition(m)) => Err(super::error_details::refusal_with(
            tonic::Code::FailedPrecondition,
            "gpus",
            m,
            &[(gpufleet_proto::error_info::OVER_POOL, gpu_type.to_string())],
        )),
        other => Ok(other?),
    }
}

/// At most this many quotas a dry run counts beside its own request.
const MAX_PLANNED: usize = 100;

/// What a dry run counts of the quotas its plan sets beside it (`also_planned`,
/// `planned_quotas`): those of tenants in the store are written into the dry run's
/// savepoint (dropped, never committed) in place of the stored ones, so every check counts
/// them as it counts stored quotas; those of tenants the plan creates have no row to write.
#[derive(Default)]
pub(super) struct Assumed {
    /// Guaranteed GPUs per model of planned quotas whose tenant is not in the store yet.
    unstored: std::collections::HashMap<String, i64>,
}

impl Assumed {
    /// Guaranteed GPUs of `gpu_type` that the pool check counts besides the store's.
    fn unstored(&self, gpu_type: &str) -> i64 {
        self.unstored.get(gpu_type).copied().unwrap_or(0)
    }
}

/// Writes the quotas a plan sets beside a dry run into its savepoint `tx` (see
/// [`Assumed`]), leaving out the request's own (`own`: its tenant's id and model). Only a
/// dry run counts them, and only the admin's: quotas are the admin's to set.
pub(super) fn assume_planned(
    tx: &impl AsConn,
    caller: &Caller,
    field: &str,
    planned: &[v1::PlannedQuota],
    validate_only: bool,
    own: Option<(&str, &str)>,
) -> Result<Assumed, Status> {
    let mut assumed = Assumed::default();
    if planned.is_empty() {
        return Ok(assumed);
    }
    if !validate_only {
        return Err(invalid(format!("{field}: only with validate_only")));
    }
    caller.require_admin(&format!("counting planned quotas ({field})"))?;
    if planned.len() > MAX_PLANNED {
        return Err(invalid(format!(
            "{field}: at most {MAX_PLANNED} quotas, got {}",
            planned.len()
        )));
    }
    for (i, p) in planned.iter().enumerate() {
        rules::at_least(&format!("{field}[{i}].gpus"), p.gpus, 0).map_err(invalid)?;
        rules::at_least(&format!("{field}[{i}].burst_gpus"), p.burst_gpus, 0).map_err(invalid)?;
        let Ok(tenant) = visible_tenant(tx, &Caller::Admin, &p.tenant_id) else {
            let sum = assumed.unstored.entry(p.gpu_type.clone()).or_default();
            *sum = sum.saturating_add(p.gpus);
            continue;
        };
        if own == Some((tenant.id.as_str(), p.gpu_type.as_str())) {
            continue;
        }
        match store::quotas::for_model(tx, &tenant.id, &p.gpu_type).map_err(db_error)? {
            Some(q) => store::quotas::update(tx, &q.id, p.gpus, p.burst_gpus),
            None => store::quotas::insert(
                tx,
                &QuotaRow::new(
                    uuid::Uuid::new_v4().to_string(),
                    tenant.id,
                    p.gpu_type.clone(),
                    p.gpus,
                    p.burst_gpus,
                ),
            ),
        }
        .map_err(db_error)?;
    }
    Ok(assumed)
}

impl Quotas {
    fn create(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::CreateGpuQuotaRequest>,
    ) -> Result<v1::GpuQuota, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("creating a gpu quota")?;
        if !req.validate_only {
            rules::required("request_id", &req.request_id).map_err(invalid)?;
        }
        if req.tenant_id.is_empty() {
            return Err(invalid(
                "tenant_id: required with the admin token, which belongs to no tenant (only it creates quotas); name the tenant, by name or id",
            ));
        }
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        require_in_fleet(&tx, &req.gpu_type)?;
        rules::at_least("gpus", req.gpus, 0).map_err(invalid)?;
        rules::at_least("burst_gpus", req.burst_gpus, 0).map_err(invalid)?;
        let (weight, lending_limit_gpus) =
            rules::quota_sharing(req.gpus, req.weight, req.lending_limit_gpus).map_err(invalid)?;
        let tenant = visible_tenant(&tx, &Caller::Admin, &req.tenant_id);
        let own = tenant
            .as_ref()
            .ok()
            .map(|t| (t.id.as_str(), req.gpu_type.as_str()));
        let assumed = assume_planned(
            &tx,
            &caller,
            "also_planned",
            &req.also_planned,
            req.validate_only,
            own,
        )?;
        let unstored = assumed.unstored(&req.gpu_type);
        if tenant.is_err() && req.validate_only {
            // A tenant the same plan creates: its guarantee must fit the pool all the same.
            admit_guarantee(&tx, &req.gpu_type, req.gpus, None, unstored)?;
        }
        let tenant = tenant?;
        // The sharing fields count only when given, so a create retried across an upgrade
        // (sent before they existed) still finds what its first try made.
        let mut fields: Vec<&dyn crate::fingerprint::Canonical> =
            vec![&req.tenant_id, &req.gpu_type, &req.gpus, &req.burst_gpus];
        if req.weight.is_some() || req.lending_limit_gpus.is_some() {
            fields.push(&req.weight);
            fields.push(&req.lending_limit_gpus);
        }
        let print = Fingerprint::of(&fields);
        // A dry run is always a new request: it neither finds nor leaves a request id.
        let prior = if req.validate_only {
            Prior::New
        } else {
            store::idempotency::lookup(&tx, "quota", &tenant.id, &req.request_id, &print)
                .map_err(db_error)?
        };
        let quota = match prior {
            Prior::Same(id) => store::quotas::get(&tx, &id)
                .map_err(db_error)?
                .ok_or_else(|| not_found("gpu quota", &id))?,
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "gpu quota")),
            Prior::New => {
                if let Some(existing) =
                    store::quotas::for_model(&tx, &tenant.id, &req.gpu_type).map_err(db_error)?
                {
                    return Err(super::error_details::already_exists(
                        "gpu_type",
                        format!(
                            "gpu_type: tenant '{}' already has a {} quota (id {}); update it instead",
                            tenant.name, req.gpu_type, existing.id
                        ),
                        &existing.id,
                    ));
                }
                admit_guarantee(&tx, &req.gpu_type, req.gpus, None, unstored)?;
                let q = QuotaRow {
                    weight,
                    lending_limit_gpus,
                    ..QuotaRow::new(
                        uuid::Uuid::new_v4().to_string(),
                        tenant.id.clone(),
                        req.gpu_type,
                        req.gpus,
                        req.burst_gpus,
                    )
                };
                if req.validate_only {
                    return message(&tx, q);
                }
                store::quotas::insert(&tx, &q).map_err(db_error)?;
                store::idempotency::record(
                    &tx,
                    "quota",
                    &tenant.id,
                    &req.request_id,
                    &print,
                    &q.id,
                )
                .map_err(db_error)?;
                q
            }
        };
        let answer = message(&tx, quota)?;
        tx.commit().map_err(db_error)?;
        Ok(answer)
    }

    fn get(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetGpuQuotaRequest>,
    ) -> Result<v1::GpuQuota, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        message(&conn, visible_quota(&conn, &caller, &req.id)?)
    }

    fn list(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListGpuQuotasRequest>,
    ) -> Result<v1::ListGpuQuotasResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let scope = list_scope(&conn, &caller, &req.tenant_id)?;
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let quotas = store::quotas::list(&conn, scope.as_deref()).map_err(db_error)?;
        let (quotas, next_page_token) = super::paging::page(
            quotas,
            &page,
            |q| format!("{}\u{0}{}", q.tenant_id, q.gpu_type),
            |q| message(&conn, q),
        )?;
        Ok(v1::ListGpuQuotasResponse {
            quotas,
            next_page_token,
        })
    }

    fn update(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::UpdateGpuQuotaRequest>,
    ) -> Result<v1::GpuQuota, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("updating a gpu quota")?;
        let mut q = visible_quota(&tx, &Caller::Admin, &req.id)?;
        rules::at_least("gpus", req.gpus, 0).map_err(invalid)?;
        rules::at_least("burst_gpus", req.burst_gpus, 0).map_err(invalid)?;
        let (weight, lending_limit_gpus) = if req.set_sharing {
            rules::quota_sharing(req.gpus, req.weight, req.lending_limit_gpus).map_err(invalid)?
        } else {
            // A client from before weights and lending limits: the quota keeps its own.
            (q.weight, q.lending_limit_gpus.map(|l| l.min(req.gpus)))
        };
        let tenant = visible_tenant(&tx, &Caller::Admin, &q.tenant_id)?;
        let own = Some((q.tenant_id.as_str(), q.gpu_type.as_str()));
        let assumed = assume_planned(
            &tx,
            &caller,
            "also_planned",
            &req.also_planned,
            req.validate_only,
            own,
        )?;
        let t = self.state.now();
        let held = holdings(&tx, &q.gpu_type, t, Exclude::default())?;
        let gpn = gpus_per_node(&tx, &q.gpu_type)?;
        let subject = QuotaSubject {
            tenant: &tenant.name,
            gpu_type: &q.gpu_type,
            holds: 0,
        };
        rules::check_quota_update(
            &subject,
            Limit {
                gpus: req.gpus,
                burst_gpus: req.burst_gpus,
            },
            &demand(&held, &q.tenant_id, gpn),
            t,
        )
        .map_err(|m| {
            super::error_details::refusal_on(tonic::Code::FailedPrecondition, "gpus", m)
        })?;
        // Lowering a guarantee is always allowed, even where others over-promise.
        if req.gpus > q.gpus {
            let unstored = assumed.unstored(&q.gpu_type);
            admit_guarantee(&tx, &q.gpu_type, req.gpus, Some(&q.id), unstored)?;
        }
        q.gpus = req.gpus;
        q.burst_gpus = req.burst_gpus;
        q.weight = weight;
        q.lending_limit_gpus = lending_limit_gpus;
        if req.validate_only {
            return message(&tx, q);
        }
        store::quotas::update(&tx, &q.id, q.gpus, q.burst_gpus).map_err(db_error)?;
        store::quotas::set_sharing(&tx, &q.id, q.weight, q.lending_limit_gpus).map_err(db_error)?;
        let answer = message(&tx, q)?;
        tx.commit().map_err(db_error)?;
        Ok(answer)
    }

    fn delete(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::DeleteGpuQuotaRequest>,
    ) -> Result<v1::DeleteResponse, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("deleting a gpu quota")?;
        let q = visible_quota(&tx, &Caller::Admin, &req.id)?;
        let (reservations, ended) =
            reservations::live_and_ended(&tx, &q.tenant_id, Some(&q.gpu_type), self.state.now())?;
        let clusters = store::clusters::list(&tx, Some(&q.tenant_id), Some(&q.gpu_type), None)
            .map_err(db_error)?;
        if !reservations.is_empty() || !clusters.is_empty() {
            let mut what: Vec<String> = reservations
                .iter()
                .map(|r| format!("reservation {}", r.id))
                .collect();
            what.extend(clusters.iter().map(|c| format!("cluster '{}'", c.name)));
            let ids: Vec<&str> = reservations
                .iter()
                .map(|r| r.id.as_str())
                .chain(clusters.iter().map(|c| c.id.as_str()))
                .collect();
            return Err(super::error_details::used_by(
                format!(
                    "the {} quota is still used by {}; delete them first",
                    q.gpu_type,
                    what.join(", ")
                ),
                &ids,
            ));
        }
        if req.validate_only {
            return Ok(v1::DeleteResponse {});
        }
        reservations::remove_ended(&tx, &ended)?;
        store::quotas::delete(&tx, &q.id).map_err(db_error)?;
        store::idempotency::forget(&tx, &q.id).map_err(db_error)?;
        tx.commit().map_err(db_error)?;
        Ok(v1::DeleteResponse {})
    }

    fn usage(
        &self,
        conn: Conn<'_>,
        request: Request<v1::QuotaUsageRequest>,
    ) -> Result<v1::QuotaUsage, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let tenant = super::target_tenant(&conn, &caller, &req.tenant_id)?;
        catalog::require_known("gpu_type", &req.gpu_type).map_err(invalid)?;
        let t = self.state.now();
        let all = holdings(&conn, &req.gpu_type, t, Exclude::default())?;
        // What a cluster without a reservation could take now: pool nodes free from now on.
        let cap = capacity(&conn, &req.gpu_type, &all)?;
        let capacity_free = cap.free_pool(t, None);
        let gpn = gpus_per_node(&conn, &req.gpu_type)?;
        // Of the pool GPUs free now, what other tenants' lending limits leave this one.
        let shares = crate::scheduling::sharing::shares(&conn, &req.gpu_type, &all, t, gpn)?;
        let lendable = crate::scheduling::sharing::Lendable::of(
            cap.free_pool(t, Some(t + 1)).saturating_mul(gpn),
            &shares,
            &tenant.id,
        );
        let held: Vec<_> = all
            .into_iter()
            .filter(|h| h.tenant_id == tenant.id)
            .collect();
        let used: i64 = held
            .iter()
            .filter(|h| h.unreserved_cluster)
            .map(|h| (h.pool + h.on_demand) * gpn)
            .sum();
        let reservations: Vec<Span> = held
            .iter()
            .filter(|h| h.is_reservation)
            .map(|h| Span {
                start: h.start,
                end: h.end,
                amount: (h.pool + h.on_demand) * gpn,
            })
            .collect();
        let reserved = rules::peak(&reservations, t, None);
        let limit = crate::scheduling::limit(&conn, &tenant.id, &req.gpu_type)?.unwrap_or(Limit {
            gpus: 0,
            burst_gpus: 0,
        });
        let quota_left = (limit.total() - used - reserved).max(0);
        let capacity_free = capacity_free.saturating_mul(gpn);
        let (available, binding) = [
            (quota_left, "quota"),
            (capacity_free, "capacity"),
            (lendable.gpus(), "lending_limit"),
        ]
        .into_iter()
        .min_by_key(|(gpus, _)| *gpus)
        .unwrap_or((0, "quota"));
        Ok(v1::QuotaUsage {
            tenant_id: tenant.id,
            gpu_type: req.gpu_type,
            gpus: limit.gpus,
            burst_gpus: limit.burst_gpus,
            used,
            reserved,
            available,
            quota_left,
            capacity_free,
            binding: binding.into(),
        })
    }
}

#[tonic::async_trait]
impl GpuQuotaService for Quotas {
    async fn create_gpu_quota(
        &self,
        r: Request<v1::CreateGpuQuotaRequest>,
    ) -> Result<Response<v1::GpuQuota>, Status> {
        super::writing(&self.state, self, r, Self::create).await
    }
    async fn get_gpu_quota(
        &self,
        r: Request<v1::GetGpuQuotaRequest>,
    ) -> Result<Response<v1::GpuQuota>, Status> {
        super::reading(&self.state, self, r, Self::get).await
    }
    async fn list_gpu_quotas(
        &self,
        r: Request<v1::ListGpuQuotasRequest>,
    ) -> Result<Response<v1::ListGpuQuotasResponse>, Status> {
        super::reading(&self.state, self, r, Self::list).await
    }
    async fn update_gpu_quota(
        &self,
        r: Request<v1::UpdateGpuQuotaRequest>,
    ) -> Result<Response<v1::GpuQuota>, Status> {
        super::writing(&self.state, self, r, Self::update).await
    }
    async fn delete_gpu_quota(
        &self,
        r: Request<v1::DeleteGpuQuotaRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        super::writing(&self.state, self, r, Self::delete).await
    }
    async fn get_quota_usage(
        &self,
        r: Request<v1::QuotaUsageRequest>,
    ) -> Result<Response<v1::QuotaUsage>, Status> {
        super::reading(&self.state, self, r, Self::usage).await
    }

    async fn get_usage(
        &self,
        r: Request<v1::UsageRequest>,
    ) -> Result<Response<v1::UsageReport>, Status> {
        super::reading(&self.state, self, r, |svc, conn, r| {
            super::usage::report(&svc.state, &conn, r)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, gpu_type: &str) -> store::nodes::NodeRow {
        store::nodes::NodeRow {
            id: id.into(),
            hostname: id.into(),
            gpu_type: gpu_type.into(),
            capacity: "pool".into(),
            gpu_count: 8,
            driver_version: String::new(),
            cuda_version: String::new(),
            cluster_id: None,
            state: store::nodes::NODE_READY.into(),
            state_reason: String::new(),
            state_since: 0,
        }
    }

    #[test]
    fn a_model_whose_only_nodes_are_quarantined_is_refused_saying_so() {
        let dir = tempfile::tempdir().unwrap();
        let conn = store::open(&dir.path().join("state.db")).unwrap();
        for (id, model) in [("h1", "H100-80GB"), ("a1", "A100-80GB")] {
            store::nodes::insert(&conn, &node(id, model), &[]).unwrap();
        }
        assert!(require_in_fleet(&conn, "H100-80GB").is_ok());
        let quarantined = store::nodes::NODE_QUARANTINED;
        store::nodes::set_state(&conn, "h1", quarantined, "no CUDA", 1).unwrap();
        let refused = require_in_fleet(&conn, "H100-80GB").unwrap_err();
        assert_eq!(
            refused.message(),
            "gpu_type: every H100-80GB node of the fleet is quarantined (h1); return one to service first (gpufleet-agent node-return)"
        );
        let refused = require_in_fleet(&conn, "H200-141GB").unwrap_err();
        assert_eq!(
            refused.message(),
            "gpu_type: the fleet has no H200-141GB nodes (it has A100-80GB)"
        );
    }

    #[test]
    fn a_guarantee_past_the_pool_says_so_in_its_details_counting_what_has_no_row() {
        use tonic_types::StatusExt;
        let dir = tempfile::tempdir().unwrap();
        let conn = store::open(&dir.path().join("state.db")).unwrap();
        for id in ["h1", "h2", "h3", "h4"] {
            store::nodes::insert(&conn, &node(id, "H100-80GB"), &[]).unwrap();
        }
        // 32 GPUs; 24 guaranteed to a tenant the plan creates (no row yet).
        assert!(admit_guarantee(&conn, "H100-80GB", 8, None, 24).is_ok());
        let refused = admit_guarantee(&conn, "H100-80GB", 16, None, 24).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().starts_with(
                "gpus: 40 guaranteed H100-80GB GPUs across tenants would exceed the pool's 32"
            ),
            "{refused:?}"
        );
        let info = refused.get_details_error_info().expect("ErrorInfo");
        assert_eq!(
            info.metadata.get(gpufleet_proto::error_info::OVER_POOL),
            Some(&"H100-80GB".to_string())
        );
        let violation = &refused
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations[0];
        assert_eq!(violation.field, "gpus");
    }
}
