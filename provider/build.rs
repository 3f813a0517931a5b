//! Compiles the plugin protocol's definitions (`proto/`): the server side of Terraform's
//! `tfplugin6`, go-plugin's controller and stdio services and gRPC health. protoc comes
//! from Debian's protobuf-compiler (scripts/bootstrap.sh installs it).

const PROTOS: [&str; 3] = [
    "proto/tfplugin6.proto",
    "proto/plugin.proto",
    "proto/health.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_protos(&PROTOS, &["proto"])?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
