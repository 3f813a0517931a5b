//! `gpufleet_nodes`: the fleet's nodes the caller may see.

use std::sync::Arc;

use async_trait::async_trait;

use crate::convert::{node_type, node_value};
use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::state::ProviderState;

pub struct Nodes {
    provider: Arc<ProviderState>,
}

impl Nodes {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
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
            .all_nodes(&gpu_type, &cluster_id)
            .await
            .map_err(|s| client.diagnostic(&s))?;
        let mut state = config.clone();
        state.set(
            "id",
            Value::String(format!("nodes/{gpu_type}/{cluster_id}")),
        );
        state.set("nodes", Value::List(nodes.iter().map(node_value).collect()));
        Ok(state)
    }
}
