//! One source of truth for admission: plan-time refusals are the backend's own dry runs,
//! so they follow whatever rules and capacity the backend has; guarantees never promise
//! more than the pool; the earliest window is the backend's answer and a reservation of
//! that window fits.

use std::time::Duration;

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::json::{i64_of, str_of};
use gpufleet_e2e::node_agent::eventually;
use gpufleet_e2e::times::{rfc3339_in_hours, unix_seconds};
use gpufleet_e2e::{Backend, LogOnPanic, Terraform};
use gpufleet_proto::timestamp::from_unix;
use gpufleet_proto::v1::{
    CreateReservationRequest, CreateTenantClusterRequest, ListEventsRequest, PlannedQuota,
};

const TENANT: &str = "gpufleet_tenant.t.id";

/// A fleet of `h100` H100 pool nodes and nothing else.
fn h100_fleet(h100: u32) -> String {
    format!("[[pool]]\ngpu_type = \"H100-80GB\"\nnodes = {h100}\n")
}

/// Tenant `t` ("team") with `gpus` guaranteed + `burst` burst H100 GPUs, and `blocks`.
fn team(gpus: i64, burst: i64, blocks: &[Block]) -> String {
    let mut all = vec![
        hcl::tenant("t", "team"),
        hcl::quota("q", TENANT, "H100-80GB", gpus).number("burst_gpus", burst),
    ];
    all.extend(blocks.iter().cloned());
    hcl::config(&all)
}

fn workdir(backend: &Backend) -> Terraform {
    let tf = Terraform::new(backend, backend.admin_token());
    tf.write_main("");
    tf.init();
    tf
}

/// The same configuration planned against two backends that differ only in their rules'
/// inputs (the fleet, the open-reservation limit): the provider's verdicts follow each
/// backend, word for word what the backend's own dry run answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_time_refusals_follow_the_backend_not_the_provider() {
    let big = Backend::start_with_fleet(&h100_fleet(4));
    let small = Backend::start_with_fleet(&h100_fleet(2));
    // 3 nodes for the next day; a 16-GPU guarantee fits both pools.
    let reservation = hcl::reservation(
        "r",
        TENANT,
        "H100-80GB",
        3,
        &rfc3339_in_hours(1),
        &rfc3339_in_hours(25),
    )
    .depends_on(&["gpufleet_gpu_quota.q"]);
    let config = team(16, 16, &[]);
    let with_reservation = team(16, 16, std::slice::from_ref(&reservation));

    let tf = workdir(&big);
    tf.write_main(&config);
    tf.apply();
    tf.write_main(&with_reservation);
    tf.plan().assert_mentions(&["1 to add"]);

    let tf = workdir(&small);
    tf.write_main(&config);
    tf.apply();
    tf.write_main(&with_reservation);
    let refused = tf.plan_fails();
    // The backend's own answer to the same request, asked directly as a dry run.
    let mut admin = small.admin().await;
    let tenant_id = str_of(&tf.resource("gpufleet_tenant.t"), "id");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let answer = admin
        .reservations
        .create_reservation(CreateReservationRequest {
            tenant_id: tenant_id.clone(),
            gpu_type: "H100-80GB".into(),
            node_count: 3,
            start_time: Some(from_unix(now + 3600)),
            end_time: Some(from_unix(now + 25 * 3600)),
            validate_only: true,
            ..Default::default()
        })
        .await
        .expect_err("3 nodes do not fit a 2-node pool");
    let words = answer.message();
    assert!(
        words.starts_with("node_count: needs 3 H100-80GB nodes from "),
        "{words}"
    );
    // Up to the window's instants (the plan asked a moment earlier), the same sentence.
    refused.assert_mentions(&["node_count: needs 3 H100-80GB nodes", "pool has 2 free"]);
    assert!(small
        .admin()
        .await
        .inventory()
        .await
        .reservations
        .is_empty());

    // A rule the provider never knew: the open-reservation limit of the backend it asks.
    let limited = Backend::start_with_args(&["--max-open-reservations", "1"]);
    let tf = workdir(&limited);
    tf.write_main(&with_reservation);
    tf.apply();
    let second = hcl::reservation(
        "r2",
        TENANT,
        "H100-80GB",
        1,
        &rfc3339_in_hours(30),
        &rfc3339_in_hours(40),
    );
    tf.write_main(&team(16, 16, &[reservation, second]));
    tf.plan_fails()
        .assert_mentions(&["already holds 1 reservations", "--max-open-reservations"]);
    assert_eq!(
        limited.admin().await.inventory().await.reservations.len(),
        1
    );
}

/// Guaranteed GPUs of one model across tenants never exceed the pool: refused at plan
/// time with the numbers; burst GPUs are best effort. Quota usage says what a tenant can
/// actually obtain now, and which limit binds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_promised_guarantees_are_refused_with_the_numbers() {
    let backend = Backend::start(); // 4 H100 pool nodes of 8 GPUs: 32 GPUs
    let mut admin = backend.admin().await;
    let (rival, _) = create_tenant(&mut admin, "rival").await;
    create_quota(&mut admin, &rival.id, "H100-80GB", 24, 0).await;
    let tf = workdir(&backend);
    // The tenant first: an existing tenant's quota (a new tenant's is checked against the
    // pool too, see `quota_changes_and_what_needs_them_plan_and_apply_together`).
    tf.write_main(&hcl::config(&[hcl::tenant("t", "team")]));
    tf.apply();
    tf.write_main(&team(16, 0, &[]));
    let needles = [
        "gpus: 40 guaranteed H100-80GB GPUs across tenants would exceed the pool's 32",
        "other tenants are guaranteed 24",
        "at most 8",
        "burst_gpus",
    ];
    tf.plan_fails().assert_mentions(&needles);
    tf.apply_fails().assert_mentions(&needles);
    assert_eq!(backend.admin().await.inventory().await.quotas.len(), 1);

    // What fits is guaranteed; the rest is burst.
    tf.write_main(&team(8, 24, &[]));
    tf.apply();
    tf.assert_no_changes();
    // A quota of another model and a cluster needing it, in one apply: the plan's dry run
    // of the cluster does not refuse for want of the quota this apply creates.
    tf.write_main(&team(
        8,
        24,
        &[
            hcl::quota("a100", TENANT, "A100-80GB", 8),
            hcl::pool_cluster("a100", TENANT, "a100", "A100-80GB", 1)
                .depends_on(&["gpufleet_gpu_quota.a100"]),
        ],
    ));
    tf.apply();
    tf.assert_no_changes();
    // Raising the guarantee past the pool is refused in place too.
    tf.write_main(&team(9, 24, &[]));
    tf.plan_fails()
        .assert_mentions(&["gpus: 33 guaranteed H100-80GB GPUs", "at most 8"]);

    // The rival holds 2 of the 4 nodes: the team's quota leaves 32, the pool 16.
    create_pool_cluster(&mut admin, &rival.id, "blocker", "H100-80GB", 2).await;
    let usage = Block::data("gpufleet_quota_usage", "u")
        .expr("tenant", TENANT)
        .string("gpu_type", "H100-80GB");
    tf.write_main(&team(
        8,
        24,
        &[usage, Block::output("usage", "data.gpufleet_quota_usage.u")],
    ));
    tf.apply();
    let usage = &tf.outputs()["usage"];
    assert_eq!(i64_of(usage, "quota_left"), 32, "{usage:#}");
    assert_eq!(i64_of(usage, "capacity_free"), 16, "{usage:#}");
    assert_eq!(i64_of(usage, "available"), 16, "{usage:#}");
    assert_eq!(str_of(usage, "binding"), "capacity", "{usage:#}");
    // And what it says is what a cluster can get: 2 nodes yes, 3 no.
    let tenant_id = str_of(&tf.resource("gpufleet_tenant.t"), "id");
    let three = CreateTenantClusterRequest {
        tenant_id: tenant_id.clone(),
        name: "c".into(),
        orchestrator: "kubernetes".into(),
        gpu_type: "H100-80GB".into(),
        node_count: 3,
        validate_only: true,
        ..Default::default()
    };
    admin
        .clusters
        .create_tenant_cluster(three.clone())
        .await
        .expect_err("24 GPUs where 16 are free");
    admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            node_count: 2,
            ..three
        })
        .await
        .expect("16 GPUs where 16 are free");
}

/// Quotas and what needs them change in one plan and one apply, counted as they will be:
/// a raise and the cluster growth it makes room for, beside a lowering that makes room for
/// the raise; what no apply could do (a growth past the raised quota, new quotas that cannot
/// all fit the pool) is refused at plan, naming the numbers, and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_changes_and_what_needs_them_plan_and_apply_together() {
    let backend = Backend::start(); // 4 H100 pool nodes of 8 GPUs: 32 GPUs
    let tf = workdir(&backend);
    // Tenants by name, known at plan: the quotas' dry runs can count them.
    let teams = |a: i64, b: i64, nodes: i64, more: &[Block]| {
        let mut all = vec![
            hcl::tenant("a", "team-a"),
            hcl::tenant("b", "team-b"),
            hcl::quota("a", "gpufleet_tenant.a.name", "H100-80GB", a),
            hcl::quota("b", "gpufleet_tenant.b.name", "H100-80GB", b),
            hcl::pool_cluster("a", "gpufleet_tenant.a.name", "train", "H100-80GB", nodes)
                .depends_on(&["gpufleet_gpu_quota.a"]),
        ];
        all.extend(more.iter().cloned());
        hcl::config(&all)
    };
    tf.write_main(&teams(8, 24, 1, &[]));
    tf.apply();

    // Growing past the raised quota: no apply could do it.
    tf.write_main(&teams(16, 16, 3, &[]));
    tf.plan_fails()
        .assert_mentions(&["needs 24 H100-80GB GPUs", "quota of tenant 'team-a' leaves"]);

    // Team a's raise fits only beside team b's lowering, and the cluster's growth only
    // with the raise: one plan, one apply, whichever order Terraform applies the quotas in.
    tf.write_main(&teams(16, 16, 2, &[]));
    tf.plan().assert_mentions(&["3 to change"]);
    tf.apply();
    tf.assert_no_changes();
    let cluster = tf.resource("gpufleet_tenant_cluster.a");
    assert_eq!(i64_of(&cluster, "node_count"), 2, "{cluster:#}");
    let quotas = backend.admin().await.inventory().await.quotas;
    let mut gpus: Vec<i64> = quotas.iter().map(|q| q.gpus).collect();
    gpus.sort();
    assert_eq!(gpus, vec![16, 16], "{quotas:#?}");

    // Two new teams' quotas: each fits beside team b's lowering, both do not. Their
    // tenants by id, known only at apply: the pool is checked all the same.
    let new_team = |label: &str| {
        [
            hcl::tenant(label, &format!("team-{label}")),
            hcl::quota(
                label,
                &format!("gpufleet_tenant.{label}.id"),
                "H100-80GB",
                16,
            ),
        ]
    };
    let more: Vec<Block> = new_team("c").into_iter().chain(new_team("d")).collect();
    tf.write_main(&teams(16, 0, 2, &more));
    // Terraform wraps a diagnostic's detail where it likes: compare words.
    let says_all = |run: gpufleet_e2e::TfRun| {
        let words = run
            .output()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for needle in [
            "gpus: 48 guaranteed H100-80GB GPUs across tenants would exceed the pool's 32",
            "Counted with the H100-80GB quotas this plan also creates or changes",
            "tenant 'team-b': 0 guaranteed + 0 burst",
            "a tenant known after apply: 16 guaranteed + 0 burst",
        ] {
            assert!(words.contains(needle), "lacks {needle:?}:\n{run}");
        }
    };
    says_all(tf.plan_fails());
    says_all(tf.apply_fails());
    let after = backend.admin().await.inventory().await;
    assert_eq!(
        (after.tenants.len(), after.quotas.len()),
        (2, 2),
        "nothing applied: {after:#?}"
    );
}

/// `gpufleet_availability` answers when N nodes are free for D, from the same holdings a
/// reservation is placed against: a reservation of that window fits, one an hour earlier
/// does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earliest_window_is_answered_and_a_reservation_there_fits() {
    let backend = Backend::start();
    let tf = workdir(&backend);
    // The whole H100 pool (4 nodes) is taken from 1h to 25h from now, 3 of them until 49h.
    let (t1, t25, t49) = (
        rfc3339_in_hours(1),
        rfc3339_in_hours(25),
        rfc3339_in_hours(49),
    );
    let taken = |label: &str, nodes: i64, end: &str| {
        hcl::reservation(label, TENANT, "H100-80GB", nodes, &t1, end)
            .depends_on(&["gpufleet_gpu_quota.q"])
    };
    let window = |nodes: i64, duration: &str| {
        Block::data("gpufleet_availability", "w")
            .string("gpu_type", "H100-80GB")
            .number("node_count", nodes)
            .string("duration", duration)
    };
    let base = [taken("a", 1, &t25), taken("b", 3, &t49)];
    // The reservations first: a data source is read at plan time, before the apply.
    tf.write_main(&team(32, 32, &base));
    tf.apply();
    let mut blocks = base.to_vec();
    blocks.push(window(1, "48h"));
    blocks.push(Block::output(
        "earliest",
        "data.gpufleet_availability.w.earliest_start",
    ));
    tf.write_main(&team(32, 32, &blocks));
    tf.apply();
    // 1 node for 48h: the first instant one is free for that long is when "a" ends.
    let earliest = tf.outputs()["earliest"].as_str().unwrap().to_string();
    assert_eq!(unix_seconds(&earliest), unix_seconds(&t25), "{earliest}");

    // A reservation of that window fits; an hour earlier it does not.
    let end = time::OffsetDateTime::from_unix_timestamp(unix_seconds(&earliest) + 48 * 3600)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let at = |start: &str| {
        let mut blocks = base.to_vec();
        blocks.push(
            hcl::reservation("next", TENANT, "H100-80GB", 1, start, &end)
                .depends_on(&["gpufleet_gpu_quota.q"]),
        );
        team(32, 32, &blocks)
    };
    tf.write_main(&at(&rfc3339_in_hours(24)));
    tf.plan_fails()
        .assert_mentions(&["node_count: needs 1 H100-80GB nodes", "pool has 0 free"]);
    tf.write_main(&at(&earliest));
    tf.apply();
    let next = tf.resource("gpufleet_reservation.next");
    assert_eq!(i64_of(&next, "pool_nodes"), 1, "{next:#}");

    // 5 nodes never fit a 4-node pool: an answer, not an error; the reason says why.
    let mut blocks = base.to_vec();
    blocks.push(window(5, "1h"));
    blocks.push(Block::output(
        "why",
        "data.gpufleet_availability.w.earliest_start_reason",
    ));
    blocks.push(Block::output(
        "never",
        "data.gpufleet_availability.w.earliest_start == null",
    ));
    tf.write_main(&team(32, 32, &blocks));
    tf.apply();
    let outputs = tf.outputs();
    assert_eq!(outputs["never"], true, "{outputs:#}");
    let why = outputs["why"].as_str().unwrap();
    assert!(
        why.starts_with("5 H100-80GB pool nodes are never free for 1h: the pool has 4 nodes"),
        "{why}"
    );
}

/// Idle capacity used, promises kept: with every H100 pool node reserved for a window that
/// starts tomorrow, a plain cluster today is refused naming that window, a preemptible one
/// takes the idle nodes; when the window starts (the backend's injected clock moves, no
/// sleep) the reservation gets all its nodes back, the preemptible cluster shrinks (or moves
/// to on-demand nodes with allow_on_demand), its status and events say which nodes left and
/// why, and a refresh-only plan shows the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemptible_clusters_use_idle_reserved_nodes_until_the_window_starts() {
    let clock_dir = tempfile::tempdir().expect("a temp dir for the clock file");
    let clock = clock_dir.path().join("now");
    let backend = Backend::start_with_args(&["--clock-file", clock.to_str().unwrap()]);
    let tf = workdir(&backend);
    let (start, end) = (rfc3339_in_hours(24), rfc3339_in_hours(48));
    let reservation = hcl::reservation("r", TENANT, "H100-80GB", 4, &start, &end)
        .depends_on(&["gpufleet_gpu_quota.q"]);
    let cluster = |label: &str, nodes: i64| {
        hcl::pool_cluster(label, TENANT, label, "H100-80GB", nodes)
            .depends_on(&["gpufleet_gpu_quota.q"])
    };
    tf.write_main(&team(32, 32, std::slice::from_ref(&reservation)));
    tf.apply();

    // Without preemptible: refused at plan time, naming the window and what would work.
    tf.write_main(&team(32, 32, &[reservation.clone(), cluster("plain", 1)]));
    tf.plan_fails().assert_mentions(&[
        "node_count: needs 1 H100-80GB pool nodes from now on with no end; 4 are free now",
        "a reservation window from",
        "preemptible = true",
        "reservation_id",
    ]);

    // Preemptible: the idle nodes, today.
    let idle = cluster("idle", 2).boolean("preemptible", true);
    let moving = cluster("moving", 1)
        .boolean("preemptible", true)
        .boolean("allow_on_demand", true);
    tf.write_main(&team(32, 32, &[reservation.clone(), idle, moving]));
    tf.apply();
    tf.assert_no_changes();
    let idle_id = str_of(&tf.resource("gpufleet_tenant_cluster.idle"), "id");
    let moving_id = str_of(&tf.resource("gpufleet_tenant_cluster.moving"), "id");

    // The window starts.
    std::fs::write(&clock, (unix_seconds(&start) + 60).to_string()).expect("write the clock");
    let _log = LogOnPanic(&backend);
    let (idle, moving) = eventually(
        "the reservation to take its pool nodes back",
        Duration::from_secs(60),
        || async {
            let clusters = backend.admin().await.inventory().await.clusters;
            let find = |id: &str| clusters.iter().find(|c| c.id == id).cloned();
            let (idle, moving) = (find(&idle_id)?, find(&moving_id)?);
            let settled = idle.status == "running"
                && moving.status == "running"
                && idle.nodes.is_empty()
                && moving.nodes.iter().all(|n| n.capacity == "on-demand");
            settled.then_some((idle, moving))
        },
    )
    .await;
    assert_eq!(idle.node_count, 0, "{idle:#?}");
    assert!(
        idle.status_reason.starts_with("preempted: ")
            && idle
                .status_reason
                .contains("left the cluster (a reservation window from")
            && idle.status_reason.contains("the cluster shrank to 0 nodes"),
        "{}",
        idle.status_reason
    );
    assert_eq!(moving.node_count, 1, "{moving:#?}");
    assert_eq!(moving.nodes.len(), 1, "{moving:#?}");
    assert!(
        moving.status_reason.contains("on-demand"),
        "{}",
        moving.status_reason
    );
    // The events name each node that left, and why.
    let mut admin = backend.admin().await;
    let events = admin
        .fleet
        .list_events(ListEventsRequest {
            object_id: idle_id.clone(),
            ..Default::default()
        })
        .await
        .expect("ListEvents")
        .into_inner()
        .events;
    let preempted: Vec<_> = events.iter().filter(|e| e.kind == "preempted").collect();
    assert_eq!(preempted.len(), 2, "{events:#?}");
    assert!(preempted
        .iter()
        .all(|e| e.message.contains("a reservation window from") && !e.node.is_empty()));

    // A refresh-only plan shows what changed under Terraform.
    tf.run_ok(&["plan", "-refresh-only", "-no-color"])
        .assert_mentions(&["node_count", "2 -> 0", "on-demand"]);

    // The reservation gets all of its nodes.
    let tenant_id = str_of(&tf.resource("gpufleet_tenant.t"), "id");
    let reservation_id = str_of(&tf.resource("gpufleet_reservation.r"), "id");
    let all = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: "reserved-all".into(),
            tenant_id,
            name: "reserved".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 4,
            reservation_id,
            ..Default::default()
        })
        .await
        .expect("all 4 reserved nodes")
        .into_inner();
    assert_eq!(all.nodes.len(), 4);
    assert!(all.nodes.iter().all(|n| n.capacity == "pool"), "{all:#?}");
}

/// A dry run answers what the real call would do and changes nothing: no rows, no nodes
/// taken, no storage, no credentials, no request id remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_answer_like_the_real_call_and_change_nothing() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "team").await;
    let quota = create_quota(&mut admin, &tenant.id, "H100-80GB", 16, 0).await;
    let before = admin.inventory().await;
    let cluster = CreateTenantClusterRequest {
        request_id: "same-id".into(),
        tenant_id: tenant.id.clone(),
        name: "train".into(),
        orchestrator: "kubernetes".into(),
        gpu_type: "H100-80GB".into(),
        node_count: 2,
        validate_only: true,
        ..Default::default()
    };
    let would = admin
        .clusters
        .create_tenant_cluster(cluster.clone())
        .await
        .expect("a dry run of what fits")
        .into_inner();
    assert_eq!(would.nodes.len(), 2, "{would:#?}");
    assert!(would.credentials.is_empty());
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    admin
        .reservations
        .create_reservation(CreateReservationRequest {
            tenant_id: tenant.id.clone(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            start_time: Some(from_unix(now + 3600)),
            end_time: Some(from_unix(now + 7200)),
            validate_only: true,
            ..Default::default()
        })
        .await
        .expect("a dry run of a reservation that fits");
    admin
        .quotas
        .update_gpu_quota(gpufleet_proto::v1::UpdateGpuQuotaRequest {
            id: quota.id.clone(),
            gpus: 8,
            burst_gpus: 0,
            validate_only: true,
            ..Default::default()
        })
        .await
        .expect("a dry run of a lower quota");
    // A raise the same plan makes counts in a cluster's dry run, and stays a dry run.
    let three = CreateTenantClusterRequest {
        node_count: 3,
        ..cluster.clone()
    };
    admin
        .clusters
        .create_tenant_cluster(three.clone())
        .await
        .expect_err("24 GPUs on a quota of 16");
    let raised = PlannedQuota {
        tenant_id: "team".into(),
        gpu_type: "H100-80GB".into(),
        gpus: 24,
        burst_gpus: 0,
    };
    admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            planned_quotas: vec![raised],
            ..three
        })
        .await
        .expect("24 GPUs on the quota of 24 the plan sets");
    assert_eq!(admin.inventory().await, before);
    let volumes = backend.data_dir().join("volumes").join(&tenant.id);
    assert!(!volumes.join("train").exists(), "a dry run made storage");

    // The request id was not remembered: the real create with the same id but other
    // values is a new request, not a conflict.
    let real = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            node_count: 1,
            validate_only: false,
            ..cluster
        })
        .await
        .expect("the real create")
        .into_inner();
    assert_eq!(real.nodes.len(), 1);
    assert!(!real.credentials.is_empty());
}

/// Lending limits through Terraform (issue 42): team-a is guaranteed the whole 2-node
/// pool (16 GPUs) and lends none of it while idle, so team-b's preemptible cluster is
/// refused at plan naming team-a's limit and the numbers; once team-a lends 8, the
/// cluster takes one node; a limit past the guarantee is refused at plan on its
/// attribute; gpufleet_quota_usage says what team-b can obtain and that the limit binds;
/// weight and limit read back and import with no diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lending_limit_keeps_a_teams_idle_guarantee_from_other_teams() {
    let backend = Backend::start_with_fleet(&h100_fleet(2));
    let tf = workdir(&backend);
    let quota_a = |lends: i64| {
        hcl::quota("qa", "gpufleet_tenant.a.id", "H100-80GB", 16)
            .number("weight", 3)
            .number("lending_limit_gpus", lends)
    };
    let base = |lends: i64| {
        vec![
            hcl::tenant("a", "team-a"),
            hcl::tenant("b", "team-b"),
            quota_a(lends),
            hcl::quota("qb", "gpufleet_tenant.b.id", "H100-80GB", 0).number("burst_gpus", 16),
            Block::data("gpufleet_quota_usage", "b")
                .expr("tenant", "gpufleet_tenant.b.id")
                .string("gpu_type", "H100-80GB")
                .depends_on(&["gpufleet_gpu_quota.qa", "gpufleet_gpu_quota.qb"]),
        ]
    };
    // What team-b can obtain now, and what limits it.
    let usage = |tf: &Terraform| {
        let u = tf.resource("data.gpufleet_quota_usage.b");
        let numbers = ["quota_left", "capacity_free", "available"].map(|k| i64_of(&u, k));
        (numbers, str_of(&u, "binding"))
    };
    let borrower = hcl::pool_cluster("borrow", "gpufleet_tenant.b.id", "borrow", "H100-80GB", 1)
        .boolean("preemptible", true)
        .depends_on(&["gpufleet_gpu_quota.qb"]);
    tf.write_main(&hcl::config(&base(0)));
    tf.apply();
    tf.assert_no_changes();
    assert_eq!(usage(&tf), ([16, 16, 0], "lending_limit".to_string()));

    let mut with_cluster = base(0);
    with_cluster.push(borrower.clone());
    tf.write_main(&hcl::config(&with_cluster));
    tf.plan_fails().assert_mentions(&[
        "node_count: needs 1 H100-80GB pool nodes now (8 GPUs), the pool has 2 free now (16 GPUs)",
        "tenant 'team-a' lends at most 0 of its 16 idle guaranteed GPUs (lending_limit_gpus = 0)",
        "tenant 'team-b' may borrow 0 GPUs (0 nodes)",
    ]);

    // Only guaranteed GPUs are lent: refused at plan, on the attribute.
    tf.write_main(&hcl::config(&base(24)));
    tf.plan_fails().assert_mentions(&[
        "lending_limit_gpus: 24 is more than the quota's 16 guaranteed GPUs",
        "lending_limit_gpus",
    ]);

    tf.write_main(&hcl::config(&base(8)));
    tf.apply();
    assert_eq!(usage(&tf), ([16, 16, 8], "lending_limit".to_string()));
    let mut with_cluster = base(8);
    with_cluster.push(borrower);
    tf.write_main(&hcl::config(&with_cluster));
    tf.apply();
    tf.assert_no_changes();
    let cluster = tf.resource("gpufleet_tenant_cluster.borrow");
    assert_eq!(i64_of(&cluster, "node_count"), 1, "{cluster:#}");
    let quota = tf.resource("gpufleet_gpu_quota.qa");
    assert_eq!(
        (
            i64_of(&quota, "weight"),
            i64_of(&quota, "lending_limit_gpus")
        ),
        (3, 8),
        "{quota:#}"
    );
    let no_limit = tf.resource("gpufleet_gpu_quota.qb");
    assert!(no_limit["lending_limit_gpus"].is_null(), "{no_limit:#}");
    assert_eq!(i64_of(&no_limit, "weight"), 1, "{no_limit:#}");

    // Imported into a fresh state, the quota reads back as configured: nothing to change.
    let imported = workdir(&backend);
    let by_name = hcl::quota("qa", "\"team-a\"", "H100-80GB", 16)
        .number("weight", 3)
        .number("lending_limit_gpus", 8);
    imported.write_main(&hcl::config(&[by_name]));
    imported.import("gpufleet_gpu_quota.qa", "team-a/H100-80GB");
    imported.assert_no_changes();
    let read = imported.resource("gpufleet_gpu_quota.qa");
    assert_eq!(
        (i64_of(&read, "weight"), i64_of(&read, "lending_limit_gpus")),
        (3, 8),
        "{read:#}"
    );
}

/// Weighted fair share through Terraform (issue 42): on an 8-node H100 pool, team-b
/// (weight 1) and team-c (weight 3) each borrow 4 idle nodes with a preemptible cluster;
/// when team-a's 4-node reservation window starts (the backend's injected clock moves),
/// the 4 nodes come back in fair-share order, one at a time from the team with the most
/// borrowed GPUs per weight: team-b gives 3 and team-c 1, leaving them 1:3, and each
/// `preempted` event names team-a's reservation and the share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_taken_back_leaves_borrowers_in_proportion_to_their_weights() {
    let clock_dir = tempfile::tempdir().expect("a temp dir for the clock file");
    let clock = clock_dir.path().join("now");
    let args = ["--clock-file", clock.to_str().unwrap()];
    let backend = Backend::start_with_fleet_and_args(&h100_fleet(8), &args);
    let tf = workdir(&backend);
    let (start, end) = (rfc3339_in_hours(24), rfc3339_in_hours(48));
    let borrower = |team: &str, weight: i64| {
        let tenant = format!("gpufleet_tenant.{team}.id");
        [
            hcl::quota(&format!("q{team}"), &tenant, "H100-80GB", 0)
                .number("burst_gpus", 32)
                .number("weight", weight),
            hcl::pool_cluster(team, &tenant, team, "H100-80GB", 4)
                .boolean("preemptible", true)
                .depends_on(&[&format!("gpufleet_gpu_quota.q{team}")]),
        ]
    };
    let mut blocks = vec![
        hcl::tenant("a", "team-a"),
        hcl::tenant("b", "team-b"),
        hcl::tenant("c", "team-c"),
        hcl::quota("qa", "gpufleet_tenant.a.id", "H100-80GB", 32),
        hcl::reservation("r", "gpufleet_tenant.a.id", "H100-80GB", 4, &start, &end)
            .depends_on(&["gpufleet_gpu_quota.qa"]),
    ];
    blocks.extend(borrower("b", 1));
    blocks.extend(borrower("c", 3));
    tf.write_main(&hcl::config(&blocks));
    tf.apply();
    let ids = ["b", "c"].map(|team| {
        str_of(
            &tf.resource(&format!("gpufleet_tenant_cluster.{team}")),
            "id",
        )
    });

    std::fs::write(&clock, (unix_seconds(&start) + 60).to_string()).expect("write the clock");
    let _log = LogOnPanic(&backend);
    let kept = eventually(
        "the reservation to take its 4 pool nodes back",
        Duration::from_secs(60),
        || async {
            let clusters = backend.admin().await.inventory().await.clusters;
            let nodes = |id: &str| {
                clusters
                    .iter()
                    .find(|c| c.id == id && c.status == "running")
                    .map(|c| c.nodes.len())
            };
            let kept = [nodes(&ids[0])?, nodes(&ids[1])?];
            (kept[0] + kept[1] == 4).then_some(kept)
        },
    )
    .await;
    assert_eq!(kept, [1, 3], "team-b (weight 1) : team-c (weight 3)");

    let mut admin = backend.admin().await;
    for (id, taken, borrowed) in [(&ids[0], 3, 32), (&ids[1], 1, 32)] {
        let events = admin
            .fleet
            .list_events(ListEventsRequest {
                object_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("ListEvents")
            .into_inner()
            .events;
        let preempted: Vec<_> = events.iter().filter(|e| e.kind == "preempted").collect();
        assert_eq!(preempted.len(), taken, "{events:#?}");
        assert!(
            preempted.iter().all(|e| e.message.contains(&format!(
                "(tenant 'team-a') needs the pool nodes back; taken in weighted fair-share order: tenant '{}' held {borrowed} pool GPUs against 0 guaranteed ({borrowed} borrowed, weight {})",
                if *id == ids[0] { "team-b" } else { "team-c" },
                if *id == ids[0] { 1 } else { 3 },
            ))),
            "{preempted:#?}"
        );
    }
}

/// The owner reclaims its lent guarantee through Terraform (issue 42): team-a is
/// guaranteed the whole 2-node pool and lends it while idle; team-b's preemptible cluster
/// borrows both nodes. team-a's own configuration then creates a 1-node cluster within
/// its guarantee: its plan passes (the pool has no free node, but team-b borrows) and the
/// backend's dry run names team-b's cluster as the one it would preempt; the apply takes
/// one node back from team-b, which shrinks to 1 node with a `preempted`
/// event naming team-a and its cluster, and both plans after are empty. team-a's
/// pipeline runs with only its own token (the platform gave it one), as a team's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_creating_a_cluster_within_its_guarantee_takes_its_lent_nodes_back() {
    let backend = Backend::start_with_fleet(&h100_fleet(2));
    let _log = LogOnPanic(&backend);
    // team-a was onboarded with its own token, which its pipeline uses alone.
    let (team_a_tenant, team_a_token) = create_tenant(&mut backend.admin().await, "team-a").await;
    let platform = workdir(&backend);
    platform.write_main(&hcl::config(&[
        hcl::tenant("b", "team-b"),
        hcl::quota("qa", &format!("\"{}\"", team_a_tenant.id), "H100-80GB", 16),
        hcl::quota("qb", "gpufleet_tenant.b.id", "H100-80GB", 0).number("burst_gpus", 16),
        hcl::pool_cluster("borrow", "gpufleet_tenant.b.id", "borrow", "H100-80GB", 2)
            .boolean("preemptible", true)
            .depends_on(&["gpufleet_gpu_quota.qb"]),
    ]));
    platform.apply();
    let borrow = str_of(&platform.resource("gpufleet_tenant_cluster.borrow"), "id");

    // The backend's dry run (what the plan asks) says whom the create would preempt, and
    // preempts nobody.
    let mut admin = backend.admin().await;
    let tenant_a = team_a_tenant.id.clone();
    let dry = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            tenant_id: tenant_a,
            name: "train".into(),
            orchestrator: "kubernetes".into(),
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            validate_only: true,
            ..Default::default()
        })
        .await
        .expect("the dry run")
        .into_inner();
    assert!(
        dry.status_reason.starts_with("takes back 1 H100-80GB pool node lent to other tenants, in weighted fair-share order: ")
            && dry.status_reason.ends_with(" from tenant 'team-b' (preemptible cluster 'borrow')"),
        "{dry:#?}"
    );
    let borrowed = |clusters: &[gpufleet_proto::v1::TenantCluster]| {
        let c = clusters
            .iter()
            .find(|c| c.id == borrow)
            .expect("team-b's cluster");
        (c.node_count, c.nodes.len())
    };
    assert_eq!(borrowed(&admin.inventory().await.clusters), (2, 2));

    let team_a = Terraform::new(&backend, &team_a_token);
    team_a.write_main(&hcl::config(&[hcl::pool_cluster(
        "train",
        "\"team-a\"",
        "train",
        "H100-80GB",
        1,
    )]));
    team_a.init();
    team_a.apply();
    team_a.assert_no_changes();
    let train = team_a.resource("gpufleet_tenant_cluster.train");
    assert_eq!(str_of(&train, "status"), "running", "{train:#}");

    assert_eq!(borrowed(&admin.inventory().await.clusters), (1, 1));
    let events = admin
        .fleet
        .list_events(ListEventsRequest {
            object_id: borrow.clone(),
            ..Default::default()
        })
        .await
        .expect("ListEvents")
        .into_inner()
        .events;
    let preempted: Vec<_> = events.iter().filter(|e| e.kind == "preempted").collect();
    assert_eq!(preempted.len(), 1, "{events:#?}");
    assert!(
        preempted[0].message.starts_with(
            "pool node taken back: tenant 'team-a' takes back its lent guarantee for its cluster 'train'; taken in weighted fair-share order: tenant 'team-b' held 16 pool GPUs against 0 guaranteed (16 borrowed, weight 1); the cluster shrinks"
        ),
        "{preempted:#?}"
    );
    // team-b's configuration still says 2 nodes: its next plan would grow the cluster
    // back, which the pool (now team-a's) refuses; the platform reads the shrink.
    platform
        .plan_fails()
        .assert_mentions(&["node_count: needs 2 H100-80GB pool nodes now"]);
}
