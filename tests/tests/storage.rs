//! A cluster's dedicated volume: growing `storage_gib` resizes it in place (the volume on
//! disk records the new size); shrinking is refused at plan time with both sizes.

use std::path::Path;

use gpufleet_e2e::hcl;
use gpufleet_e2e::json::{i64_of, str_of};
use gpufleet_e2e::{Backend, Terraform};

const CLUSTER: &str = "gpufleet_tenant_cluster.c";

fn config(storage_gib: i64) -> String {
    hcl::config(&[
        hcl::tenant("t", "team"),
        hcl::quota("q", "gpufleet_tenant.t.id", "H100-80GB", 8),
        hcl::pool_cluster("c", "gpufleet_tenant.t.id", "data", "H100-80GB", 1)
            .number("storage_gib", storage_gib)
            .depends_on(&["gpufleet_gpu_quota.q"]),
    ])
}

/// The size the volume directory's `volume.json` records.
fn volume_size_gib(storage_path: &str) -> i64 {
    let file = Path::new(storage_path).join("volume.json");
    let text =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let meta: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", file.display()));
    i64_of(&meta, "size_gib")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_grows_in_place_and_never_shrinks() {
    let backend = Backend::start();
    let tf = Terraform::new(&backend, backend.admin_token());
    tf.write_main(&config(100));
    tf.init();
    tf.apply();
    let cluster = tf.resource(CLUSTER);
    let (id, path) = (str_of(&cluster, "id"), str_of(&cluster, "storage_path"));
    assert!(
        Path::new(&path).starts_with(backend.data_dir()),
        "the volume lives in the backend's data dir: {path}"
    );
    assert_eq!(volume_size_gib(&path), 100);

    // Growing: an in-place update of the same cluster and the same volume.
    tf.write_main(&config(300));
    let (changes, text) = tf.plan_changes();
    let change = changes.iter().find(|c| c.address == CLUSTER).unwrap();
    assert_eq!(change.actions, vec!["update"], "{text}");
    text.assert_mentions(&["storage_gib", "100 -> 300", "1 to change", "0 to destroy"]);
    tf.apply();
    let cluster = tf.resource(CLUSTER);
    assert_eq!(str_of(&cluster, "id"), id);
    assert_eq!(str_of(&cluster, "storage_path"), path);
    assert_eq!(i64_of(&cluster, "storage_gib"), 300);
    assert_eq!(volume_size_gib(&path), 300, "the volume on disk grew");
    tf.assert_no_changes();

    // Shrinking: refused at plan time, naming the attribute and both sizes; nothing changes.
    let before = backend.admin().await.inventory().await;
    tf.write_main(&config(50));
    let plan = tf.plan_fails();
    plan.assert_mentions(&["storage_gib: volumes only grow: cannot shrink from 300 to 50 GiB"]);
    tf.apply_fails()
        .assert_mentions(&["storage_gib", "300", "50"]);
    assert_eq!(backend.admin().await.inventory().await, before);
    assert_eq!(volume_size_gib(&path), 300);
    assert_eq!(i64_of(&tf.resource(CLUSTER), "storage_gib"), 300);

    // Destroyed, the cluster's volume and its tenant's folder are gone.
    tf.write_main(&config(300));
    tf.destroy();
    let tenant_dir = Path::new(&path).parent().unwrap();
    assert!(!Path::new(&path).exists());
    assert!(!tenant_dir.exists(), "{} is left", tenant_dir.display());
}
