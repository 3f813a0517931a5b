//! One List call per page of the backend, until the limit: each object found as its
//! identity and a display name.

use gpufleet_proto::v1 as api;

use crate::client::Client;
use crate::framework::{Diagnostics, Value};
use crate::resources::common::answered;

/// A page asked of the backend: no bigger than the rest of the limit, nor than its own
/// maximum.
const PAGE_SIZE: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Tenants,
    Clusters,
    Reservations,
    Quotas,
}

impl Kind {
    /// The managed resource type (without the provider prefix).
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Tenants => "tenant",
            Kind::Clusters => "tenant_cluster",
            Kind::Reservations => "reservation",
            Kind::Quotas => "gpu_quota",
        }
    }

    /// The list resource's description.
    pub fn description(self) -> &'static str {
        match self {
            Kind::Tenants => "Finds the tenants that the provider's token may see (a tenant token: its own), for `terraform query`.",
            Kind::Clusters => "Finds the tenant clusters that the provider's token may see (a tenant token: its own tenant's), for `terraform query`.",
            Kind::Reservations => "Finds the reservations that the provider's token may see (a tenant token: its own tenant's), for `terraform query`.",
            Kind::Quotas => "Finds the GPU quotas that the provider's token may see (a tenant token: its own tenant's), for `terraform query`.",
        }
    }
}

/// At most `limit` objects of `kind` (of `tenant` when not empty), as (identity, display
/// name), in the backend's order.
pub async fn found(
    client: &Client,
    kind: Kind,
    tenant: &str,
    limit: usize,
) -> Result<Vec<(Value, String)>, Diagnostics> {
    let mut found = Vec::new();
    let mut page_token = String::new();
    while found.len() < limit {
        let page_size = i32::try_from((limit - found.len()).min(PAGE_SIZE)).unwrap_or(1);
        let (items, next) = page(client, kind, tenant, page_size, page_token).await?;
        found.extend(items);
        if next.is_empty() {
            break;
        }
        page_token = next;
    }
    found.truncate(limit);
    Ok(found)
}

async fn page(
    client: &Client,
    kind: Kind,
    tenant: &str,
    page_size: i32,
    page_token: String,
) -> Result<(Vec<(Value, String)>, String), Diagnostics> {
    let tenant_id = tenant.to_string();
    Ok(match kind {
        Kind::Tenants => {
            let request = api::ListTenantsRequest {
                page_size,
                page_token,
            };
            let page = answered(client, client.tenants().list_tenants(request).await)?;
            let items = page.tenants.iter().map(tenant_found).collect();
            (items, page.next_page_token)
        }
        Kind::Clusters => {
            let request = api::ListTenantClustersRequest {
                tenant_id,
                page_size,
                page_token,
            };
            let page = answered(
                client,
                client.clusters().list_tenant_clusters(request).await,
            )?;
            let items = page.clusters.iter().map(cluster_found).collect();
            (items, page.next_page_token)
        }
        Kind::Reservations => {
            let request = api::ListReservationsRequest {
                tenant_id,
                page_size,
                page_token,
            };
            let page = answered(
                client,
                client.reservations().list_reservations(request).await,
            )?;
            let items = page.reservations.iter().map(reservation_found).collect();
            (items, page.next_page_token)
        }
        Kind::Quotas => {
            let request = api::ListGpuQuotasRequest {
                tenant_id,
                page_size,
                page_token,
            };
            let page = answered(client, client.quotas().list_gpu_quotas(request).await)?;
            let items = page.quotas.iter().map(quota_found).collect();
            (items, page.next_page_token)
        }
    })
}

fn tenant_found(t: &api::Tenant) -> (Value, String) {
    let display = if t.display_name.is_empty() || t.display_name == t.name {
        t.name.clone()
    } else {
        format!("{} ({})", t.name, t.display_name)
    };
    (Value::object([("name", Value::string(&t.name))]), display)
}

fn cluster_found(c: &api::TenantCluster) -> (Value, String) {
    let identity = Value::object([
        ("tenant", Value::string(&c.tenant_name)),
        ("name", Value::string(&c.name)),
    ]);
    let display = format!(
        "{}/{} ({}, {} x {}, {})",
        c.tenant_name, c.name, c.orchestrator, c.node_count, c.gpu_type, c.status
    );
    (identity, display)
}

fn reservation_found(r: &api::Reservation) -> (Value, String) {
    let display = format!(
        "{} {} ({} x {}, {})",
        r.tenant_name, r.id, r.node_count, r.gpu_type, r.status
    );
    (Value::object([("id", Value::string(&r.id))]), display)
}

fn quota_found(q: &api::GpuQuota) -> (Value, String) {
    let identity = Value::object([
        ("tenant", Value::string(&q.tenant_name)),
        ("gpu_type", Value::string(&q.gpu_type)),
    ]);
    let display = format!(
        "{}/{} ({} GPUs, {} burst)",
        q.tenant_name, q.gpu_type, q.gpus, q.burst_gpus
    );
    (identity, display)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_name_the_tenant_and_the_object_as_resource_identity_does() {
        let c = api::TenantCluster {
            tenant_name: "team-a".into(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            node_count: 2,
            gpu_type: "H100-80GB".into(),
            status: "running".into(),
            ..Default::default()
        };
        let (identity, display) = cluster_found(&c);
        assert_eq!(identity.get("tenant"), &Value::string("team-a"));
        assert_eq!(identity.get("name"), &Value::string("train"));
        assert_eq!(display, "team-a/train (kubernetes, 2 x H100-80GB, running)");
        let t = api::Tenant {
            name: "ml".into(),
            display_name: "ML team".into(),
            ..Default::default()
        };
        assert_eq!(tenant_found(&t).1, "ml (ML team)");
        let r = api::Reservation {
            id: "r-1".into(),
            ..Default::default()
        };
        assert_eq!(
            reservation_found(&r).0,
            Value::object([("id", Value::string("r-1"))])
        );
    }
}
