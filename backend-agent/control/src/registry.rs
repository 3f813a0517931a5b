//! The control plane's view of its node agents: who is connected, when each was last
//! heard from, the work orders waiting for an answer, and the pace of each name's
//! registrations ([`Registrations`]).
//!
//! One std mutex guards it and is never held across an await or a call out: dispatching
//! an order only queues it on the agent's outbound channel. An order waits for its agent
//! while the agent reconnects (it is re-sent on registration, and the agent's journal
//! makes the re-send a replay), and fails once the node is declared unreachable or its
//! kind's deadline passes (`crate::deadlines`). Only an answer to an order still waiting
//! here, from the node it was sent to, is believed: [`Registry::claim`].

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpufleet_proto::v1::{self, control_message};
use gpufleet_wire::protocol_version::Version;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// `error_kind` of an order that failed for want of an answer within its deadline.
pub const DEADLINE: &str = "deadline";

/// `error_kind` of an order this replica refused to send: it never held the singletons'
/// lease, so the order would carry no epoch (0), which agents run unfenced.
pub const NO_EPOCH: &str = "no_epoch";

pub type Outbound = mpsc::UnboundedSender<Result<v1::ControlMessage, Status>>;

/// What became of an order.
// One per order, moved once to its waiter: boxing the answer would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Outcome {
    /// The agent's verified answer (ok or failed).
    Answered(v1::OrderResult),
    /// The node was declared unreachable before it answered.
    Unreachable(String),
}

struct Session {
    id: u64,
    out: Outbound,
}

struct Pending {
    node_id: String,
    order: v1::WorkOrder,
    waiter: oneshot::Sender<Outcome>,
    /// When it fails unanswered, after how long, and the kind that bound is for.
    deadline: Instant,
    within: Duration,
    kind: &'static str,
}

/// An order an agent has answered, taken from the waiting ones: the answer goes to its
/// waiter once the control plane has checked and recorded it.
pub struct Claim {
    waiter: oneshot::Sender<Outcome>,
    pub order: v1::WorkOrder,
    node_id: String,
    leadership: std::sync::Arc<crate::lease::Leadership>,
}

impl Claim {
    /// Hands the answer to its waiter. An agent that refused the order for its stale epoch
    /// has seen a newer leader's: this replica no longer leads, and says so.
    pub fn answer(self, result: v1::OrderResult) {
        if result.error_kind == gpufleet_wire::protocol_version::STALE_EPOCH {
            tracing::error!(
                node = %self.node_id,
                order = %self.order.id,
                epoch = self.order.epoch,
                error = %result.error,
                "a node agent refused an order of this replica's epoch: another replica holds the singletons' lease"
            );
            self.leadership.lose(&format!(
                "node {}'s agent has seen a newer epoch than {}",
                self.node_id, self.order.epoch
            ));
        }
        let _ = self.waiter.send(Outcome::Answered(result));
    }
}

struct Inner {
    sessions: HashMap<String, Session>,
    /// Last heartbeat or registration per node (nodes unheard of since start count from
    /// the start, so agents have one node timeout to come back after a restart).
    last_seen: HashMap<String, Instant>,
    /// Nodes declared unreachable, and since when.
    stale: HashMap<String, Instant>,
    pending: HashMap<String, Pending>,
    /// Each node's agent's versions as it last registered (kept while it is away: what
    /// it gets on return is checked against the release it last ran).
    versions: HashMap<String, Version>,
    /// Why each node's host cannot isolate a tenant's cluster, as its agent said when it
    /// last registered (absent: it can).
    isolation: HashMap<String, String>,
    next_session: u64,
}

pub struct Registry {
    inner: Mutex<Inner>,
    /// Woken whenever a waiting order ends (answered, failed, past its deadline).
    order_ended: tokio::sync::Notify,
    started: Instant,
    pub node_timeout: Duration,
    pub replace_after: Duration,
    /// How long each kind of order may wait for its answer.
    pub deadlines: crate::deadlines::OrderDeadlines,
    /// The pace of registrations per node name.
    pub registrations: Registrations,
    /// Each live node's latest GPU readings, as its agent reported them.
    pub telemetry: crate::telemetry::Telemetry,
    /// Each live node's node-local team volumes' use, as its agent reported it.
    pub volume_use: crate::volume_use::VolumeUse,
    /// This replica's hold on the singletons' lease: every order carries its epoch.
    leadership: std::sync::Arc<crate::lease::Leadership>,
}

fn order_message(order: &v1::WorkOrder) -> Result<v1::ControlMessage, Status> {
    Ok(v1::ControlMessage {
        msg: Some(control_message::Msg::Order(order.clone())),
    })
}

impl Registry {
    pub fn new(node_timeout: Duration, replace_after: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                sessions: HashMap::new(),
                last_seen: HashMap::new(),
                stale: HashMap::new(),
                pending: HashMap::new(),
                versions: HashMap::new(),
                isolation: HashMap::new(),
                next_session: 1,
            }),
            order_ended: tokio::sync::Notify::new(),
            started: Instant::now(),
            node_timeout,
            replace_after,
            deadlines: Default::default(),
            registrations: Default::default(),
            telemetry: Default::default(),
            volume_use: Default::default(),
            leadership: std::sync::Arc::new(crate::lease::Leadership::new(Default::default())),
        }
    }

    /// The lease this replica's orders are fenced by (`crate::lease`).
    pub fn with_leadership(mut self, leadership: std::sync::Arc<crate::lease::Leadership>) -> Self {
        self.leadership = leadership;
        self
    }

    /// This replica's hold on the singletons' lease.
    pub fn leadership(&self) -> &std::sync::Arc<crate::lease::Leadership> {
        &self.leadership
    }

    pub fn with_deadlines(mut self, deadlines: crate::deadlines::OrderDeadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How often agents must send heartbeats: several per node timeout.
    pub fn heartbeat_interval(&self) -> Duration {
        (self.node_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5))
    }

    /// Whether a live agent holds `node_id`: connected and heard from within the timeout.
    pub fn is_live(&self, node_id: &str) -> bool {
        let inner = self.lock();
        inner.sessions.contains_key(node_id)
            && inner
                .last_seen
                .get(node_id)
                .is_some_and(|t| t.elapsed() < self.node_timeout)
    }

    /// A registered agent's stream, and the versions it said; orders waiting for this
    /// node are sent again.
    pub fn attach(&self, node_id: &str, out: Outbound, version: Version) -> u64 {
        let mut inner = self.lock();
        inner.versions.insert(node_id.to_string(), version);
        let id = inner.next_session;
        inner.next_session += 1;
        for p in inner.pending.values().filter(|p| p.node_id == node_id) {
            let _ = out.send(order_message(&p.order));
        }
        inner
            .sessions
            .insert(node_id.to_string(), Session { id, out });
        inner.last_seen.insert(node_id.to_string(), Instant::now());
        inner.stale.remove(node_id);
        id
    }

    /// The versions the node's agent said when it last registered; None for a node
    /// unheard of since this control plane started.
    pub fn version_of(&self, node_id: &str) -> Option<Version> {
        self.lock().versions.get(node_id).cloned()
    }

    /// Why the node's host cannot isolate a tenant's cluster, as its agent said at this
    /// registration ("" when it can).
    pub fn set_isolation_problem(&self, node_id: &str, problem: &str) {
        let mut inner = self.lock();
        match problem.is_empty() {
            true => inner.isolation.remove(node_id),
            false => inner
                .isolation
                .insert(node_id.to_string(), problem.to_string()),
        };
    }

    /// Why the node's host cannot isolate a tenant's cluster, as its agent said when it
    /// last registered; None when it can (or it was unheard of since this start).
    pub fn isolation_problem(&self, node_id: &str) -> Option<String> {
        self.lock().isolation.get(node_id).cloned()
    }

    /// The stream `session` ended (unless a newer one has replaced it). True when it was
    /// the node's current one: the node has no agent now.
    pub fn detach(&self, node_id: &str, session: u64) -> bool {
        let mut inner = self.lock();
        if inner.sessions.get(node_id).is_some_and(|s| s.id == session) {
            inner.sessions.remove(node_id);
            return true;
        }
        false
    }

    /// The node's agent said it is stopping: if `session` is still its current one, the
    /// node is unreachable from now (its replacement counts from now), its stream ends and
    /// its waiting orders fail. True when it was declared so.
    pub fn declare_left(&self, node_id: &str, session: u64) -> bool {
        let mut inner = self.lock();
        if inner.sessions.get(node_id).is_none_or(|s| s.id != session) {
            return false;
        }
        inner.sessions.remove(node_id);
        inner.stale.insert(node_id.to_string(), Instant::now());
        let ids: Vec<String> = inner
            .pending
            .iter()
            .filter(|(_, p)| p.node_id == node_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(p) = inner.pending.remove(&id) {
                let _ = p.waiter.send(Outcome::Unreachable(format!(
                    "node {node_id}'s agent stopped"
                )));
            }
        }
        drop(inner);
        self.order_ended.notify_waiters();
        true
    }

    /// Ends the node's session, if any, with `status` (its stream's last message), and
    /// forgets its current session: its stream's task stops at its next message.
    pub fn evict(&self, node_id: &str, status: Status) {
        if let Some(session) = self.lock().sessions.remove(node_id) {
            let _ = session.out.send(Err(status));
        }
    }

    /// Drops what is known of a node that no longer exists (a forgotten candidate).
    pub fn forget(&self, node_id: &str) {
        let mut inner = self.lock();
        inner.last_seen.remove(node_id);
        inner.stale.remove(node_id);
        inner.versions.remove(node_id);
    }

    pub fn heartbeat(&self, node_id: &str, session: u64) {
        let mut inner = self.lock();
        if inner.sessions.get(node_id).is_some_and(|s| s.id == session) {
            inner.last_seen.insert(node_id.to_string(), Instant::now());
        }
    }

    /// The id of the node's current session (None without one): a check is judged only
    /// on a node whose agent stayed the same through it.
    pub fn session_of(&self, node_id: &str) -> Option<u64> {
        self.lock().sessions.get(node_id).map(|s| s.id)
    }

    /// Seconds since the node was last heard from; None when not since the start.
    pub fn heartbeat_age(&self, node_id: &str) -> Option<Duration> {
        self.lock().last_seen.get(node_id).map(|t| t.elapsed())
    }

    /// How long the node has been unreachable, if it is.
    pub fn unreachable_for(&self, node_id: &str) -> Option<Duration> {
        self.lock().stale.get(node_id).map(|t| t.elapsed())
    }

    /// Why `what` is not sent: this replica never held the singletons' lease.
    fn never_led(&self, what: &str) -> String {
        format!(
            "lease: replica {} never held the singletons' lease, so {what} would carry no epoch; it sends none (the replica that leads, or this one once it has led, does)",
            self.leadership.replica()
        )
    }

    /// Err (unavailable, naming this replica) when its orders would be refused for want of
    /// an epoch ([`Registry::dispatch`]): asked first by a request that would otherwise
    /// blame a node for the refused order (quarantine it after a failed driver install).
    pub fn refuse_without_epoch(&self) -> crate::error::Result<()> {
        match self.leadership.last_epoch() {
            0 => Err(crate::error::Error::Unavailable(
                self.never_led("its orders"),
            )),
            _ => Ok(()),
        }
    }

    /// Sends `order` to `node_id`'s agent (now, or when it reconnects). The answer comes
    /// through the receiver. The order carries the newest epoch this replica held of the
    /// singletons' lease, also when it is re-sent: an agent that has seen a newer one
    /// refuses it (`crate::lease`). A replica that never held the lease sends nothing: the
    /// order is answered at once, failed with [`NO_EPOCH`] (an order of epoch 0 would be
    /// run by every agent as one from before epochs, fenced by nothing).
    pub fn dispatch(&self, node_id: &str, mut order: v1::WorkOrder) -> oneshot::Receiver<Outcome> {
        order.epoch = self.leadership.last_epoch();
        let (tx, rx) = oneshot::channel();
        if order.epoch == 0 {
            tracing::error!(node = %node_id, order = %order.id, replica = %self.leadership.replica(), "an order refused: this replica never held the singletons' lease");
            let _ = tx.send(Outcome::Answered(v1::OrderResult {
                order_id: order.id,
                ok: false,
                error_kind: NO_EPOCH.into(),
                error: self.never_led(&format!("its order to node {node_id}")),
                ..Default::default()
            }));
            return rx;
        }
        let mut inner = self.lock();
        if inner.stale.contains_key(node_id) {
            let _ = tx.send(Outcome::Unreachable(format!(
                "node {node_id} is unreachable (no heartbeat within {:?})",
                self.node_timeout
            )));
            return rx;
        }
        if let Some(s) = inner.sessions.get(node_id) {
            let _ = s.out.send(order_message(&order));
        }
        let (kind, within) = self.deadlines.of(&order);
        inner.pending.insert(
            order.id.clone(),
            Pending {
                node_id: node_id.to_string(),
                order,
                waiter: tx,
                deadline: Instant::now() + within,
                within,
                kind,
            },
        );
        rx
    }

    /// Takes the order `order_id` that `node_id` answered, if this control plane sent it
    /// to that node and still waits for it; None for any other answer (an order never
    /// sent, another node's, one already answered or past its deadline).
    pub fn claim(&self, node_id: &str, order_id: &str) -> Option<Claim> {
        let mut inner = self.lock();
        if inner.pending.get(order_id)?.node_id != node_id {
            return None;
        }
        let p = inner.pending.remove(order_id)?;
        drop(inner);
        self.order_ended.notify_waiters();
        Some(Claim {
            waiter: p.waiter,
            order: p.order,
            node_id: p.node_id,
            leadership: self.leadership.clone(),
        })
    }

    /// Fails every waiting order, saying `why`: this replica stopped leading, so no agent
    /// answers it here any more (agents answer the replica that leads), and an order kept
    /// for a later leadership of its own would carry a former epoch. Returns how many.
    pub fn fail_all_waiting(&self, why: &str) -> usize {
        let mut inner = self.lock();
        let waiting: Vec<Pending> = inner.pending.drain().map(|(_, p)| p).collect();
        drop(inner);
        let count = waiting.len();
        for p in waiting {
            let message = format!("node {}: {why}", p.node_id);
            let _ = p.waiter.send(Outcome::Unreachable(message));
        }
        self.order_ended.notify_waiters();
        count
    }

    /// Fails every order past its deadline as a failed answer, so that its sender treats
    /// the node as broken for it. Returns the (node, kind, why) of each.
    pub fn fail_overdue(&self) -> Vec<(String, &'static str, String)> {
        let mut inner = self.lock();
        let now = Instant::now();
        let due: Vec<String> = inner
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let mut failed = Vec::new();
        for id in due {
            let Some(p) = inner.pending.remove(&id) else {
                continue;
            };
            let why = format!(
                "node {} gave no answer within {:?} (the deadline of a {} order; serve --order-deadline)",
                p.node_id, p.within, p.kind
            );
            let _ = p.waiter.send(Outcome::Answered(v1::OrderResult {
                order_id: id,
                ok: false,
                error: why.clone(),
                error_kind: DEADLINE.into(),
                ..Default::default()
            }));
            failed.push((p.node_id, p.kind, why));
        }
        drop(inner);
        if !failed.is_empty() {
            self.order_ended.notify_waiters();
        }
        failed
    }

    /// Waits until no order waits for `node_id` (at most `within`); true when none does.
    /// A change to a node is planned from its record only once the orders already sent to
    /// it have ended, or it would be planned from what they are changing.
    pub async fn settled(&self, node_id: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Taken before the check: an order that ends in between still wakes it.
            let ended = self.order_ended.notified();
            if !self.has_pending(node_id) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return !self.has_pending(node_id);
            }
        }
    }

    /// Whether orders wait for `node_id`.
    pub fn has_pending(&self, node_id: &str) -> bool {
        self.lock().pending.values().any(|p| p.node_id == node_id)
    }

    /// Declares unreachable every node (of `known`) not heard from within the timeout,
    /// ends its stream and fails its waiting orders. Returns the nodes declared now.
    pub fn expire(&self, known: &[String]) -> Vec<String> {
        let mut inner = self.lock();
        let now = Instant::now();
        let mut newly = Vec::new();
        for node in known {
            let seen = inner.last_seen.get(node).copied().unwrap_or(self.started);
            if now.duration_since(seen) < self.node_timeout || inner.stale.contains_key(node) {
                continue;
            }
            inner.stale.insert(node.clone(), now);
            if let Some(s) = inner.sessions.remove(node) {
                let _ = s.out.send(Err(Status::unavailable(
                    "no heartbeat within the node timeout; reconnect",
                )));
            }
            newly.push(node.clone());
        }
        let failed: HashSet<String> = newly.iter().cloned().collect();
        let ids: Vec<String> = inner
            .pending
            .iter()
            .filter(|(_, p)| failed.contains(&p.node_id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(p) = inner.pending.remove(&id) {
                let _ = p.waiter.send(Outcome::Unreachable(format!(
                    "node {} is unreachable (no heartbeat within {:?})",
                    p.node_id, self.node_timeout
                )));
            }
        }
        drop(inner);
        self.order_ended.notify_waiters();
        newly
    }
}

/// Registrations one node name may make at once.
pub const REGISTER_BURST: f64 = 5.0;
/// After the burst, one registration of a name per this long.
pub const REGISTER_EVERY: Duration = Duration::from_secs(10);
/// Names whose pace is kept; idle ones are let go past it.
const MAX_NAMES: usize = 10_000;

/// The pace of registrations per node name (a token bucket each).
#[derive(Default)]
pub struct Registrations {
    names: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Registrations {
    /// Takes one registration of `name` now, or says how long until one is allowed.
    pub fn admit(&self, name: &str, now: Instant) -> Result<(), Duration> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.len() >= MAX_NAMES && !names.contains_key(name) {
            // A name whose bucket has filled again holds nothing worth keeping.
            let full = REGISTER_EVERY.mul_f64(REGISTER_BURST);
            names.retain(|_, (_, at)| now.saturating_duration_since(*at) < full);
            if names.len() >= MAX_NAMES {
                return Err(REGISTER_EVERY);
            }
        }
        let (tokens, at) = names
            .entry(name.to_string())
            .or_insert((REGISTER_BURST, now));
        let refill =
            now.saturating_duration_since(*at).as_secs_f64() / REGISTER_EVERY.as_secs_f64();
        *tokens = (*tokens + refill).min(REGISTER_BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        Err(REGISTER_EVERY.mul_f64(1.0 - *tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_registers_in_bursts_then_at_a_pace_and_names_are_apart() {
        let r = Registrations::default();
        let t0 = Instant::now();
        for _ in 0..REGISTER_BURST as usize {
            assert_eq!(r.admit("n1", t0), Ok(()));
        }
        let wait = r.admit("n1", t0).unwrap_err();
        assert_eq!(wait, REGISTER_EVERY);
        assert_eq!(r.admit("n2", t0), Ok(()), "another name is not held back");
        assert_eq!(r.admit("n1", t0 + REGISTER_EVERY), Ok(()));
        assert!(r.admit("n1", t0 + REGISTER_EVERY).is_err());
        // An agent reconnecting with its backoff (5 s at most) after a burst gets in
        // every other try.
        let later = t0 + REGISTER_EVERY * 10;
        for _ in 0..REGISTER_BURST as usize {
            assert_eq!(r.admit("n1", later), Ok(()));
        }
    }

    /// An agent's answer, as the stream hands it over.
    fn complete(r: &Registry, node: &str, result: v1::OrderResult) {
        if let Some(c) = r.claim(node, &result.order_id) {
            c.answer(result);
        }
    }

    fn order(id: &str) -> v1::WorkOrder {
        v1::WorkOrder {
            id: id.into(),
            epoch: 0,
            kind: None,
        }
    }

    /// A registry of a replica that leads with epoch 7.
    fn leading(r: Registry) -> Registry {
        let lease = crate::store::leases::Lease {
            name: crate::lease::SINGLETONS.into(),
            holder: r.leadership.replica().to_string(),
            epoch: 7,
            expires_at: 1015,
            holder_url: String::new(),
        };
        r.leadership
            .record(&crate::store::leases::Acquired::Held(lease), Instant::now());
        r
    }

    #[tokio::test]
    async fn a_replica_that_never_led_refuses_to_send_an_order_without_an_epoch() {
        let r = Registry::new(Duration::from_secs(30), Duration::from_secs(60));
        let (tx, mut rx) = mpsc::unbounded_channel();
        r.attach("n1", tx, Version::ours());
        let answer = r.dispatch("n1", order("o1")).await.unwrap();
        match answer {
            Outcome::Answered(a) => {
                assert!(!a.ok);
                assert_eq!(
                    (a.order_id.as_str(), a.error_kind.as_str()),
                    ("o1", NO_EPOCH)
                );
                assert!(
                    a.error.starts_with("lease: replica ")
                        && a.error.contains("never held the singletons' lease")
                        && a.error.contains("node n1"),
                    "{}",
                    a.error
                );
            }
            Outcome::Unreachable(why) => panic!("refused as unreachable: {why}"),
        }
        assert!(
            rx.try_recv().is_err(),
            "an order of epoch 0 reached the agent"
        );
        assert!(
            !r.has_pending("n1"),
            "the refused order waits to be re-sent"
        );
        let asked = r.refuse_without_epoch().unwrap_err().to_string();
        assert!(
            asked.contains("never held the singletons' lease, so its orders would carry no epoch"),
            "{asked}"
        );
        // Once it has led (and also after it lost the lease), its orders carry its epoch.
        let r = leading(r);
        assert!(r.refuse_without_epoch().is_ok());
        let _pending = r.dispatch("n1", order("o2"));
        let sent = rx.recv().await.unwrap().unwrap();
        assert!(matches!(sent.msg, Some(control_message::Msg::Order(o)) if o.epoch == 7));
        r.leadership.lose("a test");
        let _pending = r.dispatch("n1", order("o3"));
        let sent = rx.recv().await.unwrap().unwrap();
        assert!(
            matches!(sent.msg, Some(control_message::Msg::Order(o)) if o.id == "o3" && o.epoch == 7)
        );
    }

    #[tokio::test]
    async fn an_order_waits_for_its_agent_and_is_resent_on_registration() {
        let r = leading(Registry::new(
            Duration::from_secs(30),
            Duration::from_secs(60),
        ));
        let answer = r.dispatch("n1", order("o1"));
        let (tx, mut rx) = mpsc::unbounded_channel();
        r.attach("n1", tx, Version::ours());
        let sent = rx.recv().await.unwrap().unwrap();
        assert!(matches!(sent.msg, Some(control_message::Msg::Order(o)) if o.id == "o1"));
        // Another node's answer for this id does not complete it.
        complete(
            &r,
            "n2",
            v1::OrderResult {
                order_id: "o1".into(),
                ..Default::default()
            },
        );
        assert!(r.has_pending("n1"));
        complete(
            &r,
            "n1",
            v1::OrderResult {
                order_id: "o1".into(),
                ok: true,
                ..Default::default()
            },
        );
        assert!(matches!(answer.await.unwrap(), Outcome::Answered(res) if res.ok));
        assert!(!r.has_pending("n1"));
    }

    #[tokio::test]
    async fn orders_waited_on_fail_at_once_when_the_replica_stops_leading() {
        let r = leading(Registry::new(
            Duration::from_secs(30),
            Duration::from_secs(60),
        ));
        let (tx, _rx) = mpsc::unbounded_channel();
        r.attach("n1", tx, Version::ours());
        let (first, second) = (r.dispatch("n1", order("o1")), r.dispatch("n1", order("o2")));
        assert_eq!(r.fail_all_waiting("this replica stopped leading"), 2);
        for answer in [first, second] {
            match answer.await.unwrap() {
                Outcome::Unreachable(why) => {
                    assert_eq!(why, "node n1: this replica stopped leading")
                }
                other => panic!("{other:?}"),
            }
        }
        // Nothing waits any more: a late answer to either is not believed.
        assert!(r.claim("n1", "o1").is_none());
        assert_eq!(r.fail_all_waiting("again"), 0);
    }

    #[tokio::test]
    async fn a_silent_node_expires_once_and_fails_its_orders() {
        let r = leading(Registry::new(
            Duration::from_millis(1),
            Duration::from_secs(60),
        ));
        let (tx, _rx) = mpsc::unbounded_channel();
        let session = r.attach("n1", tx, Version::ours());
        let answer = r.dispatch("n1", order("o1"));
        // Wait on the condition itself: the timeout has passed since the registration.
        while r.heartbeat_age("n1").unwrap() < Duration::from_millis(2) {
            tokio::task::yield_now().await;
        }
        let known = vec!["n1".to_string()];
        assert_eq!(r.expire(&known), known);
        assert!(r.expire(&known).is_empty(), "declared once");
        assert!(matches!(answer.await.unwrap(), Outcome::Unreachable(_)));
        assert!(!r.is_live("n1"));
        // A new order to an unreachable node fails at once; a heartbeat from the dropped
        // session does not revive it, a new registration does.
        assert!(matches!(
            r.dispatch("n1", order("o2")).await.unwrap(),
            Outcome::Unreachable(_)
        ));
        r.heartbeat("n1", session);
        assert!(r.unreachable_for("n1").is_some());
        let (tx, _rx2) = mpsc::unbounded_channel();
        r.attach("n1", tx, Version::ours());
        assert!(r.unreachable_for("n1").is_none());
    }

    #[tokio::test]
    async fn orders_carry_the_lease_epoch_and_a_stale_epoch_refusal_ends_the_leadership() {
        let leadership =
            std::sync::Arc::new(crate::lease::Leadership::new(crate::lease::Settings {
                replica: "a".into(),
                ttl: Duration::from_secs(15),
            }));
        let lease = crate::store::leases::Lease {
            name: crate::lease::SINGLETONS.into(),
            holder: "a".into(),
            epoch: 42,
            expires_at: 1015,
            holder_url: String::new(),
        };
        leadership.record(&crate::store::leases::Acquired::Held(lease), Instant::now());
        let r = Registry::new(Duration::from_secs(30), Duration::from_secs(60))
            .with_leadership(leadership.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        r.attach("n1", tx, Version::ours());
        let answer = r.dispatch("n1", order("o1"));
        let sent = rx.recv().await.unwrap().unwrap();
        assert!(matches!(sent.msg, Some(control_message::Msg::Order(o)) if o.epoch == 42));
        assert_eq!(leadership.epoch(), Some(42));
        complete(
            &r,
            "n1",
            v1::OrderResult {
                order_id: "o1".into(),
                error_kind: gpufleet_wire::protocol_version::STALE_EPOCH.into(),
                ..Default::default()
            },
        );
        assert!(matches!(answer.await.unwrap(), Outcome::Answered(a) if !a.ok));
        assert_eq!(leadership.epoch(), None, "an agent saw a newer leader");
        // Later orders still carry the newest epoch this replica held.
        let _pending = r.dispatch("n1", order("o2"));
        let sent = rx.recv().await.unwrap().unwrap();
        assert!(matches!(sent.msg, Some(control_message::Msg::Order(o)) if o.epoch == 42));
    }

    #[tokio::test]
    async fn an_unanswered_order_fails_at_its_deadline_and_a_late_answer_is_not_believed() {
        let mut d = crate::deadlines::OrderDeadlines::default();
        d.set("mig_layout", Duration::ZERO).unwrap();
        let r = leading(
            Registry::new(Duration::from_secs(30), Duration::from_secs(60)).with_deadlines(d),
        );
        let (tx, _rx) = mpsc::unbounded_channel();
        r.attach("n1", tx, Version::ours());
        let mig = v1::WorkOrder {
            id: "o1".into(),
            epoch: 0,
            kind: Some(v1::work_order::Kind::ApplyMigLayout(Default::default())),
        };
        let answer = r.dispatch("n1", mig);
        let failed = r.fail_overdue();
        assert_eq!(
            failed
                .iter()
                .map(|(n, k, _)| (n.as_str(), *k))
                .collect::<Vec<_>>(),
            vec![("n1", "mig_layout")]
        );
        match answer.await.unwrap() {
            Outcome::Answered(res) => {
                assert!(!res.ok);
                assert_eq!(res.error_kind, DEADLINE);
                assert!(res.error.contains("mig_layout"), "{}", res.error);
            }
            other => panic!("{other:?}"),
        }
        // The agent's answer after the deadline is for no waiting order.
        assert!(r.claim("n1", "o1").is_none());
        // A result for an order never sent is not claimed either.
        assert!(r.claim("n1", "never-sent").is_none());
    }
}
