//! Generates the externalgrpc server and client from `proto/` with protox, so no system
//! `protoc` is needed on a fresh machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(["proto/externalgrpc.proto"], ["proto"])?;
    // The descriptor set serves gRPC reflection (grpcurl, grpc_health_probe users).
    std::fs::write(
        out.join("externalgrpc_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto/externalgrpc.proto");
    Ok(())
}
