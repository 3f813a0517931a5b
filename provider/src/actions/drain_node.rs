//! `gpufleet_drain_node`: takes a node out of service on the admin's word (e.g. for
//! maintenance). The backend quarantines it with the reason; a cluster it was in gets a
//! replacement (or is degraded, saying why, when none is free). `gpufleet_return_node`
//! brings it back.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::limits::MAX_DISPLAY_NAME_CHARS;
use gpufleet_proto::v1 as api;

use super::{on_attribute, saying_while};
use crate::framework::{ActionType, Attribute, Diagnostics, Progress, Schema, Type, Value};
use crate::resources::common::answered;
use crate::state::ProviderState;

pub struct DrainNode {
    provider: Arc<ProviderState>,
}

impl DrainNode {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl ActionType for DrainNode {
    fn name(&self) -> &'static str {
        "drain_node"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Takes a node out of service (needs the admin token), e.g. for maintenance: it is quarantined with `reason`, and a cluster it was in gets a replacement from the same source, brought to the cluster's driver and MIG layout (with none free the cluster becomes `degraded`, saying why). A node already quarantined is left as it is. `gpufleet_return_node` brings it back after its health checks.",
            vec![
                Attribute::required(
                    "node",
                    Type::String,
                    "The node's name (its hostname), as `gpufleet_nodes` lists it.",
                ),
                Attribute::optional(
                    "reason",
                    Type::String,
                    "Why, kept as the node's `state_reason` after `drained by an operator: ` (at most 256 characters). Defaults to `maintenance`.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        if let Ok(Some("")) = config.str_attr("node") {
            diags.attr_error("node", "must not be empty");
        }
        if let Ok(Some(reason)) = config.str_attr("reason") {
            let chars = reason.chars().count();
            if chars > MAX_DISPLAY_NAME_CHARS {
                diags.attr_error(
                    "reason",
                    format!("is {chars} characters long; at most {MAX_DISPLAY_NAME_CHARS}"),
                );
            }
        }
        diags.into_result()
    }

    async fn invoke(&self, config: &Value, progress: &Progress) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let text = |name| {
            config
                .str_attr(name)
                .map(|v| v.unwrap_or_default().to_string())
                .map_err(Diagnostics::from)
        };
        let (name, reason) = (text("node")?, text("reason")?);
        progress.say(format!("draining node {name}")).await;
        let mut fleet = client.fleet();
        let call = fleet.drain_node(api::DrainNodeRequest {
            name: name.clone(),
            reason,
        });
        let answer = saying_while(progress, "draining", call).await;
        let node = answered(&client, answer).map_err(|d| on_attribute(d, "node", "name"))?;
        progress
            .say(format!(
                "node {} is out of service: {} ({})",
                node.hostname, node.state, node.state_reason
            ))
            .await;
        Ok(())
    }
}
