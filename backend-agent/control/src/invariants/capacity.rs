//! No instant from now on at which a GPU model's pool or on-demand nodes are held beyond
//! the nodes the fleet has in service. Reservations hold theirs over their window; a
//! cluster holds its nodes from its reservation's end (while that runs, the reservation
//! holds them) or from now, for ever. A preemptible cluster's pool nodes are left out:
//! it gives them back when a reservation's window needs them (admission counts them the
//! same way).

use std::collections::BTreeSet;

use super::snapshot::Snapshot;
use super::timeline::{holders_at, peak, Held};
use super::violation::{Concern, Violation};
use crate::clock::rfc3339;

/// Holders named in a message at most.
const NAMED: usize = 10;

pub fn check(s: &Snapshot) -> Vec<Violation> {
    let mut models: BTreeSet<&str> = s.models.iter().map(|m| m.gpu_type.as_str()).collect();
    models.extend(s.reservations.iter().map(|r| r.gpu_type.as_str()));
    models.extend(s.clusters.iter().map(|c| c.gpu_type.as_str()));
    let mut out = Vec::new();
    for model in models {
        let (pool, on_demand) = s
            .models
            .iter()
            .find(|m| m.gpu_type == model)
            .map_or((0, 0), |m| (m.pool_nodes, m.on_demand_nodes));
        let (pool_held, on_demand_held) = held(s, model);
        for (kind, nodes, held) in [
            ("pool", pool, pool_held),
            ("on-demand", on_demand, on_demand_held),
        ] {
            let worst = peak(&held, s.now);
            if worst.total > nodes {
                out.push(Violation::new(
                    Concern::Capacity,
                    format!(
                        "{model} {kind} overbooked at {}: {} nodes held ({}), the fleet has {nodes} in service",
                        rfc3339(worst.at),
                        worst.total,
                        holders_at(&held, worst.at, NAMED)
                    ),
                ));
            }
        }
    }
    out
}

/// The pool and on-demand nodes of `model` held over time.
fn held(s: &Snapshot, model: &str) -> (Vec<Held>, Vec<Held>) {
    let (mut pool, mut on_demand) = (Vec::new(), Vec::new());
    for r in s
        .reservations
        .iter()
        .filter(|r| r.gpu_type == model && r.end_time > s.now)
    {
        let span = |amount: i64| Held {
            start: r.start_time,
            end: Some(r.end_time),
            amount,
            holder: format!("reservation {} ({amount})", r.id),
        };
        pool.push(span(r.pool_nodes));
        on_demand.push(span(r.on_demand_nodes));
    }
    for c in s.clusters.iter().filter(|c| c.gpu_type == model) {
        let span = |amount: i64| Held {
            start: s.cluster_from(c),
            end: None,
            amount,
            holder: format!("cluster {} ({amount})", c.id),
        };
        if !c.preemptible {
            pool.push(span(c.pool));
        }
        on_demand.push(span(c.on_demand));
    }
    (pool, on_demand)
}
