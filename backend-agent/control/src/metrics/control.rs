//! The control plane's metrics at each scrape: the counters of `crate::counters`, and
//! gauges computed from the store: `gpufleet_gpus{gpu_type,state}`,
//! `gpufleet_mig_slices{gpu_type,profile,state}`,
//! `gpufleet_tenant_gpus{tenant_id,gpu_type,kind}` (and `tenant`, the name, only when the
//! operator asks for names: `serve --metrics-tenant-names`),
//! `gpufleet_reservations{state}`, `gpufleet_nodes{state}`, `gpufleet_clusters{status}` and
//! `gpufleet_node_heartbeat_age_seconds{node}`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpufleet_sql::AsConn;
use prometheus::Registry;

use crate::rules::{peak, Span};
use crate::scheduling::{holdings, Exclude, Holding};
use crate::state::AppState;
use crate::store::{
    self,
    clusters::ClusterRow,
    nodes::{NodeRow, NODE_BUSY, NODE_QUARANTINED, NODE_READY, NODE_UNREACHABLE},
    quotas::QuotaRow,
    reservations::ReservationRow,
    tenants::TenantRow,
};

/// What one scrape reads from the store, in one short read under the state lock.
struct Snapshot {
    now: i64,
    nodes: Vec<NodeRow>,
    tenants: Vec<TenantRow>,
    quotas: Vec<QuotaRow>,
    reservations: Vec<ReservationRow>,
    clusters: Vec<ClusterRow>,
    /// (gpu_type, profile, node id) -> MIG devices.
    slices: Vec<(String, String, String, i64)>,
    /// Per GPU model: who holds its nodes from now on (as quotas see it).
    holdings: BTreeMap<String, Vec<Holding>>,
}

fn read(conn: &impl AsConn, t: i64) -> Result<Snapshot, String> {
    // A fn, not a closure: the store's modules return either engine's error type.
    fn err(e: impl std::fmt::Display) -> String {
        format!("reading the state database: {e}")
    }
    let nodes = store::nodes::list(conn, None, None).map_err(err)?;
    let tenants = store::tenants::list(conn).map_err(err)?;
    let quotas = store::quotas::list(conn, None).map_err(err)?;
    let reservations = store::reservations::list(conn, None, None).map_err(err)?;
    let clusters = store::clusters::list(conn, None, None, None).map_err(err)?;
    let slices: Vec<(String, String, String, i64)> = store::nodes::mig_slices(conn).map_err(err)?;
    let models: BTreeSet<String> = nodes
        .iter()
        .map(|n| n.gpu_type.clone())
        .chain(quotas.iter().map(|q| q.gpu_type.clone()))
        .chain(reservations.iter().map(|r| r.gpu_type.clone()))
        .collect();
    let mut held = BTreeMap::new();
    for model in models {
        let h = holdings(conn, &model, t, Exclude::default())
            .map_err(|e| format!("reading the holdings of {model}: {e}"))?;
        held.insert(model, h);
    }
    Ok(Snapshot {
        now: t,
        nodes,
        tenants,
        quotas,
        reservations,
        clusters,
        slices,
        holdings: held,
    })
}

/// The control plane's metrics as Prometheus text: the store read on a blocking thread,
/// then the registry's heartbeat ages (the two locks are never held together). Tenants
/// are labelled by id, and by name too only with `tenant_names`.
pub async fn render(state: Arc<AppState>, tenant_names: bool) -> Result<String, String> {
    let t = state.now();
    let snapshot = state
        .read(move |conn| read(conn, t).map_err(crate::error::Error::Internal))
        .await
        .map_err(|e| e.to_string())?;
    let ages: Vec<(String, f64)> = snapshot
        .nodes
        .iter()
        .filter_map(|n| {
            state
                .agents
                .heartbeat_age(&n.id)
                .map(|age| (n.hostname.clone(), age.as_secs_f64()))
        })
        .collect();
    let settings = state.breaker.clone();
    let breakers = state
        .read(move |conn| crate::scheduling::breaker::views(conn, &settings, t))
        .await
        .map_err(|e| e.to_string())?;
    let (held, used) = state
        .read(move |conn| -> crate::error::Result<_> {
            Ok((
                store::usage::lifetime(conn, None, t)?,
                store::usage::lifetime_used(conn, None)?,
            ))
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut families = crate::counters::COUNTERS.registry.gather();
    families.extend(gauges(&snapshot, &ages, tenant_names));
    families.extend(super::breaker::gauges(&breakers));
    families.extend(super::usage::families(&held, &used, tenant_names));
    gpufleet_process::metrics_endpoint::encode(families)
}

/// Per (tenant, model): GPUs used by its clusters outside reservations, reserved (the
/// peak of its reservations from `now` on), its guaranteed and its burst quota, as
/// GetQuotaUsage computes them. `holdings` may hold other tenants' too (each is its own);
/// `gpus_per_node` is by model.
pub(super) fn tenant_usage<'a>(
    quotas: &'a [QuotaRow],
    holdings: &'a BTreeMap<String, Vec<Holding>>,
    gpus_per_node: &BTreeMap<String, i64>,
    now: i64,
) -> BTreeMap<(&'a str, &'a str), [i64; 4]> {
    let mut per_tenant: BTreeMap<(&str, &str), [i64; 4]> = BTreeMap::new();
    for q in quotas {
        let e = per_tenant
            .entry((q.tenant_id.as_str(), q.gpu_type.as_str()))
            .or_default();
        e[2] = q.gpus;
        e[3] = q.burst_gpus;
    }
    for (model, held) in holdings {
        let gpn = gpus_per_node.get(model).copied().unwrap_or(0);
        let tenants: BTreeSet<&str> = held.iter().map(|h| h.tenant_id.as_str()).collect();
        for tenant in tenants {
            let mine = held.iter().filter(|h| h.tenant_id == tenant);
            let used: i64 = mine
                .clone()
                .filter(|h| h.unreserved_cluster)
                .map(|h| (h.pool + h.on_demand) * gpn)
                .sum();
            let spans: Vec<Span> = mine
                .filter(|h| h.is_reservation)
                .map(|h| Span {
                    start: h.start,
                    end: h.end,
                    amount: (h.pool + h.on_demand) * gpn,
                })
                .collect();
            let e = per_tenant.entry((tenant, model.as_str())).or_default();
            e[0] = used;
            e[1] = peak(&spans, now, None);
        }
    }
    per_tenant
}

/// The `kind` label of each of [`tenant_usage`]'s values, in order.
pub(super) const TENANT_GPU_KINDS: [&str; 4] =
    ["used", "reserved", "quota_guaranteed", "quota_burst"];

/// GPUs per node of a model (the fleet's nodes of one model all have the same count).
fn gpus_per_node(nodes: &[NodeRow], model: &str) -> i64 {
    nodes
        .iter()
        .filter(|n| n.gpu_type == model)
        .map(|n| n.gpu_count)
        .max()
        .unwrap_or(0)
}

fn gauges(
    s: &Snapshot,
    ages: &[(String, f64)],
    tenant_names: bool,
) -> Vec<prometheus::proto::MetricFamily> {
    let registry = Registry::new();
    let gpus = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_gpus",
        "GPUs of the fleet by model and state: free, reserved (held by a reservation in its window and not yet in a cluster), allocated (in a cluster), quarantined.",
        &["gpu_type", "state"],
    );
    let slices = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_mig_slices",
        "MIG devices on the fleet's GPUs by model, profile and state (free, allocated, quarantined).",
        &["gpu_type", "profile", "state"],
    );
    let tenant_labels: &[&str] = if tenant_names {
        &["tenant_id", "tenant", "gpu_type", "kind"]
    } else {
        &["tenant_id", "gpu_type", "kind"]
    };
    let tenant_gpus = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_tenant_gpus",
        "Per tenant (by id; by name too with serve --metrics-tenant-names) and model: GPUs used by its clusters outside reservations, reserved (peak of its reservations from now on), and its quota (quota_guaranteed, quota_burst).",
        tenant_labels,
    );
    let reservations = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_reservations",
        "Reservations by state: pending (not started), active, ended (still recorded).",
        &["state"],
    );
    let nodes = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_nodes",
        "Nodes by state: ready, busy, unreachable, quarantined.",
        &["state"],
    );
    let clusters = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_clusters",
        "Tenant clusters by status.",
        &["status"],
    );
    let heartbeat = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_heartbeat_age_seconds",
        "Seconds since each node's agent was last heard from (nodes heard from since the control plane started).",
        &["node"],
    );

    // Nodes and GPUs.
    for state in [NODE_READY, NODE_BUSY, NODE_UNREACHABLE, NODE_QUARANTINED] {
        nodes.with_label_values(&[state]).set(0.0);
    }
    let mut by_model: BTreeMap<&str, [i64; 3]> = BTreeMap::new(); // total, allocated, quarantined
    for n in &s.nodes {
        nodes.with_label_values(&[&n.state]).inc();
        let m = by_model.entry(n.gpu_type.as_str()).or_default();
        m[0] += n.gpu_count;
        if n.state == NODE_QUARANTINED {
            m[2] += n.gpu_count;
        } else if n.cluster_id.is_some() {
            m[1] += n.gpu_count;
        }
    }
    // A live reservation holds its nodes; the nodes its clusters already took are allocated.
    let mut drawn: HashMap<&str, i64> = HashMap::new();
    let cluster_reservation: HashMap<&str, &str> = s
        .clusters
        .iter()
        .filter_map(|c| Some((c.id.as_str(), c.reservation_id.as_deref()?)))
        .collect();
    for n in &s.nodes {
        if let Some(r) = n
            .cluster_id
            .as_deref()
            .and_then(|c| cluster_reservation.get(c))
        {
            *drawn.entry(r).or_default() += 1;
        }
    }
    let mut reserved: HashMap<&str, i64> = HashMap::new();
    for (state, count) in [("pending", 0.0), ("active", 0.0), ("ended", 0.0)] {
        reservations.with_label_values(&[state]).set(count);
    }
    for r in &s.reservations {
        let state = if r.start_time > s.now {
            "pending"
        } else if r.end_time > s.now {
            "active"
        } else {
            "ended"
        };
        reservations.with_label_values(&[state]).inc();
        if state == "active" {
            let waiting = (r.node_count - drawn.get(r.id.as_str()).copied().unwrap_or(0)).max(0);
            *reserved.entry(r.gpu_type.as_str()).or_default() +=
                waiting * gpus_per_node(&s.nodes, &r.gpu_type);
        }
    }
    for (model, [total, allocated, quarantined]) in &by_model {
        let rest = (total - allocated - quarantined).max(0);
        let held = reserved.get(model).copied().unwrap_or(0).min(rest);
        for (state, value) in [
            ("free", rest - held),
            ("reserved", held),
            ("allocated", *allocated),
            ("quarantined", *quarantined),
        ] {
            gpus.with_label_values(&[model, state]).set(value as f64);
        }
    }

    // MIG slices: every profile of every model in the fleet, 0 where none exist.
    let node_state: HashMap<&str, &str> = s
        .nodes
        .iter()
        .map(|n| {
            let state = if n.state == NODE_QUARANTINED {
                "quarantined"
            } else if n.cluster_id.is_some() {
                "allocated"
            } else {
                "free"
            };
            (n.id.as_str(), state)
        })
        .collect();
    for model in by_model.keys() {
        if let Some(m) = gpufleet_gpu::catalog::model(model) {
            for p in &m.profiles {
                for state in ["free", "allocated", "quarantined"] {
                    slices.with_label_values(&[model, &p.name, state]).set(0.0);
                }
            }
        }
    }
    for (model, profile, node, count) in &s.slices {
        let state = node_state.get(node.as_str()).copied().unwrap_or("free");
        slices
            .with_label_values(&[model, profile, state])
            .add(*count as f64);
    }

    // Tenants: usage and quota per model, as GetQuotaUsage computes them.
    let names: HashMap<&str, &str> = s
        .tenants
        .iter()
        .map(|t| (t.id.as_str(), t.name.as_str()))
        .collect();
    let gpn: BTreeMap<String, i64> = s
        .holdings
        .keys()
        .map(|m| (m.clone(), gpus_per_node(&s.nodes, m)))
        .collect();
    let per_tenant = tenant_usage(&s.quotas, &s.holdings, &gpn, s.now);
    for ((tenant, model), values) in &per_tenant {
        // Only tenants that exist (a deleted one's holdings are not its any more).
        let Some(name) = names.get(tenant) else {
            continue;
        };
        for (kind, value) in TENANT_GPU_KINDS.iter().zip(values) {
            let series = if tenant_names {
                tenant_gpus.with_label_values(&[tenant, name, model, kind])
            } else {
                tenant_gpus.with_label_values(&[tenant, model, kind])
            };
            series.set(*value as f64);
        }
    }

    for c in &s.clusters {
        clusters.with_label_values(&[&c.status]).inc();
    }
    for (node, age) in ages {
        heartbeat.with_label_values(&[node]).set(*age);
    }
    registry.gather()
}
