//! Tenants as users name them: by name in the same apply that creates them, and not at all
//! in a team's own pipeline that holds only that team's token.

use gpufleet_e2e::{hcl, Backend, Terraform};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_named_in_the_apply_that_creates_it_plans_applies_and_stays_a_name() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&hcl::config(&[
        hcl::tenant("t", "speech"),
        hcl::quota("h100", "gpufleet_tenant.t.name", "H100-80GB", 8),
        hcl::pool_cluster("train", "gpufleet_tenant.t.name", "train", "H100-80GB", 1)
            .depends_on(&["gpufleet_gpu_quota.h100"]),
    ]));
    tf.init();
    tf.plan();
    tf.apply();
    assert_eq!(tf.resource("gpufleet_gpu_quota.h100")["tenant"], "speech");
    assert_eq!(
        tf.resource("gpufleet_tenant_cluster.train")["tenant"],
        "speech"
    );
    tf.assert_no_changes();
    // The backend holds them under the tenant's id.
    let inventory = backend.admin().await.inventory().await;
    let tenant_id = &inventory.tenants[0].id;
    assert!(inventory.quotas.iter().all(|q| &q.tenant_id == tenant_id));
    assert!(inventory.clusters.iter().all(|c| &c.tenant_id == tenant_id));
    // A typo in a name is an error naming it, at plan (this apply creates no 'speeh').
    tf.write_main(&hcl::config(&[
        hcl::tenant("t", "speech"),
        hcl::quota("h100", "gpufleet_tenant.t.name", "H100-80GB", 8),
        hcl::pool_cluster("train", "gpufleet_tenant.t.name", "train", "H100-80GB", 1)
            .depends_on(&["gpufleet_gpu_quota.h100"]),
        hcl::quota("a100", "\"speeh\"", "A100-80GB", 8),
    ]));
    tf.plan_fails()
        .assert_mentions(&["tenant: tenant 'speeh' not found (did you mean 'speech'?"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_pipeline_with_only_its_token_needs_no_tenant() {
    let backend = Backend::start();
    let platform = Terraform::new(&backend, backend.admin_token());
    platform.keep_credentials_in_state(); // reads the deprecated attributes
    platform.write_main(&hcl::config(&[
        hcl::tenant("red", "red"),
        hcl::quota("h100", "gpufleet_tenant.red.id", "H100-80GB", 16),
        hcl::tenant("blue", "blue"),
    ]));
    platform.init();
    platform.apply();
    let token = platform.resource("gpufleet_tenant.red")["token"]
        .as_str()
        .unwrap()
        .to_string();

    let team = Terraform::new(&backend, &token);
    let start = gpufleet_e2e::times::rfc3339_in_hours(1);
    let end = gpufleet_e2e::times::rfc3339_in_hours(49);
    team.write_main(&format!(
        r#"
resource "gpufleet_reservation" "batch" {{
  gpu_type   = "H100-80GB"
  node_count = 1
  start_time = "{start}"
  end_time   = "{end}"
}}
resource "gpufleet_tenant_cluster" "dev" {{
  tenant       = "red"
  name         = "dev"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
}}
"#
    ));
    team.init();
    team.apply();
    let reservation = team.resource("gpufleet_reservation.batch");
    assert!(reservation["tenant"].is_null(), "{reservation:#}");
    assert_eq!(
        team.resource("gpufleet_tenant_cluster.dev")["tenant"],
        "red"
    );
    team.assert_no_changes();

    // Another team's name answers like a tenant that does not exist, at plan.
    team.write_main(
        r#"
resource "gpufleet_tenant_cluster" "sneaky" {
  tenant       = "blue"
  name         = "sneaky"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
}
"#,
    );
    team.plan_fails()
        .assert_mentions(&["tenant: tenant 'blue' not found (this token's tenant is 'red')"]);
    let blue_clusters = backend
        .admin()
        .await
        .inventory()
        .await
        .clusters
        .into_iter()
        .filter(|c| c.name == "sneaky")
        .count();
    assert_eq!(blue_clusters, 0);
}

/// Dependents that name their tenant by a literal string give Terraform no order, so it
/// deletes them and the tenant in parallel: the tenant delete waits for the deletes under
/// way instead of failing "still has 1 gpu quota(s)". Ten rounds, since the order is
/// Terraform's to choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_tenant_names_apply_and_destroy_in_one_go() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let tenant = hcl::tenant("t", "literal");
    let everything = hcl::config(&[
        tenant.clone(),
        hcl::quota("h100", "\"literal\"", "H100-80GB", 8),
        hcl::quota("a100", "\"literal\"", "A100-80GB", 8),
        hcl::pool_cluster("c", "\"literal\"", "c", "H100-80GB", 1)
            .depends_on(&["gpufleet_gpu_quota.h100"]),
    ]);
    tf.write_main("");
    tf.init();
    for round in 0..10 {
        // The tenant first: a literal name is no reference Terraform could order by.
        tf.write_main(&hcl::config(std::slice::from_ref(&tenant)));
        tf.apply();
        tf.write_main(&everything);
        tf.apply();
        let destroy = tf.run(&["destroy", "-auto-approve", "-no-color", "-input=false"]);
        assert_eq!(destroy.code, 0, "round {round}\n{destroy}");
        let inventory = backend.admin().await.inventory().await;
        assert!(inventory.tenants.is_empty(), "round {round}");
        assert!(inventory.quotas.is_empty() && inventory.clusters.is_empty());
    }
}

/// Twelve teams, each a tenant, a quota and a reservation that uses it: more quota deletes
/// than Terraform runs at once (10), each planned beside the reservation it waits for. The
/// destroy plans and applies, and the waits do not starve each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroy_of_many_quotas_and_their_users_plans_and_applies() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let mut blocks = Vec::new();
    for i in 0..12 {
        let t = format!("team{i}");
        let tenant = format!("gpufleet_tenant.{t}.id");
        blocks.push(hcl::tenant(&t, &t));
        // Burst only: guarantees of the pool's 32 GPUs would not go round 12 teams.
        blocks.push(hcl::quota(&t, &tenant, "H100-80GB", 0).number("burst_gpus", 8));
        // One node each, in windows that do not overlap.
        let start = gpufleet_e2e::times::rfc3339_in_hours(2 + 2 * i);
        let end = gpufleet_e2e::times::rfc3339_in_hours(3 + 2 * i);
        blocks.push(
            hcl::reservation(&t, &tenant, "H100-80GB", 1, &start, &end)
                .depends_on(&[&format!("gpufleet_gpu_quota.{t}")]),
        );
    }
    tf.write_main(&hcl::config(&blocks));
    tf.init();
    tf.apply();
    let began = std::time::Instant::now();
    tf.destroy();
    eprintln!("destroy of 36 objects: {:?}", began.elapsed());
    let inventory = backend.admin().await.inventory().await;
    assert!(inventory.tenants.is_empty() && inventory.quotas.is_empty());
}
