//! Shared harness: a simulator, a provider and a gRPC client on loopback.
#![allow(dead_code)]

use cks_autoscaler_provider::cloudstack::{Client, ClientConfig};
use cks_autoscaler_provider::config::{ClusterRef, NodeGroupSpec};
use cks_autoscaler_provider::pb;
use cks_autoscaler_provider::pb::cloud_provider_client::CloudProviderClient;
use cks_autoscaler_provider::provider::{Provider, Settings};
use cks_autoscaler_provider::server::{ServeOptions, serve};
use cks_autoscaler_provider::sim::{self, SimConfig, SimHandle};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub const API_KEY: &str = "test-api-key";
pub const SECRET_KEY: &str = "test-secret-key";

pub struct Env {
    pub sim: SimHandle,
    pub provider: Provider,
    pub client: CloudProviderClient<Channel>,
    pub addr: SocketAddr,
    pub cluster_id: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Settings with shrunk timings for tests.
pub fn fast_settings(cluster_id: &str, min: u32, max: u32) -> Settings {
    let mut s = Settings::with_groups(vec![NodeGroupSpec {
        min,
        max,
        cluster: ClusterRef::Id(cluster_id.to_string()),
    }]);
    s.job_poll_interval = Duration::from_millis(20);
    s.refresh_min_interval = Duration::ZERO;
    s.scale_watch = Duration::from_millis(300);
    s.staleness_bound = Duration::from_secs(60);
    s
}

pub fn client_config(sim: &SimHandle) -> ClientConfig {
    ClientConfig {
        api_url: sim.api_url.clone(),
        api_key: sim.api_key.clone(),
        secret_key: sim.secret_key.clone(),
        ssl_no_verify: false,
        ca_bundle_pem: None,
        project_id: None,
        request_timeout: Duration::from_secs(3),
    }
}

/// Starts a provider (and its gRPC server) for `cluster` of a running simulator.
pub async fn start_provider(
    sim: &SimHandle,
    settings: Settings,
) -> (
    Provider,
    CloudProviderClient<Channel>,
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
) {
    start_provider_with(sim, settings, ServeOptions::default()).await
}

/// Like [`start_provider`] with serve options (extras, TLS).
pub async fn start_provider_with(
    sim: &SimHandle,
    settings: Settings,
    options: ServeOptions,
) -> (
    Provider,
    CloudProviderClient<Channel>,
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
) {
    let provider = Provider::new(Client::new(client_config(sim)).expect("client"), settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let p = provider.clone();
    tokio::spawn(async move {
        let _ = serve(listener, p, options, async {
            let _ = rx.await;
        })
        .await;
    });
    let client = CloudProviderClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    (provider, client, addr, tx)
}

/// A simulator with `config` and a provider for its cluster named `name`.
pub async fn start_with(config: SimConfig, name: &str, tweak: impl FnOnce(&mut Settings)) -> Env {
    let sim = sim::spawn(config).await.expect("simulator");
    let cluster_id = sim.cluster_id(name).expect("cluster in scenario");
    let mut settings = fast_settings(&cluster_id, 1, 10);
    tweak(&mut settings);
    let (provider, client, addr, stop) = start_provider(&sim, settings).await;
    let mut env = Env {
        sim,
        provider,
        client,
        addr,
        cluster_id,
        stop: Some(stop),
    };
    env.refresh().await.expect("first refresh");
    env
}

/// The demo cluster (1 control, 3 workers, Running, min 1 max 10).
pub async fn start() -> Env {
    start_with(SimConfig::for_tests(API_KEY, SECRET_KEY), "demo", |_| {}).await
}

pub fn node(provider_id: &str, name: &str) -> pb::ExternalGrpcNode {
    pb::ExternalGrpcNode {
        provider_id: provider_id.to_string(),
        name: name.to_string(),
        labels: HashMap::new(),
        annotations: HashMap::new(),
    }
}

pub fn fake_node(instance_id: &str, reason: &str) -> pb::ExternalGrpcNode {
    let mut n = node(instance_id, instance_id);
    n.annotations.insert(
        "k8s.io/cluster-autoscaler/fake-node-reason".into(),
        reason.into(),
    );
    n
}

impl Env {
    pub async fn refresh(&mut self) -> Result<(), tonic::Status> {
        self.client.refresh(pb::RefreshRequest {}).await.map(|_| ())
    }

    pub async fn target(&mut self) -> i32 {
        self.client
            .node_group_target_size(pb::NodeGroupTargetSizeRequest {
                id: self.cluster_id.clone(),
            })
            .await
            .expect("target size")
            .into_inner()
            .target_size
    }

    pub async fn instances(&mut self) -> Vec<pb::Instance> {
        self.client
            .node_group_nodes(pb::NodeGroupNodesRequest {
                id: self.cluster_id.clone(),
            })
            .await
            .expect("nodes")
            .into_inner()
            .instances
    }

    pub async fn increase(&mut self, delta: i32) -> Result<(), tonic::Status> {
        let mut req = tonic::Request::new(pb::NodeGroupIncreaseSizeRequest {
            delta,
            id: self.cluster_id.clone(),
        });
        req.set_timeout(Duration::from_secs(5));
        self.client.node_group_increase_size(req).await.map(|_| ())
    }

    pub async fn delete(&mut self, nodes: Vec<pb::ExternalGrpcNode>) -> Result<(), tonic::Status> {
        let mut req = tonic::Request::new(pb::NodeGroupDeleteNodesRequest {
            nodes,
            id: self.cluster_id.clone(),
        });
        req.set_timeout(Duration::from_secs(5));
        self.client.node_group_delete_nodes(req).await.map(|_| ())
    }

    pub async fn group_for(&mut self, n: pb::ExternalGrpcNode) -> pb::NodeGroup {
        self.client
            .node_group_for_node(pb::NodeGroupForNodeRequest { node: Some(n) })
            .await
            .expect("node group for node")
            .into_inner()
            .node_group
            .unwrap_or_default()
    }

    /// Scale requests CloudStack received.
    pub fn scale_requests(&self) -> Vec<std::collections::BTreeMap<String, String>> {
        self.sim
            .requests()
            .into_iter()
            .filter(|r| r.command == "scaleKubernetesCluster")
            .map(|r| r.params)
            .collect()
    }

    /// (id, name, state) of the cluster's VMs whose names contain `-node-`.
    pub fn workers(&self) -> Vec<(String, String, String)> {
        self.sim
            .vms(&self.cluster_id)
            .into_iter()
            .filter(|(_, n, _)| n.contains("-node-"))
            .map(|(id, n, s)| (id, n, format!("{s:?}")))
            .collect()
    }

    pub fn control(&self) -> (String, String) {
        self.sim
            .vms(&self.cluster_id)
            .into_iter()
            .find(|(_, n, _)| n.contains("-control-"))
            .map(|(id, n, _)| (id, n))
            .expect("a control VM")
    }

    pub fn cluster_state(&self) -> String {
        self.sim.cluster_json(&self.cluster_id)["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.sim.shutdown().await;
    }
}

/// Polls `f` until it is true or `timeout` passes.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn state_of(i: &pb::Instance) -> pb::instance_status::InstanceState {
    i.status
        .as_ref()
        .and_then(|s| pb::instance_status::InstanceState::try_from(s.instance_state).ok())
        .unwrap_or(pb::instance_status::InstanceState::Unspecified)
}

pub fn error_of(i: &pb::Instance) -> Option<&pb::InstanceErrorInfo> {
    i.status.as_ref().and_then(|s| s.error_info.as_ref())
}
