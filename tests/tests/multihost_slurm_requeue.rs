//! A lost Slurm node's jobs, on the multi-host tier (`gpufleet_e2e::netns`): a control
//! plane, three GPU hosts with a node agent each, and a client host the team works from.
//!
//! A two-node cluster runs two of a team's batch jobs across both nodes (`sbatch -N2`, not
//! pinned to any node) and an interactive `srun` across both. The host of the node that is
//! not the head is cut off; the control plane finds it unreachable and replaces it with the
//! spare host. Then, as Slurm does on a node failure:
//!
//! - the interactive step ends, and the team's `srun` says so (it does not hang);
//! - the batch job submitted with `--no-requeue` ends (`NODE_FAIL`) and does not run again;
//! - the other is requeued, keeps its job id, runs again (`SLURM_RESTART_COUNT` 1) on the
//!   nodes the cluster has now (the head and the replacement) and completes there, and
//!   `scontrol show job` says so (`sacct` has no record to show: the clusters keep no
//!   accounting storage);
//! - the lost host, only cut off, still runs the first run's step until it is back and its
//!   agent, told the node left the cluster, ends everything of the cluster there.
//!
//! The jobs' steps write `<job id> <restart count> <hostname>` to the home of the host they
//! run on (each host has its own home here), then wait for a file the test makes there.
//!
//! Needs root (CI runs as root); without it the test fails naming what is missing.

use std::time::Duration;

use gpufleet_e2e::eventually;
use gpufleet_e2e::multihost::{Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::slurm_jobs::{
    assert_completes_on, assert_ended_with_the_node, assert_running_again, controller_log,
    submit_two, written,
};
use gpufleet_e2e::slurm_login::{
    cluster_nodes, credentials, shell_word, two_node_vision, vision_applied, Session,
};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
/// The wait for the requeued job to run again: Slurm holds a requeued job back for a
/// while before it may start again (its begin time), on top of the replacement itself.
const REQUEUE_LIMIT: Duration = Duration::from_secs(300);
/// The agents' `--slurm-cred-expire`: a requeued job is held back this long plus 1 s
/// (Slurm's default, 120 s, would take two minutes of the suite).
const CRED_EXPIRE: &str = "10";
const VISION: &str = "gpufleet_tenant_cluster.vision";
const GPU_HOSTS: [&str; 3] = ["g1", "g2", "g3"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_nodes_batch_job_is_requeued_and_runs_again_on_the_replacement() {
    netns::require("the multi-host Slurm tests");
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &GPU_HOSTS,
        &["--node-timeout", "2s", "--replace-after", "1s"],
        &[
            &ONE_GPU_HOST[..],
            &["--keepalive", "1s", "--slurm-cred-expire", CRED_EXPIRE],
        ]
        .concat(),
        LIMIT,
    )
    .await;
    let client = net.host("client");
    let (tf, key) = vision_applied(client, &backend, &two_node_vision(""));
    let creds = credentials(&tf, VISION);
    let home = creds["home"].as_str().unwrap().to_string();
    let team = Session::new(client, &creds, &key);
    let nodes = cluster_nodes(&tf, VISION);
    assert_eq!(nodes.len(), 2);
    let head = creds["login_node"].as_str().unwrap().to_string();
    let head_agent = &agents[GPU_HOSTS.iter().position(|h| *h == head).unwrap()];
    let lost = nodes.iter().find(|n| **n != head).unwrap().clone();
    let spare = GPU_HOSTS
        .iter()
        .find(|h| !nodes.contains(&h.to_string()))
        .unwrap()
        .to_string();

    // Two batch jobs on both nodes, one of them run once at most; their steps write
    // where they run, then wait for the test's file.
    // The controller runs with the agents' credential lifetime.
    let config = team.ok("scontrol show config");
    assert!(
        config.lines().any(|l| l.starts_with("AuthInfo")
            && l.contains(&format!("cred_expire={CRED_EXPIRE}"))),
        "{config}"
    );
    let (job, once) = submit_two(&team);
    eventually("the batch jobs' steps running on both nodes", LIMIT, || {
        let all: Vec<_> = nodes.iter().map(|n| written(net.host(n), &home)).collect();
        let ran = nodes.iter().zip(&all).all(|(n, w)| {
            [&job, &once]
                .iter()
                .all(|j| w.contains(&(j.to_string(), "0".into(), n.clone())))
        });
        async move { ran.then_some(()) }
    })
    .await;

    // An interactive step on both nodes, from the team's login, that would wait forever.
    let interactive = Session::new(client, &creds, &key);
    let srun = std::thread::spawn(move || {
        interactive.run(&format!(
            "srun -N2 --ntasks-per-node=1 -t 10 -J interactive sh -c {}",
            shell_word(
                "hostname >> $HOME/interactive.log; \
                 until [ -e $HOME/never-made ]; do sleep 0.2; done"
            )
        ))
    });
    eventually("the interactive step running on both nodes", LIMIT, || {
        let ran = nodes.iter().all(|n| {
            let out = net
                .host(n)
                .run("cat", &[&format!("{home}/interactive.log")]);
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == n)
        });
        async move { ran.then_some(()) }
    })
    .await;

    net.host(&lost).cut();

    // The batch job runs again, the same job, on the head and the replacement.
    let mut now = vec![head.clone(), spare.clone()];
    now.sort();
    let last = std::sync::Mutex::new(String::new());
    let rerun = tokio::time::timeout(
        REQUEUE_LIMIT,
        eventually("the requeued job running again", REQUEUE_LIMIT * 2, || {
            let shown = team
                .poll(&format!("scontrol -o show job {job}"))
                .unwrap_or_default();
            let again = now.iter().all(|n| {
                written(net.host(n), &home).contains(&(job.clone(), "1".into(), n.clone()))
            });
            *last.lock().unwrap() = shown;
            async move { again.then_some(()) }
        }),
    )
    .await;
    assert!(
        rerun.is_ok(),
        "the batch job did not run again on {now:?}; last seen:\n{}\nthe interactive srun: {:?}\n{}",
        last.lock().unwrap(),
        srun.is_finished().then(|| srun.join()),
        controller_log(head_agent)
    );
    // The interactive step ended (its safety limit is long past), with an error the team
    // sees.
    let (ok, said) = srun
        .join()
        .unwrap_or_else(|_| panic!("the interactive srun hung:\n{}", controller_log(head_agent)));
    assert!(
        !ok,
        "the interactive step on the lost node succeeded: {said}"
    );
    assert!(
        said.contains(&format!("error: Node failure on {lost}")),
        "srun said: {said}"
    );
    assert_running_again(&team, &job);
    for n in &now {
        let go = net.host(n).run("touch", &[&format!("{home}/requeue-go")]);
        assert!(go.status.success(), "{go:?}");
    }
    assert_completes_on(&team, &job, &now, LIMIT).await;
    // The job that must not run twice ended with the node, and did not run again.
    assert_ended_with_the_node(&team, &once);
    let on_spare = written(net.host(&spare), &home);
    assert!(!on_spare.iter().any(|(j, _, _)| *j == once), "{on_spare:?}");
    // Its first run wrote on the lost node, the second never did.
    let on_lost = written(net.host(&lost), &home);
    assert!(
        !on_lost.iter().any(|(_, restarts, _)| restarts != "0"),
        "{on_lost:?}"
    );
    // The lost host was only cut off: its slurmd still runs the first run's step there
    // (nothing reaches it to end it) until the host is back and its agent, told that the
    // node left the cluster, stops everything of the cluster.
    let stepd = |h: &Host| h.processes().iter().any(|(_, c)| c == "slurmstepd");
    assert!(
        stepd(net.host(&lost)),
        "the cut host's step: {:?}",
        net.host(&lost).processes()
    );
    net.host(&lost).heal();
    eventually("the healed host's old step ended", LIMIT, || {
        let left = stepd(net.host(&lost));
        async move { (!left).then_some(()) }
    })
    .await;
    tf.destroy();
}
