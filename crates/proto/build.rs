//! Generates the externalgrpc server and client from `proto/` with protox, so no system
//! `protoc` is needed on a fresh machine.

/// Kubernetes messages the protos name are `k8s_pb`'s types (the crate the template node is
/// built with), so nothing generated here duplicates them.
const K8S_EXTERN: [(&str, &str); 2] = [
    (
        ".k8s.io.apimachinery.pkg.apis.meta.v1",
        "::k8s_pb::apimachinery::pkg::apis::meta::v1",
    ),
    (".k8s.io.api.core.v1", "::k8s_pb::api::core::v1"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(["proto/externalgrpc.proto"], ["proto"])?;
    // The descriptor set serves gRPC reflection (grpcurl, grpc_health_probe users).
    std::fs::write(
        out.join("externalgrpc_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let mut config = tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .generate_default_stubs(true);
    for (proto, rust) in K8S_EXTERN {
        config = config.extern_path(proto, rust);
    }
    config.compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
