//! Prometheus metrics and the plain-HTTP operations endpoints (`/metrics`, `/healthz`,
//! `/readyz`) served on `--metrics-listen`, apart from the gRPC port.
//!
//! Counters and histograms are recorded through the `metrics` facade where things happen
//! (RPCs in `grpc.rs`, CloudStack calls, job outcomes); per-group gauges are read from a
//! [`MetricsSource`] at scrape time so they can never drift from what the autoscaler is told.
//!
//! A leaf: it knows no provider, gRPC or configuration type. Whoever serves the endpoint
//! supplies the [`MetricsSource`]; callers pass labels as plain strings.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::future::Future;
use std::sync::{Arc, OnceLock};
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

/// Records one gRPC call. `code` is the gRPC status code's name as tonic spells it (`Ok`,
/// `FailedPrecondition`, …), the label value dashboards already use.
pub fn record_rpc(method: &'static str, started: Instant, code: &str) {
    metrics::counter!("cks_provider_grpc_requests_total", "method" => method, "code" => code.to_string())
        .increment(1);
    metrics::histogram!("cks_provider_grpc_request_duration_seconds", "method" => method, "code" => code.to_string())
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

/// Records accepted node removals that were not carried out (the merged request refused, or
/// its job failed with these nodes left).
pub fn record_removals_dropped(count: usize) {
    metrics::counter!("cks_provider_removals_dropped_total").increment(count as u64);
}

/// One node group's state as the gauges show it, read at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupGauges {
    pub id: String,
    /// `None` when the group has no target yet (no snapshot): the gauge keeps its last value.
    pub target_size: Option<u32>,
    pub min_size: u32,
    pub max_size: u32,
    /// Workers by the state the autoscaler is told.
    pub running: u32,
    pub creating: u32,
    pub deleting: u32,
    /// Workers CloudStack reports as not running (stopped, errored…).
    pub down: usize,
    /// CloudStack's name for the cluster's state, when a snapshot exists.
    pub cluster_state: Option<String>,
    /// Age of the group's snapshot, when one exists.
    pub since_refresh: Option<Duration>,
}

/// What the operations endpoints read from the running service.
pub trait MetricsSource: Send + Sync + 'static {
    /// `/readyz` answers 200: every group has a snapshot fresh enough to serve.
    fn ready(&self) -> bool;
    /// Every node group's gauge values, now.
    fn group_gauges(&self) -> Vec<GroupGauges>;
    /// Whether this CloudStack scales clusters in Alert: `unknown`, `supported` or
    /// `unsupported`, and how long ago CloudStack's refusal taught it (when it did).
    fn alert_verdict(&self) -> Option<(&'static str, Option<Duration>)> {
        None
    }
}

/// The Alert-scaling verdict: the current one 1, the others 0 (so an alert on
/// `verdict="unsupported"` clears when it is re-checked), and its age.
fn set_alert_verdict(verdict: Option<(&'static str, Option<Duration>)>) {
    let Some((current, age)) = verdict else {
        return;
    };
    for v in ["unknown", "supported", "unsupported"] {
        metrics::gauge!("cks_provider_alert_scaling", "verdict" => v).set(if v == current {
            1.0
        } else {
            0.0
        });
    }
    metrics::gauge!("cks_provider_alert_scaling_verdict_age_seconds")
        .set(age.map_or(0.0, |a| a.as_secs_f64()));
}

/// Sets the per-group gauges.
fn set_group_gauges(groups: &[GroupGauges]) {
    for g in groups {
        let id = g.id.clone();
        if let Some(t) = g.target_size {
            metrics::gauge!("cks_provider_node_group_target_size", "node_group" => id.clone())
                .set(f64::from(t));
        }
        metrics::gauge!("cks_provider_node_group_min_size", "node_group" => id.clone())
            .set(f64::from(g.min_size));
        metrics::gauge!("cks_provider_node_group_max_size", "node_group" => id.clone())
            .set(f64::from(g.max_size));
        for (state, n) in [
            ("running", f64::from(g.running)),
            ("creating", f64::from(g.creating)),
            ("deleting", f64::from(g.deleting)),
            ("down", g.down as f64),
        ] {
            metrics::gauge!("cks_provider_node_group_workers", "node_group" => id.clone(), "state" => state).set(n);
        }
        if let Some(state) = &g.cluster_state {
            metrics::gauge!("cks_provider_cluster_state", "node_group" => id.clone(), "state" => state.clone())
                .set(1.0);
        }
        if let Some(age) = g.since_refresh {
            metrics::gauge!("cks_provider_seconds_since_refresh", "node_group" => id.clone())
                .set(age.as_secs_f64());
        }
    }
}

#[derive(Clone)]
struct HttpState {
    handle: PrometheusHandle,
    source: Arc<dyn MetricsSource>,
}

async fn metrics_page(State(s): State<HttpState>) -> String {
    set_group_gauges(&s.source.group_gauges());
    set_alert_verdict(s.source.alert_verdict());
    s.handle.render()
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    if s.source.ready() {
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
    source: Arc<dyn MetricsSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = HttpState {
        handle: install(),
        source,
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed {
        ready: bool,
    }

    impl MetricsSource for Fixed {
        fn ready(&self) -> bool {
            self.ready
        }

        fn group_gauges(&self) -> Vec<GroupGauges> {
            vec![GroupGauges {
                id: "metrics-test-group".into(),
                target_size: Some(3),
                min_size: 1,
                max_size: 5,
                running: 2,
                creating: 1,
                deleting: 0,
                down: 1,
                cluster_state: Some("Running".into()),
                since_refresh: Some(Duration::from_secs(2)),
            }]
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("http://{addr}{path}"))
            .await
            .expect("endpoint answers");
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    }

    #[tokio::test]
    async fn endpoints_answer_from_the_source_with_the_published_names() {
        install();
        record_rpc("MetricsTestRpc", Instant::now(), "FailedPrecondition");
        for (ready, readyz) in [(true, 200), (false, 503)] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(serve_http(listener, Arc::new(Fixed { ready }), async {
                let _ = stopped.await;
            }));
            assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
            assert_eq!(get(addr, "/readyz").await.0, readyz, "ready: {ready}");
            let (status, page) = get(addr, "/metrics").await;
            assert_eq!(status, 200);
            for line in [
                r#"cks_provider_grpc_requests_total{method="MetricsTestRpc",code="FailedPrecondition"} 1"#,
                r#"cks_provider_node_group_target_size{node_group="metrics-test-group"} 3"#,
                r#"cks_provider_node_group_min_size{node_group="metrics-test-group"} 1"#,
                r#"cks_provider_node_group_max_size{node_group="metrics-test-group"} 5"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="running"} 2"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="creating"} 1"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="deleting"} 0"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="down"} 1"#,
                r#"cks_provider_cluster_state{node_group="metrics-test-group",state="Running"} 1"#,
                r#"cks_provider_seconds_since_refresh{node_group="metrics-test-group"} 2"#,
            ] {
                assert!(
                    page.lines().any(|l| l == line),
                    "{line} missing in:\n{page}"
                );
            }
            let _ = stop.send(());
            server.await.expect("joins").expect("serves until stopped");
        }
    }
}
