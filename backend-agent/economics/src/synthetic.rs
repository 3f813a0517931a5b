//! A seeded synthetic trace for tests and benchmarks (the simple CSV layout): each team's
//! jobs come in bursts (5 to 20 jobs within ten minutes, at a time drawn over the whole
//! trace), so the teams' busy hours rarely line up: the demand pooling is for. A job asks
//! for 1, 2, 4, 8 or 16 GPUs (at most its team's quota) of one of its team's models for 10
//! minutes to 6 hours (log-uniform); the trace is as long as it takes for what the jobs
//! hold (whole nodes) to come to 70% of the pool's GPU-hours. Where the fleet lists
//! `mig_profiles` for a model, a quarter of that model's jobs ask instead for 1 to 2 GPUs'
//! worth of instances of one of them (at most its team's quota in GPUs), in a last column
//! `mig_profile` (present only then, so a fleet without MIG gets the trace it always got).
//! The same fleet, rows and seed give the same trace.

use std::fmt::Write;

use crate::fleet::{Fleet, Quota};
use crate::mig::Slices;

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
    /// GPUs, or instances of `mig`'s profile.
    gpus: i64,
    mig: Option<String>,
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
    let with_mig = fleet.models.iter().any(|m| !m.mig_profiles.is_empty());
    let mut out = String::from("team,gpu_type,gpus,submit,duration");
    out.push_str(if with_mig { ",mig_profile\n" } else { "\n" });
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
        let model = fleet.model(&q.gpu_type).expect("validated");
        let mut gpus = SIZES[rng.below(SIZES.len() as u64) as usize].min(limit);
        // Drawn only for a model with MIG profiles: other fleets' traces stay as they were.
        let mut mig = None;
        if !model.mig_profiles.is_empty() && rng.below(4) == 0 {
            let profile = &model.mig_profiles[rng.below(model.mig_profiles.len() as u64) as usize];
            let per_gpu = Slices::ask(&q.gpu_type, profile, 1)
                .expect("validated with the fleet")
                .per_gpu;
            let count = 1 + rng.below((per_gpu * limit.min(2)) as u64) as i64;
            mig = Some((profile.clone(), count));
            gpus = (count + per_gpu - 1) / per_gpu;
        }
        // 10 minutes to 6 hours, log-uniform.
        let duration = (600.0 * 36f64.powf(rng.unit())) as i64;
        let gpn = model.gpus_per_node;
        let held = ((gpus + gpn - 1) / gpn * gpn * duration) as f64;
        drawn.push(Drawn {
            team,
            gpu_type: q.gpu_type.clone(),
            gpus: mig.as_ref().map_or(gpus, |(_, count)| *count),
            mig: mig.map(|(profile, _)| profile),
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
        let _ = write!(
            out,
            "{},{},{},{},{}",
            fleet.teams[d.team].name, d.gpu_type, d.gpus, submit, d.duration
        );
        if with_mig {
            let _ = write!(out, ",{}", d.mig.as_deref().unwrap_or_default());
        }
        out.push('\n');
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

    /// A fleet that lists MIG profiles gets MIG rows, seeded like the rest, each within
    /// its team's quota in GPUs and read back through the trace's MIG checks; a fleet
    /// without keeps its old header.
    #[test]
    fn a_fleet_with_mig_profiles_gets_seeded_mig_rows() {
        let fleet = crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 4\nmig_profiles = [\"1g.10gb\", \"3g.40gb\"]\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16, burst_gpus = 8 }]\n\
             [[team]]\nname = \"b\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 1 }]\n",
        )
        .unwrap();
        let text = generate(&fleet, 400, 11);
        assert_eq!(text, generate(&fleet, 400, 11));
        assert!(text.starts_with("team,gpu_type,gpus,submit,duration,mig_profile\n"));
        let trace = crate::trace::parse(Path::new("synthetic.csv"), &text, &fleet).unwrap();
        let mig: Vec<&crate::trace::Job> = trace.jobs.iter().filter(|j| j.mig.is_some()).collect();
        assert!(
            mig.len() > 50 && mig.len() < 150,
            "{} MIG rows of 400",
            mig.len()
        );
        for profile in ["1g.10gb", "3g.40gb"] {
            assert!(mig
                .iter()
                .any(|j| j.mig.as_ref().unwrap().profile == profile));
        }
        // b's quota is 1 GPU: its MIG rows fit one GPU.
        assert!(trace
            .jobs
            .iter()
            .filter(|j| j.team == 1)
            .all(|j| j.gpus <= 1));
        let plain = crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 4\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16 }]\n",
        )
        .unwrap();
        assert!(generate(&plain, 10, 11).starts_with("team,gpu_type,gpus,submit,duration\n"));
    }

    #[test]
    fn a_mig_profile_the_model_has_not_is_refused_in_the_fleet() {
        let e = crate::fleet::parse(
            Path::new("fleet.toml"),
            "[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = 4\nmig_profiles = [\"1g.5gb\"]\n\
             [[team]]\nname = \"a\"\nquota = [{ gpu_type = \"H100-80GB\", gpus = 16 }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "fleet.toml:4:17: pool.mig_profile: '1g.5gb' is not a MIG profile of H100-80GB"
            ),
            "{e}"
        );
    }
}
