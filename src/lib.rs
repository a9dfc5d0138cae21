//! cks-autoscaler-provider: a Kubernetes cluster-autoscaler `externalgrpc` cloud provider for
//! Apache CloudStack Kubernetes Service (CKS).
//!
//! See ARCHITECTURE.md for the code map.
pub mod app;
pub mod autoscaler;
pub mod cli;
pub mod cloudstack;
pub mod config;
pub mod demo;
pub mod domain;
pub mod extras;
pub mod grammar;
pub mod grpc;
pub mod metrics;
pub mod options;
pub mod pb;
pub mod probe;
pub mod provider;
pub mod redact;
pub mod server;
pub mod sim;
pub mod template;
pub mod testkit;
pub mod tls;
