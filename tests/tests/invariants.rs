//! The randomized concurrent checker (issue 41) in CI's short budget: six clients of
//! three tenants create, resize and delete reservations and clusters over the gRPC API
//! for 20 s while `serve` is killed with `kill -9` and started again every 2 to 5 s; then
//! `gpufleet-agent check` reads the store (serve still running) and the log of every
//! acknowledged answer, and must find no violation: no instant overbooked, no quota
//! exceeded, no node in two clusters, gap-free tenant sequences, usage records counting
//! exactly the GPUs held (issue 42), every acknowledged
//! object as acknowledged (its create's request_id still leading to it) and every
//! acknowledged delete gone. The same check without the answers half-way, while the
//! clients write, finds none either; no call hangs (each try is answered or fails within
//! 30 s), and once every call is answered no cluster is left creating, updating or
//! deleting; and a forged answer is named.
//!
//! The same runs on PostgreSQL with three replicas (client `i` calls replica `i % 3`),
//! where a fault starts the replica killed before and kills one at random, the leader as
//! often as any: another takes the lease over, the node agents move to it, and calls to
//! the others are passed on to it. Every third fault kills the database server instead
//! (SIGKILL to all its processes) and starts it again at once: the replicas' connections
//! break under their calls, and what it acknowledged must be there after its recovery.
//!
//! The seed is printed; rerun one with `GPUFLEET_CHECKER_SEED=<seed>`. The long run is
//! `cargo bench -p gpufleet-e2e --bench invariants`.

use std::time::Duration;

use gpufleet_e2e::checker::{self, Engine, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_concurrent_admission_breaks_no_invariant_and_loses_no_answer() {
    run_and_check(Engine::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_postgres_killed_in_turn_break_no_invariant_and_lose_no_answer() {
    run_and_check(Engine::Postgres { replicas: 3 }).await;
}

async fn run_and_check(engine: Engine) {
    let seed = checker::seed();
    let outcome = checker::run(Settings {
        seed,
        tenants: 3,
        clients_per_tenant: 2,
        budget: Duration::from_secs(20),
        kills_every: Some((Duration::from_secs(2), Duration::from_secs(5))),
        engine,
    })
    .await;
    eprintln!(
        "{engine:?}, seed {seed}: {} operations, {} acknowledged, {} refused, {} retried, {} kills ({} of the database) in {:.1} s",
        outcome.operations,
        outcome.acknowledged,
        outcome.refused,
        outcome.retried,
        outcome.kills,
        outcome.database_kills,
        outcome.duration.as_secs_f64()
    );
    assert!(
        outcome.check_passed,
        "seed {seed} ({}={seed} to rerun): gpufleet-agent check found:\n{}",
        checker::SEED_ENV,
        outcome.check_output
    );
    assert!(outcome.check_output.contains(&format!(
        "no violation (capacity, quota, membership, sequences), and the {} acknowledged answers hold",
        outcome.acknowledged
    )), "{}", outcome.check_output);
    // Every change the clients asked for ended: none is left with nobody to carry it on.
    assert!(
        outcome.changing_left.is_empty(),
        "seed {seed}: clusters left changing: {:?}",
        outcome.changing_left
    );
    // Half-way, while the clients wrote, the store held every invariant too.
    eprintln!("half-way: {}", outcome.mid_run_output.trim());
    assert!(
        outcome.mid_run_passed,
        "seed {seed}: the check half-way found:\n{}",
        outcome.mid_run_output
    );
    // The run did what it is for: answers acknowledged across kills.
    assert!(outcome.kills >= 2, "seed {seed}: {} kills", outcome.kills);
    if let Engine::Postgres { .. } = engine {
        assert!(
            outcome.database_kills >= 1,
            "seed {seed}: {} kills, none of the database",
            outcome.kills
        );
    }
    assert!(
        outcome.acknowledged > 0 && outcome.refused > 0,
        "seed {seed}: {} acknowledged, {} refused",
        outcome.acknowledged,
        outcome.refused
    );

    // The same check holds the store to what it is told: an answer it never gave (a
    // create of a cluster that is not there) is named.
    let forged = outcome.answers_log.with_file_name("forged.jsonl");
    let mut log = std::fs::read_to_string(&outcome.answers_log).unwrap();
    log.push_str(r#"{"request_id":"forged-1","op":"create","kind":"cluster","object":{"id":"never-made","node_count":1}}"#);
    log.push('\n');
    std::fs::write(&forged, log).unwrap();
    let (passed, output) = outcome.plane.store().check(Some(&forged));
    assert!(!passed, "{output}");
    assert!(
        output
            .contains("answer: cluster never-made is missing, but create forged-1 acknowledged it")
            && output.contains(": 1 violation"),
        "{output}"
    );
}
