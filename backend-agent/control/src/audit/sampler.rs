//! Refusals of callers without a valid token, sampled: anyone who reaches the port can
//! make them, as fast as the network allows. Per peer (all of loopback is one) and per
//! [`WINDOW`], the first [`SAMPLED`] are recorded one by one; the rest are counted, and
//! one entry says how many there were once the window has ended. The windows are bounded
//! ([`MAX_PEERS`]): past that, new peers share one window.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

/// The length of a peer's window, in seconds.
pub const WINDOW: i64 = 60;
/// Refusals recorded one by one per peer and window.
pub const SAMPLED: u32 = 10;
/// Peers with a window at once; past it, new peers count under [`OTHERS`].
pub const MAX_PEERS: usize = 4096;
/// Where peers past [`MAX_PEERS`] are counted.
const OTHERS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

#[derive(Debug)]
struct Window {
    started: i64,
    recorded: u32,
    counted: u64,
}

/// Refusals of one peer counted, not recorded, between `from` and `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// The peer's address; "other peers" when past [`MAX_PEERS`]; "unknown" without one.
    pub peer: String,
    pub from: i64,
    pub to: i64,
    pub count: u64,
}

#[derive(Debug, Default)]
pub struct Sampler {
    windows: Mutex<HashMap<Option<IpAddr>, Window>>,
}

impl Sampler {
    /// Whether this refusal from `peer` at `now` is recorded, and what an ended window of
    /// the same peer counted.
    pub fn admit(&self, peer: Option<IpAddr>, now: i64) -> (bool, Option<Counted>) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let mut ended = None;
        let key = if windows.contains_key(&peer) || windows.len() < MAX_PEERS {
            peer
        } else {
            Some(OTHERS)
        };
        let w = windows.entry(key).or_insert(Window {
            started: now,
            recorded: 0,
            counted: 0,
        });
        if now >= w.started + WINDOW {
            ended = counted(key, w, now);
            *w = Window {
                started: now,
                recorded: 0,
                counted: 0,
            };
        }
        if w.recorded < SAMPLED {
            w.recorded += 1;
            (true, ended)
        } else {
            w.counted += 1;
            (false, ended)
        }
    }

    /// What the windows ended by `now` (every window, when `all`) counted; those windows
    /// are forgotten.
    pub fn ended(&self, now: i64, all: bool) -> Vec<Counted> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        windows.retain(|key, w| {
            if all || now >= w.started + WINDOW {
                out.extend(counted(*key, w, now));
                false
            } else {
                true
            }
        });
        out.sort_by(|a, b| (a.from, &a.peer).cmp(&(b.from, &b.peer)));
        out
    }
}

fn counted(key: Option<IpAddr>, w: &Window, now: i64) -> Option<Counted> {
    (w.counted > 0).then(|| Counted {
        peer: match key {
            Some(OTHERS) => "other peers".to_string(),
            Some(ip) => ip.to_string(),
            None => "unknown".to_string(),
        },
        from: w.started,
        to: now.min(w.started + WINDOW),
        count: w.counted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_peer_gets_its_first_refusals_recorded_and_the_rest_counted_per_window() {
        let s = Sampler::default();
        let flood = ip("127.0.0.1");
        let recorded = (0..1000).filter(|_| s.admit(flood, 100).0).count();
        assert_eq!(recorded, SAMPLED as usize);
        // Another peer has a window of its own.
        assert!(s.admit(ip("10.0.0.7"), 101).0);
        // The next window: recorded again, and the last one's count comes with it.
        let (record, ended) = s.admit(flood, 100 + WINDOW);
        assert!(record);
        assert_eq!(
            ended,
            Some(Counted {
                peer: "127.0.0.1".into(),
                from: 100,
                to: 100 + WINDOW,
                count: 1000 - SAMPLED as u64,
            })
        );
        // At the end, every window's count; a window that counted nothing says nothing.
        for _ in 0..SAMPLED + 5 {
            s.admit(flood, 170);
        }
        let all = s.ended(170, true);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].count, 6);
        assert!(s.ended(1000, true).is_empty());
    }

    #[test]
    fn peers_past_the_bound_share_one_window() {
        let s = Sampler::default();
        for i in 0..MAX_PEERS {
            let peer = IpAddr::V6(std::net::Ipv6Addr::from(i as u128 + 1));
            assert!(s.admit(Some(peer), 0).0);
        }
        let fresh = |i: u128| Some(IpAddr::V6(std::net::Ipv6Addr::from(1u128 << 100 | i)));
        let recorded = (0..100).filter(|&i| s.admit(fresh(i), 0).0).count();
        assert_eq!(recorded, SAMPLED as usize);
        let ended = s.ended(WINDOW, false);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].peer, "other peers");
        assert_eq!(s.windows.lock().unwrap().len(), 0);
    }
}
