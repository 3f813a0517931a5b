//! `--metrics-listen`: a real Prometheus (Debian's `prometheus`, installed by
//! scripts/bootstrap.sh) scrapes a control plane and two node agents, and the values come
//! back through its HTTP API; `promtool check metrics` passes on both kinds of endpoint; every
//! metric the Grafana dashboard (examples/grafana/gpufleet.json) queries exists.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use gpufleet_e2e::fixtures::{create_quota, create_reservation, create_tenant};
use gpufleet_e2e::prom::{self, Prometheus};
use gpufleet_e2e::{eventually, Backend, Clients, NodeAgent};
use gpufleet_proto::v1::{CreateTenantClusterRequest, GetTenantRequest};

const LIMIT: Duration = Duration::from_secs(30);
const METRICS: &[&str] = &["--metrics-listen", "127.0.0.1:0"];

/// An external control plane with metrics, and agents (name, extra flags) with metrics;
/// returns them with the control plane's and each agent's metrics address.
async fn fleet(agents: &[(&str, &[&str])]) -> (Backend, String, Vec<(NodeAgent, String)>) {
    let backend = Backend::start_with_args(&[
        "--node-agents",
        "external",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let control = prom::wait_for_metrics_addr("the control plane", || backend.log());
    let started: Vec<NodeAgent> = agents
        .iter()
        .map(|(name, extra)| {
            let flags: Vec<&str> = extra.iter().chain(METRICS).copied().collect();
            NodeAgent::start(&backend, name, &flags)
        })
        .collect();
    let with_addr = started
        .into_iter()
        .map(|a| {
            let addr = prom::wait_for_metrics_addr(&a.name, || a.log());
            (a, addr)
        })
        .collect();
    let admin = backend.admin().await;
    let names: Vec<String> = agents.iter().map(|(n, _)| n.to_string()).collect();
    eventually(&format!("nodes {names:?} ready"), LIMIT, || {
        let mut admin = admin.clone();
        let names = names.clone();
        async move {
            let all = admin.nodes().await;
            names
                .iter()
                .all(|name| {
                    all.iter()
                        .any(|n| &n.hostname == name && n.state == "ready")
                })
                .then_some(())
        }
    })
    .await;
    (backend, control, with_addr)
}

fn gpu_uuid(agent: &NodeAgent, index: usize) -> String {
    agent.status().expect("the agent's status")["gpus"][index]["uuid"]
        .as_str()
        .expect("a GPU uuid")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_control_plane_and_two_agents() {
    // Fails first, and clearly, where prometheus is not installed.
    prom::tool("prometheus");
    prom::tool("promtool");
    let (backend, control, agents) = fleet(&[
        ("metrics-a", &["--gpus", "2"]),
        ("metrics-b", &["--gpus", "1", "--gpu-type", "A100-80GB"]),
    ])
    .await;
    let mut admin: Clients = backend.admin().await;

    // A tenant with quotas, a future reservation, a MIG cluster, and a request that fails.
    let (tenant, _) = create_tenant(&mut admin, "metrics-team").await;
    // The pool has 2 H100 GPUs to guarantee; the rest is burst.
    create_quota(&mut admin, &tenant.id, "H100-80GB", 2, 4).await;
    create_quota(&mut admin, &tenant.id, "A100-80GB", 1, 0).await;
    create_reservation(&mut admin, &tenant.id, "A100-80GB", 1, 1, 2).await;
    admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: "metrics-cluster".into(),
            tenant_id: tenant.id.clone(),
            name: "sliced".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            storage_gib: 10,
            mig_layout: [("3g.40gb".to_string(), 2)].into_iter().collect(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTenantCluster: {s}"));
    let missing = admin
        .tenants
        .get_tenant(GetTenantRequest {
            id: "no-such-tenant".into(),
        })
        .await
        .expect_err("an unknown tenant");
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let prometheus = Prometheus::start(&[
        ("control-plane", vec![control.clone()]),
        (
            "node-agents",
            agents.iter().map(|(_, addr)| addr.clone()).collect(),
        ),
    ]);
    // Every target scraped, then the values as Prometheus stored them.
    prometheus.wait_for_value("count(up == 1)", 3.0);
    let q = |expr: &str, want: f64| prometheus.wait_for_value(expr, want);
    q(r#"gpufleet_nodes{state="ready"}"#, 2.0);
    q(r#"gpufleet_nodes{state="unreachable"}"#, 0.0);
    let team = r#"tenant="metrics-team""#;
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="H100-80GB",kind="quota_guaranteed"}}"#),
        2.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="H100-80GB",kind="quota_burst"}}"#),
        4.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="H100-80GB",kind="used"}}"#),
        2.0,
    );
    q(
        &format!(r#"gpufleet_tenant_gpus{{{team},gpu_type="A100-80GB",kind="reserved"}}"#),
        1.0,
    );
    q(
        r#"gpufleet_gpus{gpu_type="H100-80GB",state="allocated"}"#,
        2.0,
    );
    q(r#"gpufleet_gpus{gpu_type="H100-80GB",state="free"}"#, 0.0);
    q(r#"gpufleet_gpus{gpu_type="A100-80GB",state="free"}"#, 1.0);
    q(r#"gpufleet_reservations{state="pending"}"#, 1.0);
    q(
        r#"gpufleet_mig_slices{gpu_type="H100-80GB",profile="3g.40gb",state="allocated"}"#,
        4.0,
    );
    q(
        r#"gpufleet_work_orders_total{kind="mig_layout",outcome="ok"}"#,
        1.0,
    );
    q(
        r#"gpufleet_api_requests_total{method="gpufleet.v1.TenantService/CreateTenant",code="OK"}"#,
        1.0,
    );
    q(
        r#"gpufleet_api_requests_total{method="gpufleet.v1.TenantService/GetTenant",code="NOT_FOUND"}"#,
        1.0,
    );
    q(
        r#"gpufleet_api_request_seconds_count{method="gpufleet.v1.TenantClusterService/CreateTenantCluster"}"#,
        1.0,
    );
    q("count(gpufleet_node_heartbeat_age_seconds < 30)", 2.0);
    // The agents' GPUs, per UUID, as the simulated hardware reports them.
    q("count(gpufleet_node_gpu_temperature_celsius)", 3.0);
    let (a, _) = &agents[0];
    let uuid = gpu_uuid(a, 1);
    q(
        &format!(r#"gpufleet_node_gpu_temperature_celsius{{node="metrics-a",uuid="{uuid}"}}"#),
        35.0,
    );
    q(
        &format!(r#"gpufleet_node_gpu_power_watts{{node="metrics-a",uuid="{uuid}"}}"#),
        70.0,
    );
    q(
        &format!(r#"gpufleet_node_gpu_ecc_uncorrected_errors{{uuid="{uuid}"}}"#),
        0.0,
    );
    q(
        &format!(r#"gpufleet_node_gpu_mig_instances{{uuid="{uuid}"}}"#),
        2.0,
    );
    q(r#"gpufleet_node_orders_queued{node="metrics-a"}"#, 0.0);
    q(
        r#"gpufleet_node_orders_total{node="metrics-a",kind="mig_layout",outcome="ok"}"#,
        1.0,
    );

    // Both kinds of endpoint pass promtool's checks.
    prom::promtool_check("the control plane's /metrics", &prom::scrape(&control));
    for (agent, addr) in &agents {
        prom::promtool_check(&format!("{}'s /metrics", agent.name), &prom::scrape(addr));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_grafana_dashboard_exists() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/grafana/gpufleet.json");
    let dashboard = prom::read_dashboard(&path);
    let exprs = prom::dashboard_exprs(&dashboard);
    assert!(
        exprs.len() >= 10,
        "the dashboard has only {} queries",
        exprs.len()
    );

    let (backend, control, agents) = fleet(&[("dash-a", &["--gpus", "1"])]).await;
    let mut admin = backend.admin().await;
    // Requests, so that the request metrics have series.
    let (tenant, _) = create_tenant(&mut admin, "dash-team").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 1, 0).await;
    let text = format!("{}\n{}", prom::scrape(&control), prom::scrape(&agents[0].1));

    let mut missing = BTreeSet::new();
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = prom::promql_metric_names(expr);
        assert!(!names.is_empty(), "no metric in the dashboard query {expr}");
        for name in names {
            if !prom::exposes(&text, &name) {
                missing.insert(format!("{name} (in {expr})"));
            }
            used.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics that /metrics does not have:\n{}\n--- /metrics ---\n{text}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
    // The panels the dashboard promises.
    for family in [
        "gpufleet_gpus",
        "gpufleet_tenant_gpus",
        "gpufleet_reservations",
        "gpufleet_nodes",
        "gpufleet_node_heartbeat_age_seconds",
        "gpufleet_api_requests_total",
        "gpufleet_api_request_seconds_bucket",
    ] {
        assert!(used.contains(family), "no dashboard panel uses {family}");
    }
}
