//! What this provider process has learned in the Terraform run it serves (Terraform starts
//! one process per plan or apply, and it serves every resource of that run), for the
//! answers that depend on other resources of the same run:
//!
//! * tenants and quotas this run creates: Terraform plans a resource after those it
//!   refers to, so a cluster whose tenant is `gpufleet_tenant.x.name` is planned after
//!   `x`; a dry run that finds no such tenant (or quota) yet is then no refusal;
//! * objects this run already has in state: the create half of a replacement is planned
//!   while the object it replaces still holds the name, so a name held by one of them is
//!   no refusal either (the apply frees it first);
//! * deletes under way: a tenant delete waits for the deletes of its quotas, clusters and
//!   reservations that run beside it (Terraform runs deletes without a dependency in
//!   parallel) instead of failing for dependents that are about to be gone.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
pub struct ThisRun {
    seen: Mutex<Seen>,
    /// Deletes under way, by the tenant spelling of the object deleted.
    deleting: Mutex<HashMap<String, usize>>,
    /// Deletes that ended.
    ended: AtomicU64,
    /// Told when a delete starts or ends.
    changed: Notify,
}

#[derive(Default)]
struct Seen {
    tenants: HashSet<String>,
    /// (tenant as written, GPU model) of quotas this run creates.
    quotas: HashSet<(String, String)>,
    ids: HashSet<String>,
}

impl ThisRun {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A tenant of this name is planned to be created.
    pub fn creates_tenant(&self, name: &str) {
        self.seen().tenants.insert(name.to_string());
    }

    /// Whether a tenant of this name is planned to be created.
    pub fn tenant_created(&self, name: &str) -> bool {
        self.seen().tenants.contains(name)
    }

    /// A quota of `gpu_type` for `tenant` (as written) is planned to be created.
    pub fn creates_quota(&self, tenant: &str, gpu_type: &str) {
        self.seen()
            .quotas
            .insert((tenant.to_string(), gpu_type.to_string()));
    }

    /// The tenants (as written) of the quotas of `gpu_type` planned to be created.
    pub fn quota_tenants(&self, gpu_type: &str) -> Vec<String> {
        self.seen()
            .quotas
            .iter()
            .filter(|(_, g)| g == gpu_type)
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// An object of this id is in this run's state.
    pub fn has(&self, id: &str) {
        self.seen().ids.insert(id.to_string());
    }

    /// Whether an object of this id is in this run's state.
    pub fn holds(&self, id: &str) -> bool {
        self.seen().ids.contains(id)
    }

    /// Marks a delete of an object of `tenant` (as its state spells it) as under way until
    /// the guard is dropped.
    pub fn deleting(&self, tenant: &str) -> DeleteUnderWay<'_> {
        *self.deletes().entry(tenant.to_string()).or_default() += 1;
        self.changed.notify_waiters();
        DeleteUnderWay {
            run: self,
            tenant: tenant.to_string(),
        }
    }

    fn deletes(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.deleting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits while deletes of objects of a tenant spelled one of `spellings` are under way;
    /// when none is, waits up to `grace` for one to start (Terraform starts the deletes
    /// that do not depend on each other together, but not in one instant). True when at
    /// least one of them ended meanwhile: the tenant delete is worth another try.
    pub async fn dependents_deleted(&self, spellings: &[&str], grace: Duration) -> bool {
        let ended_before = self.ended.load(Ordering::SeqCst);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let busy = {
                let deletes = self.deletes();
                spellings
                    .iter()
                    .any(|s| deletes.get(*s).is_some_and(|n| *n > 0))
            };
            if busy {
                notified.await;
                continue;
            }
            if self.ended.load(Ordering::SeqCst) != ended_before {
                return true;
            }
            if tokio::time::timeout(grace, notified).await.is_err() {
                return false;
            }
        }
    }
}

/// A delete under way (see [`ThisRun::deleting`]).
pub struct DeleteUnderWay<'a> {
    run: &'a ThisRun,
    tenant: String,
}

impl Drop for DeleteUnderWay<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.run.deletes().get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
        }
        self.run.ended.fetch_add(1, Ordering::SeqCst);
        self.run.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_tenant_delete_waits_for_the_deletes_of_its_dependents() {
        let run = Arc::new(ThisRun::default());
        let grace = Duration::from_millis(50);
        assert!(
            !run.dependents_deleted(&["team"], grace).await,
            "none began"
        );
        let guard = run.deleting("team");
        let other = run.clone();
        let waiter =
            tokio::spawn(async move { other.dependents_deleted(&["id-1", "team"], grace).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(guard);
        assert!(waiter.await.unwrap(), "one ended");
    }

    #[tokio::test]
    async fn a_delete_that_begins_within_the_grace_is_waited_for() {
        let run = Arc::new(ThisRun::default());
        let other = run.clone();
        let waiter = tokio::spawn(async move {
            other
                .dependents_deleted(&["team"], Duration::from_secs(30))
                .await
        });
        tokio::task::yield_now().await;
        let guard = run.deleting("team");
        drop(guard);
        assert!(waiter.await.unwrap());
    }

    #[test]
    fn quotas_are_found_by_model() {
        let run = ThisRun::default();
        run.creates_quota("team", "H100-80GB");
        assert_eq!(run.quota_tenants("H100-80GB"), vec!["team".to_string()]);
        assert!(run.quota_tenants("A100-80GB").is_empty());
    }
}
