//! `gpufleet_cluster_dashboard`: a tenant cluster's Grafana dashboard (JSON, every query
//! filtered to the cluster's `cluster_id`, the quota and usage panels to its `tenant_id`) and the
//! Prometheus scrape job that feeds it (a Slurm cluster's dashboard shows its jobs too): the control plane's metrics endpoint scraped
//! with one of the team's tokens, which shows the team's own series only.
//!
//! The dashboard and the job are built here from the cluster's answer (GetTenantCluster,
//! so the token must see the cluster); [`dashboard`] and [`scrape_config`] are pure.

use std::sync::Arc;

use async_trait::async_trait;
use gpufleet_proto::v1 as api;
use serde_json::{json, Value as Json};

use super::required_arg;
use crate::framework::{
    AttrPath, Attribute, DataSourceType, Diagnostic, Diagnostics, Schema, Type, Value,
};
use crate::state::ProviderState;

pub struct ClusterDashboard {
    provider: Arc<ProviderState>,
}

impl ClusterDashboard {
    pub fn new(provider: Arc<ProviderState>) -> Self {
        Self { provider }
    }
}

/// One panel: its title, unit, kind and queries (expression, legend).
struct Panel {
    title: &'static str,
    unit: &'static str,
    kind: &'static str,
    queries: Vec<(String, &'static str)>,
}

/// The panels of a cluster's dashboard, every query filtered to `cluster_id` (and the
/// quota panel to `tenant_id`); a Slurm cluster's has its jobs too.
fn panels(cluster_id: &str, tenant_id: &str, orchestrator: &str) -> Vec<Panel> {
    let c = format!(r#"cluster_id="{cluster_id}""#);
    let t = format!(r#"tenant_id="{tenant_id}""#);
    let gpu = "{{node}} GPU {{gpu}}";
    let p = |title, unit, kind, queries| Panel {
        title,
        unit,
        kind,
        queries,
    };
    let mut all = vec![
        p(
            "Cluster status",
            "none",
            "table",
            vec![(format!("gpufleet_cluster_info{{{c}}}"), "{{name}}: {{status}}")],
        ),
        p(
            "Nodes by state",
            "none",
            "timeseries",
            vec![(format!("gpufleet_cluster_nodes{{{c}}}"), "{{state}}")],
        ),
        p(
            "GPU utilisation",
            "percent",
            "timeseries",
            vec![(
                format!("gpufleet_cluster_gpu_utilization_percent{{{c}}}"),
                gpu,
            )],
        ),
        p(
            "GPU memory in use",
            "bytes",
            "timeseries",
            vec![(format!("gpufleet_cluster_gpu_memory_used_bytes{{{c}}}"), gpu)],
        ),
        p(
            "GPU memory in use (share)",
            "percentunit",
            "timeseries",
            vec![(
                format!(
                    "gpufleet_cluster_gpu_memory_used_bytes{{{c}}} / gpufleet_cluster_gpu_memory_total_bytes{{{c}}}"
                ),
                gpu,
            )],
        ),
        p(
            "GPU temperature",
            "celsius",
            "timeseries",
            vec![(
                format!("gpufleet_cluster_gpu_temperature_celsius{{{c}}}"),
                gpu,
            )],
        ),
        p(
            "GPU power",
            "watt",
            "timeseries",
            vec![(format!("gpufleet_cluster_gpu_power_watts{{{c}}}"), gpu)],
        ),
        p(
            "Uncorrected ECC errors",
            "none",
            "timeseries",
            vec![(
                format!("gpufleet_cluster_gpu_ecc_uncorrected_errors{{{c}}}"),
                gpu,
            )],
        ),
        p(
            "XIDs (last 15 minutes)",
            "none",
            "timeseries",
            vec![(
                format!("increase(gpufleet_cluster_gpu_xids_total{{{c}}}[15m])"),
                gpu,
            )],
        ),
        p(
            "MIG slices",
            "none",
            "table",
            vec![(
                format!("count by (node, gpu, profile) (gpufleet_cluster_mig_slice_memory_bytes{{{c}}})"),
                "{{node}} GPU {{gpu}} {{profile}}",
            )],
        ),
        p(
            "Health checks passed",
            "none",
            "table",
            vec![(
                format!("gpufleet_cluster_node_check_passed{{{c}}}"),
                "{{node}} ({{level}})",
            )],
        ),
        p(
            "Failed checks",
            "none",
            "timeseries",
            vec![(
                format!(r#"sum by (node) (gpufleet_cluster_node_checks{{{c},verdict="fail"}})"#),
                "{{node}}",
            )],
        ),
        p(
            "Heartbeat age",
            "s",
            "timeseries",
            vec![(
                format!("gpufleet_cluster_node_heartbeat_age_seconds{{{c}}}"),
                "{{node}}",
            )],
        ),
        p(
            "Team quota and use",
            "none",
            "timeseries",
            vec![(
                format!("gpufleet_tenant_gpus{{{t}}}"),
                "{{gpu_type}} {{kind}}",
            )],
        ),
        // Usage (issue 42): GPU-hours held and used over the last day, per model and
        // class; used only where the GPUs report utilisation (no series: not reported).
        p(
            "Team GPU-hours held (24 h)",
            "none",
            "timeseries",
            vec![(
                format!(
                    "sum by (gpu_type, class) (increase(gpufleet_gpu_seconds_total{{{t}}}[24h])) / 3600"
                ),
                "{{gpu_type}} {{class}}",
            )],
        ),
        p(
            "Team GPU-hours used (24 h)",
            "none",
            "timeseries",
            vec![(
                format!(
                    "sum by (gpu_type, class) (increase(gpufleet_gpu_seconds_used_total{{{t}}}[24h])) / 3600"
                ),
                "{{gpu_type}} {{class}}",
            )],
        ),
    ];
    if orchestrator == "slurm" {
        all.push(p(
            "Slurm jobs",
            "none",
            "timeseries",
            vec![(format!("gpufleet_cluster_slurm_jobs{{{c}}}"), "{{state}}")],
        ));
    }
    all
}

/// The Grafana dashboard of cluster `cluster_id` (named `name`, run by `orchestrator`) of
/// tenant `tenant_id`, on a Prometheus data source chosen when it is imported
/// (`${datasource}`).
pub fn dashboard(cluster_id: &str, name: &str, tenant_id: &str, orchestrator: &str) -> Json {
    let source = json!({"type": "prometheus", "uid": "${datasource}"});
    let panels: Vec<Json> = panels(cluster_id, tenant_id, orchestrator)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let targets: Vec<Json> = p
                .queries
                .iter()
                .zip('A'..)
                .map(|((expr, legend), id)| {
                    json!({
                        "refId": id.to_string(),
                        "datasource": source,
                        "expr": expr,
                        "legendFormat": legend,
                    })
                })
                .collect();
            json!({
                "id": i + 1,
                "type": p.kind,
                "title": p.title,
                "datasource": source,
                "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i / 2) * 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "targets": targets,
            })
        })
        .collect();
    json!({
        "title": format!("gpufleet cluster {name}"),
        "uid": uid(cluster_id),
        "tags": ["gpufleet"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
        }]},
        "panels": panels,
    })
}

/// A Grafana uid (at most 40 characters) from the cluster's id.
fn uid(cluster_id: &str) -> String {
    let clean: String = cluster_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(30)
        .collect();
    format!("gpufleet-{clean}")
}

/// Every query of a dashboard, in panel order.
pub fn queries(dashboard: &Json) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

/// A YAML string literal (single-quoted: only `'` needs escaping).
fn yaml_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The Prometheus scrape job (an item of `scrape_configs`) for tenant `tenant_id`'s
/// view of the control plane's metrics at `address`, with the token in `token_file`.
pub fn scrape_config(tenant_id: &str, address: &str, token_file: &str) -> String {
    format!(
        "# gpufleet: team {tenant}'s clusters (one job serves every cluster of the team)\n\
         - job_name: {job}\n  \
           metrics_path: /metrics\n  \
           scheme: http\n  \
           authorization:\n    \
             type: Bearer\n    \
             credentials_file: {file}\n  \
           static_configs:\n    \
             - targets: [{target}]\n",
        tenant = tenant_id.replace('\n', " "),
        job = yaml_str(&format!("gpufleet-{tenant_id}")),
        file = yaml_str(token_file),
        target = yaml_str(address),
    )
}

/// `host:port` with a port, as Prometheus' targets are written.
fn check_address(address: &str) -> Result<(), Diagnostics> {
    let ok = address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
        && !address.contains(char::is_whitespace)
        && !address.contains("://");
    if ok {
        return Ok(());
    }
    Err(Diagnostic::error_at(
        AttrPath::attr("metrics_address"),
        format!(
            "metrics_address: {:?} is not host:port (the address of `gpufleet-agent serve --metrics-listen`, without a scheme)",
            address.chars().take(40).collect::<String>()
        ),
        "",
    )
    .into())
}

/// The address serve says its metrics are bound at (`bound`, empty without
/// `--metrics-listen`) as Prometheus writes a target: an unspecified IP (`0.0.0.0`, `::`)
/// is replaced by the host the provider reaches the control plane at (`endpoint`).
fn advertised_address(bound: &str, endpoint: &str) -> Result<String, String> {
    if bound.is_empty() {
        return Err("the control plane serves no metrics (`gpufleet-agent serve` was started without `--metrics-listen`); set metrics_address, or ask the operator to start serve with `--metrics-listen ADDR`".into());
    }
    let addr: std::net::SocketAddr = bound.parse().map_err(|_| {
        format!("the control plane answered {bound:?}, not host:port; set metrics_address")
    })?;
    if !addr.ip().is_unspecified() {
        return Ok(addr.to_string());
    }
    let host = endpoint
        .parse::<tonic::codegen::http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .ok_or_else(|| format!("the control plane listens for metrics on every address ({bound}) and the endpoint {endpoint:?} names no host; set metrics_address"))?;
    // An IPv6 host is bracketed in a URI already; a bare one (from an IP) is not.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    Ok(format!("{host}:{}", addr.port()))
}

#[async_trait]
impl DataSourceType for ClusterDashboard {
    fn name(&self) -> &'static str {
        "cluster_dashboard"
    }

    fn schema(&self) -> Schema {
        Schema::new(
            "A tenant cluster's Grafana dashboard and the Prometheus scrape job that feeds it. The job scrapes the control plane's metrics endpoint (`serve --metrics-listen`) with one of the team's tokens, which shows only the team's own series; every query of the dashboard is filtered to the cluster (the quota and usage panels to its team: GPU-hours held and used over the last day, by model and class).",
            vec![
                Attribute::computed("id", Type::String, "`dashboard/<cluster_id>`."),
                Attribute::required("cluster_id", Type::String, "The cluster (a `gpufleet_tenant_cluster`'s `id`); the token must see it."),
                Attribute::optional_computed("metrics_address", Type::String, "`host:port` where Prometheus reaches the control plane's metrics (`gpufleet-agent serve --metrics-listen`); default: the address serve says it listens on (on every address, `0.0.0.0` or `::`: the provider's endpoint's host with that port)."),
                Attribute::optional("token_file", Type::String, "The file on the Prometheus host that holds one of the team's tokens (a `read` token is enough); default `/etc/prometheus/gpufleet-<tenant_id>.token`."),
                Attribute::computed("tenant_id", Type::String, "The cluster's tenant."),
                Attribute::computed("dashboard_json", Type::String, "The Grafana dashboard (JSON, for `grafana_dashboard`'s `config_json` or Grafana's import); its data source is chosen at import (`${datasource}`)."),
                Attribute::computed("queries", Type::list(Type::String), "Every PromQL query of the dashboard, in panel order."),
                Attribute::computed("prometheus_scrape_config", Type::String, "A Prometheus scrape job (YAML, an item of `scrape_configs`) for the team's metrics."),
            ],
        )
    }

    async fn read(&self, config: &Value) -> Result<Value, Diagnostics> {
        let cluster_id = required_arg(config, "cluster_id")?;
        let given = config
            .str_attr("metrics_address")
            .map_err(Diagnostics::from)?
            .map(str::to_string);
        if let Some(a) = &given {
            check_address(a)?;
        }
        let token_file = config
            .str_attr("token_file")
            .map_err(Diagnostics::from)?
            .map(str::to_string);
        let client = self.provider.client()?;
        let address = match given {
            Some(a) => a,
            None => {
                let bound = client
                    .fleet()
                    .get_metrics_endpoint(api::GetMetricsEndpointRequest {})
                    .await
                    .map_err(|s| {
                        let d = client.diagnostic(&s);
                        Diagnostic::error_at(
                            AttrPath::attr("metrics_address"),
                            format!("metrics_address: the control plane cannot say where its metrics are ({}); set metrics_address", d.summary),
                            d.detail,
                        )
                    })?
                    .into_inner()
                    .address;
                advertised_address(&bound, client.endpoint()).map_err(|e| {
                    Diagnostic::error_at(
                        AttrPath::attr("metrics_address"),
                        format!("metrics_address: {e}"),
                        "",
                    )
                })?
            }
        };
        let cluster = client
            .clusters()
            .get_tenant_cluster(api::GetTenantClusterRequest {
                id: cluster_id.clone(),
            })
            .await
            .map_err(|s| client.diagnostic(&s))?
            .into_inner();
        let board = dashboard(
            &cluster.id,
            &cluster.name,
            &cluster.tenant_id,
            &cluster.orchestrator,
        );
        let token_file = token_file
            .unwrap_or_else(|| format!("/etc/prometheus/gpufleet-{}.token", cluster.tenant_id));
        let mut s = config.clone();
        s.set("id", Value::String(format!("dashboard/{}", cluster.id)));
        s.set("tenant_id", Value::string(&cluster.tenant_id));
        s.set("metrics_address", Value::string(&address));
        s.set(
            "queries",
            Value::List(queries(&board).into_iter().map(Value::String).collect()),
        );
        s.set("dashboard_json", Value::String(board.to_string()));
        s.set(
            "prometheus_scrape_config",
            Value::String(scrape_config(&cluster.tenant_id, &address, &token_file)),
        );
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_is_filtered_to_the_cluster_or_its_team() {
        let board = dashboard("c-1", "train", "t-1", "kubernetes");
        let qs = queries(&board);
        assert!(qs.len() >= 16, "{qs:?}");
        // The team's GPU-hours held and used, by model and class.
        for family in [
            "gpufleet_gpu_seconds_total",
            "gpufleet_gpu_seconds_used_total",
        ] {
            assert!(
                qs.iter()
                    .any(|q| q.contains(&format!("{family}{{tenant_id=\"t-1\"}}"))
                        && q.contains("by (gpu_type, class)")),
                "{family}: {qs:?}"
            );
        }
        assert!(!qs.iter().any(|q| q.contains("slurm")), "{qs:?}");
        let slurm = queries(&dashboard("c-1", "train", "t-1", "slurm"));
        assert_eq!(slurm.len(), qs.len() + 1);
        assert!(slurm
            .iter()
            .any(|q| q.contains("gpufleet_cluster_slurm_jobs")));
        for q in &qs {
            assert!(
                q.contains(r#"cluster_id="c-1""#) || q.contains(r#"tenant_id="t-1""#),
                "{q}"
            );
            // A query with two selectors filters both.
            let selectors = q.matches("gpufleet_").count();
            let filters =
                q.matches(r#"cluster_id="c-1""#).count() + q.matches(r#"tenant_id="t-1""#).count();
            assert_eq!(selectors, filters, "{q}");
        }
        assert_eq!(board["uid"], "gpufleet-c-1");
        assert_eq!(board["panels"][0]["targets"][0]["refId"], "A");
    }

    #[test]
    fn the_scrape_job_quotes_what_it_is_given() {
        let yaml = scrape_config("t-1", "10.0.0.1:9464", "/etc/it's.token");
        assert!(yaml.contains("- job_name: 'gpufleet-t-1'"), "{yaml}");
        assert!(
            yaml.contains("credentials_file: '/etc/it''s.token'"),
            "{yaml}"
        );
        assert!(yaml.contains("- targets: ['10.0.0.1:9464']"), "{yaml}");
        assert!(check_address("10.0.0.1:9464").is_ok());
        for bad in ["10.0.0.1", "http://h:1", "h:0", ":80", "h:x"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_address_is_servers_with_the_endpoints_host_for_any() {
        let e = "http://cp.example:7443";
        assert_eq!(
            advertised_address("10.1.2.3:9464", e).unwrap(),
            "10.1.2.3:9464"
        );
        assert_eq!(
            advertised_address("0.0.0.0:9464", e).unwrap(),
            "cp.example:9464"
        );
        assert_eq!(
            advertised_address("[::]:9464", "http://[fd00::1]:7443").unwrap(),
            "[fd00::1]:9464"
        );
        let none = advertised_address("", e).unwrap_err();
        assert!(none.contains("--metrics-listen"), "{none}");
    }
}
