fn main() -> Result<(), Box<dyn std::error::Error>> {
    // protoc comes from Debian's protobuf-compiler (scripts/bootstrap.sh installs it).
    tonic_build::configure().compile_protos(
        &["gpufleet/v1/gpufleet.proto", "gpufleet/v1/node_agent.proto"],
        &["."],
    )?;
    println!("cargo:rerun-if-changed=gpufleet/v1/gpufleet.proto");
    println!("cargo:rerun-if-changed=gpufleet/v1/node_agent.proto");
    Ok(())
}
