//! Planner benchmark: time per request over a large seeded random set of layout requests
//! on every MIG model, and the fraction placed against the exhaustive optimum.
//!
//! Run: `cargo bench -p gpufleet-gpu`. Prints a table; exits non-zero on any false accept
//! or false reject.

use gpufleet_gpu::catalog::{self, GpuModel};
use gpufleet_gpu::mig::{plan, Layout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const SEED: u64 = 0x6770_7566_6c65_6574;
const REQUESTS_PER_MODEL: usize = 20_000;

/// Every achievable count vector (indexed like the model's profiles), by enumerating
/// every set of non-overlapping placements: the exhaustive optimum to compare with.
fn achievable(model: &GpuModel) -> HashSet<Vec<u32>> {
    let cands: Vec<(usize, u8)> = model
        .profiles
        .iter()
        .enumerate()
        .flat_map(|(k, p)| p.valid_starts.iter().map(move |&s| (k, s)))
        .collect();
    let mut out = HashSet::new();
    let mut counts = vec![0u32; model.profiles.len()];
    walk(model, &cands, 0, [false; 8], 0, &mut counts, &mut out);
    out
}

fn walk(
    model: &GpuModel,
    cands: &[(usize, u8)],
    i: usize,
    used: [bool; 8],
    compute: u32,
    counts: &mut Vec<u32>,
    out: &mut HashSet<Vec<u32>>,
) {
    if i == cands.len() {
        out.insert(counts.clone());
        return;
    }
    walk(model, cands, i + 1, used, compute, counts, out);
    let (k, start) = cands[i];
    let p = &model.profiles[k];
    let (s, e) = (start as usize, start as usize + p.memory_slices as usize);
    if e > 8
        || compute + p.compute_slices as u32 > 7
        || counts[k] >= p.max_per_gpu as u32
        || used[s..e].iter().any(|&u| u)
    {
        return;
    }
    let mut taken = used;
    taken[s..e].iter_mut().for_each(|u| *u = true);
    counts[k] += 1;
    walk(
        model,
        cands,
        i + 1,
        taken,
        compute + p.compute_slices as u32,
        counts,
        out,
    );
    counts[k] -= 1;
}

/// Half the requests are drawn from the achievable set (feasible), half are random
/// counts up to max+1 per profile (mostly infeasible).
fn requests(model: &GpuModel, feasible: &[Vec<u32>], rng: &mut StdRng) -> Vec<Vec<u32>> {
    (0..REQUESTS_PER_MODEL)
        .map(|i| {
            if i % 2 == 0 {
                feasible[rng.gen_range(0..feasible.len())].clone()
            } else {
                model
                    .profiles
                    .iter()
                    .map(|p| rng.gen_range(0..=p.max_per_gpu as u32 + 1) * rng.gen_range(0..=1))
                    .collect()
            }
        })
        .collect()
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

#[derive(Default)]
struct Row {
    requests: usize,
    feasible: usize,
    placed: usize,
    false_accepts: usize,
    false_rejects: usize,
    accept_times: Vec<Duration>,
    reject_times: Vec<Duration>,
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// (mean, p50, p99) in µs.
fn stats(times: &mut [Duration]) -> (f64, f64, f64) {
    if times.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    times.sort_unstable();
    let mean = times.iter().map(|&d| micros(d)).sum::<f64>() / times.len() as f64;
    let pct = |q: f64| micros(times[((times.len() - 1) as f64 * q).round() as usize]);
    (mean, pct(0.5), pct(0.99))
}

fn main() {
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut rows: Vec<(String, Row)> = Vec::new();
    for model in catalog::mig_models() {
        let set = achievable(model);
        let mut feasible: Vec<Vec<u32>> = set.iter().cloned().collect();
        feasible.sort();
        let mut row = Row::default();
        for counts in requests(model, &feasible, &mut rng) {
            let layout = to_layout(model, &counts);
            let t0 = Instant::now();
            let result = std::hint::black_box(plan(model, std::hint::black_box(&layout)));
            let elapsed = t0.elapsed();
            let ok = set.contains(&counts);
            row.requests += 1;
            row.feasible += ok as usize;
            match (&result, ok) {
                (Ok(_), true) => row.placed += 1,
                (Ok(_), false) => row.false_accepts += 1,
                (Err(_), true) => row.false_rejects += 1,
                (Err(_), false) => {}
            }
            if result.is_ok() {
                row.accept_times.push(elapsed);
            } else {
                row.reject_times.push(elapsed);
            }
        }
        rows.push((model.name.clone(), row));
    }

    println!(
        "{:<11} {:>8} {:>8} {:>8} {:>7} {:>6} {:>6} | {:>21} | {:>21} | {:>21}",
        "model",
        "requests",
        "feasible",
        "placed",
        "placed%",
        "falseA",
        "falseR",
        "accept mean/p50/p99",
        "reject mean/p50/p99",
        "all mean/p50/p99 (us)"
    );
    let mut total = Row::default();
    let mut bad = 0;
    for (name, mut row) in rows {
        print_row(&name, &mut row);
        bad += row.false_accepts + row.false_rejects;
        total.requests += row.requests;
        total.feasible += row.feasible;
        total.placed += row.placed;
        total.false_accepts += row.false_accepts;
        total.false_rejects += row.false_rejects;
        total.accept_times.extend(row.accept_times);
        total.reject_times.extend(row.reject_times);
    }
    print_row("ALL", &mut total);
    println!(
        "seed {SEED:#x}; placed% = placed / feasible (exhaustive optimum); falseA = infeasible accepted; falseR = feasible rejected; rejects include computing suggestions"
    );
    if bad > 0 {
        eprintln!("planner is not exact: {bad} wrong answers");
        std::process::exit(1);
    }
}

fn print_row(name: &str, row: &mut Row) {
    let (am, a50, a99) = stats(&mut row.accept_times);
    let (rm, r50, r99) = stats(&mut row.reject_times);
    let mut all: Vec<Duration> = row
        .accept_times
        .iter()
        .chain(&row.reject_times)
        .copied()
        .collect();
    let (m, p50, p99) = stats(&mut all);
    println!(
        "{:<11} {:>8} {:>8} {:>8} {:>6.1}% {:>6} {:>6} | {:>6.2} {:>6.2} {:>7.2} | {:>6.2} {:>6.2} {:>7.2} | {:>6.2} {:>6.2} {:>7.2}",
        name,
        row.requests,
        row.feasible,
        row.placed,
        100.0 * row.placed as f64 / row.feasible.max(1) as f64,
        row.false_accepts,
        row.false_rejects,
        am, a50, a99, rm, r50, r99, m, p50, p99
    );
}
