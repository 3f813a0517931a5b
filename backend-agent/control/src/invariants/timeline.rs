//! Amounts held over time, and the instant they are most: the checks' own sweep, written
//! apart from admission's arithmetic (`rules::peak`) so that a mistake there is not
//! repeated here.

/// `amount` held over `[start, end)`, or from `start` on (`end = None`), by `holder`
/// (words for messages, e.g. "reservation 1f3c (2)").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub start: i64,
    pub end: Option<i64>,
    pub amount: i64,
    pub holder: String,
}

impl Held {
    fn covers(&self, t: i64) -> bool {
        self.start <= t && self.end.is_none_or(|end| t < end)
    }
}

/// The most held at one instant from `from` on, and the first instant it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peak {
    pub at: i64,
    pub total: i64,
}

/// The greatest total of `held` at any instant at or after `from`. The total changes
/// only where a holding starts or ends, so those instants (and `from`) are all there is
/// to look at; at one instant every change applies before the total is read.
pub fn peak(held: &[Held], from: i64) -> Peak {
    let mut total: i64 = held
        .iter()
        .filter(|h| h.covers(from))
        .map(|h| h.amount)
        .sum();
    let mut changes: Vec<(i64, i64)> = Vec::new();
    for h in held.iter().filter(|h| h.end.is_none_or(|e| e > h.start)) {
        if h.start > from {
            changes.push((h.start, h.amount));
        }
        if let Some(end) = h.end.filter(|&e| e > from) {
            changes.push((end, -h.amount));
        }
    }
    changes.sort_unstable();
    let mut best = Peak { at: from, total };
    let mut i = 0;
    while i < changes.len() {
        let at = changes[i].0;
        while i < changes.len() && changes[i].0 == at {
            total += changes[i].1;
            i += 1;
        }
        if total > best.total {
            best = Peak { at, total };
        }
    }
    best
}

/// Who holds something at `at`, as "holder, holder, ..." (at most `most`, then a count).
pub fn holders_at(held: &[Held], at: i64, most: usize) -> String {
    let covering: Vec<&str> = held
        .iter()
        .filter(|h| h.covers(at) && h.amount != 0)
        .map(|h| h.holder.as_str())
        .collect();
    let mut text = covering
        .iter()
        .take(most)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if covering.len() > most {
        text.push_str(&format!(" and {} more", covering.len() - most));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(start: i64, end: Option<i64>, amount: i64) -> Held {
        Held {
            start,
            end,
            amount,
            holder: format!("{start}..{end:?}"),
        }
    }

    #[test]
    fn the_peak_is_where_holdings_overlap_and_ends_come_first() {
        // [0, 10) and [10, 20) never overlap; [5, ∞) overlaps the first.
        let all = [
            held(0, Some(10), 2),
            held(10, Some(20), 3),
            held(5, None, 1),
        ];
        assert_eq!(peak(&all, 0), Peak { at: 10, total: 4 });
        assert_eq!(peak(&all, 20), Peak { at: 20, total: 1 });
        assert_eq!(peak(&all[..1], 3), Peak { at: 3, total: 2 });
        assert_eq!(holders_at(&all, 6, 1), "0..Some(10) and 1 more");
    }

    #[test]
    fn an_empty_timeline_holds_nothing() {
        assert_eq!(peak(&[], 7), Peak { at: 7, total: 0 });
    }
}
