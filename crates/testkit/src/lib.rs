//! What the tests and benchmarks of the workspace share (a dev-dependency only): a simulator, a provider serving gRPC on
//! loopback with shrunk timings, a gRPC client, node helpers, a CloudStack client with its own
//! signer ([`cs`]), a central provider's fleet of clusters ([`fleet`]), the end-to-end harness with mock autoscalers ([`stack`]), the provider as a
//! process ([`process`]), a real Kubernetes API server ([`kube`]), a Secret volume updated the
//! kubelet's way ([`secret_volume`]), the exchanges recorded with a real CloudStack 4.21, read in
//! place ([`recorded`]), the programs no crate provides, set up on first use
//! ([`tools`]), and the one way a test waits: [`wait_until`].
//!
//! # Time
//! The simulator and the mock autoscaler run on tokio time, so a test started with
//! `#[tokio::test(start_paused = true)]` owns their clock: time stands still while something
//! runs and jumps to the next timer when every task waits (tokio's auto-advance), and a test may
//! `tokio::time::advance` it. [`wait_until`] polls on that same clock. Nothing here sleeps a
//! fixed time hoping something is done: waits are on conditions, with a bound ([`WAIT`]) far
//! above what any test needs, so a slow machine makes a test slower, never red.
//!
//! Only a provider process ([`process`]) keeps the wall clock: its time is not the test's.

pub mod certs;
pub mod cs;
pub mod fleet;
pub mod kube;
pub mod logs;
pub mod process;
pub mod recorded;
pub mod secret_volume;
pub mod stack;
pub mod tools;

use cks_autoscaler_provider::config::{ClusterRef, NodeGroupSpec};
use cks_autoscaler_provider::provider::{Provider, Settings};
use cks_autoscaler_provider::server::{ServeOptions, serve};
use cks_cloudstack::{Client, ClientConfig};
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, SimConfig, SimHandle};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tonic::transport::Channel;

pub use secret_volume::SecretVolume;
pub use stack::Stack;

/// The API key of test simulators.
pub const API_KEY: &str = "test-api-key";
/// The secret key of test simulators.
pub const SECRET_KEY: &str = "test-secret-key";

/// Upper bound of every wait, on the test's clock: far above what a test needs, so that a
/// loaded machine only makes a test slower, never red. Under paused time it costs nothing.
pub const WAIT: Duration = Duration::from_secs(60);

/// How often [`wait_until`] checks its condition.
const POLL: Duration = Duration::from_millis(10);

/// Checks `cond` until it holds, every 10 ms of tokio time (under paused time, each pause lets
/// the clock jump to the next timer once every task waits); panics naming `what` when it has
/// not held after [`WAIT`].
pub async fn wait_until(what: &str, cond: impl AsyncFnMut() -> bool) {
    wait_until_for(what, WAIT, cond).await
}

/// [`wait_until`] with its own bound, for a test that asserts something happens within `limit`.
pub async fn wait_until_for(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A simulator config with the test keys and millisecond timings.
pub fn sim_config() -> SimConfig {
    SimConfig::for_tests(API_KEY, SECRET_KEY)
}

/// [`sim_config`] changed by `f`.
pub fn sim_config_with(f: impl FnOnce(&mut SimConfig)) -> SimConfig {
    let mut c = sim_config();
    f(&mut c);
    c
}

/// Starts a simulator on `127.0.0.1:0`.
pub async fn start_sim(config: SimConfig) -> SimHandle {
    sim::spawn(config).await.expect("simulator starts")
}

/// Provider settings with test timings: jobs polled every 20 ms, every Refresh fetching, a
/// 300 ms watch for immediate refusals, and snapshots served for 60 s when CloudStack is away.
pub fn fast_settings(cluster_id: &str, min: u32, max: u32) -> Settings {
    let mut s = Settings::with_groups(vec![NodeGroupSpec {
        min,
        max,
        cluster: ClusterRef::Id(cluster_id.to_string()),
    }]);
    s.job_poll_interval = Duration::from_millis(20);
    s.refresh_min_interval = Duration::ZERO;
    s.scale_watch = Duration::from_millis(300);
    s.removal_window = Duration::from_millis(50);
    s.staleness_bound = Duration::from_secs(60);
    s
}

/// The CloudStack client config of a provider talking to `sim`.
pub fn client_config(sim: &SimHandle) -> ClientConfig {
    ClientConfig::new(&sim.api_url, &sim.api_key, &sim.secret_key)
        .with_timeout(Duration::from_secs(3))
}

/// A provider's gRPC server running in the test's runtime, and the means to stop it.
pub struct ProviderServer {
    pub provider: Provider,
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The state file's writer (with `Settings::state_file`), as `serve` runs it.
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl ProviderServer {
    /// Starts a provider for `sim` with `settings`, serving on `bind` (`127.0.0.1:0`: a new
    /// port) with `options`.
    pub async fn start(
        sim: &SimHandle,
        settings: Settings,
        bind: SocketAddr,
        options: ServeOptions,
    ) -> ProviderServer {
        ProviderServer::start_with_client(client_config(sim), settings, bind, options).await
    }

    /// Like [`ProviderServer::start`], with the CloudStack client built from `client` (a
    /// `project_id`, as a cloud-config's `project-id` sets it, for example).
    pub async fn start_with_client(
        client: ClientConfig,
        settings: Settings,
        bind: SocketAddr,
        options: ServeOptions,
    ) -> ProviderServer {
        let provider = Provider::new(Client::new(client).expect("CloudStack client"), settings);
        // As `serve` starts: the promises of an earlier provider taken over first.
        provider.load_state().await.expect("the recorded state");
        provider.resume_followers();
        let writer = provider.spawn_state_writer();
        // Rebinding the port of a provider that just stopped can briefly fail on a busy machine.
        let mut bound = None;
        wait_until(&format!("binding {bind}"), async || {
            match tokio::net::TcpListener::bind(bind).await {
                Ok(l) => bound = Some(l),
                Err(e) => eprintln!("binding {bind} failed ({e}); retrying"),
            }
            bound.is_some()
        })
        .await;
        let listener = bound.expect("bound");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let p = provider.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = serve(listener, p, options, async {
                let _ = stopped.await;
            })
            .await
            {
                eprintln!("provider server failed: {e:#}");
            }
        });
        ProviderServer {
            provider,
            addr,
            stop: Some(stop),
            task: Some(task),
            writer,
        }
    }

    /// A gRPC client of this server.
    pub async fn client(&self) -> CloudProviderClient<Channel> {
        grpc_client(self.addr).await
    }

    /// As `serve` ends on SIGTERM (`app.rs`): stops serving (RPCs in flight finish), follows
    /// the jobs still running for at most `grace`, writes the last record, then lets go.
    pub async fn terminate(&mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(WAIT, task).await;
        }
        self.provider.wait_idle(grace).await;
        self.provider.finish_state().await;
        if let Some(writer) = self.writer.take() {
            writer.abort();
        }
        self.provider.cleanup().await;
    }

    /// Stops serving and waits (bounded) for the server to end; background work of the
    /// provider stops too, as if its process died (jobs go on in CloudStack).
    pub async fn stop(&mut self) {
        // As a process that dies: what the state file holds is what it last wrote.
        if let Some(writer) = self.writer.take() {
            writer.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(WAIT, task).await;
        }
        self.provider.cleanup().await;
    }
}

impl Drop for ProviderServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A provider for `sim` on a new loopback port with default serve options, and a client.
pub async fn start_provider(
    sim: &SimHandle,
    settings: Settings,
) -> (ProviderServer, CloudProviderClient<Channel>) {
    start_provider_with(sim, settings, ServeOptions::default()).await
}

/// Like [`start_provider`] with serve options (extras, TLS).
pub async fn start_provider_with(
    sim: &SimHandle,
    settings: Settings,
    options: ServeOptions,
) -> (ProviderServer, CloudProviderClient<Channel>) {
    let server = ProviderServer::start(sim, settings, loopback(), options).await;
    let client = server.client().await;
    (server, client)
}

/// `127.0.0.1:0`.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A gRPC client connected to `addr`.
pub async fn grpc_client(addr: SocketAddr) -> CloudProviderClient<Channel> {
    CloudProviderClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the provider")
}

/// A gRPC request carrying `deadline` as its `grpc-timeout`.
pub fn with_deadline<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(deadline);
    r
}

/// A Kubernetes node as the autoscaler sends it.
pub fn node(provider_id: &str, name: &str) -> pb::ExternalGrpcNode {
    pb::ExternalGrpcNode {
        provider_id: provider_id.to_string(),
        name: name.to_string(),
        labels: HashMap::new(),
        annotations: HashMap::new(),
    }
}

/// The fake node the autoscaler makes of an instance without a node (name = providerID =
/// instance id, the reason in an annotation).
pub fn fake_node(instance_id: &str, reason: &str) -> pb::ExternalGrpcNode {
    let mut n = node(instance_id, instance_id);
    n.annotations.insert(
        "k8s.io/cluster-autoscaler/fake-node-reason".into(),
        reason.into(),
    );
    n
}

/// The state an instance is reported in.
pub fn state_of(i: &pb::Instance) -> pb::instance_status::InstanceState {
    i.status
        .as_ref()
        .and_then(|s| pb::instance_status::InstanceState::try_from(s.instance_state).ok())
        .unwrap_or(pb::instance_status::InstanceState::Unspecified)
}

/// The error an instance is reported with, if any (an `errorInfo` with an error code).
pub fn error_info(i: &pb::Instance) -> Option<&pb::InstanceErrorInfo> {
    i.status
        .as_ref()
        .and_then(|s| s.error_info.as_ref())
        .filter(|e| !e.error_code.is_empty())
}

/// The `errorInfo` of an instance exactly as sent (an empty one included).
pub fn error_of(i: &pb::Instance) -> Option<&pb::InstanceErrorInfo> {
    i.status.as_ref().and_then(|s| s.error_info.as_ref())
}

/// Whether `provider`'s snapshot of `cluster` shows VM `vm` down (its gauges count it; the
/// autoscaler is told Running either way).
pub fn provider_sees_down(provider: &Provider, cluster: &str, vm: &str) -> bool {
    provider
        .all_groups()
        .snapshot(cluster)
        .and_then(|snap| snap.vm(vm).map(|v| v.state.is_down()))
        .unwrap_or(false)
}

/// Lets `span` pass on the test's clock, every timer due in it firing in order (under paused
/// time this takes no wall time). Only for assertions that something does NOT happen within a
/// span, or that a duration is respected; a test waiting for something uses [`wait_until`].
pub async fn elapse(span: Duration) {
    tokio::time::sleep(span).await;
}

/// Writes `text` to a file named `name` in a temporary folder of this process for `tag`
/// (a test's subject), and returns its path.
pub fn temp_file(tag: &str, name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cks-{tag}-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write temp file");
    path
}

/// The value of an unlabelled counter or gauge in this process's metrics now (0 while it has
/// none).
pub fn metric(name: &str) -> f64 {
    let page = cks_autoscaler_provider::metrics::install().render();
    let prefix = format!("{name} ");
    page.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `/metrics` as the provider's metrics endpoint serves it from `source` (one request to a
/// server on a new loopback port, stopped after).
pub async fn scrape_metrics(
    source: std::sync::Arc<dyn cks_autoscaler_provider::metrics::MetricsSource>,
) -> String {
    cks_autoscaler_provider::metrics::install();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cks_autoscaler_provider::metrics::serve_http(
        listener,
        source,
        async {
            let _ = stopped.await;
        },
    ));
    let page = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("body");
    let _ = stop.send(());
    server.await.expect("joins").expect("serves");
    page
}
