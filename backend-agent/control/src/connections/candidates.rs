//! Which open connection makes room past a cap: the oldest on which no caller has proven
//! who it is. Connections are queued in the order they were admitted, all together and per
//! peer; one that has since been proven, evicted or closed is dropped when it reaches the
//! front (it never turns back), and a queue that grows past twice what is open is swept,
//! so finding a victim costs O(1) amortized under a flood instead of a scan of every
//! connection with the table locked.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::Activity;

/// Connections that may still be unproven, oldest first.
#[derive(Default)]
struct Queue(VecDeque<(SocketAddr, Arc<Activity>)>);

impl Queue {
    fn push(&mut self, addr: SocketAddr, activity: Arc<Activity>, open: usize) {
        self.0.push_back((addr, activity));
        if self.0.len() > 2 * open + 16 {
            self.0.retain(|(_, a)| a.evictable());
        }
    }

    fn oldest(&mut self) -> Option<(SocketAddr, Arc<Activity>)> {
        while let Some((addr, a)) = self.0.pop_front() {
            if a.evictable() {
                return Some((addr, a));
            }
        }
        None
    }
}

#[derive(Default)]
pub struct Candidates {
    all: Queue,
    of_peer: HashMap<IpAddr, Queue>,
}

impl Candidates {
    /// A connection just admitted from `addr` (of `peer`); `open` and `open_of_peer` count
    /// it.
    pub fn admitted(
        &mut self,
        addr: SocketAddr,
        peer: IpAddr,
        activity: &Arc<Activity>,
        open: usize,
        open_of_peer: usize,
    ) {
        self.all.push(addr, activity.clone(), open);
        self.of_peer
            .entry(peer)
            .or_default()
            .push(addr, activity.clone(), open_of_peer);
    }

    /// The oldest evictable connection, of `peer` when given.
    pub fn oldest(&mut self, peer: Option<IpAddr>) -> Option<(SocketAddr, Arc<Activity>)> {
        match peer {
            Some(p) => self.of_peer.get_mut(&p)?.oldest(),
            None => self.all.oldest(),
        }
    }

    /// `peer` has no connection open any more.
    pub fn gone(&mut self, peer: &IpAddr) {
        self.of_peer.remove(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_oldest_unproven_open_connection_is_found_and_queues_stay_bounded() {
        let peer: IpAddr = [127, 0, 0, 1].into();
        let mut c = Candidates::default();
        // A client that connects and closes in turn, never evicted: its queue is swept.
        for port in 0..10_000u16 {
            let a = Arc::new(Activity::new());
            c.admitted(addr(port), peer, &a, 1, 1);
            a.released.store(true, Ordering::Relaxed);
        }
        assert!(c.all.0.len() <= 2 + 16 + 1 && c.of_peer[&peer].0.len() <= 2 + 16 + 1);
        assert!(c.oldest(Some(peer)).is_none());
        // Proven ones are passed over; the oldest unproven one is found, once.
        let (proven, old, young) = (
            Arc::new(Activity::new()),
            Arc::new(Activity::new()),
            Arc::new(Activity::new()),
        );
        proven.proven.store(true, Ordering::Relaxed);
        for (port, a) in [(1, &proven), (2, &old), (3, &young)] {
            c.admitted(addr(port), peer, a, 3, 3);
        }
        let (at, _) = c.oldest(Some(peer)).unwrap();
        assert_eq!(at, addr(2));
        let (at, _) = c.oldest(None).unwrap();
        assert_eq!(
            at,
            addr(2),
            "the global queue still holds it: not yet released"
        );
        old.released.store(true, Ordering::Relaxed);
        assert_eq!(c.oldest(None).unwrap().0, addr(3));
        c.gone(&peer);
        assert!(c.oldest(Some(peer)).is_none());
    }
}
