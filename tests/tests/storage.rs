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

// ---- Volumes on the platform's shared storage (serve --shared-storage) ----

mod shared {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::process::Command;

    use gpufleet_e2e::hcl;
    use gpufleet_e2e::json::{i64_of, str_of};
    use gpufleet_e2e::shared_storage::SharedStorage;
    use gpufleet_e2e::{Backend, Terraform};

    const A: &str = "gpufleet_tenant_cluster.a";
    const B: &str = "gpufleet_tenant_cluster.b";

    /// Team A's cluster and quota (with `a`'s size and retention, or none) and team B's
    /// cluster of 1 GiB.
    fn config(a: Option<(i64, &str)>) -> String {
        let mut blocks = vec![
            hcl::tenant("ta", "team-a"),
            hcl::tenant("tb", "team-b"),
            hcl::quota("qb", "gpufleet_tenant.tb.id", "H100-80GB", 8),
            hcl::pool_cluster("b", "gpufleet_tenant.tb.id", "data", "H100-80GB", 1)
                .number("storage_gib", 1)
                .depends_on(&["gpufleet_gpu_quota.qb"]),
        ];
        if let Some((gib, retention)) = a {
            blocks.push(hcl::quota("qa", "gpufleet_tenant.ta.id", "H100-80GB", 8));
            blocks.push(
                hcl::pool_cluster("a", "gpufleet_tenant.ta.id", "data", "H100-80GB", 1)
                    .number("storage_gib", gib)
                    .string("storage_retention", retention)
                    .depends_on(&["gpufleet_gpu_quota.qa"]),
            );
        }
        hcl::config(&blocks)
    }

    /// Writes `mib` MiB of zeros to `file` with `dd` (synced), as a job would; Err with
    /// dd's stderr when it fails.
    fn write(file: &str, mib: u32) -> Result<(), String> {
        let out = Command::new("dd")
            .args([
                "if=/dev/zero",
                &format!("of={file}"),
                "bs=1M",
                &format!("count={mib}"),
                "conv=fsync",
            ])
            .output()
            .expect("run dd");
        match out.status.success() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    fn mode(path: &str) -> u32 {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .permissions()
            .mode()
            & 0o7777
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_team_gets_exactly_its_size_grows_online_and_keeps_what_it_asked_to_keep() {
        let storage = SharedStorage::new(8);
        let backend = Backend::start_with_args(&["--shared-storage", &storage.arg()]);
        let tf = Terraform::new(&backend, backend.admin_token());
        tf.write_main(&config(Some((1, "delete"))));
        tf.init();
        tf.apply();
        let (a, b) = (tf.resource(A), tf.resource(B));
        let (path_a, path_b) = (str_of(&a, "storage_path"), str_of(&b, "storage_path"));
        for (path, c) in [(&path_a, &a), (&path_b, &b)] {
            assert!(
                Path::new(path).starts_with(storage.path()),
                "the volume is on the shared storage: {path}"
            );
            assert_eq!(mode(path), 0o700, "{path}");
            assert_eq!(
                mode(Path::new(path).parent().unwrap().to_str().unwrap()),
                0o711
            );
            assert_eq!(i64_of(c, "storage_used_gib"), 0, "a new volume is empty");
        }
        assert_ne!(
            path_a, path_b,
            "two teams' clusters of one name: two volumes"
        );

        // Exactly 1 GiB: team A fills its volume, and only its own writes fail.
        let first = format!("{path_a}/first");
        write(&first, 600).expect("600 MiB fit in 1 GiB");
        let past = write(&format!("{path_a}/past"), 600).expect_err("1.2 GiB do not fit in 1 GiB");
        assert!(past.contains("Disk quota exceeded"), "{past}");
        write(&format!("{path_b}/theirs"), 600).expect("team B still writes to its own volume");
        std::fs::remove_file(format!("{path_a}/past")).unwrap();

        // Growing: in place, online, the data kept, and room for more.
        tf.write_main(&config(Some((2, "delete"))));
        let (changes, text) = tf.plan_changes();
        let change = changes.iter().find(|c| c.address == A).unwrap();
        assert_eq!(change.actions, vec!["update"], "{text}");
        text.assert_mentions(&["storage_gib", "1 -> 2"]);
        tf.apply();
        assert_eq!(str_of(&tf.resource(A), "storage_path"), path_a);
        assert_eq!(
            std::fs::metadata(&first).unwrap().len(),
            600 << 20,
            "the data is kept"
        );
        write(&format!("{path_a}/second"), 900).expect("1.5 GiB fit in 2 GiB");
        tf.refresh();
        assert_eq!(
            i64_of(&tf.resource(A), "storage_used_gib"),
            2,
            "1.5 GiB used, rounded up"
        );
        assert_eq!(i64_of(&tf.resource(B), "storage_used_gib"), 1);
        tf.assert_no_changes();

        // More than the shared storage holds besides the other volumes: refused at plan, so
        // no team can fill the storage under another.
        tf.write_main(&config(Some((100, "delete"))));
        tf.plan_fails().assert_mentions(&[
            "storage_gib",
            "promised to other volumes",
            "100 GiB do not fit",
        ]);

        // Shrinking: refused at plan, naming the attribute; the volume stays as it is.
        tf.write_main(&config(Some((1, "delete"))));
        tf.plan_fails().assert_mentions(&[
            "storage_gib",
            "volumes only grow",
            "cannot shrink from 2 to 1",
        ]);

        // Kept: destroying the cluster leaves its data; a new cluster of its name attaches it.
        tf.write_main(&config(Some((2, "keep"))));
        tf.apply();
        tf.write_main(&config(None));
        tf.apply();
        assert!(tf.find_resource(A).is_none());
        assert_eq!(std::fs::metadata(&first).unwrap().len(), 600 << 20, "kept");
        // The team's tenant is not deleted while it keeps a volume, which the refusal names.
        let tenant_a = str_of(&tf.resource("gpufleet_tenant.ta"), "id");
        let refused = backend
            .admin()
            .await
            .tenants
            .delete_tenant(gpufleet_proto::v1::DeleteTenantRequest {
                id: tenant_a,
                ..Default::default()
            })
            .await
            .expect_err("a tenant that keeps a volume is not deleted");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused
                .message()
                .contains("keeps the volumes of deleted clusters data"),
            "{}",
            refused.message()
        );
        // A kept volume is not shrunk by the cluster that attaches it.
        tf.write_main(&config(Some((1, "delete"))));
        tf.plan_fails()
            .assert_mentions(&["storage_gib", "holds 2 GiB", "cannot shrink to 1 GiB"]);
        tf.write_main(&config(Some((2, "delete"))));
        tf.apply();
        let again = tf.resource(A);
        assert_eq!(
            str_of(&again, "storage_path"),
            path_a,
            "the kept volume, attached"
        );
        assert_eq!(
            std::fs::metadata(&first).unwrap().len(),
            600 << 20,
            "its data read back"
        );
        assert_eq!(i64_of(&again, "storage_used_gib"), 2);

        // Destroyed without keep: nothing of either volume is left.
        tf.destroy();
        assert!(!Path::new(&path_a).exists(), "{path_a} is left");
        assert!(!Path::new(&path_b).exists(), "{path_b} is left");
        assert_eq!(storage.subvolumes(), Vec::<String>::new());
        assert_eq!(storage.quota_groups(), Vec::<String>::new());
        assert_eq!(storage.mounts_under(), Vec::<String>::new());
        let left: Vec<_> = std::fs::read_dir(storage.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left on the shared storage: {left:?}");
    }
}
