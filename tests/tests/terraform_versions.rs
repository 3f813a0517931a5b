//! The provider works with every Terraform from 1.6 on: the same small configuration goes
//! through init, plan, apply, import, a second empty plan and destroy with Terraform 1.15.5
//! (the pinned one) and with Terraform 1.6.6 (the oldest supported; scripts/bootstrap.sh
//! installs it as `.tools/bin/terraform-1.6`, or `TERRAFORM_1_6_BIN` names it). Older
//! clients never call the newer RPCs; 1.6 is also the first to send refined unknowns.

use std::path::PathBuf;

use gpufleet_e2e::binaries::{self, TERRAFORM_ENV};
use gpufleet_e2e::fixtures::create_tenant;
use gpufleet_e2e::json::str_of;
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::ListTenantsRequest;

fn terraform_1_6() -> PathBuf {
    let path = std::env::var_os("TERRAFORM_1_6_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| binaries::workspace_root().join(".tools/bin/terraform-1.6"));
    assert!(
        path.is_file(),
        "Terraform 1.6.6 not found at {} (run scripts/bootstrap.sh, or set TERRAFORM_1_6_BIN)",
        path.display()
    );
    path
}

/// A tenant, a quota on it (the tenant's id is unknown until apply, so the plan carries an
/// unknown into another resource), a tenant whose display name is a template over that id
/// (a *refined* unknown: known not null, with a known prefix; Terraform 1.6+ sends it as
/// MessagePack extension 12) and a data source.
const MAIN: &str = r#"
resource "gpufleet_tenant" "team" {
  name         = "versions"
  display_name = "Versions team"
}

resource "gpufleet_tenant" "sibling" {
  name         = "versions-sibling"
  display_name = "Sibling of ${gpufleet_tenant.team.id}"
}

resource "gpufleet_gpu_quota" "h100" {
  tenant   = gpufleet_tenant.team.id
  gpu_type = "H100-80GB"
  gpus     = 8
}

data "gpufleet_gpu_types" "all" {}

output "tenant_id" {
  value = gpufleet_tenant.team.id
}
"#;

/// The same, and a tenant made outside Terraform, adopted by `terraform import`.
const WITH_ADOPTED: &str = r#"
resource "gpufleet_tenant" "adopted" {
  name         = "adopted"
  display_name = "adopted team"
}
"#;

async fn whole_life_with(terraform: PathBuf, version: &str) {
    let backend = Backend::start();
    // Terraform::new takes the binary from TERRAFORM_BIN; this file's only test sets it
    // for each version in turn.
    std::env::set_var(TERRAFORM_ENV, &terraform);
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.run_ok(&["version"])
        .assert_mentions(&[&format!("Terraform v{version}")]);

    tf.write_main(MAIN);
    tf.init();
    let plan = tf.plan();
    plan.assert_mentions(&["3 to add, 0 to change, 0 to destroy"]);
    tf.apply();
    let tenant_id = str_of(&tf.outputs(), "tenant_id");
    assert!(!tenant_id.is_empty(), "{version}: the tenant has an id");

    let mut admin = backend.admin().await;
    let (adopted, _token) = create_tenant(&mut admin, "adopted").await;
    tf.write_main(&format!("{MAIN}{WITH_ADOPTED}"));
    tf.import("gpufleet_tenant.adopted", &adopted.id);
    tf.assert_no_changes();

    tf.destroy();
    assert!(tf.state_list().is_empty(), "{version}: state after destroy");
    let left = admin
        .tenants
        .list_tenants(ListTenantsRequest::default())
        .await
        .expect("ListTenants")
        .into_inner()
        .tenants;
    assert!(
        left.is_empty(),
        "{version}: destroy left tenants: {:?}",
        left.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn init_plan_apply_import_empty_plan_destroy_with_terraform_1_15_and_1_6() {
    let pinned = binaries::terraform();
    let oldest = terraform_1_6();
    whole_life_with(pinned, "1.15.5").await;
    whole_life_with(oldest, "1.6.6").await;
}
