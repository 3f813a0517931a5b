//! `gpufleet_run_health_check`: runs health checks on every node of a cluster now, at a
//! level, as `gpufleet_health_check` does at apply but without keeping a record in state.
//! Failed nodes are quarantined and replaced by the backend; a failed run is an error that
//! names each failing node, check, value and threshold.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;

use super::{on_attribute, saying_while};
use crate::framework::{
    ActionType, Attribute, Diagnostic, Diagnostics, Progress, Schema, Type, Value,
};
use crate::resources::acceptance::level_text;
use crate::resources::common::answered;
use crate::state::ProviderState;

pub struct RunHealthCheck {
    provider: Arc<ProviderState>,
}

impl RunHealthCheck {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl ActionType for RunHealthCheck {
    fn name(&self) -> &'static str {
        "run_health_check"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "Runs health checks on every node of a tenant cluster now: GPU health at `level` on each node's agent and real TCP bandwidth between the nodes. Nodes that fail are quarantined and replaced (each replacement checked too). A failed run is an error naming each failing node, check, value and threshold. Progress shows in Terraform's output while the checks run.",
            vec![
                Attribute::required("cluster_id", Type::String, "The id of the tenant cluster whose nodes are checked."),
                Attribute::optional("level", Type::String, "`quick`, `medium` or `long`. Defaults to the cluster's acceptance level."),
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
        if let Ok(Some("")) = config.str_attr("cluster_id") {
            diags.attr_error("cluster_id", "must not be empty");
        }
        diags.into_result()
    }

    /// The cluster must exist for the token, when plan can tell.
    async fn plan(&self, config: &Value) -> Result<(), Diagnostics> {
        self.validate(config).await?;
        let (Some(client), Ok(Some(id))) =
            (self.provider.plan_client(), config.str_attr("cluster_id"))
        else {
            return Ok(());
        };
        let request = api::GetTenantClusterRequest { id: id.to_string() };
        answered(&client, client.clusters().get_tenant_cluster(request).await)
            .map_err(|d| on_attribute(d, "cluster_id", "id"))?;
        Ok(())
    }

    async fn invoke(&self, config: &Value, progress: &Progress) -> Result<(), Diagnostics> {
        let client = self.provider.client()?;
        let cluster_id = config
            .str_attr("cluster_id")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let level = config
            .str_attr("level")
            .map_err(Diagnostics::from)?
            .unwrap_or_default()
            .to_string();
        let shown = if level.is_empty() {
            "acceptance-level"
        } else {
            &level
        };
        progress
            .say(format!(
                "running {shown} health checks on cluster {cluster_id}"
            ))
            .await;
        let request = api::RunHealthCheckRequest {
            cluster_id: cluster_id.clone(),
            level,
            bandwidth_duration_ms: 0,
        };
        let mut health = client.health();
        let call = health.run_health_check(request);
        let answer = saying_while(progress, "checking", call).await;
        let report =
            answered(&client, answer).map_err(|d| on_attribute(d, "cluster_id", "cluster_id"))?;
        for node in &report.nodes {
            let action = if node.action.is_empty() {
                String::new()
            } else {
                format!("; {}", node.action)
            };
            progress
                .say(format!(
                    "{}: {} ({}){action}",
                    node.node, node.verdict, node.summary
                ))
                .await;
        }
        if report.bus_bandwidth_gbps > 0.0 {
            progress
                .say(format!(
                    "bus bandwidth {:.1} Gbit/s",
                    report.bus_bandwidth_gbps
                ))
                .await;
        }
        verdict(&report)
    }
}

/// A run in which any node failed is one error per failing node, naming its failing checks
/// with value and threshold, and what the backend did (a replaced node leaves the cluster
/// whole, but the check still failed: whoever invoked it must hear of the node).
fn verdict(report: &api::ClusterHealthReport) -> Result<(), Diagnostics> {
    let any_failed = report.nodes.iter().any(|n| n.verdict == "failed");
    if report.status != "failed" && !any_failed {
        return Ok(());
    }
    let mut diags = Diagnostics::default();
    for node in report.nodes.iter().filter(|n| n.verdict == "failed") {
        let failing: Vec<String> = node
            .checks
            .iter()
            .filter(|c| c.verdict == "fail")
            .map(|c| {
                let gpu = if c.gpu_uuid.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", c.gpu_uuid)
                };
                format!("{}{gpu} = {} (threshold {})", c.name, c.value, c.threshold)
            })
            .collect();
        let what = if failing.is_empty() {
            node.summary.clone()
        } else {
            failing.join("; ")
        };
        let action = if node.action.is_empty() {
            String::new()
        } else {
            format!("; {}", node.action)
        };
        diags.push(Diagnostic::error(
            format!(
                "health check failed on node {} of cluster {} ({} level): {what}{action}",
                node.node, report.cluster_id, report.level
            ),
            node.summary.clone(),
        ));
    }
    if diags.0.is_empty() {
        diags.push(Diagnostic::error(
            format!(
                "health checks failed on cluster {} ({} level)",
                report.cluster_id, report.level
            ),
            "",
        ));
    }
    Err(diags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_names_the_node_the_check_and_its_value() {
        let report = api::ClusterHealthReport {
            cluster_id: "c1".into(),
            level: "quick".into(),
            status: "failed".into(),
            nodes: vec![
                api::NodeHealth {
                    node: "n1".into(),
                    verdict: "passed".into(),
                    ..Default::default()
                },
                api::NodeHealth {
                    node: "n2".into(),
                    verdict: "failed".into(),
                    action: "quarantined; replaced by n3".into(),
                    checks: vec![api::HealthCheckResult {
                        name: "ecc_uncorrected_volatile".into(),
                        verdict: "fail".into(),
                        value: "2".into(),
                        threshold: "0".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let err = verdict(&report).unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(
            err.0[0].summary,
            "health check failed on node n2 of cluster c1 (quick level): ecc_uncorrected_volatile = 2 (threshold 0); quarantined; replaced by n3"
        );
        // Replaced, the cluster passes again; the node's failure is still an error.
        let healed = api::ClusterHealthReport {
            status: "passed".into(),
            ..report.clone()
        };
        assert_eq!(verdict(&healed).unwrap_err().0.len(), 1);
        let passed = api::ClusterHealthReport {
            status: "passed".into(),
            nodes: vec![report.nodes[0].clone()],
            ..report
        };
        assert!(verdict(&passed).is_ok());
    }

    #[tokio::test]
    async fn a_bad_level_is_refused_on_its_attribute() {
        let action = RunHealthCheck::new(Arc::new(ProviderState::default()));
        let config = Value::object([
            ("cluster_id", Value::string("c1")),
            ("level", Value::string("deep")),
        ]);
        let err = action.validate(&config).await.unwrap_err();
        assert!(err.0[0].summary.starts_with("level: must be"), "{err:?}");
        assert!(err.0[0].path.is_some());
    }
}
