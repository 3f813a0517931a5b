//! Everything the checks read, loaded from one read transaction of the store, so that
//! they judge one committed state even while `serve` writes.

use std::collections::BTreeMap;

use rusqlite::Connection;

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
    /// Reads the store in one snapshot (`conn` read-only, outside any transaction).
    pub fn load(conn: &Connection, now: i64) -> rusqlite::Result<Snapshot> {
        reads::snapshot(conn)?;
        let loaded = Snapshot {
            now,
            reservations: reads::reservations(conn)?,
            clusters: reads::clusters(conn)?,
            models: reads::models(conn)?,
            quotas: reads::quotas(conn)?,
            tenant_names: reads::tenant_names(conn)?.into_iter().collect(),
            memberships: reads::memberships(conn)?,
            usage: reads::usage_held(conn)?,
            events: reads::tenant_entries(conn, Log::Events)?,
            audit: reads::tenant_entries(conn, Log::Audit)?,
            event_prune_horizons: reads::event_prune_horizons(conn)?.into_iter().collect(),
            request_ids: reads::request_ids(conn)?
                .into_iter()
                .map(|(kind, scope, request_id, id)| ((kind, scope, request_id), id))
                .collect(),
        };
        conn.execute_batch("COMMIT")?;
        Ok(loaded)
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
