//! Credentials out of Terraform state (issues 31 and 40), with Terraform 1.15.5: a
//! configuration that leaves `store_credentials_in_state` out (false by default) and mints a tenant token with the ephemeral
//! `gpufleet_tenant_token`, configures a second `gpufleet` provider with it, and reads a
//! Kubernetes cluster's kubeconfig and a Slurm cluster's login details with the ephemeral
//! `gpufleet_cluster_credentials` (provisioners write them to 0600 files: proof that the
//! values reached the configuration). After every
//! apply, the state file and a saved plan (`terraform show -json`) hold no token secret,
//! no private key and no munge key; the minted tokens are revoked once each run closes
//! them, and no apply warns of a deprecated attribute. A state written with
//! `store_credentials_in_state = true` (credentials kept) is emptied by one refresh once the
//! setting is left out again.

use std::fs;

use gpufleet_e2e::grpc::bearer_auth;
use gpufleet_e2e::json::str_of;
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::access_service_client::AccessServiceClient;
use gpufleet_proto::v1::{AuditEntry, ListAuditEntriesRequest, ListTokensRequest, Token};
use serde_json::Value;

/// The configuration; `store_credentials` is the provider's setting, left out when None.
fn main_tf(store_credentials: Option<bool>) -> String {
    let setting = store_credentials
        .map(|keep| format!("  store_credentials_in_state = {keep}\n"))
        .unwrap_or_default();
    format!(
        r#"
provider "gpufleet" {{
{setting}}}

resource "gpufleet_tenant" "team" {{
  name         = "vault"
  display_name = "Vault team"
}}

resource "gpufleet_gpu_quota" "h100" {{
  tenant   = gpufleet_tenant.team.id
  gpu_type = "H100-80GB"
  gpus     = 16
}}

resource "gpufleet_tenant_cluster" "train" {{
  tenant       = gpufleet_tenant.team.id
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
  depends_on   = [gpufleet_gpu_quota.h100]
}}

resource "gpufleet_tenant_cluster" "login" {{
  tenant       = gpufleet_tenant.team.id
  name         = "login"
  orchestrator = "slurm"
  gpu_type     = "H100-80GB"
  node_count   = 1
  depends_on   = [gpufleet_gpu_quota.h100]
}}

resource "gpufleet_tenant_token" "ci" {{
  tenant = gpufleet_tenant.team.id
  name   = "ci"
  scope  = "read"
}}

# A read token for this run only, and a provider configured with it.
ephemeral "gpufleet_tenant_token" "team_read" {{
  tenant      = gpufleet_tenant.team.id
  ttl_seconds = 600
}}

provider "gpufleet" {{
  alias = "team"
  token = ephemeral.gpufleet_tenant_token.team_read.token
}}

data "gpufleet_clusters" "seen_by_team" {{
  provider   = gpufleet.team
  depends_on = [gpufleet_tenant_cluster.train, gpufleet_tenant_cluster.login]
}}

ephemeral "gpufleet_cluster_credentials" "train" {{
  cluster_id = gpufleet_tenant_cluster.train.id
}}

resource "terraform_data" "kubeconfig" {{
  triggers_replace = [gpufleet_tenant_cluster.train.id]
  provisioner "local-exec" {{
    command     = "umask 077 && printf '%s' \"$KUBECONFIG_DATA\" > kubeconfig.out"
    environment = {{ KUBECONFIG_DATA = ephemeral.gpufleet_cluster_credentials.train.credentials }}
  }}
}}

ephemeral "gpufleet_cluster_credentials" "login" {{
  cluster_id = gpufleet_tenant_cluster.login.id
}}

resource "terraform_data" "slurm_login" {{
  triggers_replace = [gpufleet_tenant_cluster.login.id]
  provisioner "local-exec" {{
    command     = "umask 077 && printf '%s' \"$SLURM_LOGIN\" > slurm-login.json"
    environment = {{ SLURM_LOGIN = ephemeral.gpufleet_cluster_credentials.login.credentials }}
  }}
}}

output "clusters_seen_by_team" {{
  value = sort([for c in data.gpufleet_clusters.seen_by_team.clusters : c.name])
}}
"#
    )
}

/// What must never be in a state or a plan: a token secret (`gft_`/`gfa_` and 48
/// characters), a private key (PEM, or a kubeconfig's `client-key-data`), a munge key, and
/// each of `known` (secrets this test saw elsewhere, e.g. the kubeconfig's key).
fn secrets_in(text: &str, known: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in ["gft_", "gfa_"] {
        for (at, _) in text.match_indices(prefix) {
            let tail: String = text[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if tail.len() >= 20 {
                found.push(format!("a token secret {prefix}{}...", &tail[..4]));
            }
        }
    }
    for marker in ["PRIVATE KEY", "client-key-data", "munge"] {
        if text.contains(marker) {
            found.push(format!("{marker:?}"));
        }
    }
    for secret in known.iter().filter(|s| !s.is_empty()) {
        if text.contains(secret) {
            found.push(format!("a known secret ({} characters)", secret.len()));
        }
    }
    found
}

/// Greps the state file and a saved plan of the current configuration.
fn assert_no_secret(tf: &Terraform, when: &str, known: &[&str]) {
    let state = fs::read_to_string(tf.dir().join("terraform.tfstate")).expect("read state");
    let found = secrets_in(&state, known);
    assert!(found.is_empty(), "{when}: the state holds {found:?}");
    tf.run_ok(&["plan", "-no-color", "-input=false", "-out=saved.tfplan"]);
    let plan_file = fs::read(tf.dir().join("saved.tfplan")).expect("read saved plan");
    let found = secrets_in(&String::from_utf8_lossy(&plan_file), known);
    assert!(
        found.is_empty(),
        "{when}: the saved plan file holds {found:?}"
    );
    let shown = tf.run_ok(&["show", "-json", "saved.tfplan"]).stdout;
    let found = secrets_in(&shown, known);
    assert!(
        found.is_empty(),
        "{when}: the saved plan (show -json) holds {found:?}"
    );
}

/// The tenant's tokens, by the admin.
async fn tokens(backend: &Backend, tenant: &str) -> Vec<Token> {
    let channel = tonic::transport::Channel::from_shared(backend.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the backend");
    let mut access =
        AccessServiceClient::with_interceptor(channel, bearer_auth(backend.admin_token()));
    access
        .list_tokens(ListTokensRequest {
            tenant_id: tenant.to_string(),
            ..Default::default()
        })
        .await
        .expect("ListTokens")
        .into_inner()
        .tokens
}

/// The tenant's audit entries (the first page: this test's are far fewer), by the admin.
async fn audit(backend: &Backend, tenant: &str) -> Vec<AuditEntry> {
    let channel = tonic::transport::Channel::from_shared(backend.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the backend");
    let mut access =
        AccessServiceClient::with_interceptor(channel, bearer_auth(backend.admin_token()));
    access
        .list_audit_entries(ListAuditEntriesRequest {
            tenant_id: tenant.to_string(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("ListAuditEntries")
        .into_inner()
        .entries
}

/// The names of the tokens the ephemeral resource minted (`tf-ephemeral-*`) that the audit
/// log shows created, and of those it shows revoked.
async fn minted_and_revoked(backend: &Backend, tenant: &str) -> (Vec<String>, Vec<String>) {
    let entries = audit(backend, tenant).await;
    let named = |method: &str| -> Vec<String> {
        entries
            .iter()
            .filter(|e| e.method.ends_with(method) && e.outcome == "OK")
            .filter(|e| e.object.contains("tf-ephemeral-"))
            .map(|e| e.object.clone())
            .collect()
    };
    (named("/CreateToken"), named("/RevokeToken"))
}

/// The Slurm cluster's munge key (base64, as a JSON state would carry it), from the
/// private directory of its head node's agent (embedded: in the control plane's data
/// dir); the cluster's name and head come from the login details the provisioner wrote
/// from the ephemeral value.
fn munge_key(tf: &Terraform, backend: &Backend) -> String {
    use base64::Engine;
    let login = fs::read_to_string(tf.dir().join("slurm-login.json"))
        .expect("the provisioner wrote the Slurm login details");
    let login: Value = serde_json::from_str(&login).expect("Slurm login JSON");
    let cluster = login["cluster"]
        .as_str()
        .expect("cluster in the login details");
    let head = login["login_node"]
        .as_str()
        .expect("login_node in the login details");
    let key = fs::read(
        backend
            .data_dir()
            .join("agents")
            .join(head)
            .join("slurm")
            .join(cluster)
            .join("munge.key"),
    )
    .expect("the head's munge key");
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// The kubeconfig's client key, as the provisioner wrote it from the ephemeral value.
fn kubeconfig_key(tf: &Terraform) -> String {
    let path = tf.dir().join("kubeconfig.out");
    let kubeconfig = fs::read_to_string(&path).expect("the provisioner wrote the kubeconfig");
    let mode = fs::metadata(&path).expect("stat").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600,
        "kubeconfig file mode"
    );
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("client-key-data:"))
        .unwrap_or_else(|| panic!("no client-key-data in the kubeconfig:\n{kubeconfig}"))
        .trim()
        .to_string()
}

#[test]
fn ephemeral_credentials_leave_no_secret_in_state_or_saved_plan() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.run_ok(&["version"])
        .assert_mentions(&["Terraform v1.15."]);
    tf.write_main(&main_tf(None));
    tf.init();
    let first = tf.apply();
    assert!(
        !first.output().contains("Deprecated"),
        "the default warns of nothing:\n{first}"
    );
    let key = kubeconfig_key(&tf);
    assert!(
        key.len() > 100,
        "a real client key: {} characters",
        key.len()
    );
    let seen = tf.outputs()["clusters_seen_by_team"].clone();
    assert_eq!(
        seen,
        Value::from(vec!["login", "train"]),
        "the team's provider read its clusters"
    );
    let munge = munge_key(&tf, &backend);
    let known = [key.as_str(), munge.as_str(), backend.admin_token()];
    assert_no_secret(&tf, "after the first apply", &known);

    // Every token the ephemeral resource minted (this apply's and each plan's) is revoked,
    // and the revoked ones leave no rows in the token list (issue 40: each run left its
    // own there for 30 days).
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let ephemeral = || -> Vec<Token> {
        rt.block_on(tokens(&backend, "vault"))
            .into_iter()
            .filter(|t| t.name.starts_with("tf-ephemeral-"))
            .collect()
    };
    let (minted, revoked) = rt.block_on(minted_and_revoked(&backend, "vault"));
    assert!(
        minted.len() >= 2,
        "apply and plan each minted one: {minted:?}"
    );
    for name in &minted {
        assert!(revoked.contains(name), "{name} revoked after its run");
    }
    assert_eq!(ephemeral(), vec![], "no run's token is left in the list");

    // A second apply (a new kubeconfig file: the provisioner runs again) keeps it so.
    fs::remove_file(tf.dir().join("kubeconfig.out")).expect("remove kubeconfig");
    tf.run_ok(&[
        "apply",
        "-auto-approve",
        "-no-color",
        "-input=false",
        "-replace=terraform_data.kubeconfig",
    ]);
    assert_eq!(kubeconfig_key(&tf), key, "the same cluster's key");
    assert_no_secret(&tf, "after the second apply", &known);
    assert_eq!(ephemeral(), vec![], "runs do not pile up in the token list");
    tf.assert_no_changes();

    // Asked to, the deprecated attributes keep the secrets; leaving the setting out again
    // and refreshing empties the state. A reference to a deprecated attribute is warned
    // about.
    tf.write_main(&main_tf(Some(true)));
    tf.write_file(
        "outputs.tf",
        "output \"ci_token\" {\n  value     = gpufleet_tenant_token.ci.token\n  sensitive = true\n}\n",
    );
    tf.run_ok(&["apply", "-refresh-only", "-auto-approve", "-no-color"]);
    tf.run_ok(&[
        "apply",
        "-auto-approve",
        "-no-color",
        "-input=false",
        "-replace=gpufleet_tenant_token.ci",
    ])
    .assert_mentions(&["Deprecated", "\"token\""]);
    tf.remove_file("outputs.tf");
    let kept = tf.resource("gpufleet_tenant_token.ci");
    assert!(
        str_of(&kept, "token").starts_with("gft_"),
        "kept with store_credentials_in_state = true"
    );
    let state = fs::read_to_string(tf.dir().join("terraform.tfstate")).expect("read state");
    let found = secrets_in(&state, &known);
    assert!(
        found.iter().any(|f| f.starts_with("a token secret"))
            && found.iter().any(|f| f.contains("client-key-data")),
        "the grep finds what the deprecated attributes keep: {found:?}"
    );
    tf.write_main(&main_tf(None));
    tf.refresh();
    assert_no_secret(&tf, "after the refresh with the setting left out", &known);
    tf.assert_no_changes();

    tf.destroy();
    assert!(tf.state_list().is_empty());
}
