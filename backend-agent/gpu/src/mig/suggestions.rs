//! Nearest valid layouts for a rejected request.
//!
//! Distance is the number of edits, where one edit drops one instance or shrinks one
//! instance to a smaller profile (no more compute and no more memory). Counts above a
//! profile's maximum are first clamped to it. A breadth-first search over count vectors
//! (at most 8*2*5*4*3*2*2 states after clamping) returns the closest valid layouts,
//! preferring those that keep the most memory, then compute.

use super::planner::fits;
use super::Layout;
use crate::catalog::GpuModel;
use std::collections::HashSet;

/// How many suggestions a rejection carries at most.
pub const MAX_SUGGESTIONS: usize = 3;

/// Up to three distinct, valid, non-empty layouts closest to `counts`.
pub(crate) fn nearest(model: &GpuModel, counts: &[u32]) -> Vec<Layout> {
    let start: Vec<u32> = model
        .profiles
        .iter()
        .zip(counts)
        .map(|(p, &n)| n.min(p.max_per_gpu as u32))
        .collect();
    let mut found: Vec<Vec<u32>> = Vec::new();
    let mut seen: HashSet<Vec<u32>> = HashSet::from([start.clone()]);
    let mut level = vec![start];
    while !level.is_empty() && found.len() < MAX_SUGGESTIONS {
        let mut valid: Vec<Vec<u32>> = level
            .iter()
            .filter(|c| c.iter().any(|&n| n > 0) && fits(model, c))
            .cloned()
            .collect();
        valid.sort_by_key(|c| closeness_key(model, c));
        found.extend(valid.into_iter().take(MAX_SUGGESTIONS - found.len()));
        let mut next = Vec::new();
        for c in &level {
            for edited in edits(model, c) {
                if seen.insert(edited.clone()) {
                    next.push(edited);
                }
            }
        }
        level = next;
    }
    found.iter().map(|c| to_layout(model, c)).collect()
}

/// Sort key: more memory slices kept, then more compute kept, then a stable tie-break.
fn closeness_key(
    model: &GpuModel,
    counts: &[u32],
) -> (std::cmp::Reverse<u32>, std::cmp::Reverse<u32>, Vec<u32>) {
    let (mut memory, mut compute) = (0u32, 0u32);
    for (p, &n) in model.profiles.iter().zip(counts) {
        memory += n * p.memory_slices as u32;
        compute += n * p.compute_slices as u32;
    }
    let tie: Vec<u32> = counts.iter().rev().map(|&n| u32::MAX - n).collect();
    (std::cmp::Reverse(memory), std::cmp::Reverse(compute), tie)
}

/// Every layout one edit away: drop one instance, or shrink one to a smaller profile.
fn edits(model: &GpuModel, counts: &[u32]) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for (i, p) in model.profiles.iter().enumerate() {
        if counts[i] == 0 {
            continue;
        }
        let mut dropped = counts.to_vec();
        dropped[i] -= 1;
        for (j, q) in model.profiles.iter().enumerate() {
            let smaller = j != i
                && q.memory_slices <= p.memory_slices
                && q.compute_slices <= p.compute_slices
                && (q.memory_slices, q.compute_slices) != (p.memory_slices, p.compute_slices);
            // The +me profile is a special-purpose shape: never offer it as a shrink.
            if smaller && !q.name.ends_with("+me") && counts[j] < q.max_per_gpu as u32 {
                let mut shrunk = dropped.clone();
                shrunk[j] += 1;
                out.push(shrunk);
            }
        }
        out.push(dropped);
    }
    out
}

fn to_layout(model: &GpuModel, counts: &[u32]) -> Layout {
    model
        .profiles
        .iter()
        .zip(counts)
        .filter(|(_, &n)| n > 0)
        .map(|(p, &n)| (p.name.clone(), n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::mig::plan;

    fn layout(items: &[(&str, u32)]) -> Layout {
        items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    #[test]
    fn suggestions_are_valid_distinct_and_at_most_three() {
        let m = catalog::model("H100-80GB").unwrap();
        for req in [
            layout(&[("3g.40gb", 2), ("1g.10gb", 1)]),
            layout(&[("7g.80gb", 1), ("1g.10gb", 1)]),
            layout(&[("1g.10gb", 30)]),
            layout(&[("4g.40gb", 1), ("3g.40gb", 1), ("2g.20gb", 1)]),
        ] {
            let e = plan(m, &req).unwrap_err();
            assert!(!e.suggestions.is_empty(), "{req:?}");
            assert!(e.suggestions.len() <= MAX_SUGGESTIONS);
            for (i, s) in e.suggestions.iter().enumerate() {
                assert!(plan(m, s).is_ok(), "{s:?}");
                assert!(!e.suggestions[..i].contains(s));
            }
        }
    }

    #[test]
    fn shrinking_beats_dropping_when_it_keeps_more() {
        // 3g + 3g + 1g: shrinking the 1g is impossible; dropping it keeps 8 memory slices.
        let m = catalog::model("H100-80GB").unwrap();
        let e = plan(m, &layout(&[("3g.40gb", 2), ("1g.10gb", 1)])).unwrap_err();
        assert_eq!(e.suggestions[0], layout(&[("3g.40gb", 2)]));
    }

    #[test]
    fn too_many_is_clamped_to_the_maximum() {
        let m = catalog::model("A100-40GB").unwrap();
        let e = plan(m, &layout(&[("1g.5gb", 9)])).unwrap_err();
        assert_eq!(e.suggestions[0], layout(&[("1g.5gb", 7)]));
    }
}
