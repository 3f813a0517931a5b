//! A Slurm cluster's head lost without shared storage, again and again, on the multi-host
//! tier (`gpufleet_e2e::netns`): a control plane and three GPU hosts with a node agent each,
//! no shared storage (the multi-host guide's own setup), and a client host the team works
//! from.
//!
//! Without shared storage a cluster has no backup controller and its controller's state is
//! its head's: when the head's host is lost, the control plane replaces the node and the new
//! head's controller starts with an empty queue (docs/guides/slurm.md says so). What must
//! not happen is what did before: the new controller giving job ids from 1 again, so that
//! new jobs met the old jobs' steps still running on the surviving node (`setns failed`),
//! stayed completing for minutes and hung the team's `srun`. Each round here:
//!
//! - the team runs a few jobs, one of them a 2-node job whose steps wait forever, so the
//!   node that survives the loss still runs a step of it;
//! - the head's host is cut off; the login moves to another node with the same host key,
//!   and the team's next apply rewrites its login details (the guides' pattern);
//! - the new controller gives ids past every id the former ones gave; a new 2-node batch
//!   job and an interactive `srun` on the surviving node start and end;
//! - the old job's step on the surviving node ends (the new controller knows no such job),
//!   and the team is told so once, as a cluster event (`job N ended: NODE_FAIL (its
//!   controller was lost)`, naming the surviving node);
//! - the cut host is healed and its agent, told its node left the cluster, keeps nothing
//!   of it; the host is the spare of the next round.
//!
//! Needs root (CI runs as root); without it the test fails naming what is missing.

use std::time::Duration;

use gpufleet_e2e::multihost::{nodes_ready, Fleet, ONE_GPU_HOST};
use gpufleet_e2e::netns::{self, Host};
use gpufleet_e2e::slurm_jobs::{controller_log, field};
use gpufleet_e2e::slurm_login::{
    cluster_nodes, credentials, shell_word, two_node_vision, vision_applied, Session,
};
use gpufleet_e2e::{eventually, Terraform};
use gpufleet_proto::v1::{Event, ListEventsRequest};

/// A safety net against hangs, never a timing assertion: conditions are waited on.
const LIMIT: Duration = Duration::from_secs(120);
const VISION: &str = "gpufleet_tenant_cluster.vision";
const GPU_HOSTS: [&str; 3] = ["g1", "g2", "g3"];
/// Heads lost one after the other: the third head starts past ids that two earlier
/// controllers gave, one of them itself a replacement (5 rounds showed nothing more and
/// cost CI 70 s).
const ROUNDS: usize = 3;
/// The guides' pattern for the team's login details: read for each run, written to a 0600
/// file, rewritten when the cluster's login moves (its endpoint changes).
const LOGIN_FILE: &str = r#"
ephemeral "gpufleet_cluster_credentials" "vision" {
  cluster_id = gpufleet_tenant_cluster.vision.id
}

resource "terraform_data" "login" {
  triggers_replace = [gpufleet_tenant_cluster.vision.id, gpufleet_tenant_cluster.vision.endpoint]
  provisioner "local-exec" {
    command     = "umask 077 && printf '%s' \"$LOGIN\" > login.json"
    environment = { LOGIN = ephemeral.gpufleet_cluster_credentials.vision.credentials }
  }
}
"#;

/// The login details the guides' pattern wrote.
fn login_file(tf: &Terraform) -> serde_json::Value {
    let text = std::fs::read_to_string(tf.dir().join("login.json")).expect("login.json");
    serde_json::from_str(&text).expect("login.json is JSON")
}

/// Whether `host` runs a process whose command line holds `tag`.
fn runs(host: &Host, tag: &str) -> bool {
    host.pids().into_iter().any(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(tag))
    })
}

/// Submits a batch job as `team` and returns its id.
fn submit(team: &Session, options: &str, script: &str) -> u64 {
    let id = team.ok(&format!(
        "sbatch --parsable -t 10 --output=/dev/null {options} --wrap {}",
        shell_word(script)
    ));
    id.trim()
        .parse()
        .unwrap_or_else(|_| panic!("sbatch said {id:?}"))
}

/// Waits until job `id` is in `state`, as `team` sees it.
async fn wait_state(team: &Session, id: u64, state: &str) {
    eventually(&format!("job {id} {state}"), LIMIT, || {
        let shown = team
            .poll(&format!("scontrol -o show job {id}"))
            .and_then(|s| field(&s, "JobState").map(str::to_string));
        async move { (shown.as_deref() == Some(state)).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_lost_without_shared_storage_leaves_no_stale_job_and_ids_never_go_back() {
    netns::require("the multi-host Slurm tests");
    let Fleet {
        net,
        backend,
        agents,
    } = Fleet::start(
        &GPU_HOSTS,
        &["--node-timeout", "2s", "--replace-after", "1s"],
        &[&ONE_GPU_HOST[..], &["--keepalive", "1s"]].concat(),
        LIMIT,
    )
    .await;
    let client = net.host("client");
    let (tf, key) = vision_applied(
        client,
        &backend,
        &format!("{}{LOGIN_FILE}", two_node_vision("")),
    );
    let mut creds = credentials(&tf, VISION);
    let admin = backend.admin().await;
    let cluster_id = tf.resource(VISION)["id"].as_str().unwrap().to_string();
    let tenant_id = tf.resource("gpufleet_tenant.vision")["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(login_file(&tf)["host"], creds["host"]);
    let host_key = |c: &serde_json::Value| {
        c["known_hosts"]
            .as_str()
            .and_then(|l| l.split_once(' ').map(|(_, k)| k.to_string()))
    };
    let first_key = host_key(&creds);
    let mut given = 0u64;
    for round in 0..ROUNDS {
        let team = Session::new(client, &creds, &key);
        let nodes = cluster_nodes(&tf, VISION);
        let head = creds["login_node"].as_str().unwrap().to_string();
        let survivor = nodes.iter().find(|n| **n != head).unwrap().clone();
        let agent_of = |h: &str| &agents[GPU_HOSTS.iter().position(|g| *g == h).unwrap()];

        // A few short jobs, and one whose steps on both nodes wait forever.
        for _ in 0..3 {
            let id = submit(&team, "-N1", "true");
            assert!(id > given, "round {round}: job id {id} after {given}");
            given = id;
        }
        let tag = format!("stale-step-{round}");
        let stale = submit(
            &team,
            "-N2",
            &format!(
                "srun -N2 --ntasks-per-node=1 sh -c {}",
                shell_word(&format!("until false; do sleep 0.2; done; echo {tag}"))
            ),
        );
        given = stale;
        wait_state(&team, stale, "RUNNING").await;
        eventually("the long job's step on the surviving node", LIMIT, || {
            let there = runs(net.host(&survivor), &tag);
            async move { there.then_some(()) }
        })
        .await;

        net.host(&head).cut();
        let moved = eventually("the login on another node", LIMIT, || {
            tf.refresh();
            let c = credentials(&tf, VISION);
            let moved = (c["login_node"].as_str() != Some(head.as_str())).then_some(c);
            async move { moved }
        })
        .await;
        assert_eq!(host_key(&moved), first_key, "the login keeps its host key");
        creds = moved;
        // The team's next apply rewrites its login details for the moved login.
        tf.apply();
        let written = login_file(&tf);
        assert_eq!(
            (&written["host"], &written["port"], &written["known_hosts"]),
            (&creds["host"], &creds["port"], &creds["known_hosts"]),
            "round {round}: login.json follows the head"
        );
        let team = Session::new(client, &creds, &key);
        eventually("the moved login answering", LIMIT, || {
            let ok = team.poll("squeue -h").is_some();
            async move { ok.then_some(()) }
        })
        .await;

        // New work starts and ends, on the surviving node too, with ids past the old ones.
        let job = submit(&team, "-N2", "srun -N2 --ntasks-per-node=1 true");
        assert!(
            job > given,
            "round {round}: the new controller gave job id {job}, not past {given}\n{}",
            controller_log(agent_of(&survivor))
        );
        given = job;
        wait_state(&team, job, "COMPLETED").await;
        let shown = team.ok(&format!("scontrol -o show job {job}"));
        assert_eq!(field(&shown, "ExitCode"), Some("0:0"), "{shown}");
        let (ok, out) = team.run(&format!("srun -N1 -w {survivor} hostname"));
        assert!(
            ok && out.contains(&survivor),
            "an interactive srun on {survivor}: {out}"
        );
        // The old job's step on the surviving node ends: no controller knows its job.
        eventually("the stale step on the surviving node ended", LIMIT, || {
            let left = runs(net.host(&survivor), &tag);
            async move { (!left).then_some(()) }
        })
        .await;
        // And the team is told, once, that the job ended with its node's failure.
        let told = format!("job {stale} ended: NODE_FAIL (its controller was lost)");
        let ended = eventually(&format!("the event {told:?}"), LIMIT, || {
            let (mut admin, id, told) = (admin.clone(), cluster_id.clone(), told.clone());
            async move {
                let events = admin
                    .fleet
                    .list_events(ListEventsRequest {
                        object_id: id,
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner()
                    .events;
                let ended: Vec<Event> = events.into_iter().filter(|e| e.message == told).collect();
                (!ended.is_empty()).then_some(ended)
            }
        })
        .await;
        assert_eq!(ended.len(), 1, "round {round}: {ended:?}");
        assert_eq!(
            (
                ended[0].kind.as_str(),
                ended[0].node.as_str(),
                &ended[0].tenant_id
            ),
            ("job_ended", survivor.as_str(), &tenant_id),
            "round {round}: the team's event names the node that ran the old job"
        );

        // The lost host comes back with nothing of the cluster: the next round's spare.
        net.host(&head).heal();
        nodes_ready(&backend, GPU_HOSTS.len(), LIMIT).await;
        eventually("nothing of the cluster on the healed host", LIMIT, || {
            let left = ["slurmd -D", "slurmctld -D", "slurmstepd"]
                .iter()
                .any(|d| runs(net.host(&head), d));
            async move { (!left).then_some(()) }
        })
        .await;
    }
    tf.destroy();
}
