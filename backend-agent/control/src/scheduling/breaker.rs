//! The automatic-quarantine breaker, per GPU model: failed health checks quarantine at
//! most a cap of a model's nodes within a window (`serve --breaker-*`). Past the cap the
//! breaker opens: nothing more of that model is quarantined automatically (a failed node
//! stays in service and the failure is reported), an event and a metric say so, and it
//! stays open until an operator resets it (`gpufleet-agent breaker reset --gpu-type M`),
//! as NVIDIA's fault pipeline stops automated remediation and pages a human when faults
//! come too fast to be hardware. The window runs on the control plane's clock.

use std::time::Duration;

use gpufleet_sql::AsConn;

use crate::error::{Error, Result};
use crate::store::{self, nodes::NodeRow};

pub use crate::state::BreakerSettings as Settings;

impl Settings {
    /// How many of a model's `nodes` may be quarantined automatically per window.
    pub fn cap(&self, nodes: i64) -> i64 {
        let share = nodes.max(0) * i64::from(self.max_percent) / 100;
        share.max(i64::from(self.max_quarantines))
    }

    pub fn enabled(&self) -> bool {
        !self.window.is_zero()
    }

    fn window_seconds(&self) -> i64 {
        i64::try_from(self.window.as_secs()).unwrap_or(i64::MAX)
    }
}

/// The event log of a model's breaker (`gpufleet-agent events breaker/H100-80GB`, the
/// admin's): `breaker_opened`, `quarantine_held`, `breaker_reset`.
pub fn event_object(gpu_type: &str) -> String {
    format!("breaker/{gpu_type}")
}

/// What a failed check may do to its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Quarantine it (counted in the model's window).
    Quarantine,
    /// Quarantine it without counting it: a candidate, never in service, steers no
    /// breaker (anyone with the join token can register one that fails).
    Candidate,
    /// Leave it in service: the model's breaker is open. `opened` when this failure is
    /// the one that opened it; `why` says so, naming the reset.
    Held { why: String, opened: bool },
}

/// How a window is said: `10m`, `90s`.
fn window_text(d: Duration) -> String {
    let s = d.as_secs();
    let (minutes, seconds_over) = (s / 60, s % 60);
    let (hours, minutes_over) = (minutes / 60, minutes % 60);
    match (hours, minutes, seconds_over, minutes_over) {
        (h, _, 0, 0) if h > 0 => format!("{h}h"),
        (_, m, 0, _) if m > 0 => format!("{m}m"),
        _ => format!("{s}s"),
    }
}

/// The words of a held quarantine.
fn held_why(gpu_type: &str, reason: &str) -> String {
    format!(
        "not quarantined: the automatic-quarantine breaker of {gpu_type} is open ({reason}); the node stays in service until an operator resets it with `gpufleet-agent breaker reset --gpu-type {gpu_type}`"
    )
}

/// Whether a failed check may quarantine `node` automatically now; run in the writer's
/// transaction, before the quarantine is written, so two checks at once count as two.
/// A quarantine it allows is counted in the model's window; the one past the cap opens
/// the breaker.
pub fn decide(
    conn: &impl AsConn,
    settings: &Settings,
    node: &NodeRow,
    now: i64,
) -> Result<Decision> {
    if store::nodes::in_service(conn, &node.id)? == Some(false) {
        return Ok(Decision::Candidate);
    }
    if !settings.enabled() {
        return Ok(Decision::Quarantine);
    }
    let model = node.gpu_type.as_str();
    if let Some(open) = store::breaker::get_open(conn, model)? {
        store::breaker::hold(conn, model)?;
        return Ok(Decision::Held {
            why: held_why(model, &open.reason),
            opened: false,
        });
    }
    let window_start = now.saturating_sub(settings.window_seconds());
    let counted = store::breaker::quarantines_after(conn, model, window_start)?;
    let nodes = store::breaker::model_nodes(conn)?
        .into_iter()
        .find(|(m, _)| m == model)
        .map(|(_, n)| n)
        .unwrap_or(0);
    let cap = settings.cap(nodes);
    if counted >= cap {
        let reason = format!(
            "{counted} automatic quarantines of its {nodes} nodes within {}, at most {cap}",
            window_text(settings.window)
        );
        store::breaker::open(conn, model, now, &reason)?;
        return Ok(Decision::Held {
            why: held_why(model, &reason),
            opened: true,
        });
    }
    store::breaker::record_quarantine(conn, model, &node.id, now, window_start)?;
    Ok(Decision::Quarantine)
}

/// One model's breaker as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub gpu_type: String,
    pub open: Option<store::breaker::OpenRow>,
    pub quarantines_in_window: i64,
    pub cap: i64,
    pub window_seconds: i64,
}

/// Every model of the fleet's breaker.
pub fn views(conn: &impl AsConn, settings: &Settings, now: i64) -> Result<Vec<View>> {
    let open = store::breaker::list_open(conn)?;
    let window_start = now.saturating_sub(settings.window_seconds());
    store::breaker::model_nodes(conn)?
        .into_iter()
        .map(|(gpu_type, nodes)| {
            Ok(View {
                open: open.iter().find(|o| o.gpu_type == gpu_type).cloned(),
                quarantines_in_window: store::breaker::quarantines_after(
                    conn,
                    &gpu_type,
                    window_start,
                )?,
                cap: if settings.enabled() {
                    settings.cap(nodes)
                } else {
                    0
                },
                window_seconds: settings.window_seconds(),
                gpu_type,
            })
        })
        .collect()
}

/// Closes `gpu_type`'s breaker and starts its window afresh (an operator's reset).
/// Returns the breaker after, and whether it was open.
pub fn reset(
    conn: &impl AsConn,
    settings: &Settings,
    gpu_type: &str,
    now: i64,
) -> Result<(View, bool)> {
    let was_open = store::breaker::reset(conn, gpu_type)?;
    let view = views(conn, settings, now)?
        .into_iter()
        .find(|v| v.gpu_type == gpu_type)
        .ok_or_else(|| {
            Error::NotFound(format!(
                "gpu_type: the fleet has no {gpu_type} nodes, so it has no breaker"
            ))
        })?;
    Ok((view, was_open))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::nodes::POOL;
    use rusqlite::Connection;

    fn node(conn: &Connection, id: &str) -> NodeRow {
        let row = NodeRow {
            id: id.into(),
            hostname: id.into(),
            gpu_type: "H100-80GB".into(),
            capacity: POOL.into(),
            gpu_count: 8,
            driver_version: String::new(),
            cuda_version: String::new(),
            cluster_id: None,
            state: store::nodes::NODE_READY.into(),
            state_reason: String::new(),
            state_since: 0,
        };
        store::nodes::insert(conn, &row, &[]).unwrap();
        store::nodes::put_in_service(conn, id, 0).unwrap();
        row
    }

    #[test]
    fn the_cap_is_a_count_or_a_share_of_the_model_whichever_is_more() {
        let s = Settings::default();
        assert_eq!(s.cap(4), 2);
        assert_eq!(s.cap(10), 2);
        assert_eq!(s.cap(50), 10);
        assert_eq!(window_text(s.window), "10m");
        assert_eq!(window_text(Duration::from_secs(7200)), "2h");
        assert_eq!(window_text(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn past_the_cap_the_breaker_opens_and_holds_until_reset() {
        let dir = tempfile::tempdir().unwrap();
        let conn = store::open(&dir.path().join("s.db")).unwrap();
        let nodes: Vec<NodeRow> = (1..=5).map(|i| node(&conn, &format!("n{i}"))).collect();
        let s = Settings::default();
        assert_eq!(
            decide(&conn, &s, &nodes[0], 1000).unwrap(),
            Decision::Quarantine
        );
        assert_eq!(
            decide(&conn, &s, &nodes[1], 1001).unwrap(),
            Decision::Quarantine
        );
        let Decision::Held { why, opened } = decide(&conn, &s, &nodes[2], 1002).unwrap() else {
            panic!("the third within 10m is held")
        };
        assert!(opened);
        assert!(
            why.contains("breaker of H100-80GB is open (2 automatic quarantines of its 5 nodes within 10m, at most 2)")
                && why.contains("gpufleet-agent breaker reset --gpu-type H100-80GB"),
            "{why}"
        );
        // Open until reset, even after the window has passed.
        let later = decide(&conn, &s, &nodes[3], 1000 + 3600).unwrap();
        assert!(
            matches!(later, Decision::Held { opened: false, .. }),
            "{later:?}"
        );
        let v = &views(&conn, &s, 1002).unwrap()[0];
        assert_eq!((v.quarantines_in_window, v.cap), (2, 2));
        assert_eq!(v.open.as_ref().unwrap().held, 2);
        let (after, was_open) = reset(&conn, &s, "H100-80GB", 1003).unwrap();
        assert!(was_open && after.open.is_none() && after.quarantines_in_window == 0);
        assert_eq!(
            decide(&conn, &s, &nodes[3], 1004).unwrap(),
            Decision::Quarantine
        );
        assert!(matches!(
            reset(&conn, &s, "B200", 1005).unwrap_err(),
            Error::NotFound(_)
        ));
        // Quarantines older than the window no longer count.
        assert_eq!(
            decide(&conn, &s, &nodes[4], 1004 + 601).unwrap(),
            Decision::Quarantine
        );
        // A candidate (never in service) is quarantined, open breaker or not, and counts
        // toward nothing.
        let mut candidate = nodes[4].clone();
        (candidate.id, candidate.hostname) = ("fake".into(), "fake".into());
        store::nodes::insert(&conn, &candidate, &[]).unwrap();
        let before = views(&conn, &s, 1004 + 601).unwrap()[0].quarantines_in_window;
        for t in [1004 + 602, 1004 + 603, 1004 + 604] {
            assert_eq!(
                decide(&conn, &s, &candidate, t).unwrap(),
                Decision::Candidate
            );
        }
        let after = &views(&conn, &s, 1004 + 604).unwrap()[0];
        assert_eq!(after.quarantines_in_window, before);
        assert!(after.open.is_none());
        // Off: every failure quarantines.
        let off = Settings {
            window: Duration::ZERO,
            ..Settings::default()
        };
        for n in &nodes {
            assert_eq!(decide(&conn, &off, n, 5000).unwrap(), Decision::Quarantine);
        }
    }
}
