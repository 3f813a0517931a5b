//! Each tenant's own event and audit sequences (its cursors) are gap-free and ordered:
//! in the fleet-wide order, a tenant's `tenant_seq` rises by one from entry to entry.
//! Pruning takes the oldest first, so what is kept is a run; the one hole pruning may
//! leave is in the event log, which keeps each object's newest events (those within
//! `store::events::KEEP_PER_OBJECT` of its newest), so a hole that starts below a
//! tenant's pruning horizon is the store's own doing.

use super::snapshot::Snapshot;
use super::violation::{Concern, Violation};
use crate::store::invariants::Sequenced;

pub fn check(s: &Snapshot) -> Vec<Violation> {
    let mut out = one_log(s, "events", &s.events, |tenant, seq| {
        s.event_prune_horizons
            .get(tenant)
            .is_some_and(|&horizon| seq < horizon)
    });
    out.extend(one_log(s, "audit entries", &s.audit, |_, _| false));
    out
}

/// `entries` are by tenant, then fleet-wide seq; `pruned(tenant, seq)`: whether pruning
/// may have removed entries of `tenant` after the one at `seq`.
fn one_log(
    s: &Snapshot,
    log: &str,
    entries: &[(String, Sequenced)],
    pruned: impl Fn(&str, i64) -> bool,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut previous: Option<(&str, Sequenced)> = None;
    for (tenant, entry) in entries {
        let Some(own) = entry.tenant_seq else {
            out.push(Violation::new(
                Concern::Sequence,
                format!(
                    "{log} of tenant {}: seq {} has no tenant sequence number",
                    s.tenant(tenant),
                    entry.seq
                ),
            ));
            continue;
        };
        let before = previous
            .filter(|(t, _)| *t == tenant.as_str())
            .and_then(|(_, p)| p.tenant_seq.map(|n| (p.seq, n)));
        previous = Some((tenant, *entry));
        let Some((before_seq, before_own)) = before else {
            continue;
        };
        if own <= before_own {
            out.push(Violation::new(
                Concern::Sequence,
                format!(
                    "{log} of tenant {}: tenant_seq {own} (seq {}) comes after tenant_seq {before_own} (seq {before_seq}); it must rise",
                    s.tenant(tenant),
                    entry.seq
                ),
            ));
        } else if own > before_own + 1 && !pruned(tenant, before_seq) {
            let missing = if own == before_own + 2 {
                format!("{} is missing", before_own + 1)
            } else {
                format!("{}..={} are missing", before_own + 1, own - 1)
            };
            out.push(Violation::new(
                Concern::Sequence,
                format!(
                    "{log} of tenant {}: tenant_seq goes from {before_own} (seq {before_seq}) to {own} (seq {}): {missing}",
                    s.tenant(tenant),
                    entry.seq
                ),
            ));
        }
    }
    out
}
