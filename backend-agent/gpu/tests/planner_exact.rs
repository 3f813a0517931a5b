//! The planner is exact: it accepts a layout iff some set of placements realises it.
//!
//! The reference is an exhaustive enumeration of every set of non-overlapping placements
//! on the 7-compute / 8-memory-slice geometry, written here independently of the planner
//! (its own copy of the geometry table, its own overlap test over slice vectors).

use gpufleet_gpu::catalog::{self, GpuModel};
use gpufleet_gpu::mig::{plan, Layout};
use proptest::prelude::*;
use std::collections::HashSet;
use std::sync::OnceLock;

/// (profile id, compute slices, memory slices, valid starts, max per GPU), from the MIG
/// user guide table in shared/reference/gpu-facts.md.
const TABLE: [(u32, u32, usize, &[usize], u32); 7] = [
    (19, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 7),
    (20, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 1),
    (15, 1, 2, &[0, 2, 4, 6], 4),
    (14, 2, 2, &[0, 2, 4], 3),
    (9, 3, 4, &[0, 4], 2),
    (5, 4, 4, &[0], 1),
    (0, 7, 8, &[0], 1),
];

type Counts = [u32; 7];

/// Every achievable per-profile count vector (indexed like TABLE).
fn achievable() -> &'static HashSet<Counts> {
    static SET: OnceLock<HashSet<Counts>> = OnceLock::new();
    SET.get_or_init(|| {
        let candidates: Vec<(usize, usize)> = TABLE
            .iter()
            .enumerate()
            .flat_map(|(p, row)| row.3.iter().map(move |&s| (p, s)))
            .collect();
        let mut out = HashSet::new();
        let mut slices = [false; 8];
        let mut counts = [0u32; 7];
        enumerate(&candidates, 0, &mut slices, 0, &mut counts, &mut out);
        out
    })
}

fn enumerate(
    cands: &[(usize, usize)],
    i: usize,
    slices: &mut [bool; 8],
    compute: u32,
    counts: &mut Counts,
    out: &mut HashSet<Counts>,
) {
    if i == cands.len() {
        out.insert(*counts);
        return;
    }
    // Leave candidate i out.
    enumerate(cands, i + 1, slices, compute, counts, out);
    // Or take it, if it fits.
    let (p, start) = cands[i];
    let (_, c, size, _, max) = TABLE[p];
    let end = start + size;
    if end > 8 || compute + c > 7 || counts[p] + 1 > max {
        return;
    }
    if slices[start..end].iter().any(|&used| used) {
        return;
    }
    slices[start..end].iter_mut().for_each(|s| *s = true);
    counts[p] += 1;
    enumerate(cands, i + 1, slices, compute + c, counts, out);
    counts[p] -= 1;
    slices[start..end].iter_mut().for_each(|s| *s = false);
}

fn to_layout(model: &GpuModel, counts: &Counts) -> Layout {
    TABLE
        .iter()
        .zip(counts)
        .filter(|(_, &n)| n > 0)
        .map(|(row, &n)| (model.profile_by_id(row.0).unwrap().name.clone(), n))
        .collect()
}

fn to_counts(model: &GpuModel, layout: &Layout) -> Counts {
    let mut c = [0u32; 7];
    for (name, &n) in layout {
        let id = model.profile(name).unwrap().id;
        let p = TABLE.iter().position(|row| row.0 == id).unwrap();
        c[p] += n;
    }
    c
}

/// Checks an accepted plan against the rules, independently of the planner.
fn assert_valid_placements(model: &GpuModel, counts: &Counts) {
    let placements = plan(model, &to_layout(model, counts)).unwrap();
    let mut slices = [false; 8];
    let mut got = [0u32; 7];
    let mut compute = 0;
    let mut last_size = usize::MAX;
    for pl in &placements {
        let p = TABLE.iter().position(|row| row.0 == pl.profile_id).unwrap();
        let (_, c, size, starts, _) = TABLE[p];
        assert_eq!(pl.size as usize, size);
        assert!(starts.contains(&(pl.start as usize)), "{pl:?}");
        let (s, e) = (pl.start as usize, pl.start as usize + size);
        assert!(slices[s..e].iter().all(|&u| !u), "overlap at {pl:?}");
        slices[s..e].iter_mut().for_each(|u| *u = true);
        assert!(
            size <= last_size,
            "creation order must be larger first: {placements:?}"
        );
        last_size = size;
        compute += c;
        got[p] += 1;
    }
    assert!(compute <= 7);
    assert_eq!(&got, counts);
}

fn check_request(model: &GpuModel, counts: &Counts) {
    let layout = to_layout(model, counts);
    let feasible = achievable().contains(counts);
    match plan(model, &layout) {
        Ok(_) => {
            assert!(feasible, "{}: false accept of {layout:?}", model.name);
            assert_valid_placements(model, counts);
        }
        Err(e) => {
            assert!(
                !feasible,
                "{}: false reject of {layout:?}: {}",
                model.name, e.reason
            );
            assert!(!e.reason.is_empty());
            assert!(e.suggestions.len() <= 3);
            for (i, s) in e.suggestions.iter().enumerate() {
                assert!(
                    achievable().contains(&to_counts(model, s)),
                    "invalid suggestion {s:?}"
                );
                assert!(
                    !e.suggestions[..i].contains(s),
                    "duplicate suggestion {s:?}"
                );
            }
        }
    }
}

#[test]
fn catalog_geometry_matches_the_reference_table() {
    for m in catalog::mig_models() {
        for (id, c, size, starts, max) in TABLE {
            let p = m.profile_by_id(id).unwrap();
            assert_eq!(p.compute_slices as u32, c, "{} {}", m.name, p.name);
            assert_eq!(p.memory_slices as usize, size, "{} {}", m.name, p.name);
            let s: Vec<usize> = p.valid_starts.iter().map(|&s| s as usize).collect();
            assert_eq!(s, starts, "{} {}", m.name, p.name);
            assert_eq!(p.max_per_gpu as u32, max, "{} {}", m.name, p.name);
        }
    }
}

#[test]
fn reference_enumeration_is_sane() {
    let set = achievable();
    assert!(set.contains(&[7, 0, 0, 0, 0, 0, 0]));
    assert!(set.contains(&[0, 0, 0, 0, 1, 1, 0])); // 4g + 3g
    assert!(set.contains(&[2, 0, 0, 1, 1, 0, 0])); // 3g + 2g + 2 x 1g
    assert!(!set.contains(&[1, 0, 0, 0, 1, 1, 0])); // compute 8
    assert!(!set.contains(&[0, 0, 0, 0, 0, 2, 0])); // 4g twice
    assert!(!set.contains(&[8, 0, 0, 0, 0, 0, 0]));
}

/// A fact the enumeration reveals about this geometry: whenever the per-profile maxima,
/// the compute sum (<= 7) and the memory sum (<= 8) hold, some placement exists. So the
/// planner's placement search never dead-ends on catalog models; its placement
/// explanation exists for other geometries (and the simulator explains bad creates).
#[test]
fn count_rules_alone_decide_feasibility_on_this_geometry() {
    let ranges: Vec<u32> = TABLE.iter().map(|row| row.4 + 1).collect();
    let total: u32 = ranges.iter().product();
    let mut sums_ok = 0;
    for mut i in 0..total {
        let mut counts = [0u32; 7];
        for (k, r) in ranges.iter().enumerate() {
            counts[k] = i % r;
            i /= r;
        }
        let compute: u32 = TABLE.iter().zip(&counts).map(|(row, n)| row.1 * n).sum();
        let memory: usize = TABLE
            .iter()
            .zip(&counts)
            .map(|(row, &n)| row.2 * n as usize)
            .sum();
        let sums = compute <= 7 && memory <= 8;
        sums_ok += sums as u32;
        assert_eq!(sums, achievable().contains(&counts), "{counts:?}");
    }
    assert_eq!(sums_ok as usize, achievable().len());
}

/// Every count vector with each count in 0..=max+1, on one model: a complete sweep.
#[test]
fn exhaustive_sweep_on_h100() {
    let model = catalog::model("H100-80GB").unwrap();
    let ranges: Vec<u32> = TABLE.iter().map(|row| row.4 + 2).collect();
    let mut counts = [0u32; 7];
    let mut checked = 0;
    loop {
        check_request(model, &counts);
        checked += 1;
        let mut k = 0;
        loop {
            if k == 7 {
                assert_eq!(checked, ranges.iter().product::<u32>());
                return;
            }
            counts[k] += 1;
            if counts[k] < ranges[k] {
                break;
            }
            counts[k] = 0;
            k += 1;
        }
    }
}

fn request() -> impl Strategy<Value = (usize, Counts)> {
    let counts = (
        0u32..10,
        0u32..3,
        0u32..6,
        0u32..5,
        0u32..4,
        0u32..3,
        0u32..3,
    )
        .prop_map(|(a, b, c, d, e, f, g)| [a, b, c, d, e, f, g]);
    (0..catalog::mig_models().len(), counts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn planner_agrees_with_exhaustive_search((model_idx, counts) in request()) {
        check_request(catalog::mig_models()[model_idx], &counts);
    }

    /// Feasible requests drawn from the achievable set itself (random requests are
    /// mostly infeasible), across all models.
    #[test]
    fn every_achievable_layout_is_placed(model_idx in 0..catalog::mig_models().len(), pick in any::<prop::sample::Index>()) {
        let mut all: Vec<&Counts> = achievable().iter().collect();
        all.sort();
        let counts = *pick.get(&all);
        check_request(catalog::mig_models()[model_idx], counts);
    }
}
