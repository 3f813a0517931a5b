//! List resources (`terraform query`, Terraform 1.14+; here 1.15.5): a `.tfquery.hcl`'s
//! `list` blocks find the tenants, GPU quotas, tenant clusters and reservations that the
//! provider's token may see (the admin: every tenant's; a team's token: its own), each with
//! its resource identity; `-generate-config-out` writes resources and `import` blocks that
//! then plan as imports alone, and after their apply the plan is empty. A bad filter is
//! refused before anything is listed.

use gpufleet_e2e::fixtures::{
    create_pool_cluster, create_quota, create_reservation, create_tenant,
};
use gpufleet_e2e::{Backend, Terraform};
use serde_json::Value;

const QUERY: &str = r#"
list "gpufleet_tenant" "all" {
  provider = gpufleet
}
list "gpufleet_gpu_quota" "all" {
  provider = gpufleet
}
list "gpufleet_tenant_cluster" "all" {
  provider = gpufleet
}
list "gpufleet_reservation" "all" {
  provider = gpufleet
}
"#;

/// (list address, display name) of every result, from `terraform query -json`'s lines.
fn found(tf: &Terraform) -> Vec<(String, String, Value)> {
    let run = tf.run_ok(&["query", "-json", "-no-color"]);
    let mut found = Vec::new();
    for line in run.stdout.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if event["type"] != "list_resource_found" {
            continue;
        }
        let result = &event["list_resource_found"];
        found.push((
            result["address"].as_str().unwrap_or_default().to_string(),
            result["display_name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            result["identity"].clone(),
        ));
    }
    assert!(!found.is_empty(), "no result in\n{run}");
    found
}

fn displays(found: &[(String, String, Value)], list: &str) -> Vec<String> {
    let mut d: Vec<String> = found
        .iter()
        .filter(|(address, _, _)| address == list)
        .map(|(_, display, _)| display.clone())
        .collect();
    d.sort();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_finds_every_teams_objects_and_a_team_only_its_own() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let mut team_tokens = Vec::new();
    for name in ["qa", "qb"] {
        let (tenant, token) = create_tenant(&mut admin, name).await;
        create_quota(&mut admin, &tenant.id, "H100-80GB", 16, 0).await;
        create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;
        create_reservation(&mut admin, &tenant.id, "H100-80GB", 1, 24, 48).await;
        team_tokens.push(token);
    }

    let mut tf = Terraform::new(&backend, backend.admin_token());
    tf.write_file("find.tfquery.hcl", QUERY);
    tf.init();
    let all = found(&tf);
    assert_eq!(
        displays(&all, "list.gpufleet_tenant.all"),
        ["qa (qa team)", "qb (qb team)"]
    );
    assert_eq!(
        displays(&all, "list.gpufleet_tenant_cluster.all"),
        [
            "qa/train (kubernetes, 1 x H100-80GB, running)",
            "qb/train (kubernetes, 1 x H100-80GB, running)"
        ]
    );
    assert_eq!(
        displays(&all, "list.gpufleet_gpu_quota.all"),
        [
            "qa/H100-80GB (16 GPUs, 0 burst)",
            "qb/H100-80GB (16 GPUs, 0 burst)"
        ]
    );
    assert_eq!(displays(&all, "list.gpufleet_reservation.all").len(), 2);
    let cluster_identity = all
        .iter()
        .find(|(a, d, _)| a == "list.gpufleet_tenant_cluster.all" && d.starts_with("qa/"))
        .map(|(_, _, i)| i.clone())
        .expect("qa's cluster");
    assert_eq!(
        cluster_identity,
        serde_json::json!({ "tenant": "qa", "name": "train" })
    );

    // Team qa's own token: only qa's objects.
    tf.set_token(&team_tokens[0]);
    let own = found(&tf);
    assert_eq!(displays(&own, "list.gpufleet_tenant.all"), ["qa (qa team)"]);
    assert!(
        own.iter().all(|(_, d, _)| !d.contains("qb")),
        "a team sees nothing of another: {own:?}"
    );
    assert_eq!(displays(&own, "list.gpufleet_tenant_cluster.all").len(), 1);
    assert_eq!(displays(&own, "list.gpufleet_reservation.all").len(), 1);

    // The admin narrows by tenant, and a limit is honoured.
    tf.set_token(backend.admin_token());
    tf.write_file(
        "find.tfquery.hcl",
        r#"
list "gpufleet_tenant_cluster" "b" {
  provider = gpufleet
  config {
    tenant = "qb"
  }
}
list "gpufleet_tenant" "one" {
  provider = gpufleet
  limit    = 1
}
"#,
    );
    let narrowed = found(&tf);
    assert_eq!(
        displays(&narrowed, "list.gpufleet_tenant_cluster.b"),
        ["qb/train (kubernetes, 1 x H100-80GB, running)"]
    );
    assert_eq!(displays(&narrowed, "list.gpufleet_tenant.one").len(), 1);

    // An empty filter is refused before anything is listed, naming the attribute.
    tf.write_file(
        "find.tfquery.hcl",
        r#"
list "gpufleet_gpu_quota" "none" {
  provider = gpufleet
  config {
    tenant = ""
  }
}
"#,
    );
    tf.run_fails(&["query", "-no-color"])
        .assert_mentions(&["tenant: must not be empty"]);
}

/// Generates configuration for what `token` finds (a tenant with a quota, a cluster, a
/// reservation running now and one to come), then imports it: the plan only imports, and
/// after the apply it is empty.
async fn generate_import_and_plan_empty(as_team: bool) {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, team_token) = create_tenant(&mut admin, "gen").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 24, 2).await;
    create_pool_cluster(&mut admin, &tenant.id, "train", "H100-80GB", 1).await;
    create_reservation(&mut admin, &tenant.id, "H100-80GB", 1, -1, 48).await;
    create_reservation(&mut admin, &tenant.id, "H100-80GB", 1, 24, 48).await;
    // Another team's objects, which the team's own token must not find.
    let (other, _) = create_tenant(&mut admin, "other").await;
    create_quota(&mut admin, &other.id, "H100-80GB", 8, 0).await;

    let token = if as_team {
        team_token.as_str()
    } else {
        backend.admin_token()
    };
    let tf = Terraform::new(&backend, token);
    tf.write_file("find.tfquery.hcl", QUERY);
    tf.init();
    tf.run_ok(&["query", "-no-color", "-generate-config-out=generated.tf"]);
    let generated =
        std::fs::read_to_string(tf.dir().join("generated.tf")).expect("generated.tf written");
    for block in [
        "resource \"gpufleet_tenant\"",
        "resource \"gpufleet_gpu_quota\"",
        "resource \"gpufleet_tenant_cluster\"",
        "resource \"gpufleet_reservation\"",
        "import {",
    ] {
        assert!(generated.contains(block), "{block} in\n{generated}");
    }
    // The admin finds the other team and its quota too.
    let imports = if as_team { 5 } else { 7 };
    assert_eq!(
        generated.matches("import {").count(),
        imports,
        "{generated}"
    );
    assert_eq!(generated.contains("\"other\""), !as_team, "{generated}");
    // The query file is for `terraform query` only; plan reads the generated blocks.
    tf.plan().assert_mentions(&[&format!(
        "{imports} to import, 0 to add, 0 to change, 0 to destroy"
    )]);
    tf.apply();
    tf.assert_no_changes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_configuration_imports_with_no_change_and_then_plans_empty() {
    generate_import_and_plan_empty(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_generates_the_configuration_of_its_own_objects_only() {
    generate_import_and_plan_empty(true).await;
}
