//! What one agent session may send: a message budget, and heartbeats in sequence with
//! bounded values.
//!
//! An agent sends a heartbeat per interval (at most 20 a second, `Registry::heartbeat_interval`)
//! and one answer per order. A session may send [`RATE_PER_SECOND`] messages a second on
//! average with bursts of [`BURST`]; messages past that are dropped unread, and a session
//! that has [`CUT_AFTER_DROPS`] dropped within [`DROP_WINDOW`] is ended with
//! RESOURCE_EXHAUSTED (the agent reconnects, and registers again). A heartbeat whose
//! sequence number does not increase, or whose `orders_queued` is out of bounds, ends the
//! session with INVALID_ARGUMENT naming the field.
//!
//! Registrations are paced per node name too (`crate::registry::Registrations`): each one costs the
//! control plane its admission checks, and an agent registers once per connection, with a
//! reconnect backoff of up to 5 s.

use std::time::{Duration, Instant};

use gpufleet_proto::v1;

/// Messages a second a session may send on average.
pub const RATE_PER_SECOND: f64 = 50.0;
/// Messages a session may send at once.
pub const BURST: f64 = 100.0;
/// Dropped messages within [`DROP_WINDOW`] that end the session.
pub const CUT_AFTER_DROPS: u32 = 250;
pub const DROP_WINDOW: Duration = Duration::from_secs(5);
/// Most orders an agent may report queued (it runs one at a time; the control plane
/// never has more waiting for one node than this).
pub const MAX_ORDERS_QUEUED: u32 = 1024;

/// What to do with one message of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Take,
    /// Over the budget: dropped unread.
    Drop,
    /// End the session: over the budget for too long.
    CutForRate(String),
    /// End the session: a heartbeat out of sequence or out of bounds.
    CutForProtocol(String),
}

/// One session's budget and heartbeat sequence.
pub struct Pacing {
    tokens: f64,
    refilled: Instant,
    dropped: u32,
    window_start: Instant,
    last_seq: u64,
}

impl Pacing {
    pub fn new(now: Instant) -> Self {
        Self {
            tokens: BURST,
            refilled: now,
            dropped: 0,
            window_start: now,
            last_seq: 0,
        }
    }

    /// Whether the session's next message (of any kind) is taken.
    pub fn admit(&mut self, now: Instant) -> Verdict {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * RATE_PER_SECOND).min(BURST);
        self.refilled = now;
        if now.saturating_duration_since(self.window_start) >= DROP_WINDOW {
            (self.window_start, self.dropped) = (now, 0);
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Verdict::Take;
        }
        self.dropped += 1;
        if self.dropped >= CUT_AFTER_DROPS {
            return Verdict::CutForRate(format!(
                "the agent sent more than {RATE_PER_SECOND} messages a second (bursts of {BURST}) and {} were dropped within {DROP_WINDOW:?}; reconnect",
                self.dropped
            ));
        }
        Verdict::Drop
    }

    /// Whether a taken heartbeat is in sequence and in bounds.
    pub fn heartbeat(&mut self, beat: &v1::Heartbeat) -> Verdict {
        if beat.seq <= self.last_seq {
            return Verdict::CutForProtocol(format!(
                "heartbeat.seq: must increase within a session (got {} after {})",
                beat.seq, self.last_seq
            ));
        }
        if beat.orders_queued > MAX_ORDERS_QUEUED {
            return Verdict::CutForProtocol(format!(
                "heartbeat.orders_queued: at most {MAX_ORDERS_QUEUED} (got {})",
                beat.orders_queued
            ));
        }
        self.last_seq = beat.seq;
        Verdict::Take
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(seq: u64, orders_queued: u32) -> v1::Heartbeat {
        v1::Heartbeat {
            seq,
            orders_queued,
            gpus: Vec::new(),
            ..Default::default()
        }
    }

    #[test]
    fn a_flood_is_dropped_past_the_burst_then_cut() {
        let t0 = Instant::now();
        let mut p = Pacing::new(t0);
        let verdicts: Vec<Verdict> = (0..400).map(|_| p.admit(t0)).collect();
        let taken = verdicts.iter().filter(|v| **v == Verdict::Take).count();
        assert_eq!(taken, BURST as usize);
        let cut = verdicts
            .iter()
            .position(|v| matches!(v, Verdict::CutForRate(_)))
            .expect("cut");
        assert_eq!(cut, BURST as usize + CUT_AFTER_DROPS as usize - 1);
    }

    #[test]
    fn an_agent_at_its_heartbeat_rate_is_never_dropped() {
        let t0 = Instant::now();
        let mut p = Pacing::new(t0);
        // 20 heartbeats a second (the shortest interval) and an answer per heartbeat, for
        // a minute.
        for i in 0..2400u64 {
            let now = t0 + Duration::from_millis(i * 25);
            assert_eq!(p.admit(now), Verdict::Take, "message {i}");
        }
    }

    #[test]
    fn drops_spread_over_windows_do_not_cut() {
        let t0 = Instant::now();
        let mut p = Pacing::new(t0);
        for _ in 0..BURST as usize {
            p.admit(t0);
        }
        for w in 0..10u64 {
            let now = t0 + DROP_WINDOW * w as u32;
            for _ in 0..CUT_AFTER_DROPS / 2 {
                assert!(!matches!(p.admit(now), Verdict::CutForRate(_)));
            }
        }
    }

    #[test]
    fn heartbeats_must_increase_and_stay_in_bounds() {
        let mut p = Pacing::new(Instant::now());
        assert_eq!(p.heartbeat(&beat(1, 0)), Verdict::Take);
        assert_eq!(p.heartbeat(&beat(2, 3)), Verdict::Take);
        for (b, field) in [
            (
                beat(2, 0),
                "heartbeat.seq: must increase within a session (got 2 after 2)",
            ),
            (
                beat(1, 0),
                "heartbeat.seq: must increase within a session (got 1 after 2)",
            ),
            (beat(0, 0), "heartbeat.seq"),
            (beat(3, u32::MAX), "heartbeat.orders_queued: at most 1024"),
        ] {
            match p.heartbeat(&b) {
                Verdict::CutForProtocol(why) => assert!(why.starts_with(field), "{why}"),
                other => panic!("{b:?}: {other:?}"),
            }
        }
        // A jump forward is an increase.
        assert_eq!(p.heartbeat(&beat(1_000, 0)), Verdict::Take);
    }
}
