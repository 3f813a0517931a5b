//! The earliest window: when `nodes` pool nodes are first free for a whole duration,
//! against the same capacity a reservation is placed against.

use crate::rules::Capacity;

/// The first instant `t >= from` at which `nodes` pool nodes are free over all of
/// `[t, t + duration)`; None when that never happens (open-ended holdings keep too
/// many, or the pool is smaller than `nodes`).
///
/// Exact: the free count only rises where a holding ends, so a window that does not fit
/// at `from` can first fit at the end of some holding; those are the only candidates.
pub fn earliest_start(cap: &Capacity, nodes: i64, duration: i64, from: i64) -> Option<i64> {
    if nodes > cap.pool_nodes {
        return None;
    }
    let mut candidates: Vec<i64> = std::iter::once(from)
        .chain(
            cap.pool_used
                .iter()
                .filter_map(|s| s.end)
                .filter(|&end| end > from),
        )
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    candidates.into_iter().find(|&t| {
        t.checked_add(duration)
            .is_some_and(|end| cap.free_pool(t, Some(end)) >= nodes)
    })
}

/// The longest window one can ask about: ten years.
pub const MAX_DURATION_SECONDS: i64 = 10 * 366 * 24 * 3600;

/// The (node_count, duration) of an earliest-window question; both or neither.
pub fn wanted(node_count: i64, duration_seconds: i64) -> Result<Option<(i64, i64)>, String> {
    match (node_count, duration_seconds) {
        (0, 0) => Ok(None),
        (n, _) if n < 0 => Err(format!("node_count: must be at least 1 (got {n})")),
        (_, d) if !(0..=MAX_DURATION_SECONDS).contains(&d) => Err(format!(
            "duration_seconds: must be between 1 and {MAX_DURATION_SECONDS} (got {d})"
        )),
        (0, _) => Err("node_count: required with duration_seconds".into()),
        (_, 0) => Err("duration_seconds: required with node_count".into()),
        (n, d) => Ok(Some((n, d))),
    }
}

/// Why no window ever fits, with the numbers.
pub fn never(gpu_type: &str, nodes: i64, duration: i64, cap: &Capacity) -> String {
    let open_ended: i64 = cap
        .pool_used
        .iter()
        .filter(|s| s.end.is_none())
        .map(|s| s.amount)
        .sum();
    format!(
        "{nodes} {gpu_type} pool nodes are never free for {}: the pool has {} nodes and clusters hold {open_ended} of them with no end",
        words(duration),
        cap.pool_nodes
    )
}

/// A duration in words: "48h", "90m", "45s".
fn words(seconds: i64) -> String {
    if seconds % 3600 == 0 {
        format!("{}h", seconds / 3600)
    } else if seconds % 60 == 0 {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Span;

    fn span(start: i64, end: Option<i64>, amount: i64) -> Span {
        Span { start, end, amount }
    }

    fn pool(used: Vec<Span>) -> Capacity {
        Capacity {
            pool_nodes: 4,
            on_demand_nodes: 0,
            pool_used: used,
            on_demand_used: vec![],
        }
    }

    #[test]
    fn free_now_starts_now() {
        let cap = pool(vec![span(100, Some(200), 2)]);
        assert_eq!(earliest_start(&cap, 2, 1000, 0), Some(0));
    }

    #[test]
    fn waits_for_the_holding_that_blocks_to_end() {
        // 3 nodes held over [100, 200), 4 in all: 2 nodes for 150s fit from 200 on, not
        // before (every window from 0 overlaps [100, 200)).
        let cap = pool(vec![span(100, Some(200), 3)]);
        assert_eq!(earliest_start(&cap, 2, 150, 0), Some(200));
        // A window short enough to end before 100 fits at once.
        assert_eq!(earliest_start(&cap, 2, 100, 0), Some(0));
        // Back-to-back holdings: the first gap long enough.
        let cap = pool(vec![
            span(0, Some(100), 4),
            span(150, Some(300), 4),
            span(310, Some(400), 4),
        ]);
        assert_eq!(earliest_start(&cap, 1, 50, 0), Some(100));
        assert_eq!(earliest_start(&cap, 1, 60, 0), Some(400));
    }

    #[test]
    fn never_when_open_ended_holdings_or_the_pool_are_too_small() {
        let cap = pool(vec![span(0, None, 3)]);
        assert_eq!(earliest_start(&cap, 2, 10, 0), None);
        assert_eq!(earliest_start(&pool(vec![]), 5, 10, 0), None);
        assert_eq!(
            never("H100-80GB", 2, 48 * 3600, &cap),
            "2 H100-80GB pool nodes are never free for 48h: the pool has 4 nodes and clusters hold 3 of them with no end"
        );
    }

    #[test]
    fn node_count_and_duration_come_together() {
        assert_eq!(wanted(0, 0), Ok(None));
        assert_eq!(wanted(2, 3600), Ok(Some((2, 3600))));
        assert!(wanted(2, 0).unwrap_err().starts_with("duration_seconds:"));
        assert!(wanted(0, 60).unwrap_err().starts_with("node_count:"));
        assert!(wanted(-1, 60).unwrap_err().starts_with("node_count:"));
        assert!(wanted(1, i64::MAX)
            .unwrap_err()
            .starts_with("duration_seconds:"));
    }
}
