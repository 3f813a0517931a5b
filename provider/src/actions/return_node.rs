//! `gpufleet_return_node`: a quarantined node back to service (the admin token), as
//! `gpufleet-agent node-return` does. The backend runs the medium checks first: a node
//! that fails them stays quarantined, and the action fails saying why.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::{on_attribute, saying_while};
use crate::framework::{ActionType, Attribute, Diagnostics, Progress, Schema, Type, Value};
use crate::resources::common::answered;
use crate::state::ProviderState;

pub struct ReturnNode {
    provider: Arc<ProviderState>,
}

impl ReturnNode {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl ActionType for ReturnNode {
    fn name(&self) -> &'static str {
        "return_node"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Returns a quarantined node to service (needs the admin token). The node runs the medium health checks first: passed, its agent resets it to whole GPUs and it becomes ready; failed, it stays quarantined and the action fails with the reason. Progress shows in Terraform's output while the checks run.",
            vec![Attribute::required(
                "node",
                Type::String,
                "The node's name (its hostname), as `gpufleet_nodes` lists it.",
            )],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        if let Ok(Some("")) = config.str_attr("node") {
            diags.attr_error("node", "must not be empty");
        }
        diags.into_result()
    }

    async fn invoke(&self, config: &Value, progress: &Progress) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let name = config
            .str_attr("node")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        progress
            .say(format!(
                "returning node {name}: running its medium health checks first"
            ))
            .await;
        let mut fleet = client.fleet();
        let call = fleet.return_node(api::ReturnNodeRequest { name: name.clone() });
        let answer = saying_while(progress, "checking", call).await;
        let node = answered(&client, answer).map_err(|d| on_attribute(d, "node", "name"))?;
        progress
            .say(format!(
                "node {} passed and is back in service: {} ({})",
                node.hostname, node.state, node.state_reason
            ))
            .await;
        Ok(())
    }
}
