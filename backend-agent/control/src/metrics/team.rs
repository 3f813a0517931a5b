//! A tenant's own view of the metrics, for a scrape with one of its tokens: its clusters,
//! its nodes' GPUs and MIG slices, its nodes' health checks and its quota use. Nothing of
//! another tenant and nothing fleet-wide (free capacity, other nodes, request counts):
//! every series is computed from rows read for this tenant alone, and carries its
//! `tenant_id`; every series of a cluster carries its `cluster_id`.
//!
//! - `gpufleet_cluster_info{tenant_id,cluster_id,name,orchestrator,gpu_type,status}` 1;
//!   `gpufleet_cluster_nodes{tenant_id,cluster_id,state}`.
//! - Per GPU of the cluster's nodes (labels `tenant_id`, `cluster_id`, `node`, `gpu` =
//!   index, `uuid`, `gpu_type`), as the node's agent last reported it on its heartbeats
//!   (`crate::telemetry`), only while the agent's session is live and only for what the
//!   agent could read: `gpufleet_cluster_gpu_utilization_percent`,
//!   `gpufleet_cluster_gpu_memory_used_bytes`, `gpufleet_cluster_gpu_memory_total_bytes`,
//!   `gpufleet_cluster_gpu_temperature_celsius`, `gpufleet_cluster_gpu_power_watts`,
//!   `gpufleet_cluster_gpu_ecc_uncorrected_errors`, `gpufleet_cluster_gpu_xids_total`.
//! - Per MIG slice, from the store (what the agents reported at their last change):
//!   `gpufleet_cluster_mig_slice_memory_bytes{...,gpu,profile,start,mig_uuid}`.
//!   NVML reports no utilisation per MIG slice (that takes DCGM's profiling counters), so
//!   there is none; a GPU in MIG mode has no whole-GPU utilisation either.
//! - Per Slurm cluster: `gpufleet_cluster_slurm_jobs{tenant_id,cluster_id,state}`
//!   (running, pending), as its controller (run by this control plane) last answered
//!   `squeue`; absent while it does not answer. A Kubernetes cluster's pods are not
//!   known to the control plane, so there is nothing of them.
//! - Per node: `gpufleet_cluster_node_heartbeat_age_seconds`, and its latest health check
//!   as a member of the cluster: `gpufleet_cluster_node_check_passed{...,level}` (1/0),
//!   `gpufleet_cluster_node_check_timestamp_seconds{...,level}`,
//!   `gpufleet_cluster_node_checks{...,level,verdict}` (checks by verdict).
//! - `gpufleet_tenant_gpus{tenant_id,gpu_type,kind}`: the operator's family, this tenant's
//!   rows only.
//! - `gpufleet_gpu_seconds_total`, `gpufleet_mig_slice_seconds_total`,
//!   `gpufleet_gpu_seconds_used_total` and
//!   `gpufleet_gpu_seconds_measured_total{tenant_id,gpu_type,class,mig_profile}`
//!   ([`super::usage`]): the operator's families, read for this tenant alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpufleet_sql::AsConn;
use prometheus::Registry;

use crate::scheduling::{holdings, Exclude, Holding};
use crate::state::AppState;
use crate::store::{
    self, clusters::ClusterRow, health::ResultRow, nodes::MigDeviceRow, nodes::NodeRow,
    quotas::QuotaRow,
};
use crate::telemetry::GpuReading;

const MIB: f64 = 1024.0 * 1024.0;

/// What one scrape reads of one tenant, in one read.
struct Snapshot {
    now: i64,
    tenant_id: String,
    tenant_name: String,
    clusters: Vec<ClusterRow>,
    /// The nodes of its clusters.
    nodes: Vec<NodeRow>,
    slices: HashMap<(String, i64), Vec<MigDeviceRow>>,
    /// Per cluster: the latest check of each node checked as its member.
    checks: BTreeMap<String, Vec<ResultRow>>,
    quotas: Vec<QuotaRow>,
    holdings: BTreeMap<String, Vec<Holding>>,
    /// Per Slurm cluster of the tenant: its jobs, when its controller answered.
    jobs: BTreeMap<String, gpufleet_slurm::status::JobCounts>,
    gpus_per_node: BTreeMap<String, i64>,
    /// Its lifetime GPU-seconds held, and used where its GPUs reported utilisation.
    usage_held: Vec<store::usage::Lifetime>,
    usage_used: Vec<store::usage::LifetimeUsed>,
}

fn read(conn: &impl AsConn, tenant_id: &str, now: i64) -> crate::error::Result<Option<Snapshot>> {
    let Some(tenant) = store::tenants::get(conn, tenant_id)? else {
        return Ok(None);
    };
    let clusters = store::clusters::list(conn, Some(tenant_id), None, None)?;
    let nodes = store::nodes::list_of_tenant(conn, tenant_id, None, None)?;
    let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    let slices = store::nodes::mig_devices_of(conn, &ids)?;
    let mut checks = BTreeMap::new();
    for c in &clusters {
        checks.insert(
            c.id.clone(),
            store::health::latest_for_cluster(conn, &c.id)?,
        );
    }
    let quotas = store::quotas::list(conn, Some(tenant_id))?;
    let reservations = store::reservations::list(conn, Some(tenant_id), None)?;
    let models: BTreeSet<String> = quotas
        .iter()
        .map(|q| q.gpu_type.clone())
        .chain(clusters.iter().map(|c| c.gpu_type.clone()))
        .chain(reservations.iter().map(|r| r.gpu_type.clone()))
        .collect();
    let mut held = BTreeMap::new();
    let mut gpus_per_node = BTreeMap::new();
    for model in models {
        // Every tenant's holdings of the model are read; only this tenant's are kept.
        let mine: Vec<Holding> = holdings(conn, &model, now, Exclude::default())?
            .into_iter()
            .filter(|h| h.tenant_id == tenant_id)
            .collect();
        gpus_per_node.insert(model.clone(), store::nodes::gpus_per_node(conn, &model)?);
        held.insert(model, mine);
    }
    let usage_held = store::usage::lifetime(conn, Some(tenant_id), now)?;
    let usage_used = store::usage::lifetime_used(conn, Some(tenant_id))?;
    Ok(Some(Snapshot {
        now,
        tenant_id: tenant_id.to_string(),
        tenant_name: tenant.name,
        clusters,
        nodes,
        slices,
        checks,
        quotas,
        holdings: held,
        gpus_per_node,
        jobs: BTreeMap::new(),
        usage_held,
        usage_used,
    }))
}

/// `tenant_id`'s metrics as Prometheus text (`None`: no such tenant any more). The store
/// is read on a blocking thread, then the registry's heartbeats and GPU readings (the two
/// locks are never held together). The tenant's name labels its quota series only with
/// `tenant_names`, as in the operator's view.
pub async fn render(
    state: Arc<AppState>,
    tenant_id: String,
    tenant_names: bool,
) -> Result<Option<String>, String> {
    let t = state.now();
    let Some(mut snapshot) = state
        .read(move |conn| read(conn, &tenant_id, t))
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    snapshot.jobs = snapshot
        .clusters
        .iter()
        .filter_map(|c| Some((c.id.clone(), state.agents.telemetry.jobs_of(&c.id)?)))
        .collect();
    let live: HashMap<String, Live> = snapshot
        .nodes
        .iter()
        .filter_map(|n| {
            let session = state.agents.session_of(&n.id)?;
            Some((
                n.id.clone(),
                Live {
                    heartbeat_age: state.agents.heartbeat_age(&n.id).map(|a| a.as_secs_f64()),
                    gpus: state
                        .agents
                        .telemetry
                        .of(&n.id, session)
                        .unwrap_or_default(),
                },
            ))
        })
        .collect();
    let families = gauges(&snapshot, &live, tenant_names);
    gpufleet_process::metrics_endpoint::encode(families).map(Some)
}

/// What the registry says of a node whose agent's session is live.
struct Live {
    heartbeat_age: Option<f64>,
    gpus: Vec<GpuReading>,
}

fn gauges(
    s: &Snapshot,
    live: &HashMap<String, Live>,
    tenant_names: bool,
) -> Vec<prometheus::proto::MetricFamily> {
    use gpufleet_process::metrics_endpoint::gauge_vec;
    let registry = Registry::new();
    let tenant = s.tenant_id.as_str();

    let info = gauge_vec(
        &registry,
        "gpufleet_cluster_info",
        "Each of the team's clusters (1), with its name, orchestrator, GPU model and status.",
        &[
            "tenant_id",
            "cluster_id",
            "name",
            "orchestrator",
            "gpu_type",
            "status",
        ],
    );
    let slurm_jobs = gauge_vec(
        &registry,
        "gpufleet_cluster_slurm_jobs",
        "A Slurm cluster's jobs by state (running, pending), as its controller answered the control plane's last look (every 2 s); absent while it does not answer.",
        &["tenant_id", "cluster_id", "state"],
    );
    for (cluster, counts) in &s.jobs {
        slurm_jobs
            .with_label_values(&[tenant, cluster, "running"])
            .set(counts.running as f64);
        slurm_jobs
            .with_label_values(&[tenant, cluster, "pending"])
            .set(counts.pending as f64);
    }
    let cluster_nodes = gauge_vec(
        &registry,
        "gpufleet_cluster_nodes",
        "The cluster's nodes by state: ready, busy, unreachable, quarantined.",
        &["tenant_id", "cluster_id", "state"],
    );
    let by_cluster: HashMap<&str, &ClusterRow> =
        s.clusters.iter().map(|c| (c.id.as_str(), c)).collect();
    for c in &s.clusters {
        info.with_label_values(&[
            tenant,
            &c.id,
            &c.name,
            &c.orchestrator,
            &c.gpu_type,
            &c.status,
        ])
        .set(1.0);
        for state in [
            store::nodes::NODE_READY,
            store::nodes::NODE_BUSY,
            store::nodes::NODE_UNREACHABLE,
            store::nodes::NODE_QUARANTINED,
        ] {
            cluster_nodes
                .with_label_values(&[tenant, &c.id, state])
                .set(0.0);
        }
    }

    let gpu_labels = &["tenant_id", "cluster_id", "node", "gpu", "uuid", "gpu_type"];
    let gpu_gauge = |name: &str, help: &str| gauge_vec(&registry, name, help, gpu_labels);
    let utilization = gpu_gauge(
        "gpufleet_cluster_gpu_utilization_percent",
        "Percent of the last sample period the GPU was busy, as its node's agent last reported it (none under MIG: NVML has no whole-GPU figure then).",
    );
    let memory_used = gpu_gauge(
        "gpufleet_cluster_gpu_memory_used_bytes",
        "GPU memory in use, as its node's agent last reported it.",
    );
    let memory_total = gpu_gauge(
        "gpufleet_cluster_gpu_memory_total_bytes",
        "GPU memory in all, as its node's agent last reported it.",
    );
    let temperature = gpu_gauge(
        "gpufleet_cluster_gpu_temperature_celsius",
        "GPU temperature, as its node's agent last reported it.",
    );
    let power = gpu_gauge(
        "gpufleet_cluster_gpu_power_watts",
        "GPU power draw, as its node's agent last reported it.",
    );
    let ecc = gpu_gauge(
        "gpufleet_cluster_gpu_ecc_uncorrected_errors",
        "Uncorrected ECC errors since the GPU's driver loaded (volatile), as its node's agent last reported it.",
    );
    let xids = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "gpufleet_cluster_gpu_xids_total",
            "XID errors the node's agent has seen on the GPU since the agent started.",
        ),
        gpu_labels,
    )
    .expect("a valid counter definition");
    registry
        .register(Box::new(xids.clone()))
        .expect("a counter registered once");
    let slice_memory = gauge_vec(
        &registry,
        "gpufleet_cluster_mig_slice_memory_bytes",
        "Each MIG slice on the cluster's GPUs (its memory), by profile and first memory slice.",
        &[
            "tenant_id",
            "cluster_id",
            "node",
            "gpu",
            "profile",
            "start",
            "mig_uuid",
        ],
    );
    let heartbeat = gauge_vec(
        &registry,
        "gpufleet_cluster_node_heartbeat_age_seconds",
        "Seconds since the node's agent was last heard from (nodes whose agent is connected).",
        &["tenant_id", "cluster_id", "node"],
    );
    let node_labels = &["tenant_id", "cluster_id", "node", "level"];
    let check_passed = gauge_vec(
        &registry,
        "gpufleet_cluster_node_check_passed",
        "Whether the node's latest health check as a member of the cluster passed (1) or failed (0), by level.",
        node_labels,
    );
    let check_time = gauge_vec(
        &registry,
        "gpufleet_cluster_node_check_timestamp_seconds",
        "When the node's latest health check as a member of the cluster finished (Unix seconds).",
        node_labels,
    );
    let check_verdicts = gauge_vec(
        &registry,
        "gpufleet_cluster_node_checks",
        "The checks of the node's latest health check by verdict (pass, warn, fail, not_run).",
        &["tenant_id", "cluster_id", "node", "level", "verdict"],
    );

    for n in &s.nodes {
        let Some(cluster) = n
            .cluster_id
            .as_deref()
            .filter(|c| by_cluster.contains_key(c))
        else {
            continue;
        };
        cluster_nodes
            .with_label_values(&[tenant, cluster, &n.state])
            .inc();
        for ((node_id, gpu), devices) in &s.slices {
            if *node_id != n.id {
                continue;
            }
            let gpu = gpu.to_string();
            for d in devices {
                let start = d.start.to_string();
                slice_memory
                    .with_label_values(&[
                        tenant,
                        cluster,
                        &n.hostname,
                        &gpu,
                        &d.profile,
                        &start,
                        &d.uuid,
                    ])
                    .set(d.memory_mib as f64 * MIB);
            }
        }
        let Some(l) = live.get(&n.id) else {
            continue;
        };
        if let Some(age) = l.heartbeat_age {
            heartbeat
                .with_label_values(&[tenant, cluster, &n.hostname])
                .set(age);
        }
        for g in &l.gpus {
            let index = g.index.to_string();
            let labels = [
                tenant,
                cluster,
                n.hostname.as_str(),
                index.as_str(),
                g.uuid.as_str(),
                n.gpu_type.as_str(),
            ];
            if let Some(u) = g.utilization_percent {
                utilization.with_label_values(&labels).set(f64::from(u));
            }
            if let Some((used, total)) = g.memory_mib {
                memory_used
                    .with_label_values(&labels)
                    .set(used as f64 * MIB);
                memory_total
                    .with_label_values(&labels)
                    .set(total as f64 * MIB);
            }
            if let Some(c) = g.temperature_c {
                temperature.with_label_values(&labels).set(f64::from(c));
            }
            if let Some(mw) = g.power_mw {
                power.with_label_values(&labels).set(f64::from(mw) / 1000.0);
            }
            if let Some(e) = g.ecc_uncorrected {
                ecc.with_label_values(&labels).set(e as f64);
            }
            xids.with_label_values(&labels).inc_by(g.xids_total);
        }
    }

    // Checks: only of nodes still in the cluster (a node that left may be another
    // team's now).
    for (cluster, results) in &s.checks {
        for r in results {
            let still_in = s
                .nodes
                .iter()
                .any(|n| n.id == r.node_id && n.cluster_id.as_deref() == Some(cluster));
            if !still_in {
                continue;
            }
            let labels = [tenant, cluster.as_str(), r.node.as_str(), r.level.as_str()];
            let passed = if r.verdict == "passed" { 1.0 } else { 0.0 };
            check_passed.with_label_values(&labels).set(passed);
            check_time
                .with_label_values(&labels)
                .set(r.finished_at as f64);
            for verdict in ["pass", "warn", "fail", "not_run"] {
                let count = r.checks.iter().filter(|c| c.verdict == verdict).count();
                check_verdicts
                    .with_label_values(&[tenant, cluster, &r.node, &r.level, verdict])
                    .set(count as f64);
            }
        }
    }

    // Quota use, as the operator's view computes it, this tenant's rows only.
    let tenant_labels: &[&str] = if tenant_names {
        &["tenant_id", "tenant", "gpu_type", "kind"]
    } else {
        &["tenant_id", "gpu_type", "kind"]
    };
    let tenant_gpus = gauge_vec(
        &registry,
        "gpufleet_tenant_gpus",
        "Per model: GPUs the team's clusters use outside reservations, reserved (peak of its reservations from now on), and its quota (quota_guaranteed, quota_burst).",
        tenant_labels,
    );
    let usage = super::control::tenant_usage(&s.quotas, &s.holdings, &s.gpus_per_node, s.now);
    for ((owner, model), values) in &usage {
        if *owner != tenant {
            continue;
        }
        for (kind, value) in super::control::TENANT_GPU_KINDS.iter().zip(values) {
            let series = if tenant_names {
                tenant_gpus.with_label_values(&[tenant, &s.tenant_name, model, kind])
            } else {
                tenant_gpus.with_label_values(&[tenant, model, kind])
            };
            series.set(*value as f64);
        }
    }
    let mut families = registry.gather();
    families.extend(super::usage::families(
        &s.usage_held,
        &s.usage_used,
        tenant_names,
    ));
    families
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(id: &str) -> ClusterRow {
        ClusterRow {
            id: id.into(),
            tenant_id: "t1".into(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            reservation_id: None,
            storage_gib: 10,
            status: "running".into(),
            endpoint: String::new(),
            credentials: String::new(),
            storage_path: String::new(),
            mig_layout: BTreeMap::new(),
            status_reason: String::new(),
            cuda_version: String::new(),
            driver_version: String::new(),
            max_unavailable: 1,
            storage_retention: "delete".into(),
        }
    }

    fn node(id: &str, cluster: &str) -> NodeRow {
        NodeRow {
            id: id.into(),
            hostname: id.into(),
            gpu_type: "H100-80GB".into(),
            capacity: "pool".into(),
            gpu_count: 1,
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            cluster_id: Some(cluster.into()),
            state: "ready".into(),
            state_reason: String::new(),
            state_since: 0,
        }
    }

    fn checked(node: &str, cluster: &str) -> ResultRow {
        ResultRow {
            node_id: node.into(),
            node: node.into(),
            cluster_id: cluster.into(),
            tenant_id: "t1".into(),
            level: "quick".into(),
            verdict: "passed".into(),
            finished_at: 1_700_000_000,
            ..Default::default()
        }
    }

    fn text(s: &Snapshot, live: &HashMap<String, Live>) -> String {
        gpufleet_process::metrics_endpoint::encode(gauges(s, live, false)).unwrap()
    }

    #[test]
    fn gpus_show_only_live_readings_and_checks_only_nodes_still_in_the_cluster() {
        let snapshot = Snapshot {
            now: 0,
            tenant_id: "t1".into(),
            tenant_name: "team".into(),
            clusters: vec![cluster("c1")],
            // n1 is in the cluster with a live agent, n2 in it without; n3 was checked in
            // the cluster and has left it (it may be another team's now).
            nodes: vec![node("n1", "c1"), node("n2", "c1")],
            slices: HashMap::new(),
            checks: [(
                "c1".to_string(),
                vec![checked("n1", "c1"), checked("n3", "c1")],
            )]
            .into_iter()
            .collect(),
            quotas: Vec::new(),
            holdings: BTreeMap::new(),
            gpus_per_node: BTreeMap::new(),
            jobs: BTreeMap::new(),
            usage_held: Vec::new(),
            usage_used: Vec::new(),
        };
        let reading = GpuReading {
            index: 0,
            uuid: "GPU-1".into(),
            utilization_percent: None,
            memory_mib: Some((1, 2)),
            temperature_c: Some(40),
            power_mw: Some(70_000),
            ecc_uncorrected: Some(0),
            xids_total: 3,
        };
        let live: HashMap<String, Live> = [(
            "n1".to_string(),
            Live {
                heartbeat_age: Some(1.0),
                gpus: vec![reading],
            },
        )]
        .into_iter()
        .collect();
        let t = text(&snapshot, &live);
        let gpu =
            r#"cluster_id="c1",gpu="0",gpu_type="H100-80GB",node="n1",tenant_id="t1",uuid="GPU-1""#;
        assert!(
            t.contains(&format!(
                "gpufleet_cluster_gpu_temperature_celsius{{{gpu}}} 40"
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!("gpufleet_cluster_gpu_power_watts{{{gpu}}} 70")),
            "{t}"
        );
        assert!(
            t.contains(&format!("gpufleet_cluster_gpu_xids_total{{{gpu}}} 3")),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "gpufleet_cluster_gpu_memory_used_bytes{{{gpu}}} 1048576"
            )),
            "{t}"
        );
        // Not read is absent, never 0; a node without a live agent has no GPU series.
        assert!(
            !t.contains("gpufleet_cluster_gpu_utilization_percent{"),
            "{t}"
        );
        assert!(
            !t.lines()
                .any(|l| l.starts_with("gpufleet_cluster_gpu_") && l.contains(r#"node="n2""#)),
            "{t}"
        );
        assert!(
            t.contains(r#"gpufleet_cluster_nodes{cluster_id="c1",state="ready",tenant_id="t1"} 2"#),
            "{t}"
        );
        assert!(t.contains(r#"gpufleet_cluster_node_check_passed{cluster_id="c1",level="quick",node="n1",tenant_id="t1"} 1"#), "{t}");
        assert!(
            !t.contains(r#"node="n3""#),
            "a node that left shows nothing: {t}"
        );
        // Every series is the tenant's.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains(r#"tenant_id="t1""#), "{line}");
        }
    }

    /// The usage counters of a team's view are its own: another team's held and used
    /// series are absent from it, though the store holds them.
    #[test]
    fn a_team_sees_its_own_usage_counters_only() {
        let dir = tempfile::tempdir().unwrap();
        let conn = store::open(&dir.path().join("state.db")).unwrap();
        conn.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('a', 'team-a', '', '{}', 'ha', 0), ('b', 'team-b', '', '{}', 'hb', 0);",
        )
        .unwrap();
        for (id, tenant) in [("a1", "a"), ("b1", "b")] {
            conn.execute(
                "INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                       storage_gib, status, endpoint, credentials, storage_path,
                                       mig_layout)
                 VALUES (?1, ?2, ?1, 'kubernetes', 'H100-80GB', 1, 1, 'running', '', '', '', '{}')",
                [id, tenant],
            )
            .unwrap();
            let node = format!("n-{id}");
            conn.execute(
                "INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                    cuda_version, state)
                 VALUES (?1, ?1, 'H100-80GB', 'pool', 8, '550', '12.4', 'ready')",
                [&node],
            )
            .unwrap();
            assert!(store::nodes::assign(&conn, &node, id, 1_000).unwrap());
            let busy = store::usage::Reading {
                t: 1_010,
                reported: 8,
                busy_percent: 800,
            };
            store::usage::record_used(&conn, &node, &[busy], 30).unwrap();
        }
        let snapshot = read(&conn, "a", 1_100).unwrap().unwrap();
        let t = text(&snapshot, &HashMap::new());
        let mine = r#"{class="burst",gpu_type="H100-80GB",mig_profile="none",tenant_id="a"}"#;
        for line in [
            format!("gpufleet_gpu_seconds_total{mine} 800"),
            format!("gpufleet_gpu_seconds_used_total{mine} 80"),
            format!("gpufleet_gpu_seconds_measured_total{mine} 80"),
        ] {
            assert!(t.lines().any(|l| l == line), "{line} in\n{t}");
        }
        assert!(!t.contains(r#"tenant_id="b""#), "{t}");
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains(r#"tenant_id="a""#), "{line}");
        }
    }
}
