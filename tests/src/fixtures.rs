//! Objects created straight through the API (as an operator would outside Terraform), for
//! import, drift and isolation tests.

use std::sync::atomic::{AtomicU64, Ordering};

use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::{
    CreateGpuQuotaRequest, CreateReservationRequest, CreateTenantClusterRequest,
    CreateTenantRequest, GpuQuota, Reservation, Tenant, TenantCluster,
};

use crate::grpc::Clients;

/// A request id no other create in this process uses.
pub fn request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "e2e-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates a tenant; returns it with its token.
pub async fn create_tenant(admin: &mut Clients, name: &str) -> (Tenant, String) {
    let response = admin
        .tenants
        .create_tenant(CreateTenantRequest {
            request_id: request_id(),
            name: name.to_string(),
            display_name: format!("{name} team"),
            labels: Default::default(),
            validate_only: false,
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTenant {name}: {s}"))
        .into_inner();
    (
        response.tenant.expect("CreateTenant returns the tenant"),
        response.token,
    )
}

pub async fn create_quota(
    admin: &mut Clients,
    tenant_id: &str,
    gpu_type: &str,
    gpus: i64,
    burst_gpus: i64,
) -> GpuQuota {
    admin
        .quotas
        .create_gpu_quota(CreateGpuQuotaRequest {
            request_id: request_id(),
            tenant_id: tenant_id.to_string(),
            gpu_type: gpu_type.to_string(),
            gpus,
            burst_gpus,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateGpuQuota {gpu_type}: {s}"))
        .into_inner()
}

/// A reservation of `node_count` nodes from `start_hours` to `end_hours` relative to now.
pub async fn create_reservation(
    clients: &mut Clients,
    tenant_id: &str,
    gpu_type: &str,
    node_count: i64,
    start_hours: i64,
    end_hours: i64,
) -> Reservation {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    clients
        .reservations
        .create_reservation(CreateReservationRequest {
            request_id: request_id(),
            tenant_id: tenant_id.to_string(),
            gpu_type: gpu_type.to_string(),
            node_count,
            start_time: Some(from_unix(now + start_hours * 3600)),
            end_time: Some(from_unix(now + end_hours * 3600)),
            allow_on_demand: false,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateReservation: {s}"))
        .into_inner()
}

/// A cluster from the free pool (no reservation), whole GPUs.
pub async fn create_pool_cluster(
    clients: &mut Clients,
    tenant_id: &str,
    name: &str,
    gpu_type: &str,
    node_count: i64,
) -> TenantCluster {
    clients
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: request_id(),
            tenant_id: tenant_id.to_string(),
            name: name.to_string(),
            orchestrator: "kubernetes".to_string(),
            gpu_type: gpu_type.to_string(),
            node_count,
            reservation_id: String::new(),
            storage_gib: 100,
            mig_layout: Default::default(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTenantCluster {name}: {s}"))
        .into_inner()
}
