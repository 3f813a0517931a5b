//! The singletons' lease, as one replica of the control plane holds it.
//!
//! The work that must run once per fleet (the watch over heartbeats and node replacement,
//! preemption's take-backs, periodic health checks, Slurm supervision, refills, drift
//! sweeps) runs on the replica that holds the store's `singletons` lease
//! (`store::leases`), and only while it does: [`while_leader`] starts each loop when the
//! replica becomes leader and stops it when the lease is lost. [`run`] renews it every
//! third of its TTL. Two fences keep a replica that lost the lease without knowing it (a
//! paused process, a partition, a store write that failed) from acting:
//!
//! - a singleton's write calls [`Leadership::fence`] in its own transaction: the store's
//!   epoch must still be the one this replica holds, or nothing is written;
//! - every work order carries the epoch (`WorkOrder.epoch`, stamped by the registry),
//!   and a node agent refuses an order older than the newest epoch it has seen.
//!
//! Whether this replica is leader is judged on the monotonic clock: a renewal is good
//! for the TTL from the moment it was asked, whatever the store's clock (which tests
//! move) says. On one replica (the default) the lease is taken at start, before anything
//! runs, and never lost: `serve` holds the data dir's lock, so no other replica of an
//! SQLite store can be alive and the start takes it over at once.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpufleet_process::signals::stopped;
use gpufleet_sql::AsConn;
use tokio::sync::watch;

use crate::error::Error;
use crate::store::leases::{self, Acquired};

/// The lease the singletons run under.
pub const SINGLETONS: &str = "singletons";

/// `serve --lease-ttl` when not given, and its bounds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
pub const MIN_TTL: Duration = Duration::from_secs(3);
pub const MAX_TTL: Duration = Duration::from_secs(300);

/// The longest replica id (`serve --replica-id`).
pub const MAX_REPLICA_ID: usize = 64;

/// How a replica holds the lease (serve's `--replica-id`, `--lease-ttl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// This replica's name as the lease's holder: unique per process.
    pub replica: String,
    pub ttl: Duration,
}

impl Default for Settings {
    /// This process's default id and the default TTL.
    fn default() -> Self {
        Self {
            replica: default_replica_id(),
            ttl: DEFAULT_TTL,
        }
    }
}

/// `--replica-id`: 1 to [`MAX_REPLICA_ID`] letters, digits, '.', '-' or '_'.
pub fn check_replica_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_REPLICA_ID {
        return Err(format!(
            "replica-id: '{id}' is {} characters long; 1 to {MAX_REPLICA_ID}",
            id.len()
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!(
            "replica-id: '{id}' holds {c:?}; only letters, digits, '.', '-' and '_'"
        ));
    }
    Ok(())
}

/// `--lease-ttl`: from [`MIN_TTL`] to [`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<(), String> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(format!(
            "lease-ttl: {ttl:?} is out of bounds; {MIN_TTL:?} to {MAX_TTL:?}"
        ));
    }
    Ok(())
}

/// `<host name>-<pid>`, cut to [`MAX_REPLICA_ID`] and to the characters an id may hold:
/// unique per process on a host, and readable in the store.
pub fn default_replica_id() -> String {
    let pid = std::process::id().to_string();
    let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_REPLICA_ID - pid.len() - 1)
        .collect();
    let host = if host.is_empty() {
        "replica".to_string()
    } else {
        host
    };
    format!("{host}-{pid}")
}

/// The replica that leads, as this replica last read the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub replica: String,
    /// Where it serves its API ('' when it has not said yet).
    pub url: String,
    pub epoch: i64,
}

/// This replica's view of the lease: whether it leads, with which epoch.
pub struct Leadership {
    settings: Settings,
    /// Where this replica serves its API, written with each renewal ('' until known: the
    /// port may be chosen at bind).
    url: Mutex<String>,
    /// Who leads, as the last answer of the store said (this replica or another).
    leader: Mutex<Option<Leader>>,
    /// Wakes [`run`] for a renewal now (the URL became known).
    renew_now: tokio::sync::Notify,
    /// An epoch taken over after start whose former leader's half-done work is not
    /// settled yet (0: none): until it is, this replica serves nothing as the leader.
    unsettled: std::sync::atomic::AtomicU64,
    /// The epoch of [`Leadership::unsettled`] whose store is settled: node agents are
    /// welcome, and the API waits for them to be back (0: none).
    welcomes_agents: std::sync::atomic::AtomicU64,
    /// The replica is stopping: it gives the lease up, and nothing that follows the
    /// lease (node agents' sessions) should take that for a loss.
    stopping: std::sync::atomic::AtomicBool,
    /// Some(epoch) while this replica leads; the singleton loops watch it.
    leads: watch::Sender<Option<u64>>,
    /// Until when the last renewal is good (the monotonic clock).
    valid_until: Mutex<Option<Instant>>,
    /// The newest epoch this replica held: what its orders carry (0: never held).
    last: std::sync::atomic::AtomicU64,
}

impl Leadership {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            url: Mutex::new(String::new()),
            leader: Mutex::new(None),
            renew_now: tokio::sync::Notify::new(),
            stopping: Default::default(),
            unsettled: Default::default(),
            welcomes_agents: Default::default(),
            leads: watch::channel(None).0,
            valid_until: Mutex::new(None),
            last: Default::default(),
        }
    }

    pub fn replica(&self) -> &str {
        &self.settings.replica
    }

    pub fn ttl(&self) -> Duration {
        self.settings.ttl
    }

    /// Whether this replica is stopping (it released the lease, or is about to).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Where this replica serves its API ('' until set).
    pub fn url(&self) -> String {
        self.url.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sets where this replica serves its API and has [`run`] renew at once, so that the
    /// lease says it to the other replicas.
    pub fn set_url(&self, url: &str) {
        *self.url.lock().unwrap_or_else(|p| p.into_inner()) = url.to_string();
        self.renew_now.notify_one();
    }

    /// Who leads, as the store last answered this replica (None before its first answer).
    pub fn leader(&self) -> Option<Leader> {
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The epoch taken over that still waits for [`Leadership::settled`], if any.
    pub fn unsettled(&self) -> Option<u64> {
        let epoch = self.unsettled.load(std::sync::atomic::Ordering::Acquire);
        (epoch != 0).then_some(epoch)
    }

    /// The store is settled for the taken-over `epoch`: node agents may register here,
    /// while the API still waits for them ([`Leadership::settled`]).
    pub fn welcome_agents(&self, epoch: u64) {
        self.welcomes_agents
            .store(epoch, std::sync::atomic::Ordering::Release);
    }

    /// What the former leader left is settled for `epoch`: this replica serves as leader.
    pub fn settled(&self, epoch: u64) {
        let _ = self.unsettled.compare_exchange(
            epoch,
            0,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        );
    }

    /// None while this replica leads and serves the API as the leader; otherwise why
    /// not, naming the leader it knows of (a call is passed on to it, or answered so).
    pub fn not_serving(&self) -> Option<String> {
        match (self.epoch(), self.unsettled()) {
            (Some(epoch), Some(taken)) if taken == epoch => Some(format!(
                "replica {} is taking the lease over (epoch {epoch}): it settles what the former leader left and waits for the node agents first",
                self.replica()
            )),
            _ => self.not_leading(),
        }
    }

    /// None while this replica leads and node agents may register here (its store
    /// settled after a takeover); otherwise why not, naming the leader it knows of.
    pub fn not_leading(&self) -> Option<String> {
        if let Some(epoch) = self.epoch() {
            let welcome = self
                .welcomes_agents
                .load(std::sync::atomic::Ordering::Acquire);
            return match self.unsettled() {
                Some(taken) if taken == epoch && welcome != epoch => Some(format!(
                    "replica {} is taking the lease over (epoch {epoch}) and settles what the former leader left first",
                    self.replica()
                )),
                _ => None,
            };
        }
        Some(match self.leader() {
            Some(l) if l.replica != self.replica() => format!(
                "replica {} does not lead; replica {} does (epoch {}{})",
                self.replica(),
                l.replica,
                l.epoch,
                if l.url.is_empty() {
                    String::new()
                } else {
                    format!(", at {}", l.url)
                }
            ),
            _ => format!(
                "replica {} does not lead now (its lease lapsed, or nobody holds it); a replica takes the lease over within {}s",
                self.replica(),
                self.ttl().as_secs()
            ),
        })
    }

    /// The epoch this replica leads with now; None when it does not lead (never took
    /// the lease, lost it, or its last renewal is older than the TTL).
    pub fn epoch(&self) -> Option<u64> {
        let epoch = (*self.leads.borrow())?;
        let valid = self
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| Instant::now() < until);
        valid.then_some(epoch)
    }

    /// How long the last good renewal still holds (None: this replica does not lead).
    pub fn valid_for(&self) -> Option<Duration> {
        let until = (*self.valid_until.lock().unwrap_or_else(|p| p.into_inner()))?;
        until.checked_duration_since(Instant::now())
    }

    /// The newest epoch this replica held, leading or not (0: never): a work order
    /// carries it, so that agents that saw a newer one refuse it.
    pub fn last_epoch(&self) -> u64 {
        self.last.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Turns to Some(epoch) when this replica starts leading, None when it stops.
    pub fn watch(&self) -> watch::Receiver<Option<u64>> {
        self.leads.subscribe()
    }

    /// Takes or renews the lease in the caller's write transaction, at `now` by the
    /// store's clock (`exclusive`: see `store::leases::acquire`). Nothing of this
    /// replica's view changes until the caller has committed and calls
    /// [`Leadership::record`] with the answer.
    pub fn acquire(
        &self,
        conn: &impl AsConn,
        now: i64,
        exclusive: bool,
    ) -> gpufleet_sql::Result<Acquired> {
        let ttl = i64::try_from(self.settings.ttl.as_secs()).unwrap_or(i64::MAX);
        leases::acquire(
            conn,
            SINGLETONS,
            self.replica(),
            &self.url(),
            ttl,
            now,
            exclusive,
        )
    }

    /// What a committed [`Leadership::acquire`] that was asked at `asked` answered.
    pub fn record(&self, acquired: &Acquired, asked: Instant) {
        let (Acquired::Held(l) | Acquired::Busy(l)) = acquired;
        let answered_before = self
            .leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(Leader {
                replica: l.holder.clone(),
                url: l.holder_url.clone(),
                epoch: l.epoch,
            })
            .is_some();
        match acquired {
            Acquired::Held(l) => {
                let epoch = u64::try_from(l.epoch).unwrap_or(0);
                *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(asked + self.settings.ttl);
                let last = self
                    .last
                    .fetch_max(epoch, std::sync::atomic::Ordering::AcqRel);
                // A takeover after start: another replica may have written under the
                // epochs between, and what it left half-way is settled before this one
                // serves (`takeover`). At start, `serve` settles before serving.
                if answered_before && epoch > last {
                    self.unsettled
                        .store(epoch, std::sync::atomic::Ordering::Release);
                }
                let before = *self.leads.borrow();
                if before != Some(epoch) {
                    tracing::info!(replica = %self.replica(), epoch, "this replica leads: it holds the singletons' lease");
                    self.leads.send_replace(Some(epoch));
                }
            }
            Acquired::Busy(l) => self.lose(&format!(
                "replica {} holds the singletons' lease (epoch {})",
                l.holder, l.epoch
            )),
        }
    }

    /// This replica stops leading (the lease taken over, or not renewed within its TTL).
    pub fn lose(&self, why: &str) {
        if self.stop_leading() {
            tracing::warn!(replica = %self.replica(), %why, "this replica no longer leads; its singletons stop");
        }
    }

    /// Stops leading; whether it led.
    fn stop_leading(&self) -> bool {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.leads.send_replace(None).is_some()
    }

    /// The fence of a singleton's write, in its own transaction: an error, and nothing
    /// written, unless this replica leads and the store's epoch is still the one it
    /// holds.
    pub fn fence(&self, conn: &impl AsConn) -> crate::error::Result<()> {
        let Some(epoch) = self.epoch() else {
            return Err(Error::Precondition(format!(
                "lease: replica {} does not hold the singletons' lease; a singleton's work runs on the replica that does",
                self.replica()
            )));
        };
        let epoch_i = i64::try_from(epoch).unwrap_or(i64::MAX);
        if leases::held(conn, SINGLETONS, self.replica(), epoch_i)? {
            return Ok(());
        }
        let now_held = leases::get(conn, SINGLETONS)?
            .map(|l| format!("replica {} holds epoch {}", l.holder, l.epoch))
            .unwrap_or_else(|| "nobody holds it".into());
        self.lose(&now_held);
        Err(Error::Precondition(format!(
            "lease: replica {} leads with epoch {epoch} of the singletons' lease, but {now_held}: a former leader writes nothing",
            self.replica()
        )))
    }
}

/// Whose write a shared write is, passed down to it: a singleton loop's is fenced (the
/// store's epoch must still be the one this replica leads with, checked by [`Fence::check`]
/// in the write's own transaction), a request's is not (an API handler, a registration: any
/// replica serves those). One store function serves both; the caller says which.
#[derive(Clone, Default)]
pub struct Fence(Option<std::sync::Arc<Leadership>>);

impl Fence {
    /// A singleton loop's writes: fenced by `leadership`'s epoch.
    pub fn singleton(leadership: std::sync::Arc<Leadership>) -> Self {
        Self(Some(leadership))
    }

    /// A request's writes: not fenced.
    pub fn request() -> Self {
        Self(None)
    }

    /// Whether these are a singleton's writes.
    pub fn is_singleton(&self) -> bool {
        self.0.is_some()
    }

    /// Call first in the write's transaction: for a singleton, an error (and the caller
    /// writes nothing) unless this replica still leads with the store's epoch
    /// ([`Leadership::fence`]); for a request, nothing.
    pub fn check(&self, conn: &impl AsConn) -> crate::error::Result<()> {
        match &self.0 {
            Some(leadership) => leadership.fence(conn),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(l) => write!(f, "Fence::singleton({})", l.replica()),
            None => f.write_str("Fence::request"),
        }
    }
}

/// Renews the lease now and every third of its TTL until `stop` turns true, through `renew`
/// (one committed [`Leadership::acquire`]); a renewal that fails, or none within the
/// TTL, ends this replica's leadership. Then releases it, so another replica takes over
/// at once, through `release`.
pub async fn run<R, RF, L, LF>(
    leadership: std::sync::Arc<Leadership>,
    mut stop: watch::Receiver<bool>,
    renew: R,
    release: L,
) where
    R: Fn() -> RF,
    RF: Future<Output = crate::error::Result<Acquired>>,
    L: FnOnce(u64) -> LF,
    LF: Future<Output = crate::error::Result<bool>>,
{
    let every = leadership.ttl() / 3;
    loop {
        let asked = Instant::now();
        // A renewal that hangs (the database unreachable, a partition) must not outlast
        // the lease: leading ends when the last good renewal is a TTL old.
        let within = leadership.valid_for().unwrap_or(every).max(every);
        match tokio::time::timeout(within, renew()).await {
            Ok(Ok(acquired)) => leadership.record(&acquired, asked),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot renew the singletons' lease");
                if leadership.epoch().is_none() {
                    leadership.lose(&format!("its renewals failed for the lease's TTL: {e}"));
                }
            }
            Err(_) => {
                tracing::error!(waited = ?within, "a renewal of the singletons' lease got no answer");
                if leadership.epoch().is_none() {
                    leadership.lose("no renewal was answered within the lease's TTL");
                }
            }
        }
        tokio::select! {
            _ = stopped(&mut stop) => break,
            _ = tokio::time::sleep(every) => {}
            _ = leadership.renew_now.notified() => {}
        }
    }
    leadership
        .stopping
        .store(true, std::sync::atomic::Ordering::Release);
    if let Some(epoch) = leadership.epoch() {
        leadership.stop_leading();
        match release(epoch).await {
            Ok(_) => tracing::info!(epoch, "released the singletons' lease"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot release the singletons' lease; another replica takes it over when it expires")
            }
        }
    }
}

/// Runs the singleton loop `name` (`start(stop)`: a loop that ends when its stop flag
/// turns true) while this replica leads: started when it begins leading, stopped when it
/// stops (or leads again under another epoch, which restarts it), until `stop` turns
/// true.
pub async fn while_leader<S, F>(
    leadership: std::sync::Arc<Leadership>,
    mut stop: watch::Receiver<bool>,
    name: &'static str,
    start: S,
) where
    S: Fn(watch::Receiver<bool>) -> F,
    F: Future<Output = ()>,
{
    let mut leads = leadership.watch();
    loop {
        let epoch = loop {
            if let Some(epoch) = *leads.borrow_and_update() {
                break epoch;
            }
            tokio::select! {
                _ = stopped(&mut stop) => return,
                changed = leads.changed() => if changed.is_err() { return },
            }
        };
        let (end, ended) = watch::channel(false);
        let work = start(ended);
        tokio::pin!(work);
        let stopping = tokio::select! {
            _ = &mut work => return,
            _ = stopped(&mut stop) => true,
            _ = leads.wait_for(|now| *now != Some(epoch)) => false,
        };
        let _ = end.send(true);
        work.await;
        if stopping || *stop.borrow() {
            return;
        }
        tracing::info!(
            singleton = name,
            epoch,
            "stopped a singleton: this replica no longer leads with its epoch"
        );
    }
}

/// For other modules' tests of fenced writes: replicas that take the lease on a store.
#[cfg(test)]
pub mod testing {
    use super::*;
    use rusqlite::Connection;
    use std::sync::Arc;

    /// A replica named `name` with the default TTL, leading nothing yet.
    pub fn replica(name: &str) -> Arc<Leadership> {
        Arc::new(Leadership::new(Settings {
            replica: name.into(),
            ttl: DEFAULT_TTL,
        }))
    }

    /// `l` takes (or renews) the lease at `now` by the store's clock, as `run` does.
    pub fn take(l: &Leadership, conn: &mut Connection, now: i64) {
        let asked = Instant::now();
        let tx = conn.transaction().unwrap();
        let acquired = l.acquire(&tx, now, false).unwrap();
        tx.commit().unwrap();
        l.record(&acquired, asked);
    }

    /// A store's objects for a fenced write to change: tenant `t` (a quota of 16 H100s),
    /// its running Slurm cluster `c1` holding node `n1`, and node `n2` free; both 8-GPU
    /// pool nodes, ready.
    pub fn seed(conn: &Connection) {
        conn.execute_batch(
            "INSERT INTO tenants (id, name, display_name, labels, token_hash, created_at)
                 VALUES ('t', 'team-t', '', '{}', 'ht', 0);
             INSERT INTO quotas (id, tenant_id, gpu_type, gpus, burst_gpus)
                 VALUES ('q', 't', 'H100-80GB', 16, 16);
             INSERT INTO clusters (id, tenant_id, name, orchestrator, gpu_type, node_count,
                                   storage_gib, status, endpoint, credentials, storage_path,
                                   mig_layout)
                 VALUES ('c1', 't', 'c1', 'slurm', 'H100-80GB', 1, 1, 'running', '', '', '', '{}');
             INSERT INTO nodes (id, hostname, gpu_type, capacity, gpu_count, driver_version,
                                cuda_version, state, cluster_id)
                 VALUES ('n1', 'n1', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready', 'c1'),
                        ('n2', 'n2', 'H100-80GB', 'pool', 8, '550', '12.4', 'ready', NULL);",
        )
        .unwrap();
    }

    /// Two replicas of one store: `a` led first, then `b` took the expired lease over, and
    /// `a` does not know yet (its own renewal is recent by its monotonic clock). Their
    /// singletons' fences: a stale one and the current one.
    pub fn stale_and_current(conn: &mut Connection) -> (Fence, Fence) {
        let (a, b) = (replica("a"), replica("b"));
        take(&a, conn, 1000);
        take(&b, conn, 1000 + DEFAULT_TTL.as_secs() as i64 + 1);
        assert!(a.epoch().is_some(), "a still believes it leads");
        (Fence::singleton(a), Fence::singleton(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;
    use std::sync::Arc;

    fn store() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("state.db")).unwrap();
        (dir, conn)
    }

    fn replica(name: &str) -> Arc<Leadership> {
        Arc::new(Leadership::new(Settings {
            replica: name.into(),
            ttl: Duration::from_secs(15),
        }))
    }

    /// One renewal as `run` does it: acquired and committed, then recorded.
    fn renew(l: &Leadership, conn: &mut Connection, now: i64, exclusive: bool) {
        let asked = Instant::now();
        let tx = conn.transaction().unwrap();
        let acquired = l.acquire(&tx, now, exclusive).unwrap();
        tx.commit().unwrap();
        l.record(&acquired, asked);
    }

    #[test]
    fn two_replicas_on_one_store_lead_one_at_a_time_and_the_former_leader_is_fenced() {
        let (_dir, mut conn) = store();
        let (a, b) = (replica("a"), replica("b"));
        renew(&a, &mut conn, 1000, false);
        renew(&b, &mut conn, 1001, false);
        let first = a.epoch().expect("a took the free lease");
        assert_eq!(b.epoch(), None, "b leads beside a");
        assert!(a.fence(&conn).is_ok());
        // a pauses past its expiry by the store's clock; b takes over. a still believes it
        // leads (its own renewal is recent on its clock) but its writes are refused.
        renew(&b, &mut conn, 1015, false);
        let second = b.epoch().expect("b took over the expired lease");
        assert!(second > first);
        assert_eq!(a.epoch(), Some(first));
        let refused = a.fence(&conn).unwrap_err().to_string();
        assert!(
            refused.contains("replica b holds epoch") && refused.contains("writes nothing"),
            "{refused}"
        );
        // The refusal ends a's leadership; its next renewal finds b's lease.
        assert_eq!(a.epoch(), None);
        renew(&a, &mut conn, 1016, false);
        assert_eq!(a.epoch(), None);
        assert_eq!(a.last_epoch(), first);
        assert!(b.fence(&conn).is_ok());
        assert_eq!(b.last_epoch(), second);
    }

    #[test]
    fn a_write_behind_the_fence_of_a_stale_leader_writes_nothing() {
        let (_dir, mut conn) = store();
        let (a, b) = (replica("a"), replica("b"));
        renew(&a, &mut conn, 1000, false);
        renew(&b, &mut conn, 2000, false);
        let tx = conn.transaction().unwrap();
        let wrote = a.fence(&tx).and_then(|()| {
            Ok(crate::store::events::record(
                &tx,
                2000,
                "n1",
                "",
                "node_unreachable",
                "n1",
                "stale",
            )?)
        });
        assert!(wrote.is_err());
        drop(tx);
        assert!(crate::store::events::list(&conn, "n1").unwrap().is_empty());
    }

    #[test]
    fn a_singletons_fence_refuses_once_another_replica_took_over_and_a_requests_never_does() {
        let (_dir, mut conn) = store();
        let (a, b) = (replica("a"), replica("b"));
        renew(&a, &mut conn, 1000, false);
        let (singleton, request) = (Fence::singleton(a.clone()), Fence::request());
        assert!(singleton.is_singleton() && !request.is_singleton());
        assert!(singleton.check(&conn).is_ok());
        renew(&b, &mut conn, 2000, false);
        let refused = singleton.check(&conn).unwrap_err().to_string();
        assert!(refused.contains("writes nothing"), "{refused}");
        assert!(request.check(&conn).is_ok());
    }

    #[test]
    fn a_restart_on_the_same_store_takes_over_at_once_with_a_higher_epoch() {
        let (_dir, mut conn) = store();
        let before = replica("host-100");
        renew(&before, &mut conn, 1000, false);
        // The next process of the same data dir (a new pid): its start is exclusive.
        let after = replica("host-200");
        renew(&after, &mut conn, 1001, true);
        assert!(after.epoch().unwrap() > before.epoch().unwrap());
    }

    #[test]
    fn replica_ids_and_ttls_are_bounded() {
        assert!(check_replica_id("cp-1.zone_a").is_ok());
        assert!(check_replica_id("")
            .unwrap_err()
            .starts_with("replica-id: '' is 0 characters"));
        assert!(check_replica_id(&"x".repeat(65)).is_err());
        assert!(check_replica_id("a b").unwrap_err().contains("' '"));
        let id = default_replica_id();
        assert!(check_replica_id(&id).is_ok(), "{id}");
        assert!(id.ends_with(&format!("-{}", std::process::id())));
        assert!(check_ttl(DEFAULT_TTL).is_ok());
        assert!(check_ttl(Duration::from_secs(2))
            .unwrap_err()
            .starts_with("lease-ttl:"));
        assert!(check_ttl(Duration::from_secs(301)).is_err());
    }

    #[tokio::test]
    async fn a_singleton_runs_only_while_its_replica_leads() {
        let (_dir, mut conn) = store();
        let a = replica("a");
        let (stop_tx, stop) = watch::channel(false);
        let (runs_tx, mut runs) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
        let task = tokio::spawn(while_leader(a.clone(), stop, "test", move |mut end| {
            let runs = runs_tx.clone();
            async move {
                let _ = runs.send("started");
                stopped(&mut end).await;
                let _ = runs.send("stopped");
            }
        }));
        renew(&a, &mut conn, 1000, false);
        assert_eq!(runs.recv().await, Some("started"));
        a.lose("a test");
        assert_eq!(runs.recv().await, Some("stopped"));
        // Leading again restarts it.
        renew(&a, &mut conn, 1001, false);
        assert_eq!(runs.recv().await, Some("started"));
        stop_tx.send(true).unwrap();
        assert_eq!(runs.recv().await, Some("stopped"));
        task.await.unwrap();
    }
}
