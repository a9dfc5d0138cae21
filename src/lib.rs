//! cks-autoscaler-provider: a Kubernetes cluster-autoscaler `externalgrpc` cloud provider for
//! Apache CloudStack Kubernetes Service (CKS). The service and its binary; the decisions live
//! in `cks-domain`, the CloudStack client in `cks-cloudstack`, the wire in `cks-proto`.
//!
//! See ARCHITECTURE.md for the code map.
pub mod app;
pub mod cli;
pub mod config;
pub mod grammar;
pub mod grpc;
pub mod metrics;
pub mod optional_rpcs;
pub mod options;
pub mod probe;
pub mod provider;
pub mod server;
pub mod template;
pub mod tls;

#[cfg(test)]
mod test_files {
    /// A file with `text` in a directory of its own under the system's temporary directory.
    pub fn temp_file(tag: &str, name: &str, text: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cks-{tag}-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write temp file");
        path
    }
}
