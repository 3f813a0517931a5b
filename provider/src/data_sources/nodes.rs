//! `gpufleet_nodes`: the fleet's nodes the caller may see.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::provider::ProviderState;

pub struct Nodes {
    provider: Arc<ProviderState>,
}

impl Nodes {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn node_type() -> Type {
    Type::object([
        ("id", Type::String),
        ("hostname", Type::String),
        ("gpu_type", Type::String),
        ("capacity", Type::String),
        ("gpu_count", Type::Number),
        ("driver_version", Type::String),
        ("cuda_version", Type::String),
        ("cluster_id", Type::String),
        ("tenant_id", Type::String),
        (
            "gpus",
            Type::list(Type::object([
                ("index", Type::Number),
                ("uuid", Type::String),
                ("model", Type::String),
                ("memory_mib", Type::Number),
                ("mig_enabled", Type::Bool),
                (
                    "mig_devices",
                    Type::list(Type::object([
                        ("profile", Type::String),
                        ("profile_id", Type::Number),
                        ("start", Type::Number),
                        ("size", Type::Number),
                        ("memory_mib", Type::Number),
                        ("uuid", Type::String),
                    ])),
                ),
            ])),
        ),
    ])
}

fn node_value(n: &api::Node) -> Value {
    let gpus = n
        .gpus
        .iter()
        .map(|g| {
            let devices = g
                .mig_devices
                .iter()
                .map(|d| {
                    Value::object([
                        ("profile", Value::string(&d.profile)),
                        ("profile_id", Value::Number(d.profile_id.into())),
                        ("start", Value::Number(d.start.into())),
                        ("size", Value::Number(d.size.into())),
                        ("memory_mib", Value::Number(d.memory_mib)),
                        ("uuid", Value::string(&d.uuid)),
                    ])
                })
                .collect();
            Value::object([
                ("index", Value::Number(g.index.into())),
                ("uuid", Value::string(&g.uuid)),
                ("model", Value::string(&g.model)),
                ("memory_mib", Value::Number(g.memory_mib)),
                ("mig_enabled", Value::Bool(g.mig_enabled)),
                ("mig_devices", Value::List(devices)),
            ])
        })
        .collect();
    Value::object([
        ("id", Value::string(&n.id)),
        ("hostname", Value::string(&n.hostname)),
        ("gpu_type", Value::string(&n.gpu_type)),
        ("capacity", Value::string(&n.capacity)),
        ("gpu_count", Value::Number(n.gpu_count.into())),
        ("driver_version", Value::string(&n.driver_version)),
        ("cuda_version", Value::string(&n.cuda_version)),
        ("cluster_id", Value::string(&n.cluster_id)),
        ("tenant_id", Value::string(&n.tenant_id)),
        ("gpus", Value::List(gpus)),
    ])
}

#[async_trait]
impl DataSourceType for Nodes {
    fn name(&self) -> &'static str {
        "nodes"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "The fleet's nodes the caller may see, optionally filtered.",
            vec![
                Attribute::computed("id", Type::String, "An id made of the filters."),
                Attribute::optional("gpu_type", Type::String, "Only nodes of this GPU model."),
                Attribute::optional(
                    "cluster_id",
                    Type::String,
                    "Only the nodes of this cluster.",
                ),
                Attribute::computed("nodes", Type::list(node_type()), "The matching nodes."),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let gpu_type = config
            .str_attr("gpu_type")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let cluster_id = config
            .str_attr("cluster_id")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let nodes = client
            .fleet()
            .list_nodes(api::ListNodesRequest {
                gpu_type: gpu_type.clone(),
                cluster_id: cluster_id.clone(),
            })
            .await
            .map_err(|s| client.diagnostic(&s))?
            .into_inner()
            .nodes;
        let mut state = config.clone();
        state.set(
            "id",
            Value::String(format!("nodes/{gpu_type}/{cluster_id}")),
        );
        state.set("nodes", Value::List(nodes.iter().map(node_value).collect()));
        Ok(state)
    }
}
