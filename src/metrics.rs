//! Prometheus metrics and the plain-HTTP operations endpoints (`/metrics`, `/healthz`,
//! `/readyz`) served on `--metrics-listen`, apart from the gRPC port.
//!
//! Counters and histograms are recorded through the `metrics` facade where things happen
//! (RPCs in `grpc.rs`, CloudStack calls, job outcomes); per-group gauges are computed from the
//! provider's state at scrape time so they can never drift from what the autoscaler is told.

use crate::domain::status::InstanceState;
use crate::provider::Provider;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once; later calls return the same handle.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ])
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Fails only when another recorder is installed (tests); the handle still renders.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Records one gRPC call.
pub fn record_rpc(method: &'static str, started: Instant, code: tonic::Code) {
    let code = format!("{code:?}");
    metrics::counter!("cks_provider_grpc_requests_total", "method" => method, "code" => code.clone())
        .increment(1);
    metrics::histogram!("cks_provider_grpc_request_duration_seconds", "method" => method, "code" => code)
        .record(started.elapsed().as_secs_f64());
}

/// Records one CloudStack API call.
/// `waited`: from sending the request to having read the whole answer (CloudStack's time, not
/// the provider's time parsing it).
pub fn record_cloudstack(command: &str, waited: Duration, outcome: &'static str) {
    metrics::counter!("cks_provider_cloudstack_requests_total", "command" => command.to_string(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("cks_provider_cloudstack_request_duration_seconds", "command" => command.to_string())
        .record(waited.as_secs_f64());
}

/// Records a finished scale job.
pub fn record_job(kind: &'static str, outcome: &'static str) {
    metrics::counter!("cks_provider_scale_jobs_total", "kind" => kind, "outcome" => outcome)
        .increment(1);
}

/// Sets the per-group gauges from the provider's current state.
pub fn update_group_gauges(provider: &Provider) {
    for g in provider.node_groups() {
        let id = g.id.clone();
        if let Ok(t) = provider.target_size(&id) {
            metrics::gauge!("cks_provider_node_group_target_size", "node_group" => id.clone())
                .set(f64::from(t));
        }
        metrics::gauge!("cks_provider_node_group_min_size", "node_group" => id.clone())
            .set(f64::from(g.min));
        metrics::gauge!("cks_provider_node_group_max_size", "node_group" => id.clone())
            .set(f64::from(g.max));
        let (mut running, mut creating, mut deleting) = (0u32, 0u32, 0u32);
        for i in provider.nodes(&id).unwrap_or_default().iter() {
            match i.state {
                InstanceState::Running => running += 1,
                InstanceState::Creating => creating += 1,
                InstanceState::Deleting => deleting += 1,
            }
        }
        let down = provider.down_workers(&id).len();
        for (state, n) in [
            ("running", f64::from(running)),
            ("creating", f64::from(creating)),
            ("deleting", f64::from(deleting)),
            ("down", down as f64),
        ] {
            metrics::gauge!("cks_provider_node_group_workers", "node_group" => id.clone(), "state" => state).set(n);
        }
        if let Some(snap) = provider.snapshot(&id) {
            metrics::gauge!("cks_provider_cluster_state", "node_group" => id.clone(), "state" => snap.state.as_str().to_string())
                .set(1.0);
        }
        if let Some(age) = provider.snapshot_age(&id) {
            metrics::gauge!("cks_provider_seconds_since_refresh", "node_group" => id.clone())
                .set(age.as_secs_f64());
        }
    }
}

#[derive(Clone)]
struct HttpState {
    handle: PrometheusHandle,
    provider: Provider,
}

async fn metrics_page(State(s): State<HttpState>) -> String {
    update_group_gauges(&s.provider);
    s.handle.render()
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    if s.provider.healthy() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no fresh CloudStack snapshot\n",
        )
    }
}

/// Serves `/metrics`, `/healthz` (process alive) and `/readyz` (fresh snapshot) until
/// `shutdown` completes.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    provider: Provider,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = HttpState {
        handle: install(),
        provider,
    };
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
