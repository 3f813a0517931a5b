//! A node agent's metrics, read at each scrape: per GPU (labels `node`, `gpu` = index,
//! `uuid`, `model`) what its backend reports — utilisation and memory in use (where it can
//! read them), temperature, power, uncorrected ECC errors, remapped rows, whether it is
//! healthy — and the agent's orders queued or running, plus the orders it has answered
//! since it started.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use gpufleet_gpu::hardware::{GpuBackend, RowRemap};
use prometheus::{IntCounterVec, Opts, Registry};

/// Each agent's current session's order queue (an agent has one session at a time).
static QUEUES: LazyLock<Mutex<HashMap<String, Weak<AtomicU32>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

struct Counters {
    registry: Registry,
    orders: IntCounterVec,
}

static COUNTERS: LazyLock<Counters> = LazyLock::new(|| {
    let registry = Registry::new();
    let orders = IntCounterVec::new(
        Opts::new(
            "gpufleet_node_orders_total",
            "Work orders this agent answered, by node, kind and outcome (ok, failed).",
        ),
        &["node", "kind", "outcome"],
    )
    .expect("a valid counter");
    registry
        .register(Box::new(orders.clone()))
        .expect("registered once");
    Counters { registry, orders }
});

/// Makes `queued` the order queue the metrics of agent `node` report (while it lives).
pub fn watch_queue(node: &str, queued: &Arc<AtomicU32>) {
    let mut queues = QUEUES.lock().unwrap_or_else(|p| p.into_inner());
    queues.insert(node.to_string(), Arc::downgrade(queued));
}

/// The `kind` label of a work order.
pub fn order_kind(order: &gpufleet_proto::v1::WorkOrder) -> &'static str {
    use gpufleet_proto::v1::work_order::Kind;
    match order.kind {
        Some(Kind::ApplyMigLayout(_)) => gpufleet_wire::order_kind::MIG_LAYOUT,
        Some(Kind::InstallDriver(_)) => gpufleet_wire::order_kind::DRIVER,
        Some(Kind::RunHealthCheck(_)) => "health_check",
        Some(Kind::StartSlurmd(_)) => "start_slurmd",
        Some(Kind::StopSlurmd(_)) => "stop_slurmd",
        Some(Kind::SlurmQuery(_)) => "slurm_query",
        Some(Kind::SetVolumes(_)) => "set_volumes",
        None => "none",
    }
}

/// Counts an order agent `node` answered.
pub fn order_answered(node: &str, kind: &str, ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    COUNTERS
        .orders
        .with_label_values(&[node, kind, outcome])
        .inc();
}

/// The agent's metrics as Prometheus text; the hardware is read on a blocking thread.
pub async fn render(node: String, backend: Arc<dyn GpuBackend>) -> Result<String, String> {
    let families = tokio::task::spawn_blocking(move || gauges(&node, &*backend))
        .await
        .map_err(|e| format!("the metrics read failed: {e}"))??;
    let mut all = COUNTERS.registry.gather();
    all.extend(families);
    gpufleet_process::metrics_endpoint::encode(all)
}

fn gauges(
    node: &str,
    backend: &dyn GpuBackend,
) -> Result<Vec<prometheus::proto::MetricFamily>, String> {
    let registry = Registry::new();
    let gpu_labels = &["node", "gpu", "uuid", "model"];
    let temperature = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_temperature_celsius",
        "GPU temperature as the backend reports it.",
        gpu_labels,
    );
    let power = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_power_watts",
        "GPU power draw as the backend reports it.",
        gpu_labels,
    );
    let ecc = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_ecc_uncorrected_errors",
        "Uncorrected ECC errors since the GPU's driver was loaded (NVML's volatile counter).",
        gpu_labels,
    );
    let remapped = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_remapped_rows",
        "Memory rows remapped, by kind (correctable, uncorrectable); absent where the GPU does not report them (e.g. under MIG).",
        &["node", "gpu", "uuid", "model", "kind"],
    );
    let healthy = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_healthy",
        "1 when the GPU's health check finds nothing that makes it unfit for work, else 0.",
        gpu_labels,
    );
    let mig = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_mig_instances",
        "MIG instances on the GPU (0 with MIG off).",
        gpu_labels,
    );
    let utilization = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_utilization_percent",
        "Percent of the last sample period the GPU was busy (absent where the backend cannot read it, e.g. NVML under MIG).",
        gpu_labels,
    );
    let memory_used = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_gpu_memory_used_bytes",
        "GPU memory in use.",
        gpu_labels,
    );
    let queue = gpufleet_process::metrics_endpoint::gauge_vec(
        &registry,
        "gpufleet_node_orders_queued",
        "Work orders the agent has received and not yet answered (the one running included).",
        &["node"],
    );
    let queued = {
        let queues = QUEUES.lock().unwrap_or_else(|p| p.into_inner());
        queues
            .get(node)
            .and_then(Weak::upgrade)
            .map(|q| q.load(Ordering::Relaxed))
            .unwrap_or(0)
    };
    queue.with_label_values(&[node]).set(f64::from(queued));
    let gpus = backend
        .gpus()
        .map_err(|e| format!("reading the GPUs: {e}"))?;
    for g in &gpus {
        let index = g.index.to_string();
        let labels = [node, index.as_str(), g.uuid.as_str(), g.model.as_str()];
        mig.with_label_values(&labels).set(g.instances.len() as f64);
        if let Ok(u) = backend.usage(g.index) {
            if let Some(p) = u.utilization_percent {
                utilization.with_label_values(&labels).set(f64::from(p));
            }
            memory_used
                .with_label_values(&labels)
                .set(u.memory_used_mib as f64 * 1024.0 * 1024.0);
        }
        let h = match backend.health(g.index) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(gpu = g.index, error = %e, "metrics: cannot read the GPU's health");
                continue;
            }
        };
        healthy
            .with_label_values(&labels)
            .set(if h.healthy { 1.0 } else { 0.0 });
        if let Some(t) = h.temperature_c {
            temperature.with_label_values(&labels).set(f64::from(t));
        }
        if let Some(mw) = h.power_mw {
            power.with_label_values(&labels).set(f64::from(mw) / 1000.0);
        }
        if let Some(n) = h.ecc_uncorrected {
            ecc.with_label_values(&labels).set(n as f64);
        }
        if let RowRemap::Counts {
            correctable,
            uncorrectable,
            ..
        } = h.remapped_rows
        {
            for (kind, n) in [
                ("correctable", correctable),
                ("uncorrectable", uncorrectable),
            ] {
                let l = [labels[0], labels[1], labels[2], labels[3], kind];
                remapped.with_label_values(&l).set(f64::from(n));
            }
        }
    }
    Ok(registry.gather())
}
