//! `--hardware nvml`: the fleet is this host, one pool node whose records come from its
//! backend's inventory instead of a fleet file.
//!
//! On the first start of an empty store the node is seeded from the inventory (hostname,
//! catalog model, GPUs with UUIDs and memory, MIG mode and instances, driver and CUDA
//! versions). Later starts accept only a store that holds this same host with the same
//! GPUs, and refresh its recorded MIG state from the hardware, which is the truth.
//! Everything here reads the backend only; it never changes a GPU.

use anyhow::bail;
use gpufleet_gpu::hardware::{GpuBackend, GpuInfo};
use gpufleet_sql::AsConn;

use crate::store::nodes::{self, GpuRow, NodeRow, POOL};

/// Seeds (first start) or checks and refreshes (later starts) the host node; returns
/// its node id and whether it was created now. All of it or nothing: in a savepoint,
/// which on SQLite outside a transaction is one of its own; on PostgreSQL `conn` must be
/// in the caller's transaction.
pub fn seed(
    conn: &impl AsConn,
    backend: &dyn GpuBackend,
    now: i64,
) -> anyhow::Result<(String, bool)> {
    let hostname = backend.hostname();
    let gpus = backend
        .gpus()
        .map_err(|e| anyhow::anyhow!("--hardware nvml: reading this host's GPUs: {e}"))?;
    let model = gpufleet_wire::inventory::host_model(&gpus)?;
    let tx = gpufleet_sql::Savepoint::begin(conn.as_conn())?;
    let recorded = nodes::list(&tx, None, None)?;
    let created = if recorded.is_empty() {
        let node = NodeRow {
            id: hostname.clone(),
            hostname: hostname.clone(),
            gpu_type: model.name.clone(),
            capacity: POOL.into(),
            gpu_count: gpus.len() as i64,
            driver_version: backend
                .driver_version()
                .map_err(|e| anyhow::anyhow!("--hardware nvml: driver version: {e}"))?,
            cuda_version: backend
                .cuda_version()
                .map_err(|e| anyhow::anyhow!("--hardware nvml: CUDA version: {e}"))?,
            cluster_id: None,
            state: nodes::NODE_UNREACHABLE.into(),
            state_reason: "waiting for its agent to register".into(),
            state_since: now,
        };
        let rows: Vec<GpuRow> = gpus
            .iter()
            .map(|g| GpuRow {
                node_id: hostname.clone(),
                index: g.index as i64,
                uuid: g.uuid.clone(),
                model: model.name.clone(),
                memory_mib: g.memory_mib as i64,
                mig_enabled: g.mig_enabled,
            })
            .collect();
        nodes::insert(&tx, &node, &rows)?;
        // Declared by the platform: in service, not a candidate.
        nodes::put_in_service(&tx, &node.id, now)?;
        true
    } else {
        require_same_host(&tx, &recorded, &hostname, &gpus)?;
        false
    };
    for gpu in &gpus {
        nodes::set_mig_state(
            &tx,
            &hostname,
            gpu.index as i64,
            gpu.mig_enabled,
            &crate::recorded::mig_device_rows(gpu),
        )?;
    }
    tx.commit()?;
    Ok((hostname, created))
}

/// A store seeded before must hold this host alone, with the GPUs it has now.
fn require_same_host(
    conn: &impl AsConn,
    recorded: &[NodeRow],
    hostname: &str,
    gpus: &[GpuInfo],
) -> anyhow::Result<()> {
    if recorded.len() != 1 || recorded[0].id != hostname {
        let names: Vec<&str> = recorded.iter().take(3).map(|n| n.id.as_str()).collect();
        bail!(
            "--hardware nvml: the state holds {} node(s) ({}{}), not this host {hostname} alone; use a fresh --data-dir",
            recorded.len(),
            names.join(", "),
            if recorded.len() > names.len() { ", ..." } else { "" }
        );
    }
    // NVML's index order is not stable across reboots: the same GPUs are the same set of
    // UUIDs, whatever their indices now.
    let recorded_gpus = nodes::gpus(conn, hostname)?;
    let mut uuids: Vec<String> = recorded_gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut now: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    uuids.sort();
    now.sort();
    if uuids != now {
        bail!(
            "--hardware nvml: this host's GPUs changed since the state was seeded (recorded {}, now {}); use a fresh --data-dir",
            uuids.join(", "),
            now.join(", ")
        );
    }
    // Record the indices they have now (two passes: UUIDs are unique in the store).
    let moved: Vec<&GpuInfo> = gpus
        .iter()
        .filter(|g| {
            recorded_gpus
                .iter()
                .any(|r| r.index == g.index as i64 && r.uuid != g.uuid)
        })
        .collect();
    for (pass, g) in [0, 1]
        .iter()
        .flat_map(|p| moved.iter().map(move |g| (*p, g)))
    {
        let uuid = if pass == 0 {
            format!("renumbering:{}", g.uuid)
        } else {
            g.uuid.clone()
        };
        nodes::set_gpu_uuid(conn, hostname, g.index as i64, &uuid)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    use gpufleet_gpu::hardware::{GpuHealth, HwError, MigInstance, SimulatedNode};
    use rusqlite::Connection;

    use super::*;

    const DRIVER: &str = "550.54.15";

    fn store() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open(&dir.path().join("state.db")).unwrap();
        (dir, conn)
    }

    /// A 4 x H100-80GB host with MIG on GPU 1: a 3g.40gb at 0 and a 1g.10gb at 6.
    fn host_with_mig() -> SimulatedNode {
        let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let host = SimulatedNode::new("gpu-host-7", model, 4, DRIVER);
        host.set_mig_mode(1, true).unwrap();
        for (profile, start) in [("3g.40gb", 0), ("1g.10gb", 6)] {
            let id = model.profile(profile).unwrap().id;
            host.create_instance(1, id, start).unwrap();
        }
        host
    }

    #[test]
    fn seeds_the_host_node_with_its_gpus_and_mig_instances() {
        let (_dir, conn) = store();
        let host = host_with_mig();
        assert_eq!(
            seed(&conn, &host, 0).unwrap(),
            ("gpu-host-7".to_string(), true)
        );

        let recorded = nodes::list(&conn, None, None).unwrap();
        assert_eq!(recorded.len(), 1);
        let node = &recorded[0];
        assert_eq!(
            (
                node.id.as_str(),
                node.hostname.as_str(),
                node.gpu_type.as_str(),
                node.capacity.as_str(),
                node.gpu_count,
                node.driver_version.as_str(),
                node.cuda_version.clone(),
                node.cluster_id.clone(),
            ),
            (
                "gpu-host-7",
                "gpu-host-7",
                "H100-80GB",
                POOL,
                4,
                DRIVER,
                host.cuda_version().unwrap(),
                None
            )
        );

        let reported = host.gpus().unwrap();
        let gpus = nodes::gpus(&conn, "gpu-host-7").unwrap();
        assert_eq!(gpus.len(), 4);
        for (row, gpu) in gpus.iter().zip(&reported) {
            assert_eq!(row.index, gpu.index as i64);
            assert_eq!(row.uuid, gpu.uuid);
            assert_eq!(row.model, "H100-80GB");
            assert_eq!(row.memory_mib, gpu.memory_mib as i64);
            assert_eq!(row.mig_enabled, gpu.index == 1, "gpu {}", gpu.index);
        }

        let devices = nodes::mig_devices(&conn, "gpu-host-7", 1).unwrap();
        let summary: Vec<(&str, i64, i64, i64)> = devices
            .iter()
            .map(|d| (d.profile.as_str(), d.profile_id, d.start, d.size))
            .collect();
        assert_eq!(
            summary,
            vec![("3g.40gb", 9, 0, 4), ("1g.10gb", 19, 6, 1)],
            "{devices:?}"
        );
        let uuids: Vec<&str> = reported[1]
            .instances
            .iter()
            .map(|i| i.uuid.as_str())
            .collect();
        assert_eq!(
            devices.iter().map(|d| d.uuid.as_str()).collect::<Vec<_>>(),
            uuids
        );
        assert!(uuids.iter().all(|u| u.starts_with("MIG-")), "{uuids:?}");
        for gpu in [0, 2, 3] {
            assert!(nodes::mig_devices(&conn, "gpu-host-7", gpu)
                .unwrap()
                .is_empty());
        }
    }

    #[test]
    fn a_later_start_keeps_the_node_and_records_the_real_mig_state() {
        let (_dir, conn) = store();
        let host = host_with_mig();
        seed(&conn, &host, 0).unwrap();
        // Changed outside the control plane while it was down.
        host.destroy_instance(1, 6).unwrap();

        assert_eq!(
            seed(&conn, &host, 0).unwrap(),
            ("gpu-host-7".to_string(), false)
        );
        assert_eq!(nodes::count(&conn).unwrap(), 1);
        let devices = nodes::mig_devices(&conn, "gpu-host-7", 1).unwrap();
        assert_eq!(devices.iter().map(|d| d.start).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn a_store_of_another_fleet_is_refused() {
        let (_dir, conn) = store();
        crate::fleet::seed(&conn, &crate::fleet::default_fleet(), 0).unwrap();
        let err = seed(&conn, &host_with_mig(), 0).unwrap_err().to_string();
        assert!(
            err.contains("holds 12 node(s)")
                && err.contains("not this host gpu-host-7")
                && err.contains("fresh --data-dir"),
            "{err}"
        );
    }

    #[test]
    fn the_same_gpus_in_another_index_order_are_the_same_host() {
        let (_dir, conn) = store();
        let host = |gpus: Vec<GpuInfo>| Inventory(gpus);
        let g = |index: u32, uuid: &str| GpuInfo {
            uuid: uuid.into(),
            ..gpu(index, "H100-80GB", 81559)
        };
        seed(
            &conn,
            &host(vec![g(0, "GPU-a"), g(1, "GPU-b"), g(2, "GPU-c")]),
            0,
        )
        .unwrap();
        // After a reboot NVML enumerates them in another order.
        let (_, created) = seed(
            &conn,
            &host(vec![g(0, "GPU-c"), g(1, "GPU-a"), g(2, "GPU-b")]),
            0,
        )
        .unwrap();
        assert!(!created);
        let rows: Vec<(i64, String)> = nodes::gpus(&conn, "odd-host")
            .unwrap()
            .into_iter()
            .map(|r| (r.index, r.uuid))
            .collect();
        assert_eq!(
            rows,
            vec![
                (0, "GPU-c".into()),
                (1, "GPU-a".into()),
                (2, "GPU-b".into())
            ]
        );
        let err = seed(
            &conn,
            &host(vec![g(0, "GPU-c"), g(1, "GPU-a"), g(2, "GPU-x")]),
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("GPUs changed"), "{err}");
    }

    #[test]
    fn other_gpus_on_the_same_host_are_refused() {
        let (_dir, conn) = store();
        seed(&conn, &host_with_mig(), 0).unwrap();
        let model = gpufleet_gpu::catalog::model("H100-80GB").unwrap();
        let replaced = SimulatedNode::new("gpu-host-7", model, 2, DRIVER);
        let err = seed(&conn, &replaced, 0).unwrap_err().to_string();
        assert!(
            err.contains("GPUs changed since the state was seeded"),
            "{err}"
        );
    }

    /// A host whose inventory is given; it never changes anything.
    struct Inventory(Vec<GpuInfo>);

    impl GpuBackend for Inventory {
        fn hostname(&self) -> String {
            "odd-host".into()
        }
        fn driver_version(&self) -> Result<String, HwError> {
            Ok(DRIVER.into())
        }
        fn cuda_version(&self) -> Result<String, HwError> {
            Ok("12.4".into())
        }
        fn gpus(&self) -> Result<Vec<GpuInfo>, HwError> {
            Ok(self.0.clone())
        }
        fn set_mig_mode(&self, _: u32, _: bool) -> Result<(), HwError> {
            Err(HwError::Unsupported("read-only test host".into()))
        }
        fn create_instance(&self, _: u32, _: u32, _: u8) -> Result<MigInstance, HwError> {
            Err(HwError::Unsupported("read-only test host".into()))
        }
        fn destroy_instance(&self, _: u32, _: u8) -> Result<(), HwError> {
            Err(HwError::Unsupported("read-only test host".into()))
        }
        fn health(&self, _: u32) -> Result<GpuHealth, HwError> {
            Err(HwError::Unsupported("read-only test host".into()))
        }
    }

    fn gpu(index: u32, model: &str, memory_mib: u64) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            model: model.into(),
            memory_mib,
            mig_enabled: false,
            instances: Vec::new(),
        }
    }

    #[test]
    fn an_unmapped_model_names_nvmls_name_and_records_nothing() {
        let (_dir, conn) = store();
        let host = Inventory(vec![gpu(0, "Tesla V100-SXM2-32GB", 32768)]);
        let err = seed(&conn, &host, 0).unwrap_err().to_string();
        assert!(
            err.contains(
                "GPU 0 is \"Tesla V100-SXM2-32GB\" (32768 MiB), which is not a catalog model"
            ) && err.contains("H100-80GB"),
            "{err}"
        );
        assert_eq!(nodes::count(&conn).unwrap(), 0);
    }

    #[test]
    fn nvml_names_map_to_catalog_models_and_mixed_models_are_refused() {
        let (_dir, conn) = store();
        let mixed = Inventory(vec![
            gpu(0, "NVIDIA H100 80GB HBM3", 81559),
            gpu(1, "NVIDIA A100-SXM4-80GB", 81920),
        ]);
        let err = seed(&conn, &mixed, 0).unwrap_err().to_string();
        assert!(
            err.contains("GPU 1 is A100-80GB but GPU 0 is H100-80GB"),
            "{err}"
        );
        let host = Inventory(vec![gpu(0, "NVIDIA H100 80GB HBM3", 81559)]);
        seed(&conn, &host, 0).unwrap();
        assert_eq!(
            nodes::list(&conn, None, None).unwrap()[0].gpu_type,
            "H100-80GB"
        );
        assert!(seed(&conn, &Inventory(Vec::new()), 0)
            .unwrap_err()
            .to_string()
            .contains("reports no GPUs"));
    }
}
