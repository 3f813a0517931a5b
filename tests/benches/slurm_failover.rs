//! A Slurm cluster's controller failover measured (issue 28): head node lost to the first
//! `sbatch` accepted, on the multi-host tier (see `tests/src/netns.rs`) with the platform's
//! shared storage, for a two-node cluster (the primary controller and the login on its
//! head, the backup controller on its other node, one state directory on the shared
//! storage) and a spare host.
//!
//! At time 0 the head's host is cut off (its link down: a partition; the host stays up).
//! Two clocks run from there:
//!
//! - **Slurm's failover**: the team's account on the backup's host submits `sbatch` until
//!   one is accepted (the backup takes control once the primary has neither answered nor
//!   written its heartbeat to the state directory for `SlurmctldTimeout`, 10 s; each try
//!   waits for Slurm's own connect timeout to the lost primary first). The cut-off head
//!   still reaches the shared storage here and writes its heartbeat, so the backup stays
//!   standby and this clock ends with the controller restarted by gpufleet's move;
//! - **gpufleet's move**: the node is declared unreachable (`--node-timeout`), replaced
//!   (`--replace-after`) by the spare, and the control plane moves the controller and the
//!   login to the backup's node: until the cluster's credentials name it and an `sbatch`
//!   through that login is accepted.
//!
//! Prints a table; nothing is asserted about the times. Needs root (namespaces), loop
//! devices and btrfs-progs, Slurm and sshd. `ROUNDS` (default 1) repeats it.
//!
//! `cargo bench -p gpufleet-e2e --bench slurm_failover` (binaries: `GPUFLEET_AGENT_BIN`,
//! else `target/debug`).

use std::time::{Duration, Instant};

use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Launcher};
use gpufleet_e2e::shared_storage::SharedStorage;
use gpufleet_e2e::slurm_login::{credentials, team_key, two_node_vision, Session};
use gpufleet_e2e::{eventually, Terraform};
use gpufleet_proto::v1::GetTenantClusterRequest;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(300);
const VISION: &str = "gpufleet_tenant_cluster.vision";

/// One `sbatch` by the team's account on `host`, with that node's own slurm.conf (bounded
/// to 30 s): accepted, or what it said.
fn sbatch_on(host: &Launcher, cluster: &str, user: &str) -> Result<(), String> {
    let script = format!(
        "conf=$(ls /run/gpufleet/{cluster}/n*/slurm.conf | head -1); \
         timeout 30 runuser -u {user} -- env SLURM_CONF=$conf \
         sbatch --parsable -D /tmp --output=/dev/null --wrap true"
    );
    let out = host
        .command("sh")
        .args(["-c", &format!("cd /tmp && {script}")])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// Seconds from `t0` until Slurm's backup accepted a job and until gpufleet's moved login
/// did.
async fn round() -> (f64, f64) {
    let storage = SharedStorage::new(8);
    let shared = storage.arg();
    let mut agent_args = ONE_GPU_HOST.to_vec();
    agent_args.extend(["--shared-storage", &shared, "--keepalive", "1s"]);
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &["g1", "g2", "g3"],
        &[
            "--shared-storage",
            &shared,
            "--node-timeout",
            "2s",
            "--replace-after",
            "1s",
        ],
        &agent_args,
        LIMIT,
    )
    .await;
    let client = net.host("client");
    let (key, public) = team_key(client, "vision");
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &public);
    tf.write_main(&two_node_vision("  storage_gib     = 1\n"));
    tf.init();
    tf.apply();
    let creds = credentials(&tf, VISION);
    let id = tf.resource(VISION)["id"].as_str().unwrap().to_string();
    let (cluster, user) = (
        creds["cluster"].as_str().unwrap().to_string(),
        creds["user"].as_str().unwrap().to_string(),
    );
    let head = creds["login_node"].as_str().unwrap().to_string();
    let backup = {
        let mut nodes: Vec<String> = tf.resource(VISION)["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["hostname"].as_str().unwrap().to_string())
            .collect();
        nodes.retain(|n| *n != head);
        nodes.pop().unwrap()
    };
    if let Err(e) = sbatch_on(&net.host(&backup).launcher(), &cluster, &user) {
        panic!("sbatch on {backup} before the cut: {e}");
    }
    let admin = backend.admin().await;

    let t0 = Instant::now();
    net.host(&head).cut();
    // Both clocks at once: Slurm's on a thread of its own, gpufleet's here.
    let backup_host = net.host(&backup).launcher();
    let slurm = {
        let (cluster, user) = (cluster.clone(), user.clone());
        std::thread::spawn(move || loop {
            if sbatch_on(&backup_host, &cluster, &user).is_ok() {
                return t0.elapsed();
            }
            assert!(t0.elapsed() < LIMIT, "no sbatch accepted by the backup");
            std::thread::sleep(Duration::from_millis(200));
        })
    };
    let moved: Value = eventually("the login moved", LIMIT, || {
        let mut admin = admin.clone();
        let id = id.clone();
        let head = head.clone();
        async move {
            let c = admin
                .clusters
                .get_tenant_cluster(GetTenantClusterRequest { id })
                .await
                .ok()?
                .into_inner();
            let creds: Value = serde_json::from_str(&c.credentials).ok()?;
            (creds["login_node"].as_str() != Some(head.as_str())).then_some(creds)
        }
    })
    .await;
    let session = Session::new(client, &moved, &key);
    let gpufleet = loop {
        if session
            .poll("sbatch --parsable --output=/dev/null --wrap true")
            .is_some()
        {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < LIMIT,
            "no sbatch accepted by the moved login"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let slurm = slurm.join().expect("Slurm's clock");
    net.host(&head).heal();
    tf.destroy();
    drop(agents);
    drop(backend);
    (slurm.as_secs_f64(), gpufleet.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Some(why) = netns::unavailable() {
        println!("slurm_failover bench skipped: {why}");
        return;
    }
    if let Some(why) = gpufleet_e2e::shared_storage::missing() {
        println!("slurm_failover bench skipped: it needs {why}");
        return;
    }
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    println!(
        "| round | head lost -> first sbatch accepted by Slurm's backup | head lost -> controller and login moved, first sbatch through the login |"
    );
    println!("|---:|---:|---:|");
    for r in 1..=rounds {
        let (slurm, gpufleet) = round().await;
        println!("| {r} | {slurm:.1} s | {gpufleet:.1} s |");
    }
    println!();
    println!(
        "(SlurmctldTimeout 10 s; serve --node-timeout 2s --replace-after 1s; node --keepalive 1s)"
    );
}
