//! What an in-place change of a cluster does to its `nodes`, planned so that a reviewer
//! reads only what changes: a driver change or a MIG re-partition keeps every node (the
//! backend changes them in place, in the same order, and a node that fails fails the
//! apply), so each node keeps its planned values and only the fields the change rewrites
//! are unknown. Shrinking releases the nodes with the highest hostnames (the list is
//! sorted by hostname), so the first ones stay, planned. Growing adds nodes the backend
//! picks at apply, wherever their hostnames sort, so the list is unknown then.

use crate::framework::Value;

/// What an in-place update changes on the nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeChange<'a> {
    /// How `node_count` changes.
    pub count: Count,
    /// The driver changes: the planned `driver_version` (Unknown when not known yet).
    pub driver: Option<&'a Value>,
    /// `mig_layout` changes.
    pub layout: bool,
}

/// A change of `node_count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Count {
    #[default]
    Same,
    /// Down to this many nodes.
    Shrink(usize),
    /// Up, or to a count not known yet.
    Other,
}

impl NodeChange<'_> {
    pub fn any(&self) -> bool {
        self.count != Count::Same || self.driver.is_some() || self.layout
    }
}

/// The planned `nodes` of a cluster whose nodes were `prior` before `change`.
pub fn planned_nodes(prior: &Value, change: NodeChange<'_>) -> Value {
    let Value::List(nodes) = prior else {
        return Value::Unknown;
    };
    let kept = match change.count {
        Count::Same => nodes.len(),
        Count::Shrink(n) => n.min(nodes.len()),
        Count::Other => return Value::Unknown,
    };
    Value::List(
        nodes[..kept]
            .iter()
            .map(|n| planned_node(n, change))
            .collect(),
    )
}

fn planned_node(prior: &Value, change: NodeChange<'_>) -> Value {
    let mut node = prior.clone();
    if change.driver.is_none() && !change.layout {
        // A node that stays through a shrink is not touched.
        return node;
    }
    // A node is drained and returned (driver) or re-partitioned (MIG) on the way.
    node.set("state", Value::Unknown);
    node.set("state_reason", Value::Unknown);
    if let Some(driver) = change.driver {
        let driver = match driver {
            Value::String(_) => driver.clone(),
            _ => Value::Unknown,
        };
        node.set("driver_version", driver);
        node.set("cuda_version", Value::Unknown);
    }
    if change.layout {
        if let Value::List(gpus) = node.get("gpus").clone() {
            let gpus = gpus
                .into_iter()
                .map(|mut g| {
                    g.set("mig_enabled", Value::Unknown);
                    g.set("mig_devices", Value::Unknown);
                    g
                })
                .collect();
            node.set("gpus", Value::List(gpus));
        }
    }
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str) -> Value {
        let gpu = Value::object([
            ("index", Value::Number(0)),
            ("uuid", Value::string(format!("GPU-{host}"))),
            ("mig_enabled", Value::Bool(false)),
            ("mig_devices", Value::List(vec![])),
        ]);
        Value::object([
            ("hostname", Value::string(host)),
            ("driver_version", Value::string("550.54.15")),
            ("cuda_version", Value::string("12.4")),
            ("state", Value::string("allocated")),
            ("state_reason", Value::string("")),
            ("gpus", Value::List(vec![gpu])),
        ])
    }

    #[test]
    fn a_driver_change_keeps_every_node_and_says_its_new_driver() {
        let prior = Value::List(vec![node("a"), node("b")]);
        let driver = Value::string("570.211.01");
        let change = NodeChange {
            driver: Some(&driver),
            ..Default::default()
        };
        let Value::List(planned) = planned_nodes(&prior, change) else {
            panic!("a known list")
        };
        assert_eq!(planned.len(), 2);
        assert_eq!(planned[1].get("hostname"), &Value::string("b"));
        assert_eq!(planned[1].get("driver_version"), &driver);
        assert!(planned[1].get("cuda_version").is_unknown());
        assert_eq!(planned[1].get("gpus"), node("b").get("gpus"));
    }

    #[test]
    fn a_layout_change_keeps_the_gpus_and_leaves_their_slices_unknown() {
        let prior = Value::List(vec![node("a")]);
        let change = NodeChange {
            layout: true,
            ..Default::default()
        };
        let Value::List(planned) = planned_nodes(&prior, change) else {
            panic!("a known list")
        };
        assert_eq!(
            planned[0].get("driver_version"),
            &Value::string("550.54.15")
        );
        let Value::List(gpus) = planned[0].get("gpus") else {
            panic!("known gpus")
        };
        assert_eq!(gpus[0].get("uuid"), &Value::string("GPU-a"));
        assert!(gpus[0].get("mig_devices").is_unknown());
    }

    #[test]
    fn growing_leaves_the_list_to_the_apply() {
        let prior = Value::List(vec![node("a")]);
        let change = NodeChange {
            count: Count::Other,
            ..Default::default()
        };
        assert!(planned_nodes(&prior, change).is_unknown());
    }

    #[test]
    fn shrinking_keeps_the_lowest_hostnames_untouched() {
        let prior = Value::List(vec![node("a"), node("b"), node("c")]);
        let change = NodeChange {
            count: Count::Shrink(2),
            ..Default::default()
        };
        assert_eq!(
            planned_nodes(&prior, change),
            Value::List(vec![node("a"), node("b")])
        );
    }
}
