//! The NVML backend against the fake NVML library (`backend-agent/gpu/fake-nvml`), through
//! nvml-wrapper and the raw NVML calls: the defects of issue 13 and the sim/NVML parity.
//!
//! Each test loads its own copy of `libfake_nvml.so` (separate state per copy) with its
//! scenario in `fake-nvml.toml` beside it. The library is built by `cargo build
//! --workspace` / `cargo test --workspace`; when it is missing, the first test builds it
//! with `cargo build -p fake-nvml`.

use gpufleet_gpu::catalog;
use gpufleet_gpu::hardware::{
    apply_layout, check_report, clear_layout, GpuBackend, HwError, NvmlBackend, RowRemap,
    SimulatedNode,
};
use gpufleet_gpu::mig::{plan, Layout, Placement};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// target/debug/libfake_nvml.so, built first when missing.
fn fake_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // This test binary lives in target/<profile>/deps/.
        let exe = std::env::current_exe().expect("test binary path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>")
            .to_path_buf();
        let lib = profile_dir.join("libfake_nvml.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "-p", "fake-nvml"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("running cargo build -p fake-nvml");
            assert!(status.success(), "cargo build -p fake-nvml failed");
        }
        assert!(lib.exists(), "{} is missing", lib.display());
        lib
    })
}

/// A private copy of the fake with its scenario.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new(scenario: &str) -> Self {
        assert!(
            std::env::var_os("FAKE_NVML_SCENARIO").is_none(),
            "unset FAKE_NVML_SCENARIO to run these tests"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fake_library(), dir.path().join("libfake_nvml.so")).unwrap();
        let fake = Self { dir };
        fake.set_scenario(scenario);
        fake
    }

    /// Takes effect at the next initialisation (when no backend is open).
    fn set_scenario(&self, scenario: &str) {
        std::fs::write(self.dir.path().join("fake-nvml.toml"), scenario).unwrap();
    }

    fn backend(&self) -> NvmlBackend {
        NvmlBackend::with_library(Some(&self.dir.path().join("libfake_nvml.so")))
            .expect("the fake NVML initialises")
    }
}

fn h100() -> &'static catalog::GpuModel {
    catalog::model("H100-80GB").unwrap()
}

fn placements(items: &[(&str, u32)]) -> Vec<Placement> {
    let l: Layout = items.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    plan(h100(), &l).unwrap()
}

fn layout_of(b: &dyn GpuBackend, gpu: u32) -> (bool, Vec<(u32, u8)>) {
    let g = b.gpu(gpu).unwrap();
    let mut v: Vec<(u32, u8)> = g
        .instances
        .iter()
        .map(|i| (i.profile_id, i.start))
        .collect();
    v.sort_unstable();
    (g.mig_enabled, v)
}

#[test]
fn default_host_is_eight_h100s_with_mig_off() {
    let fake = Fake::new("");
    let b = fake.backend();
    let gpus = b.gpus().unwrap();
    assert_eq!(gpus.len(), 8);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g.index, i as u32);
        assert_eq!(g.model, "H100-80GB");
        assert_eq!(g.memory_mib, 81559);
        assert!(!g.mig_enabled && g.instances.is_empty());
        assert!(g.uuid.starts_with("GPU-"), "{}", g.uuid);
    }
    let mut uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 8);
    assert_eq!(b.driver_version().unwrap(), "550.54.15");
    assert_eq!(b.cuda_version().unwrap(), "12.4");
    assert!(b.preflight().is_empty(), "{:?}", b.preflight());
    let r = check_report(&b).unwrap();
    assert!(r.contains("gpus:   8"), "{r}");
    assert!(
        r.contains(&format!(
            "gpu 0: H100-80GB {} 81559 MiB, MIG off, persistence on",
            gpus[0].uuid
        )),
        "{r}"
    );
    assert!(
        r.contains("health: ok, temperature 35 C, power 70.0 W, uncorrected ECC 0, retired pages pending no, remapped rows 0 correctable/0 uncorrectable"),
        "{r}"
    );
}

/// Enabling MIG re-acquires the device handle (the fake invalidates handles across a mode
/// change) and lists instances with in/out counts set to the buffer length.
#[test]
fn apply_and_clear_run_through_nvml() {
    let fake = Fake::new("");
    let b = fake.backend();
    let ps = placements(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]);
    let made = apply_layout(&b, 0, &ps).unwrap();
    assert_eq!(made.len(), 4);
    assert!(made.iter().all(|i| i.uuid.starts_with("MIG-")), "{made:?}");
    assert_eq!(made[0].profile, "3g.40gb");
    assert_eq!(made[0].size, 4);
    let g = b.gpu(0).unwrap();
    assert!(g.mig_enabled);
    assert_eq!(g.instances.len(), 4);
    // Same layout again: nothing changes.
    assert_eq!(apply_layout(&b, 0, &ps).unwrap(), made);
    // Re-partition keeping the 3g.
    let next = apply_layout(&b, 0, &placements(&[("3g.40gb", 1), ("4g.40gb", 1)])).unwrap();
    assert_eq!(next[1], made[0]);
    clear_layout(&b, 0).unwrap();
    assert_eq!(layout_of(&b, 0), (false, vec![]));
}

/// Defect 1: a MIG mode change that cannot activate because the GPU is in use is IN_USE,
/// not "reset the GPU". Defect 2: the pending mode it left is put back.
#[test]
fn mig_activation_in_use_is_in_use_and_leaves_no_pending_mode() {
    let fake = Fake::new("[[gpu]]\nindex = 2\nmig_activation = \"in_use\"\n");
    let b = fake.backend();
    match b.set_mig_mode(2, true) {
        Err(HwError::InUse { gpu: 2, instances }) => {
            assert!(instances[0].contains("as a whole"), "{instances:?}");
            assert!(
                instances[0].contains("pending mode was put back"),
                "{instances:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let status = &b.inventory().unwrap()[2];
    assert_eq!(status.mig_pending, Some(false));
    // Through apply_layout: refused, and nothing pending afterwards either.
    let err = apply_layout(&b, 2, &placements(&[("7g.80gb", 1)])).unwrap_err();
    assert!(matches!(err, HwError::InUse { gpu: 2, .. }), "{err:?}");
    let status = &b.inventory().unwrap()[2];
    assert_eq!(
        (
            status.info.as_ref().unwrap().mig_enabled,
            status.mig_pending
        ),
        (false, Some(false))
    );
}

#[test]
fn mig_activation_needing_a_reset_says_so() {
    let fake = Fake::new("[[gpu]]\nindex = 0\nmig_activation = \"reset_required\"\n");
    let b = fake.backend();
    match b.set_mig_mode(0, true) {
        Err(HwError::Unsupported(m)) => assert!(m.contains("needs a GPU reset"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.inventory().unwrap()[0].mig_pending, Some(false));
}

/// Defect 2: a pending mode is reported beside the current one.
#[test]
fn a_pending_mode_is_reported() {
    let fake = Fake::new("[[gpu]]\nindex = 1\nmig_pending = true\n");
    let b = fake.backend();
    let s = &b.inventory().unwrap()[1];
    assert_eq!(s.mig_pending, Some(true));
    let r = check_report(&b).unwrap();
    assert!(
        r.contains("MIG off (pending on: takes effect at the next GPU reset)"),
        "{r}"
    );
    assert!(
        r.contains("finding: gpu 1: a MIG mode change to on is pending"),
        "{r}"
    );
}

/// Defect 3: without root, MIG-enabled GPUs cannot be inventoried; say so clearly, keep
/// the other GPUs, and treat a refused memory total as unknown.
#[test]
fn without_privileges_the_report_says_so_and_keeps_the_other_gpus() {
    let fake = Fake::new(
        "privileged = false\ncount = 2\n[[gpu]]\nindex = 1\nmig = true\ninstances = [{ profile = 9, start = 0 }]\n",
    );
    let b = fake.backend();
    let problems = b.preflight();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("not privileged") && p.contains("run gpufleet-agent as root")),
        "{problems:?}"
    );
    let inv = b.inventory().unwrap();
    assert!(inv[0].info.is_ok());
    assert!(!inv[1].memory_known);
    let e = inv[1].info.as_ref().unwrap_err().to_string();
    assert!(e.contains("no permission"), "{e}");
    let r = check_report(&b).unwrap();
    assert!(r.contains("finding: not privileged"), "{r}");
    assert!(
        r.contains("gpu 1: GPU-") && r.contains("cannot be read"),
        "{r}"
    );
}

#[test]
fn a_refused_memory_total_is_unknown_not_fatal() {
    let fake = Fake::new(
        "[[gpu]]\nindex = 0\nmig = true\n[[fault]]\nfunction = \"nvmlDeviceGetMemoryInfo_v2\"\ncall = 1\ncode = 4\n",
    );
    let b = fake.backend();
    let s = &b.inventory().unwrap()[0];
    assert!(!s.memory_known);
    let g = s.info.as_ref().unwrap();
    assert_eq!((g.model.as_str(), g.memory_mib), ("H100-80GB", 81920));
}

/// Defect 4: a profile-info error other than NOT_SUPPORTED/INVALID_ARGUMENT is an error,
/// not "no instances" (apply would create over existing ones).
#[test]
fn profile_info_errors_are_not_read_as_no_instances() {
    let fake = Fake::new(
        "[[gpu]]\nindex = 0\nmig = true\ninstances = [{ profile = 9, start = 0 }]\n[[fault]]\nfunction = \"nvmlDeviceGetGpuInstanceProfileInfo\"\ncall = 1\ncode = 15\n",
    );
    let b = fake.backend();
    let e = b.gpu(0).unwrap_err().to_string();
    assert!(e.contains("fallen off the bus"), "{e}");
    // Read again (no fault now): the instance is there.
    assert_eq!(layout_of(&b, 0), (true, vec![(9, 0)]));
}

/// Utilisation and memory in use through NVML: whole-GPU utilisation where NVML has it,
/// none (not 0) under MIG, where the memory is still read.
#[test]
fn usage_reads_utilisation_and_memory_and_none_under_mig() {
    let fake =
        Fake::new("count = 2\n[[gpu]]\nindex = 0\nbusy = true\n[[gpu]]\nindex = 1\nmig = true\n");
    let b = fake.backend();
    let busy = b.usage(0).unwrap();
    assert_eq!(busy.utilization_percent, Some(100));
    assert_eq!(busy.memory_total_mib, 81559);
    assert!(busy.memory_used_mib > 0 && busy.memory_used_mib < busy.memory_total_mib);
    let sliced = b.usage(1).unwrap();
    assert_eq!(sliced.utilization_percent, None);
    assert_eq!(sliced.memory_total_mib, 81559);
}

/// Defect 5: row remapping is part of health; "n/a under MIG" where NVML says so.
#[test]
fn remapped_rows_pending_or_failed_are_unhealthy() {
    let fake = Fake::new(
        "count = 3\n[[gpu]]\nindex = 0\nremapped_rows = { uncorrectable = 2, pending = true }\n[[gpu]]\nindex = 1\nremapped_rows = { failure = true }\n[[gpu]]\nindex = 2\nmig = true\n",
    );
    let b = fake.backend();
    let h0 = b.health(0).unwrap();
    assert!(!h0.healthy);
    assert_eq!(
        h0.remapped_rows,
        RowRemap::Counts {
            correctable: 0,
            uncorrectable: 2,
            pending: true,
            failure: false
        }
    );
    assert!(
        h0.findings[0].contains("row remapping is pending"),
        "{:?}",
        h0.findings
    );
    let h1 = b.health(1).unwrap();
    assert!(!h1.healthy && h1.findings[0].contains("row remapping failed"));
    let h2 = b.health(2).unwrap();
    assert!(h2.healthy);
    assert_eq!(h2.remapped_rows, RowRemap::NotUnderMig);
    let r = check_report(&b).unwrap();
    assert!(
        r.contains("remapped rows 0 correctable/2 uncorrectable, pending"),
        "{r}"
    );
    assert!(r.contains("remapped rows n/a under MIG"), "{r}");
}

/// Defect 6: INSUFFICIENT_RESOURCES (23) is a rule error naming the occupied slices.
#[test]
fn insufficient_resources_names_the_occupied_slices() {
    let fake =
        Fake::new("[[gpu]]\nindex = 0\nmig = true\ninstances = [{ profile = 5, start = 0 }]\n");
    let b = fake.backend();
    match b.create_instance(0, 9, 0) {
        Err(HwError::Rule(m)) => {
            assert!(m.contains("cannot create 3g.40gb@0 (slices 0-3)"), "{m}");
            assert!(m.contains("occupied: 4g.40gb@0 (slices 0-3)"), "{m}");
            assert!(!m.contains("unexpected enum variant"), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

/// Defect 7: a lost GPU or one without permission does not abort the inventory, and work
/// on the other GPUs goes on.
#[test]
fn a_lost_gpu_is_reported_alone() {
    let fake = Fake::new(
        "[[gpu]]\nindex = 5\naccess = \"lost\"\n[[gpu]]\nindex = 6\naccess = \"no_permission\"\n",
    );
    let b = fake.backend();
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 8);
    assert_eq!(inv.iter().filter(|s| s.info.is_ok()).count(), 6);
    assert!(inv[5]
        .info
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("fallen off the bus"));
    assert!(inv[6]
        .info
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("no permission"));
    let e = b.gpus().unwrap_err().to_string();
    assert!(e.contains("2 of 8 GPU(s) cannot be read"), "{e}");
    apply_layout(&b, 0, &placements(&[("7g.80gb", 1)])).unwrap();
    let r = check_report(&b).unwrap();
    assert!(r.contains("gpu 5: cannot be read"), "{r}");
    assert!(r.contains("gpu 7: H100-80GB"), "{r}");
}

/// Defect 8: the MIG driver floor is per model (H200 needs 550.90.07).
#[test]
fn h200_needs_its_own_mig_driver() {
    let fake = Fake::new(
        "model = \"H200-141GB\"\ncount = 2\ndriver_version = \"550.54.15\"\n[[gpu]]\nindex = 1\nmig = true\n",
    );
    let b = fake.backend();
    match b.set_mig_mode(0, true) {
        Err(HwError::Unsupported(m)) => {
            assert!(
                m.contains("MIG on H200-141GB needs driver 550.90.07"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    let r = check_report(&b).unwrap();
    assert!(
        r.contains("driver 550.54.15 is older than MIG on H200-141GB needs (550.90.07"),
        "{r}"
    );
}

/// Defect 9: a compute instance of a profile newer than nvml-wrapper's bindings (7-slice
/// NVL, index 8) is found and destroyed, not read as "work is running".
#[test]
fn a_newer_compute_instance_profile_does_not_block_destroy() {
    let fake = Fake::new(
        "[[gpu]]\nindex = 0\nmig = true\ninstances = [{ profile = 0, start = 0, compute = \"nvl\" }]\n",
    );
    let b = fake.backend();
    let g = b.gpu(0).unwrap();
    assert!(g.instances[0].uuid.starts_with("MIG-"));
    assert!(b.inventory().unwrap()[0].incomplete.is_empty());
    apply_layout(&b, 0, &placements(&[("3g.40gb", 2)])).unwrap();
    assert_eq!(layout_of(&b, 0), (true, vec![(9, 0), (9, 4)]));
}

/// Defect 10: when reading the new instance fails after a successful create, the
/// instance is destroyed before the error (or returned): never left unrecorded.
#[test]
fn a_failed_listing_after_create_leaves_nothing_behind() {
    let fake = Fake::new(
        "[[gpu]]\nindex = 0\nmig = true\n\
         [[fault]]\nfunction = \"nvmlDeviceGetGpuInstances\"\ncall = 1\ncode = 999\n\
         [[fault]]\nfunction = \"nvmlDeviceGetMigDeviceHandleByIndex\"\ncall = 1\ncode = 999\n",
    );
    let b = fake.backend();
    let made = b.create_instance(0, 9, 4);
    // The first read may meet an injected fault: read twice.
    let after = b.gpu(0).or_else(|_| b.gpu(0)).unwrap();
    match made {
        Ok(inst) => assert_eq!(after.instances, vec![inst]),
        Err(e) => assert!(
            after.instances.is_empty(),
            "{e} but the GPU holds {after:?}"
        ),
    }
}

/// Also: a GPU instance without a compute instance is incomplete, and applying a layout
/// recreates it.
#[test]
fn an_instance_without_compute_instance_is_incomplete_and_recreated() {
    let fake = Fake::new(
        "[[gpu]]\nindex = 0\nmig = true\ninstances = [{ profile = 9, start = 0, compute = \"none\" }, { profile = 9, start = 4 }]\n",
    );
    let b = fake.backend();
    assert_eq!(b.inventory().unwrap()[0].incomplete, vec![0]);
    let r = check_report(&b).unwrap();
    assert!(r.contains("INCOMPLETE (no compute instance)"), "{r}");
    assert!(
        r.contains("has no compute instance, so no MIG device"),
        "{r}"
    );
    let made = apply_layout(&b, 0, &placements(&[("3g.40gb", 2)])).unwrap();
    assert!(made.iter().all(|i| i.uuid.starts_with("MIG-")), "{made:?}");
    assert!(b.inventory().unwrap()[0].incomplete.is_empty());
}

/// Also: NVML's profile table is compared with the catalog; a mismatch is a preflight
/// problem printing both tables.
#[test]
fn a_profile_table_that_contradicts_the_catalog_is_refused() {
    let fake = Fake::new("count = 1\n[[profile_patch]]\nid = 9\nplacement_size = 3\n");
    let b = fake.backend();
    let problems = b.preflight();
    assert_eq!(problems.len(), 1, "{problems:?}");
    let p = &problems[0];
    assert!(
        p.contains("differs from the catalog's H100-80GB (profile 9 (3g.40gb) differs)"),
        "{p}"
    );
    assert!(p.contains("catalog:") && p.contains("NVML:"), "{p}");
    // Unpatched, the fake's table (written from the MIG guide) agrees with the catalog for
    // every MIG model.
    for model in [
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "H100-94GB",
        "H200-141GB",
        "B200",
        "GH200",
    ] {
        let fake = Fake::new(&format!(
            "model = \"{model}\"\ncount = 1\ndriver_version = \"580.65.06\"\n"
        ));
        let b = fake.backend();
        assert_eq!(b.gpus().unwrap()[0].model, model);
        assert!(b.preflight().is_empty(), "{model}: {:?}", b.preflight());
    }
}

#[test]
fn persistence_mode_and_gh200_144gb() {
    let fake = Fake::new("count = 1\n[[gpu]]\nindex = 0\npersistence = false\n");
    let r = check_report(&fake.backend()).unwrap();
    assert!(r.contains("MIG off, persistence off"), "{r}");
    let fake = Fake::new("model = \"GH200-144GB\"\ncount = 1\n");
    let g = &fake.backend().gpus().unwrap()[0];
    assert_eq!(
        g.model, "NVIDIA GH200 144G HBM3e",
        "not the catalog's 96GB GH200"
    );
}

mod parity {
    //! The simulated and NVML backends answer the same scripted scenario identically
    //! where the hardware rules say they must: from a random starting layout, apply a
    //! random target layout with the k-th instance create failing (or none), and compare
    //! success and the GPU's final state.
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 7] = [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ];

    fn layout() -> impl Strategy<Value = Option<Vec<Placement>>> {
        proptest::collection::vec(0usize..NAMES.len(), 0..6).prop_map(|picks| {
            let mut l = Layout::new();
            for p in picks {
                *l.entry(NAMES[p].to_string()).or_insert(0) += 1;
            }
            plan(h100(), &l).ok()
        })
    }

    fn scenario(start: &[Placement], fault: u32) -> String {
        let mut s = String::from("count = 1\n");
        if !start.is_empty() {
            let list: Vec<String> = start
                .iter()
                .map(|p| format!("{{ profile = {}, start = {} }}", p.profile_id, p.start))
                .collect();
            s += &format!(
                "[[gpu]]\nindex = 0\nmig = true\ninstances = [{}]\n",
                list.join(", ")
            );
        }
        if fault > 0 {
            s += &format!(
                "[[fault]]\nfunction = \"nvmlDeviceCreateGpuInstanceWithPlacement\"\ncall = {fault}\ncode = 999\n"
            );
        }
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn sim_and_nvml_agree(start in layout(), target in layout(), fault in 0u32..6) {
            let (Some(start), Some(target)) = (start, target) else {
                return Ok(());
            };
            let sim = SimulatedNode::new("parity", h100(), 1, "550.54.15");
            if !start.is_empty() {
                apply_layout(&sim, 0, &start).unwrap();
            }
            if fault > 0 {
                sim.fail_create_at(fault, "injected");
            }
            let fake = FAKE.with(|f| f.clone());
            fake.set_scenario(&scenario(&start, fault));
            let nvml = fake.backend();
            prop_assert_eq!(layout_of(&sim, 0), layout_of(&nvml, 0));
            let a = apply_layout(&sim, 0, &target);
            let b = apply_layout(&nvml, 0, &target);
            prop_assert_eq!(a.is_ok(), b.is_ok(), "sim {:?} nvml {:?}", a, b);
            if let (Ok(a), Ok(b)) = (&a, &b) {
                let shape = |v: &[gpufleet_gpu::hardware::MigInstance]| {
                    v.iter().map(|i| (i.profile_id, i.start, i.size)).collect::<Vec<_>>()
                };
                prop_assert_eq!(shape(a), shape(b));
            }
            prop_assert_eq!(layout_of(&sim, 0), layout_of(&nvml, 0));
        }
    }

    thread_local! {
        static FAKE: std::rc::Rc<Fake> = std::rc::Rc::new(Fake::new(""));
    }
}

#[test]
fn health_readings_through_nvml_carry_xids_pcie_ecc_and_nvlink() {
    let fake = Fake::new(
        "count = 2\n\
         [[gpu]]\nindex = 1\necc_uncorrected = 2\necc_corrected = 7\nxids = [79, 13]\n\
         pcie = { gen = 3, width = 8 }\nnvlink_down = [4]\ntemperature = 61\n",
    );
    let b = fake.backend();
    let healthy = b.readings(0).unwrap();
    assert_eq!(healthy.xids, Ok(vec![]));
    assert_eq!(healthy.slowdown_c, Ok(87));
    assert_eq!(healthy.power_limit_mw, Ok(700_000));
    let link = healthy.pcie.clone().unwrap();
    assert_eq!(
        (link.gen, link.width, link.max_gen, link.max_width),
        (5, 16, 5, 16)
    );
    let nv = healthy.nvlink.clone().unwrap();
    assert_eq!((nv.links, nv.down.len(), nv.replay), (18, 0, 0));
    let r = b.readings(1).unwrap();
    assert_eq!(r.uuid, b.gpus().unwrap()[1].uuid);
    let ecc = r.ecc.clone().unwrap();
    assert_eq!(
        (
            ecc.volatile_uncorrected,
            ecc.aggregate_uncorrected,
            ecc.volatile_corrected
        ),
        (2, 2, 7)
    );
    // XIDs arrive through the event set registered when the backend opened.
    assert_eq!(r.xids, Ok(vec![79, 13]));
    let link = r.pcie.clone().unwrap();
    assert_eq!((link.gen, link.width), (3, 8));
    assert_eq!(r.nvlink.clone().unwrap().down, vec![4]);
    assert_eq!(r.temperature_c, Ok(61));
    // Consumed: the next reading reports only new XIDs.
    assert_eq!(b.readings(1).unwrap().xids, Ok(vec![]));
}

#[test]
fn readings_say_why_where_the_gpu_cannot_answer() {
    let fake = Fake::new("model = \"L40S\"\ncount = 1\n");
    let r = fake.backend().readings(0).unwrap();
    assert!(
        r.nvlink.as_ref().unwrap_err().contains("no NVLink"),
        "{:?}",
        r.nvlink
    );
    // Ampere and newer remap rows instead of retiring pages: NVML says not supported.
    assert!(
        r.retired_pages
            .as_ref()
            .unwrap_err()
            .contains("not supported"),
        "{:?}",
        r.retired_pages
    );
}
