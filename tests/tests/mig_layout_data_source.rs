//! `gpufleet_mig_layout` through Terraform: a fitting layout is answered with placements
//! that follow the catalog's geometry, an impossible one with the rule and the nearest
//! valid layouts (an answer a `check` or a `precondition` can act on, not an error), a
//! model without MIG is an error on `gpu_type`, and nothing is ever created.

use std::collections::BTreeMap;

use gpufleet_e2e::hcl::{self, Block};
use gpufleet_e2e::json::{array_of, i64_of, str_of};
use gpufleet_e2e::{Backend, Terraform};
use gpufleet_proto::v1::{ListGpuTypesRequest, MigProfile};
use serde_json::Value;

/// 3 + 2 + 1 + 1 = 7 compute slices and 4 + 2 + 1 + 1 = 8 memory slices: fits an H100.
const FITTING: &[(&str, i64)] = &[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)];
/// 7 compute slices but 4 + 4 + 1 = 9 memory slices: the memory rule fails.
const TOO_MUCH_MEMORY: &[(&str, i64)] = &[("3g.40gb", 2), ("1g.10gb", 1)];

/// `layout` rendered as an HCL map, e.g. `{ "3g.40gb" = 1 }`.
fn hcl_layout(layout: &[(&str, i64)]) -> String {
    let entries: Vec<String> = layout
        .iter()
        .map(|(profile, count)| format!("\"{profile}\" = {count}"))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

/// `data "gpufleet_mig_layout" "<label>"` asking about `layout` on `gpu_type`.
fn mig_layout(label: &str, gpu_type: &str, layout: &[(&str, i64)]) -> Block {
    Block::data("gpufleet_mig_layout", label)
        .string("gpu_type", gpu_type)
        .expr("layout", &hcl_layout(layout))
}

/// A `check` block that warns with the reason when `data.gpufleet_mig_layout.<label>` does
/// not fit (the hcl builders have no nested blocks).
fn fits_check(label: &str) -> String {
    format!(
        r#"
check "{label}_fits" {{
  assert {{
    condition     = data.gpufleet_mig_layout.{label}.fits
    error_message = "layout {label} does not fit: ${{data.gpufleet_mig_layout.{label}.reason}}"
  }}
}}
"#
    )
}

/// The H100-80GB MIG profiles by name, as the backend's catalog has them.
async fn h100_profiles(backend: &Backend) -> BTreeMap<String, MigProfile> {
    let types = backend
        .admin()
        .await
        .fleet
        .list_gpu_types(ListGpuTypesRequest {})
        .await
        .expect("ListGpuTypes")
        .into_inner()
        .gpu_types;
    let h100 = types
        .into_iter()
        .find(|t| t.name == "H100-80GB")
        .expect("the default fleet has H100-80GB");
    h100.mig_profiles
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect()
}

/// Asserts that `placements` place exactly `layout` on one GPU of the catalog's geometry:
/// each at a valid start of its profile with the profile's id and memory slices, larger
/// first, within the 8 memory slices and without overlap.
fn assert_placements_follow_catalog(
    placements: &[Value],
    layout: &[(&str, i64)],
    profiles: &BTreeMap<String, MigProfile>,
) {
    let mut counts = BTreeMap::new();
    let mut used = [false; 8];
    let mut previous_size = i64::MAX;
    for p in placements {
        let name = str_of(p, "profile");
        let profile = profiles
            .get(&name)
            .unwrap_or_else(|| panic!("{name} is not an H100-80GB profile: {p:#}"));
        let (start, size) = (i64_of(p, "start"), i64_of(p, "size"));
        assert_eq!(i64_of(p, "profile_id"), i64::from(profile.id), "{p:#}");
        assert_eq!(size, i64::from(profile.memory_slices), "{p:#}");
        assert!(
            profile.valid_starts.iter().any(|s| i64::from(*s) == start),
            "{name} may start only at {:?}: {p:#}",
            profile.valid_starts
        );
        assert!(
            size <= previous_size,
            "larger profiles are created first: {placements:#?}"
        );
        previous_size = size;
        for slice in start..start + size {
            let slot = usize::try_from(slice)
                .ok()
                .and_then(|s| used.get_mut(s))
                .unwrap_or_else(|| panic!("{name} runs past the 8 memory slices: {p:#}"));
            assert!(!*slot, "memory slice {slice} used twice: {placements:#?}");
            *slot = true;
        }
        *counts.entry(name).or_insert(0) += 1;
    }
    let expected: BTreeMap<String, i64> = layout.iter().map(|(p, c)| (p.to_string(), *c)).collect();
    assert_eq!(counts, expected, "placements: {placements:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fitting_and_impossible_layouts_are_answered_and_nothing_is_created() {
    let backend = Backend::start();
    let mut admin = backend.admin().await;
    let nodes_before = without_heartbeats(admin.nodes().await);
    let tf = Terraform::new(&backend, backend.admin_token());
    let main = format!(
        "{}\n{}",
        hcl::config(&[
            mig_layout("fitting", "H100-80GB", FITTING),
            mig_layout("impossible", "H100-80GB", TOO_MUCH_MEMORY),
        ]),
        fits_check("impossible")
    );
    tf.write_main(&main);
    tf.init();
    // A layout that does not fit is an answer: the apply succeeds and the check warns.
    let apply = tf.apply();
    apply.assert_mentions(&["layout impossible does not fit:", "memory slices"]);

    let fitting = tf.resource("data.gpufleet_mig_layout.fitting");
    assert_eq!(fitting["fits"], true, "{fitting:#}");
    assert_eq!(str_of(&fitting, "reason"), "", "{fitting:#}");
    assert!(array_of(&fitting, "suggestions").is_empty(), "{fitting:#}");
    assert_eq!(
        str_of(&fitting, "id"),
        "H100-80GB:1g.10gb=2,2g.20gb=1,3g.40gb=1"
    );
    let placements = array_of(&fitting, "placements");
    assert_eq!(placements.len(), 4, "{fitting:#}");
    assert_placements_follow_catalog(placements, FITTING, &h100_profiles(&backend).await);

    let impossible = tf.resource("data.gpufleet_mig_layout.impossible");
    assert_eq!(impossible["fits"], false, "{impossible:#}");
    assert!(
        str_of(&impossible, "reason").contains("memory slices"),
        "the reason names the memory rule: {impossible:#}"
    );
    assert!(
        !array_of(&impossible, "suggestions").is_empty(),
        "{impossible:#}"
    );
    assert!(
        array_of(&impossible, "placements").is_empty(),
        "{impossible:#}"
    );

    // Asking created nothing and partitioned no GPU.
    let inventory = admin.inventory().await;
    assert!(inventory.is_empty(), "{inventory:#?}");
    assert_eq!(
        without_heartbeats(admin.nodes().await),
        nodes_before,
        "MIG state changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precondition_on_fits_stops_a_cluster_at_plan_time() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    let config = |layout: &[(&str, i64)]| {
        let cluster = hcl::pool_cluster("c", "gpufleet_tenant.t.id", "infer", "H100-80GB", 1)
            .expr("mig_layout", "data.gpufleet_mig_layout.split.layout")
            .depends_on(&["gpufleet_gpu_quota.q"]);
        // The precondition is a nested block: spliced in before the closing brace.
        let cluster = cluster.to_string();
        let cluster = format!(
            "{}  lifecycle {{\n    precondition {{\n      condition     = data.gpufleet_mig_layout.split.fits\n      error_message = \"mig_layout does not fit: ${{data.gpufleet_mig_layout.split.reason}}\"\n    }}\n  }}\n}}\n",
            cluster.trim_end().strip_suffix('}').expect("a block ends with }")
        );
        format!(
            "{}\n{cluster}",
            hcl::config(&[
                hcl::tenant("t", "team"),
                hcl::quota("q", "gpufleet_tenant.t.id", "H100-80GB", 8),
                mig_layout("split", "H100-80GB", layout),
            ])
        )
    };
    tf.write_main(&config(TOO_MUCH_MEMORY));
    tf.init();
    tf.plan_fails()
        .assert_mentions(&["mig_layout does not fit:", "memory slices"]);
    assert!(backend.admin().await.inventory().await.is_empty());

    // The same configuration with a layout that fits plans.
    tf.write_main(&config(FITTING));
    tf.plan();
}

/// A fleet with L40S nodes (no MIG) besides the A100s.
const L40S_FLEET: &str = r#"
[[pool]]
gpu_type = "A100-80GB"
nodes = 1

[[pool]]
gpu_type = "L40S"
nodes = 2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_mig_an_unknown_model_and_negative_counts_are_errors() {
    let backend = Backend::start_with_fleet(L40S_FLEET);
    let mut admin = backend.admin().await;
    let nodes_before = without_heartbeats(admin.nodes().await);
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main("");
    tf.init();

    // Each error is on the attribute to change: Terraform quotes its line.
    tf.write_main(&hcl::config(&[mig_layout(
        "l40s",
        "L40S",
        &[("1g.10gb", 1)],
    )]));
    tf.plan_fails()
        .assert_mentions(&["gpu_type: L40S does not support MIG", "gpu_type = \"L40S\""]);

    tf.write_main(&hcl::config(&[mig_layout(
        "unknown",
        "V100-16GB",
        &[("1g.10gb", 1)],
    )]));
    tf.plan_fails().assert_mentions(&[
        "gpu_type: unknown GPU model",
        "A100-80GB",
        "gpu_type = \"V100-16GB\"",
    ]);

    tf.write_main(&hcl::config(&[mig_layout(
        "negative",
        "A100-80GB",
        &[("1g.10gb", -1)],
    )]));
    tf.plan_fails()
        .assert_mentions(&["layout[\"1g.10gb\"]: must be at least 0 (got -1)"]);

    let inventory = admin.inventory().await;
    assert!(inventory.is_empty(), "{inventory:#?}");
    assert_eq!(
        without_heartbeats(admin.nodes().await),
        nodes_before,
        "MIG state changed"
    );
}

/// Nodes without their heartbeat ages, which move on by themselves.
fn without_heartbeats(mut nodes: Vec<gpufleet_proto::v1::Node>) -> Vec<gpufleet_proto::v1::Node> {
    for n in &mut nodes {
        n.heartbeat_age_seconds = 0;
    }
    nodes
}
