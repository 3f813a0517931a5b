//! Resource identity (Terraform 1.12+; here 1.15.5): objects made outside Terraform are
//! imported with `import { identity = {...} }` (the tenant's name and the object's name,
//! not an id; a reservation, which has no name, by its id), the state keeps each
//! resource's identity beside its attributes (for a resource Terraform created too), and
//! the plan after the import is empty.

use std::fs;

use gpufleet_e2e::fixtures::{
    create_pool_cluster, create_quota, create_reservation, create_tenant, request_id,
};
use gpufleet_e2e::grpc::bearer_auth;
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::access_service_client::AccessServiceClient;
use gpufleet_proto::v1::{CreateTokenRequest, Reservation};
use serde_json::{json, Value};

const CONFIG: &str = r#"
resource "gpufleet_tenant" "t" {
  name         = "ident"
  display_name = "ident team"
}

resource "gpufleet_gpu_quota" "q" {
  tenant   = gpufleet_tenant.t.name
  gpu_type = "H100-80GB"
  gpus     = 16
}

resource "gpufleet_tenant_cluster" "c" {
  tenant       = gpufleet_tenant.t.name
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
  storage_gib  = 100
}

resource "gpufleet_tenant_token" "ci" {
  tenant = gpufleet_tenant.t.name
  name   = "ci"
  scope  = "read"
}

# Made by Terraform: its identity comes from the create.
resource "gpufleet_tenant_token" "made" {
  tenant = gpufleet_tenant.t.name
  name   = "made"
  scope  = "read"
}
"#;

const IMPORTS: &str = r#"
import {
  to       = gpufleet_tenant.t
  identity = { name = "ident" }
}
import {
  to       = gpufleet_gpu_quota.q
  identity = { tenant = "ident", gpu_type = "H100-80GB" }
}
import {
  to       = gpufleet_tenant_cluster.c
  identity = { tenant = "ident", name = "train" }
}
import {
  to       = gpufleet_tenant_token.ci
  identity = { tenant = "ident", name = "ci" }
}
"#;

/// The reservation's block and its import by identity (reservations have no name: their
/// identity is their id).
fn reservation_config(r: &Reservation) -> String {
    let rfc3339 = |ts: &Option<prost_types::Timestamp>| {
        let seconds = ts.as_ref().expect("reservation has its window").seconds;
        time::OffsetDateTime::from_unix_timestamp(seconds)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    format!(
        r#"
resource "gpufleet_reservation" "r" {{
  tenant     = gpufleet_tenant.t.id
  gpu_type   = "H100-80GB"
  node_count = 1
  start_time = "{start}"
  end_time   = "{end}"
}}

import {{
  to       = gpufleet_reservation.r
  identity = {{ id = "{id}" }}
}}
"#,
        start = rfc3339(&r.start_time),
        end = rfc3339(&r.end_time),
        id = r.id,
    )
}

/// Each resource's identity as the state file keeps it, by address.
fn identities(tf: &Terraform) -> Value {
    let text = fs::read_to_string(tf.dir().join("terraform.tfstate")).expect("read state");
    let state: Value = serde_json::from_str(&text).expect("state JSON");
    let mut out = serde_json::Map::new();
    for r in state["resources"].as_array().expect("resources") {
        let address = format!(
            "{}.{}",
            r["type"].as_str().unwrap(),
            r["name"].as_str().unwrap()
        );
        out.insert(address, r["instances"][0]["identity"].clone());
    }
    Value::Object(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_by_identity_then_an_empty_plan_and_identities_in_state() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, _token) = create_tenant(&mut admin, "ident").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 16, 0).await;
    create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;
    let reservation = create_reservation(&mut admin, &tenant.id, "H100-80GB", 1, -1, 48).await;
    let channel = tonic::transport::Channel::from_shared(backend.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    AccessServiceClient::with_interceptor(channel, bearer_auth(backend.admin_token()))
        .create_token(CreateTokenRequest {
            tenant_id: tenant.id.clone(),
            name: "ci".to_string(),
            scope: "read".to_string(),
            request_id: request_id(),
            ..Default::default()
        })
        .await
        .expect("CreateToken ci");

    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(CONFIG);
    tf.write_file("imports.tf", IMPORTS);
    tf.write_file("reservation.tf", &reservation_config(&reservation));
    tf.init();
    tf.plan()
        .assert_mentions(&["5 to import, 1 to add, 0 to change, 0 to destroy"]);
    tf.apply();

    let got = identities(&tf);
    let want = json!({
        "gpufleet_tenant.t": { "name": "ident" },
        "gpufleet_gpu_quota.q": { "tenant": "ident", "gpu_type": "H100-80GB" },
        "gpufleet_tenant_cluster.c": { "tenant": "ident", "name": "train" },
        "gpufleet_tenant_token.ci": { "tenant": "ident", "name": "ci" },
        "gpufleet_tenant_token.made": { "tenant": "ident", "name": "made" },
        "gpufleet_reservation.r": { "id": reservation.id },
    });
    assert_eq!(got, want, "identities in state");
    tf.assert_no_changes();

    // A refresh keeps every identity (Terraform holds them; none is made again).
    tf.refresh();
    assert_eq!(identities(&tf), want, "identities after a refresh");

    // An identity that names nothing is refused, naming what it looked for.
    tf.write_file(
        "imports.tf",
        r#"
import {
  to       = gpufleet_tenant_cluster.ghost
  identity = { tenant = "ident", name = "ghost" }
}
"#,
    );
    tf.write_main(&format!(
        "{CONFIG}\n{}",
        CONFIG
            .split("resource \"gpufleet_tenant_cluster\" \"c\"")
            .nth(1)
            .and_then(|rest| rest.split("resource \"gpufleet_tenant_token\"").next())
            .map(|body| format!(
                "resource \"gpufleet_tenant_cluster\" \"ghost\"{}",
                body.replace("\"train\"", "\"ghost\"")
            ))
            .expect("cluster block")
    ));
    tf.plan_fails()
        .assert_mentions(&["no tenant cluster \"ident/ghost\": not found"]);
}

/// A team's own configuration (its tenant token, `tenant` left out): the identities name
/// its tenant, and an import by identity may leave the tenant out too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_token_makes_identities_and_imports_without_naming_its_tenant() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, team_token) = create_tenant(&mut admin, "own").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 8, 0).await;

    let tf = Terraform::new(&backend, &team_token);
    tf.write_main(
        r#"
resource "gpufleet_tenant_cluster" "c" {
  name         = "train"
  orchestrator = "kubernetes"
  gpu_type     = "H100-80GB"
  node_count   = 1
}

resource "gpufleet_tenant_token" "ci" {
  name  = "ci"
  scope = "read"
}
"#,
    );
    tf.init();
    let applied = tf.apply();
    assert!(
        !applied.output().contains("no resource identity"),
        "every identity was made\n{applied}"
    );
    let want = json!({
        "gpufleet_tenant_cluster.c": { "tenant": "own", "name": "train" },
        "gpufleet_tenant_token.ci": { "tenant": "own", "name": "ci" },
    });
    assert_eq!(identities(&tf), want);

    tf.run_ok(&["state", "rm", "gpufleet_tenant_cluster.c"]);
    tf.write_file(
        "imports.tf",
        r#"
import {
  to       = gpufleet_tenant_cluster.c
  identity = { name = "train" }
}
"#,
    );
    tf.apply();
    assert_eq!(identities(&tf), want, "imported by name alone");
    tf.assert_no_changes();
}
