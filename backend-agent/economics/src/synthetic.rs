//! A seeded synthetic trace for tests and benchmarks (the simple CSV layout): each team's
//! jobs come in bursts (5 to 20 jobs within ten minutes, at a time drawn over the whole
//! trace), so the teams' busy hours rarely line up: the demand pooling is for. A job asks
//! for 1, 2, 4, 8 or 16 GPUs (at most its team's quota) of one of its team's models for 10
//! minutes to 6 hours (log-uniform); the trace is as long as it takes for what the jobs
//! hold (whole nodes) to come to 70% of the pool's GPU-hours. The same fleet, rows and
//! seed give the same trace.

use std::fmt::Write;

use crate::fleet::{Fleet, Quota};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const SIZES: [i64; 5] = [1, 2, 4, 8, 16];
const LOAD: f64 = 0.7;

struct Drawn {
    team: usize,
    gpu_type: String,
    gpus: i64,
    duration: i64,
    held_gpu_seconds: f64,
}

/// `rows` jobs for `fleet`'s teams that have a quota, as the simple CSV.
pub fn generate(fleet: &Fleet, rows: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    let takers: Vec<(usize, &Quota)> = fleet
        .teams
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.quotas.iter().map(move |q| (i, q)))
        .filter(|(_, q)| q.gpus + q.burst_gpus > 0)
        .collect();
    let mut out = String::from("team,gpu_type,gpus,submit,duration\n");
    if takers.is_empty() {
        return out;
    }
    let weight_total: i64 = takers.iter().map(|(_, q)| q.gpus + q.burst_gpus).sum();
    let mut drawn = Vec::with_capacity(rows);
    for _ in 0..rows {
        let mut pick = rng.below(weight_total as u64) as i64;
        let &(team, q) = takers
            .iter()
            .find(|(_, q)| {
                pick -= q.gpus + q.burst_gpus;
                pick < 0
            })
            .expect("a pick below the total lands on a quota");
        let limit = q.gpus + q.burst_gpus;
        let gpus = SIZES[rng.below(SIZES.len() as u64) as usize].min(limit);
        // 10 minutes to 6 hours, log-uniform.
        let duration = (600.0 * 36f64.powf(rng.unit())) as i64;
        let gpn = fleet.model(&q.gpu_type).expect("validated").gpus_per_node;
        let held = ((gpus + gpn - 1) / gpn * gpn * duration) as f64;
        drawn.push(Drawn {
            team,
            gpu_type: q.gpu_type.clone(),
            gpus,
            duration,
            held_gpu_seconds: held,
        });
    }
    let pool_gpus: i64 = fleet.models.iter().map(|m| m.pool_gpus()).sum();
    let held: f64 = drawn.iter().map(|d| d.held_gpu_seconds).sum();
    let span = (held / (LOAD * pool_gpus.max(1) as f64)).max(3_600.0) as u64;
    // Bursts of 5 to 20 of a team's jobs, each burst at a random time of the span.
    let mut burst: Vec<(u64, usize)> = vec![(0, 0); fleet.teams.len()];
    for d in &drawn {
        let (start, left) = &mut burst[d.team];
        if *left == 0 {
            *start = rng.below(span);
            *left = 5 + rng.below(16) as usize;
        }
        *left -= 1;
        let submit = *start + rng.below(600);
        let _ = writeln!(
            out,
            "{},{},{},{},{}",
            fleet.teams[d.team].name, d.gpu_type, d.gpus, submit, d.duration
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_same_seed_gives_the_same_trace_and_it_reads_back() {
        let fleet = crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 4\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16, burst_gpus = 8 }]\n\
             [[team]]\nname = \"b\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 4 }]\n",
        )
        .unwrap();
        let one = generate(&fleet, 500, 7);
        assert_eq!(one, generate(&fleet, 500, 7));
        assert_ne!(one, generate(&fleet, 500, 8));
        let trace = crate::trace::parse(Path::new("synthetic.csv"), &one, &fleet).unwrap();
        assert_eq!(trace.jobs.len(), 500);
        // Team b asks for at most its quota of 4.
        assert!(trace
            .jobs
            .iter()
            .filter(|j| j.team == 1)
            .all(|j| j.gpus <= 4));
        assert!(trace.jobs.iter().any(|j| j.team == 1) && trace.jobs.iter().any(|j| j.team == 0));
    }
}
