//! Terraform 1.6.6 (the oldest supported; `.tools/bin/terraform-1.6`, or
//! `TERRAFORM_1_6_BIN`) with the credential changes of issue 31: it is offered no ephemeral
//! resource (GetProviderSchema's field for them is one it does not know), an `ephemeral`
//! block is refused by Terraform itself naming the block, the deprecated attributes still
//! keep their secrets with `store_credentials_in_state = true`, and leaving the setting out
//! (false, the default since issue 40) keeps them out of its state too. The state it wrote, which holds no
//! resource identity, gets one at its first refresh under Terraform 1.15.5.

use std::path::PathBuf;

use gpufleet_e2e::binaries::{self, TERRAFORM_ENV};
use gpufleet_e2e::json::str_of;
use gpufleet_e2e::{Backend, Terraform};
use serde_json::Value;

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

/// The configuration; `store` is the provider's setting, left out when None.
fn main_tf(store: Option<bool>) -> String {
    let setting = store
        .map(|keep| format!("  store_credentials_in_state = {keep}\n"))
        .unwrap_or_default();
    format!(
        r#"
provider "gpufleet" {{
{setting}}}

resource "gpufleet_tenant" "team" {{
  name         = "old-client"
  display_name = "Old client team"
}}

resource "gpufleet_tenant_token" "ci" {{
  tenant = gpufleet_tenant.team.id
  name   = "ci"
  scope  = "read"
}}
"#
    )
}

#[test]
fn terraform_1_6_keeps_the_old_attributes_and_is_offered_no_ephemeral_resource() {
    // This file's only test: Terraform::new takes the binary from TERRAFORM_BIN.
    std::env::set_var(TERRAFORM_ENV, terraform_1_6());
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.run_ok(&["version"])
        .assert_mentions(&["Terraform v1.6.6"]);

    tf.init();
    let schema = tf.run_ok(&["providers", "schema", "-json"]);
    let schema: Value = serde_json::from_str(&schema.stdout).expect("schema JSON");
    let provider = &schema["provider_schemas"]["registry.terraform.io/gpufleet/gpufleet"];
    assert!(
        provider["resource_schemas"]["gpufleet_tenant"].is_object(),
        "1.6 reads the resources"
    );
    assert!(
        provider.get("ephemeral_resource_schemas").is_none(),
        "1.6 is offered no ephemeral resource: {:?}",
        provider.as_object().map(|p| p.keys().collect::<Vec<_>>())
    );

    tf.write_main(&main_tf(Some(true)));
    tf.init();
    tf.apply();
    let token = tf.resource("gpufleet_tenant_token.ci");
    assert!(
        str_of(&token, "token").starts_with("gft_"),
        "kept when asked"
    );
    tf.assert_no_changes();

    tf.write_main(&main_tf(None));
    tf.refresh();
    for address in ["gpufleet_tenant.team", "gpufleet_tenant_token.ci"] {
        assert!(
            tf.resource(address)["token"].is_null(),
            "{address}: no token in 1.6's state once the setting is left out"
        );
    }
    tf.assert_no_changes();

    tf.write_file(
        "ephemeral.tf",
        r#"
ephemeral "gpufleet_tenant_token" "run" {
  tenant = gpufleet_tenant.team.id
}
"#,
    );
    tf.plan_fails().assert_mentions(&["\"ephemeral\""]);
    tf.remove_file("ephemeral.tf");

    // 1.6 keeps no identity; the same state under Terraform 1.15.5 gets one at its first
    // refresh (the upgrade path of a state written before identities).
    let state = std::fs::read_to_string(tf.dir().join("terraform.tfstate")).expect("state");
    assert!(!state.contains("\"identity\""), "1.6 keeps no identity");
    std::env::set_var(
        TERRAFORM_ENV,
        binaries::workspace_root().join(".tools/bin/terraform"),
    );
    let upgraded = Terraform::new(&backend, backend.admin_token());
    upgraded.write_main(&main_tf(None));
    upgraded.write_file("terraform.tfstate", &state);
    upgraded.init();
    upgraded.refresh();
    let state = std::fs::read_to_string(upgraded.dir().join("terraform.tfstate")).expect("state");
    let state: Value = serde_json::from_str(&state).expect("state JSON");
    let identity_of = |ty: &str| {
        state["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["type"] == ty)
            .map(|r| r["instances"][0]["identity"].clone())
            .unwrap_or_default()
    };
    assert_eq!(identity_of("gpufleet_tenant")["name"], "old-client");
    assert_eq!(identity_of("gpufleet_tenant_token")["tenant"], "old-client");
    upgraded.assert_no_changes();
    upgraded.destroy();
    assert!(upgraded.state_list().is_empty());
}
