//! The `acceptance` block of `gpufleet_tenant_cluster` (the checks its nodes pass before
//! the cluster is ready) and its computed `acceptance_status` / `acceptance_nodes`, plus
//! the per-node, per-check result values `gpufleet_health_check` and
//! `gpufleet_health_report` share.

use gpufleet_proto::v1 as api;

use crate::framework::{changed, AttrPath, Attribute, Block, Diagnostic, Diagnostics, Type, Value};
use crate::times;

/// The levels, lowest first (each includes the lower ones' checks).
pub const LEVELS: [&str; 3] = ["quick", "medium", "long"];
pub const DEFAULT_LEVEL: &str = "medium";
/// Computed attributes of the cluster that a change (or any check) may move.
pub const COMPUTED: [&str; 2] = ["acceptance_status", "acceptance_nodes"];

pub fn block() -> Block {
    Block {
        name: "acceptance",
        description: "Checks every node passes before the cluster is ready (and each node that joins it later): GPU health at `level` on each node's agent, and real TCP bandwidth between the nodes. A node that fails is quarantined and replaced from the same source; when no replacement is left the create fails (an existing cluster becomes `degraded`). Changes in place.",
        attributes: vec![
            Attribute::optional("level", Type::String, "`quick`, `medium` or `long` (each includes the lower ones' checks). Defaults to `medium`."),
            Attribute::optional("min_bus_bandwidth_gbps", Type::Number, "All-reduce bus bandwidth (Gbit/s, busbw = algbw x 2(n-1)/n with algbw the slowest pair) the nodes must reach between them. Defaults to `0`: measured, not judged."),
            Attribute::optional("run_on_create", Type::Bool, "Whether creating the cluster (and adding nodes) runs the checks. Defaults to `true`."),
        ],
    }
}

/// The cluster's computed acceptance attributes.
pub fn attributes() -> Vec<Attribute> {
    vec![
        Attribute::computed("acceptance_status", Type::String, "`passed`, `failed`, `running` or `not_run`: the outcome of the cluster's latest run of checks (its acceptance checks, or a `gpufleet_health_check`)."),
        Attribute::computed("acceptance_nodes", Type::list(summary_type()), "Each node's verdict in the cluster's latest run of checks (its acceptance checks, or a `gpufleet_health_check`): `node`, `level`, `verdict` (`passed` or `failed`), `summary` (the failed checks with value and threshold), `action` (e.g. `quarantined; replaced by <node>`) and `checked_at` (RFC 3339)."),
    ]
}

pub fn summary_type() -> Type {
    Type::object([
        ("node", Type::String),
        ("level", Type::String),
        ("verdict", Type::String),
        ("summary", Type::String),
        ("action", Type::String),
        ("checked_at", Type::String),
    ])
}

fn checked_at(t: &Option<prost_types::Timestamp>) -> Value {
    t.as_ref()
        .map_or(Value::Null, |t| Value::String(times::canonical(t.seconds)))
}

pub fn summary_value(n: &api::NodeHealth) -> Value {
    Value::object([
        ("node", Value::string(&n.node)),
        ("level", Value::string(&n.level)),
        ("verdict", Value::string(&n.verdict)),
        ("summary", Value::string(&n.summary)),
        ("action", Value::string(&n.action)),
        ("checked_at", checked_at(&n.checked_at)),
    ])
}

/// One check of one node, as `results` lists it.
pub fn result_type() -> Type {
    Type::object([
        ("node", Type::String),
        ("check", Type::String),
        ("gpu_uuid", Type::String),
        ("verdict", Type::String),
        ("value", Type::String),
        ("threshold", Type::String),
        ("detail", Type::String),
        ("peer", Type::String),
    ])
}

/// Every check of every node of a report, node by node.
pub fn results(report: &api::ClusterHealthReport) -> Value {
    Value::List(
        report
            .nodes
            .iter()
            .flat_map(|n| {
                n.checks.iter().map(move |c| {
                    Value::object([
                        ("node", Value::string(&n.node)),
                        ("check", Value::string(&c.name)),
                        ("gpu_uuid", Value::string(&c.gpu_uuid)),
                        ("verdict", Value::string(&c.verdict)),
                        ("value", Value::string(&c.value)),
                        ("threshold", Value::string(&c.threshold)),
                        ("detail", Value::string(&c.detail)),
                        ("peer", Value::string(&c.peer)),
                    ])
                })
            })
            .collect(),
    )
}

/// Gbit/s as Terraform numbers take them (whole, rounded down).
pub fn whole_gbps(gbps: f64) -> Value {
    Value::Number(if gbps.is_finite() && gbps > 0.0 {
        gbps.floor().min(i64::MAX as f64) as i64
    } else {
        0
    })
}

/// Sets the computed attributes and the block from the backend's cluster; the block keeps
/// null where `written` (the configuration's block, or the prior state's) leaves an
/// attribute out and the backend has its default, so an absent block reads back absent.
pub fn set_state(state: &mut Value, c: &api::TenantCluster, written: &Value) {
    state.set(
        "acceptance_status",
        Value::string(if c.acceptance_status.is_empty() {
            "not_run"
        } else {
            &c.acceptance_status
        }),
    );
    state.set(
        "acceptance_nodes",
        Value::List(c.acceptance_nodes.iter().map(summary_value).collect()),
    );
    let level = if c.acceptance_level.is_empty() {
        DEFAULT_LEVEL
    } else {
        &c.acceptance_level
    };
    let keep = |name: &str, value: Value, default: Value| {
        if written.get(name).is_null() && value == default {
            Value::Null
        } else {
            value
        }
    };
    state.set(
        "acceptance",
        Value::object([
            (
                "level",
                keep("level", Value::string(level), Value::string(DEFAULT_LEVEL)),
            ),
            (
                "min_bus_bandwidth_gbps",
                keep(
                    "min_bus_bandwidth_gbps",
                    whole_gbps(c.min_bus_bandwidth_gbps),
                    Value::Number(0),
                ),
            ),
            (
                "run_on_create",
                keep(
                    "run_on_create",
                    Value::Bool(c.run_acceptance_on_create),
                    Value::Bool(true),
                ),
            ),
        ]),
    );
}

/// The request's acceptance fields: (set, level, min busbw, run on create). `set` only
/// when the block says something (a create) or changed (an update).
pub fn request_fields(
    prior: Option<&Value>,
    planned: &Value,
) -> Result<(bool, String, f64, bool), Diagnostics> {
    let block = planned.get("acceptance");
    let set = match prior {
        None => ["level", "min_bus_bandwidth_gbps", "run_on_create"]
            .iter()
            .any(|a| !block.get(a).is_null()),
        Some(prior) => changed(prior, planned, "acceptance"),
    };
    let path = |a: &str| AttrPath::attr("acceptance").child(a);
    let level = block
        .get("level")
        .as_str(&path("level"))?
        .unwrap_or(DEFAULT_LEVEL)
        .to_string();
    let min = block
        .get("min_bus_bandwidth_gbps")
        .as_i64(&path("min_bus_bandwidth_gbps"))?
        .unwrap_or(0);
    let run = block
        .get("run_on_create")
        .as_bool(&path("run_on_create"))?
        .unwrap_or(true);
    Ok((set, level, min as f64, run))
}

/// A create request's acceptance fields (the rest default, for `..` in a literal).
pub fn create_fields(planned: &Value) -> Result<api::CreateTenantClusterRequest, Diagnostics> {
    let (set_acceptance, acceptance_level, min_bus_bandwidth_gbps, run_acceptance_on_create) =
        request_fields(None, planned)?;
    Ok(api::CreateTenantClusterRequest {
        set_acceptance,
        acceptance_level,
        min_bus_bandwidth_gbps,
        run_acceptance_on_create,
        ..Default::default()
    })
}

/// An update request's acceptance fields (set only when the block changes).
pub fn update_fields(
    prior: &Value,
    planned: &Value,
) -> Result<api::UpdateTenantClusterRequest, Diagnostics> {
    let (set_acceptance, acceptance_level, min_bus_bandwidth_gbps, run_acceptance_on_create) =
        request_fields(Some(prior), planned)?;
    Ok(api::UpdateTenantClusterRequest {
        set_acceptance,
        acceptance_level,
        min_bus_bandwidth_gbps,
        run_acceptance_on_create,
        ..Default::default()
    })
}

/// Inputs whose change may run checks: nodes that join (a new count), a driver roll, the
/// block itself. A MIG, storage or key change runs none, so its plan keeps the last
/// results instead of listing every node's as removed.
const CHECKED_ON: [&str; 4] = ["node_count", "driver_version", "cuda_version", "acceptance"];

/// An update that may check nodes (new ones, replacements): what it leaves is known after
/// it; so is what an update still under way (an apply that timed out) leaves.
pub fn mark_plan(prior: Option<&Value>, planned: &mut Value) {
    let Some(prior) = prior else {
        return;
    };
    let unsettled = matches!(prior.str_attr("status"), Ok(Some("creating" | "updating")));
    if unsettled || CHECKED_ON.iter().any(|a| changed(prior, planned, a)) {
        crate::framework::mark_unknown(planned, &COMPUTED);
    }
}

/// The API's one upper bound of `min_bus_bandwidth_gbps` (whole Gbit/s here).
const MAX_GBPS: i64 = gpufleet_proto::limits::MAX_BANDWIDTH_GBPS as i64;

/// Plan-time checks of the block, naming the attribute.
pub fn check(config: &Value, diags: &mut Diagnostics) {
    let block = config.get("acceptance");
    let path = |a: &str| AttrPath::attr("acceptance").child(a);
    match block.get("level").as_str(&path("level")) {
        Ok(Some(l)) => {
            if let Err(reason) = level_text(l) {
                diags.push(Diagnostic::error_at(
                    path("level"),
                    format!("acceptance.level: {reason}"),
                    "",
                ));
            }
        }
        Ok(None) => {}
        Err(d) => diags.push(d),
    }
    match block
        .get("min_bus_bandwidth_gbps")
        .as_i64(&path("min_bus_bandwidth_gbps"))
    {
        Ok(Some(v)) if !(0..=MAX_GBPS).contains(&v) => diags.push(Diagnostic::error_at(
            path("min_bus_bandwidth_gbps"),
            format!(
                "acceptance.min_bus_bandwidth_gbps: must be between 0 and {MAX_GBPS} Gbit/s (got {v})"
            ),
            "",
        )),
        Ok(_) => {}
        Err(d) => diags.push(d),
    }
}

/// A level's spelling: one of [`LEVELS`].
pub fn level_text(l: &str) -> Result<(), String> {
    if LEVELS.contains(&l) {
        Ok(())
    } else {
        Err(format!(
            "must be \"quick\", \"medium\" or \"long\" (got {l:?})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(level: &str, min: f64, run: bool) -> api::TenantCluster {
        api::TenantCluster {
            acceptance_level: level.into(),
            min_bus_bandwidth_gbps: min,
            run_acceptance_on_create: run,
            acceptance_status: "passed".into(),
            acceptance_nodes: vec![api::NodeHealth {
                node: "n1".into(),
                level: "medium".into(),
                verdict: "passed".into(),
                checked_at: Some(times::to_proto(1_800_000_000)),
                summary: "all 9 checks passed".into(),
                checks: vec![],
                action: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_absent_block_reads_back_absent_and_a_written_one_as_written() {
        let mut s = Value::object([("acceptance", Value::Null)]);
        set_state(&mut s, &cluster("medium", 0.0, true), &Value::Null);
        let block = s.get("acceptance");
        for a in ["level", "min_bus_bandwidth_gbps", "run_on_create"] {
            assert!(block.get(a).is_null(), "{a}");
        }
        assert_eq!(s.get("acceptance_status"), &Value::string("passed"));
        let written = Value::object([
            ("level", Value::string("medium")),
            ("min_bus_bandwidth_gbps", Value::Null),
            ("run_on_create", Value::Bool(true)),
        ]);
        set_state(&mut s, &cluster("medium", 0.0, true), &written);
        assert_eq!(s.get("acceptance").get("level"), &Value::string("medium"));
        assert_eq!(s.get("acceptance").get("run_on_create"), &Value::Bool(true));
        // Set elsewhere (an import): non-defaults show.
        set_state(&mut s, &cluster("quick", 25.7, false), &Value::Null);
        assert_eq!(s.get("acceptance").get("level"), &Value::string("quick"));
        assert_eq!(
            s.get("acceptance").get("min_bus_bandwidth_gbps"),
            &Value::Number(25)
        );
        let Value::List(nodes) = s.get("acceptance_nodes") else {
            panic!("not a list")
        };
        assert_eq!(
            nodes[0].get("checked_at"),
            &Value::string("2027-01-15T08:00:00Z")
        );
    }

    #[test]
    fn the_block_is_checked_naming_the_attribute() {
        let config = Value::object([(
            "acceptance",
            Value::object([
                ("level", Value::string("deep")),
                ("min_bus_bandwidth_gbps", Value::Number(-1)),
                ("run_on_create", Value::Null),
            ]),
        )]);
        let mut diags = Diagnostics::default();
        check(&config, &mut diags);
        let said: Vec<&str> = diags.0.iter().map(|d| d.summary.as_str()).collect();
        assert!(said[0].starts_with("acceptance.level: must be"), "{said:?}");
        assert!(
            said[1].starts_with("acceptance.min_bus_bandwidth_gbps"),
            "{said:?}"
        );
    }

    #[test]
    fn a_create_sets_the_fields_only_when_the_block_says_something() {
        let absent = Value::object([("acceptance", Value::Null)]);
        assert_eq!(
            request_fields(None, &absent).unwrap(),
            (false, "medium".to_string(), 0.0, true)
        );
        let quick = Value::object([(
            "acceptance",
            Value::object([
                ("level", Value::string("quick")),
                ("min_bus_bandwidth_gbps", Value::Number(10)),
                ("run_on_create", Value::Null),
            ]),
        )]);
        assert_eq!(
            request_fields(None, &quick).unwrap(),
            (true, "quick".to_string(), 10.0, true)
        );
        assert!(!request_fields(Some(&quick), &quick).unwrap().0);
        assert!(request_fields(Some(&absent), &quick).unwrap().0);
    }
}
