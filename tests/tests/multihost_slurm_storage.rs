//! Slurm jobs on team volumes, on the multi-host tier: two teams' Slurm clusters with
//! `storage_gib = 1` on the shared storage (a loop-mounted btrfs mounted before the hosts
//! are made, so every host sees it at the same path), each team working from the client
//! host with only its key and its cluster's credentials.
//!
//! - A job on one of the vision team's nodes writes to `storage_path`; a job on its other
//!   node reads it: the volume is the same on every node of the cluster, and the files
//!   are the cluster account's.
//! - A job writing past 1 GiB fails with "Disk quota exceeded"; the speech team's job
//!   still writes to its own volume.
//! - From the speech team's jobs the vision volume is not there (not mounted on its node),
//!   and from its login (on the control plane's host, which has the shared storage) the
//!   vision volume cannot be entered and the vision tenant's folder cannot be listed.
//! - Kept: destroyed with `storage_retention = "keep"` and made again under its name, the
//!   new cluster's jobs (another account) read the data as their own files.
//! - Destroy: no host has a volume mount and nothing is left on the shared storage.
//!
//! Needs root, loop devices, btrfs-progs, Slurm and sshd (CI runs as root after
//! scripts/bootstrap.sh).

use std::path::Path;
use std::time::Duration;

use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::shared_storage::SharedStorage;
use gpufleet_e2e::slurm_login::{credentials, team_key, Session};
use gpufleet_e2e::Terraform;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const VISION: &str = "gpufleet_tenant_cluster.vision";
const SPEECH: &str = "gpufleet_tenant_cluster.speech";
const GPU_HOSTS: [&str; 3] = ["g1", "g2", "g3"];

/// Both teams' clusters; the vision cluster with `vision`'s storage_retention, or none.
fn config(vision: Option<&str>) -> String {
    let cluster = |team: &str, name: &str, nodes: u32, retention: Option<&str>| {
        let tenant = format!(
            r#"
resource "gpufleet_tenant" "{team}" {{
  name = "{team}"
}}
resource "gpufleet_gpu_quota" "{team}" {{
  tenant   = gpufleet_tenant.{team}.name
  gpu_type = "H100-80GB"
  gpus     = {nodes}
}}
"#
        );
        let Some(retention) = retention else {
            return tenant;
        };
        tenant
            + &format!(
                r#"
resource "gpufleet_tenant_cluster" "{team}" {{
  tenant            = gpufleet_tenant.{team}.name
  name              = "{name}"
  orchestrator      = "slurm"
  gpu_type          = "H100-80GB"
  node_count        = {nodes}
  storage_gib       = 1
  storage_retention = "{retention}"
  ssh_public_keys   = [file("${{path.module}}/{team}.pub")]
  depends_on        = [gpufleet_gpu_quota.{team}]
}}
"#
            )
    };
    cluster("vision", "train", 2, vision) + &cluster("speech", "asr", 1, Some("delete"))
}

fn hosts_of(tf: &Terraform, address: &str) -> Vec<String> {
    tf.resource(address)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostname"].as_str().unwrap().to_string())
        .collect()
}

/// The volume mounts in `host`'s own mount namespace.
fn volume_mounts(host: &Host) -> Vec<String> {
    let out = host.run("cat", &["/proc/self/mountinfo"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Under it: the root itself is a mount of its own (see `gpufleet_slurm::sandbox`).
        .filter(|p| p.starts_with("/run/gpufleet/volumes/"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_jobs_share_their_teams_volume_across_nodes_and_only_their_team_can_reach_it() {
    netns::require("the multi-host Slurm storage tests");
    let storage = SharedStorage::new(8);
    let shared = storage.arg();
    let mut agent_args = ONE_GPU_HOST.to_vec();
    agent_args.extend(["--shared-storage", &shared]);
    let fleet = Fleet::start(
        &GPU_HOSTS,
        &["--shared-storage", &shared],
        &agent_args,
        LIMIT,
    )
    .await;
    let client = fleet.net.host("client");
    let (vision_key, vision_pub) = team_key(client, "vision");
    let (speech_key, speech_pub) = team_key(client, "speech");
    let tf = Terraform::on_host(client, &fleet.backend, fleet.backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &vision_pub);
    tf.write_file("speech.pub", &speech_pub);
    tf.write_main(&config(Some("delete")));
    tf.init();
    tf.apply();
    let vision = Session::new(client, &credentials(&tf, VISION), &vision_key);
    let speech = Session::new(client, &credentials(&tf, SPEECH), &speech_key);
    let v_path = tf.resource(VISION)["storage_path"]
        .as_str()
        .unwrap()
        .to_string();
    let s_path = tf.resource(SPEECH)["storage_path"]
        .as_str()
        .unwrap()
        .to_string();
    let v_hosts = hosts_of(&tf, VISION);
    assert_eq!(v_hosts.len(), 2);

    // Written by a job on one node, read by a job on the other, as the cluster's account.
    vision.ok(&format!(
        "srun -N1 -w {} sh -c 'hostname > {v_path}/from-first'",
        v_hosts[0]
    ));
    let read = vision.ok(&format!(
        "srun -N1 -w {} sh -c 'cat {v_path}/from-first; stat -c %U {v_path}/from-first'",
        v_hosts[1]
    ));
    let lines: Vec<&str> = read.lines().map(str::trim).collect();
    assert_eq!(
        lines,
        vec![v_hosts[0].as_str(), vision.user.as_str()],
        "{read}"
    );

    // Exactly 1 GiB, for this team only.
    let (ok, past) = vision.run(&format!(
        "srun -N1 dd if=/dev/zero of={v_path}/big bs=1M count=1200 conv=fsync"
    ));
    assert!(!ok && past.contains("Disk quota exceeded"), "{past}");
    speech.ok(&format!(
        "srun -N1 dd if=/dev/zero of={s_path}/big bs=1M count=600 conv=fsync"
    ));

    // The other team reaches nothing of it: not mounted on its node, and on the login's
    // host (which has the shared storage) neither the volume nor the tenant's folder opens.
    let (ok, out) = speech.run(&format!("srun -N1 ls {v_path}"));
    assert!(!ok, "speech's job lists vision's volume: {out}");
    let v_dir = format!(
        "{shared}/{}",
        v_path.trim_start_matches("/run/gpufleet/volumes/")
    );
    let v_tenant = Path::new(&v_dir).parent().unwrap().display().to_string();
    for probe in [
        format!("ls {v_dir}"),
        format!("cat {v_dir}/from-first"),
        format!("ls {v_tenant}"),
    ] {
        let (ok, out) = speech.run(&probe);
        // Refused, or not there at all: the login has a /tmp of its own, and the tests'
        // shared storage is under this machine's /tmp.
        assert!(
            !ok && (out.contains("Permission denied") || out.contains("No such file")),
            "{probe}: {out}"
        );
    }

    // Kept: the vision cluster destroyed with storage_retention = "keep", and made again
    // under its name (a new account), whose jobs read the data as their own files.
    tf.write_main(&config(Some("keep")));
    tf.apply();
    tf.write_main(&config(None));
    tf.apply();
    tf.write_main(&config(Some("delete")));
    tf.apply();
    let again = Session::new(client, &credentials(&tf, VISION), &vision_key);
    assert_ne!(again.user, vision.user, "a new cluster, a new account");
    assert_eq!(
        tf.resource(VISION)["storage_path"].as_str(),
        Some(v_path.as_str())
    );
    let read = again.ok(&format!(
        "srun -N1 sh -c 'cat {v_path}/from-first; stat -c %U {v_path}/from-first'"
    ));
    let lines: Vec<&str> = read.lines().map(str::trim).collect();
    assert_eq!(
        lines,
        vec![v_hosts[0].as_str(), again.user.as_str()],
        "{read}"
    );

    // Destroyed: no host has a volume mount, nothing is left on the shared storage.
    tf.destroy();
    for h in GPU_HOSTS {
        assert_eq!(
            volume_mounts(fleet.net.host(h)),
            Vec::<String>::new(),
            "{h}"
        );
    }
    assert_eq!(storage.subvolumes(), Vec::<String>::new());
    assert_eq!(storage.quota_groups(), Vec::<String>::new());
    drop(fleet);
}
