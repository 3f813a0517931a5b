//! A rolling upgrade that no team notices, on the multi-host tier (`gpufleet_e2e::netns`):
//! a control plane and two GPU hosts with a node agent each, and a client host the team
//! works from.
//!
//! A two-node cluster runs two of the team's batch jobs across both nodes (`sbatch -N2`)
//! and a team member's login session is open. Then, as an upgrade does, the control plane
//! is stopped and started again, then each host's agent in turn, with a planned stop
//! (SIGTERM: `systemctl restart`); last, the first host's agent once more with `kill -9`,
//! as a crash. Throughout:
//!
//! - the cluster's daemons on every host are the same processes before and after (each new
//!   agent adopted what ran);
//! - both jobs run on and complete cleanly with `Restarts=0` (neither was requeued, the one
//!   submitted with `--no-requeue` did not end);
//! - the session stays open and ends as the team ends it;
//! - a plan is empty.
//!
//! Version skew (the previous release against this one) is not exercised here: see
//! docs/operations.md, "Upgrades and version skew".
//!
//! Needs root (CI runs as root); without it the test fails naming what is missing.

use std::time::Duration;

use gpufleet_e2e::eventually;
use gpufleet_e2e::multihost::{nodes_ready, Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::slurm_jobs::{field, submit_two, written};
use gpufleet_e2e::slurm_login::{
    cluster_nodes, credentials, two_node_vision, vision_applied, Session,
};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(90);
const VISION: &str = "gpufleet_tenant_cluster.vision";
const GPU_HOSTS: [&str; 2] = ["g1", "g2"];

/// The cluster's daemons on `host` (munged, slurmd, slurmctld, the login's sshd) as
/// (command line, pid), sorted. A session's sshd (the listener's child, which bears its
/// command line until it names itself after its user) is not a daemon.
fn daemons(host: &Host, cluster: &str) -> Vec<(String, u32)> {
    let mut found: Vec<(String, u32)> = host
        .pids()
        .into_iter()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .filter(|(_, cmd)| {
            ["munged ", "slurmd -D", "slurmctld -D", "sshd -D"]
                .iter()
                .any(|d| cmd.contains(d))
                && cmd.contains(&format!("/{cluster}/"))
        })
        .map(|(pid, cmd)| (cmd, pid))
        .collect();
    let all: Vec<u32> = found.iter().map(|(_, p)| *p).collect();
    found.retain(|(_, p)| parent_of(*p).is_none_or(|parent| !all.contains(&parent)));
    found.sort();
    found
}

/// The parent of `pid`, from its stat (after the command's closing parenthesis).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_leaves_jobs_and_sessions_running() {
    netns::require("the multi-host Slurm tests");
    let Fleet {
        net,
        mut backend,
        mut agents,
    } = Fleet::start(
        &GPU_HOSTS,
        // Long enough that no restart here replaces a node.
        &["--node-timeout", "30s", "--replace-after", "10m"],
        &ONE_GPU_HOST,
        LIMIT,
    )
    .await;
    let client = net.host("client");
    let (tf, key) = vision_applied(client, &backend, &two_node_vision(""));
    let creds = credentials(&tf, VISION);
    let cluster = creds["user"].as_str().unwrap().to_string();
    let home = creds["home"].as_str().unwrap().to_string();
    let team = Session::new(client, &creds, &key);
    let nodes = cluster_nodes(&tf, VISION);
    assert_eq!(nodes.len(), 2);
    let head = creds["login_node"].as_str().unwrap().to_string();

    let (job, once) = submit_two(&team);
    eventually("the batch jobs' steps running on both nodes", LIMIT, || {
        let ran = nodes.iter().all(|n| {
            let w = written(net.host(n), &home);
            [&job, &once]
                .iter()
                .all(|j| w.contains(&(j.to_string(), "0".into(), n.clone())))
        });
        async move { ran.then_some(()) }
    })
    .await;
    let mut session = team.hold("until [ -e $HOME/session-go ]; do sleep 0.2; done");
    let before: Vec<_> = GPU_HOSTS
        .iter()
        .map(|h| daemons(net.host(h), &cluster))
        .collect();
    let head_at = GPU_HOSTS.iter().position(|h| *h == head).unwrap();
    assert_eq!(
        before[head_at].len(),
        4,
        "munged, slurmd, slurmctld and sshd on the head: {before:?}"
    );

    // The upgrade: the control plane, then each host in turn, then a crash for good measure.
    backend.restart();
    nodes_ready(&backend, GPU_HOSTS.len(), LIMIT).await;
    for agent in agents.iter_mut() {
        agent.terminate();
        let status = agent.wait_exit(LIMIT).expect("the agent stops");
        assert!(status.success(), "{status:?}: {}", agent.log());
        agent.restart();
        nodes_ready(&backend, GPU_HOSTS.len(), LIMIT).await;
    }
    agents[0].restart();
    nodes_ready(&backend, GPU_HOSTS.len(), LIMIT).await;
    eventually("every agent adopted its cluster's daemons", LIMIT, || {
        let adopted = agents.iter().all(|a| {
            a.log().lines().any(|l| {
                l.contains("adopted a daemon a former agent started") && l.contains("slurmd/")
            })
        });
        async move { adopted.then_some(()) }
    })
    .await;

    let after: Vec<_> = GPU_HOSTS
        .iter()
        .map(|h| daemons(net.host(h), &cluster))
        .collect();
    assert_eq!(
        after,
        before,
        "the same daemons on every host\n{}",
        agents
            .iter()
            .map(|a| a.log())
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    assert!(
        session.try_wait().unwrap().is_none(),
        "the team's session stayed open"
    );
    for j in [&job, &once] {
        let shown = team.ok(&format!("scontrol -o show job {j}"));
        assert_eq!(field(&shown, "JobState"), Some("RUNNING"), "{shown}");
        assert_eq!(field(&shown, "Restarts"), Some("0"), "{shown}");
    }

    // The team ends its work: every job completes where it ran, once.
    for n in &nodes {
        let go = net.host(n).run("touch", &[&format!("{home}/requeue-go")]);
        assert!(go.status.success(), "{go:?}");
    }
    let go = net
        .host(&head)
        .run("touch", &[&format!("{home}/session-go")]);
    assert!(go.status.success(), "{go:?}");
    let ended = session.wait().unwrap();
    assert!(
        ended.success(),
        "the session ended as the team ended it: {ended:?}"
    );
    for j in [&job, &once] {
        eventually("the job completing", LIMIT, || {
            let state = team
                .poll(&format!("scontrol -o show job {j}"))
                .and_then(|s| field(&s, "JobState").map(str::to_string));
            async move { (state.as_deref() == Some("COMPLETED")).then_some(()) }
        })
        .await;
        let shown = team.ok(&format!("scontrol -o show job {j}"));
        assert_eq!(field(&shown, "Restarts"), Some("0"), "{shown}");
        assert_eq!(field(&shown, "ExitCode"), Some("0:0"), "{shown}");
    }
    for n in &nodes {
        let w = written(net.host(n), &home);
        assert_eq!(w.len(), 2, "each job's step ran once on {n}: {w:?}");
    }
    tf.assert_no_changes();
    tf.destroy();
}
