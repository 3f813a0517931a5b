//! TenantService: tenants and their bearer tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpufleet_proto::error_info::QUOTA_IDS;
use gpufleet_proto::v1::{self, tenant_service_server::TenantService};
use gpufleet_sql::Conn;
use gpufleet_sql::Savepoint;
use tonic::{Request, Response, Status};

use super::{
    invalid, not_found, precondition, request_id_conflict, reservations, to_hash_map, to_timestamp,
    visible_tenant,
};
use crate::auth::{self, Caller};
use crate::fingerprint::Fingerprint;
use crate::rules;
use crate::state::{db_error, AppState};
use crate::store::{self, idempotency::Prior, tenants::TenantRow};

#[derive(Clone)]
pub struct Tenants {
    pub state: Arc<AppState>,
}

pub fn message(t: TenantRow) -> v1::Tenant {
    v1::Tenant {
        id: t.id,
        name: t.name,
        display_name: t.display_name,
        labels: to_hash_map(&t.labels),
        created_at: to_timestamp(t.created_at),
    }
}

/// Every label has a key (an empty one names nothing and cannot be selected by).
fn require_label_keys(labels: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    if labels.keys().any(|k| k.trim().is_empty()) {
        return Err(invalid("labels: a label's key must not be empty"));
    }
    Ok(())
}

impl Tenants {
    fn create(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::CreateTenantRequest>,
    ) -> Result<v1::CreateTenantResponse, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("creating a tenant")?;
        // A dry run (validate_only) needs no request id: "" was never recorded.
        if !req.validate_only {
            rules::required("request_id", &req.request_id).map_err(invalid)?;
        }
        gpufleet_wire::names::dns_label("name", &req.name).map_err(invalid)?;
        if uuid::Uuid::parse_str(&req.name).is_ok() {
            // Tenants are referred to by name or id: a name shaped like an id could stand
            // for another tenant.
            return Err(invalid(format!(
                "name: '{}' has the form of a tenant id; choose a name that does not",
                req.name
            )));
        }
        require_label_keys(&req.labels)?;
        let labels: BTreeMap<String, String> = req.labels.into_iter().collect();
        if req.validate_only {
            return match store::tenants::by_name(&tx, &req.name).map_err(db_error)? {
                Some(existing) => Err(super::error_details::already_exists(
                    "name",
                    format!(
                        "name: a tenant named '{}' already exists (id {})",
                        req.name, existing.id
                    ),
                    &existing.id,
                )),
                None => Ok(v1::CreateTenantResponse {
                    tenant: Some(message(TenantRow {
                        id: String::new(),
                        name: req.name,
                        display_name: req.display_name,
                        labels,
                        created_at: self.state.now(),
                    })),
                    token: String::new(),
                }),
            };
        }
        let print = Fingerprint::of(&[&req.name, &req.display_name, &labels]);
        let token = auth::new_token("gft_");
        let tenant = match store::idempotency::lookup(&tx, "tenant", "", &req.request_id, &print)
            .map_err(db_error)?
        {
            // A retry means the first response (and its token) may never have reached the
            // caller: issue a fresh token and revoke the old one, since only its hash is kept.
            Prior::Same(id) => {
                let t = store::tenants::get(&tx, &id)
                    .map_err(db_error)?
                    .ok_or_else(|| not_found("tenant", &id))?;
                super::tokens::reissue_default(&tx, &id, &token, self.state.now())?;
                t
            }
            Prior::Conflict => return Err(request_id_conflict(&req.request_id, "tenant")),
            Prior::New => {
                if let Some(existing) = store::tenants::by_name(&tx, &req.name).map_err(db_error)? {
                    return Err(Status::already_exists(format!(
                        "name: a tenant named '{}' already exists (id {})",
                        req.name, existing.id
                    )));
                }
                let t = TenantRow {
                    id: uuid::Uuid::new_v4().to_string(),
                    name: req.name,
                    display_name: req.display_name,
                    labels,
                    created_at: self.state.now(),
                };
                store::tenants::insert(&tx, &t).map_err(db_error)?;
                super::tokens::issue_default(&tx, &t.id, &token, t.created_at)?;
                store::idempotency::record(&tx, "tenant", "", &req.request_id, &print, &t.id)
                    .map_err(db_error)?;
                tracing::info!(tenant = %t.name, id = %t.id, "created tenant");
                t
            }
        };
        tx.commit().map_err(db_error)?;
        Ok(v1::CreateTenantResponse {
            tenant: Some(message(tenant)),
            token,
        })
    }

    fn get(
        &self,
        conn: Conn<'_>,
        request: Request<v1::GetTenantRequest>,
    ) -> Result<v1::Tenant, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let id = match (&caller, req.id.as_str()) {
            (Caller::Tenant(own), "") => own.clone(),
            (Caller::Admin, "") => {
                return Err(invalid(
                    "id: required (only a tenant token has a tenant of its own)",
                ))
            }
            (_, id) => id.to_string(),
        };
        Ok(message(visible_tenant(&conn, &caller, &id)?))
    }

    fn list(
        &self,
        conn: Conn<'_>,
        request: Request<v1::ListTenantsRequest>,
    ) -> Result<v1::ListTenantsResponse, Status> {
        let (caller, req) = super::enter(&self.state, &conn, request)?;
        let page = super::paging::parse(req.page_size, &req.page_token)?;
        let mut tenants = store::tenants::list(&conn).map_err(db_error)?;
        tenants.retain(|t| caller.sees(&t.id));
        let (tenants, next_page_token) =
            super::paging::page(tenants, &page, |t| t.name.clone(), |t| Ok(message(t)))?;
        Ok(v1::ListTenantsResponse {
            tenants,
            next_page_token,
        })
    }

    fn update(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::UpdateTenantRequest>,
    ) -> Result<v1::Tenant, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("updating a tenant")?;
        let mut t = visible_tenant(&tx, &Caller::Admin, &req.id)?;
        require_label_keys(&req.labels)?;
        t.display_name = req.display_name;
        t.labels = req.labels.into_iter().collect();
        store::tenants::update(&tx, &t.id, &t.display_name, &t.labels).map_err(db_error)?;
        tx.commit().map_err(db_error)?;
        Ok(message(t))
    }

    fn delete(
        &self,
        tx: Savepoint<'_>,
        request: Request<v1::DeleteTenantRequest>,
    ) -> Result<v1::DeleteResponse, Status> {
        let (caller, req) = super::enter(&self.state, &tx, request)?;
        caller.require_admin("deleting a tenant")?;
        let t = visible_tenant(&tx, &Caller::Admin, &req.id)?;
        let quotas = store::quotas::list(&tx, Some(&t.id)).map_err(db_error)?;
        let (live, ended) = reservations::live_and_ended(&tx, &t.id, None, self.state.now())?;
        let clusters = store::clusters::list(&tx, Some(&t.id), None, None).map_err(db_error)?;
        if !quotas.is_empty() || !live.is_empty() || !clusters.is_empty() {
            // Each named, and their ids as data: a client that deletes them in the same
            // run (a plan) may go on.
            let mut named: Vec<String> = quotas
                .iter()
                .map(|q| format!("the {} quota", q.gpu_type))
                .collect();
            named.extend(live.iter().map(|r| format!("reservation {}", r.id)));
            named.extend(clusters.iter().map(|c| format!("cluster '{}'", c.name)));
            let ids: Vec<&str> = quotas
                .iter()
                .map(|q| q.id.as_str())
                .chain(live.iter().map(|r| r.id.as_str()))
                .chain(clusters.iter().map(|c| c.id.as_str()))
                .collect();
            let quota_ids: Vec<&str> = quotas.iter().map(|q| q.id.as_str()).collect();
            return Err(super::error_details::used_by_with(
                format!(
                    "tenant '{}' still has {} gpu quota(s), {} reservation(s) and {} cluster(s) ({}); delete them first",
                    t.name,
                    quotas.len(),
                    live.len(),
                    clusters.len(),
                    named.join(", ")
                ),
                &ids,
                &[(QUOTA_IDS, quota_ids.join(","))],
            ));
        }
        // Volumes kept by deleted clusters (storage_retention = "keep") are the team's data:
        // never deleted with the tenant, and never handed to a later tenant of its name.
        let kept = self
            .state
            .volumes
            .kept_in(&t.id)
            .map_err(|e| Status::internal(format!("cannot read the tenant's volumes: {e}")))?;
        if !kept.is_empty() {
            return Err(precondition(format!(
                "tenant '{}' keeps the volumes of deleted clusters {}; attach each to a cluster of that name with storage_retention = \"delete\" and delete it, first",
                t.name,
                kept.join(", ")
            )));
        }
        if req.validate_only {
            return Ok(v1::DeleteResponse {});
        }
        reservations::remove_ended(&tx, &ended)?;
        store::tenants::delete(&tx, &t.id).map_err(db_error)?;
        store::idempotency::forget(&tx, &t.id).map_err(db_error)?;
        tx.commit().map_err(db_error)?;
        self.state.volumes.remove_tenant(&t.id);
        // Volumes made before they were kept by tenant id.
        self.state.volumes.remove_tenant(&t.name);
        tracing::info!(tenant = %t.name, "deleted tenant");
        Ok(v1::DeleteResponse {})
    }
}

#[tonic::async_trait]
impl TenantService for Tenants {
    async fn create_tenant(
        &self,
        r: Request<v1::CreateTenantRequest>,
    ) -> Result<Response<v1::CreateTenantResponse>, Status> {
        super::writing(&self.state, self, r, Self::create).await
    }
    async fn get_tenant(
        &self,
        r: Request<v1::GetTenantRequest>,
    ) -> Result<Response<v1::Tenant>, Status> {
        super::reading(&self.state, self, r, Self::get).await
    }
    async fn list_tenants(
        &self,
        r: Request<v1::ListTenantsRequest>,
    ) -> Result<Response<v1::ListTenantsResponse>, Status> {
        super::reading(&self.state, self, r, Self::list).await
    }
    async fn update_tenant(
        &self,
        r: Request<v1::UpdateTenantRequest>,
    ) -> Result<Response<v1::Tenant>, Status> {
        super::writing(&self.state, self, r, Self::update).await
    }
    async fn delete_tenant(
        &self,
        r: Request<v1::DeleteTenantRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        super::writing(&self.state, self, r, Self::delete).await
    }
}
