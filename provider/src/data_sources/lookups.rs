//! `gpufleet_tenants`, `gpufleet_clusters` and `gpufleet_reservations`: what exists, found
//! by name (users know names; ids come from these). A tenant token sees its own tenant's
//! objects only: the backend answers for it, so another team's name finds nothing.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::resources::common::answered;
use crate::state::ProviderState;
use crate::times;

/// An optional string argument ("" when left out).
fn arg(config: &Value, name: &str) -> Result<String, Diagnostics> {
    Ok(config
        .str_attr(name)
        .map_err(Diagnostics::from)?
        .unwrap_or_default()
        .to_string())
}

/// Whether `name` passes the optional `wanted` filter.
fn named(wanted: &str, name: &str) -> bool {
    wanted.is_empty() || wanted == name
}

pub struct Tenants {
    provider: Arc<ProviderState>,
}

impl Tenants {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn tenant_type() -> Type {
    Type::object([
        ("id", Type::String),
        ("name", Type::String),
        ("display_name", Type::String),
        ("labels", Type::map(Type::String)),
    ])
}

#[async_trait]
impl DataSourceType for Tenants {
    fn name(&self) -> &'static str {
        "tenants"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The tenants this token may see (the admin token: all; a tenant token: its own), optionally the one of a name.",
            vec![
                Attribute::computed("id", Type::String, "An id made of the filter."),
                Attribute::optional("name", Type::String, "Only the tenant of this name."),
                Attribute::computed("tenants", Type::list(tenant_type()), "The matching tenants, by name: `id`, `name`, `display_name`, `labels`."),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let wanted = arg(config, "name")?;
        let mut found = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = api::ListTenantsRequest {
                page_size: 0,
                page_token,
            };
            let page = answered(&client, client.tenants().list_tenants(request).await)?;
            found.extend(page.tenants.into_iter().filter(|t| named(&wanted, &t.name)));
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let mut state = config.clone();
        state.set("id", Value::String(format!("tenants/{wanted}")));
        let tenants = found
            .iter()
            .map(|t| {
                Value::object([
                    ("id", Value::string(&t.id)),
                    ("name", Value::string(&t.name)),
                    ("display_name", Value::string(&t.display_name)),
                    ("labels", Value::string_map(&t.labels)),
                ])
            })
            .collect();
        state.set("tenants", Value::List(tenants));
        Ok(state)
    }
}

pub struct Clusters {
    provider: Arc<ProviderState>,
}

impl Clusters {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn cluster_type() -> Type {
    Type::object([
        ("id", Type::String),
        ("tenant_id", Type::String),
        ("tenant_name", Type::String),
        ("name", Type::String),
        ("orchestrator", Type::String),
        ("gpu_type", Type::String),
        ("node_count", Type::Number),
        ("status", Type::String),
    ])
}

#[async_trait]
impl DataSourceType for Clusters {
    fn name(&self) -> &'static str {
        "clusters"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The tenant clusters this token may see, optionally of one tenant and of one name: how to find a cluster's id (e.g. to import it) from the names a team knows.",
            vec![
                Attribute::computed("id", Type::String, "An id made of the filters."),
                Attribute::optional("tenant", Type::String, "Only this tenant's clusters, by id or by name (a tenant this token may not see is an error listing those it may)."),
                Attribute::optional("name", Type::String, "Only the clusters of this name (one per tenant)."),
                Attribute::computed("clusters", Type::list(cluster_type()), "The matching clusters: `id`, `tenant_id`, `tenant_name`, `name`, `orchestrator`, `gpu_type`, `node_count`, `status` (their nodes are the `gpufleet_nodes` data source's)."),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let tenant = arg(config, "tenant")?;
        let wanted = arg(config, "name")?;
        let mut found = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = api::ListTenantClustersRequest {
                tenant_id: tenant.clone(),
                page_size: 0,
                page_token,
            };
            let page = answered(
                &client,
                client.clusters().list_tenant_clusters(request).await,
            )?;
            found.extend(
                page.clusters
                    .into_iter()
                    .filter(|c| named(&wanted, &c.name)),
            );
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let mut state = config.clone();
        state.set("id", Value::String(format!("clusters/{tenant}/{wanted}")));
        let clusters = found
            .iter()
            .map(|c| {
                Value::object([
                    ("id", Value::string(&c.id)),
                    ("tenant_id", Value::string(&c.tenant_id)),
                    ("tenant_name", Value::string(&c.tenant_name)),
                    ("name", Value::string(&c.name)),
                    ("orchestrator", Value::string(&c.orchestrator)),
                    ("gpu_type", Value::string(&c.gpu_type)),
                    ("node_count", Value::Number(c.node_count)),
                    ("status", Value::string(&c.status)),
                ])
            })
            .collect();
        state.set("clusters", Value::List(clusters));
        Ok(state)
    }
}

pub struct Reservations {
    provider: Arc<ProviderState>,
}

impl Reservations {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn reservation_type() -> Type {
    Type::object([
        ("id", Type::String),
        ("tenant_id", Type::String),
        ("tenant_name", Type::String),
        ("gpu_type", Type::String),
        ("node_count", Type::Number),
        ("start_time", Type::String),
        ("end_time", Type::String),
        ("status", Type::String),
    ])
}

#[async_trait]
impl DataSourceType for Reservations {
    fn name(&self) -> &'static str {
        "reservations"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The reservations this token may see, optionally of one tenant and one GPU model (reservations have no name: a tenant and a model find them).",
            vec![
                Attribute::computed("id", Type::String, "An id made of the filters."),
                Attribute::optional("tenant", Type::String, "Only this tenant's reservations, by id or by name."),
                Attribute::optional("gpu_type", Type::String, "Only reservations of this GPU model."),
                Attribute::computed("reservations", Type::list(reservation_type()), "The matching reservations: `id`, `tenant_id`, `tenant_name`, `gpu_type`, `node_count`, `start_time`, `end_time` (RFC 3339), `status`."),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let tenant = arg(config, "tenant")?;
        let gpu_type = arg(config, "gpu_type")?;
        let mut found = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = api::ListReservationsRequest {
                tenant_id: tenant.clone(),
                page_size: 0,
                page_token,
            };
            let page = answered(
                &client,
                client.reservations().list_reservations(request).await,
            )?;
            found.extend(
                page.reservations
                    .into_iter()
                    .filter(|r| named(&gpu_type, &r.gpu_type)),
            );
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let when = |t: &Option<prost_types::Timestamp>| {
            t.as_ref()
                .map_or(Value::Null, |t| Value::String(times::canonical(t.seconds)))
        };
        let mut state = config.clone();
        state.set(
            "id",
            Value::String(format!("reservations/{tenant}/{gpu_type}")),
        );
        let reservations = found
            .iter()
            .map(|r| {
                Value::object([
                    ("id", Value::string(&r.id)),
                    ("tenant_id", Value::string(&r.tenant_id)),
                    ("tenant_name", Value::string(&r.tenant_name)),
                    ("gpu_type", Value::string(&r.gpu_type)),
                    ("node_count", Value::Number(r.node_count)),
                    ("start_time", when(&r.start_time)),
                    ("end_time", when(&r.end_time)),
                    ("status", Value::string(&r.status)),
                ])
            })
            .collect();
        state.set("reservations", Value::List(reservations));
        Ok(state)
    }
}
