//! The control plane believes only what it ordered and verified. An attacker holding the
//! join token runs its own agent (`common::rogue`): registrations that contradict
//! themselves are refused, answers to orders never sent or out of bounds are not
//! recorded, a node whose agent left is never ready, and an order that gets no answer
//! fails at its deadline instead of holding a cluster in `creating`.

mod common;

use std::time::Duration;

use common::rogue::{registration, Rogue};
use common::*;
use gpufleet_proto::v1::*;
use tonic::Code;

/// The rogues' fleet (`common::start_for_rogues`), with a breaker far from the rogues'
/// few quarantines.
fn start(dir: &std::path::Path, extra: &[&str]) -> Agent {
    let mut args = vec![
        "--breaker-max-quarantines",
        "8",
        "--breaker-max-percent",
        "100",
    ];
    args.extend_from_slice(extra);
    start_for_rogues(dir, &args)
}

async fn refused_answers(agent: &Agent, reason: &str) -> f64 {
    let text = scrape(agent, &metrics_addr(agent));
    metric_value(
        &text,
        &format!("gpufleet_agent_answers_refused_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or_else(|| panic!("no refused-answers series for {reason} in:\n{text}"))
}

#[tokio::test]
async fn registrations_that_contradict_themselves_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let refuse = |reg: RegisterNode| {
        let (endpoint, data) = (agent.endpoint.clone(), agent.data_dir.clone());
        async move {
            Rogue::register(&endpoint, &data, reg)
                .await
                .err()
                .expect("the registration must be refused")
        }
    };
    // An H100 node whose second GPU says it is a B200.
    let mut b200 = registration("liar-01", "H100-80GB", 2);
    b200.inventory.as_mut().unwrap().gpus[1].model = "B200".into();
    let s = refuse(b200).await;
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    assert!(
        s.message().contains("inventory.gpus[1].model") && s.message().contains("B200"),
        "{}",
        s.message()
    );
    // 10^15 MiB per GPU.
    let mut huge = registration("liar-02", "H100-80GB", 1);
    huge.inventory.as_mut().unwrap().gpus[0].memory_mib = 1_000_000_000_000_000;
    let s = refuse(huge).await;
    assert!(
        s.message().contains("inventory.gpus[0].memory_mib"),
        "{}",
        s.message()
    );
    // A 2 MB driver string.
    let mut long = registration("liar-03", "H100-80GB", 1);
    long.inventory.as_mut().unwrap().driver_version = "9".repeat(2 << 20);
    let s = refuse(long).await;
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(
        s.message()
            .contains("inventory.driver_version: at most 128"),
        "{}",
        s.message()
    );
    // Two whole-GPU MIG devices on one GPU.
    let mut overlap = registration("liar-04", "H100-80GB", 1);
    let gpu = &mut overlap.inventory.as_mut().unwrap().gpus[0];
    gpu.mig_enabled = true;
    gpu.mig_devices = (0..2)
        .map(|i| MigDevice {
            profile: "7g.80gb".into(),
            profile_id: 0,
            start: 0,
            size: 8,
            memory_mib: 81152,
            uuid: format!("MIG-liar-{i}"),
        })
        .collect();
    let s = refuse(overlap).await;
    assert!(s.message().contains("overlaps"), "{}", s.message());
    // None of them joined the fleet.
    let mut admin = agent.admin().await;
    let names: Vec<String> = admin
        .nodes()
        .await
        .into_iter()
        .map(|n| n.hostname)
        .collect();
    assert_eq!(names, vec!["a100-40gb-pool-01"]);
}

#[tokio::test]
async fn answers_to_orders_never_sent_or_out_of_bounds_are_not_believed() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let mut admin = agent.admin().await;
    let rogue = ready_rogue(&agent, &mut admin, "rogue-01", 2).await;

    // A result for an order id this control plane never sent, with an inventory it
    // would have recorded before: another driver and two whole-GPU MIG devices.
    let mut inv = registration("rogue-01", "H100-80GB", 2).inventory.unwrap();
    inv.driver_version = "999.99.99-UNSOLICITED".into();
    inv.gpus[0].mig_enabled = true;
    inv.gpus[0].mig_devices = (0..2)
        .map(|i| MigDevice {
            profile: "7g.80gb".into(),
            profile_id: 0,
            start: 0,
            size: 8,
            memory_mib: 81152,
            uuid: format!("MIG-forged-{i}"),
        })
        .collect();
    let before = refused_answers(&agent, "unsolicited").await;
    rogue.answer(OrderResult {
        order_id: "an-order-never-sent".into(),
        ok: true,
        inventory: Some(inv),
        ..Default::default()
    });
    while refused_answers(&agent, "unsolicited").await < before + 1.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = node(&mut admin, "rogue-01").await.unwrap();
    assert_eq!(n.driver_version, "550.54.15");
    assert!(n
        .gpus
        .iter()
        .all(|g| !g.mig_enabled && g.mig_devices.is_empty()));
    assert_eq!(n.state, "ready");

    // A second node answers its real admission check with a 2 MB driver string: the
    // answer is not believed, so the check failed and the node is out of service.
    let mut liar = Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        registration("rogue-02", "H100-80GB", 2),
    )
    .await
    .unwrap();
    let check = liar.next_order().await;
    let mut inv = registration("rogue-02", "H100-80GB", 2).inventory.unwrap();
    inv.driver_version = "9".repeat(2 << 20);
    liar.answer(OrderResult {
        order_id: check.id.clone(),
        ok: true,
        inventory: Some(inv),
        health: Some(HealthReport {
            level: "medium".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let n = wait_state(&mut admin, "rogue-02", "quarantined", &["ready"]).await;
    assert_eq!(n.driver_version, "550.54.15");
    assert!(
        n.state_reason.contains("not believed"),
        "{}",
        n.state_reason
    );
    assert!(refused_answers(&agent, "out_of_bounds").await >= 1.0);
    // The admin's node list still reads, and so does the CLI's table.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["nodes", "--endpoint", &agent.endpoint])
        .env("GPUFLEET_TOKEN", ADMIN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("rogue-02") && text.len() < 64 << 10, "{text}");
}

#[tokio::test]
async fn an_agent_that_registers_and_leaves_never_leaves_a_ready_node() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let mut admin = agent.admin().await;
    for i in 1..=5 {
        let name = format!("ghost-{i:02}");
        let ghost = Rogue::register(
            &agent.endpoint,
            &agent.data_dir,
            registration(&name, "H100-80GB", 2),
        )
        .await
        .unwrap();
        ghost.leave();
        let n = wait_state(&mut admin, &name, "unreachable", &["ready"]).await;
        assert!(n.cluster_id.is_empty());
    }
    // A live node still joins: the fleet is not refusing everyone.
    let _live = ready_rogue(&agent, &mut admin, "live-01", 2).await;
}

#[tokio::test]
async fn an_order_without_an_answer_fails_at_its_deadline_and_quarantines_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &["--order-deadline", "mig_layout=2s"]);
    let mut admin = agent.admin().await;
    let mut rogue = ready_rogue(&agent, &mut admin, "hung-01", 2).await;
    let (tenant, _) = admin.tenant("vision").await;
    admin.quota(&tenant.id, "H100-80GB", 2, 0).await;
    let mut req = Clients::cluster(&tenant.id, "cv", "H100-80GB", 1);
    req.mig_layout = mig_layout(&[("3g.40gb", 2)]);
    let mut clusters = admin.clusters.clone();
    let create = tokio::spawn(async move { clusters.create_tenant_cluster(req).await });
    // The layout order arrives and is never answered (a stuck NVML call).
    let order = rogue.next_order().await;
    assert!(
        matches!(order.kind, Some(work_order::Kind::ApplyMigLayout(_))),
        "{order:?}"
    );
    let s = create.await.unwrap().expect_err("the create must fail");
    assert_eq!(s.code(), Code::Aborted, "{}", s.message());
    assert!(
        s.message().contains("no answer within 2s") && s.message().contains("mig_layout"),
        "{}",
        s.message()
    );
    // Nothing of the create is left, and the node that hung is out of service.
    let listed = admin
        .clusters
        .list_tenant_clusters(ListTenantClustersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.clusters.is_empty(), "{listed:?}");
    let n = wait_state(&mut admin, "hung-01", "quarantined", &[]).await;
    assert!(
        n.state_reason.contains("no answer within 2s"),
        "{}",
        n.state_reason
    );
    assert!(n.cluster_id.is_empty());
    let text = scrape(&agent, &metrics_addr(&agent));
    let labels = ["gpu_type=\"H100-80GB\"", "cause=\"deadline\""];
    assert!(
        series(&text, "gpufleet_quarantines_total", &labels) >= 1.0,
        "{text}"
    );
    let timed_out = ["kind=\"mig_layout\"", "outcome=\"timed_out\""];
    assert!(
        series(&text, "gpufleet_work_orders_total", &timed_out) >= 1.0,
        "{text}"
    );
}

#[tokio::test]
async fn a_nodes_name_is_bound_to_the_host_that_first_took_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let mut admin = agent.admin().await;
    let owner = ready_rogue(&agent, &mut admin, "gpu-07", 2).await;
    let secret = owner.secret.clone();
    assert!(secret.starts_with("gfn_"), "{secret:?}");
    owner.leave();
    wait_state(&mut admin, "gpu-07", "unreachable", &[]).await;
    // Its GPU UUIDs are in any tenant's node list: with them and the join token, an
    // impostor under the dead node's name is still refused.
    let impostor = Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        registration("gpu-07", "H100-80GB", 2),
    )
    .await
    .err()
    .expect("an impostor must be refused");
    assert_eq!(impostor.code(), Code::PermissionDenied);
    assert!(
        impostor.message().contains("node secret")
            && impostor.message().contains("node-forget-secret gpu-07"),
        "{}",
        impostor.message()
    );
    // The host that holds the secret comes back, and keeps its name (no new secret).
    let mut reg = registration("gpu-07", "H100-80GB", 2);
    reg.node_secret = secret.clone();
    let mut back = Rogue::register(&agent.endpoint, &agent.data_dir, reg)
        .await
        .expect("the owner registers again");
    assert!(back.secret.is_empty());
    let check = back.next_order().await;
    back.pass_check(&check);
    wait_state(&mut admin, "gpu-07", "ready", &["quarantined"]).await;
    // An operator releases the name only while no agent holds it; then a rebuilt host
    // takes it with a new secret.
    let held = admin
        .fleet
        .forget_node_secret(ForgetNodeSecretRequest {
            name: "gpu-07".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(held.code(), Code::FailedPrecondition, "{}", held.message());
    back.leave();
    wait_state(&mut admin, "gpu-07", "unreachable", &[]).await;
    admin
        .fleet
        .forget_node_secret(ForgetNodeSecretRequest {
            name: "gpu-07".into(),
        })
        .await
        .unwrap_or_else(|s| panic!("ForgetNodeSecret: {s}"));
    let rebuilt = Rogue::register(
        &agent.endpoint,
        &agent.data_dir,
        registration("gpu-07", "H100-80GB", 2),
    )
    .await
    .expect("the rebuilt host takes the released name");
    assert!(rebuilt.secret.starts_with("gfn_") && rebuilt.secret != secret);
}

/// The value of the first series of `name` whose labels include every one of `labels`.
fn series(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_quarantine_from_a_failed_create_is_counted_by_cause_and_traced_in_the_fleets_stream() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let mut admin = agent.admin().await;
    let mut rogue = ready_rogue(&agent, &mut admin, "bad-01", 2).await;
    let (tenant, token) = admin.tenant("vision").await;
    admin.quota(&tenant.id, "H100-80GB", 2, 0).await;
    let mut clusters = admin.clusters.clone();
    let req = Clients::cluster(&tenant.id, "cv", "H100-80GB", 1);
    let create = tokio::spawn(async move { clusters.create_tenant_cluster(req).await });
    // Its acceptance check finds an XID on GPU 0.
    let check = rogue.next_order().await;
    let Some(work_order::Kind::RunHealthCheck(h)) = &check.kind else {
        panic!("expected the acceptance check, got {check:?}");
    };
    rogue.answer(OrderResult {
        order_id: check.id.clone(),
        ok: true,
        health: Some(HealthReport {
            level: h.level.clone(),
            checks: vec![CheckResult {
                name: "xid".into(),
                gpu_uuid: "GPU-bad-01-0".into(),
                verdict: "fail".into(),
                value: "1 XID 79".into(),
                threshold: "0".into(),
                ..Default::default()
            }],
            finished_at: 0,
        }),
        ..Default::default()
    });
    let s = create.await.unwrap().expect_err("the create must fail");
    assert!(s.message().contains("not created"), "{}", s.message());

    let text = scrape(&agent, &metrics_addr(&agent));
    let labels = ["gpu_type=\"H100-80GB\"", "cause=\"xid\""];
    assert!(
        series(&text, "gpufleet_quarantines_total", &labels) >= 1.0,
        "{text}"
    );
    let labels = [
        "gpu_type=\"H100-80GB\"",
        "level=\"medium\"",
        "check=\"xid\"",
    ];
    assert!(
        series(&text, "gpufleet_check_failures_total", &labels) >= 1.0,
        "{text}"
    );

    // The admin's stream of the whole fleet traces the quarantine to the cluster and its
    // tenant, though the cluster is gone.
    let all = admin
        .fleet
        .list_events(ListEventsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .events;
    let quarantined: Vec<&Event> = all
        .iter()
        .filter(|e| e.kind == "node_quarantined" && e.node == "bad-01")
        .collect();
    assert!(
        quarantined.iter().any(|e| e.tenant_id == tenant.id),
        "{quarantined:?}"
    );
    assert!(
        quarantined.iter().any(|e| e.object_id == "bad-01"
            && e.message
                .contains(&format!("in cluster cv of tenant {}", tenant.id))),
        "{quarantined:?}"
    );
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "oldest first");
    // A tenant's stream is its own clusters' events only: not the fleet's node logs.
    let mine = agent
        .clients(&token)
        .await
        .fleet
        .list_events(ListEventsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .events;
    assert!(!mine.is_empty());
    assert!(mine.iter().all(|e| e.tenant_id == tenant.id), "{mine:?}");
    // Paged: one at a time, the same events in the same order.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .fleet
            .list_events(ListEventsRequest {
                page_size: 1,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        paged.extend(page.events.into_iter().map(|e| e.seq));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let seqs: Vec<i64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(paged[..seqs.len()], seqs[..]);
}

#[tokio::test]
async fn a_node_back_from_a_cluster_it_no_longer_belongs_to_is_told_to_stop_its_daemons() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let mut admin = agent.admin().await;
    // An agent that kept the daemons of a cluster it was in before it was replaced (it
    // starts none of them by itself): first it is told to stop them and remove their keys.
    let mut reg = registration("back-01", "H100-80GB", 2);
    reg.slurm_clusters = vec!["gf0123456789ab".into()];
    let mut rogue = Rogue::register(&agent.endpoint, &agent.data_dir, reg)
        .await
        .expect("registered");
    let stop = rogue.next_order().await;
    let Some(work_order::Kind::StopSlurmd(s)) = &stop.kind else {
        panic!("expected StopSlurmd first, got {stop:?}");
    };
    assert_eq!(s.cluster, "gf0123456789ab");
    rogue.answer(OrderResult {
        order_id: stop.id.clone(),
        ok: true,
        ..Default::default()
    });
    let check = rogue.next_order().await;
    rogue.pass_check(&check);
    wait_state(&mut admin, "back-01", "ready", &["quarantined"]).await;
    // A kept cluster's name is bounded like any: a path is refused, naming the field.
    let mut bad = registration("back-02", "H100-80GB", 1);
    bad.slurm_clusters = vec!["../../etc".into()];
    let s = Rogue::register(&agent.endpoint, &agent.data_dir, bad)
        .await
        .err()
        .expect("refused");
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().starts_with("slurm_clusters"), "{}", s.message());
}

#[tokio::test]
async fn a_node_whose_host_cannot_isolate_a_cluster_is_quarantined_saying_why_and_never_placed() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path(), &[]);
    let mut admin = agent.admin().await;
    let problem = "cgroup v1 controller 'memory' is not mounted at /sys/fs/cgroup/memory";
    let mut reg = registration("bare-01", "H100-80GB", 2);
    reg.isolation_problem = problem.into();
    let _bare = Rogue::register(&agent.endpoint, &agent.data_dir, reg)
        .await
        .unwrap();
    // Out of service from its registration on, with why (no check runs first).
    let n = wait_state(&mut admin, "bare-01", "quarantined", &["ready"]).await;
    assert!(
        n.state_reason.contains("cannot isolate a tenant's cluster")
            && n.state_reason.contains(problem),
        "{}",
        n.state_reason
    );
    let events = admin
        .fleet
        .list_events(ListEventsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .events;
    assert!(
        events.iter().any(|e| e.kind == "node_quarantined"
            && e.node == "bare-01"
            && e.message.contains(problem)),
        "{events:?}"
    );
    // No cluster is placed on it: with the fleet's only H100 node out, a quota for one is
    // refused naming it.
    let (tenant, _) = admin.tenant("vision").await;
    let s = admin
        .quotas
        .create_gpu_quota(CreateGpuQuotaRequest {
            request_id: "quota-on-bare".into(),
            tenant_id: tenant.id.clone(),
            gpu_type: "H100-80GB".into(),
            gpus: 1,
            ..Default::default()
        })
        .await
        .expect_err("a quota on a node that cannot isolate a cluster");
    assert!(
        s.message().contains("quarantined (bare-01)"),
        "{}",
        s.message()
    );
    // An operator's return is refused while its agent says so.
    let s = admin
        .fleet
        .return_node(ReturnNodeRequest {
            name: "bare-01".into(),
        })
        .await
        .expect_err("returned while its host cannot isolate a cluster");
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    assert!(s.message().contains(problem), "{}", s.message());
    // Bounded: a registration's problem past 1024 characters is refused naming the field.
    let mut long = registration("bare-02", "H100-80GB", 1);
    long.isolation_problem = "x".repeat(1025);
    let s = Rogue::register(&agent.endpoint, &agent.data_dir, long)
        .await
        .err()
        .expect("refused");
    assert!(s.message().contains("isolation_problem"), "{}", s.message());
}
