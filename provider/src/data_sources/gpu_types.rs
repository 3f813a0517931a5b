//! `gpufleet_gpu_types`: the GPU model catalog with capacity and MIG profiles.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use crate::framework::{Attribute, DataSourceType, Diagnostics, Schema, Type, Value};
use crate::state::ProviderState;

pub struct GpuTypes {
    provider: Arc<ProviderState>,
}

impl GpuTypes {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

fn profile_type() -> Type {
    Type::object([
        ("id", Type::Number),
        ("name", Type::String),
        ("compute_slices", Type::Number),
        ("memory_slices", Type::Number),
        ("valid_starts", Type::list(Type::Number)),
        ("max_per_gpu", Type::Number),
        ("memory_mib", Type::Number),
    ])
}

fn gpu_type_value(t: &api::GpuType) -> Value {
    let profiles = t
        .mig_profiles
        .iter()
        .map(|p| {
            Value::object([
                ("id", Value::Number(p.id.into())),
                ("name", Value::string(&p.name)),
                ("compute_slices", Value::Number(p.compute_slices.into())),
                ("memory_slices", Value::Number(p.memory_slices.into())),
                (
                    "valid_starts",
                    Value::List(
                        p.valid_starts
                            .iter()
                            .map(|s| Value::Number((*s).into()))
                            .collect(),
                    ),
                ),
                ("max_per_gpu", Value::Number(p.max_per_gpu.into())),
                ("memory_mib", Value::Number(p.memory_mib)),
            ])
        })
        .collect();
    Value::object([
        ("name", Value::string(&t.name)),
        ("gpus_per_node", Value::Number(t.gpus_per_node.into())),
        ("memory_mib", Value::Number(t.memory_mib)),
        ("pool_nodes", Value::Number(t.pool_nodes)),
        ("on_demand_nodes", Value::Number(t.on_demand_nodes)),
        ("free_pool_nodes", Value::Number(t.free_pool_nodes)),
        (
            "free_on_demand_nodes",
            Value::Number(t.free_on_demand_nodes),
        ),
        ("mig_capable", Value::Bool(t.mig_capable)),
        ("mig_profiles", Value::List(profiles)),
    ])
}

#[async_trait]
impl DataSourceType for GpuTypes {
    fn name(&self) -> &'static str {
        "gpu_types"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Every GPU model of the catalog, with pool and on-demand capacity and MIG profiles.",
            vec![
                Attribute::computed("id", Type::String, "A constant placeholder id."),
                Attribute::computed(
                    "gpu_types",
                    Type::list(Type::object([
                        ("name", Type::String),
                        ("gpus_per_node", Type::Number),
                        ("memory_mib", Type::Number),
                        ("pool_nodes", Type::Number),
                        ("on_demand_nodes", Type::Number),
                        ("free_pool_nodes", Type::Number),
                        ("free_on_demand_nodes", Type::Number),
                        ("mig_capable", Type::Bool),
                        ("mig_profiles", Type::list(profile_type())),
                    ])),
                    "One entry per GPU model.",
                ),
            ],
        )
    }

    async fn read(&self, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        // Read fresh, not from the plan-time cache: pool counts are part of the answer.
        let types = client
            .fleet()
            .list_gpu_types(api::ListGpuTypesRequest {})
            .await
            .map_err(|s| client.diagnostic(&s))?
            .into_inner()
            .gpu_types;
        Ok(Value::object([
            ("id", Value::string("gpu_types")),
            (
                "gpu_types",
                Value::List(types.iter().map(gpu_type_value).collect()),
            ),
        ]))
    }
}
