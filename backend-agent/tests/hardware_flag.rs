//! `serve --hardware nvml` start errors that need no GPU: they come before anything
//! touches a GPU or the data dir.

use std::process::Command;

fn serve(data_dir: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env_remove("GPUFLEET_FLEET")
        .output()
        .expect("run gpufleet-agent serve");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_fleet_file_with_nvml_hardware_is_refused_before_the_data_dir_exists() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ok, err) = serve(
        &data,
        &["--hardware", "nvml", "--fleet", "/nonexistent/fleet.toml"],
    );
    assert!(!ok);
    assert!(
        err.contains("--fleet (GPUFLEET_FLEET): not used with --hardware nvml"),
        "{err}"
    );
    assert!(!data.exists());
}

#[test]
fn nvml_hardware_without_a_driver_says_so_before_the_data_dir_exists() {
    if gpufleet_gpu::hardware::NvmlBackend::new().is_ok() {
        // An NVIDIA host: serve would drive its GPUs; this test is about hosts without one.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ok, err) = serve(&data, &["--hardware", "nvml"]);
    assert!(!ok);
    assert!(err.contains("--hardware nvml: NVIDIA driver"), "{err}");
    assert!(!data.exists());
}

#[test]
fn a_fleet_file_that_does_not_parse_is_refused_before_the_data_dir_exists() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(&fleet, "[[pools]\n").unwrap();
    let data = dir.path().join("data");
    let (ok, err) = serve(&data, &["--fleet", fleet.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("fleet.toml"), "{err}");
    assert!(
        !data.exists(),
        "no data dir (and no state.db) for a refused start"
    );
}
