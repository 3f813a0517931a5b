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
//! * deletes this run plans: a quota still used by a cluster is refused at plan unless
//!   the same plan deletes that cluster too;
//! * deletes under way: a tenant delete waits for the deletes of its quotas, clusters and
//!   reservations that run beside it (Terraform runs deletes without a dependency in
//!   parallel) instead of failing for dependents that are about to be gone;
//! * reservations this plan creates: each create's dry run is sent with those admitted
//!   before it, so siblings that cannot all fit are refused at plan, not half-applied;
//! * quotas this plan creates or changes: each quota's dry run is sent with those admitted
//!   before it (siblings that cannot all fit the pool are refused at plan; a lowering makes
//!   room for a raise), a cluster's with all of its model (a raise makes room for it); at
//!   apply a raise refused for the pool waits for the lowerings beside it, and a cluster
//!   for the create or raise of its tenant's quota.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
pub struct ThisRun {
    seen: Mutex<Seen>,
    /// Deletes under way, by the object's id and its tenant's spelling.
    deleting: Mutex<HashMap<String, usize>>,
    /// Deletes that ended.
    ended: AtomicU64,
    /// Told when a delete starts or ends.
    changed: Notify,
    /// Told when a delete is planned.
    planned: Notify,
    /// Reservation creates whose dry runs admitted them and that are not created yet.
    reservations: Mutex<PlannedReservations>,
    /// Quota creates and changes whose dry runs admitted them.
    quotas: Mutex<PlannedQuotas>,
    /// Told when a quota change is admitted or applied.
    quotas_changed: Notify,
}

/// Quota creates and changes a plan admitted, one per (tenant as written, model), and a
/// count of the changes to them (a dry run that saw another count asks again).
#[derive(Default)]
struct PlannedQuotas {
    changes: u64,
    admitted: Vec<PlannedQuota>,
}

struct PlannedQuota {
    quota: gpufleet_proto::v1::PlannedQuota,
    /// Whether it raises what the tenant may use (a create, or more GPUs): a cluster's
    /// create or growth waits for it at apply.
    raises: bool,
    /// Whether it lowers the guarantee: a raise refused for the pool waits for it at apply.
    lowers: bool,
    /// Its create or update ended (at apply), whatever the answer.
    applied: bool,
}

/// Which of a model's planned quota changes a wait at apply is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum QuotaChange {
    Raise,
    Lowering,
}

impl PlannedQuota {
    fn is(&self, which: QuotaChange) -> bool {
        match which {
            QuotaChange::Raise => self.raises,
            QuotaChange::Lowering => self.lowers,
        }
    }
}

/// Reservation creates a plan admitted, in that order, and a count of the changes to
/// them (a dry run that saw another count asks again).
#[derive(Default)]
struct PlannedReservations {
    changes: u64,
    admitted: Vec<gpufleet_proto::v1::PlannedReservation>,
}

#[derive(Default)]
struct Seen {
    tenants: HashSet<String>,
    /// (tenant as written, GPU model) of quotas this run creates.
    quotas: HashSet<(String, String)>,
    ids: HashSet<String>,
    /// Objects whose delete this run plans.
    deleted: HashSet<String>,
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

    /// The delete of the object of this id is planned.
    pub fn plans_delete(&self, id: &str) {
        self.seen().deleted.insert(id.to_string());
        self.planned.notify_waiters();
    }

    /// Of `ids`, those whose delete this run does not plan, after waiting up to `grace`
    /// for the plans of the others (Terraform plans deletes side by side, in no order).
    pub async fn unplanned_deletes(&self, ids: &[String], grace: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let notified = self.planned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let left: Vec<String> = {
                let seen = self.seen();
                ids.iter()
                    .filter(|id| !seen.deleted.contains(*id))
                    .cloned()
                    .collect()
            };
            if left.is_empty() {
                return left;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return left;
            }
        }
    }

    fn reservations(&self) -> std::sync::MutexGuard<'_, PlannedReservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reservation creates admitted in this run and not created yet, those of
    /// `gpu_type` (at most `max`, the first admitted), and the count of changes to them
    /// so far.
    pub fn planned_reservations(
        &self,
        gpu_type: &str,
        max: usize,
    ) -> (u64, Vec<gpufleet_proto::v1::PlannedReservation>) {
        let planned = self.reservations();
        let same = planned
            .admitted
            .iter()
            .filter(|r| r.gpu_type == gpu_type)
            .take(max)
            .cloned()
            .collect();
        (planned.changes, same)
    }

    /// Records an admitted reservation create, unless they changed since the dry run
    /// saw `seen` (false: ask again, with them).
    pub fn admits_reservation(
        &self,
        seen: u64,
        reservation: gpufleet_proto::v1::PlannedReservation,
    ) -> bool {
        let mut planned = self.reservations();
        if planned.changes != seen {
            return false;
        }
        planned.changes += 1;
        planned.admitted.push(reservation);
        true
    }

    /// Whether the admitted reservation creates changed since a dry run saw `seen`.
    pub fn reservations_changed_since(&self, seen: u64) -> bool {
        self.reservations().changes != seen
    }

    /// A reservation create is about to be sent: from now on the backend counts it, so
    /// the dry runs after it (Terraform plans each resource again during the apply) must
    /// not count it twice.
    pub fn creating_reservation(&self, reservation: &gpufleet_proto::v1::PlannedReservation) {
        let mut planned = self.reservations();
        if let Some(at) = planned.admitted.iter().position(|r| r == reservation) {
            planned.admitted.remove(at);
            planned.changes += 1;
        }
    }

    fn quotas(&self) -> std::sync::MutexGuard<'_, PlannedQuotas> {
        self.quotas.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The quota creates and changes of `gpu_type` admitted in this run, but for the one of
    /// the tenant written `tenant` (at most `max`, the first admitted), and the count of
    /// changes to them so far.
    pub fn planned_quotas(
        &self,
        gpu_type: &str,
        tenant: &str,
        max: usize,
    ) -> (u64, Vec<gpufleet_proto::v1::PlannedQuota>) {
        let planned = self.quotas();
        let same = planned
            .admitted
            .iter()
            .map(|p| &p.quota)
            .filter(|q| q.gpu_type == gpu_type && q.tenant_id != tenant)
            .take(max)
            .cloned()
            .collect();
        (planned.changes, same)
    }

    /// Records an admitted quota create or change (in place of an earlier one of the same
    /// tenant and model), unless they changed since the dry run saw `seen` (false: ask
    /// again, with them).
    pub fn admits_quota(
        &self,
        seen: u64,
        quota: gpufleet_proto::v1::PlannedQuota,
        raises: bool,
        lowers: bool,
    ) -> bool {
        let mut planned = self.quotas();
        if planned.changes != seen {
            return false;
        }
        planned.changes += 1;
        planned.admitted.retain(|p| {
            (&p.quota.tenant_id, &p.quota.gpu_type) != (&quota.tenant_id, &quota.gpu_type)
        });
        planned.admitted.push(PlannedQuota {
            quota,
            raises,
            lowers,
            applied: false,
        });
        drop(planned);
        self.quotas_changed.notify_waiters();
        true
    }

    /// Waits up to `grace` for a quota change admitted after a dry run saw `seen`
    /// (Terraform plans siblings side by side, in no order): true when one was, and the
    /// refused dry run is worth asking again.
    pub async fn quota_admitted_since(&self, seen: u64, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let notified = self.quotas_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.quotas().changes != seen {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// The create or update of the quota of `gpu_type` for the tenant written `tenant`
    /// ended (at apply), whatever its answer.
    pub fn quota_applied(&self, tenant: &str, gpu_type: &str) {
        let mut planned = self.quotas();
        for p in planned.admitted.iter_mut() {
            if p.quota.tenant_id == tenant && p.quota.gpu_type == gpu_type {
                p.applied = true;
            }
        }
        drop(planned);
        self.quotas_changed.notify_waiters();
    }

    /// Waits up to `limit` until every admitted quota change of `gpu_type` of kind
    /// `which` is applied: the raises of the tenant written `tenant` (what its cluster
    /// needs), or the lowerings of the other tenants (what a raise of its quota needs).
    /// True when there is one and all are applied now: what it waited for is in the store.
    pub async fn quota_changes_applied(
        &self,
        gpu_type: &str,
        tenant: &str,
        which: QuotaChange,
        limit: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.quotas_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let applied: Vec<bool> = self
                .quotas()
                .admitted
                .iter()
                .filter(|p| {
                    let whose = match which {
                        QuotaChange::Raise => p.quota.tenant_id == tenant,
                        QuotaChange::Lowering => p.quota.tenant_id != tenant,
                    };
                    p.quota.gpu_type == gpu_type && whose && p.is(which)
                })
                .map(|p| p.applied)
                .collect();
            let (any, pending) = (!applied.is_empty(), applied.contains(&false));
            if !pending {
                return any;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Marks a delete as under way until the guard is dropped, under `keys`: the object's
    /// id and its tenant as its state spells it.
    pub fn deleting(&self, keys: &[&str]) -> DeleteUnderWay<'_> {
        let mut deletes = self.deletes();
        for key in keys {
            *deletes.entry(key.to_string()).or_default() += 1;
        }
        drop(deletes);
        self.changed.notify_waiters();
        DeleteUnderWay {
            run: self,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn deletes(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.deleting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many deletes of this run have ended so far: taken before a delete is sent,
    /// for [`ThisRun::dependents_deleted`].
    pub fn deletes_ended(&self) -> u64 {
        self.ended.load(Ordering::SeqCst)
    }

    /// Waits while deletes under one of `spellings` (a tenant's id and name, or objects'
    /// ids) are under way;
    /// when none is, waits up to `grace` for one to start (Terraform starts the deletes
    /// that do not depend on each other together, but not in one instant). True when at
    /// least one delete ended since `ended_before` ([`ThisRun::deletes_ended`] taken
    /// before the refused delete was sent, so that one that ended while the refusal was
    /// on its way counts): the delete is worth another try.
    pub async fn dependents_deleted(
        &self,
        spellings: &[&str],
        grace: Duration,
        ended_before: u64,
    ) -> bool {
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
    keys: Vec<String>,
}

impl Drop for DeleteUnderWay<'_> {
    fn drop(&mut self) {
        let mut deletes = self.run.deletes();
        for key in &self.keys {
            if let Some(n) = deletes.get_mut(key) {
                *n = n.saturating_sub(1);
            }
        }
        drop(deletes);
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
            !run.dependents_deleted(&["team"], grace, run.deletes_ended())
                .await,
            "none began"
        );
        let guard = run.deleting(&["q-1", "team"]);
        let other = run.clone();
        let since = run.deletes_ended();
        let waiter = tokio::spawn(async move {
            other
                .dependents_deleted(&["id-1", "team"], grace, since)
                .await
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(guard);
        assert!(waiter.await.unwrap(), "one ended");
    }

    #[tokio::test]
    async fn a_delete_that_ended_while_the_refusal_was_on_its_way_counts() {
        let run = ThisRun::default();
        // Taken before the tenant's delete is sent; its refusal names a quota whose own
        // delete then begins and ends before the refusal arrives.
        let since = run.deletes_ended();
        drop(run.deleting(&["q-1", "team"]));
        assert!(
            run.dependents_deleted(&["team"], Duration::from_millis(50), since)
                .await,
            "the quota's delete ended after the tenant's was sent: worth another try"
        );
    }

    #[tokio::test]
    async fn a_delete_that_begins_within_the_grace_is_waited_for() {
        let run = Arc::new(ThisRun::default());
        let other = run.clone();
        let since = run.deletes_ended();
        let waiter = tokio::spawn(async move {
            other
                .dependents_deleted(&["team"], Duration::from_secs(30), since)
                .await
        });
        tokio::task::yield_now().await;
        let guard = run.deleting(&["q-1", "team"]);
        drop(guard);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_delete_planned_beside_is_waited_for_and_others_are_not_found() {
        let run = Arc::new(ThisRun::default());
        let other = run.clone();
        let ids = vec!["c-1".to_string(), "c-2".to_string()];
        let waiter = tokio::spawn(async move {
            other
                .unplanned_deletes(&ids, Duration::from_millis(200))
                .await
        });
        tokio::task::yield_now().await;
        run.plans_delete("c-1");
        assert_eq!(waiter.await.unwrap(), vec!["c-2".to_string()]);
    }

    #[test]
    fn a_reservation_admitted_meanwhile_sends_the_dry_run_again() {
        let run = ThisRun::default();
        let planned = |gpu: &str| gpufleet_proto::v1::PlannedReservation {
            gpu_type: gpu.into(),
            node_count: 2,
            ..Default::default()
        };
        // Two dry runs at once, both before either was recorded.
        let (seen_a, _) = run.planned_reservations("H100-80GB", 100);
        let (seen_b, _) = run.planned_reservations("H100-80GB", 100);
        assert!(run.admits_reservation(seen_a, planned("H100-80GB")));
        assert!(!run.admits_reservation(seen_b, planned("H100-80GB")));
        let (seen, same) = run.planned_reservations("H100-80GB", 100);
        assert_eq!((seen, same.len()), (1, 1));
        assert!(run.admits_reservation(seen, planned("A100-80GB")));
        assert_eq!(run.planned_reservations("A100-80GB", 100).1.len(), 1);
        assert!(run.planned_reservations("H100-80GB", 0).1.is_empty());
        // Once its create is sent, the backend counts it: it is no sibling any more, and
        // a dry run that saw it asks again.
        let (seen, _) = run.planned_reservations("H100-80GB", 100);
        run.creating_reservation(&planned("H100-80GB"));
        assert!(run.planned_reservations("H100-80GB", 100).1.is_empty());
        assert!(!run.admits_reservation(seen, planned("H100-80GB")));
    }

    fn quota(tenant: &str, gpus: i64) -> gpufleet_proto::v1::PlannedQuota {
        gpufleet_proto::v1::PlannedQuota {
            tenant_id: tenant.into(),
            gpu_type: "H100-80GB".into(),
            gpus,
            burst_gpus: 0,
        }
    }

    #[tokio::test]
    async fn a_quota_admitted_meanwhile_sends_the_dry_run_again_and_is_counted_once() {
        let run = ThisRun::default();
        let (seen_a, _) = run.planned_quotas("H100-80GB", "a", 100);
        let (seen_b, _) = run.planned_quotas("H100-80GB", "b", 100);
        assert!(run.admits_quota(seen_a, quota("a", 8), true, false));
        assert!(!run.admits_quota(seen_b, quota("b", 16), true, false));
        assert!(run.quota_admitted_since(seen_b, Duration::ZERO).await);
        let (seen, others) = run.planned_quotas("H100-80GB", "b", 100);
        assert_eq!(others, vec![quota("a", 8)]);
        assert!(run.planned_quotas("H100-80GB", "a", 100).1.is_empty());
        // The apply plans it again: one entry, the newer.
        assert!(run.admits_quota(seen, quota("a", 4), true, false));
        assert_eq!(
            run.planned_quotas("H100-80GB", "b", 100).1,
            vec![quota("a", 4)]
        );
        let (seen, _) = run.planned_quotas("H100-80GB", "b", 100);
        assert!(
            !run.quota_admitted_since(seen, Duration::from_millis(10))
                .await
        );
    }

    #[tokio::test]
    async fn a_raise_waits_for_the_lowering_beside_it_and_never_for_another_raise() {
        let run = Arc::new(ThisRun::default());
        let limit = Duration::from_secs(30);
        assert!(run.admits_quota(0, quota("a", 16), true, false));
        assert!(run.admits_quota(1, quota("b", 0), false, true));
        assert!(run.admits_quota(2, quota("c", 8), true, false));
        let other = run.clone();
        let waiter = tokio::spawn(async move {
            other
                .quota_changes_applied("H100-80GB", "a", QuotaChange::Lowering, limit)
                .await
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        run.quota_applied("b", "H100-80GB");
        assert!(waiter.await.unwrap(), "the lowering is applied");
        // Nothing pending: no wait.
        assert!(
            run.quota_changes_applied("H100-80GB", "c", QuotaChange::Lowering, limit)
                .await
        );
        assert!(
            !run.quota_changes_applied("H100-80GB", "b", QuotaChange::Lowering, limit)
                .await,
            "no lowering beside b's own"
        );
        // A cluster waits for the raise of its tenant's quota, not another tenant's.
        let short = Duration::from_millis(10);
        assert!(
            !run.quota_changes_applied("H100-80GB", "a", QuotaChange::Raise, short)
                .await
        );
        let other = run.clone();
        let waiter = tokio::spawn(async move {
            other
                .quota_changes_applied("H100-80GB", "a", QuotaChange::Raise, limit)
                .await
        });
        run.quota_applied("a", "H100-80GB");
        assert!(waiter.await.unwrap(), "its raise is applied");
        assert!(
            !run.quota_changes_applied("H100-80GB", "b", QuotaChange::Raise, limit)
                .await,
            "b raises nothing"
        );
    }

    #[test]
    fn quotas_are_found_by_model() {
        let run = ThisRun::default();
        run.creates_quota("team", "H100-80GB");
        assert_eq!(run.quota_tenants("H100-80GB"), vec!["team".to_string()]);
        assert!(run.quota_tenants("A100-80GB").is_empty());
    }
}
