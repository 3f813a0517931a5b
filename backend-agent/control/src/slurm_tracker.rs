//! What the control plane knows of its Slurm clusters between requests, kept in its state
//! (`AppState::slurm`): what each cluster was last brought to (so that the supervisor of
//! `slurm_clusters` brings a cluster to its nodes once after a start, and again only when
//! what it should run changes), why its last acceptance probe found it unusable, one
//! bring-up at a time per cluster, and whether node agents are external (the clusters'
//! nodes are other hosts). Memory only: a start of the
//! control plane brings every cluster to its nodes again, which leaves running daemons
//! that run the same configuration alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Tracker {
    external_nodes: bool,
    clusters: Mutex<HashMap<String, Arc<Tracked>>>,
}

/// One cluster's.
#[derive(Default)]
pub struct Tracked {
    /// Held for a bring-up.
    pub bring_up: tokio::sync::Mutex<()>,
    /// The last bring-up's fingerprint once it succeeded.
    applied: Mutex<Option<String>>,
    /// Why the cluster is not usable, as its last acceptance probe found, and when it ran
    /// (None: it passed, or none ran since this control plane started).
    unaccepted: Mutex<Option<(String, std::time::Instant)>>,
}

impl Tracker {
    /// For a control plane whose node agents are external (`serve --node-agents external`).
    pub fn new(external_nodes: bool) -> Tracker {
        Tracker {
            external_nodes,
            ..Tracker::default()
        }
    }

    pub fn external_nodes(&self) -> bool {
        self.external_nodes
    }

    pub fn of(&self, cluster_id: &str) -> Arc<Tracked> {
        let mut all = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
        all.entry(cluster_id.to_string()).or_default().clone()
    }

    pub fn forget(&self, cluster_id: &str) {
        let mut all = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
        all.remove(cluster_id);
    }
}

impl Tracked {
    pub fn applied(&self) -> Option<String> {
        self.applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_applied(&self, fingerprint: Option<String>) {
        *self.applied.lock().unwrap_or_else(|p| p.into_inner()) = fingerprint;
    }

    pub fn unaccepted(&self) -> Option<(String, std::time::Instant)> {
        self.unaccepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_unaccepted(&self, why: Option<String>) {
        *self.unaccepted.lock().unwrap_or_else(|p| p.into_inner()) =
            why.map(|w| (w, std::time::Instant::now()));
    }
}
