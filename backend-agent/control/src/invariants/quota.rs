//! No tenant holds more GPUs of a model than its quota allows (guaranteed + burst) at any
//! instant from now on, and none of a model it has no quota for. Reservations hold
//! node_count nodes over their window; clusters their nodes from their reservation's end
//! or from now; a node has as many GPUs as the model's largest (as admission counts).

use std::collections::BTreeSet;

use super::snapshot::Snapshot;
use super::timeline::{holders_at, peak, Held};
use super::violation::{Concern, Violation};
use crate::clock::rfc3339;

/// Holders named in a message at most.
const NAMED: usize = 10;

pub fn check(s: &Snapshot) -> Vec<Violation> {
    let mut subjects: BTreeSet<(&str, &str)> = BTreeSet::new();
    subjects.extend(
        s.reservations
            .iter()
            .map(|r| (r.tenant_id.as_str(), r.gpu_type.as_str())),
    );
    subjects.extend(
        s.clusters
            .iter()
            .map(|c| (c.tenant_id.as_str(), c.gpu_type.as_str())),
    );
    let mut out = Vec::new();
    for (tenant, model) in subjects {
        let gpus_per_node = s
            .models
            .iter()
            .find(|m| m.gpu_type == model)
            .map_or(0, |m| m.gpus_per_node);
        let held = demand(s, tenant, model, gpus_per_node);
        let worst = peak(&held, s.now);
        let quota = s
            .quotas
            .iter()
            .find(|q| q.tenant_id == tenant && q.gpu_type == model);
        let (limit, limit_text) = match quota {
            Some(q) => (
                q.gpus.saturating_add(q.burst_gpus),
                format!(
                    "its quota {} ({} guaranteed + {} burst)",
                    q.gpus.saturating_add(q.burst_gpus),
                    q.gpus,
                    q.burst_gpus
                ),
            ),
            None => (0, "it has no quota for it".to_string()),
        };
        if worst.total > limit {
            out.push(Violation::new(
                Concern::Quota,
                format!(
                    "tenant {} holds {} {model} GPUs at {} ({}), {limit_text}",
                    s.tenant(tenant),
                    worst.total,
                    rfc3339(worst.at),
                    holders_at(&held, worst.at, NAMED)
                ),
            ));
        }
    }
    out
}

/// `tenant`'s GPUs of `model` held over time.
fn demand(s: &Snapshot, tenant: &str, model: &str, gpus_per_node: i64) -> Vec<Held> {
    let mut held = Vec::new();
    for r in s
        .reservations
        .iter()
        .filter(|r| r.tenant_id == tenant && r.gpu_type == model && r.end_time > s.now)
    {
        let gpus = r.node_count * gpus_per_node;
        held.push(Held {
            start: r.start_time,
            end: Some(r.end_time),
            amount: gpus,
            holder: format!("reservation {} ({gpus})", r.id),
        });
    }
    for c in s
        .clusters
        .iter()
        .filter(|c| c.tenant_id == tenant && c.gpu_type == model)
    {
        let gpus = (c.pool + c.on_demand) * gpus_per_node;
        held.push(Held {
            start: s.cluster_from(c),
            end: None,
            amount: gpus,
            holder: format!("cluster {} ({gpus})", c.id),
        });
    }
    held
}
