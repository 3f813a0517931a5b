//! Compiles the previous release's protocol (`proto-previous/`, a copy of `proto/` as the
//! last release had it) for tests/tests/version_skew.rs: its clients and servers speak to
//! this release's control plane and agent as the previous release's would.

use std::path::PathBuf;

const PREVIOUS: [&str; 2] = ["gpufleet/v1/gpufleet.proto", "gpufleet/v1/node_agent.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_build::configure()
        .file_descriptor_set_path(out.join("previous.fds"))
        .compile_protos(&PREVIOUS, &["proto-previous"])?;
    for proto in PREVIOUS {
        println!("cargo:rerun-if-changed=proto-previous/{proto}");
    }
    Ok(())
}
