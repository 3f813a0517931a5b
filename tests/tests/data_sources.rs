//! The data sources read through Terraform: the fleet's models and MIG profiles, free
//! capacity in a window, the nodes a token may see, and what counts against a quota.

use std::collections::BTreeSet;

use gpufleet_e2e::fixtures::{
    create_pool_cluster, create_quota, create_reservation, create_tenant,
};
use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::json::{array_of, i64_of, str_of};
use gpufleet_e2e::times::rfc3339_in_hours;
use gpufleet_e2e::{Backend, Terraform};
use serde_json::Value;

/// Reads `blocks` (data sources) with `token` and returns the working dir to look into.
fn read_data(backend: &Backend, token: &str, blocks: &[Block]) -> Terraform {
    let tf = Terraform::new(backend, token);
    tf.write_main(&hcl::config(blocks));
    tf.init();
    tf.apply();
    tf
}

/// The entry of `list` whose `key` is `value`.
fn entry<'a>(list: &'a [Value], key: &str, value: &str) -> &'a Value {
    list.iter()
        .find(|e| e[key] == value)
        .unwrap_or_else(|| panic!("no entry with {key} = {value:?} in {list:#?}"))
}

/// One MIG profile as gpu-facts.md lists it:
/// (name, profile id, compute slices, memory slices, valid starts, max per GPU).
type ProfileFacts = (&'static str, i64, i64, i64, &'static [i64], i64);

/// H100-80GB's MIG profiles.
const H100_PROFILES: &[ProfileFacts] = &[
    ("1g.10gb", 19, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 7),
    ("1g.10gb+me", 20, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 1),
    ("1g.20gb", 15, 1, 2, &[0, 2, 4, 6], 4),
    ("2g.20gb", 14, 2, 2, &[0, 2, 4], 3),
    ("3g.40gb", 9, 3, 4, &[0, 4], 2),
    ("4g.40gb", 5, 4, 4, &[0], 1),
    ("7g.80gb", 0, 7, 8, &[0], 1),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_types_lists_the_default_fleet_with_mig_profiles() {
    let backend = Backend::start();
    let tf = read_data(
        &backend,
        backend.admin_token(),
        &[Block::data("gpufleet_gpu_types", "all")],
    );
    let data = tf.resource("data.gpufleet_gpu_types.all");
    let types = array_of(&data, "gpu_types");

    let names: BTreeSet<String> = types.iter().map(|t| str_of(t, "name")).collect();
    assert_eq!(
        names,
        ["A100-80GB", "H100-80GB", "H200-141GB"]
            .map(String::from)
            .into(),
        "the default fleet's models"
    );
    // (model, pool nodes, on-demand nodes): 4+2+2 pool, 4 H100 on demand.
    for (model, pool, on_demand) in [
        ("H100-80GB", 4, 4),
        ("A100-80GB", 2, 0),
        ("H200-141GB", 2, 0),
    ] {
        let t = entry(types, "name", model);
        assert_eq!(i64_of(t, "gpus_per_node"), 8, "{model}");
        assert_eq!(i64_of(t, "pool_nodes"), pool, "{model} pool nodes");
        assert_eq!(
            i64_of(t, "on_demand_nodes"),
            on_demand,
            "{model} on-demand nodes"
        );
        // Nothing runs yet: every node is free.
        assert_eq!(
            (
                i64_of(t, "free_pool_nodes"),
                i64_of(t, "free_on_demand_nodes")
            ),
            (pool, on_demand),
            "{model} free nodes"
        );
        assert_eq!(t["mig_capable"], true, "{model}");
    }

    let h100 = entry(types, "name", "H100-80GB");
    let profiles = array_of(h100, "mig_profiles");
    assert_eq!(
        profiles.len(),
        H100_PROFILES.len(),
        "H100-80GB profiles: {profiles:#?}"
    );
    for (name, id, compute, memory, starts, max) in H100_PROFILES {
        let p = entry(profiles, "name", name);
        assert_eq!(i64_of(p, "id"), *id, "{name} id");
        assert_eq!(
            i64_of(p, "compute_slices"),
            *compute,
            "{name} compute slices"
        );
        assert_eq!(i64_of(p, "memory_slices"), *memory, "{name} memory slices");
        assert_eq!(i64_of(p, "max_per_gpu"), *max, "{name} max per GPU");
        let valid_starts: Vec<i64> = array_of(p, "valid_starts")
            .iter()
            .map(|s| s.as_i64().expect("a start is a number"))
            .collect();
        assert_eq!(valid_starts, *starts, "{name} valid starts");
        assert!(i64_of(p, "memory_mib") > 0, "{name} memory");
    }
    // Memory grows with the memory slices: a 1-slice profile holds less than the 8-slice one.
    assert!(
        i64_of(entry(profiles, "name", "1g.10gb"), "memory_mib")
            < i64_of(entry(profiles, "name", "7g.80gb"), "memory_mib")
    );
}

/// `gpufleet_availability.<label>` for H100-80GB between `start` and `end` hours from now.
fn h100_availability(label: &str, start: i64, end: i64) -> Block {
    Block::data("gpufleet_availability", label)
        .string("gpu_type", "H100-80GB")
        .string("start_time", &rfc3339_in_hours(start))
        .string("end_time", &rfc3339_in_hours(end))
}

/// (free pool nodes, free on-demand nodes) of an availability data source in state.
fn free_nodes(tf: &Terraform, label: &str) -> (i64, i64) {
    let data = tf.resource(&format!("data.gpufleet_availability.{label}"));
    (
        i64_of(&data, "free_pool_nodes"),
        i64_of(&data, "free_on_demand_nodes"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn availability_drops_inside_a_reservation_window_only() {
    let backend = Backend::start();
    let windows = [
        h100_availability("during", 12, 20),
        h100_availability("after", 30, 40),
    ];
    let tf = read_data(&backend, backend.admin_token(), &windows);
    assert_eq!(free_nodes(&tf, "during"), (4, 4), "an empty fleet");
    assert_eq!(free_nodes(&tf, "after"), (4, 4), "an empty fleet");

    // 3 H100 nodes reserved from 10 h to 24 h from now.
    let mut admin = backend.admin().await;
    let (tenant, _) = create_tenant(&mut admin, "team").await;
    create_quota(&mut admin, &tenant.id, "H100-80GB", 32, 0).await;
    create_reservation(&mut admin, &tenant.id, "H100-80GB", 3, 10, 24).await;

    tf.apply();
    assert_eq!(
        free_nodes(&tf, "during"),
        (1, 4),
        "3 of 4 pool nodes reserved inside the window; on-demand untouched"
    );
    assert_eq!(
        free_nodes(&tf, "after"),
        (4, 4),
        "a window after the reservation ends is unaffected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_shows_the_admin_everything_and_a_tenant_only_its_own_clusters() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (alpha, alpha_token) = create_tenant(&mut admin, "alpha").await;
    let (beta, _) = create_tenant(&mut admin, "beta").await;
    create_quota(&mut admin, &alpha.id, "H100-80GB", 8, 0).await;
    create_quota(&mut admin, &beta.id, "A100-80GB", 8, 0).await;
    let alpha_cluster = create_pool_cluster(&mut admin, &alpha.id, "a", "H100-80GB", 1).await;
    let beta_cluster = create_pool_cluster(&mut admin, &beta.id, "b", "A100-80GB", 1).await;
    let all_nodes = [Block::data("gpufleet_nodes", "all")];

    // The admin: every node of the default fleet (8 pool + 4 on-demand), both clusters.
    let tf = read_data(&backend, backend.admin_token(), &all_nodes);
    let admin_view = tf.resource("data.gpufleet_nodes.all");
    let nodes = array_of(&admin_view, "nodes");
    let capacity = |kind: &str| nodes.iter().filter(|n| n["capacity"] == kind).count();
    assert_eq!(nodes.len(), 12, "{nodes:#?}");
    assert_eq!((capacity("pool"), capacity("on-demand")), (8, 4));
    let clusters: BTreeSet<String> = nodes
        .iter()
        .map(|n| str_of(n, "cluster_id"))
        .filter(|id| !id.is_empty())
        .collect();
    assert_eq!(
        clusters,
        [alpha_cluster.id.clone(), beta_cluster.id.clone()].into()
    );
    let beta_node = entry(nodes, "cluster_id", &beta_cluster.id);
    assert_eq!(str_of(beta_node, "tenant_id"), beta.id);
    assert_eq!(i64_of(beta_node, "gpu_count"), 8);
    assert_eq!(array_of(beta_node, "gpus").len(), 8);

    // Alpha's token: only the node of alpha's own cluster, with its holder; nothing of
    // beta's node (its id, hostname or GPU UUIDs) nor of the free ones.
    let tf = read_data(&backend, &alpha_token, &all_nodes);
    let alpha_view = tf.resource("data.gpufleet_nodes.all");
    let seen = array_of(&alpha_view, "nodes");
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let own = entry(nodes, "cluster_id", &alpha_cluster.id);
    assert_eq!(str_of(&seen[0], "id"), str_of(own, "id"));
    assert_eq!(str_of(&seen[0], "cluster_id"), alpha_cluster.id);
    assert_eq!(str_of(&seen[0], "tenant_id"), alpha.id);
    let text = alpha_view.to_string();
    let beta_ids = [str_of(beta_node, "id"), str_of(beta_node, "hostname")]
        .into_iter()
        .chain(
            array_of(beta_node, "gpus")
                .iter()
                .map(|g| str_of(g, "uuid")),
        );
    for id in beta_ids.chain([beta.id.clone(), beta_cluster.id.clone()]) {
        assert!(
            !text.contains(&id),
            "alpha's view names {id} of beta's: {text}"
        );
    }

    // Capacity only as counts, the same for alpha as for the admin: beta's node is not free.
    let types = [Block::data("gpufleet_gpu_types", "all")];
    let counts = |token: &str| {
        let tf = read_data(&backend, token, &types);
        tf.resource("data.gpufleet_gpu_types.all")["gpu_types"].clone()
    };
    let alpha_counts = counts(&alpha_token);
    assert_eq!(alpha_counts, counts(backend.admin_token()));
    let a100 = entry(alpha_counts.as_array().unwrap(), "name", "A100-80GB");
    assert_eq!(
        (i64_of(a100, "pool_nodes"), i64_of(a100, "free_pool_nodes")),
        (2, 1),
        "beta's A100 node is not free: {a100:#}"
    );

    // Filtering by beta's cluster answers like an unknown cluster: no nodes.
    let tf = read_data(
        &backend,
        &alpha_token,
        &[Block::data("gpufleet_nodes", "theirs").string("cluster_id", &beta_cluster.id)],
    );
    let theirs = tf.resource("data.gpufleet_nodes.theirs");
    assert!(array_of(&theirs, "nodes").is_empty(), "{theirs:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_usage_counts_clusters_as_used_and_reservations_as_reserved() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (tenant, token) = create_tenant(&mut admin, "team").await;
    // 16 guaranteed + 8 burst GPUs.
    create_quota(&mut admin, &tenant.id, "H100-80GB", 16, 8).await;
    let usage = [Block::data("gpufleet_quota_usage", "h100")
        .expr("tenant", &hcl::id(&tenant.id))
        .string("gpu_type", "H100-80GB")];
    let tf = read_data(&backend, backend.admin_token(), &usage);
    let read = |tf: &Terraform| {
        let u = tf.resource("data.gpufleet_quota_usage.h100");
        ["gpus", "burst_gpus", "used", "reserved", "available"].map(|k| i64_of(&u, k))
    };
    assert_eq!(
        read(&tf),
        [16, 8, 0, 0, 24],
        "gpus, burst, used, reserved, available"
    );

    // One pool node in a cluster (8 GPUs used) and one node reserved later (8 reserved).
    create_pool_cluster(&mut admin, &tenant.id, "c", "H100-80GB", 1).await;
    create_reservation(&mut admin, &tenant.id, "H100-80GB", 1, 2, 24).await;
    tf.apply();
    assert_eq!(
        read(&tf),
        [16, 8, 8, 8, 8],
        "gpus, burst, used, reserved, available"
    );
    // The team's own token reads its usage without naming its tenant, as its resources do.
    let own = [Block::data("gpufleet_quota_usage", "h100").string("gpu_type", "H100-80GB")];
    let team = read_data(&backend, &token, &own);
    assert_eq!(read(&team), [16, 8, 8, 8, 8]);
}

/// A question the pool can never answer is an answer, not an error: once this
/// configuration's own cluster holds every H100 pool node, `earliest_start` is null with
/// the reason, the next plan reads it without failing, and `terraform destroy` succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn availability_never_blocks_a_plan_or_a_destroy() {
    let backend = Backend::start(); // 4 H100 pool nodes
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&hcl::config(&[
        hcl::tenant("t", "team"),
        hcl::quota("q", "gpufleet_tenant.t.id", "H100-80GB", 32),
        hcl::pool_cluster("all", "gpufleet_tenant.t.id", "all", "H100-80GB", 4)
            .depends_on(&["gpufleet_gpu_quota.q"]),
        Block::data("gpufleet_availability", "w")
            .string("gpu_type", "H100-80GB")
            .number("node_count", 1)
            .string("duration", "72h"),
        Block::output("earliest", "data.gpufleet_availability.w.earliest_start"),
        Block::output("why", "data.gpufleet_availability.w.earliest_start_reason"),
    ]));
    tf.init();
    tf.apply();
    // The apply's own read came before the cluster: the refresh now sees the pool used.
    tf.refresh();
    let outputs = tf.outputs();
    assert!(outputs["earliest"].is_null(), "{outputs:#}");
    let why = outputs["why"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("1 H100-80GB pool nodes are never free for 72h: the pool has 4 nodes and clusters hold 4 of them with no end"),
        "{outputs:#}"
    );
    tf.assert_no_changes();
    tf.destroy();
    assert!(tf.state_list().is_empty());
}

/// Runs `gpufleet-agent ARGS` against `backend` with `token`; its stdout, or the test fails
/// with its stderr.
fn agent_lists(backend: &Backend, token: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(gpufleet_e2e::binaries::agent())
        .args(args)
        .args(["--endpoint", &backend.endpoint(), "--token", token])
        .output()
        .expect("run gpufleet-agent");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Users know names: the lookup data sources and the list commands find tenants, clusters
/// and reservations by them, with the ids; a team's token finds its own only, and another
/// team's tenant is not found for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_find_what_exists_by_name_and_a_team_sees_its_own_only() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let (vision, _) = create_tenant(&mut admin, "vision").await;
    let (speech, speech_token) = create_tenant(&mut admin, "speech").await;
    create_quota(&mut admin, &vision.id, "H100-80GB", 16, 0).await;
    let cv = create_pool_cluster(&mut admin, &vision.id, "cv", "H100-80GB", 1).await;
    let r = create_reservation(&mut admin, &vision.id, "H100-80GB", 1, 2, 24).await;
    let lookups = [
        Block::data("gpufleet_tenants", "vision").string("name", "vision"),
        Block::data("gpufleet_clusters", "cv")
            .string("tenant", "vision")
            .string("name", "cv"),
        Block::data("gpufleet_reservations", "vision").string("tenant", "vision"),
        Block::data("gpufleet_tenants", "all"),
    ];
    let tf = read_data(&backend, backend.admin_token(), &lookups);
    let list = |tf: &Terraform, address: &str, key: &str| -> Vec<Value> {
        array_of(&tf.resource(address), key).to_vec()
    };
    let tenants = list(&tf, "data.gpufleet_tenants.vision", "tenants");
    assert_eq!(tenants.len(), 1);
    assert_eq!(str_of(&tenants[0], "id"), vision.id);
    let clusters = list(&tf, "data.gpufleet_clusters.cv", "clusters");
    assert_eq!(clusters.len(), 1);
    assert_eq!(str_of(&clusters[0], "id"), cv.id);
    assert_eq!(str_of(&clusters[0], "tenant_name"), "vision");
    let reservations = list(&tf, "data.gpufleet_reservations.vision", "reservations");
    assert_eq!(reservations.len(), 1);
    assert_eq!(str_of(&reservations[0], "id"), r.id);
    assert_eq!(list(&tf, "data.gpufleet_tenants.all", "tenants").len(), 2);

    // A team: its own tenant only, none of the other team's clusters.
    let team = read_data(
        &backend,
        &speech_token,
        &[
            Block::data("gpufleet_tenants", "all"),
            Block::data("gpufleet_clusters", "all"),
        ],
    );
    let seen = list(&team, "data.gpufleet_tenants.all", "tenants");
    assert_eq!(seen.len(), 1);
    assert_eq!(str_of(&seen[0], "id"), speech.id);
    assert!(list(&team, "data.gpufleet_clusters.all", "clusters").is_empty());
    team.write_main(&hcl::config(&[
        Block::data("gpufleet_clusters", "theirs").string("tenant", "vision")
    ]));
    team.plan_fails()
        .assert_mentions(&["tenant 'vision' not found (this token's tenant is 'speech')"]);

    // The same from the command line.
    let text = agent_lists(
        &backend,
        backend.admin_token(),
        &["clusters", "--tenant", "vision"],
    );
    assert!(
        text.starts_with("TENANT") && text.contains(&cv.id),
        "{text}"
    );
    let text = agent_lists(&backend, backend.admin_token(), &["reservations"]);
    assert!(text.contains(&r.id), "{text}");
    let text = agent_lists(&backend, &speech_token, &["tenants"]);
    assert!(
        text.contains(&speech.id) && !text.contains(&vision.id),
        "{text}"
    );
    let text = agent_lists(&backend, &speech_token, &["clusters"]);
    assert!(!text.contains(&cv.id), "{text}");
}
