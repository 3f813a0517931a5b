//! A rolling upgrade measured from a team's side (issue 39): on the multi-host tier (see
//! `tests/src/netns.rs`) a control plane and three GPU hosts, a two-node Slurm cluster with
//! a running two-node batch job, and a prober that, through the team's login, asks the
//! controller to accept a job (`sbatch --test-only`) one try after another.
//!
//! The upgrade: the control plane stopped and started again, then each host's node agent
//! in turn (SIGTERM, started again, the next once every node is ready). Measured: how long
//! the login and job submission were unavailable (the sum of the prober's outages, each
//! from its first failed try to the next success, and the longest), and what became of the
//! running job (its state and `Restarts` after the upgrade).
//!
//! Two rows from the same run: **before** (agents started with `--stop-workloads`, as every
//! agent behaved before its daemons outlived it: a stop ended the node's Slurm daemons and
//! jobs) and **now** (the default: the daemons, jobs and sessions run on and the next agent
//! adopts them). Prints a table; nothing is asserted about the times. Needs root.
//!
//! `cargo bench -p gpufleet-e2e --bench rolling_upgrade` (binaries: `GPUFLEET_AGENT_BIN`,
//! else `target/debug`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufleet_e2e::eventually;
use gpufleet_e2e::multihost::{nodes_ready, Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns;
use gpufleet_e2e::slurm_jobs::field;
use gpufleet_e2e::slurm_login::{
    credentials, shell_word, two_node_vision, vision_applied, Session,
};

const LIMIT: Duration = Duration::from_secs(180);
const VISION: &str = "gpufleet_tenant_cluster.vision";
const GPU_HOSTS: [&str; 3] = ["g1", "g2", "g3"];

struct Row {
    mode: &'static str,
    upgrade: Duration,
    unavailable: Duration,
    longest: Duration,
    job: String,
    /// The job's step processes still running on the GPU hosts (2 before the upgrade).
    steps: usize,
}

/// The processes running `sleep 1200` (the job's steps) on the GPU hosts of `net`.
fn steps(net: &netns::Network) -> usize {
    GPU_HOSTS
        .iter()
        .flat_map(|h| net.host(h).pids())
        .filter(|pid| {
            // srun runs the step by its full path: `/usr/bin/sleep 1200`.
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.len() == 3 && args[0].ends_with(b"sleep") && args[1] == b"1200"
            })
        })
        .count()
}

/// The prober's outages: from each first failed try to the next success.
#[derive(Default)]
struct Outages {
    since: Option<Instant>,
    all: Vec<Duration>,
}

impl Outages {
    fn record(&mut self, at: Instant, ok: bool) {
        match (ok, self.since) {
            (false, None) => self.since = Some(at),
            (true, Some(from)) => {
                self.all.push(at - from);
                self.since = None;
            }
            _ => {}
        }
    }
}

async fn run(mode: &'static str, agent_flags: &[&str]) -> Row {
    let mut args = [&ONE_GPU_HOST[..], agent_flags].concat();
    args.extend(["--keepalive", "1s"]);
    let Fleet {
        net,
        mut backend,
        mut agents,
    } = Fleet::start(
        &GPU_HOSTS,
        &["--node-timeout", "30s", "--replace-after", "10m"],
        &args,
        LIMIT,
    )
    .await;
    let client = net.host("client");
    let (tf, key) = vision_applied(client, &backend, &two_node_vision(""));
    let creds = credentials(&tf, VISION);
    let team = Session::new(client, &creds, &key);
    let job = team
        .ok(&format!(
            "sbatch --parsable -N2 -t 30 --output=/dev/null --wrap {}",
            shell_word("srun -N2 --ntasks-per-node=1 sleep 1200")
        ))
        .trim()
        .to_string();
    eventually("the job's steps running on both nodes", LIMIT, || {
        let running = steps(&net) == 2;
        async move { running.then_some(()) }
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let outages = Arc::new(Mutex::new(Outages::default()));
    let prober = {
        let (stop, outages) = (stop.clone(), outages.clone());
        let team = Session::new(client, &creds, &key);
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let at = Instant::now();
                let (ok, _) = team.run("sbatch --test-only -N1 --wrap true");
                outages.lock().unwrap().record(at, ok);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let started = Instant::now();
    backend.restart();
    nodes_ready(&backend, GPU_HOSTS.len(), LIMIT).await;
    for agent in agents.iter_mut() {
        agent.terminate();
        agent.wait_exit(LIMIT).expect("the agent stops");
        agent.restart();
        nodes_ready(&backend, GPU_HOSTS.len(), LIMIT).await;
    }
    let upgrade = started.elapsed();
    // The prober's last outage, if any, ends with its next success.
    eventually("the login and submission answering", LIMIT, || {
        let back = outages.lock().unwrap().since.is_none();
        async move { back.then_some(()) }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let _ = prober.join();
    let shown = team
        .poll(&format!("scontrol -o show job {job}"))
        .unwrap_or_default();
    let outages = outages.lock().unwrap();
    let row = Row {
        mode,
        upgrade,
        unavailable: outages.all.iter().sum(),
        longest: outages.all.iter().max().copied().unwrap_or_default(),
        job: format!(
            "{} Restarts={}",
            field(&shown, "JobState").unwrap_or("gone"),
            field(&shown, "Restarts").unwrap_or("-")
        ),
        steps: steps(&net),
    };
    let _ = team.run(&format!("scancel {job}"));
    tf.destroy();
    row
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    netns::require("the rolling upgrade benchmark");
    let rows = [
        run("before (--stop-workloads)", &["--stop-workloads"]).await,
        run("now (workloads outlive)", &[]).await,
    ];
    println!();
    println!("rolling upgrade of a 3-host fleet: serve, then each agent (SIGTERM, start)");
    println!(
        "| {:<26} | {:>10} | {:>28} | {:>16} | {:<24} | {:>14} |",
        "mode",
        "upgrade s",
        "login+sbatch unavailable s",
        "longest outage s",
        "running 2-node job after",
        "its steps left"
    );
    println!("|{}|", ["-"; 6].map(|_| "---").join("|"));
    for r in rows {
        println!(
            "| {:<26} | {:>10.1} | {:>28.1} | {:>16.1} | {:<24} | {:>9} of 2 |",
            r.mode,
            r.upgrade.as_secs_f64(),
            r.unavailable.as_secs_f64(),
            r.longest.as_secs_f64(),
            r.job,
            r.steps
        );
    }
}
