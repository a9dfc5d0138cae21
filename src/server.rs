//! Serving: the CloudProvider service, gRPC health and reflection on one listener, with
//! graceful shutdown. The binary decides the address and the signal; tests bind port 0. The
//! admin address (`--admin-listen`) is one more such listener, with [`ServeOptions::admin`].

use crate::grpc::CloudProviderService;
use crate::optional_rpcs::ProviderExtras;
use crate::provider::Provider;
use cks_proto as pb;
use cks_proto::cloud_provider_server::CloudProviderServer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

/// Largest request the server decodes: the autoscaler's biggest message is a DeleteNodes
/// with a few hundred nodes; anything far larger is a misbehaving client.
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// How the server is run.
pub struct ServeOptions {
    /// The optional RPCs (template node, option overrides).
    pub extras: Arc<ProviderExtras>,
    /// TLS (mutual when a client CA is configured), re-read when the files change. With a
    /// client CA, each call's verified client certificate names its caller, which sees only
    /// the node groups bound to it (`--nodes …@CLIENT`, `crate::grpc::caller`).
    pub tls: Option<crate::tls::ReloadingTls>,
    /// Concurrent requests per connection.
    pub concurrency_per_connection: usize,
    /// The admin address: every call is the read-only admin caller's, who sees every group
    /// (`crate::provider::Caller::admin`). Its TLS asks for no client certificate.
    pub admin: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            extras: Arc::new(ProviderExtras::without_template()),
            tls: None,
            concurrency_per_connection: 256,
            admin: false,
        }
    }
}

/// Serves until `shutdown` completes, then finishes in-flight RPCs.
pub async fn serve(
    listener: TcpListener,
    provider: Provider,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_not_serving::<CloudProviderServer<CloudProviderService>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let health_task = tokio::spawn(track_health(provider.clone(), reporter));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let cloud_provider = if options.admin {
        CloudProviderService::admin(provider.clone(), options.extras)
    } else {
        CloudProviderService::new(provider.clone(), options.extras)
    };
    let service = InterceptedService::new(
        CloudProviderServer::new(cloud_provider).max_decoding_message_size(MAX_REQUEST_BYTES),
        crate::grpc::leader_gate(provider),
    );
    let mut builder = Server::builder()
        .concurrency_limit_per_connection(options.concurrency_per_connection)
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(30)));
    let router = builder
        .add_service(health)
        .add_service(reflection)
        .add_service(service);
    let result = match options.tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(crate::tls::incoming(listener, tls), shutdown)
                .await
        }
        None => {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    };
    health_task.abort();
    result.map_err(Into::into)
}

/// gRPC health: the whole server ("") says what `/readyz` says (whether this replica can take
/// the autoscaler's calls, CloudStack's state aside: a gRPC readiness probe must not take the
/// leader out of its Service's endpoints when CloudStack is down); the CloudProvider service
/// says whether every node group has a snapshot within the staleness bound, for `probe` and
/// an operator's checks.
async fn track_health(provider: Provider, reporter: tonic_health::server::HealthReporter) {
    let mut last = None;
    loop {
        let health = provider.health();
        let now = (health.ready_for_traffic(), health.healthy());
        if last != Some(now) {
            let (ready, fresh) = now;
            let status = |up: bool| {
                if up {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                }
            };
            if fresh {
                reporter
                    .set_serving::<CloudProviderServer<CloudProviderService>>()
                    .await;
            } else {
                reporter
                    .set_not_serving::<CloudProviderServer<CloudProviderService>>()
                    .await;
            }
            reporter.set_service_status("", status(ready)).await;
            tracing::info!(
                serving = ready,
                snapshots_fresh = fresh,
                "health status changed"
            );
            last = Some(now);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
