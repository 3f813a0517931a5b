//! The whole life of a configuration: create everything, an empty second plan, updates in
//! place, replacements, a backend restart, and destroy leaving the backend empty.

use gpufleet_e2e::json::{array_of, i64_of, str_of};
use gpufleet_e2e::times::{rfc3339_in_hours, unix_seconds};
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::{GetReservationRequest, GetTenantClusterRequest, GetTenantRequest};

/// One team: tenant, H100 quota, an active reservation and a Kubernetes cluster on it.
struct TeamConfig {
    tenant_name: &'static str,
    display_name: &'static str,
    team_label: &'static str,
    gpus: i64,
    reserved_nodes: i64,
    end_time: String,
    orchestrator: &'static str,
    cluster_nodes: i64,
    storage_gib: i64,
}

impl TeamConfig {
    fn initial() -> TeamConfig {
        TeamConfig {
            tenant_name: "vision",
            display_name: "Computer Vision",
            team_label: "cv",
            gpus: 16,
            reserved_nodes: 2,
            end_time: rfc3339_in_hours(48),
            orchestrator: "kubernetes",
            cluster_nodes: 1,
            storage_gib: 100,
        }
    }

    fn hcl(&self, start_time: &str) -> String {
        format!(
            r#"
resource "gpufleet_tenant" "team" {{
  name         = "{tenant_name}"
  display_name = "{display_name}"
  labels       = {{ team = "{team_label}", cost_center = "cc-1" }}
}}

resource "gpufleet_gpu_quota" "h100" {{
  tenant     = gpufleet_tenant.team.id
  gpu_type   = "H100-80GB"
  gpus       = {gpus}
  burst_gpus = 8
}}

resource "gpufleet_reservation" "training" {{
  tenant     = gpufleet_tenant.team.id
  gpu_type   = "H100-80GB"
  node_count = {reserved_nodes}
  start_time = "{start_time}"
  end_time   = "{end_time}"
  depends_on = [gpufleet_gpu_quota.h100]
}}

resource "gpufleet_tenant_cluster" "training" {{
  tenant         = gpufleet_tenant.team.id
  name           = "training"
  orchestrator   = "{orchestrator}"
  gpu_type       = "H100-80GB"
  node_count     = {cluster_nodes}
  reservation_id = gpufleet_reservation.training.id
  storage_gib    = {storage_gib}
}}

output "tenant_id" {{
  value = gpufleet_tenant.team.id
}}

output "tenant_token" {{
  value     = gpufleet_tenant.team.token
  sensitive = true
}}

output "cluster_hostnames" {{
  value = gpufleet_tenant_cluster.training.nodes[*].hostname
}}

output "cluster_endpoint" {{
  value = gpufleet_tenant_cluster.training.endpoint
}}
"#,
            tenant_name = self.tenant_name,
            display_name = self.display_name,
            team_label = self.team_label,
            gpus = self.gpus,
            reserved_nodes = self.reserved_nodes,
            end_time = self.end_time,
            orchestrator = self.orchestrator,
            cluster_nodes = self.cluster_nodes,
            storage_gib = self.storage_gib,
        )
    }
}

const TENANT: &str = "gpufleet_tenant.team";
const QUOTA: &str = "gpufleet_gpu_quota.h100";
const RESERVATION: &str = "gpufleet_reservation.training";
const CLUSTER: &str = "gpufleet_tenant_cluster.training";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_everything_then_no_changes_then_destroy_empties_backend() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    // This test reads the deprecated attributes.
    tf.keep_credentials_in_state();
    // A start in the past means "from now on": the reservation is active at once.
    let start = rfc3339_in_hours(-1);
    let config = TeamConfig::initial();
    tf.write_main(&config.hcl(&start));
    tf.init();
    tf.apply();

    assert_eq!(tf.plan_detailed_exitcode(), 0, "second plan must be empty");

    // State matches what the backend holds.
    let mut admin = backend.admin().await;
    let tenant = tf.resource(TENANT);
    let tenant_id = str_of(&tenant, "id");
    let stored = admin
        .tenants
        .get_tenant(GetTenantRequest {
            id: tenant_id.clone(),
        })
        .await
        .expect("GetTenant for the tenant Terraform created")
        .into_inner();
    assert_eq!(stored.name, "vision");
    assert_eq!(stored.display_name, "Computer Vision");
    assert_eq!(stored.labels.get("team").map(String::as_str), Some("cv"));
    assert_eq!(str_of(&tenant["labels"], "cost_center"), "cc-1");

    let quota = tf.resource(QUOTA);
    assert_eq!(str_of(&quota, "tenant"), tenant_id);
    assert_eq!(i64_of(&quota, "gpus"), 16);
    assert_eq!(i64_of(&quota, "burst_gpus"), 8);

    let reservation = tf.resource(RESERVATION);
    assert_eq!(str_of(&reservation, "status"), "active");
    assert_eq!(i64_of(&reservation, "pool_nodes"), 2);
    assert_eq!(i64_of(&reservation, "on_demand_nodes"), 0);
    assert_eq!(reservation["allow_on_demand"], false);
    let stored_reservation = admin
        .reservations
        .get_reservation(GetReservationRequest {
            id: str_of(&reservation, "id"),
        })
        .await
        .expect("GetReservation")
        .into_inner();
    assert_eq!(stored_reservation.node_count, 2);
    // State keeps the configured window; the backend holds a start in the past as "from now".
    assert_eq!(str_of(&reservation, "start_time"), start);
    assert!(stored_reservation.start_time.map(|t| t.seconds) >= Some(unix_seconds(&start)));
    assert_eq!(
        stored_reservation.end_time.map(|t| t.seconds),
        Some(unix_seconds(&config.end_time))
    );

    let cluster = tf.resource(CLUSTER);
    assert_eq!(str_of(&cluster, "status"), "running");
    assert_eq!(
        str_of(&cluster, "reservation_id"),
        str_of(&reservation, "id")
    );
    let nodes = array_of(&cluster, "nodes");
    assert_eq!(nodes.len(), 1, "one node: {cluster:#}");
    assert_eq!(i64_of(&nodes[0], "gpu_count"), 8);
    assert_eq!(array_of(&nodes[0], "gpu_uuids").len(), 8);
    assert!(!str_of(&cluster, "endpoint").is_empty());
    assert_kubeconfig_verifies(&str_of(&cluster, "credentials"), config.tenant_name);
    assert!(!str_of(&cluster, "storage_path").is_empty());
    let stored_cluster = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: str_of(&cluster, "id"),
        })
        .await
        .expect("GetTenantCluster")
        .into_inner();
    assert_eq!(stored_cluster.tenant_id, tenant_id);
    assert_eq!(stored_cluster.nodes.len(), 1);
    assert_eq!(
        stored_cluster.nodes[0].hostname,
        str_of(&nodes[0], "hostname")
    );
    assert_eq!(stored_cluster.endpoint, str_of(&cluster, "endpoint"));

    // Outputs carry the same values; the token works and sees this tenant's cluster.
    let outputs = tf.outputs();
    assert_eq!(str_of(&outputs, "tenant_id"), tenant_id);
    assert_eq!(
        outputs["cluster_hostnames"],
        serde_json::json!([stored_cluster.nodes[0].hostname])
    );
    let token = str_of(&outputs, "tenant_token");
    assert!(!token.is_empty());
    let mut as_tenant = backend.clients(&token).await;
    let visible = as_tenant.inventory().await;
    assert_eq!(
        visible.clusters.iter().map(|c| &c.id).collect::<Vec<_>>(),
        vec![&stored_cluster.id]
    );

    tf.destroy();
    assert!(tf.state_list().is_empty(), "state empty after destroy");
    let left = admin.inventory().await;
    assert!(
        left.is_empty(),
        "backend not empty after destroy: {left:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_apply_in_place_and_leave_no_diff() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let start = rfc3339_in_hours(-1);
    let mut config = TeamConfig::initial();
    tf.write_main(&config.hcl(&start));
    tf.init();
    tf.apply();
    let ids_before: Vec<String> = [TENANT, QUOTA, RESERVATION, CLUSTER]
        .iter()
        .map(|a| str_of(&tf.resource(a), "id"))
        .collect();
    let first_node = tf.resource(CLUSTER)["nodes"][0].clone();

    config.display_name = "Vision Research";
    config.team_label = "vision";
    config.gpus = 24;
    config.end_time = rfc3339_in_hours(72);
    config.cluster_nodes = 2;
    config.storage_gib = 250;
    tf.write_main(&config.hcl(&start));

    let (changes, text) = tf.plan_changes();
    for address in [TENANT, QUOTA, RESERVATION, CLUSTER] {
        let change = changes
            .iter()
            .find(|c| c.address == address)
            .unwrap_or_else(|| panic!("no planned change for {address}\n{text}"));
        assert_eq!(change.actions, vec!["update"], "{address}\n{text}");
    }
    text.assert_mentions(&[
        "will be updated in-place",
        "4 to change",
        "0 to add",
        "0 to destroy",
    ]);
    // Growing keeps the node the cluster has, planned as it is, and adds one unknown at
    // the end: the plan shows no GPU of it leaving.
    let grown = changes.iter().find(|c| c.address == CLUSTER).unwrap();
    assert_eq!(
        grown.detail["change"]["after"]["nodes"][0], first_node,
        "{text}"
    );
    assert_eq!(
        grown.detail["change"]["after_unknown"]["nodes"][1],
        serde_json::Value::Bool(true),
        "{text}"
    );
    assert!(
        !text
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("- \"GPU-")),
        "{text}"
    );

    tf.apply();
    let ids_after: Vec<String> = [TENANT, QUOTA, RESERVATION, CLUSTER]
        .iter()
        .map(|a| str_of(&tf.resource(a), "id"))
        .collect();
    assert_eq!(ids_before, ids_after, "in-place updates keep every id");

    let mut admin = backend.admin().await;
    let tenant = admin
        .tenants
        .get_tenant(GetTenantRequest {
            id: ids_after[0].clone(),
        })
        .await
        .expect("GetTenant")
        .into_inner();
    assert_eq!(tenant.display_name, "Vision Research");
    assert_eq!(
        tenant.labels.get("team").map(String::as_str),
        Some("vision")
    );
    let reservation = admin
        .reservations
        .get_reservation(GetReservationRequest {
            id: ids_after[2].clone(),
        })
        .await
        .expect("GetReservation")
        .into_inner();
    assert_eq!(
        reservation.end_time.map(|t| t.seconds),
        Some(unix_seconds(&config.end_time))
    );
    let cluster = admin
        .clusters
        .get_tenant_cluster(GetTenantClusterRequest {
            id: ids_after[3].clone(),
        })
        .await
        .expect("GetTenantCluster")
        .into_inner();
    assert_eq!(cluster.node_count, 2);
    assert_eq!(cluster.nodes.len(), 2);
    assert_eq!(cluster.storage_gib, 250);
    assert_eq!(i64_of(&tf.resource(QUOTA), "gpus"), 24);
    assert_eq!(array_of(&tf.resource(CLUSTER), "nodes").len(), 2);
    assert_eq!(
        tf.resource(CLUSTER)["nodes"][0],
        first_node,
        "it keeps its place"
    );

    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_changes_create_new_objects_and_remove_old_ones() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let start = rfc3339_in_hours(-1);
    let mut config = TeamConfig::initial();
    tf.write_main(&config.hcl(&start));
    tf.init();
    tf.apply();
    let mut admin = backend.admin().await;

    // orchestrator replaces the cluster alone.
    let old_cluster_id = str_of(&tf.resource(CLUSTER), "id");
    config.orchestrator = "slurm";
    tf.write_main(&config.hcl(&start));
    let (changes, text) = tf.plan_changes();
    let cluster_change = changes.iter().find(|c| c.address == CLUSTER).unwrap();
    assert!(
        cluster_change.actions.contains(&"delete".to_string())
            && cluster_change.actions.contains(&"create".to_string()),
        "orchestrator must replace the cluster: {:?}\n{text}",
        cluster_change.actions
    );
    text.assert_mentions(&[
        "must be replaced",
        "orchestrator",
        "1 to add",
        "1 to destroy",
    ]);
    tf.apply();
    let new_cluster = tf.resource(CLUSTER);
    assert_ne!(str_of(&new_cluster, "id"), old_cluster_id);
    let clusters = admin.inventory().await.clusters;
    assert_eq!(clusters.len(), 1, "old cluster gone: {clusters:#?}");
    assert_eq!(clusters[0].id, str_of(&new_cluster, "id"));
    assert_eq!(clusters[0].orchestrator, "slurm");
    tf.assert_no_changes();

    // The tenant's name replaces the tenant, and everything that references its id.
    let old_tenant_id = str_of(&tf.resource(TENANT), "id");
    config.tenant_name = "vision-2";
    tf.write_main(&config.hcl(&start));
    let (changes, text) = tf.plan_changes();
    for address in [TENANT, QUOTA, RESERVATION, CLUSTER] {
        let change = changes.iter().find(|c| c.address == address).unwrap();
        assert!(
            change.actions.contains(&"delete".to_string()),
            "{address} must be replaced: {:?}\n{text}",
            change.actions
        );
    }
    text.assert_mentions(&["must be replaced", "4 to add", "4 to destroy"]);
    tf.apply();
    let tenants = admin.inventory().await.tenants;
    assert_eq!(tenants.len(), 1, "old tenant gone: {tenants:#?}");
    assert_eq!(tenants[0].name, "vision-2");
    assert_ne!(tenants[0].id, old_tenant_id);
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_restart_loses_nothing() {
    let mut backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let start = rfc3339_in_hours(-1);
    tf.write_main(&TeamConfig::initial().hcl(&start));
    tf.init();
    tf.apply();
    let before = backend.admin().await.inventory().await;

    backend.restart();

    let after = backend.admin().await.inventory().await;
    assert_eq!(before, after, "the backend's objects survive a restart");
    tf.assert_no_changes();
}

/// A Kubernetes cluster's credentials are a kubeconfig whose client certificate (for the
/// tenant) is signed by the CA it carries, as `openssl verify` checks.
fn assert_kubeconfig_verifies(kubeconfig: &str, tenant: &str) {
    let dir = tempfile::tempdir().unwrap();
    let decoded = |field: &str| {
        let value = kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
            .unwrap_or_else(|| panic!("{field} missing from the kubeconfig:\n{kubeconfig}"));
        let encoded = dir.path().join(format!("{field}.b64"));
        let pem = dir.path().join(format!("{field}.pem"));
        std::fs::write(&encoded, value).unwrap();
        let status = std::process::Command::new("openssl")
            .args(["base64", "-d", "-A", "-in"])
            .arg(&encoded)
            .arg("-out")
            .arg(&pem)
            .status()
            .expect("openssl runs");
        assert!(status.success(), "{field} is not base64");
        pem
    };
    let ca = decoded("certificate-authority-data");
    let client = decoded("client-certificate-data");
    let key = std::fs::read_to_string(decoded("client-key-data")).unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
    let verify = std::process::Command::new("openssl")
        .arg("verify")
        .arg("-CAfile")
        .arg(&ca)
        .arg(&client)
        .output()
        .expect("openssl runs");
    assert!(
        verify.status.success(),
        "the client certificate does not verify against the kubeconfig's CA: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let subject = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(&client)
        .output()
        .expect("openssl runs");
    let subject = String::from_utf8_lossy(&subject.stdout).to_string();
    assert!(subject.contains(&format!("CN = {tenant}")), "{subject}");
}
