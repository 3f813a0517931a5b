//! What an in-place change of a cluster does to its `nodes`, planned so that a reviewer
//! reads only what changes: a driver change or a MIG re-partition keeps every node (the
//! backend changes them in place, in the same order, and a node that fails fails the
//! apply), so each node keeps its planned values and only the fields the change rewrites
//! change: a MIG change plans each node's `mig_instances` exactly (see
//! [`super::cluster_node`]), a driver change its `driver_version`. Shrinking releases the nodes with the highest hostnames, so the others
//! stay, planned. Growing adds nodes the backend picks at apply: the staying nodes stay
//! planned, and the new ones are unknown at the end of the list.
//!
//! For that the list keeps its order across changes ([`in_prior_order`]): a node keeps
//! its place while it stays in the cluster, and nodes that join are added at the end
//! (in hostname order among themselves). A cluster read afresh (created, imported) lists
//! its nodes by hostname.

use crate::framework::Value;

/// What an in-place update changes on the nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeChange<'a> {
    /// How `node_count` changes.
    pub count: Count,
    /// The driver changes: the planned `driver_version` (Unknown when not known yet).
    pub driver: Option<&'a Value>,
    /// `mig_layout` changes: the planned layout (per GPU; Unknown when not known yet).
    pub layout: Option<&'a Value>,
}

/// A change of `node_count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Count {
    #[default]
    Same,
    /// Down to this many nodes.
    Shrink(usize),
    /// Up to this many nodes.
    Grow(usize),
    /// To a count not known yet.
    Other,
}

impl NodeChange<'_> {
    pub fn any(&self) -> bool {
        self.count != Count::Same || self.driver.is_some() || self.layout.is_some()
    }
}

/// The planned `nodes` of a cluster whose nodes were `prior` before `change`.
pub fn planned_nodes(prior: &Value, change: NodeChange<'_>) -> Value {
    let Value::List(nodes) = prior else {
        return Value::Unknown;
    };
    let (staying, added): (Vec<&Value>, usize) = match change.count {
        Count::Same => (nodes.iter().collect(), 0),
        Count::Shrink(n) => (without_highest_hostnames(nodes, n), 0),
        Count::Grow(n) => (nodes.iter().collect(), n.saturating_sub(nodes.len())),
        Count::Other => return Value::Unknown,
    };
    let mut planned: Vec<Value> = staying
        .into_iter()
        .map(|n| planned_node(n, change))
        .collect();
    planned.extend(std::iter::repeat_n(Value::Unknown, added));
    Value::List(planned)
}

fn hostname(node: &Value) -> Option<&str> {
    match node.get("hostname") {
        Value::String(h) => Some(h),
        _ => None,
    }
}

/// `nodes` less all but the `keep` lowest hostnames (the backend releases the highest),
/// in their order.
fn without_highest_hostnames(nodes: &[Value], keep: usize) -> Vec<&Value> {
    let mut names: Vec<&str> = nodes.iter().filter_map(hostname).collect();
    names.sort_unstable();
    let kept: std::collections::HashSet<&str> = names.into_iter().take(keep).collect();
    nodes
        .iter()
        .filter(|n| hostname(n).is_some_and(|h| kept.contains(h)))
        .collect()
}

/// `nodes` (as the backend lists them, by hostname) in the order of `prior`'s list: each
/// node that was there keeps its place, and the others follow in the backend's order.
/// Without a known prior list, the backend's order.
pub fn in_prior_order(nodes: Vec<Value>, prior: &Value) -> Vec<Value> {
    let Value::List(before) = prior else {
        return nodes;
    };
    let place: std::collections::HashMap<&str, usize> = before
        .iter()
        .filter_map(hostname)
        .enumerate()
        .map(|(i, h)| (h, i))
        .collect();
    let mut indexed: Vec<(usize, usize, Value)> = nodes
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let at = hostname(&n)
                .and_then(|h| place.get(h).copied())
                .unwrap_or(usize::MAX);
            (at, i, n)
        })
        .collect();
    indexed.sort_by_key(|(at, i, _)| (*at, *i));
    indexed.into_iter().map(|(_, _, n)| n).collect()
}

fn planned_node(prior: &Value, change: NodeChange<'_>) -> Value {
    let mut node = prior.clone();
    if change.driver.is_none() && change.layout.is_none() {
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
    if let Some(layout) = change.layout {
        // Every GPU of the node gets the layout (the planner placed it at plan time).
        let gpus = match node.get("gpus") {
            Value::List(gpus) => Some(gpus.len()),
            _ => None,
        };
        node.set(
            "mig_instances",
            super::cluster_node::planned_instances(layout, gpus),
        );
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
        ]);
        Value::object([
            ("hostname", Value::string(host)),
            ("mig_instances", Value::Map(Default::default())),
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
    fn a_layout_change_keeps_the_gpus_and_plans_each_nodes_instances() {
        let prior = Value::List(vec![node("a")]);
        let layout = Value::Map(
            [("3g.40gb".to_string(), Value::Number(2))]
                .into_iter()
                .collect(),
        );
        let change = NodeChange {
            layout: Some(&layout),
            ..Default::default()
        };
        let Value::List(planned) = planned_nodes(&prior, change) else {
            panic!("a known list")
        };
        assert_eq!(
            planned[0].get("driver_version"),
            &Value::string("550.54.15")
        );
        assert_eq!(planned[0].get("gpus"), node("a").get("gpus"));
        // One GPU: the layout once.
        assert_eq!(planned[0].get("mig_instances"), &layout);
        assert!(planned[0].get("state").is_unknown());
    }

    #[test]
    fn growing_keeps_the_nodes_and_adds_unknown_ones_at_the_end() {
        let prior = Value::List(vec![node("b"), node("a")]);
        let change = NodeChange {
            count: Count::Grow(4),
            ..Default::default()
        };
        assert_eq!(
            planned_nodes(&prior, change),
            Value::List(vec![node("b"), node("a"), Value::Unknown, Value::Unknown])
        );
        let unknown_count = NodeChange {
            count: Count::Other,
            ..Default::default()
        };
        assert!(planned_nodes(&prior, unknown_count).is_unknown());
    }

    #[test]
    fn shrinking_keeps_the_lowest_hostnames_untouched_in_their_places() {
        // After a growth the list is not sorted: "b" joined after "c".
        let prior = Value::List(vec![node("a"), node("c"), node("b")]);
        let change = NodeChange {
            count: Count::Shrink(2),
            ..Default::default()
        };
        assert_eq!(
            planned_nodes(&prior, change),
            Value::List(vec![node("a"), node("b")])
        );
    }

    #[test]
    fn nodes_keep_their_places_and_newcomers_follow_in_hostname_order() {
        let prior = Value::List(vec![node("c"), node("a")]);
        let read = vec![node("a"), node("b"), node("c"), node("d")];
        assert_eq!(
            in_prior_order(read.clone(), &prior),
            vec![node("c"), node("a"), node("b"), node("d")]
        );
        // A node that left is simply gone; without a prior list the backend's order.
        let prior = Value::List(vec![node("z"), node("c")]);
        assert_eq!(
            in_prior_order(vec![node("a"), node("c")], &prior),
            vec![node("c"), node("a")]
        );
        assert_eq!(in_prior_order(read.clone(), &Value::Unknown), read);
    }
}
