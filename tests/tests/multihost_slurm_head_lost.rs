//! A team's batch jobs when its Slurm cluster's head node is lost out of reach, on the
//! multi-host tier (`gpufleet_e2e::netns`) with the platform's shared storage: a control
//! plane, three GPU hosts with a node agent each, and a client host the team works from.
//!
//! A two-node cluster on shared storage has its primary controller and login on its head
//! and a backup controller on its other node (one state directory on the shared storage).
//! It runs two of a team's batch jobs across both nodes (`sbatch -N2`, not pinned to any
//! node), one of them submitted with `--no-requeue`. The head's host is cut off from the
//! network (not from the shared storage, a local mount here: its primary controller runs
//! on and keeps the backup standby with its heartbeat there). Nothing is set down first;
//! then, as docs/guides/slurm.md ("A lost node's jobs", "When the head node goes") says:
//!
//! - the control plane finds the head unreachable, replaces it with the spare host, and
//!   moves the controller and the login to the backup's node: the credentials Terraform
//!   reads after a refresh name it (`login_node`), with the same host key, and the team
//!   reaches its cluster through it; the controller restarted there with the new node set
//!   recovers the jobs from the shared state;
//! - the batch job submitted with `--no-requeue` ends (`NODE_FAIL`) and does not run again;
//! - the other is requeued, keeps its job id, runs again once (`SLURM_RESTART_COUNT` 1) on
//!   the nodes the cluster has now (the former backup, now head, and the replacement) and
//!   completes there (`ExitCode` 0:0);
//! - the lost host, back, is left with nothing of the cluster (its agent, told the node
//!   left, stops the controller, the login and the first run's steps there);
//! - what the cut-off controller saved meanwhile, and at its stop, reached no one: the
//!   controllers on the backup's node run on a state directory of their own head (seeded
//!   from the one before, which is gone), and the controller there, killed and started
//!   again by its supervisor, reads back the queue as it was.
//!
//! The jobs' steps write `<job id> <restart count> <hostname>` to the team's home (its
//! volume on the shared storage, the same on every node), then wait for a file the test
//! makes there.
//!
//! Needs root, loop devices, btrfs-progs, Slurm and sshd (CI runs as root after
//! scripts/bootstrap.sh); without them the test fails naming what is missing.

use std::time::Duration;

use gpufleet_e2e::eventually;
use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::shared_storage::SharedStorage;
use gpufleet_e2e::slurm_jobs::{
    assert_completes_on, assert_ended_with_the_node, assert_running_again, controller_log, field,
    submit_two, written,
};
use gpufleet_e2e::slurm_login::{
    cluster_nodes, credentials, two_node_vision, vision_applied, Session,
};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(120);
/// The wait for the requeued job to run again: the head is replaced first, and Slurm holds
/// a requeued job back for a while before it may start again (its begin time).
const REQUEUE_LIMIT: Duration = Duration::from_secs(360);
const VISION: &str = "gpufleet_tenant_cluster.vision";
const GPU_HOSTS: [&str; 3] = ["g1", "g2", "g3"];
/// What a node of a Slurm cluster runs on its host (the login: sshd on the head).
const OF_THE_CLUSTER: [&str; 4] = ["slurmctld", "slurmd", "slurmstepd", "sshd"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_heads_batch_jobs_are_requeued_and_its_login_moves_to_the_backups_node() {
    netns::require("the multi-host Slurm tests");
    let storage = SharedStorage::new(8);
    let shared = storage.arg();
    let mut agent_args = ONE_GPU_HOST.to_vec();
    // A requeued job is held back 10 s + 1 s, not Slurm's default 120 s + 1 s (see
    // docs/guides/slurm.md, "A lost node's jobs").
    agent_args.extend([
        "--shared-storage",
        &shared,
        "--keepalive",
        "1s",
        "--slurm-cred-expire",
        "10",
    ]);
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &GPU_HOSTS,
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
    let (tf, key) = vision_applied(
        client,
        &backend,
        &two_node_vision("  storage_gib     = 1\n"),
    );
    let before = credentials(&tf, VISION);
    let home = before["home"].as_str().unwrap().to_string();
    let team = Session::new(client, &before, &key);
    let nodes = cluster_nodes(&tf, VISION);
    assert_eq!(nodes.len(), 2);
    let head = before["login_node"].as_str().unwrap().to_string();
    let backup = nodes.iter().find(|n| **n != head).unwrap().clone();
    let spare = GPU_HOSTS
        .iter()
        .find(|h| !nodes.contains(&h.to_string()))
        .unwrap()
        .to_string();
    let agent_of = |h: &str| &agents[GPU_HOSTS.iter().position(|g| *g == h).unwrap()];
    // A backup controller: the primary on the head, the backup on the other node.
    let controllers: Vec<String> = team
        .controllers()
        .iter()
        .map(|c| c.split('(').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(controllers, vec![head.clone(), backup.clone()]);
    // The team's home is one volume for all nodes: the backup's host (never cut) reads it.
    let seen = net.host(&backup);

    // Two batch jobs on both nodes, one of them run once at most; their steps write
    // where they run, then wait for the test's file.
    let (job, once) = submit_two(&team);
    eventually("the batch jobs' steps running on both nodes", LIMIT, || {
        let w = written(seen, &home);
        let ran = nodes.iter().all(|n| {
            [&job, &once]
                .iter()
                .all(|j| w.contains(&(j.to_string(), "0".into(), n.clone())))
        });
        async move { ran.then_some(()) }
    })
    .await;

    net.host(&head).cut();

    // The controller and the login move to the backup's node; Terraform reads the new
    // credentials, with the same host key.
    let after = eventually("the login on the backup's node", LIMIT, || {
        tf.refresh();
        let creds = credentials(&tf, VISION);
        let moved = (creds["login_node"].as_str() == Some(backup.as_str())).then_some(creds);
        async move { moved }
    })
    .await;
    assert_eq!(
        after["host"].as_str(),
        Some(net.host(&backup).addr().to_string().as_str())
    );
    assert_eq!(
        after["known_hosts"]
            .as_str()
            .map(|l| l.split_once(' ').map(|(_, k)| k.to_string())),
        before["known_hosts"]
            .as_str()
            .map(|l| l.split_once(' ').map(|(_, k)| k.to_string())),
        "the login keeps its host key"
    );
    let mut now = vec![backup.clone(), spare.clone()];
    now.sort();
    let replaced = cluster_nodes(&tf, VISION);
    assert_eq!(replaced, now, "the head was replaced by the spare");
    let moved = Session::new(client, &after, &key);
    eventually("the moved login answering", LIMIT, || {
        let ok = moved.poll("squeue -h").is_some();
        async move { ok.then_some(()) }
    })
    .await;

    // The batch job runs again, the same job, on the former backup and the replacement.
    let last = std::sync::Mutex::new(String::new());
    let rerun = tokio::time::timeout(
        REQUEUE_LIMIT,
        eventually("the requeued job running again", REQUEUE_LIMIT * 2, || {
            let shown = moved
                .poll(&format!("scontrol -o show job {job} {once}"))
                .unwrap_or_default();
            let w = written(seen, &home);
            let again = now
                .iter()
                .all(|n| w.contains(&(job.clone(), "1".into(), n.clone())));
            *last.lock().unwrap() = shown;
            async move { again.then_some(()) }
        }),
    )
    .await;
    assert!(
        rerun.is_ok(),
        "the batch job did not run again on {now:?}; last seen:\n{}\nwritten: {:?}\n{}",
        last.lock().unwrap(),
        written(seen, &home),
        controller_log(agent_of(&backup))
    );
    assert_running_again(&moved, &job);
    let go = seen.run("touch", &[&format!("{home}/requeue-go")]);
    assert!(go.status.success(), "{go:?}");
    assert_completes_on(&moved, &job, &now, LIMIT).await;
    // It ran twice in all, once on each node set: no other run started.
    let w = written(seen, &home);
    let mut runs: Vec<(String, String)> = w
        .iter()
        .filter(|(j, _, _)| *j == job)
        .map(|(_, r, h)| (r.clone(), h.clone()))
        .collect();
    runs.sort();
    let mut expected: Vec<(String, String)> = nodes
        .iter()
        .map(|n| ("0".to_string(), n.clone()))
        .chain(now.iter().map(|n| ("1".to_string(), n.clone())))
        .collect();
    expected.sort();
    assert_eq!(runs, expected, "{w:?}");
    // The job that must not run twice ended with the head, and did not run again.
    assert_ended_with_the_node(&moved, &once);
    assert!(w.iter().all(|(j, r, _)| *j != once || r == "0"), "{w:?}");

    // The lost host back: its agent, told its node left the cluster, ends everything of
    // the cluster there.
    net.host(&head).heal();
    let left = |h: &Host| -> Vec<String> {
        h.processes()
            .into_iter()
            .map(|(_, c)| c)
            .filter(|c| OF_THE_CLUSTER.contains(&c.as_str()))
            .collect()
    };
    eventually(
        "nothing of the cluster left on the healed host",
        LIMIT,
        || {
            let left = left(net.host(&head));
            async move { left.is_empty().then_some(()) }
        },
    )
    .await;

    // One state directory of the cluster is left, the new head's own.
    let dirs: Vec<String> = std::fs::read_dir(storage.path().join(".slurm"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        dirs.len() == 1 && dirs[0].ends_with(&format!("@{backup}")),
        "the controllers' state directories: {dirs:?}"
    );
    // The controller reads back what it saved, not what the cut-off one did.
    let controllers: Vec<u32> = net
        .host(&backup)
        .processes()
        .into_iter()
        .filter(|(_, c)| c == "slurmctld")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(controllers.len(), 1, "{:?}", net.host(&backup).processes());
    let killed = std::process::Command::new("kill")
        .args(["-9", &controllers[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    eventually("the controller started again", LIMIT, || {
        let restarted = net
            .host(&backup)
            .processes()
            .iter()
            .any(|(p, c)| c == "slurmctld" && *p != controllers[0]);
        let answers = moved.poll("squeue -h").is_some();
        async move { (restarted && answers).then_some(()) }
    })
    .await;
    for (id, state, restarts) in [(&job, "COMPLETED", "1"), (&once, "NODE_FAIL", "0")] {
        let shown = moved.ok(&format!("scontrol -o show job {id}"));
        assert_eq!(
            (field(&shown, "JobState"), field(&shown, "Restarts")),
            (Some(state), Some(restarts)),
            "{shown}"
        );
    }
    tf.destroy();
}
