//! Creates that wait for capacity through Terraform (issue 42): each team's pipeline, with
//! only its own token, creates clusters with `wait_for_capacity` while another team holds
//! every idle H100; the plan warns that they will wait and why, the applies wait, and when
//! the capacity frees the backend admits them in weighted fair-share order; a queued
//! create whose wait runs out (or that is deleted) fails its apply with the reason,
//! leaving no cluster and nothing in state; a queued Slurm cluster comes up with its
//! daemons and login once admitted.

use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_tenant, request_id};
use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::node_agent::eventually;
use gpufleet_e2e::{Backend, LogOnPanic, Terraform, TfRun};
use gpufleet_proto::v1::{
    CreateGpuQuotaRequest, CreateTenantClusterRequest, DeleteTenantClusterRequest,
    ListEventsRequest, QuotaUsageRequest, TenantCluster,
};

const H100: &str = "H100-80GB";

/// A 1-node cluster `name` of `team` (its pipeline's token's own) that waits up to `wait`.
fn waiting_cluster(team: &str, name: &str, wait: &str) -> Block {
    Block::resource("gpufleet_tenant_cluster", name)
        .string("tenant", team)
        .string("name", name)
        .string("orchestrator", "kubernetes")
        .string("gpu_type", H100)
        .number("node_count", 1)
        .string("wait_for_capacity", wait)
}

/// A team's pipeline: a working directory with the team's own token.
fn pipeline(backend: &Backend, token: &str) -> Terraform {
    let tf = Terraform::new(backend, token);
    tf.write_main("");
    tf.init();
    tf
}

/// A team with 32 burst H100 GPUs (nothing guaranteed) and quota weight `weight`.
async fn team(backend: &Backend, name: &str, weight: i64) -> (String, String) {
    let mut admin = backend.admin().await;
    let (tenant, token) = create_tenant(&mut admin, name).await;
    admin
        .quotas
        .create_gpu_quota(CreateGpuQuotaRequest {
            request_id: request_id(),
            tenant_id: tenant.id.clone(),
            gpu_type: H100.into(),
            gpus: 0,
            burst_gpus: 32,
            weight: Some(weight),
            ..Default::default()
        })
        .await
        .expect("CreateGpuQuota");
    (tenant.id, token)
}

/// The clusters of `tenant_id` by status.
async fn clusters_of(backend: &Backend, tenant_id: &str) -> Vec<TenantCluster> {
    let mut clusters = backend.admin().await.inventory().await.clusters;
    clusters.retain(|c| c.tenant_id == tenant_id);
    clusters
}

fn count(clusters: &[TenantCluster], status: &str) -> usize {
    clusters.iter().filter(|c| c.status == status).count()
}

/// An apply run on its own thread: it waits for admissions the test makes happen.
fn apply_in_background(tf: Terraform) -> std::thread::JoinHandle<(Terraform, TfRun)> {
    std::thread::spawn(move || {
        let run = tf.run(&["apply", "-no-color", "-input=false", "-auto-approve"]);
        (tf, run)
    })
}

/// Deletes team-c's `blocker` (as the operator) and waits for `apply`, which waited for
/// the capacity it held: its run must succeed.
async fn free_and_finish(
    admin: &mut gpufleet_e2e::Clients,
    blocker: &str,
    apply: std::thread::JoinHandle<(Terraform, TfRun)>,
    team: &str,
) -> Terraform {
    admin
        .clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest {
            id: blocker.to_string(),
        })
        .await
        .expect("the blocker goes");
    let (tf, run) = tokio::task::spawn_blocking(move || apply.join().expect("thread"))
        .await
        .expect("join");
    assert_eq!(run.code, 0, "{team}'s apply: {run}");
    tf
}

/// team-a (weight 1) and team-b (weight 3) each queue three 1-node clusters through their
/// own pipelines while team-c's cluster holds all 4 H100 nodes. When it goes, the 4
/// nodes are admitted b, b, a, b: b's share per weight after each admission (8/3, 16/3,
/// 24/3) against a's 8/1, the tie going to the team that waited longer (team-a), so the
/// teams hold 1:3. team-b's apply completes and its next plan is empty; team-a's two
/// still queued are deleted by the operator, and team-a's apply fails naming that, with
/// only its admitted cluster in state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_capacity_is_admitted_to_waiting_teams_in_weighted_fair_share_order() {
    let backend =
        Backend::start_with_fleet(&format!("[[pool]]\ngpu_type = \"{H100}\"\nnodes = 4\n"));
    let _log = LogOnPanic(&backend);
    let (a, a_token) = team(&backend, "team-a", 1).await;
    let (b, b_token) = team(&backend, "team-b", 3).await;
    let (c, _) = team(&backend, "team-c", 1).await;
    let mut admin = backend.admin().await;
    let blocker = create_pool_cluster(&mut admin, &c, "blocker", H100, 4).await;

    let team_a = pipeline(&backend, &a_token);
    team_a.write_main(&hcl::config(
        &["a1", "a2", "a3"].map(|n| waiting_cluster("team-a", n, "10m")),
    ));
    // The plan passes, saying that the creates will wait and why.
    team_a.plan().assert_mentions(&[
        "3 to add",
        "the create will wait: waiting for capacity: needs 1 H100-80GB nodes (8 GPUs), 0 free for it now (0 GPUs)",
    ]);
    let a_apply = apply_in_background(team_a);
    eventually(
        "team-a's 3 clusters queued",
        Duration::from_secs(120),
        || async { (count(&clusters_of(&backend, &a).await, "queued") == 3).then_some(()) },
    )
    .await;
    let team_b = pipeline(&backend, &b_token);
    team_b.write_main(&hcl::config(
        &["b1", "b2", "b3"].map(|n| waiting_cluster("team-b", n, "10m")),
    ));
    let b_apply = apply_in_background(team_b);
    eventually(
        "team-b's 3 clusters queued",
        Duration::from_secs(120),
        || async { (count(&clusters_of(&backend, &b).await, "queued") == 3).then_some(()) },
    )
    .await;
    // Queued clusters hold nothing, and the team's quota usage (its own token) counts none.
    let queued = clusters_of(&backend, &a).await;
    assert!(queued.iter().all(|c| c.nodes.is_empty()), "{queued:#?}");
    let usage = backend
        .clients(&a_token)
        .await
        .quotas
        .get_quota_usage(QuotaUsageRequest {
            tenant_id: a.clone(),
            gpu_type: H100.into(),
        })
        .await
        .expect("team-a's quota usage")
        .into_inner();
    assert_eq!((usage.used, usage.quota_left), (0, 32), "{usage:#?}");

    let team_b = free_and_finish(&mut admin, &blocker.id, b_apply, "team-b").await;
    team_b.assert_no_changes();

    // The admissions, in the order the backend made them.
    let events = admin
        .fleet
        .list_events(ListEventsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("ListEvents")
        .into_inner()
        .events;
    let admitted: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == "admitted")
        .map(|e| if e.tenant_id == a { "a" } else { "b" })
        .collect();
    assert_eq!(admitted, ["b", "b", "a", "b"], "{events:#?}");
    let first_a = events
        .iter()
        .find(|e| e.kind == "admitted" && e.tenant_id == a)
        .expect("team-a's admission");
    assert!(
        first_a.message.starts_with("admitted after waiting ")
            && first_a.message.ends_with(
                "s, in weighted fair-share order: tenant 'team-a' held 0 pool GPUs beyond its guarantee, weight 1"
            ),
        "{first_a:?}"
    );
    let a_now = clusters_of(&backend, &a).await;
    assert_eq!(
        (count(&a_now, "running"), count(&a_now, "queued")),
        (1, 2),
        "{a_now:#?}"
    );
    let b_now = clusters_of(&backend, &b).await;
    assert_eq!(count(&b_now, "running"), 3, "{b_now:#?}");
    assert!(
        a_now.iter().filter(|c| c.status == "queued").all(|c| c
            .status_reason
            .starts_with("waiting for capacity: needs 1 H100-80GB nodes (8 GPUs), 0 free")),
        "{a_now:#?}"
    );

    // The operator deletes team-a's two still queued: they just go, and team-a's apply
    // fails for them, saying so; its admitted cluster is in its state.
    for c in a_now.iter().filter(|c| c.status == "queued") {
        admin
            .clusters
            .delete_tenant_cluster(DeleteTenantClusterRequest { id: c.id.clone() })
            .await
            .expect("a queued cluster is deleted at once");
    }
    let (team_a, a_run) = tokio::task::spawn_blocking(move || a_apply.join().expect("thread"))
        .await
        .expect("join");
    assert_ne!(a_run.code, 0, "{a_run}");
    a_run.assert_mentions(&[
        "was not created: it was not admitted within wait_for_capacity: the queued cluster was deleted before it was admitted; it held nothing",
    ]);
    let admitted_a = a_now.iter().find(|c| c.status == "running").expect("a1");
    assert_eq!(
        team_a.state_list(),
        [format!("gpufleet_tenant_cluster.{}", admitted_a.name)]
    );
    assert_eq!(clusters_of(&backend, &a).await.len(), 1);
}

/// A queued create whose wait runs out: the apply fails naming the reason with the
/// numbers, no cluster is left on the backend and nothing in state; the same
/// configuration plans the create again (warning that it would wait), and without it the
/// plan is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_wait_runs_out_fails_its_apply_and_leaves_nothing() {
    let backend =
        Backend::start_with_fleet(&format!("[[pool]]\ngpu_type = \"{H100}\"\nnodes = 1\n"));
    let _log = LogOnPanic(&backend);
    let (a, a_token) = team(&backend, "team-a", 1).await;
    let (c, _) = team(&backend, "team-c", 1).await;
    create_pool_cluster(&mut backend.admin().await, &c, "blocker", H100, 1).await;

    let tf = pipeline(&backend, &a_token);
    // Past the bound, or not a duration: refused at plan on the attribute.
    tf.write_main(&hcl::config(&[waiting_cluster("team-a", "late", "25h")]));
    tf.plan_fails()
        .assert_mentions(&["wait_for_capacity: must be at most 24h (got \"25h\")"]);
    // More than the team may ever hold: refused now whatever the wait.
    let too_big = waiting_cluster("team-a", "late", "1h").number("node_count", 5);
    tf.write_main(&hcl::config(&[too_big]));
    tf.plan_fails().assert_mentions(&[
        "exceeds quota: needs 40 H100-80GB GPUs, more than tenant 'team-a' may ever hold (32 = 0 guaranteed + 32 burst); waiting cannot help",
    ]);

    tf.write_main(&hcl::config(&[waiting_cluster("team-a", "late", "3s")]));
    tf.apply_fails().assert_mentions(&[
        "tenant cluster \"late\" was not created: it was not admitted within wait_for_capacity: not admitted within its wait (",
        "waiting for capacity: needs 1 H100-80GB nodes (8 GPUs), 0 free for it now (0 GPUs); the queued cluster was deleted, it held nothing",
    ]);
    assert!(clusters_of(&backend, &a).await.is_empty());
    assert!(tf.state_list().is_empty(), "{:?}", tf.state_list());
    // The same configuration: the create again, nothing else.
    tf.plan().assert_mentions(&[
        "1 to add, 0 to change, 0 to destroy",
        "the create will wait",
    ]);
    tf.write_main("");
    tf.assert_no_changes();
}

/// A queued create outlives a control-plane restart: still queued with its reason after
/// it, and admitted once the capacity frees (through the API, as any client would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_create_outlives_a_restart_and_is_admitted_after_it() {
    let mut backend =
        Backend::start_with_fleet(&format!("[[pool]]\ngpu_type = \"{H100}\"\nnodes = 1\n"));
    let (a, a_token) = team(&backend, "team-a", 1).await;
    let (c, _) = team(&backend, "team-c", 1).await;
    let blocker = create_pool_cluster(&mut backend.admin().await, &c, "blocker", H100, 1).await;
    let queued = backend
        .clients(&a_token)
        .await
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: request_id(),
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: H100.into(),
            node_count: 1,
            wait_seconds: 600,
            ..Default::default()
        })
        .await
        .expect("a create that waits")
        .into_inner();
    assert_eq!(
        (queued.status.as_str(), queued.status_reason.as_str()),
        (
            "queued",
            "waiting for capacity: needs 1 H100-80GB nodes (8 GPUs), 0 free for it now (0 GPUs)"
        )
    );
    assert!(queued.nodes.is_empty(), "{queued:#?}");

    backend.restart();
    let _log = LogOnPanic(&backend);
    let after = clusters_of(&backend, &a).await;
    assert_eq!(after.len(), 1);
    assert_eq!(
        (after[0].status.as_str(), after[0].status_reason.as_str()),
        ("queued", queued.status_reason.as_str())
    );
    backend
        .admin()
        .await
        .clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest { id: blocker.id })
        .await
        .expect("the blocker goes");
    eventually(
        "the queued cluster admitted and running",
        Duration::from_secs(60),
        || async {
            let now = clusters_of(&backend, &a).await;
            (now.len() == 1 && now[0].status == "running" && now[0].nodes.len() == 1).then_some(())
        },
    )
    .await;
}

/// A Slurm cluster waits like any other and, once admitted, comes up as a create's does:
/// its controller, slurmd and login start on the node it gets (embedded node agents with
/// Slurm), its acceptance runs a job step there, and the apply ends `running` with an
/// empty plan after it. Team-a's pipeline has only its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_slurm_cluster_comes_up_when_admitted() {
    let backend = Backend::start_with_fleet_and_args(
        &format!("[[pool]]\ngpu_type = \"{H100}\"\nnodes = 1\ngpus_per_node = 1\n"),
        &[],
    );
    let _log = LogOnPanic(&backend);
    let (a, a_token) = team(&backend, "team-a", 1).await;
    let (c, _) = team(&backend, "team-c", 1).await;
    let mut admin = backend.admin().await;
    let blocker = create_pool_cluster(&mut admin, &c, "blocker", H100, 1).await;

    let team_a = pipeline(&backend, &a_token);
    let keys = tempfile::tempdir().unwrap();
    let (_, public) = gpufleet_e2e::slurm_login::team_key_in(keys.path(), "alice");
    team_a.write_file("alice.pub", &public);
    let hpc = waiting_cluster("team-a", "hpc", "5m")
        .string("orchestrator", "slurm")
        .expr("ssh_public_keys", "[file(\"${path.module}/alice.pub\")]");
    team_a.write_main(&hcl::config(&[hpc]));
    let apply = apply_in_background(team_a);
    eventually(
        "team-a's Slurm cluster queued",
        Duration::from_secs(120),
        || async { (count(&clusters_of(&backend, &a).await, "queued") == 1).then_some(()) },
    )
    .await;
    let team_a = free_and_finish(&mut admin, &blocker.id, apply, "team-a").await;
    let hpc = team_a.resource("gpufleet_tenant_cluster.hpc");
    assert_eq!(hpc["status"], "running", "{hpc:#}");
    // A Slurm cluster's endpoint is its login's host:port (a Kubernetes one is a URL).
    let endpoint = hpc["endpoint"].as_str().unwrap_or_default();
    assert!(
        hpc["orchestrator"] == "slurm"
            && !endpoint.contains("://")
            && endpoint
                .rsplit_once(':')
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok()),
        "the login's endpoint: {hpc:#}"
    );
    team_a.assert_no_changes();
    // Down again, leaving no daemon of the team behind.
    team_a.write_main("");
    team_a.apply();
}
