//! What a `gpufleet_tenant_cluster` records of each of its nodes: the node as the
//! `gpufleet_nodes` data source lists it, less each GPU's MIG devices, plus the node's MIG
//! instances counted by profile (`mig_instances`).
//!
//! Why per node and not per GPU: a MIG change re-creates every instance, and each new
//! instance's UUID exists only once the hardware made it, so per-GPU devices in the
//! resource are unknown in every plan that changes the layout: the plan then listed every
//! device of every GPU as removed (1,324 lines for 4 nodes of 8 GPUs). Counted per node,
//! what a layout change does is known exactly at plan time (the layout on each of the
//! node's GPUs: the MIG planner places every layout the plan admits), so the plan says per
//! node what it will hold, in a few lines whatever the GPU count. Each device's placement
//! and UUID stay one data source away (`gpufleet_nodes` with the cluster's id).

use std::collections::BTreeMap;

use gpufleet_proto::v1 as api;

use crate::convert::{node_type, node_value};
use crate::framework::{Type, Value};

/// The GPU attributes a cluster's nodes leave to the `gpufleet_nodes` data source.
const PER_GPU_MIG: [&str; 2] = ["mig_enabled", "mig_devices"];

/// The type of one element of the cluster's `nodes`.
pub fn cluster_node_type() -> Type {
    let Type::Object(mut fields) = node_type() else {
        unreachable!("a node is an object")
    };
    if let Some(Type::List(gpu)) = fields.get_mut("gpus") {
        if let Type::Object(gpu_fields) = gpu.as_mut() {
            for name in PER_GPU_MIG {
                gpu_fields.remove(name);
            }
        }
    }
    fields.insert("mig_instances".into(), Type::map(Type::Number));
    Type::Object(fields)
}

/// One node as the cluster's `nodes` records it.
pub fn cluster_node_value(n: &api::Node) -> Value {
    let mut node = node_value(n);
    if let Value::List(gpus) = node.get("gpus").clone() {
        let gpus = gpus
            .into_iter()
            .map(|gpu| match gpu {
                Value::Object(mut fields) => {
                    for name in PER_GPU_MIG {
                        fields.remove(name);
                    }
                    Value::Object(fields)
                }
                other => other,
            })
            .collect();
        node.set("gpus", Value::List(gpus));
    }
    let mut instances: BTreeMap<String, Value> = BTreeMap::new();
    for device in n.gpus.iter().flat_map(|g| &g.mig_devices) {
        let count = instances
            .entry(device.profile.clone())
            .or_insert(Value::Number(0));
        if let Value::Number(c) = count {
            *c += 1;
        }
    }
    node.set("mig_instances", Value::Map(instances));
    node
}

/// The `mig_instances` a node of `gpus` GPUs holds once `layout` (the cluster's planned
/// `mig_layout`, per GPU) is applied to every one of them; unknown while the layout or
/// the GPU count is.
pub fn planned_instances(layout: &Value, gpus: Option<usize>) -> Value {
    let (Value::Map(per_gpu), Some(gpus)) = (layout, gpus) else {
        return Value::Unknown;
    };
    let gpus = i64::try_from(gpus).unwrap_or(i64::MAX);
    let mut planned = BTreeMap::new();
    for (profile, count) in per_gpu {
        let Value::Number(count) = count else {
            return Value::Unknown;
        };
        planned.insert(profile.clone(), Value::Number(count.saturating_mul(gpus)));
    }
    Value::Map(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: i32, profiles: &[&str]) -> api::Gpu {
        api::Gpu {
            index,
            uuid: format!("GPU-{index}"),
            mig_enabled: !profiles.is_empty(),
            mig_devices: profiles
                .iter()
                .map(|p| api::MigDevice {
                    profile: p.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_counts_its_instances_by_profile_and_its_gpus_keep_no_devices() {
        let node = api::Node {
            hostname: "n1".into(),
            gpu_count: 2,
            gpus: vec![
                gpu(0, &["3g.40gb", "1g.10gb", "1g.10gb"]),
                gpu(1, &["3g.40gb", "1g.10gb", "1g.10gb"]),
            ],
            ..Default::default()
        };
        let value = cluster_node_value(&node);
        assert_eq!(
            value.get("mig_instances"),
            &Value::Map(BTreeMap::from([
                ("1g.10gb".to_string(), Value::Number(4)),
                ("3g.40gb".to_string(), Value::Number(2)),
            ]))
        );
        let Value::List(gpus) = value.get("gpus") else {
            panic!("a list")
        };
        assert_eq!(gpus[1].get("uuid"), &Value::string("GPU-1"));
        assert!(gpus[1].get("mig_devices").is_null());
        // The value has exactly the type's attributes.
        let (Type::Object(fields), Value::Object(values)) = (cluster_node_type(), &value) else {
            panic!("objects")
        };
        assert_eq!(
            fields.keys().collect::<Vec<_>>(),
            values.keys().collect::<Vec<_>>()
        );
        let whole = cluster_node_value(&api::Node {
            gpus: vec![gpu(0, &[])],
            ..Default::default()
        });
        assert_eq!(whole.get("mig_instances"), &Value::Map(BTreeMap::new()));
    }

    #[test]
    fn the_planned_instances_are_the_layout_on_every_gpu() {
        let layout = Value::Map(BTreeMap::from([
            ("4g.40gb".to_string(), Value::Number(1)),
            ("3g.40gb".to_string(), Value::Number(1)),
        ]));
        assert_eq!(
            planned_instances(&layout, Some(8)),
            Value::Map(BTreeMap::from([
                ("3g.40gb".to_string(), Value::Number(8)),
                ("4g.40gb".to_string(), Value::Number(8)),
            ]))
        );
        assert_eq!(
            planned_instances(&Value::Map(BTreeMap::new()), Some(8)),
            Value::Map(BTreeMap::new())
        );
        assert!(planned_instances(&Value::Unknown, Some(8)).is_unknown());
        assert!(planned_instances(&layout, None).is_unknown());
    }
}
