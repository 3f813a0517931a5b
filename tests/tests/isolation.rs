//! Two tenants, each driving its own configuration with its own token in its own working
//! directory: neither can see, change or adopt the other's objects.

use gpufleet_e2e::json::str_of;
use gpufleet_e2e::terraform::says_not_found;
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::{GetTenantClusterRequest, UpdateTenantClusterRequest};

/// The admin's configuration: two tenants with an H100 quota each; their tokens as outputs.
const ADMIN_HCL: &str = r#"
resource "gpufleet_tenant" "alpha" {
  name = "alpha"
}
resource "gpufleet_tenant" "beta" {
  name = "beta"
}
resource "gpufleet_gpu_quota" "alpha" {
  tenant   = gpufleet_tenant.alpha.id
  gpu_type = "H100-80GB"
  gpus     = 16
}
resource "gpufleet_gpu_quota" "beta" {
  tenant   = gpufleet_tenant.beta.id
  gpu_type = "H100-80GB"
  gpus     = 16
}
output "alpha_id" {
  value = gpufleet_tenant.alpha.id
}
output "beta_id" {
  value = gpufleet_tenant.beta.id
}
output "alpha_token" {
  value     = gpufleet_tenant.alpha.token
  sensitive = true
}
output "beta_token" {
  value     = gpufleet_tenant.beta.token
  sensitive = true
}
"#;

/// A team's own configuration: a reservation and a cluster on it.
fn team_hcl(tenant_id: &str, cluster_name: &str) -> String {
    format!(
        r#"
resource "gpufleet_reservation" "r" {{
  tenant     = "{tenant_id}"
  gpu_type   = "H100-80GB"
  node_count = 1
  start_time = "{start}"
  end_time   = "{end}"
}}
resource "gpufleet_tenant_cluster" "c" {{
  tenant         = "{tenant_id}"
  name           = "{cluster_name}"
  orchestrator   = "kubernetes"
  gpu_type       = "H100-80GB"
  node_count     = 1
  reservation_id = gpufleet_reservation.r.id
}}
"#,
        start = rfc3339_in_hours(-1),
        end = rfc3339_in_hours(24),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_their_own_tokens_cannot_touch_each_other() {
    let backend = Backend::start();
    let admin_tf = Terraform::new(&backend, backend.admin_token());
    admin_tf.keep_credentials_in_state(); // reads the deprecated attributes
    admin_tf.write_main(ADMIN_HCL);
    admin_tf.init();
    admin_tf.apply();
    let outputs = admin_tf.outputs();
    let (alpha_id, beta_id) = (str_of(&outputs, "alpha_id"), str_of(&outputs, "beta_id"));
    let (alpha_token, beta_token) = (
        str_of(&outputs, "alpha_token"),
        str_of(&outputs, "beta_token"),
    );
    assert_ne!(alpha_token, beta_token);

    let alpha_tf = Terraform::new(&backend, &alpha_token);
    alpha_tf.write_main(&team_hcl(&alpha_id, "alpha-train"));
    alpha_tf.init();
    alpha_tf.apply();
    let beta_tf = Terraform::new(&backend, &beta_token);
    beta_tf.write_main(&team_hcl(&beta_id, "beta-train"));
    beta_tf.init();
    beta_tf.apply();
    let alpha_cluster = str_of(&alpha_tf.resource("gpufleet_tenant_cluster.c"), "id");
    let beta_cluster = str_of(&beta_tf.resource("gpufleet_tenant_cluster.c"), "id");

    // Each token lists only its own objects.
    let mut as_alpha = backend.clients(&alpha_token).await;
    let mut as_beta = backend.clients(&beta_token).await;
    let alpha_sees = as_alpha.inventory().await;
    let beta_sees = as_beta.inventory().await;
    assert_eq!(
        alpha_sees
            .clusters
            .iter()
            .map(|c| c.id.clone())
            .collect::<Vec<_>>(),
        vec![alpha_cluster.clone()]
    );
    assert_eq!(
        beta_sees
            .clusters
            .iter()
            .map(|c| c.id.clone())
            .collect::<Vec<_>>(),
        vec![beta_cluster.clone()]
    );
    assert!(alpha_sees
        .reservations
        .iter()
        .all(|r| r.tenant_id == alpha_id));
    // ... and only the nodes of its own cluster: none of the other team's, none free.
    for (client, cluster) in [
        (&mut as_alpha, &alpha_cluster),
        (&mut as_beta, &beta_cluster),
    ] {
        let nodes = client.nodes().await;
        assert!(!nodes.is_empty());
        assert!(
            nodes.iter().all(|n| &n.cluster_id == cluster),
            "a tenant sees a node outside its cluster {cluster}: {nodes:#?}"
        );
    }

    // Beta's token gets NotFound for alpha's cluster: no contents, no hint it exists.
    let status = as_beta
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: alpha_cluster.clone(),
        })
        .await
        .expect_err("beta must not read alpha's cluster");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status}");
    assert!(!status.message().contains("alpha-train"), "{status}");
    let status = as_beta
        .clusters
        .update_tenant_cluster(UpdateTenantClusterRequest {
            id: alpha_cluster.clone(),
            node_count: 2,
            ..Default::default()
        })
        .await
        .expect_err("beta must not change alpha's cluster");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status}");

    // Through Terraform: beta cannot import alpha's cluster, and the error is the one an
    // id that exists nowhere gets (nothing tells beta that alpha's cluster exists).
    let intruder = Terraform::new(&backend, &beta_token);
    intruder.write_main(&team_hcl(&beta_id, "alpha-train"));
    intruder.init();
    let import = |id: &str| {
        intruder.run_fails(&[
            "import",
            "-no-color",
            "-input=false",
            "gpufleet_tenant_cluster.c",
            id,
        ])
    };
    let theirs = import(&alpha_cluster);
    assert!(
        says_not_found(&theirs.output()),
        "import of another tenant's cluster must answer not found\n{theirs}"
    );
    let nowhere_id = "00000000-0000-4000-8000-000000000000";
    let nowhere = import(nowhere_id);
    assert_eq!(
        theirs.stderr.replace(&alpha_cluster, "<id>"),
        nowhere.stderr.replace(nowhere_id, "<id>"),
        "another tenant's id and a missing id must be indistinguishable"
    );
    assert!(intruder.state_list().is_empty());

    // ... nor create objects in alpha's name.
    let before = backend.admin().await.inventory().await;
    let intruder = Terraform::new(&backend, &beta_token);
    intruder.write_main(&team_hcl(&alpha_id, "sneaky"));
    intruder.init();
    let run = intruder.apply_fails();
    assert!(
        !run.output().contains("alpha-train"),
        "the error must not reveal alpha's objects\n{run}"
    );
    assert_eq!(
        backend.admin().await.inventory().await,
        before,
        "nothing was created in alpha's name"
    );

    // Alpha's configuration is untouched; beta's destroy removes only beta's objects.
    alpha_tf.assert_no_changes();
    beta_tf.destroy();
    let left = backend.admin().await.inventory().await;
    assert_eq!(
        left.clusters
            .iter()
            .map(|c| c.id.clone())
            .collect::<Vec<_>>(),
        vec![alpha_cluster]
    );
    assert!(left.reservations.iter().all(|r| r.tenant_id == alpha_id));
    alpha_tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_token_cannot_manage_tenants_or_quotas() {
    let backend = Backend::start();
    let admin_tf = Terraform::new(&backend, backend.admin_token());
    admin_tf.keep_credentials_in_state(); // reads the deprecated attributes
    admin_tf.write_main(ADMIN_HCL);
    admin_tf.init();
    admin_tf.apply();
    let alpha_token = str_of(&admin_tf.outputs(), "alpha_token");
    let before = backend.admin().await.inventory().await;

    let tf = Terraform::new(&backend, &alpha_token);
    tf.write_main(
        r#"
resource "gpufleet_tenant" "rogue" {
  name = "rogue"
}
"#,
    );
    tf.init();
    let run = tf.apply_fails();
    assert!(
        run.output().to_lowercase().contains("permission")
            || run.output().to_lowercase().contains("admin"),
        "a tenant token creating a tenant must be refused as not permitted\n{run}"
    );
    assert_eq!(backend.admin().await.inventory().await, before);
}
