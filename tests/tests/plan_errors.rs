//! Bad input is refused at plan time, with an error that names the attribute and the
//! reason, and nothing reaches the backend (`apply` stops at its plan too).

use gpufleet_e2e::fixtures::{create_pool_cluster, create_quota, create_tenant};
use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{Backend, Terraform, TfRun};

const TENANT: &str = "gpufleet_tenant.t.id";

/// The tenant `t` ("team") followed by `blocks`.
fn with_tenant(blocks: &[Block]) -> String {
    let mut all = vec![hcl::tenant("t", "team")];
    all.extend_from_slice(blocks);
    hcl::config(&all)
}

/// An H100 reservation of `node_count` nodes from `start` to `end` hours from now.
fn h100_reservation(tenant: &str, node_count: i64, start: i64, end: i64) -> Block {
    hcl::reservation(
        "r",
        tenant,
        "H100-80GB",
        node_count,
        &rfc3339_in_hours(start),
        &rfc3339_in_hours(end),
    )
}

/// Plans `hcl`, asserts that it fails mentioning each of `needles`; then applies it and
/// asserts that the apply fails the same way and the backend holds what it held before.
async fn assert_refused_at_plan(backend: &Backend, tf: &Terraform, hcl: &str, needles: &[&str]) {
    let before = backend.admin().await.inventory().await;
    tf.write_main(hcl);
    let plan: TfRun = tf.plan_fails();
    plan.assert_mentions(needles);
    let apply = tf.apply_fails();
    apply.assert_mentions(needles);
    let after = backend.admin().await.inventory().await;
    assert_eq!(before, after, "a refused plan changed the backend\n{apply}");
}

/// A backend and a working dir with the admin token, initialised.
fn admin_workdir() -> (Backend, Terraform) {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main("");
    tf.init();
    (backend, tf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tenant_name_is_refused() {
    let (backend, tf) = admin_workdir();
    // A valid sibling shows that nothing at all is applied when one resource is refused.
    let hcl = hcl::config(&[
        hcl::tenant("ok", "fine-name"),
        hcl::tenant("bad", "Bad_Name"),
    ]);
    assert_refused_at_plan(&backend, &tf, &hcl, &["name", "Bad_Name", "DNS label"]).await;

    let hcl = hcl::config(&[hcl::tenant("bad", &"a".repeat(64))]);
    assert_refused_at_plan(&backend, &tf, &hcl, &["name", "63"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_gpu_model_or_tenant_left_out_by_the_admin_is_refused_saying_what_to_write() {
    let (backend, tf) = admin_workdir();
    let hcl = with_tenant(&[hcl::quota("q", TENANT, "V100-16GB", 8)]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &[
            "gpu_type",
            "V100-16GB",
            "H100-80GB",
            "A100-80GB",
            "H200-141GB",
        ],
    )
    .await;
    // A model in the wrong case gets the right one (issue 40).
    let hcl = with_tenant(&[hcl::quota("q", TENANT, "h100-80gb", 8)]);
    let wanted = ["gpu_type", "h100-80gb", "did you mean \"H100-80GB\"?"];
    assert_refused_at_plan(&backend, &tf, &hcl, &wanted).await;
    // The admin token leaving `tenant` out is told why it is needed.
    let hcl = with_tenant(&[
        Block::resource("gpufleet_gpu_quota", "q")
            .string("gpu_type", "H100-80GB")
            .number("gpus", 8),
        hcl::pool_cluster("c", TENANT, "train", "H100-80GB", 1).expr("tenant", "null"),
    ]);
    let wanted = [
        "tenant: required with the admin token, which belongs to no tenant (only it creates quotas)",
        "tenant: required with the admin token, which belongs to no tenant; name the tenant (by name or id), or use the tenant's own token",
    ];
    assert_refused_at_plan(&backend, &tf, &hcl, &wanted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_ending_before_it_starts_is_refused() {
    let (backend, tf) = admin_workdir();
    let hcl = with_tenant(&[h100_reservation(TENANT, 1, 48, 24)]);
    assert_refused_at_plan(&backend, &tf, &hcl, &["end_time", "start_time"]).await;

    let hcl = with_tenant(&[h100_reservation(TENANT, 1, 1, 24).string("start_time", "tomorrow")]);
    assert_refused_at_plan(&backend, &tf, &hcl, &["start_time", "RFC 3339"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_below_one_are_refused() {
    let (backend, tf) = admin_workdir();
    let reservation = with_tenant(&[h100_reservation(TENANT, 0, 1, 24)]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &reservation,
        &["node_count", "at least 1", "0"],
    )
    .await;

    let cluster = with_tenant(&[hcl::pool_cluster("c", TENANT, "c", "H100-80GB", -2)]);
    assert_refused_at_plan(&backend, &tf, &cluster, &["node_count", "at least 1", "-2"]).await;

    let quota = with_tenant(&[hcl::quota("q", TENANT, "H100-80GB", -1)]);
    assert_refused_at_plan(&backend, &tf, &quota, &["gpus", "-1"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orchestrator_must_be_kubernetes_or_slurm() {
    let (backend, tf) = admin_workdir();
    let hcl = with_tenant(&[
        hcl::pool_cluster("c", TENANT, "c", "H100-80GB", 1).string("orchestrator", "nomad")
    ]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &["orchestrator", "nomad", "kubernetes", "slurm"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_surely_short_is_refused_with_the_numbers() {
    let (backend, tf) = admin_workdir();
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "team").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 16, 0).await;

    // 3 nodes x 8 GPUs = 24 GPUs against a quota of 16.
    let tenant_id = hcl::id(&tenant.id);
    let hcl = hcl::config(&[h100_reservation(&tenant_id, 3, 1, 24)]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &["node_count", "24", "H100-80GB", "16"],
    )
    .await;

    // The same through a cluster from the pool.
    let hcl = hcl::config(&[hcl::pool_cluster("c", &tenant_id, "big", "H100-80GB", 3)]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &["node_count", "24", "H100-80GB", "16"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_capacity_surely_short_is_refused_with_the_numbers() {
    let (backend, tf) = admin_workdir();
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "team").await;
    // The pool has 16 A100 GPUs to guarantee; the rest of the quota is burst.
    create_quota(&mut admin, &tenant.id, "A100-80GB", 16, 48).await;

    // The default fleet has 2 A100-80GB nodes and no on-demand A100 capacity.
    let hcl = hcl::config(&[h100_reservation(&hcl::id(&tenant.id), 3, 1, 24)
        .string("gpu_type", "A100-80GB")
        .boolean("allow_on_demand", true)]);
    assert_refused_at_plan(&backend, &tf, &hcl, &["node_count", "3", "2", "A100-80GB"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_a_quota_below_use_is_refused_with_the_numbers() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let config = |gpus: i64| with_tenant(&[hcl::quota("q", TENANT, "H100-80GB", gpus)]);
    tf.write_main(&config(16));
    tf.init();
    tf.apply();
    // 8 GPUs in use through a cluster made outside this configuration.
    let mut admin = backend.admin().await;
    let tenant_id = tf.resource("gpufleet_tenant.t")["id"]
        .as_str()
        .unwrap()
        .to_string();
    create_pool_cluster(&mut admin, &tenant_id, "inuse", "H100-80GB", 1).await;

    assert_refused_at_plan(&backend, &tf, &config(4), &["gpus", "4", "8"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_cluster_larger_than_the_free_pool_is_refused_at_plan_time() {
    let (backend, tf) = admin_workdir();
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "team").await;
    // The pool has 16 A100 GPUs to guarantee; the rest of the quota is burst.
    create_quota(&mut admin, &tenant.id, "A100-80GB", 16, 48).await;

    // The default fleet has 2 A100-80GB pool nodes; clusters never take on-demand ones.
    let hcl = hcl::config(&[hcl::pool_cluster(
        "c",
        &hcl::id(&tenant.id),
        "big",
        "A100-80GB",
        3,
    )]);
    assert_refused_at_plan(&backend, &tf, &hcl, &["node_count", "3", "2", "A100-80GB"]).await;
}

/// A team pipeline holding only its token (its tenant left out, as the docs recommend)
/// gives its cluster ssh keys the login cannot take: each is refused at plan, naming
/// `ssh_public_keys` and why, on that attribute (Terraform quotes its line of the HCL,
/// not `node_count`'s), and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_pipelines_unusable_ssh_keys_are_refused_at_plan() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, token) = create_tenant(&mut admin, "ml").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let tf = Terraform::new(&backend, &token);
    tf.write_main("");
    tf.init();
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIUbCEB1wtwHnPpUtmvbvCP/oP71XRKXWqho1010j2Sr alice@laptop";
    let cluster = |orchestrator: &str, keys: &str| {
        format!(
            r#"
resource "gpufleet_tenant_cluster" "train" {{
  name            = "train"
  orchestrator    = "{orchestrator}"
  gpu_type        = "H100-80GB"
  node_count      = 1
  ssh_public_keys = [{keys}]
}}
"#
        )
    };
    for (hcl, needles) in [
        (
            cluster("kubernetes", &format!("{key:?}")),
            vec!["ssh_public_keys", "only a Slurm cluster has a login"],
        ),
        (
            cluster(
                "slurm",
                &format!("{:?}", format!("command=\"/bin/sh\" {key}")),
            ),
            vec!["ssh_public_keys[0]", "without options"],
        ),
        (
            cluster(
                "slurm",
                &format!("{key:?}, {:?}", key.replace("alice", "bob")),
            ),
            vec!["ssh_public_keys[1]", "listed twice"],
        ),
        (
            cluster("slurm", r#""ssh-ed25519 AAAAC3NzaC1yc2E=""#),
            vec!["ssh_public_keys[0]", "not a ssh-ed25519 key"],
        ),
    ] {
        let mut needles = needles;
        // The diagnostic's source line: the attribute's own.
        needles.push("ssh_public_keys = [");
        assert_refused_at_plan(&backend, &tf, &hcl, &needles).await;
        let plan = tf.plan_fails();
        assert!(
            !plan.output().contains("node_count      = 1"),
            "the refusal points at node_count\n{plan}"
        );
    }
}

/// What apply would refuse about the tenant, its quota and a cluster's name is refused at
/// plan, on the attribute, through the backend's dry run: a mistyped tenant (the answer
/// lists the tenants there are), a model without quota, a tenant made with a tenant's
/// token, another team's tenant (answered exactly like one that does not exist), and a
/// name the tenant already uses (with the quota's verdict in the same plan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_apply_would_refuse_is_refused_at_plan() {
    let (backend, tf) = admin_workdir();
    let mut admin = backend.admin().await;
    let (vision, _) = create_tenant(&mut admin, "vision").await;
    let (_, speech_token) = create_tenant(&mut admin, "speech").await;
    create_quota(&mut admin, &vision.id, "H100-80GB", 16, 0).await;
    create_pool_cluster(&mut admin, &vision.id, "cv", "H100-80GB", 1).await;

    // A typo in the tenant's name: the names there are, the nearest first.
    let hcl = hcl::config(&[hcl::pool_cluster("c", "\"vison\"", "det", "H100-80GB", 1)]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &[
            "tenant: tenant 'vison' not found (did you mean 'vision'? tenants: vision, speech)",
            "tenant       = \"vison\"",
        ],
    )
    .await;

    // A model the tenant has no quota for, by name and by id.
    for tenant in ["\"vision\"".to_string(), hcl::id(&vision.id)] {
        let hcl = hcl::config(&[hcl::pool_cluster("c", &tenant, "big", "H200-141GB", 1)]);
        assert_refused_at_plan(
            &backend,
            &tf,
            &hcl,
            &["tenant 'vision' has no quota for H200-141GB"],
        )
        .await;
    }

    // A second cluster named like one the tenant has, asking for more than its quota:
    // both are said.
    let hcl = hcl::config(&[hcl::pool_cluster("c", "\"vision\"", "cv", "H100-80GB", 3)]);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &[
            "name: tenant 'vision' already has a cluster named 'cv'",
            "name         = \"cv\"",
            "quota",
        ],
    )
    .await;

    // A team's own token: no tenants, and the other team's tenant does not exist for it.
    let team = Terraform::new(&backend, &speech_token);
    team.write_main("");
    team.init();
    let hcl = hcl::config(&[hcl::tenant("new", "newteam")]);
    assert_refused_at_plan(
        &backend,
        &team,
        &hcl,
        &[
            "creating a tenant needs the admin token",
            "name = \"newteam\"",
        ],
    )
    .await;
    let mut said = Vec::new();
    for tenant in ["vision", "nosuch"] {
        let hcl = hcl::config(&[hcl::pool_cluster(
            "c",
            &format!("\"{tenant}\""),
            "sneaky",
            "H100-80GB",
            1,
        )]);
        team.write_main(&hcl);
        let plan = team.plan_fails();
        plan.assert_mentions(&[&format!(
            "tenant: tenant '{tenant}' not found (this token's tenant is 'speech')"
        )]);
        said.push(plan.output().replace(tenant, "TENANT"));
    }
    assert_eq!(said[0], said[1], "another team's tenant answers like none");
    assert!(backend
        .admin()
        .await
        .inventory()
        .await
        .clusters
        .iter()
        .all(|c| c.name != "sneaky"));
}

/// A platform configuration of teams (a tenant and two quotas each, from one map): a team
/// dropped from the map while its cluster (in the team's own configuration) still exists
/// is refused at plan, so nothing is half-deleted; dropping the cluster in the same plan
/// as its quota is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_platform_change_that_drops_a_team_whose_cluster_exists_is_refused_at_plan() {
    let (backend, tf) = admin_workdir();
    let platform = |teams: &[&str], cluster: bool| {
        let list = teams
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut hcl = format!(
            r#"
locals {{
  teams = toset([{list}])
}}
resource "gpufleet_tenant" "team" {{
  for_each = local.teams
  name     = each.key
}}
resource "gpufleet_gpu_quota" "h100" {{
  for_each = local.teams
  tenant   = gpufleet_tenant.team[each.key].id
  gpu_type = "H100-80GB"
  gpus     = 8
}}
resource "gpufleet_gpu_quota" "a100" {{
  for_each = local.teams
  tenant   = gpufleet_tenant.team[each.key].id
  gpu_type = "A100-80GB"
  gpus     = 8
}}
"#
        );
        if cluster {
            hcl.push_str(
                r#"
resource "gpufleet_tenant_cluster" "speech" {
  tenant       = gpufleet_tenant.team["speech"].id
  name         = "asr"
  orchestrator = "kubernetes"
  gpu_type     = "A100-80GB"
  node_count   = 1
  depends_on   = [gpufleet_gpu_quota.a100]
}
"#,
            );
        }
        hcl
    };
    tf.write_main(&platform(&["vision", "speech"], true));
    tf.apply();
    // The vision team's own pipeline runs its cluster.
    let vision = backend
        .admin()
        .await
        .inventory()
        .await
        .tenants
        .into_iter()
        .find(|t| t.name == "vision")
        .unwrap();
    let mut admin = backend.admin().await;
    create_pool_cluster(&mut admin, &vision.id, "cv", "H100-80GB", 1).await;

    // The tenant is planned first (its quotas refer to it): its check names the cluster.
    let hcl = platform(&["speech"], true);
    assert_refused_at_plan(
        &backend,
        &tf,
        &hcl,
        &[
            "tenant 'vision' still has 2 gpu quota(s), 0 reservation(s) and 1 cluster(s)",
            "cluster 'cv'",
        ],
    )
    .await;

    // The speech team and its cluster go in one change: planned and applied.
    tf.write_main(&platform(&["vision"], false));
    tf.apply();
    let inventory = backend.admin().await.inventory().await;
    assert!(inventory.tenants.iter().all(|t| t.name != "speech"));
    assert!(inventory.clusters.iter().all(|c| c.name != "asr"));
}

/// Dropping a tenant whose team still has a quota and a cluster that the plan does not
/// delete (the team's own pipeline made them) is refused at plan, naming them, for
/// `terraform destroy` too; the apply deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_delete_with_dependents_is_refused_at_plan_naming_them() {
    let (backend, tf) = admin_workdir();
    tf.write_main(&with_tenant(&[]));
    tf.apply();
    let mut admin = backend.admin().await;
    let tenant = admin
        .inventory()
        .await
        .tenants
        .into_iter()
        .find(|t| t.name == "team")
        .expect("the tenant");
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    create_pool_cluster(&mut admin, &tenant.id, "cv", "H100-80GB", 1).await;

    let needles = [
        "tenant 'team' still has 1 gpu quota(s), 0 reservation(s) and 1 cluster(s)",
        "the H100-80GB quota",
        "cluster 'cv'",
        "Not deleted beside the tenant by this plan: 2 of them",
    ];
    assert_refused_at_plan(&backend, &tf, "", &needles).await;
    tf.run_fails(&["destroy", "-auto-approve", "-input=false", "-no-color"])
        .assert_mentions(&needles);
    let inventory = backend.admin().await.inventory().await;
    assert!(inventory.tenants.iter().any(|t| t.name == "team"));
    assert!(inventory.clusters.iter().any(|c| c.name == "cv"));
}

/// A team's second configuration planning a cluster whose name the tenant already has
/// (made by its first configuration, with the same text) is refused at plan on `name`,
/// naming the cluster and the `terraform import` that adopts it, before any quota reason:
/// with the quota full (issue 40: the duplicate was reported as the quota, or planned as
/// `1 to add`) and with room; a second quota of a model likewise (before the pool's
/// verdict), a tenant's name and a token's. The apply creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_configuration_creating_what_the_tenant_has_is_told_to_import_it() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, token) = create_tenant(&mut admin, "team-b").await;
    // One H100 node's 8 GPUs: the first configuration's cluster fills the quota.
    let quota = create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;
    let asr =
        |tenant: &str| hcl::config(&[hcl::pool_cluster("asr", tenant, "asr", "H100-80GB", 1)]);
    let first = Terraform::new(&backend, &token);
    first.write_main(&asr("\"team-b\""));
    first.init();
    first.apply();
    let id = first.resource("gpufleet_tenant_cluster.asr")["id"]
        .as_str()
        .unwrap()
        .to_string();

    let second = Terraform::new(&backend, &token);
    second.write_main("");
    second.init();
    let taken = format!("name: tenant 'team-b' already has a cluster named 'asr' (id {id})");
    let needles = [
        taken.as_str(),
        "name         = \"asr\"",
        "terraform import gpufleet_tenant_cluster.NAME team-b/asr",
    ];
    // The tenant written, and left out (the token's own).
    for tenant in ["\"team-b\"", "null"] {
        assert_refused_at_plan(&backend, &second, &asr(tenant), &needles).await;
        // The duplicate comes first; the full quota may follow, never instead.
        let plan = second.plan_fails();
        let output = plan.output();
        let quota = output.find("quota").unwrap_or(usize::MAX);
        assert!(output.find(&taken).unwrap() < quota, "{plan}");
    }

    // With room in the quota: the same refusal.
    admin
        .quotas
        .update_gpu_quota(gpufleet_proto::v1::UpdateGpuQuotaRequest {
            id: quota.id.clone(),
            gpus: 16,
            ..Default::default()
        })
        .await
        .expect("raise the quota");
    assert_refused_at_plan(&backend, &second, &asr("\"team-b\""), &needles).await;

    // The same for a quota the tenant has, asking for more than the pool holds: the
    // duplicate, not the pool.
    let platform = Terraform::new(&backend, backend.admin_token());
    platform.write_main("");
    platform.init();
    let hcl = hcl::config(&[hcl::quota("h100", "\"team-b\"", "H100-80GB", 100_000)]);
    let taken = format!(
        "gpu_type: tenant 'team-b' already has a H100-80GB quota (id {})",
        quota.id
    );
    let needles = [
        taken.as_str(),
        "terraform import gpufleet_gpu_quota.NAME team-b/H100-80GB",
    ];
    assert_refused_at_plan(&backend, &platform, &hcl, &needles).await;

    // A tenant, and a token name in use (another configuration's token).
    let hcl = hcl::config(&[hcl::tenant("b", "team-b")]);
    let needles = [
        "name: a tenant named 'team-b' already exists",
        "terraform import gpufleet_tenant.NAME team-b",
    ];
    assert_refused_at_plan(&backend, &platform, &hcl, &needles).await;
    let ci = hcl::config(&[Block::resource("gpufleet_tenant_token", "ci")
        .string("tenant", "team-b")
        .string("name", "ci")
        .string("scope", "read")]);
    platform.write_main(&ci);
    platform.apply();
    let other = Terraform::new(&backend, backend.admin_token());
    other.write_main("");
    other.init();
    let needles = [
        "already has a token named 'ci'",
        "terraform import gpufleet_tenant_token.NAME team-b/ci",
    ];
    assert_refused_at_plan(&backend, &other, &ci, &needles).await;
}
