//! The exact MIG placement planner.
//!
//! A layout (profile name -> count) fits one GPU iff there is a set of placements with
//! every instance at one of its profile's valid starts, no two overlapping in memory
//! slices, compute slices summing to at most 7 and per-profile counts within their
//! maximum. With at most 19 instances on 8 slices, a backtracking search over starts
//! (largest profiles first, identical instances in increasing start order) is exhaustive
//! and takes microseconds. (On the catalog geometry the count rules alone turn out to
//! decide feasibility, see tests/planner_exact.rs; the search still proves each layout by
//! constructing it, and explains dead ends for any other geometry.)

use super::geometry::{describe_run, in_bounds, slice_mask, COMPUTE_SLICES, MEMORY_SLICES};
use super::Layout;
use crate::catalog::{self, GpuModel, MigProfile};
use serde::{Deserialize, Serialize};

/// Where one instance goes: profile and its run of memory slices `[start, start+size)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub profile: String,
    pub profile_id: u32,
    pub start: u8,
    pub size: u8,
}

/// Why a layout cannot be placed: the rule it breaks, and its per-profile counts where it
/// named only known profiles (the suggestions start from them).
pub(crate) struct Unplaceable {
    pub reason: String,
    pub counts: Option<Vec<u32>>,
}

/// Finds placements for `layout` on one GPU of `model`, in creation order (larger
/// profiles first, as the hardware needs), or says which rule fails.
pub(crate) fn place(model: &GpuModel, layout: &Layout) -> Result<Vec<Placement>, Unplaceable> {
    if !model.mig_capable || model.profiles.is_empty() {
        return Err(Unplaceable {
            reason: format!(
                "mig_layout: {} does not support MIG; leave mig_layout unset to use whole GPUs",
                model.name
            ),
            counts: None,
        });
    }
    let counts = resolve_counts(model, layout).map_err(|reason| Unplaceable {
        reason,
        counts: None,
    })?;
    if let Some(reason) = count_rule_violations(model, &counts) {
        return Err(Unplaceable {
            reason,
            counts: Some(counts),
        });
    }
    match search(model, &counts) {
        Search::Placed(found) => Ok(found
            .into_iter()
            .map(|(idx, start)| {
                let p = &model.profiles[idx];
                Placement {
                    profile: p.name.clone(),
                    profile_id: p.id,
                    start,
                    size: p.memory_slices,
                }
            })
            .collect()),
        Search::Stuck { placed, next } => Err(Unplaceable {
            reason: explain_stuck(model, &placed, next),
            counts: Some(counts),
        }),
    }
}

/// Whether per-profile `counts` (indexed like `model.profiles`) fit one GPU.
pub(crate) fn fits(model: &GpuModel, counts: &[u32]) -> bool {
    count_rule_violations_fast(model, counts) && matches!(search(model, counts), Search::Placed(_))
}

/// Maps names to per-profile counts (indexed like `model.profiles`); unknown names are
/// an error listing the model's profile names.
fn resolve_counts(model: &GpuModel, layout: &Layout) -> Result<Vec<u32>, String> {
    let mut counts = vec![0u32; model.profiles.len()];
    let mut unknown = Vec::new();
    for (name, &count) in layout {
        match model.profiles.iter().position(|p| &p.name == name) {
            Some(idx) => counts[idx] = counts[idx].saturating_add(count),
            None => unknown.push(name.as_str()),
        }
    }
    if unknown.is_empty() {
        return Ok(counts);
    }
    let hints: Vec<String> = unknown
        .iter()
        .filter_map(|name| other_model_hint(model, name))
        .collect();
    let mut reason = format!(
        "mig_layout: unknown profile {} for {}; its profiles are {}",
        unknown
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", "),
        model.name,
        model.profile_names().join(", ")
    );
    for hint in hints {
        reason.push_str("; ");
        reason.push_str(&hint);
    }
    Err(reason)
}

/// "3g.20gb is the A100-40GB name of the 3g.40gb shape on H100-80GB" style hint.
fn other_model_hint(model: &GpuModel, name: &str) -> Option<String> {
    catalog::models().iter().find_map(|other| {
        let id = other.profile(name)?.id;
        let here = model.profile_by_id(id)?;
        Some(format!(
            "\"{name}\" is a profile of {}; the same shape on {} is \"{}\"",
            other.name, model.name, here.name
        ))
    })
}

/// The per-profile maximum, compute-sum and memory-sum rules, in words; None if all hold.
fn count_rule_violations(model: &GpuModel, counts: &[u32]) -> Option<String> {
    let mut problems = Vec::new();
    for (p, &n) in model.profiles.iter().zip(counts) {
        if n > p.max_per_gpu as u32 {
            problems.push(format!(
                "{}: at most {} per GPU (requested {})",
                p.name, p.max_per_gpu, n
            ));
        }
    }
    let terms = |slices: fn(&MigProfile) -> u8| -> (u64, String) {
        let mut total = 0u64;
        let mut parts = Vec::new();
        for (p, &n) in model.profiles.iter().zip(counts).rev() {
            if n > 0 {
                total += n as u64 * slices(p) as u64;
                parts.push(if n == 1 {
                    format!("{} ({})", p.name, slices(p))
                } else {
                    format!("{} x {} ({})", n, p.name, n as u64 * slices(p) as u64)
                });
            }
        }
        (total, parts.join(" + "))
    };
    let (compute, compute_terms) = terms(|p| p.compute_slices);
    if compute > COMPUTE_SLICES as u64 {
        problems.push(format!(
            "compute slices: {compute_terms} need {compute}, exceeding {COMPUTE_SLICES}"
        ));
    }
    let (memory, memory_terms) = terms(|p| p.memory_slices);
    if memory > MEMORY_SLICES as u64 {
        problems.push(format!(
            "memory slices: the layout needs {memory} of {MEMORY_SLICES} ({memory_terms})"
        ));
    }
    if problems.is_empty() {
        None
    } else {
        Some(problems.join("; "))
    }
}

/// Allocation-free form of `count_rule_violations`: true when every count rule holds.
fn count_rule_violations_fast(model: &GpuModel, counts: &[u32]) -> bool {
    let mut compute = 0u64;
    let mut memory = 0u64;
    for (p, &n) in model.profiles.iter().zip(counts) {
        if n > p.max_per_gpu as u32 {
            return false;
        }
        compute += n as u64 * p.compute_slices as u64;
        memory += n as u64 * p.memory_slices as u64;
    }
    compute <= COMPUTE_SLICES as u64 && memory <= MEMORY_SLICES as u64
}

enum Search {
    /// (profile index, start) per instance, in creation order.
    Placed(Vec<(usize, u8)>),
    /// No placement: the deepest partial placement found and the instance it could not add.
    Stuck {
        placed: Vec<(usize, u8)>,
        next: usize,
    },
}

/// Instances (profile indices) in creation order: larger memory first, then larger compute.
fn creation_order(model: &GpuModel, counts: &[u32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..model.profiles.len())
        .filter(|&i| counts[i] > 0)
        .collect();
    order.sort_by_key(|&i| {
        let p = &model.profiles[i];
        (
            std::cmp::Reverse(p.memory_slices),
            std::cmp::Reverse(p.compute_slices),
            i,
        )
    });
    order
        .into_iter()
        .flat_map(|i| std::iter::repeat_n(i, counts[i] as usize))
        .collect()
}

fn search(model: &GpuModel, counts: &[u32]) -> Search {
    let instances = creation_order(model, counts);
    let mut state = SearchState {
        model,
        instances: &instances,
        current: Vec::with_capacity(instances.len()),
        deepest: Vec::new(),
    };
    if state.place(0, 0, 0) {
        Search::Placed(state.current)
    } else {
        let next = instances[state.deepest.len()];
        Search::Stuck {
            placed: state.deepest,
            next,
        }
    }
}

struct SearchState<'a> {
    model: &'a GpuModel,
    instances: &'a [usize],
    current: Vec<(usize, u8)>,
    deepest: Vec<(usize, u8)>,
}

impl SearchState<'_> {
    /// Places instances[k..] given the occupied `used` mask and compute already spent.
    fn place(&mut self, k: usize, used: u16, compute: u8) -> bool {
        if k == self.instances.len() {
            return true;
        }
        let idx = self.instances[k];
        let p = &self.model.profiles[idx];
        if compute + p.compute_slices > COMPUTE_SLICES {
            self.note_depth();
            return false;
        }
        // Identical instances are interchangeable: keep their starts increasing.
        let min_start = match self.current.last() {
            Some(&(prev, start)) if prev == idx => start + 1,
            _ => 0,
        };
        for &start in p.valid_starts.iter().filter(|&&s| s >= min_start) {
            if !in_bounds(start, p.memory_slices) {
                continue;
            }
            let mask = slice_mask(start, p.memory_slices);
            if used & mask != 0 {
                continue;
            }
            self.current.push((idx, start));
            if self.place(k + 1, used | mask, compute + p.compute_slices) {
                return true;
            }
            self.current.pop();
        }
        self.note_depth();
        false
    }

    fn note_depth(&mut self) {
        if self.current.len() > self.deepest.len() || self.deepest.is_empty() {
            self.deepest = self.current.clone();
        }
    }
}

/// Words for a placement dead end: which starts the stuck profile could use and who sits there.
fn explain_stuck(model: &GpuModel, placed: &[(usize, u8)], next: usize) -> String {
    let p = &model.profiles[next];
    let occupants = |start: u8| -> Vec<String> {
        let mask = slice_mask(start, p.memory_slices);
        placed
            .iter()
            .filter(|&&(i, s)| slice_mask(s, model.profiles[i].memory_slices) & mask != 0)
            .map(|&(i, s)| format!("{}@{}", model.profiles[i].name, s))
            .collect()
    };
    let placed_words: Vec<String> = placed
        .iter()
        .map(|&(i, s)| {
            let q = &model.profiles[i];
            format!("{}@{} ({})", q.name, s, describe_run(s, q.memory_slices))
        })
        .collect();
    let context = if placed_words.is_empty() {
        String::new()
    } else {
        format!(" after {}", placed_words.join(", "))
    };
    if let [only] = p.valid_starts.as_slice() {
        let who = occupants(*only);
        return format!(
            "placement: {} can only start at slice {}, which {} already {}{}",
            p.name,
            only,
            who.join(" and "),
            if who.len() == 1 { "occupies" } else { "occupy" },
            context
        );
    }
    let taken: Vec<String> = p
        .valid_starts
        .iter()
        .map(|&s| {
            let who = occupants(s);
            if who.is_empty() {
                format!("{s}: free")
            } else {
                format!("{s}: {}", who.join(" and "))
            }
        })
        .collect();
    format!(
        "placement: no free run of {} memory slice(s) for {} at its valid starts{} ({})",
        p.memory_slices,
        p.name,
        context,
        taken.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::plan;

    fn h100() -> &'static GpuModel {
        catalog::model("H100-80GB").unwrap()
    }

    fn layout(items: &[(&str, u32)]) -> Layout {
        items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    fn starts(ps: &[Placement]) -> Vec<(String, u8)> {
        ps.iter().map(|p| (p.profile.clone(), p.start)).collect()
    }

    #[test]
    fn mixed_layout_in_creation_order() {
        // 3g@0 would leave 1g needing slice 7, which no 1g may start at: 3g goes to 4.
        let ps = plan(
            h100(),
            &layout(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]),
        )
        .unwrap();
        let want: Vec<(String, u8)> = [
            ("3g.40gb", 4),
            ("2g.20gb", 0),
            ("1g.10gb", 2),
            ("1g.10gb", 3),
        ]
        .iter()
        .map(|(n, s)| (n.to_string(), *s))
        .collect();
        assert_eq!(starts(&ps), want);
        assert_eq!(ps[0].profile_id, 9);
        assert_eq!(ps[0].size, 4);
    }

    #[test]
    fn full_gpu_and_seven_small() {
        let ps = plan(h100(), &layout(&[("7g.80gb", 1)])).unwrap();
        assert_eq!(starts(&ps), vec![("7g.80gb".to_string(), 0)]);
        let ps = plan(h100(), &layout(&[("1g.10gb", 7)])).unwrap();
        assert_eq!(
            ps.iter().map(|p| p.start).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4, 5, 6]
        );
    }

    #[test]
    fn four_plus_three_fits_with_four_first() {
        let ps = plan(h100(), &layout(&[("3g.40gb", 1), ("4g.40gb", 1)])).unwrap();
        assert_eq!(
            starts(&ps),
            vec![("4g.40gb".to_string(), 0), ("3g.40gb".to_string(), 4)]
        );
    }

    #[test]
    fn empty_and_zero_counts_plan_nothing() {
        assert_eq!(plan(h100(), &Layout::new()).unwrap(), vec![]);
        assert_eq!(plan(h100(), &layout(&[("1g.10gb", 0)])).unwrap(), vec![]);
    }

    #[test]
    fn compute_rule_in_words() {
        let e = plan(
            h100(),
            &layout(&[("3g.40gb", 1), ("4g.40gb", 1), ("1g.10gb", 1)]),
        )
        .unwrap_err();
        assert!(
            e.reason.contains(
                "compute slices: 4g.40gb (4) + 3g.40gb (3) + 1g.10gb (1) need 8, exceeding 7"
            ),
            "{}",
            e.reason
        );
        assert!(!e.suggestions.is_empty());
    }

    #[test]
    fn memory_rule_in_words() {
        let e = plan(h100(), &layout(&[("1g.20gb", 4), ("1g.10gb", 1)])).unwrap_err();
        assert!(
            e.reason.contains("memory slices: the layout needs 9 of 8"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn max_per_gpu_rule_in_words() {
        let e = plan(h100(), &layout(&[("1g.10gb+me", 2)])).unwrap_err();
        assert!(
            e.reason
                .contains("1g.10gb+me: at most 1 per GPU (requested 2)"),
            "{}",
            e.reason
        );
        let mut one = Layout::new();
        one.insert("1g.10gb+me".into(), 1);
        assert_eq!(e.suggestions[0], one);
    }

    #[test]
    fn unknown_profile_lists_the_model_profiles() {
        let e = plan(h100(), &layout(&[("3g.20gb", 1), ("9g.1tb", 1)])).unwrap_err();
        assert!(
            e.reason
                .contains("unknown profile \"3g.20gb\", \"9g.1tb\" for H100-80GB"),
            "{}",
            e.reason
        );
        assert!(
            e.reason
                .contains("1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
            "{}",
            e.reason
        );
        assert!(
            e.reason
                .contains("the same shape on H100-80GB is \"3g.40gb\""),
            "{}",
            e.reason
        );
    }

    #[test]
    fn non_mig_model_is_a_clear_error() {
        let l40s = catalog::model("L40S").unwrap();
        for request in [&[("1g.10gb", 1)][..], &[]] {
            let e = plan(l40s, &layout(request)).unwrap_err();
            assert_eq!(
                e.reason,
                "mig_layout: L40S does not support MIG; leave mig_layout unset to use whole GPUs"
            );
            assert!(e.suggestions.is_empty());
        }
    }

    #[test]
    fn placements_never_overlap_and_respect_starts() {
        let m = h100();
        let ps = plan(m, &layout(&[("2g.20gb", 3), ("1g.10gb+me", 1)])).unwrap();
        let mut used = 0u16;
        for p in &ps {
            let prof = m.profile(&p.profile).unwrap();
            assert!(prof.valid_starts.contains(&p.start));
            let mask = slice_mask(p.start, p.size);
            assert_eq!(used & mask, 0);
            used |= mask;
        }
    }

    #[test]
    fn stuck_explanation_names_the_occupant() {
        let m = h100();
        let four = m.profiles.iter().position(|p| p.name == "4g.40gb").unwrap();
        let three = m.profiles.iter().position(|p| p.name == "3g.40gb").unwrap();
        let words = explain_stuck(m, &[(three, 0)], four);
        assert!(
            words.starts_with(
                "placement: 4g.40gb can only start at slice 0, which 3g.40gb@0 already occupies"
            ),
            "{words}"
        );
    }
}
