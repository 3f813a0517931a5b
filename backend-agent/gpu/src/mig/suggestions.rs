//! Nearest valid layouts for a rejected request.
//!
//! Distance is the number of edits, where one edit drops one instance or shrinks one
//! instance to a smaller profile (no more compute and no more memory). Counts above a
//! profile's maximum are first clamped to it. After clamping a layout is a point in a
//! small grid (8*2*5*4*3*2*2 = 3840 points on these GPUs), so a breadth-first search over
//! the grid with a dense visited array and a cached feasibility table (one planner run
//! per grid point, once per geometry) is cheap. Among equally near layouts, those that
//! keep the most memory, then compute, come first.

use super::planner::fits;
use super::Layout;
use crate::catalog::GpuModel;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// How many suggestions a rejection carries at most.
pub const MAX_SUGGESTIONS: usize = 3;
/// Largest grid searched; beyond it (not the case for any catalog model) no suggestions.
const MAX_GRID: usize = 1 << 20;

/// Up to three distinct, valid, non-empty layouts closest to `counts`.
pub(crate) fn nearest(model: &GpuModel, counts: &[u32]) -> Vec<Layout> {
    let Some(grid) = Grid::new(model) else {
        return Vec::new();
    };
    let feasible = feasibility_table(model, &grid);
    let clamped: Vec<u32> = grid
        .radix
        .iter()
        .zip(counts)
        .map(|(&r, &c)| c.min(r - 1))
        .collect();
    let start = grid.index(&clamped);
    let mut found: Vec<usize> = Vec::new();
    let mut seen = vec![false; grid.size];
    seen[start] = true;
    let mut level = vec![start];
    let mut next = Vec::new();
    while !level.is_empty() && found.len() < MAX_SUGGESTIONS {
        let mut valid: Vec<usize> = level
            .iter()
            .copied()
            .filter(|&i| i != 0 && feasible[i])
            .collect();
        valid.sort_by_key(|&i| closeness_key(model, &grid, i));
        found.extend(valid.into_iter().take(MAX_SUGGESTIONS - found.len()));
        next.clear();
        for &i in &level {
            grid.for_each_edit(model, i, |j| {
                if !seen[j] {
                    seen[j] = true;
                    next.push(j);
                }
            });
        }
        std::mem::swap(&mut level, &mut next);
    }
    found.iter().map(|&i| grid.to_layout(model, i)).collect()
}

/// Mixed-radix numbering of count vectors: digit k counts profile k, 0..=max_per_gpu.
struct Grid {
    radix: Vec<u32>,
    /// Weight of one instance of profile k in the index.
    stride: Vec<usize>,
    size: usize,
}

impl Grid {
    fn new(model: &GpuModel) -> Option<Self> {
        let radix: Vec<u32> = model
            .profiles
            .iter()
            .map(|p| p.max_per_gpu as u32 + 1)
            .collect();
        let mut stride = Vec::with_capacity(radix.len());
        let mut size = 1usize;
        for &r in &radix {
            stride.push(size);
            size = size.checked_mul(r as usize)?;
        }
        (size > 1 && size <= MAX_GRID).then_some(Self {
            radix,
            stride,
            size,
        })
    }

    fn index(&self, counts: &[u32]) -> usize {
        counts
            .iter()
            .zip(&self.stride)
            .map(|(&c, &s)| c as usize * s)
            .sum()
    }

    fn count(&self, index: usize, k: usize) -> u32 {
        ((index / self.stride[k]) % self.radix[k] as usize) as u32
    }

    fn counts(&self, index: usize) -> Vec<u32> {
        (0..self.radix.len())
            .map(|k| self.count(index, k))
            .collect()
    }

    /// Calls `f` with every point one edit away: drop one instance, or shrink one to a
    /// smaller profile (never to the special-purpose +me profile).
    fn for_each_edit(&self, model: &GpuModel, index: usize, mut f: impl FnMut(usize)) {
        for (i, p) in model.profiles.iter().enumerate() {
            if self.count(index, i) == 0 {
                continue;
            }
            let dropped = index - self.stride[i];
            for (j, q) in model.profiles.iter().enumerate() {
                let smaller = j != i
                    && q.memory_slices <= p.memory_slices
                    && q.compute_slices <= p.compute_slices
                    && (q.memory_slices, q.compute_slices) != (p.memory_slices, p.compute_slices);
                if smaller && !q.name.ends_with("+me") && self.count(dropped, j) + 1 < self.radix[j]
                {
                    f(dropped + self.stride[j]);
                }
            }
            f(dropped);
        }
    }

    fn to_layout(&self, model: &GpuModel, index: usize) -> Layout {
        model
            .profiles
            .iter()
            .enumerate()
            .filter(|&(k, _)| self.count(index, k) > 0)
            .map(|(k, p)| (p.name.clone(), self.count(index, k)))
            .collect()
    }
}

/// Sort key: more memory slices kept, then more compute kept, then larger profiles.
fn closeness_key(
    model: &GpuModel,
    grid: &Grid,
    index: usize,
) -> (Reverse<u32>, Reverse<u32>, Reverse<Vec<u32>>) {
    let counts = grid.counts(index);
    let (mut memory, mut compute) = (0u32, 0u32);
    for (p, &n) in model.profiles.iter().zip(&counts) {
        memory += n * p.memory_slices as u32;
        compute += n * p.compute_slices as u32;
    }
    (
        Reverse(memory),
        Reverse(compute),
        Reverse(counts.into_iter().rev().collect()),
    )
}

/// Geometry of a model's profiles: feasibility depends on nothing else.
type GeometryKey = Vec<(u8, u8, Vec<u8>, u8)>;

/// Whether each grid point fits one GPU, computed once per geometry with the planner.
fn feasibility_table(model: &GpuModel, grid: &Grid) -> Arc<Vec<bool>> {
    static CACHE: OnceLock<Mutex<HashMap<GeometryKey, Arc<Vec<bool>>>>> = OnceLock::new();
    let key: GeometryKey = model
        .profiles
        .iter()
        .map(|p| {
            (
                p.compute_slices,
                p.memory_slices,
                p.valid_starts.clone(),
                p.max_per_gpu,
            )
        })
        .collect();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(table) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Arc::clone(table);
    }
    let table: Arc<Vec<bool>> = Arc::new(
        (0..grid.size)
            .map(|i| fits(model, &grid.counts(i)))
            .collect(),
    );
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, Arc::clone(&table));
    table
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
