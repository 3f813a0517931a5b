//! `gpufleet_availability`: free pool and on-demand nodes of a model over a window.

use std::sync::Arc;

use async_trait::async_trait;

use super::required_arg;
use crate::framework::{Attribute, DataSourceType, Diagnostic, Diagnostics, Schema, Type, Value};
use crate::provider::ProviderState;
use crate::resources::checks::availability;
use crate::resources::common::{check_window, known_gpu_type};
use crate::times;

pub struct Availability {
    provider: Arc<ProviderState>,
}

impl Availability {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn parse_arg(config: &Value, name: &str) -> Result<i64, Diagnostics> {
    let text = required_arg(config, name)?;
    times::unix(&text).map_err(|reason| {
        Diagnostic::error_at(
            crate::framework::AttrPath::attr(name),
            format!("{name}: {reason}"),
            "",
        )
        .into()
    })
}

#[async_trait]
impl DataSourceType for Availability {
    fn name(&self) -> &'static str {
        "availability"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Nodes of one GPU model free for the whole of a window.",
            vec![
                Attribute::computed(
                    "id",
                    Type::String,
                    "An id made of the model and the window.",
                ),
                Attribute::required("gpu_type", Type::String, "GPU model, e.g. `H100-80GB`."),
                Attribute::required("start_time", Type::String, "Start of the window, RFC 3339."),
                Attribute::required(
                    "end_time",
                    Type::String,
                    "End of the window, RFC 3339; after `start_time`.",
                ),
                Attribute::computed(
                    "free_pool_nodes",
                    Type::Number,
                    "The fewest pool nodes free at any instant of the window.",
                ),
                Attribute::computed(
                    "free_on_demand_nodes",
                    Type::Number,
                    "The fewest on-demand nodes free at any instant of the window.",
                ),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        check_window(config, &mut diags);
        diags.into_result()
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let gpu_type = required_arg(config, "gpu_type")?;
        known_gpu_type(&client, &gpu_type).await?;
        let start = parse_arg(config, "start_time")?;
        let end = parse_arg(config, "end_time")?;
        let free = availability(&client, &gpu_type, start, end).await?;
        let mut state = config.clone();
        state.set("id", Value::String(format!("{gpu_type}/{start}/{end}")));
        state.set("free_pool_nodes", Value::Number(free.free_pool_nodes));
        state.set(
            "free_on_demand_nodes",
            Value::Number(free.free_on_demand_nodes),
        );
        Ok(state)
    }
}
