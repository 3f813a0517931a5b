//! API objects shared by several resources and data sources, as Terraform values, with
//! the types that describe them.

use gpufleet_proto::v1 as api;

use crate::framework::{Type, Value};

/// A fleet node, its GPUs and each GPU's MIG devices: the element type of
/// `gpufleet_nodes.nodes` and of `gpufleet_tenant_cluster.nodes`.
pub fn node_type() -> Type {
    Type::object([
        ("id", Type::String),
        ("hostname", Type::String),
        ("gpu_type", Type::String),
        ("capacity", Type::String),
        ("gpu_count", Type::Number),
        ("gpu_uuids", Type::list(Type::String)),
        ("driver_version", Type::String),
        ("cuda_version", Type::String),
        ("cluster_id", Type::String),
        ("tenant_id", Type::String),
        ("state", Type::String),
        ("state_reason", Type::String),
        ("heartbeat_age_seconds", Type::Number),
        ("gpus", Type::list(gpu_type())),
    ])
}

fn gpu_type() -> Type {
    Type::object([
        ("index", Type::Number),
        ("uuid", Type::String),
        ("model", Type::String),
        ("memory_mib", Type::Number),
        ("mig_enabled", Type::Bool),
        ("mig_devices", Type::list(mig_device_type())),
    ])
}

fn mig_device_type() -> Type {
    Type::object([
        ("profile", Type::String),
        ("profile_id", Type::Number),
        ("start", Type::Number),
        ("size", Type::Number),
        ("memory_mib", Type::Number),
        ("uuid", Type::String),
    ])
}

/// A node as a value of [`node_type`].
pub fn node_value(n: &api::Node) -> Value {
    Value::object([
        ("id", Value::string(&n.id)),
        ("hostname", Value::string(&n.hostname)),
        ("gpu_type", Value::string(&n.gpu_type)),
        ("capacity", Value::string(&n.capacity)),
        ("gpu_count", Value::Number(n.gpu_count.into())),
        (
            "gpu_uuids",
            Value::List(n.gpus.iter().map(|g| Value::string(&g.uuid)).collect()),
        ),
        ("driver_version", Value::string(&n.driver_version)),
        ("cuda_version", Value::string(&n.cuda_version)),
        ("cluster_id", Value::string(&n.cluster_id)),
        ("tenant_id", Value::string(&n.tenant_id)),
        ("state", Value::string(&n.state)),
        ("state_reason", Value::string(&n.state_reason)),
        (
            "heartbeat_age_seconds",
            Value::Number(n.heartbeat_age_seconds),
        ),
        ("gpus", Value::List(n.gpus.iter().map(gpu_value).collect())),
    ])
}

fn gpu_value(g: &api::Gpu) -> Value {
    Value::object([
        ("index", Value::Number(g.index.into())),
        ("uuid", Value::string(&g.uuid)),
        ("model", Value::string(&g.model)),
        ("memory_mib", Value::Number(g.memory_mib)),
        ("mig_enabled", Value::Bool(g.mig_enabled)),
        (
            "mig_devices",
            Value::List(g.mig_devices.iter().map(mig_device_value).collect()),
        ),
    ])
}

fn mig_device_value(d: &api::MigDevice) -> Value {
    Value::object([
        ("profile", Value::string(&d.profile)),
        ("profile_id", Value::Number(d.profile_id.into())),
        ("start", Value::Number(d.start.into())),
        ("size", Value::Number(d.size.into())),
        ("memory_mib", Value::Number(d.memory_mib)),
        ("uuid", Value::string(&d.uuid)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `value` has exactly the shape `ty` describes (a mismatch is an error in
    /// Terraform when the state is encoded).
    fn conforms(value: &Value, ty: &Type) -> bool {
        match (value, ty) {
            (Value::String(_), Type::String)
            | (Value::Number(_), Type::Number)
            | (Value::Bool(_), Type::Bool) => true,
            (Value::List(items), Type::List(of)) => items.iter().all(|v| conforms(v, of)),
            (Value::Object(fields), Type::Object(types)) => {
                fields.len() == types.len()
                    && types
                        .iter()
                        .all(|(k, t)| fields.get(k).is_some_and(|v| conforms(v, t)))
            }
            _ => false,
        }
    }

    #[test]
    fn a_node_value_has_exactly_the_attributes_of_its_type() {
        let node = api::Node {
            id: "n1".into(),
            gpu_count: 1,
            gpus: vec![api::Gpu {
                uuid: "GPU-1".into(),
                mig_enabled: true,
                mig_devices: vec![api::MigDevice {
                    profile: "3g.40gb".into(),
                    start: 4,
                    size: 4,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let value = node_value(&node);
        assert!(conforms(&value, &node_type()));
        assert_eq!(
            value.get("gpu_uuids"),
            &Value::List(vec![Value::string("GPU-1")])
        );
    }
}
