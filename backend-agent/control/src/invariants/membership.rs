//! No node in two clusters, and no cluster holding what is not its own. A node's cluster
//! is one column, so a node names one cluster at most; what is checked is that the
//! cluster it names exists and is of its model, and that the clusters drawing from a
//! reservation that still runs hold no more nodes than it has (else two tenants' promises
//! share nodes), and draw only from a reservation of their own tenant and model.

use std::collections::BTreeMap;

use super::snapshot::Snapshot;
use super::violation::{Concern, Violation};

pub fn check(s: &Snapshot) -> Vec<Violation> {
    let mut out = Vec::new();
    for m in &s.memberships {
        match &m.cluster_gpu_type {
            None => out.push(Violation::new(
                Concern::Membership,
                format!(
                    "node {} ({}) is assigned to cluster {}, which does not exist",
                    m.node_id, m.hostname, m.cluster_id
                ),
            )),
            Some(model) if *model != m.node_gpu_type => out.push(Violation::new(
                Concern::Membership,
                format!(
                    "node {} ({}) is a {} node in cluster {} of {model}",
                    m.node_id, m.hostname, m.node_gpu_type, m.cluster_id
                ),
            )),
            Some(_) => {}
        }
    }
    // Nodes the clusters of each reservation hold, and which clusters.
    let mut drawn: BTreeMap<&str, (i64, Vec<String>)> = BTreeMap::new();
    for c in &s.clusters {
        let Some(rid) = c.reservation_id.as_deref() else {
            continue;
        };
        let Some(r) = s.reservation(rid) else {
            out.push(Violation::new(
                Concern::Membership,
                format!(
                    "cluster {} draws from reservation {rid}, which does not exist",
                    c.id
                ),
            ));
            continue;
        };
        if r.tenant_id != c.tenant_id || r.gpu_type != c.gpu_type {
            out.push(Violation::new(
                Concern::Membership,
                format!(
                    "cluster {} of tenant {} and {} draws from reservation {rid} of tenant {} and {}",
                    c.id,
                    s.tenant(&c.tenant_id),
                    c.gpu_type,
                    s.tenant(&r.tenant_id),
                    r.gpu_type
                ),
            ));
        }
        let entry = drawn.entry(rid).or_default();
        entry.0 += c.pool + c.on_demand;
        entry
            .1
            .push(format!("cluster {} ({})", c.id, c.pool + c.on_demand));
    }
    for r in s.reservations.iter().filter(|r| r.end_time > s.now) {
        if let Some((nodes, clusters)) = drawn.get(r.id.as_str()) {
            if *nodes > r.node_count {
                out.push(Violation::new(
                    Concern::Membership,
                    format!(
                        "reservation {} has {} nodes, its clusters hold {nodes} ({})",
                        r.id,
                        r.node_count,
                        clusters.join(", ")
                    ),
                ));
            }
        }
    }
    out
}
