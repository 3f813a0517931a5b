//! The API's connections as a bounded resource (`serve --max-connections`,
//! `--max-connections-per-peer`, `--first-request-within`, `--idle-connection-timeout`).
//!
//! A TCP connection costs a file descriptor before it has said a word, so an attacker who
//! only opens connections can exhaust the process (EMFILE) without a token. Here:
//! - the accept loop never ends on an accept error: out of descriptors it backs off and
//!   tries again ([`accept`]);
//! - connections past the global cap, or past the cap of their peer address (every
//!   loopback address counts as one peer: a local user can bind to any of them), are
//!   closed at once, unless the peer (or the process) holds a connection on which no
//!   caller has proven who it is (a valid token or join token): then the oldest such
//!   one is closed and the newcomer admitted. One local process holding every slot with
//!   refused calls thus cannot shut out the CLI or Terraform, and a proven caller's
//!   connection is never taken;
//! - a connection that has sent no request within `first_request_within` is closed, and so
//!   is one with no request in flight for `idle_after`, or for `first_request_within` when
//!   no caller on it has proven who it is ([`guarded`], [`activity`]).
//!
//! The accept loop is the one thing that must never stop while the process serves: if it
//! does anyway, `serve` returns an error, so the process exits non-zero and its supervisor
//! restarts it.

pub mod accept;
pub mod activity;
mod candidates;
pub mod file_limit;
pub mod guarded;
pub mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

/// The bounds on the API's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most, from everyone together.
    pub max_connections: usize,
    /// Open connections at most from one peer address (all of loopback is one).
    pub max_per_peer: usize,
    /// A connection that has sent no request by then is closed (TLS and HTTP/2 preface
    /// included).
    pub first_request_within: Duration,
    /// A connection with no request in flight for this long is closed (clients reconnect).
    pub idle_after: Duration,
}

/// Connections at most per peer address by default: far above what one client process
/// opens (one HTTP/2 connection carries all its calls), far below a flood.
pub const DEFAULT_MAX_PER_PEER: usize = 256;
/// The global cap when the file limit allows more: the rest of the descriptors are the
/// store's, the agents' and the Slurm supervision's.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;
/// Descriptors kept for everything but API connections when the cap follows a low file
/// limit.
pub const RESERVED_DESCRIPTORS: u64 = 256;

impl Limits {
    /// The defaults for a process that may open `open_files` descriptors: 16,384
    /// connections, or what the file limit leaves after [`RESERVED_DESCRIPTORS`] when
    /// that is less (at least 16).
    pub fn for_file_limit(open_files: u64) -> Self {
        let room = open_files.saturating_sub(RESERVED_DESCRIPTORS).max(16);
        let max_connections = (room as usize).min(DEFAULT_MAX_CONNECTIONS);
        Self {
            max_connections,
            max_per_peer: DEFAULT_MAX_PER_PEER.min(max_connections),
            first_request_within: Duration::from_secs(10),
            idle_after: Duration::from_secs(600),
        }
    }
}

/// What `serve`'s flags ask for; what is not given follows the file limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    pub max_connections: Option<usize>,
    pub max_per_peer: Option<usize>,
    pub first_request_within: Option<Duration>,
    pub idle_after: Option<Duration>,
}

impl Wanted {
    /// The limits asked for, the rest from [`Limits::for_file_limit`].
    pub fn resolve(&self, open_files: u64) -> Limits {
        let d = Limits::for_file_limit(open_files);
        let max_connections = self.max_connections.unwrap_or(d.max_connections).max(1);
        Limits {
            max_connections,
            max_per_peer: self
                .max_per_peer
                .unwrap_or(d.max_per_peer)
                .clamp(1, max_connections),
            first_request_within: self.first_request_within.unwrap_or(d.first_request_within),
            idle_after: self.idle_after.unwrap_or(d.idle_after),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::for_file_limit(u64::MAX)
    }
}

/// The peer a connection is counted against: its address, with all of loopback as one.
pub fn peer_of(addr: &SocketAddr) -> IpAddr {
    let ip = match addr.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        ip => ip,
    };
    if ip.is_loopback() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        ip
    }
}

/// What one open connection has done, shared by its stream (which closes it when it
/// overstays) and the request layer (which marks its requests).
#[derive(Debug)]
pub struct Activity {
    accepted: Instant,
    /// A request has arrived on it.
    requested: AtomicBool,
    /// Requests whose response has not ended.
    in_flight: AtomicUsize,
    /// Milliseconds after `accepted` of the last request's start or end.
    last_active_ms: AtomicU64,
    /// A caller on it proved who it is ([`mark_proven`]).
    proven: AtomicBool,
    /// Closed to make room for a newcomer; its place is already given back.
    evicted: AtomicBool,
    /// Its place was given back (closed, or evicted).
    released: AtomicBool,
    /// Wakes the stream's task, so that an eviction is acted on at once.
    waker: Mutex<Option<Waker>>,
}

impl Activity {
    fn new() -> Self {
        Self {
            accepted: Instant::now(),
            requested: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(0),
            proven: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            released: AtomicBool::new(false),
            waker: Mutex::new(None),
        }
    }

    /// Whether a caller on this connection proved who it is.
    pub fn is_proven(&self) -> bool {
        self.proven.load(Ordering::Relaxed)
    }

    /// Keeps `waker` to be woken when the connection is evicted.
    pub fn wake_on_eviction(&self, waker: &Waker) {
        let mut kept = self.waker.lock().unwrap_or_else(|p| p.into_inner());
        if !kept.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *kept = Some(waker.clone());
        }
    }

    /// Whether it may be evicted for a newcomer: open and unproven.
    fn evictable(&self) -> bool {
        !self.is_proven() && !self.released.load(Ordering::Relaxed)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Relaxed);
        let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn touch(&self) {
        let ms = self.accepted.elapsed().as_millis() as u64;
        self.last_active_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// A request started on this connection.
    pub fn request_started(&self) {
        self.requested.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    /// A request's response ended (or was dropped).
    pub fn request_ended(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.touch();
    }

    /// Why the connection should be closed now, if it should; else when to look again.
    pub fn verdict(&self, limits: &Limits, now: Instant) -> Result<Instant, Overstayed> {
        if self.evicted.load(Ordering::Relaxed) {
            return Err(Overstayed::Evicted);
        }
        if !self.requested.load(Ordering::Relaxed) {
            let due = self.accepted + limits.first_request_within;
            return if now >= due {
                Err(Overstayed::NoRequest)
            } else {
                Ok(due)
            };
        }
        // Whoever has not proven who it is may keep a connection no longer than it may
        // wait before its first request: its calls were all refused.
        let idle_after = if self.is_proven() {
            limits.idle_after
        } else {
            limits.idle_after.min(limits.first_request_within)
        };
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            // Looked at again later: the request may end meanwhile.
            return Ok(now + idle_after);
        }
        let last =
            self.accepted + Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        let due = last + idle_after;
        if now >= due {
            Err(Overstayed::Idle)
        } else {
            Ok(due)
        }
    }
}

/// A request's handle on the connection it came on (put in its extensions by
/// [`activity`]), for authentication to say that its caller proved who it is.
#[derive(Clone)]
pub struct Identity(Arc<Activity>);

impl Identity {
    pub fn new(activity: Arc<Activity>) -> Self {
        Self(activity)
    }
}

/// Marks the connection a request came on (when it came through a [`Table`]) as one on
/// which a caller proved who it is: a valid token, or a node agent's join token.
pub fn mark_proven(extensions: &tonic::Extensions) {
    if let Some(identity) = extensions.get::<Identity>() {
        identity.prove();
    }
}

impl Identity {
    /// Its caller proved who it is (see [`mark_proven`]).
    pub fn prove(&self) {
        self.0.proven.store(true, Ordering::Relaxed);
    }
}

/// Why a connection was closed for overstaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overstayed {
    /// No request within `first_request_within`.
    NoRequest,
    /// No request in flight for `idle_after` (or `first_request_within`, unproven).
    Idle,
    /// Unproven, and closed to make room for a newcomer past a cap.
    Evicted,
}

impl Overstayed {
    pub fn label(self) -> &'static str {
        match self {
            Overstayed::NoRequest => "no_request",
            Overstayed::Idle => "idle",
            Overstayed::Evicted => "evicted",
        }
    }
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The global cap was reached.
    Full,
    /// The peer's cap was reached.
    PeerFull,
}

impl Refused {
    pub fn label(self) -> &'static str {
        match self {
            Refused::Full => "max_connections",
            Refused::PeerFull => "max_connections_per_peer",
        }
    }
}

#[derive(Default)]
struct Open {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
    /// By the peer's full address (unique among open connections), for the request layer.
    by_addr: HashMap<SocketAddr, Arc<Activity>>,
    candidates: candidates::Candidates,
}

/// The open connections: counts against the caps, and each one's activity.
pub struct Table {
    pub limits: Limits,
    open: Mutex<Open>,
}

/// One admitted connection's place in the [`Table`]; given back when dropped.
pub struct Admission {
    table: Arc<Table>,
    addr: SocketAddr,
    pub activity: Arc<Activity>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut open = self.table.lock();
        // An evicted connection gave its place back when it was evicted.
        if !self.activity.released.load(Ordering::Relaxed) {
            open.release(&self.addr, &self.activity);
        }
        // A newer connection may reuse the address only after this one closed.
        if open
            .by_addr
            .get(&self.addr)
            .is_some_and(|a| Arc::ptr_eq(a, &self.activity))
        {
            open.by_addr.remove(&self.addr);
        }
    }
}

impl Open {
    /// Gives back the place of the connection from `addr`.
    fn release(&mut self, addr: &SocketAddr, activity: &Activity) {
        activity.released.store(true, Ordering::Relaxed);
        self.total -= 1;
        let peer = peer_of(addr);
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&peer);
                self.candidates.gone(&peer);
            }
        }
        crate::counters::COUNTERS.api_connections_open.dec();
    }

    /// Evicts the oldest connection on which no caller proved who it is, of `peer` when
    /// given, and gives its place back; false when there is none.
    fn evict_unproven(&mut self, peer: Option<IpAddr>) -> bool {
        let Some((addr, activity)) = self.candidates.oldest(peer) else {
            return false;
        };
        activity.evict();
        self.release(&addr, &activity);
        crate::counters::connection_closed(Overstayed::Evicted.label());
        true
    }
}

impl Table {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::new(Open::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new connection from `addr` in, or says which cap it is over. Past a cap,
    /// the oldest unproven connection (of the same peer for the peer's cap) makes room.
    ///
    /// An evicted connection's descriptor is given back once its task sees the eviction
    /// (at once when it is woken), so the caps may be passed by that many for that long.
    pub fn admit(self: &Arc<Self>, addr: SocketAddr) -> Result<Admission, Refused> {
        let mut open = self.lock();
        let peer = peer_of(&addr);
        let from_peer = open.per_peer.get(&peer).copied().unwrap_or(0);
        if from_peer >= self.limits.max_per_peer && !open.evict_unproven(Some(peer)) {
            return Err(Refused::PeerFull);
        }
        if open.total >= self.limits.max_connections && !open.evict_unproven(None) {
            return Err(Refused::Full);
        }
        let from_peer = {
            let n = open.per_peer.entry(peer).or_insert(0);
            *n += 1;
            *n
        };
        open.total += 1;
        let activity = Arc::new(Activity::new());
        open.by_addr.insert(addr, activity.clone());
        let total = open.total;
        open.candidates
            .admitted(addr, peer, &activity, total, from_peer);
        crate::counters::COUNTERS.api_connections_open.inc();
        Ok(Admission {
            table: self.clone(),
            addr,
            activity,
        })
    }

    /// The activity of the open connection from `addr`.
    pub fn activity(&self, addr: &SocketAddr) -> Option<Arc<Activity>> {
        self.lock().by_addr.get(addr).cloned()
    }

    /// Open connections in all.
    pub fn open(&self) -> usize {
        self.lock().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_peer: usize) -> Limits {
        Limits {
            max_connections: total,
            max_per_peer: per_peer,
            ..Limits::default()
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn proven(a: &Admission) {
        a.activity.proven.store(true, Ordering::Relaxed);
    }

    fn evicted(a: &Admission) -> bool {
        a.activity.evicted.load(Ordering::Relaxed)
    }

    #[test]
    fn caps_count_per_peer_with_loopback_as_one_and_free_on_drop() {
        let t = Table::new(limits(3, 2));
        let a = t.admit(addr("127.0.0.1:1000")).unwrap();
        let b = t.admit(addr("127.9.9.9:1001")).unwrap();
        proven(&a);
        proven(&b);
        // A third loopback address is the same peer.
        assert_eq!(
            t.admit(addr("127.0.0.2:1002")).err(),
            Some(Refused::PeerFull)
        );
        let c = t.admit(addr("10.0.0.5:1003")).unwrap();
        proven(&c);
        assert_eq!(t.admit(addr("10.0.0.6:1004")).err(), Some(Refused::Full));
        drop(a);
        assert_eq!(t.open(), 2);
        assert!(t.admit(addr("10.0.0.6:1004")).is_ok());
        assert!(t.activity(&addr("127.9.9.9:1001")).is_some());
    }

    #[test]
    fn past_a_cap_the_oldest_unproven_connection_makes_room_never_a_proven_one() {
        let t = Table::new(limits(4, 3));
        let caller = t.admit(addr("127.0.0.1:1000")).unwrap();
        proven(&caller);
        let old = t.admit(addr("127.0.0.1:1001")).unwrap();
        let young = t.admit(addr("127.0.0.1:1002")).unwrap();
        // The peer is full: its oldest unproven connection goes, its place given back.
        let newcomer = t.admit(addr("127.0.0.1:1003")).unwrap();
        assert!(evicted(&old) && !evicted(&young) && !evicted(&caller));
        assert_eq!(t.open(), 3);
        assert_eq!(
            old.activity.verdict(&t.limits, Instant::now()),
            Err(Overstayed::Evicted)
        );
        // Dropped later, it gives nothing back twice.
        drop(old);
        assert_eq!(t.open(), 3);
        // The process is full: another peer's newcomer takes the oldest unproven place.
        let _remote = t.admit(addr("10.0.0.5:2000")).unwrap();
        assert_eq!(t.open(), 4);
        let _other = t.admit(addr("10.0.0.6:2001")).unwrap();
        assert!(evicted(&young) && !evicted(&newcomer));
        // With only proven connections left of the peer, the cap holds.
        proven(&newcomer);
        let _third = t.admit(addr("127.0.0.1:1004")).unwrap();
        proven(&_third);
        assert_eq!(
            t.admit(addr("127.0.0.1:1005")).err(),
            Some(Refused::PeerFull)
        );
        assert!(!evicted(&caller));
    }

    #[test]
    fn an_unproven_connection_idles_out_as_soon_as_a_silent_one() {
        let l = Limits {
            first_request_within: Duration::from_secs(10),
            idle_after: Duration::from_secs(600),
            ..Limits::default()
        };
        let a = Activity::new();
        a.request_started();
        a.request_ended();
        let ended = a.accepted + Duration::from_millis(a.last_active_ms.load(Ordering::Relaxed));
        assert_eq!(
            a.verdict(&l, ended + Duration::from_secs(10)),
            Err(Overstayed::Idle)
        );
        a.proven.store(true, Ordering::Relaxed);
        assert_eq!(
            a.verdict(&l, ended + Duration::from_secs(10)),
            Ok(ended + Duration::from_secs(600))
        );
    }

    #[test]
    fn a_connection_overstays_without_a_request_or_when_idle() {
        let l = Limits {
            first_request_within: Duration::from_secs(10),
            idle_after: Duration::from_secs(60),
            ..Limits::default()
        };
        let a = Activity::new();
        a.proven.store(true, Ordering::Relaxed);
        let t0 = a.accepted;
        assert_eq!(a.verdict(&l, t0), Ok(t0 + Duration::from_secs(10)));
        assert_eq!(
            a.verdict(&l, t0 + Duration::from_secs(10)),
            Err(Overstayed::NoRequest)
        );
        a.request_started();
        // In flight: never idle, looked at again later.
        let later = t0 + Duration::from_secs(3600);
        assert!(a.verdict(&l, later).is_ok());
        a.request_ended();
        let ended = t0 + Duration::from_millis(a.last_active_ms.load(Ordering::Relaxed));
        assert!(a.verdict(&l, ended + Duration::from_secs(59)).is_ok());
        assert_eq!(
            a.verdict(&l, ended + Duration::from_secs(60)),
            Err(Overstayed::Idle)
        );
    }

    #[test]
    fn the_caps_follow_a_low_file_limit() {
        let l = Limits::for_file_limit(1024);
        assert_eq!((l.max_connections, l.max_per_peer), (768, 256));
        let l = Limits::for_file_limit(100);
        assert_eq!((l.max_connections, l.max_per_peer), (16, 16));
        assert_eq!(Limits::for_file_limit(1 << 20).max_connections, 16_384);
    }
}
