//! Where the binaries under test are: an env var names each one; without it, the workspace's
//! build output (`$CARGO_TARGET_DIR` or `<workspace>/target`, profile `debug`).

use std::path::{Path, PathBuf};

pub const AGENT_ENV: &str = "GPUFLEET_AGENT_BIN";
pub const PROVIDER_ENV: &str = "GPUFLEET_PROVIDER_BIN";
pub const TERRAFORM_ENV: &str = "TERRAFORM_BIN";

/// The workspace root (this crate lives in `<workspace>/tests`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn target_debug_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("debug"),
        None => workspace_root().join("target").join("debug"),
    }
}

fn built_binary(env_var: &str, name: &str) -> PathBuf {
    let path = match std::env::var_os(env_var) {
        Some(path) => PathBuf::from(path),
        None => target_debug_dir().join(name),
    };
    assert!(
        path.is_file(),
        "{name} not found at {} (build it with `cargo build --workspace --bins`, or set {env_var})",
        path.display()
    );
    path
}

/// The backend binary, `gpufleet-agent`.
pub fn agent() -> PathBuf {
    built_binary(AGENT_ENV, "gpufleet-agent")
}

/// The backend binary for benchmarks: `$GPUFLEET_AGENT_BIN`, else the release build
/// (`cargo build --release`; timings of a debug build would mislead).
pub fn release_agent() -> PathBuf {
    if let Some(path) = std::env::var_os(AGENT_ENV) {
        return path.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("release").join("gpufleet-agent")
}

/// The provider binary, `terraform-provider-gpufleet`.
pub fn provider() -> PathBuf {
    built_binary(PROVIDER_ENV, "terraform-provider-gpufleet")
}

/// Terraform: `$TERRAFORM_BIN`, else the launcher that scripts/bootstrap.sh writes, else
/// `terraform` from PATH.
pub fn terraform() -> PathBuf {
    if let Some(path) = std::env::var_os(TERRAFORM_ENV) {
        return PathBuf::from(path);
    }
    let launcher = workspace_root().join(".tools/bin/terraform");
    if launcher.is_file() {
        return launcher;
    }
    PathBuf::from("terraform")
}
