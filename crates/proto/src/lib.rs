//! The externalgrpc wire: generated types, server and client (from `crates/proto/proto/externalgrpc.proto`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");

/// Encoded file descriptor set, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("externalgrpc_descriptor");
