//! Objects made outside Terraform: imported by id (`terraform import` and `import` blocks)
//! with an empty plan afterwards; deleted or changed behind Terraform's back, which the next
//! refresh and plan show and the next apply repairs.

use gpufleet_e2e::fixtures::{create_quota, create_reservation, create_tenant};
use gpufleet_e2e::hcl;
use gpufleet_e2e::json::{array_of, i64_of, str_of};
use gpufleet_e2e::terraform::says_not_found;
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{Backend, Clients, Terraform};
use gpufleet_proto::v1::{
    CreateTenantClusterRequest, DeleteTenantClusterRequest, GetTenantClusterRequest, Reservation,
    Tenant, TenantCluster, UpdateTenantClusterRequest,
};

/// What the API created: a tenant with an H100 quota, an active reservation of 2 nodes and a
/// 1-node cluster on it.
struct Existing {
    tenant: Tenant,
    quota_id: String,
    reservation: Reservation,
    cluster: TenantCluster,
}

async fn create_existing(admin: &mut Clients) -> Existing {
    let (tenant, _token) = create_tenant(admin, "imported").await;
    let quota = create_quota(admin, &tenant.id, "H100-80GB", 16, 0).await;
    let reservation = create_reservation(admin, &tenant.id, "H100-80GB", 2, -1, 48).await;
    let cluster = admin
        .clusters
        .create_tenant_cluster(CreateTenantClusterRequest {
            request_id: gpufleet_e2e::fixtures::request_id(),
            tenant_id: tenant.id.clone(),
            name: "train".to_string(),
            orchestrator: "slurm".to_string(),
            gpu_type: "H100-80GB".to_string(),
            node_count: 1,
            reservation_id: reservation.id.clone(),
            storage_gib: 200,
            mig_layout: Default::default(),
            ..Default::default()
        })
        .await
        .expect("CreateTenantCluster")
        .into_inner();
    Existing {
        tenant,
        quota_id: quota.id,
        reservation,
        cluster,
    }
}

/// Configuration that describes `existing` exactly.
fn matching_config(existing: &Existing) -> String {
    let rfc3339 = |ts: &Option<prost_types::Timestamp>| {
        let seconds = ts.as_ref().expect("reservation has its window").seconds;
        time::OffsetDateTime::from_unix_timestamp(seconds)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    format!(
        r#"
resource "gpufleet_tenant" "t" {{
  name         = "imported"
  display_name = "{display_name}"
}}
resource "gpufleet_gpu_quota" "q" {{
  tenant   = gpufleet_tenant.t.id
  gpu_type = "H100-80GB"
  gpus     = 16
}}
resource "gpufleet_reservation" "r" {{
  tenant     = gpufleet_tenant.t.id
  gpu_type   = "H100-80GB"
  node_count = 2
  start_time = "{start}"
  end_time   = "{end}"
}}
resource "gpufleet_tenant_cluster" "c" {{
  tenant         = gpufleet_tenant.t.id
  name           = "train"
  orchestrator   = "slurm"
  gpu_type       = "H100-80GB"
  node_count     = 1
  reservation_id = gpufleet_reservation.r.id
  storage_gib    = 200
}}
"#,
        display_name = existing.tenant.display_name,
        start = rfc3339(&existing.reservation.start_time),
        end = rfc3339(&existing.reservation.end_time),
    )
}

fn assert_state_matches(tf: &Terraform, existing: &Existing) {
    let tenant = tf.resource("gpufleet_tenant.t");
    assert_eq!(str_of(&tenant, "id"), existing.tenant.id);
    assert_eq!(str_of(&tenant, "name"), "imported");
    let quota = tf.resource("gpufleet_gpu_quota.q");
    assert_eq!(str_of(&quota, "id"), existing.quota_id);
    assert_eq!(str_of(&quota, "tenant"), existing.tenant.id);
    assert_eq!(i64_of(&quota, "gpus"), 16);
    let reservation = tf.resource("gpufleet_reservation.r");
    assert_eq!(str_of(&reservation, "id"), existing.reservation.id);
    assert_eq!(i64_of(&reservation, "node_count"), 2);
    assert_eq!(str_of(&reservation, "status"), "active");
    let cluster = tf.resource("gpufleet_tenant_cluster.c");
    assert_eq!(str_of(&cluster, "id"), existing.cluster.id);
    assert_eq!(str_of(&cluster, "reservation_id"), existing.reservation.id);
    assert_eq!(str_of(&cluster, "endpoint"), existing.cluster.endpoint);
    assert!(!existing.cluster.credentials.is_empty());
    assert!(
        cluster["credentials"].is_null(),
        "an import keeps no credentials in state (store_credentials_in_state is false by default)"
    );
    let nodes = array_of(&cluster, "nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        str_of(&nodes[0], "hostname"),
        existing.cluster.nodes[0].hostname
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_import_adopts_every_resource_with_no_changes_after() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let existing = create_existing(&mut admin).await;
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&matching_config(&existing));
    tf.init();

    tf.import("gpufleet_tenant.t", &existing.tenant.id);
    tf.import("gpufleet_gpu_quota.q", &existing.quota_id);
    tf.import("gpufleet_reservation.r", &existing.reservation.id);
    tf.import("gpufleet_tenant_cluster.c", &existing.cluster.id);

    assert_state_matches(&tf, &existing);
    tf.assert_no_changes();
    // Import read, it did not create: the backend still holds exactly one of each.
    let inventory = admin.inventory().await;
    assert_eq!(inventory.tenants.len(), 1);
    assert_eq!(inventory.clusters.len(), 1);
}

/// Import stores the tenant's id; a configuration that names the tenant by name is the
/// same tenant spelled another way: the plan changes the spelling in place (nothing is
/// replaced), and after the apply state keeps the name and the next plan is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_objects_named_by_tenant_name_change_spelling_in_place() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let existing = create_existing(&mut admin).await;
    let tf = Terraform::new(&backend, backend.admin_token());
    let by_name =
        matching_config(&existing).replace("gpufleet_tenant.t.id", "gpufleet_tenant.t.name");
    tf.write_main(&by_name);
    tf.init();
    tf.import("gpufleet_tenant.t", &existing.tenant.id);
    tf.import("gpufleet_gpu_quota.q", &existing.quota_id);
    tf.import("gpufleet_reservation.r", &existing.reservation.id);
    tf.import("gpufleet_tenant_cluster.c", &existing.cluster.id);

    for address in [
        "gpufleet_gpu_quota.q",
        "gpufleet_reservation.r",
        "gpufleet_tenant_cluster.c",
    ] {
        assert_eq!(
            tf.planned_actions(address),
            vec!["update".to_string()],
            "{address}: a new spelling of the same tenant is no replacement"
        );
    }
    tf.apply();
    for address in [
        "gpufleet_gpu_quota.q",
        "gpufleet_reservation.r",
        "gpufleet_tenant_cluster.c",
    ] {
        assert_eq!(
            str_of(&tf.resource(address), "tenant"),
            "imported",
            "{address}"
        );
    }
    assert_eq!(
        str_of(&tf.resource("gpufleet_tenant_cluster.c"), "id"),
        existing.cluster.id,
        "the cluster was kept, not replaced"
    );
    assert_eq!(
        str_of(&tf.resource("gpufleet_gpu_quota.q"), "id"),
        existing.quota_id
    );
    tf.assert_no_changes();

    // Naming another tenant is still a replacement.
    let (_other, _) = create_tenant(&mut admin, "other").await;
    tf.write_main(&by_name.replacen("gpufleet_tenant.t.name", "\"other\"", 1));
    assert_eq!(
        tf.planned_actions("gpufleet_gpu_quota.q"),
        vec!["delete".to_string(), "create".to_string()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_blocks_adopt_every_resource_with_no_changes_after() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let existing = create_existing(&mut admin).await;
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&matching_config(&existing));
    tf.write_file(
        "imports.tf",
        &format!(
            r#"
import {{
  to = gpufleet_tenant.t
  id = "{tenant}"
}}
import {{
  to = gpufleet_gpu_quota.q
  id = "{quota}"
}}
import {{
  to = gpufleet_reservation.r
  id = "{reservation}"
}}
import {{
  to = gpufleet_tenant_cluster.c
  id = "{cluster}"
}}
"#,
            tenant = existing.tenant.id,
            quota = existing.quota_id,
            reservation = existing.reservation.id,
            cluster = existing.cluster.id,
        ),
    );
    tf.init();

    let plan = tf.plan();
    plan.assert_mentions(&["4 to import, 0 to add, 0 to change, 0 to destroy"]);
    tf.apply();
    assert_state_matches(&tf, &existing);
    tf.assert_no_changes();
    assert_eq!(admin.inventory().await.clusters.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn importing_an_unknown_id_is_a_clear_error() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(
        r#"
resource "gpufleet_tenant" "t" {
  name = "ghost"
}
"#,
    );
    tf.init();
    let run = tf.run_fails(&[
        "import",
        "-no-color",
        "-input=false",
        "gpufleet_tenant.t",
        "no-such-tenant",
    ]);
    run.assert_mentions(&["no-such-tenant"]);
    assert!(
        says_not_found(&run.output()),
        "import of an unknown id must say it was not found\n{run}"
    );
    assert!(tf.state_list().is_empty());
}

/// A tenant, its quota and a 1-node pool cluster, created through Terraform.
fn pool_cluster_config(node_count: i64) -> String {
    format!(
        r#"
resource "gpufleet_tenant" "t" {{
  name = "drifty"
}}
resource "gpufleet_gpu_quota" "q" {{
  tenant   = gpufleet_tenant.t.id
  gpu_type = "H100-80GB"
  gpus     = 24
}}
resource "gpufleet_tenant_cluster" "c" {{
  tenant       = gpufleet_tenant.t.id
  name         = "pool"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = {node_count}
  depends_on   = [gpufleet_gpu_quota.q]
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_outside_terraform_leaves_state_on_refresh_and_is_recreated() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&pool_cluster_config(1));
    tf.init();
    tf.apply();
    let old_id = str_of(&tf.resource("gpufleet_tenant_cluster.c"), "id");

    let mut admin = backend.admin().await;
    admin
        .clusters
        .delete_tenant_cluster(DeleteTenantClusterRequest { id: old_id.clone() })
        .await
        .expect("DeleteTenantCluster");

    tf.refresh();
    assert!(
        !tf.state_list()
            .contains(&"gpufleet_tenant_cluster.c".to_string()),
        "refresh drops the deleted cluster from state"
    );
    assert_eq!(
        tf.planned_actions("gpufleet_tenant_cluster.c"),
        vec!["create"]
    );

    tf.apply();
    let clusters = admin.inventory().await.clusters;
    assert_eq!(clusters.len(), 1);
    assert_ne!(
        clusters[0].id, old_id,
        "a new cluster replaces the deleted one"
    );
    assert_eq!(
        str_of(&tf.resource("gpufleet_tenant_cluster.c"), "id"),
        clusters[0].id
    );
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_outside_terraform_shows_as_drift_and_apply_converges() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&pool_cluster_config(1));
    tf.init();
    tf.apply();
    let id = str_of(&tf.resource("gpufleet_tenant_cluster.c"), "id");

    let mut admin = backend.admin().await;
    admin
        .clusters
        .update_tenant_cluster(UpdateTenantClusterRequest {
            id: id.clone(),
            node_count: 2,
            storage_gib: 0,
            mig_layout: Default::default(),
            set_mig_layout: false,
            ..Default::default()
        })
        .await
        .expect("UpdateTenantCluster node_count 2");

    assert_eq!(tf.plan_detailed_exitcode(), 2, "the drift is a change");
    let (changes, text) = tf.plan_changes();
    let change = changes
        .iter()
        .find(|c| c.address == "gpufleet_tenant_cluster.c")
        .expect("cluster in plan");
    assert_eq!(change.actions, vec!["update"], "{text}");
    assert_eq!(change.detail["change"]["before"]["node_count"], 2, "{text}");
    assert_eq!(change.detail["change"]["after"]["node_count"], 1, "{text}");
    text.assert_mentions(&["node_count", "2 -> 1"]);

    tf.apply();
    let cluster = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest { id: id.clone() })
        .await
        .expect("GetTenantCluster")
        .into_inner();
    assert_eq!(
        cluster.node_count, 1,
        "apply converges to the configuration"
    );
    assert_eq!(cluster.nodes.len(), 1);
    assert_eq!(str_of(&tf.resource("gpufleet_tenant_cluster.c"), "id"), id);
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_deleted_outside_terraform_is_recreated() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let start = rfc3339_in_hours(2);
    let end = rfc3339_in_hours(26);
    tf.write_main(&hcl::config(&[
        hcl::tenant("t", "later"),
        hcl::quota("q", "gpufleet_tenant.t.id", "H200-141GB", 16),
        hcl::reservation("r", "gpufleet_tenant.t.id", "H200-141GB", 1, &start, &end)
            .depends_on(&["gpufleet_gpu_quota.q"]),
    ]));
    tf.init();
    tf.apply();
    assert_eq!(
        str_of(&tf.resource("gpufleet_reservation.r"), "status"),
        "scheduled"
    );
    let old_id = str_of(&tf.resource("gpufleet_reservation.r"), "id");
    let mut admin = backend.admin().await;
    admin
        .reservations
        .delete_reservation(gpufleet_proto::v1::DeleteReservationRequest { id: old_id.clone() })
        .await
        .expect("DeleteReservation");

    assert_eq!(tf.planned_actions("gpufleet_reservation.r"), vec!["create"]);
    tf.apply();
    let reservations = admin.inventory().await.reservations;
    assert_eq!(reservations.len(), 1);
    assert_ne!(reservations[0].id, old_id);
    tf.assert_no_changes();
}

/// `vision`'s 16-GPU H100 quota and 1-node cluster `cv`, made outside Terraform; the
/// configuration that describes them with `tenant` spelled `tenant` (an HCL expression,
/// or None to leave it out).
fn vision_config(tenant: Option<&str>) -> String {
    let tenant = tenant.map_or(String::new(), |t| format!("  tenant       = {t}\n"));
    format!(
        r#"
resource "gpufleet_gpu_quota" "q" {{
{tenant}  gpu_type     = "H100-80GB"
  gpus         = 16
}}
resource "gpufleet_tenant_cluster" "c" {{
{tenant}  name         = "cv"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
}}
"#
    )
}

/// Users know names: clusters import by `TENANT/NAME` and quotas by `TENANT/GPU_TYPE`
/// (the tenant by name or id; with a tenant token the name alone), and the next plan is
/// empty however the configuration spells the tenant, as long as the import id spelled it
/// the same way (a tenant token's configuration leaving it out imports by name or id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_by_tenant_and_name_plan_nothing_whichever_way_tenant_is_spelled() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (vision, token) = create_tenant(&mut admin, "vision").await;
    let quota = create_quota(&mut admin, &vision.id, "H100-80GB", 16, 0).await;
    let cluster =
        gpufleet_e2e::fixtures::create_pool_cluster(&mut admin, &vision.id, "cv", "H100-80GB", 1)
            .await;
    let admin_tf = Terraform::new(&backend, backend.admin_token());
    let team_tf = Terraform::new(&backend, &token);
    let id = hcl::id(&vision.id);
    let cases: [(&Terraform, Option<&str>, String, String); 6] = [
        (
            &admin_tf,
            Some("\"vision\""),
            "vision/H100-80GB".into(),
            "vision/cv".into(),
        ),
        (
            &admin_tf,
            Some(&id),
            format!("{}/H100-80GB", vision.id),
            format!("{}/cv", vision.id),
        ),
        (&team_tf, None, "H100-80GB".into(), "cv".into()),
        (&team_tf, None, quota.id.clone(), cluster.id.clone()),
        // The team's configuration leaves `tenant` out; the import id names it (issue 40).
        (
            &team_tf,
            None,
            "vision/H100-80GB".into(),
            "vision/cv".into(),
        ),
        (
            &team_tf,
            Some("\"vision\""),
            "vision/H100-80GB".into(),
            "vision/cv".into(),
        ),
    ];
    for (tf, tenant, quota_import, cluster_import) in cases {
        tf.write_main(&vision_config(tenant));
        tf.init();
        for address in ["gpufleet_gpu_quota.q", "gpufleet_tenant_cluster.c"] {
            if tf.state_list().iter().any(|a| a == address) {
                tf.run_ok(&["state", "rm", address]);
            }
        }
        tf.import("gpufleet_gpu_quota.q", &quota_import);
        tf.import("gpufleet_tenant_cluster.c", &cluster_import);
        assert_eq!(
            str_of(&tf.resource("gpufleet_tenant_cluster.c"), "id"),
            cluster.id,
            "{cluster_import}"
        );
        tf.assert_no_changes();
    }
    // A health check the team applied, forgotten and imported by its cluster's id: the
    // plan after is empty (issue 40);
    // `triggers`, which the backend does not keep, are recorded in place with no new run.
    for (inputs, adopts) in [
        ("", false),
        ("  triggers   = { week = \"2027-W03\" }\n", true),
    ] {
        team_tf.write_main(&format!(
            "{}resource \"gpufleet_health_check\" \"h\" {{\n  cluster_id = gpufleet_tenant_cluster.c.id\n{inputs}}}\n",
            vision_config(None)
        ));
        team_tf.apply();
        let run = str_of(&team_tf.resource("gpufleet_health_check.h"), "id");
        team_tf.run_ok(&["state", "rm", "gpufleet_health_check.h"]);
        team_tf.import("gpufleet_health_check.h", &cluster.id);
        if adopts {
            assert_eq!(
                team_tf.planned_actions("gpufleet_health_check.h"),
                vec!["update"]
            );
            team_tf.apply();
        }
        team_tf.assert_no_changes();
        assert_eq!(
            str_of(&team_tf.resource("gpufleet_health_check.h"), "id"),
            run,
            "the imported run, not a new one"
        );
    }
    // A name the tenant does not have, or a tenant that does not exist: said so.
    let run = admin_tf.run_fails(&[
        "import",
        "-no-color",
        "-input=false",
        "gpufleet_tenant_cluster.c",
        "vision/nosuch",
    ]);
    run.assert_mentions(&["no tenant cluster \"vision/nosuch\": not found"]);
    admin_tf.run_ok(&["state", "rm", "gpufleet_tenant_cluster.c"]);
    let run = admin_tf.run_fails(&[
        "import",
        "-no-color",
        "-input=false",
        "gpufleet_tenant_cluster.c",
        "vison/cv",
    ]);
    run.assert_mentions(&["tenant 'vison' not found (did you mean 'vision'?"]);
}
