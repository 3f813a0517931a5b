//! Domain rules as pure functions: input validation, and the time-aware capacity and
//! quota arithmetic. Nothing here touches the store; callers pass what they loaded.
//!
//! Time is in Unix seconds. A holding is a [`Span`]: an amount (nodes or GPUs) held over
//! `[start, end)`, or from `start` on when `end` is `None` (clusters are open-ended).

/// An amount held over a half-open time window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: i64,
    pub end: Option<i64>,
    pub amount: i64,
}

impl Span {
    pub fn covers(&self, t: i64) -> bool {
        self.start <= t && self.end.is_none_or(|end| t < end)
    }
}

/// The largest total amount held at any instant of `[from, until)` (`until = None`: for ever).
/// Exact: the total only rises where a span starts, so it suffices to look at `from` and
/// at every start inside the window. One sweep over the starts and ends inside the window
/// in time order (at one instant ends first: a span is held over `[start, end)`), so
/// O(n log n) for n spans.
pub fn peak(spans: &[Span], from: i64, until: Option<i64>) -> i64 {
    let inside = |t: i64| t > from && until.is_none_or(|u| t < u);
    let mut total: i64 = spans
        .iter()
        .filter(|s| s.covers(from))
        .map(|s| s.amount)
        .sum();
    // (instant, is a start, amount); spans that hold nothing (end <= start) never count.
    let mut changes: Vec<(i64, bool, i64)> = Vec::new();
    for s in spans.iter().filter(|s| s.end.is_none_or(|e| e > s.start)) {
        if inside(s.start) {
            changes.push((s.start, true, s.amount));
        }
        if let Some(end) = s.end.filter(|&e| inside(e)) {
            changes.push((end, false, -s.amount));
        }
    }
    changes.sort_unstable();
    let mut best = total;
    for (i, &(t, _, amount)) in changes.iter().enumerate() {
        total += amount;
        let last_at_t = changes.get(i + 1).is_none_or(|next| next.0 != t);
        // Sorted by (instant, is a start): the last change at an instant is a start when
        // any change there is.
        if last_at_t && changes[i].1 {
            best = best.max(total);
        }
    }
    best
}

pub fn at_least(field: &str, value: i64, min: i64) -> Result<(), String> {
    if value < min {
        Err(format!("{field}: must be at least {min} (got {value})"))
    } else {
        Ok(())
    }
}

pub fn required(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        Err(format!("{field}: required"))
    } else {
        Ok(())
    }
}

pub const ORCHESTRATORS: &[&str] = &["kubernetes", "slurm"];

pub fn orchestrator(value: &str) -> Result<(), String> {
    if ORCHESTRATORS.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "orchestrator: must be one of {} (got '{value}')",
            ORCHESTRATORS.join(", ")
        ))
    }
}

/// What deleting a cluster does to its volume (`storage_retention`).
pub const RETENTIONS: &[&str] = &["delete", "keep"];

/// `storage_retention`: "delete" or "keep".
pub fn storage_retention(value: &str) -> Result<(), String> {
    if RETENTIONS.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "storage_retention: must be one of {} (got '{value}')",
            RETENTIONS.join(", ")
        ))
    }
}

/// A tenant's quota for one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub gpus: i64,
    pub burst_gpus: i64,
}

impl Limit {
    /// Saturates instead of wrapping (the API bounds each part to 1,000,000 anyway).
    pub fn total(&self) -> i64 {
        self.gpus.saturating_add(self.burst_gpus)
    }
}

/// A quota's share of idle capacity as a request gives it: `weight` (None: 1) and
/// `lending_limit_gpus` (None: no limit), checked against the quota's guaranteed `gpus`
/// (only guaranteed GPUs are lent). Returns what the quota keeps.
pub fn quota_sharing(
    gpus: i64,
    weight: Option<i64>,
    lending_limit_gpus: Option<i64>,
) -> Result<(i64, Option<i64>), String> {
    use gpufleet_proto::limits::{DEFAULT_QUOTA_WEIGHT, MAX_QUOTA_WEIGHT};
    let weight = weight.unwrap_or(DEFAULT_QUOTA_WEIGHT);
    if !(1..=MAX_QUOTA_WEIGHT).contains(&weight) {
        return Err(format!(
            "weight: must be 1 to {MAX_QUOTA_WEIGHT} (got {weight})"
        ));
    }
    if let Some(lend) = lending_limit_gpus {
        at_least("lending_limit_gpus", lend, 0)?;
        if lend > gpus {
            return Err(format!(
                "lending_limit_gpus: {lend} is more than the quota's {gpus} guaranteed GPUs (gpus); only guaranteed GPUs are lent: set it to at most {gpus}, or leave it out for no limit"
            ));
        }
    }
    Ok((weight, lending_limit_gpus))
}

/// What a quota check is about, for the messages.
pub struct QuotaSubject<'a> {
    pub tenant: &'a str,
    pub gpu_type: &'a str,
    /// GPUs the request holds already (a cluster scaling): part of what it needs, and not
    /// among the others' "in use".
    pub holds: i64,
}

/// Checks that `others` plus `new` stay within `limit` at every instant from `now` on.
/// `others` are the tenant's other holdings (GPUs) of this model.
pub fn check_quota(
    subject: &QuotaSubject,
    limit: Option<Limit>,
    others: &[Span],
    new: Span,
    now: i64,
) -> Result<(), String> {
    let from = new.start.max(now);
    let in_use = peak(others, from, new.end);
    let mut all = others.to_vec();
    all.push(new);
    let Some(limit) = limit else {
        if new.amount == 0 {
            return Ok(());
        }
        return Err(format!(
            "needs {} {} GPUs, tenant '{}' has no quota for {} (create a gpu quota first)",
            new.amount, subject.gpu_type, subject.tenant, subject.gpu_type
        ));
    };
    if peak(&all, now, None) <= limit.total() {
        return Ok(());
    }
    let (own, others_word) = match subject.holds {
        0 => (String::new(), ""),
        n => (
            format!(" (it holds {n} now)"),
            " by its other clusters and reservations",
        ),
    };
    Err(format!(
        "needs {} {} GPUs{own}, quota of tenant '{}' leaves {} (limit {} = {} guaranteed + {} burst, {} in use{others_word})",
        new.amount,
        subject.gpu_type,
        subject.tenant,
        (limit.total() - in_use).max(0),
        limit.total(),
        limit.gpus,
        limit.burst_gpus,
        in_use
    ))
}

/// A quota may not be lowered below the tenant's peak demand from now on.
pub fn check_quota_update(
    subject: &QuotaSubject,
    new_limit: Limit,
    demand: &[Span],
    now: i64,
) -> Result<(), String> {
    let peak_demand = peak(demand, now, None);
    if peak_demand <= new_limit.total() {
        return Ok(());
    }
    Err(format!(
        "gpus + burst_gpus = {} is below what tenant '{}' already uses or has reserved of {}: {} GPUs at peak; delete or shrink clusters/reservations first",
        new_limit.total(),
        subject.tenant,
        subject.gpu_type,
        peak_demand
    ))
}

/// Node capacity of one GPU model and what already holds it.
#[derive(Debug, Clone, Default)]
pub struct Capacity {
    pub pool_nodes: i64,
    pub on_demand_nodes: i64,
    pub pool_used: Vec<Span>,
    pub on_demand_used: Vec<Span>,
}

impl Capacity {
    /// The fewest pool nodes free at any instant of `[from, until)`.
    pub fn free_pool(&self, from: i64, until: Option<i64>) -> i64 {
        (self.pool_nodes - peak(&self.pool_used, from, until)).max(0)
    }

    pub fn free_on_demand(&self, from: i64, until: Option<i64>) -> i64 {
        (self.on_demand_nodes - peak(&self.on_demand_used, from, until)).max(0)
    }
}

/// How a reservation's nodes split between the pool and on-demand capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub pool: i64,
    pub on_demand: i64,
}

/// Places `nodes` over `[start, end)`: pool first, the rest from on-demand capacity when
/// allowed. `min` is the least of each kind the result must keep (nodes clusters hold).
/// A reservation to place: `nodes` over `[start, end)` (`window_text` says it in words).
pub struct Placing<'a> {
    pub nodes: i64,
    pub start: i64,
    pub end: i64,
    pub allow_on_demand: bool,
    pub window_text: &'a str,
}

pub fn split_reservation(
    gpu_type: &str,
    capacity: &Capacity,
    want: &Placing,
    min: Split,
) -> Result<Split, String> {
    let Placing {
        nodes,
        start,
        end,
        allow_on_demand,
        window_text,
    } = *want;
    let free_pool = capacity.free_pool(start, Some(end));
    let free_od = capacity.free_on_demand(start, Some(end));
    let mut pool = nodes.min(free_pool);
    let mut on_demand = nodes - pool;
    if on_demand < min.on_demand {
        on_demand = min.on_demand;
        pool = nodes - on_demand;
    }
    let short = || {
        format!(
            "node_count: needs {nodes} {gpu_type} nodes {window_text}, pool has {free_pool} free{}",
            if allow_on_demand {
                format!(" and on-demand capacity {free_od}")
            } else {
                format!(" (on-demand has {free_od} free; set allow_on_demand to use it)")
            }
        )
    };
    if pool < min.pool || pool > free_pool {
        return Err(short());
    }
    if on_demand > 0 && (!allow_on_demand && on_demand > min.on_demand || on_demand > free_od) {
        return Err(short());
    }
    Ok(Split { pool, on_demand })
}

/// "scheduled", "active" or "ended" for a window at `now`.
pub fn reservation_status(start: i64, end: i64, now: i64) -> &'static str {
    if now < start {
        "scheduled"
    } else if now < end {
        "active"
    } else {
        "ended"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: i64, end: Option<i64>, amount: i64) -> Span {
        Span { start, end, amount }
    }

    #[test]
    fn peak_counts_only_overlapping_spans() {
        let spans = [
            span(10, Some(20), 2),
            span(20, Some(30), 3),
            span(15, Some(25), 1),
        ];
        assert_eq!(peak(&spans, 0, None), 4); // at 20: 3 + 1
        assert_eq!(peak(&spans, 0, Some(15)), 2);
        assert_eq!(peak(&spans, 25, None), 3);
        assert_eq!(peak(&spans, 30, None), 0);
    }

    /// The sweep agrees with the definition (the total at `from` and at every start
    /// inside the window) on seeded random spans, ties and empty spans included.
    #[test]
    fn peak_matches_its_definition() {
        fn naive(spans: &[Span], from: i64, until: Option<i64>) -> i64 {
            let inside = |t: i64| t >= from && until.is_none_or(|u| t < u);
            std::iter::once(from)
                .chain(spans.iter().map(|s| s.start).filter(|&t| inside(t)))
                .map(|t| spans.iter().filter(|s| s.covers(t)).map(|s| s.amount).sum())
                .max()
                .unwrap_or(0)
        }
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let mut next = |n: i64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as i64
        };
        for _ in 0..3000 {
            let spans: Vec<Span> = (0..next(12))
                .map(|_| {
                    let start = next(40);
                    let end = match next(4) {
                        0 => None,
                        _ => Some(start + next(20) - 2),
                    };
                    span(start, end, next(5))
                })
                .collect();
            let from = next(45);
            let until = match next(3) {
                0 => None,
                _ => Some(from + next(30) - 3),
            };
            assert_eq!(
                peak(&spans, from, until),
                naive(&spans, from, until),
                "{spans:?} from {from} until {until:?}"
            );
        }
    }

    #[test]
    fn peak_includes_open_ended_spans_started_before_the_window() {
        let spans = [span(0, None, 5), span(50, Some(60), 1)];
        assert_eq!(peak(&spans, 100, None), 5);
        assert_eq!(peak(&spans, 10, None), 6);
    }

    #[test]
    fn counts_and_orchestrators() {
        assert_eq!(
            at_least("node_count", 0, 1).unwrap_err(),
            "node_count: must be at least 1 (got 0)"
        );
        assert!(at_least("gpus", 0, 0).is_ok());
        assert!(orchestrator("slurm").is_ok());
        assert!(orchestrator("nomad")
            .unwrap_err()
            .starts_with("orchestrator:"));
    }

    #[test]
    fn quota_message_has_the_numbers() {
        let subject = QuotaSubject {
            tenant: "team-a",
            gpu_type: "H100-80GB",
            holds: 0,
        };
        let limit = Some(Limit {
            gpus: 24,
            burst_gpus: 8,
        });
        let others = [span(0, None, 16)];
        let err = check_quota(&subject, limit, &others, span(100, None, 24), 100).unwrap_err();
        assert_eq!(
            err,
            "needs 24 H100-80GB GPUs, quota of tenant 'team-a' leaves 16 (limit 32 = 24 guaranteed + 8 burst, 16 in use)"
        );
        assert!(check_quota(&subject, limit, &others, span(100, None, 16), 100).is_ok());
    }

    #[test]
    fn a_quotas_weight_and_lending_limit_default_and_are_bounded_by_name() {
        assert_eq!(quota_sharing(16, None, None), Ok((1, None)));
        assert_eq!(quota_sharing(16, Some(1000), Some(0)), Ok((1000, Some(0))));
        assert_eq!(quota_sharing(16, Some(3), Some(16)), Ok((3, Some(16))));
        assert_eq!(
            quota_sharing(16, Some(0), None).unwrap_err(),
            "weight: must be 1 to 1000 (got 0)"
        );
        assert_eq!(
            quota_sharing(16, None, Some(-1)).unwrap_err(),
            "lending_limit_gpus: must be at least 0 (got -1)"
        );
        assert_eq!(
            quota_sharing(16, None, Some(17)).unwrap_err(),
            "lending_limit_gpus: 17 is more than the quota's 16 guaranteed GPUs (gpus); only guaranteed GPUs are lent: set it to at most 16, or leave it out for no limit"
        );
    }

    #[test]
    fn a_scaling_cluster_counts_its_own_gpus_as_its_own_not_as_others_in_use() {
        let subject = QuotaSubject {
            tenant: "vision",
            gpu_type: "H100-80GB",
            holds: 16,
        };
        let limit = Some(Limit {
            gpus: 16,
            burst_gpus: 0,
        });
        let err = check_quota(&subject, limit, &[], span(100, None, 24), 100).unwrap_err();
        assert_eq!(
            err,
            "needs 24 H100-80GB GPUs (it holds 16 now), quota of tenant 'vision' leaves 16 (limit 16 = 16 guaranteed + 0 burst, 0 in use by its other clusters and reservations)"
        );
    }

    #[test]
    fn quota_is_time_aware() {
        let subject = QuotaSubject {
            tenant: "t",
            gpu_type: "H100-80GB",
            holds: 0,
        };
        let limit = Some(Limit {
            gpus: 16,
            burst_gpus: 0,
        });
        // A reservation of 16 GPUs in [200, 300) does not conflict with one in [300, 400).
        let others = [span(200, Some(300), 16)];
        assert!(check_quota(&subject, limit, &others, span(300, Some(400), 16), 100).is_ok());
        assert!(check_quota(&subject, limit, &others, span(250, Some(350), 8), 100).is_err());
        // Ended holdings do not count.
        let ended = [span(0, Some(50), 16)];
        assert!(check_quota(&subject, limit, &ended, span(100, None, 16), 100).is_ok());
    }

    #[test]
    fn no_quota_means_nothing_allowed() {
        let subject = QuotaSubject {
            tenant: "t",
            gpu_type: "A100-80GB",
            holds: 0,
        };
        let err = check_quota(&subject, None, &[], span(0, None, 8), 0).unwrap_err();
        assert!(err.contains("has no quota for A100-80GB"), "{err}");
    }

    #[test]
    fn quota_update_below_peak_is_refused() {
        let subject = QuotaSubject {
            tenant: "t",
            gpu_type: "H100-80GB",
            holds: 0,
        };
        let demand = [span(0, None, 8), span(10, Some(20), 16)];
        let err = check_quota_update(
            &subject,
            Limit {
                gpus: 16,
                burst_gpus: 0,
            },
            &demand,
            0,
        )
        .unwrap_err();
        assert!(err.contains("24 GPUs at peak"), "{err}");
        assert!(check_quota_update(
            &subject,
            Limit {
                gpus: 16,
                burst_gpus: 8
            },
            &demand,
            0
        )
        .is_ok());
        // After the reservation ended only the cluster counts.
        assert!(check_quota_update(
            &subject,
            Limit {
                gpus: 8,
                burst_gpus: 0
            },
            &demand,
            20
        )
        .is_ok());
    }

    fn placing(
        nodes: i64,
        start: i64,
        end: i64,
        allow_on_demand: bool,
        window_text: &str,
    ) -> Placing<'_> {
        Placing {
            nodes,
            start,
            end,
            allow_on_demand,
            window_text,
        }
    }

    fn capacity() -> Capacity {
        Capacity {
            pool_nodes: 4,
            on_demand_nodes: 4,
            pool_used: vec![span(100, Some(200), 2)],
            on_demand_used: vec![],
        }
    }

    #[test]
    fn reservations_take_the_pool_first_then_on_demand() {
        let none = Split {
            pool: 0,
            on_demand: 0,
        };
        let c = capacity();
        assert_eq!(
            split_reservation("H100-80GB", &c, &placing(2, 150, 250, false, "w"), none).unwrap(),
            Split {
                pool: 2,
                on_demand: 0
            }
        );
        assert_eq!(
            split_reservation("H100-80GB", &c, &placing(4, 150, 250, true, "w"), none).unwrap(),
            Split {
                pool: 2,
                on_demand: 2
            }
        );
        let err = split_reservation(
            "H100-80GB",
            &c,
            &placing(4, 150, 250, false, "from a to b"),
            none,
        )
        .unwrap_err();
        assert!(
            err.starts_with("node_count: needs 4 H100-80GB nodes from a to b, pool has 2 free"),
            "{err}"
        );
        // Outside the busy window the whole pool is free.
        assert_eq!(
            split_reservation("H100-80GB", &c, &placing(4, 200, 300, false, "w"), none).unwrap(),
            Split {
                pool: 4,
                on_demand: 0
            }
        );
        assert!(
            split_reservation("H100-80GB", &c, &placing(7, 150, 250, true, "w"), none).is_err()
        );
    }

    #[test]
    fn statuses() {
        assert_eq!(reservation_status(10, 20, 5), "scheduled");
        assert_eq!(reservation_status(10, 20, 10), "active");
        assert_eq!(reservation_status(10, 20, 20), "ended");
    }
}
