//! Each team's Slurm controller and login on the cluster's own nodes (issue 28, item 2),
//! on the multi-host tier with the platform's shared storage (a loop-mounted btrfs every
//! host sees at one path) and each team working from the client host with only its key and
//! its cluster's credentials.
//!
//! - Where things run: the primary controller and the login on the cluster's head node,
//!   a backup controller on its second node (`SlurmctldHost` twice, one state directory on
//!   the shared storage), and nothing of any team on the control plane's host (no Slurm,
//!   munge or ssh daemon, no account). The team's home is its volume, the same on the
//!   login and every node.
//! - `kill -9` of the control plane: both teams still log in, `sbatch` and `srun` and
//!   their jobs run; the control plane started again disturbs nothing (the same daemons run
//!   on) and a plan is empty.
//! - The head node quarantined (a failed health check): the controller and the login move
//!   to another node of the cluster (its backup), the credentials follow with the same
//!   host key, and the queue is intact: a running job runs on to its end, held and
//!   waiting jobs are still queued.
//!
//! Needs root, loop devices, btrfs-progs, Slurm and sshd (CI runs as root after
//! scripts/bootstrap.sh).

use std::time::Duration;

use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::shared_storage::SharedStorage;
use gpufleet_e2e::slurm_login::{cluster_nodes, credentials, shell_word, team_key, Session};
use gpufleet_e2e::{eventually, Terraform};
use serde_json::Value;

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(120);

/// Team `team`'s tenant, quota and cluster `name` of `nodes` nodes with a 1 GiB volume.
fn team(team: &str, name: &str, nodes: u32) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "{team}" {{
  name = "{team}"
}}
resource "gpufleet_gpu_quota" "{team}" {{
  tenant   = gpufleet_tenant.{team}.name
  gpu_type = "H100-80GB"
  gpus     = {nodes}
}}
resource "gpufleet_tenant_cluster" "{team}" {{
  tenant          = gpufleet_tenant.{team}.name
  name            = "{name}"
  orchestrator    = "slurm"
  gpu_type        = "H100-80GB"
  node_count      = {nodes}
  storage_gib     = 1
  ssh_public_keys = [file("${{path.module}}/{team}.pub")]
  depends_on      = [gpufleet_gpu_quota.{team}]
}}
"#
    )
}

/// The pids of `host`'s processes named `comm`.
fn pids(host: &Host, comm: &str) -> Vec<u32> {
    host.processes()
        .into_iter()
        .filter(|(_, c)| c == comm)
        .map(|(p, _)| p)
        .collect()
}

/// The pids of `host`'s listening sshd (not a session's own sshd processes, which are
/// its children).
fn logins(host: &Host) -> Vec<u32> {
    let parent = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok())
            })
    };
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    pids(host, "sshd")
        .into_iter()
        .filter(|p| match parent(*p) {
            Some(pp) => comm(pp).trim() != "sshd",
            None => true,
        })
        .collect()
}

/// What runs on the control plane's host but the control plane itself.
fn on_control_plane(cp: &Host) -> Vec<String> {
    cp.processes()
        .into_iter()
        .map(|(_, comm)| comm)
        .filter(|c| c != "gpufleet-agent")
        .collect()
}

/// The host name a controller line (`HOST(ADDR)`) names.
fn host_of(controller: &str) -> String {
    controller.split('(').next().unwrap_or_default().to_string()
}

/// The key of a known_hosts line (after its host pattern).
fn key_of(creds: &Value) -> String {
    let line = creds["known_hosts"].as_str().unwrap();
    line.split_once(' ').unwrap().1.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_and_logins_run_on_the_clusters_nodes_and_outlive_a_killed_control_plane() {
    netns::require("the multi-host Slurm head tests");
    let storage = SharedStorage::new(8);
    let shared = storage.arg();
    let mut agent_args = ONE_GPU_HOST.to_vec();
    agent_args.extend(["--shared-storage", &shared]);
    let Fleet {
        net,
        mut backend,
        agents,
    } = Fleet::start(
        &["g1", "g2", "g3", "g4"],
        &["--shared-storage", &shared],
        &agent_args,
        LIMIT,
    )
    .await;
    let (cp, client) = (net.host("cp"), net.host("client"));
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    let mut teams = Vec::new();
    for t in ["vision", "speech"] {
        let (key, public) = team_key(client, t);
        tf.write_file(&format!("{t}.pub"), &public);
        teams.push((t, key));
    }
    tf.write_main(&(team("vision", "train", 2) + &team("speech", "asr", 2)));
    tf.init();
    tf.apply();

    // Where things run, for each team.
    let mut heads = Vec::new();
    for (t, key) in &teams {
        let address = format!("gpufleet_tenant_cluster.{t}");
        let creds = credentials(&tf, &address);
        let nodes = cluster_nodes(&tf, &address);
        let session = Session::new(client, &creds, key);
        let head = creds["login_node"].as_str().unwrap().to_string();
        assert_eq!(head, nodes[0], "{t}: the head is its first node by name");
        assert_eq!(
            creds["host"].as_str(),
            Some(net.host(&head).addr().to_string().as_str()),
            "{t}: the login is at its head's address"
        );
        // The primary on the head, the backup on the other node, both by their hosts.
        let controllers = session.controllers();
        assert_eq!(
            controllers.iter().map(|c| host_of(c)).collect::<Vec<_>>(),
            nodes,
            "{t}: {controllers:?}"
        );
        for n in &nodes {
            assert_eq!(pids(net.host(n), "slurmctld").len(), 1, "{t}: {n}");
        }
        assert_eq!(logins(net.host(&head)).len(), 1, "{t}: the login");
        assert!(pids(net.host(&nodes[1]), "sshd").is_empty(), "{t}");
        // One state for both controllers, on the shared storage (root's alone), the
        // head's own.
        let name = creds["cluster"].as_str().unwrap();
        let config = session.ok("scontrol show config");
        let state = format!("{shared}/.slurm/{name}@{head}");
        assert!(
            config
                .lines()
                .any(|l| l.starts_with("StateSaveLocation") && l.trim_end().ends_with(&state)),
            "{config}"
        );
        let mode = std::fs::metadata(&state).map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o777
        });
        assert_eq!(mode.ok(), Some(0o700), "{state}");
        // The home is the team's volume, the same on the login and on every node.
        let volume = tf.resource(&address)["storage_path"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(session.ok("readlink -f $HOME").trim(), volume);
        session.ok(&format!(
            "srun -N1 -w {} sh -c 'hostname > $HOME/from-job'",
            nodes[1]
        ));
        assert_eq!(session.ok("cat $HOME/from-job").trim(), nodes[1]);
        heads.push((head, session, nodes));
    }
    // Nothing of any team on the control plane's host.
    assert_eq!(on_control_plane(cp), Vec::<String>::new());
    let uid = heads[0].1.ok("id -u").trim().to_string();
    assert!(!cp.run("getent", &["passwd", &uid]).status.success());
    let daemons = |h: &str| {
        let host = net.host(h);
        (pids(host, "slurmctld"), logins(host))
    };
    let before: Vec<_> = heads.iter().map(|(h, ..)| daemons(h)).collect();

    // kill -9 of the control plane: both teams work on.
    backend.crash();
    for (head, session, nodes) in &heads {
        assert_ne!(session.ok("id -u").trim(), "0");
        let ran = session.ok(&format!(
            "sbatch --wait --parsable -N1 -w {} --output=/dev/null --wrap {} && cat $HOME/while-down",
            nodes[1],
            shell_word("hostname > $HOME/while-down")
        ));
        assert_eq!(
            ran.lines().last().map(str::trim),
            Some(nodes[1].as_str()),
            "{ran}"
        );
        let mut answered: Vec<String> = session
            .ok("srun -N2 hostname")
            .lines()
            .map(|l| l.trim().to_string())
            .collect();
        answered.sort();
        assert_eq!(&answered, nodes, "{head}");
    }

    // Started again: nothing of the teams restarts, and a plan has nothing to do.
    backend.start_again();
    let admin = backend.admin().await;
    eventually("the GPU hosts' nodes ready again", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let nodes = admin.nodes().await;
            (nodes.len() == 4 && nodes.iter().all(|n| n.state == "ready")).then_some(())
        }
    })
    .await;
    eventually("both clusters running again", LIMIT, || {
        let mut admin = admin.clone();
        async move {
            let clusters = admin.inventory().await.clusters;
            (clusters.len() == 2 && clusters.iter().all(|c| c.status == "running")).then_some(())
        }
    })
    .await;
    tf.assert_no_changes();
    let after: Vec<_> = heads.iter().map(|(h, ..)| daemons(h)).collect();
    assert_eq!(
        after, before,
        "a daemon of a team restarted with the control plane"
    );
    for (_, session, nodes) in &heads {
        assert_eq!(session.ok("srun -N2 hostname").lines().count(), nodes.len());
    }
    assert_eq!(on_control_plane(cp), Vec::<String>::new());

    // Destroyed: the controllers' state goes with the clusters.
    tf.destroy();
    let left = std::fs::read_dir(format!("{shared}/.slurm"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_head_hands_its_controller_and_login_to_another_node_with_the_queue_intact() {
    netns::require("the multi-host Slurm head tests");
    let storage = SharedStorage::new(8);
    let shared = storage.arg();
    let mut agent_args = ONE_GPU_HOST.to_vec();
    agent_args.extend(["--shared-storage", &shared]);
    let gpu_hosts = ["g1", "g2", "g3"];
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &gpu_hosts,
        &["--shared-storage", &shared],
        &agent_args,
        LIMIT,
    )
    .await;
    let (cp, client) = (net.host("cp"), net.host("client"));
    let (key, public) = team_key(client, "vision");
    let tf = Terraform::on_host(client, &backend, backend.admin_token());
    tf.keep_credentials_in_state(); // reads the deprecated attributes
    tf.write_file("vision.pub", &public);
    let config = team("vision", "train", 2);
    tf.write_main(&config);
    tf.init();
    tf.apply();
    const VISION: &str = "gpufleet_tenant_cluster.vision";
    let before = credentials(&tf, VISION);
    let nodes = cluster_nodes(&tf, VISION);
    let (head, backup) = (nodes[0].clone(), nodes[1].clone());
    assert_eq!(before["login_node"].as_str(), Some(head.as_str()));
    let team = Session::new(client, &before, &key);

    // The queue: a job running on the backup's node until told to end, one held and one
    // that waits for its start time.
    let sbatch = |args: &str, script: &str| {
        team.ok(&format!(
            "sbatch --parsable --output=/dev/null {args} --wrap {}",
            shell_word(script)
        ))
        .trim()
        .to_string()
    };
    let running = sbatch(
        &format!("-N1 -w {backup}"),
        "until [ -e $HOME/go ]; do sleep 0.2; done; hostname > $HOME/done",
    );
    let held = sbatch("-H -N1", "true");
    let later = sbatch("--begin=now+1hour -N1", "true");
    eventually("the first job running", LIMIT, || {
        let state = team.poll(&format!("squeue -h -j {running} -o %T"));
        async move { state.is_some_and(|s| s.trim() == "RUNNING").then_some(()) }
    })
    .await;

    // The head fails a health check: quarantined, out of the cluster, replaced by g3.
    let at = gpu_hosts.iter().position(|h| *h == head).unwrap();
    std::fs::write(
        agents[at].data_dir().join("sim-faults.toml"),
        format!("[[ecc_burst]]\nnode = \"{head}\"\ngpu = 0\nuncorrected = 3\n"),
    )
    .unwrap();
    tf.write_main(&format!(
        r#"{config}
resource "gpufleet_health_check" "now" {{
  cluster_id = gpufleet_tenant_cluster.vision.id
  level      = "quick"
  triggers   = {{ round = "1" }}
}}
"#
    ));
    tf.apply();
    let spare = gpu_hosts
        .iter()
        .find(|h| !nodes.contains(&h.to_string()))
        .unwrap()
        .to_string();

    // The controller and the login move to the backup's node: the credentials follow,
    // with the same host key.
    let after = eventually("the login on the backup's node", LIMIT, || {
        tf.refresh();
        let creds = credentials(&tf, VISION);
        let moved = (creds["login_node"].as_str() == Some(backup.as_str())).then_some(creds);
        async move { moved }
    })
    .await;
    assert_eq!(
        cluster_nodes(&tf, VISION),
        vec![backup.clone(), spare.clone()],
        "the head was replaced"
    );
    assert_eq!(
        after["host"].as_str(),
        Some(net.host(&backup).addr().to_string().as_str())
    );
    assert_eq!(
        key_of(&after),
        key_of(&before),
        "the login keeps its host key"
    );
    assert_eq!(after["user"], before["user"]);
    let moved = Session::new(client, &after, &key);
    eventually("the moved login answering", LIMIT, || {
        let ok = moved.poll("squeue -h").is_some();
        async move { ok.then_some(()) }
    })
    .await;
    assert_eq!(
        moved
            .controllers()
            .iter()
            .map(|c| host_of(c))
            .collect::<Vec<_>>(),
        vec![backup.clone(), spare.clone()]
    );
    // The queue is intact.
    let queue = moved.ok("squeue -h -o '%i %T'");
    for (job, state) in [
        (&running, "RUNNING"),
        (&held, "PENDING"),
        (&later, "PENDING"),
    ] {
        assert!(
            queue.lines().any(|l| l.trim() == format!("{job} {state}")),
            "job {job} is not {state}: {queue}"
        );
    }
    moved.ok("touch $HOME/go");
    eventually("the running job done", LIMIT, || {
        let shown = moved.poll(&format!("scontrol show job {running}"));
        async move {
            shown
                .is_some_and(|s| s.contains("JobState=COMPLETED"))
                .then_some(())
        }
    })
    .await;
    assert_eq!(moved.ok("cat $HOME/done").trim(), backup);
    // Controllers on the cluster's two nodes now; none on the quarantined host, nor on the
    // control plane's; the old login no longer answers.
    for (h, count) in [(&backup, 1), (&spare, 1), (&head, 0)] {
        assert_eq!(pids(net.host(h), "slurmctld").len(), count, "{h}");
    }
    assert!(pids(net.host(&head), "sshd").is_empty());
    assert_eq!(on_control_plane(cp), Vec::<String>::new());
    let (ok, out) = team.run("id");
    assert!(!ok, "the old login still answers: {out}");
    let mut answered: Vec<String> = moved
        .ok("srun -N2 hostname")
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    answered.sort();
    assert_eq!(answered, vec![backup, spare]);
    tf.assert_no_changes();
    tf.write_main(&config);
    tf.destroy();
}
