//! Plan-time checks that ask the backend about capacity and quota, shared by the
//! resources that take nodes (reservations and clusters). Each refusal names the
//! attribute and the numbers.

use gpufleet_proto::v1 as api;

use super::common::answered;
use crate::client::Client;
use crate::framework::{AttrPath, Diagnostic, Diagnostics};
use crate::times;

/// The tenant's usage of `gpu_type`; None when the tenant does not exist yet (it may be
/// created by the same apply, which then checks for real).
pub(crate) async fn quota_usage(
    client: &Client,
    tenant: &str,
    gpu_type: &str,
) -> Result<Option<api::QuotaUsage>, Diagnostics> {
    let request = api::QuotaUsageRequest {
        tenant_id: tenant.to_string(),
        gpu_type: gpu_type.to_string(),
    };
    match client.quotas().get_quota_usage(request).await {
        Ok(r) => Ok(Some(r.into_inner())),
        Err(s) if super::common::tenant_not_found(&s) => Ok(None),
        Err(s) => Err(client.diagnostic(&s).into()),
    }
}

/// Adds the refusal on `node_count` when `nodes` whole nodes of `model` need more GPUs
/// than the tenant's quota surely leaves.
pub(crate) async fn check_quota(
    client: &Client,
    tenant: &str,
    model: &api::GpuType,
    nodes: i64,
    diags: &mut Diagnostics,
) -> Result<(), Diagnostics> {
    let Some(usage) = quota_usage(client, tenant, &model.name).await? else {
        return Ok(());
    };
    let gpus = nodes * i64::from(model.gpus_per_node);
    if let Some(d) = quota_error(gpus, &model.name, &usage, "node_count") {
        diags.push(d);
    }
    Ok(())
}

/// Free pool and on-demand nodes of `gpu_type` for the whole of `[from, to)`.
pub(crate) async fn availability(
    client: &Client,
    gpu_type: &str,
    from: i64,
    to: i64,
) -> Result<api::Availability, Diagnostics> {
    let request = api::AvailabilityRequest {
        gpu_type: gpu_type.to_string(),
        start_time: Some(times::to_proto(from)),
        end_time: Some(times::to_proto(to)),
    };
    answered(client, client.fleet().get_availability(request).await)
}

/// Adds the refusal on `node_count` when a cluster outside any reservation needs more pool
/// nodes than the pool keeps free from now on (such clusters hold their nodes open-ended and
/// never take on-demand ones).
pub(crate) async fn check_pool(
    client: &Client,
    gpu_type: &str,
    nodes: i64,
    diags: &mut Diagnostics,
) -> Result<(), Diagnostics> {
    let request = api::AvailabilityRequest {
        gpu_type: gpu_type.to_string(),
        start_time: None,
        end_time: None,
    };
    let free = answered(client, client.fleet().get_availability(request).await)?;
    if let Some(d) = pool_error(nodes, gpu_type, free.free_pool_nodes) {
        diags.push(d);
    }
    Ok(())
}

fn pool_error(needed: i64, gpu_type: &str, free_pool_nodes: i64) -> Option<Diagnostic> {
    (needed > free_pool_nodes).then(|| {
        Diagnostic::error_at(
            AttrPath::attr("node_count"),
            format!(
                "node_count: needs {needed} more {gpu_type} pool nodes from now on, the pool has {free_pool_nodes} free"
            ),
            "Other clusters and reservations hold the rest. Draw the nodes from a reservation with allow_on_demand = true (reservation_id), or ask for fewer.",
        )
    })
}

/// The refusal when the pool (plus on-demand capacity, if allowed) is short in a window.
pub(crate) fn capacity_error(
    needed: i64,
    gpu_type: &str,
    window: (i64, i64),
    free: &api::Availability,
    allow_on_demand: bool,
) -> Option<Diagnostic> {
    let usable = free.free_pool_nodes
        + if allow_on_demand {
            free.free_on_demand_nodes
        } else {
            0
        };
    if usable >= needed {
        return None;
    }
    let hint = if !allow_on_demand && free.free_pool_nodes + free.free_on_demand_nodes >= needed {
        " (set allow_on_demand = true to take the rest from on-demand capacity)"
    } else {
        ""
    };
    Some(Diagnostic::error_at(
        AttrPath::attr("node_count"),
        format!(
            "node_count: needs {needed} {gpu_type} nodes from {} to {}, {} free in the pool and {} on demand{hint}",
            times::canonical(window.0),
            times::canonical(window.1),
            free.free_pool_nodes,
            free.free_on_demand_nodes,
        ),
        "See the gpufleet_availability data source for what a window has free.",
    ))
}

/// The refusal when a tenant's quota surely cannot cover `gpus` more GPUs: even ignoring
/// other reservations, the limit minus what clusters use is smaller.
pub(crate) fn quota_error(
    gpus: i64,
    gpu_type: &str,
    usage: &api::QuotaUsage,
    path: &str,
) -> Option<Diagnostic> {
    // No quota at all: perhaps this same plan creates it; the backend decides at apply.
    if usage.gpus + usage.burst_gpus == 0 {
        return None;
    }
    let leaves = (usage.gpus + usage.burst_gpus - usage.used).max(0);
    (gpus > leaves).then(|| {
        Diagnostic::error_at(
            AttrPath::attr(path),
            format!("{path}: needs {gpus} {gpu_type} GPUs, quota leaves {leaves}"),
            format!(
                "The tenant's {gpu_type} quota is {} guaranteed + {} burst, and its clusters use {}. If this configuration also raises the quota, apply that change first.",
                usage.gpus, usage.burst_gpus, usage.used
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn capacity_message_has_the_numbers() {
        let free = api::Availability {
            gpu_type: "H100-80GB".into(),
            free_pool_nodes: 2,
            free_on_demand_nodes: 0,
        };
        let d = capacity_error(4, "H100-80GB", (NOW, NOW + 3600), &free, false).unwrap();
        assert_eq!(
            d.summary,
            "node_count: needs 4 H100-80GB nodes from 2027-01-15T08:00:00Z to 2027-01-15T09:00:00Z, 2 free in the pool and 0 on demand"
        );
        let free = api::Availability {
            free_on_demand_nodes: 2,
            ..free
        };
        assert!(capacity_error(4, "H100-80GB", (NOW, NOW + 1), &free, true).is_none());
        assert!(capacity_error(4, "H100-80GB", (NOW, NOW + 1), &free, false)
            .unwrap()
            .summary
            .ends_with("(set allow_on_demand = true to take the rest from on-demand capacity)"));
    }

    #[test]
    fn pool_message_has_the_numbers() {
        let d = pool_error(3, "A100-80GB", 2).unwrap();
        assert_eq!(
            d.summary,
            "node_count: needs 3 more A100-80GB pool nodes from now on, the pool has 2 free"
        );
        assert!(pool_error(2, "A100-80GB", 2).is_none());
    }

    #[test]
    fn quota_message_has_the_numbers() {
        let usage = api::QuotaUsage {
            gpus: 16,
            burst_gpus: 8,
            used: 8,
            ..Default::default()
        };
        let d = quota_error(24, "H100-80GB", &usage, "node_count").unwrap();
        assert_eq!(
            d.summary,
            "node_count: needs 24 H100-80GB GPUs, quota leaves 16"
        );
        assert!(quota_error(16, "H100-80GB", &usage, "node_count").is_none());
        let no_quota = api::QuotaUsage::default();
        assert!(quota_error(16, "H100-80GB", &no_quota, "node_count").is_none());
    }
}
