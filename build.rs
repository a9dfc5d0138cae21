//! Generates the externalgrpc server and client from `proto/` with protox, so no system
//! `protoc` is needed on a fresh machine; and, for tests/wire_generations.rs only, a client for
//! each upstream wire generation kept under `tests/protos/`.

use std::path::Path;

/// Kubernetes messages the protos name are `k8s_pb`'s types (the crate the template node is
/// built with), so nothing generated here duplicates them.
const K8S_EXTERN: [(&str, &str); 2] = [
    (
        ".k8s.io.apimachinery.pkg.apis.meta.v1",
        "::k8s_pb::apimachinery::pkg::apis::meta::v1",
    ),
    (".k8s.io.api.core.v1", "::k8s_pb::api::core::v1"),
];

/// The upstream wire generations under `tests/protos/` (each file names its upstream tags).
const GENERATIONS: [&str; 5] = ["v1_28", "v1_29", "v1_33", "v1_34_2", "v1_35"];

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

    // Clients of every generation, each in its own directory (they share the package name).
    // Only tests include them: `include!(concat!(env!("OUT_DIR"), "/wire-generations/<g>/..."))`.
    for generation in GENERATIONS {
        let dir = Path::new("tests/protos").join(generation);
        let fds = protox::compile(
            [dir.join("externalgrpc.proto")],
            [dir.as_path(), Path::new("tests/protos/k8s-stubs")],
        )?;
        let gen_out = out.join("wire-generations").join(generation);
        std::fs::create_dir_all(&gen_out)?;
        let mut config = tonic_prost_build::configure()
            .build_server(false)
            .build_client(true)
            .build_transport(true)
            .out_dir(&gen_out);
        for (proto, rust) in K8S_EXTERN {
            config = config.extern_path(proto, rust);
        }
        config.compile_fds(fds)?;
    }
    println!("cargo:rerun-if-changed=tests/protos");
    Ok(())
}
