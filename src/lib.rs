//! cks-autoscaler-provider: a Kubernetes cluster-autoscaler `externalgrpc` cloud provider for
//! Apache CloudStack Kubernetes Service (CKS). The service and its binary; the decisions live
//! in `cks-domain`, the CloudStack client in `cks-cloudstack`, the wire in `cks-proto`.
//!
//! See ARCHITECTURE.md for the code map.
pub mod app;
pub mod check;
pub mod cli;
pub mod config;
pub mod grammar;
pub mod grpc;
pub mod keys;
pub mod kube;
pub mod leader;
pub mod metrics;
pub mod optional_rpcs;
pub mod options;
pub mod probe;
pub mod provider;
pub mod server;
pub mod suggest;
pub mod template;
pub mod tls;
pub mod x509;
