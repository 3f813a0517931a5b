//! `--hardware nvml` end to end without a GPU: `hw-check`, `serve` (embedded agent) and
//! `node` (external agent) run the real NVML code against the fake NVML library
//! (`backend-agent/gpu/fake-nvml`) given with `--nvml-lib` / `GPUFLEET_NVML_LIB`.
//!
//! Each test copies `libfake_nvml.so` into its temp dir with its scenario beside it
//! (`fake-nvml.toml`). The library is built by `cargo build --workspace` / `cargo test
//! --workspace`; when it is missing, the first test builds it (`cargo build -p fake-nvml`).

mod common;

use common::{mig_layout, Agent, Clients, ADMIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn fake_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // The agent binary and libfake_nvml.so share target/<profile>/.
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_gpufleet-agent"));
        let lib = bin.parent().unwrap().join("libfake_nvml.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
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

/// A copy of the fake NVML library in `dir` with `scenario` beside it; returns its path.
fn fake_in(dir: &Path, scenario: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let lib = dir.join("libfake_nvml.so");
    std::fs::copy(fake_library(), &lib).unwrap();
    std::fs::write(dir.join("fake-nvml.toml"), scenario).unwrap();
    lib.to_str().unwrap().to_string()
}

fn agent_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
    for var in [
        "FAKE_NVML_SCENARIO",
        "GPUFLEET_NVML_LIB",
        "GPUFLEET_FLEET",
        "GPUFLEET_ADMIN_TOKEN",
    ] {
        c.env_remove(var);
    }
    c
}

#[test]
fn hw_check_reads_the_fake_host_through_nvml() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_in(
        &dir.path().join("lib"),
        "[[gpu]]\nindex = 1\nmig = true\ninstances = [{ profile = 9, start = 0 }, { profile = 19, start = 6 }]\n\
         [[gpu]]\nindex = 5\naccess = \"lost\"\n\
         [[gpu]]\nindex = 3\nremapped_rows = { uncorrectable = 1, pending = true }\n",
    );
    let out = agent_cmd()
        .args(["hw-check", "--hardware", "nvml", "--nvml-lib", &lib])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("driver: 550.54.15\ncuda:   12.4\ngpus:   8\n"),
        "{text}"
    );
    assert!(text.contains("gpu 0: H100-80GB GPU-"), "{text}");
    assert!(
        text.contains("MIG on, persistence on\n  mig 3g.40gb@0 (slices 0-3) 40448 MiB MIG-"),
        "{text}"
    );
    assert!(
        text.contains("  mig 1g.10gb@6 (slices 6-6) 9984 MiB MIG-"),
        "{text}"
    );
    assert!(text.contains("remapped rows n/a under MIG"), "{text}");
    assert!(
        text.contains("gpu 5: cannot be read: NVML: gpu 5: the GPU has fallen off the bus"),
        "{text}"
    );
    assert!(
        text.contains("finding: gpu 3: row remapping is pending"),
        "{text}"
    );

    // The same through GPUFLEET_NVML_LIB.
    let out = agent_cmd()
        .args(["hw-check", "--hardware", "nvml"])
        .env("GPUFLEET_NVML_LIB", &lib)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), text);
}

#[test]
fn hw_check_prints_the_health_checks_of_a_level() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_in(
        &dir.path().join("lib"),
        "count = 2\n[[gpu]]\nindex = 1\nxids = [79]\npcie = { gen = 3, width = 8 }\necc_uncorrected = 2\n",
    );
    let run = |level: &str| {
        let out = agent_cmd()
            .args([
                "hw-check",
                "--hardware",
                "nvml",
                "--nvml-lib",
                &lib,
                "--level",
                level,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let medium = run("medium");
    assert!(medium.contains("checks (medium):\n  FAIL    "), "{medium}");
    for line in [
        "FAIL    xid GPU-",
        ": 79 (threshold no XID that needs a GPU reset or service)",
        "FAIL    ecc_uncorrected_volatile GPU-",
        ": 2 uncorrected (threshold 0)",
        "FAIL    pcie_link GPU-",
        ": Gen3 x8 (threshold Gen5 x16)",
        "PASS    driver: 550.54.15 (threshold >= 520.61.05 (H100-80GB minimum))",
        "PASS    temperature GPU-",
        "NOT_RUN dcgm_diag: not run",
    ] {
        assert!(medium.contains(line), "missing '{line}' in\n{medium}");
    }
    let quick = run("quick");
    assert!(
        quick.contains("checks (quick):") && !quick.contains("pcie_link"),
        "{quick}"
    );
    let bad = agent_cmd()
        .args([
            "hw-check",
            "--hardware",
            "nvml",
            "--nvml-lib",
            &lib,
            "--level",
            "deep",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--level"));
}

/// The test process the agent starts for each MIG slice (`load-probe`, hidden) answers
/// one line: on this host without CUDA, why its test cannot run; a bad call, what to give.
#[test]
fn the_slice_test_process_answers_one_line() {
    let run = |args: &[&str]| {
        let out = agent_cmd().arg("load-probe").args(args).output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let line = run(&["burn-bf16", "33280", "0.5", "1", "1000", "1048576", "7"]);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with("err not run: no CUDA library") || line.starts_with("ok burn bf16 "),
        "{line}"
    );
    assert!(run(&["burn"]).starts_with("err load-probe: give TEST MEMORY_MIB"));
}

#[test]
fn a_missing_nvml_library_is_a_clear_error() {
    let out = agent_cmd()
        .args([
            "hw-check",
            "--hardware",
            "nvml",
            "--nvml-lib",
            "/nonexistent/libnvml.so",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVML library /nonexistent/libnvml.so cannot be loaded"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_host_it_cannot_drive_before_the_data_dir_exists() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let lib = fake_in(&dir.path().join("lib"), "privileged = false\n");
    let out = agent_cmd()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--hardware",
            "nvml",
            "--nvml-lib",
            &lib,
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not privileged") && err.contains("as root"),
        "{err}"
    );
    assert!(!data.exists());

    let lib = fake_in(
        &dir.path().join("lib2"),
        "[[profile_patch]]\nid = 9\nplacement_size = 3\n",
    );
    let out = agent_cmd()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--hardware",
            "nvml",
            "--nvml-lib",
            &lib,
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MIG profile table differs from the catalog's H100-80GB"),
        "{err}"
    );
    assert!(!data.exists());
}

/// `serve --hardware nvml`: the fake host is seeded as the one pool node, a cluster's MIG
/// layout goes to its GPUs through NVML, and a restart that finds the same GPUs in
/// another index order is the same host.
#[tokio::test]
async fn serve_drives_the_fake_host_through_nvml() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let lib = fake_in(&dir.path().join("lib"), "count = 2\n");
    let agent = Agent::start_with(
        &data,
        &[
            "--admin-token",
            ADMIN,
            "--hardware",
            "nvml",
            "--nvml-lib",
            &lib,
            // The fake host has no CUDA: its load tests cannot run, which fails its
            // checks unless the fleet lets hosts of its model skip them.
            "--load-test-skip",
            "H100-80GB",
        ],
    );
    let mut c = agent.admin().await;
    let nodes = c.nodes().await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(
        (nodes[0].gpu_type.as_str(), nodes[0].gpu_count),
        ("H100-80GB", 2)
    );
    let uuids: Vec<String> = nodes[0].gpus.iter().map(|g| g.uuid.clone()).collect();

    let (t, _) = c.tenant("team-a").await;
    c.quota(&t.id, "H100-80GB", 2, 0).await;
    let mut req = Clients::cluster(&t.id, "k", "H100-80GB", 1);
    req.mig_layout = mig_layout(&[("3g.40gb", 2)]);
    let k = c.create_cluster(req).await;
    for g in &k.nodes[0].gpus {
        assert!(g.mig_enabled);
        let got: Vec<(String, i32)> = g
            .mig_devices
            .iter()
            .map(|d| (d.profile.clone(), d.start))
            .collect();
        assert_eq!(got, vec![("3g.40gb".into(), 0), ("3g.40gb".into(), 4)]);
        assert!(g.mig_devices.iter().all(|d| d.uuid.starts_with("MIG-")));
    }
    drop(c);
    assert!(agent.stop().success());

    // After a "reboot" the GPUs enumerate in another order (and, the fake's state being
    // per process, come back with MIG off): still this host.
    std::fs::write(
        dir.path().join("lib/fake-nvml.toml"),
        "count = 2\nindex_order = [1, 0]\n",
    )
    .unwrap();
    let agent = Agent::start_with(
        &data,
        &[
            "--admin-token",
            ADMIN,
            "--hardware",
            "nvml",
            "--nvml-lib",
            &lib,
            // The fake host has no CUDA: its load tests cannot run, which fails its
            // checks unless the fleet lets hosts of its model skip them.
            "--load-test-skip",
            "H100-80GB",
        ],
    );
    let mut c = agent.admin().await;
    let nodes = c.nodes().await;
    let now: Vec<String> = nodes[0].gpus.iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(now, vec![uuids[1].clone(), uuids[0].clone()]);
}

/// `gpufleet-agent node --hardware nvml` registers the fake host with a control plane.
#[test]
fn a_node_agent_registers_the_fake_host() {
    let dir = tempfile::tempdir().unwrap();
    let cp_data = dir.path().join("cp");
    let lib = fake_in(
        &dir.path().join("lib"),
        "model = \"H200-141GB\"\ncount = 4\ndriver_version = \"550.90.07\"\n",
    );
    let cp = Agent::start_with(
        &cp_data,
        &[
            "--admin-token",
            ADMIN,
            "--node-agents",
            "external",
            "--join-token",
            "join-secret",
            // No CUDA on the fake host: its load tests may only say "not run".
            "--load-test-skip",
            "H200-141GB",
        ],
    );
    let node_log = std::fs::File::create(dir.path().join("node.log")).unwrap();
    let mut node = agent_cmd()
        .args([
            "node",
            "--hardware",
            "nvml",
            "--control-plane",
            &cp.endpoint,
            "--join-token",
            "join-secret",
            "--name",
            "fake-h200",
            "--data-dir",
        ])
        .arg(dir.path().join("node"))
        .env("GPUFLEET_NVML_LIB", &lib)
        .stdout(Stdio::null())
        .stderr(node_log)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        let out = agent_cmd()
            .args(["nodes", "--endpoint", &cp.endpoint, "--token", ADMIN])
            .output()
            .unwrap();
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        if last.lines().any(|l| {
            l.starts_with("fake-h200")
                && l.contains("H200-141GB")
                && l.contains(" 4 ")
                && l.contains("ready")
        }) {
            break;
        }
        if let Some(status) = node.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
            panic!("node agent exited ({status}):\n{log}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = node.kill();
    let _ = node.wait();
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(
        last.lines()
            .any(|l| l.starts_with("fake-h200") && l.contains("ready")),
        "nodes:\n{last}\nnode log:\n{log}"
    );
}
