//! `gpufleet_health_check`: health checks of a cluster's nodes run by the apply, the way
//! a team's pipeline re-checks its nodes on demand. Changing `level` or `triggers` runs
//! them again (a replacement); the state keeps that run's results. Failed nodes are
//! quarantined and replaced by the backend, as with acceptance checks.
//!
//! An import reads the cluster's latest run; the backend keeps no `triggers`, so an
//! imported state has none (null), and the configuration's are adopted in place at the
//! next apply, without a new run.
//!
//! The state records the cluster's tenant (`tenant_id`): a read with another tenant's
//! token, which the backend answers as for a cluster that does not exist, is refused
//! naming it (`identity::refuse_unseen`) instead of taken as deleted.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::acceptance::{self, level_text, result_type, summary_type, summary_value, whole_gbps};
use super::common::{answered, diag, found, imported, required_str};
use crate::client::Client;
use crate::framework::{
    default_when_unset, mark_unknown, requires_replace_if_changed, AttrPath, Attribute, Diagnostic,
    Diagnostics, PlannedChange, ResourceType, Schema, Type, Value,
};
use crate::state::ProviderState;
use crate::times;

pub struct HealthCheck {
    provider: Arc<ProviderState>,
}

impl HealthCheck {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

const REPLACE_ON: &[&str] = &["cluster_id", "level", "triggers"];
const COMPUTED: &[&str] = &[
    "id",
    "tenant_id",
    "passed",
    "status",
    "checked_at",
    "nodes",
    "results",
    "bus_bandwidth_gbps",
];

/// The state of one run from its report and its cluster's tenant's id; `inputs` gives
/// the configuration's values.
fn state(inputs: &Value, r: &api::ClusterHealthReport, tenant_id: Value) -> Value {
    let checked = r.checked_at.as_ref().map_or(0, |t| t.seconds);
    let mut s = inputs.clone();
    // One id per run: two runs within a second share their time, never their run id (a
    // control plane from before run ids gives none).
    let run = if r.run_id.is_empty() {
        checked.to_string()
    } else {
        r.run_id.clone()
    };
    s.set("id", Value::String(format!("{}/{run}", r.cluster_id)));
    s.set("cluster_id", Value::string(&r.cluster_id));
    s.set("tenant_id", tenant_id);
    s.set("passed", Value::Bool(r.status == "passed"));
    s.set("status", Value::string(&r.status));
    s.set(
        "checked_at",
        if checked > 0 {
            Value::String(times::canonical(checked))
        } else {
            Value::Null
        },
    );
    s.set(
        "nodes",
        Value::List(r.nodes.iter().map(summary_value).collect()),
    );
    s.set("results", acceptance::results(r));
    s.set("bus_bandwidth_gbps", whole_gbps(r.bus_bandwidth_gbps));
    s
}

fn plan(prior: Option<&Value>, proposed: Value, config: &Value) -> PlannedChange {
    let mut planned = proposed;
    default_when_unset(
        &mut planned,
        config,
        "level",
        Value::string(acceptance::DEFAULT_LEVEL),
    );
    default_when_unset(
        &mut planned,
        config,
        "triggers",
        Value::Map(Default::default()),
    );
    let Some(prior) = prior else {
        mark_unknown(&mut planned, COMPUTED);
        return PlannedChange {
            state: planned,
            requires_replace: vec![],
        };
    };
    // An imported run's triggers are unknown (null): the configuration's, if any, are
    // recorded in place; they ran nothing.
    let imported = prior.get("triggers").is_null();
    if imported && config.get("triggers").is_null() {
        planned.set("triggers", Value::Null);
    }
    let replace_on: Vec<&str> = REPLACE_ON
        .iter()
        .copied()
        .filter(|a| !(imported && *a == "triggers"))
        .collect();
    let requires_replace = requires_replace_if_changed(prior, &planned, &replace_on);
    if !requires_replace.is_empty() {
        mark_unknown(&mut planned, COMPUTED);
    }
    PlannedChange {
        state: planned,
        requires_replace,
    }
}

/// The id of the tenant whose cluster `cluster_id` is, as the token sees it (null when it
/// does not).
async fn tenant_of(client: &Client, cluster_id: &str) -> Result<Value, Diagnostics> {
    let request = api::GetTenantClusterRequest {
        id: cluster_id.to_string(),
    };
    Ok(
        found(client, client.clusters().get_tenant_cluster(request).await)?
            .map_or(Value::Null, |c| Value::string(&c.tenant_id)),
    )
}

async fn report(
    client: &Client,
    cluster_id: &str,
) -> Result<Option<api::ClusterHealthReport>, Diagnostics> {
    let request = api::GetHealthReportRequest {
        cluster_id: cluster_id.to_string(),
    };
    found(client, client.health().get_health_report(request).await)
}

#[async_trait]
impl ResourceType for HealthCheck {
    fn name(&self) -> &'static str {
        "health_check"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Runs health checks on every node of a tenant cluster when applied: GPU health at `level` on each node's agent and real TCP bandwidth between the nodes. Nodes that fail are quarantined and replaced (each replacement checked too); without a replacement the cluster becomes `degraded`. Changing `level` or `triggers` runs the checks again; destroying it only forgets the results (the backend keeps them).",
            vec![
                Attribute::computed("id", Type::String, "`<cluster_id>/<run id>`: one per run."),
                Attribute::required("cluster_id", Type::String, "The cluster to check (a `gpufleet_tenant_cluster`'s `id`); the token must see it. Changing it runs the checks again."),
                Attribute::optional_computed("level", Type::String, "`quick`, `medium` or `long`. Defaults to `medium`. Changing it runs the checks again."),
                Attribute::optional_computed("triggers", Type::map(Type::String), "Arbitrary values; changing any runs the checks again (e.g. `{ week = \"2027-W03\" }`). Defaults to `{}`."),
                Attribute::computed("tenant_id", Type::String, "The id of the tenant whose cluster it checks: a read with another tenant's token is refused naming it, not taken as deleted."),
                Attribute::computed("passed", Type::Bool, "Whether every node of the cluster passed in the end (failed nodes replaced by ones that passed)."),
                Attribute::computed("status", Type::String, "`passed` or `failed`."),
                Attribute::computed("checked_at", Type::String, "When the run finished (RFC 3339)."),
                Attribute::computed("nodes", Type::list(summary_type()), "Each node's verdict: `node`, `level`, `verdict`, `summary` (the failed checks with value and threshold), `action` (e.g. `quarantined; replaced by <node>`) and `checked_at`."),
                Attribute::computed("results", Type::list(result_type()), "Every check of every node: `node`, `check` (e.g. `ecc_uncorrected_volatile`, `xid`, `pcie_link`, `driver`, `bandwidth`), `gpu_uuid` (empty for a node-wide check), `verdict` (`pass`, `warn`, `fail` or `not_run`), `value`, `threshold`, `detail` and `peer` (for `bandwidth`)."),
                Attribute::computed("bus_bandwidth_gbps", Type::Number, "All-reduce bus bandwidth equivalent of the slowest pair, Gbit/s (whole); 0 with one node."),
            ],
        )
    }

    async fn validate(&self, config: &Value) -> Result<(), Diagnostics> {
        let mut diags = Diagnostics::default();
        match config.str_attr("level") {
            Ok(Some(l)) => {
                if let Err(reason) = level_text(l) {
                    diags.attr_error("level", reason);
                }
            }
            Ok(None) => {}
            Err(d) => diags.push(d),
        }
        if let Ok(Some(id)) = config.str_attr("cluster_id") {
            if id.is_empty() {
                diags.attr_error("cluster_id", "must not be empty");
            }
        }
        diags.into_result()
    }

    /// The run is a record: it stays as it was while its cluster exists (a state from
    /// before `tenant_id` gains it).
    async fn read(&self, prior: &Value) -> Result<Option<Value>, Diagnostics> {
        let client = self.provider.client()?;
        let cluster_id = required_str(prior, "cluster_id")?;
        if report(&client, &cluster_id).await?.is_none() {
            return Ok(None);
        }
        let mut s = prior.clone();
        if s.get("tenant_id").is_null() {
            s.set("tenant_id", tenant_of(&client, &cluster_id).await?);
        }
        Ok(Some(s))
    }

    async fn plan(
        &self,
        prior: Option<&Value>,
        proposed: Value,
        config: &Value,
    ) -> Result<PlannedChange, Diagnostics> {
        Ok(plan(prior, proposed, config))
    }

    async fn create(&self, planned: &Value, _config: &Value) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let request = api::RunHealthCheckRequest {
            cluster_id: required_str(planned, "cluster_id")?,
            level: required_str(planned, "level")?,
            bandwidth_duration_ms: 0,
        };
        let r =
            answered(&client, client.health().run_health_check(request).await).map_err(|d| {
                let mut d = d;
                for e in d.0.iter_mut() {
                    if e.path.is_none() {
                        e.path = Some(AttrPath::attr("cluster_id"));
                    }
                }
                d
            })?;
        let tenant_id = tenant_of(&client, &r.cluster_id).await?;
        Ok(state(planned, &r, tenant_id))
    }

    async fn update(
        &self,
        prior: &Value,
        planned: &Value,
        _config: &Value,
    ) -> Result<Value, Diagnostics> {
        // Every input forces a new run; nothing else can change in place.
        let mut s = prior.clone();
        for name in ["level", "triggers"] {
            s.set(name, planned.get(name).clone());
        }
        Ok(s)
    }

    async fn delete(&self, _prior: &Value) -> Result<(), Diagnostics> {
        Ok(())
    }

    /// Imports the cluster's latest report (id: the cluster's id).
    async fn import(&self, id: &str) -> Result<Value, Diagnostics> {
        let client = self.provider.client()?;
        let r = imported(
            "tenant cluster",
            id,
            "the cluster's id",
            report(&client, id).await?,
        )?;
        // The backend keeps no triggers: null until the configuration's are adopted.
        let inputs = Value::object([
            ("level", Value::string(&r.level)),
            ("triggers", Value::Null),
        ]);
        if r.status == "not_run" {
            return Err(diag(Diagnostic::error(
                format!("cluster {id:?} has no health checks to import"),
                "Apply a gpufleet_health_check for it instead.",
            )));
        }
        let tenant_id = tenant_of(&client, &r.cluster_id).await?;
        Ok(state(&inputs, &r, tenant_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(level: Option<&str>, triggers: &[(&str, &str)]) -> Value {
        Value::object([
            ("id", Value::Null),
            ("cluster_id", Value::string("c1")),
            ("level", level.map_or(Value::Null, Value::string)),
            (
                "triggers",
                if triggers.is_empty() {
                    Value::Null
                } else {
                    Value::Map(
                        triggers
                            .iter()
                            .map(|(k, v)| (k.to_string(), Value::string(*v)))
                            .collect(),
                    )
                },
            ),
            ("passed", Value::Null),
            ("status", Value::Null),
            ("checked_at", Value::Null),
            ("nodes", Value::Null),
            ("results", Value::Null),
            ("bus_bandwidth_gbps", Value::Null),
        ])
    }

    fn report() -> api::ClusterHealthReport {
        api::ClusterHealthReport {
            cluster_id: "c1".into(),
            level: "medium".into(),
            status: "passed".into(),
            checked_at: Some(times::to_proto(1_800_000_000)),
            nodes: vec![api::NodeHealth {
                node: "n1".into(),
                level: "medium".into(),
                verdict: "failed".into(),
                checked_at: Some(times::to_proto(1_800_000_000)),
                summary: "xid on GPU-1: 1 XID 79 (threshold 0)".into(),
                checks: vec![api::HealthCheckResult {
                    name: "xid".into(),
                    gpu_uuid: "GPU-1".into(),
                    verdict: "fail".into(),
                    value: "1 XID 79".into(),
                    threshold: "0".into(),
                    ..Default::default()
                }],
                action: "quarantined; replaced by n2".into(),
            }],
            alg_bandwidth_gbps: 10.5,
            bus_bandwidth_gbps: 10.5,
            min_bus_bandwidth_gbps: 0.0,
            run_id: "r1".into(),
        }
    }

    #[test]
    fn each_run_has_an_id_of_its_own_even_within_one_second() {
        let first = state(&config(None, &[]), &report(), Value::string("t1"));
        let second = state(
            &config(None, &[]),
            &api::ClusterHealthReport {
                run_id: "r2".into(),
                ..report()
            },
            Value::Null,
        );
        assert_eq!(first.get("id"), &Value::string("c1/r1"));
        assert_ne!(first.get("id"), second.get("id"));
        // From a control plane without run ids: the run's time, as before.
        let older = state(
            &config(None, &[]),
            &api::ClusterHealthReport {
                run_id: String::new(),
                ..report()
            },
            Value::Null,
        );
        assert_eq!(older.get("id"), &Value::string("c1/1800000000"));
    }

    #[test]
    fn a_new_level_or_trigger_runs_again_and_nothing_else_does() {
        let created = plan(None, config(None, &[]), &config(None, &[]));
        assert_eq!(created.state.get("level"), &Value::string("medium"));
        assert!(created.state.get("results").is_unknown());
        let prior = state(&created.state, &report(), Value::string("t1"));
        assert_eq!(prior.get("passed"), &Value::Bool(true));
        assert_eq!(prior.get("bus_bandwidth_gbps"), &Value::Number(10));
        let Value::List(results) = prior.get("results") else {
            panic!("results is not a list")
        };
        assert_eq!(results[0].get("value"), &Value::string("1 XID 79"));
        assert_eq!(results[0].get("node"), &Value::string("n1"));
        // The same configuration: the same state, no run.
        let mut proposed = config(None, &[]);
        for c in COMPUTED {
            proposed.set(c, prior.get(c).clone());
        }
        let same = plan(Some(&prior), proposed.clone(), &config(None, &[]));
        assert!(same.requires_replace.is_empty());
        assert_eq!(same.state, prior);
        // A trigger changes: a new run.
        let mut with_trigger = proposed;
        with_trigger.set(
            "triggers",
            Value::Map([("week".to_string(), Value::string("3"))].into()),
        );
        let again = plan(Some(&prior), with_trigger, &config(None, &[("week", "3")]));
        assert_eq!(again.requires_replace, vec![AttrPath::attr("triggers")]);
        assert!(again.state.get("results").is_unknown());
    }

    #[test]
    fn an_imported_run_adopts_the_configurations_triggers_without_running_again() {
        let mut imported = state(&config(Some("medium"), &[]), &report(), Value::string("t1"));
        imported.set("triggers", Value::Null);
        let mut proposed = config(Some("medium"), &[]);
        for c in COMPUTED {
            proposed.set(c, imported.get(c).clone());
        }
        let same = plan(
            Some(&imported),
            proposed.clone(),
            &config(Some("medium"), &[]),
        );
        assert_eq!(
            same.state, imported,
            "no triggers configured: nothing to do"
        );
        let weekly = config(Some("medium"), &[("week", "3")]);
        proposed.set("triggers", weekly.get("triggers").clone());
        let adopted = plan(Some(&imported), proposed.clone(), &weekly);
        assert!(adopted.requires_replace.is_empty(), "no new run");
        assert_eq!(adopted.state.get("triggers"), weekly.get("triggers"));
        assert_eq!(adopted.state.get("results"), imported.get("results"));
        // Another level is a run that the imported one was not: a new run.
        proposed.set("level", Value::string("long"));
        let longer = plan(
            Some(&imported),
            proposed,
            &config(Some("long"), &[("week", "3")]),
        );
        assert_eq!(longer.requires_replace, vec![AttrPath::attr("level")]);
    }
}
