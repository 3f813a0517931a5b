//! Everything the checks read, loaded from one read transaction of the store, so that
//! they judge one committed state even while `serve` writes.

use std::collections::BTreeMap;

use gpufleet_sql::Database;

use crate::store::invariants::{
    self as reads, ClusterHeld, Log, Membership, ModelCapacity, QuotaLimit, ReservationHeld,
    Sequenced, UsageHeld,
};

/// The store as of one instant, and the time the checks look from (`now`: instants
/// before it are history, which admission no longer answers for).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub now: i64,
    /// Sorted by id (the store reads them so), as are `clusters`.
    pub reservations: Vec<ReservationHeld>,
    pub clusters: Vec<ClusterHeld>,
    pub models: Vec<ModelCapacity>,
    pub quotas: Vec<QuotaLimit>,
    pub tenant_names: BTreeMap<String, String>,
    pub memberships: Vec<Membership>,
    /// Every node with the GPUs its open usage intervals count.
    pub usage: Vec<UsageHeld>,
    pub events: Vec<(String, Sequenced)>,
    pub audit: Vec<(String, Sequenced)>,
    /// Per tenant, the fleet-wide seq at or below which the event log's per-object
    /// pruning may have removed its events.
    pub event_prune_horizons: BTreeMap<String, i64>,
    /// The object each remembered create made: (kind, tenant id, request_id) -> id.
    pub request_ids: BTreeMap<(String, String, String), String>,
}

impl Snapshot {
    /// Reads the store in one read transaction of `db` (one committed state).
    pub fn load(db: &mut Database, now: i64) -> gpufleet_sql::Result<Snapshot> {
        db.read(|c| {
            Ok(Snapshot {
                now,
                reservations: reads::reservations(c)?,
                clusters: reads::clusters(c)?,
                models: reads::models(c)?,
                quotas: reads::quotas(c)?,
                tenant_names: reads::tenant_names(c)?.into_iter().collect(),
                memberships: reads::memberships(c)?,
                usage: reads::usage_held(c)?,
                events: reads::tenant_entries(c, Log::Events)?,
                audit: reads::tenant_entries(c, Log::Audit)?,
                event_prune_horizons: reads::event_prune_horizons(c)?.into_iter().collect(),
                request_ids: reads::request_ids(c)?
                    .into_iter()
                    .map(|(kind, scope, request_id, id)| ((kind, scope, request_id), id))
                    .collect(),
            })
        })
    }

    /// The reservation `id`.
    pub fn reservation(&self, id: &str) -> Option<&ReservationHeld> {
        let at = self
            .reservations
            .binary_search_by(|r| r.id.as_str().cmp(id));
        at.ok().map(|i| &self.reservations[i])
    }

    /// The cluster `id`.
    pub fn cluster(&self, id: &str) -> Option<&ClusterHeld> {
        let at = self.clusters.binary_search_by(|c| c.id.as_str().cmp(id));
        at.ok().map(|i| &self.clusters[i])
    }

    /// "'name' (id)" of a tenant, or its id alone when it has no row.
    pub fn tenant(&self, id: &str) -> String {
        match self.tenant_names.get(id) {
            Some(name) => format!("'{name}' ({id})"),
            None => id.to_string(),
        }
    }

    /// The instant a cluster's nodes count from: its reservation's end while that
    /// reservation still runs (the reservation holds them until then), else now.
    pub fn cluster_from(&self, c: &ClusterHeld) -> i64 {
        c.reservation_end
            .filter(|&end| end > self.now)
            .unwrap_or(self.now)
    }
}
