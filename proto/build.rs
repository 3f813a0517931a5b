use std::path::PathBuf;

use prost::Message;

const PROTOS: [&str; 2] = ["gpufleet/v1/gpufleet.proto", "gpufleet/v1/node_agent.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("gpufleet.v1.fds");
    // The messages and the clients, with tonic's codec: a response that does not decode
    // is INTERNAL (the server's fault). protoc comes from Debian's protobuf-compiler
    // (scripts/bootstrap.sh installs it).
    tonic_build::configure()
        .build_server(false)
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&PROTOS, &["."])?;

    // The servers alone, over the same messages, with the codec that answers a request
    // that does not decode INVALID_ARGUMENT (the caller's fault): `src/codec.rs`. Their
    // descriptors without messages or enums, so nothing is generated twice.
    let mut set = prost_types::FileDescriptorSet::decode(&*std::fs::read(&descriptors)?)?;
    for file in &mut set.file {
        file.message_type.clear();
        file.enum_type.clear();
    }
    let servers = out.join("servers");
    std::fs::create_dir_all(&servers)?;
    tonic_build::configure()
        .build_client(false)
        .build_server(true)
        .codec_path("crate::codec::ServerCodec")
        .extern_path(".gpufleet.v1", "crate::v1")
        .out_dir(&servers)
        .compile_fds(set)?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
