//! The end-to-end harness: a simulated CloudStack, the provider serving gRPC on loopback, a
//! gRPC client and mock autoscalers driving it, plus the assertions the scenarios share.
//!
//! Everything runs in the test's own runtime on 127.0.0.1 with shrunk timings. Waits are on
//! conditions ([`wait_until`]); no test relies on a fixed sleep being long enough.

use super::{ProviderServer, WAIT, fast_settings, grpc_client, loopback, sim_config, wait_until};
use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
use cks_autoscaler_provider::provider::{Provider, Settings};
use cks_autoscaler_provider::server::ServeOptions;
use cks_cloudstack::ClientConfig;
use cks_lab::autoscaler::{
    AutoscalerConfig, Call, Decision, MockAutoscaler, Reply, Request, Rpc, SimNodeSource,
};
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{SimConfig, SimHandle, VmState};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// `scaleKubernetesCluster` as the simulator recorded it.
pub const SCALE: &str = "scaleKubernetesCluster";

/// Simulator + provider + gRPC server + a gRPC client, for one CKS cluster.
pub struct Stack {
    pub sim: SimHandle,
    pub cluster_id: String,
    pub provider: Provider,
    /// Where the provider's gRPC server listens.
    pub addr: SocketAddr,
    /// A plain gRPC client of the provider (no mock autoscaler: no decision taken).
    pub client: CloudProviderClient<Channel>,
    server: Option<ProviderServer>,
    /// The optional RPCs (template node, options) every provider of this stack serves.
    extras: Arc<ProviderExtras>,
    /// How every provider of this stack reaches the simulator.
    client_config: ClientConfig,
}

/// The mock autoscaler's settings: the real defaults with every timer divided by `divisor`,
/// a loop every `loop_ms` and `deadline` on every call.
pub fn autoscaler_config(divisor: u32, loop_ms: u64, deadline: Duration) -> AutoscalerConfig {
    let mut c = AutoscalerConfig::time_scaled(divisor);
    c.loop_interval = Duration::from_millis(loop_ms);
    c.call_deadline = deadline;
    c
}

impl Stack {
    /// Starts a simulator from `config` and a provider for its cluster `name` (group min/max
    /// 1..10 unless `tweak` changes them; a cluster with CKS autoscaling on uses its own).
    /// The provider answers Unimplemented to the optional RPCs (NodeGroupTemplateNodeInfo,
    /// NodeGroupGetOptions); see [`Stack::start_with_extras`].
    pub async fn start(config: SimConfig, name: &str, tweak: impl FnOnce(&mut Settings)) -> Stack {
        Stack::start_with_extras(
            config,
            name,
            tweak,
            Arc::new(ProviderExtras::without_template()),
        )
        .await
    }

    /// Like [`Stack::start`], with the provider serving the optional RPCs through `extras`
    /// (for example `cks_autoscaler_provider::optional_rpcs::ProviderExtras`, as the binary does).
    pub async fn start_with_extras(
        config: SimConfig,
        name: &str,
        tweak: impl FnOnce(&mut Settings),
        extras: Arc<ProviderExtras>,
    ) -> Stack {
        Stack::start_with_client(config, name, tweak, extras, |_| {}).await
    }

    /// Like [`Stack::start_with_extras`], with the providers' CloudStack client changed by
    /// `client` (e.g. a `project_id`, as the cloud-config's `project-id` sets it).
    pub async fn start_with_client(
        config: SimConfig,
        name: &str,
        tweak: impl FnOnce(&mut Settings),
        extras: Arc<ProviderExtras>,
        client: impl FnOnce(&mut ClientConfig),
    ) -> Stack {
        let sim = super::start_sim(config).await;
        let cluster_id = sim.cluster_id(name).expect("cluster in the scenario");
        let mut settings = fast_settings(&cluster_id, 1, 10);
        tweak(&mut settings);
        let mut client_config = super::client_config(&sim);
        client(&mut client_config);
        let server = ProviderServer::start_with_client(
            client_config.clone(),
            settings,
            loopback(),
            options(&extras),
        )
        .await;
        let client = server.client().await;
        Stack {
            sim,
            cluster_id,
            provider: server.provider.clone(),
            addr: server.addr,
            client,
            server: Some(server),
            extras,
            client_config,
        }
    }

    /// Like [`Stack::start`], then one Refresh through gRPC: the provider has a snapshot.
    pub async fn refreshed(
        config: SimConfig,
        name: &str,
        tweak: impl FnOnce(&mut Settings),
    ) -> Stack {
        let mut stack = Stack::start(config, name, tweak).await;
        stack.refresh().await.expect("first Refresh");
        stack
    }

    /// The demo cluster (1 control, 3 workers, Running, CKS autoscaling 1..10) with the test
    /// timings and a provider with [`fast_settings`] that has refreshed once.
    pub async fn demo_default() -> Stack {
        Stack::refreshed(sim_config(), "demo", |_| {}).await
    }

    /// The demo cluster (1 control, 3 workers, Running, CKS autoscaling 1..10).
    pub async fn demo(tweak_sim: impl FnOnce(&mut SimConfig)) -> Stack {
        let mut config = sim_config();
        tweak_sim(&mut config);
        Stack::start(config, "demo", |_| {}).await
    }

    /// A mock autoscaler pointed at this provider, seeing the simulator's Kubernetes nodes of
    /// this cluster.
    pub async fn autoscaler(&self, config: AutoscalerConfig) -> MockAutoscaler {
        let nodes = SimNodeSource::new(&self.sim.api_url)
            .expect("simulator URL")
            .for_cluster(self.cluster_id.clone());
        MockAutoscaler::connect(&self.addr.to_string(), Arc::new(nodes), config)
            .await
            .expect("mock autoscaler")
    }

    /// Stops the provider's server and its background work, as if its process died: the
    /// followers stop, jobs go on in CloudStack.
    pub async fn stop_provider(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop().await;
        }
        self.provider.cleanup().await;
    }

    /// The provider dies ([`Stack::stop_provider`]) and a fresh one starts with the same
    /// settings (its store included), on a new port.
    pub async fn restart_provider(&mut self) {
        let settings = self.provider.settings().clone();
        self.stop_provider().await;
        self.start_new_provider(settings, 0).await;
    }

    /// Starts a fresh provider (nothing in memory) with `settings`, on `port` (0: a new one).
    pub async fn start_new_provider(&mut self, settings: Settings, port: u16) {
        assert!(self.server.is_none(), "stop the running provider first");
        let bind = SocketAddr::from(([127, 0, 0, 1], port));
        let server = ProviderServer::start_with_client(
            self.client_config.clone(),
            settings,
            bind,
            options(&self.extras),
        )
        .await;
        self.provider = server.provider.clone();
        self.addr = server.addr;
        self.client = server.client().await;
        self.server = Some(server);
    }

    /// The first Refresh of a freshly started provider, while CloudStack still runs a scale
    /// job of the cluster: the provider must adopt the job and report `target` at once.
    pub async fn assert_adopts_running_job(&self, target: u32) {
        self.provider
            .refresh()
            .await
            .expect("first refresh of the new provider");
        // Checked after the refresh: the job ran during it.
        assert_eq!(
            self.sim.running_jobs(&self.cluster_id),
            1,
            "the job ended before the new provider's first refresh; nothing to adopt"
        );
        assert_eq!(
            self.provider
                .all_groups()
                .target_size(&self.cluster_id)
                .ok(),
            Some(target),
            "the new provider shows the running job's size"
        );
    }

    /// `scaleKubernetesCluster` requests CloudStack executed (requests the simulator answered
    /// with an injected 5xx page never ran), as their parameters.
    pub fn scale_requests(&self) -> Vec<BTreeMap<String, String>> {
        self.sim
            .requests()
            .into_iter()
            .filter(|r| r.command == SCALE && r.fault.as_deref() != Some("error"))
            .map(|r| r.params)
            .collect()
    }

    /// What `listKubernetesClusters` shows of the cluster.
    pub fn cluster(&self) -> serde_json::Value {
        self.sim.cluster_json(&self.cluster_id)
    }

    pub fn cluster_state(&self) -> String {
        self.cluster()["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub fn cluster_size(&self) -> i64 {
        self.cluster()["size"].as_i64().unwrap_or(-1)
    }

    /// (id, name, state) of the cluster's VMs whose name says `role` (`control`, `etcd`,
    /// `node`).
    pub fn vms_named(&self, role: &str) -> Vec<(String, String, VmState)> {
        let marker = format!("-{role}-");
        self.sim
            .vms(&self.cluster_id)
            .into_iter()
            .filter(|(_, n, _)| n.contains(&marker))
            .collect()
    }

    pub fn workers(&self) -> Vec<(String, String, VmState)> {
        self.vms_named("node")
    }

    pub fn controls(&self) -> Vec<(String, String, VmState)> {
        self.vms_named("control")
    }

    /// Waits until the cluster is in `state` (the simulator's status scanner runs every
    /// 20 ms in tests; a scan is also forced on every poll).
    pub async fn wait_state(&self, state: &str) {
        wait_until(&format!("cluster state {state}"), async || {
            self.sim.scan_now();
            self.cluster_state() == state
        })
        .await;
    }

    /// Waits until CloudStack has no scale job running for the cluster and the provider no
    /// operation in flight (its view of the target equals CloudStack's size).
    pub async fn wait_settled(&self) {
        wait_until("CloudStack and the provider to settle", async || {
            self.sim.running_jobs(&self.cluster_id) == 0 && self.cluster_state() != "Scaling"
        })
        .await;
    }

    /// Waits until the provider has caught up with CloudStack: its target equals CloudStack's
    /// size and every instance it lists is Running (no job it still follows, no placeholder).
    pub async fn wait_provider_settled(&self) {
        use cks_domain::status::InstanceState as S;
        wait_until("the provider to catch up with CloudStack", async || {
            let size = self.cluster_size();
            self.provider
                .all_groups()
                .target_size(&self.cluster_id)
                .ok()
                .map(i64::from)
                == Some(size)
                && self
                    .provider
                    .all_groups()
                    .nodes(&self.cluster_id)
                    .is_ok_and(|n| {
                        n.len() as i64 == size && n.iter().all(|i| i.state == S::Running)
                    })
        })
        .await;
    }

    /// The provider's answers, read through a plain gRPC client (not through a mock, so no
    /// decision is taken): (target size, instances).
    pub async fn provider_view(&self) -> (i32, Vec<pb::Instance>) {
        let mut c = grpc_client(self.addr).await;
        c.refresh(pb::RefreshRequest {}).await.expect("Refresh");
        let target = c
            .node_group_target_size(pb::NodeGroupTargetSizeRequest {
                id: self.cluster_id.clone(),
            })
            .await
            .expect("NodeGroupTargetSize")
            .into_inner()
            .target_size;
        let instances = c
            .node_group_nodes(pb::NodeGroupNodesRequest {
                id: self.cluster_id.clone(),
            })
            .await
            .expect("NodeGroupNodes")
            .into_inner()
            .instances;
        (target, instances)
    }

    pub async fn shutdown(mut self) {
        self.stop_provider().await;
        self.sim.shutdown().await;
    }

    // The provider's answers through the plain gRPC client.

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

    /// NodeGroupIncreaseSize under a 5 s deadline.
    pub async fn increase(&mut self, delta: i32) -> Result<(), tonic::Status> {
        let req = super::with_deadline(
            pb::NodeGroupIncreaseSizeRequest {
                delta,
                id: self.cluster_id.clone(),
            },
            Duration::from_secs(5),
        );
        self.client.node_group_increase_size(req).await.map(|_| ())
    }

    /// NodeGroupDeleteNodes under a 5 s deadline.
    pub async fn delete(&mut self, nodes: Vec<pb::ExternalGrpcNode>) -> Result<(), tonic::Status> {
        let req = super::with_deadline(
            pb::NodeGroupDeleteNodesRequest {
                nodes,
                id: self.cluster_id.clone(),
            },
            Duration::from_secs(5),
        );
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

    /// (id, name) of the cluster's first control VM.
    pub fn control(&self) -> (String, String) {
        self.controls()
            .into_iter()
            .next()
            .map(|(id, n, _)| (id, n))
            .expect("a control VM")
    }
}

fn options(extras: &Arc<ProviderExtras>) -> ServeOptions {
    ServeOptions {
        extras: extras.clone(),
        ..ServeOptions::default()
    }
}

/// Runs loops of `ca` until `done` holds after one; on timeout, panics with the timeline.
pub async fn loop_until(
    ca: &mut MockAutoscaler,
    what: &str,
    done: impl FnMut(&MockAutoscaler) -> bool,
) -> u64 {
    match ca.run_until(WAIT, done).await {
        Ok(n) => n,
        Err(e) => panic!("{what}: {e:#}\ntimeline:\n{}", ca.timeline()),
    }
}

/// Runs loops of `ca` for at least `span` and at least `min_loops` loops.
pub async fn loop_for(ca: &mut MockAutoscaler, span: Duration, min_loops: u64) {
    let start = tokio::time::Instant::now();
    let first = ca.loops_run();
    loop {
        ca.run_once().await;
        if start.elapsed() >= span && ca.loops_run() - first >= min_loops {
            return;
        }
        tokio::time::sleep(ca.config().loop_interval).await;
    }
}

/// The instances of the latest successful NodeGroupNodes answer.
pub fn last_instances(ca: &MockAutoscaler) -> Vec<pb::Instance> {
    ca.calls(Rpc::NodeGroupNodes)
        .iter()
        .rev()
        .find_map(|c| match &c.outcome {
            Ok(Reply::Instances(list)) => Some(list.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Every instance of every successful NodeGroupNodes answer, with the loop it was seen in.
pub fn all_instances_seen(ca: &MockAutoscaler) -> Vec<(u64, pb::Instance)> {
    ca.calls(Rpc::NodeGroupNodes)
        .iter()
        .filter_map(|c| match &c.outcome {
            Ok(Reply::Instances(list)) => Some(
                list.iter()
                    .map(|i| (c.loop_no, i.clone()))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Mutating calls that succeeded.
pub fn ok_calls(ca: &MockAutoscaler, rpc: Rpc) -> Vec<Call> {
    ca.calls(rpc)
        .into_iter()
        .filter(|c| c.is_ok())
        .cloned()
        .collect()
}

/// The nodes a NodeGroupDeleteNodes call carried.
pub fn deleted_nodes(call: &Call) -> Vec<pb::ExternalGrpcNode> {
    match &call.request {
        Request::NodeGroupDeleteNodes { nodes, .. } => nodes.clone(),
        _ => Vec::new(),
    }
}

/// Asserts that no scale-up was tried while the group was backed off: after each back-off
/// decision (taken in a loop, for a duration counted from that loop's start), the next
/// NodeGroupIncreaseSize comes in a loop starting after the backoff ends. 10 ms of slack
/// cover the loop's own bookkeeping before its clock reading. Returns the backoffs.
pub fn assert_backoffs_respected(ca: &MockAutoscaler) -> Vec<Duration> {
    let loops = ca.timeline().loops();
    let start = |n: u64| loops[(n - 1) as usize].at;
    let increases = ca.calls(Rpc::NodeGroupIncreaseSize);
    let mut out = Vec::new();
    for (l, d) in ca.timeline().decisions() {
        let Decision::BackOff { duration, .. } = d else {
            continue;
        };
        out.push(*duration);
        let ends = start(l) + *duration;
        if let Some(c) = increases.iter().find(|c| c.loop_no > l) {
            assert!(
                start(c.loop_no) + Duration::from_millis(10) >= ends,
                "scale-up in loop {} while backed off (loop {l}, {duration:?})\n{}",
                c.loop_no,
                ca.timeline()
            );
        }
    }
    out
}

/// Asserts that every RPC of `ca` was answered within `limit`, naming the slowest.
pub fn assert_latencies_below(ca: &MockAutoscaler, limit: Duration) {
    let slowest = ca.timeline().all_calls().max_by_key(|c| c.latency).cloned();
    if let Some(c) = slowest {
        assert!(
            c.latency < limit,
            "{c} took {:?}, over {limit:?}\ntimeline:\n{}",
            c.latency,
            ca.timeline()
        );
    }
}

/// Prints the loop summaries of `ca` when `SCENARIO_TIMELINE` is set (with `--nocapture`),
/// the full timeline when it is `full`.
pub fn show(what: &str, ca: &MockAutoscaler) {
    match std::env::var("SCENARIO_TIMELINE").as_deref() {
        Ok("full") => eprintln!("== {what}\n{}", ca.timeline()),
        Ok(_) => {
            eprintln!("== {what}");
            for l in ca.timeline().loops() {
                eprintln!("{l}");
            }
        }
        Err(_) => {}
    }
}

/// The parameters a scale request carried besides command/response (sorted).
pub fn scale_keys(params: &BTreeMap<String, String>) -> Vec<String> {
    params
        .keys()
        .filter(|k| !matches!(k.as_str(), "command" | "response"))
        .cloned()
        .collect()
}

/// A Running cluster "pool" with `workers` workers, one control node and no CKS autoscaling
/// (the `--nodes` bounds apply).
pub fn pool(workers: u64) -> SimConfig {
    let mut cfg = sim_config();
    cfg.scenario = cks_sim::Scenario::with_cluster(cks_sim::ClusterSpec::new("pool", 1, workers));
    cfg
}

/// The node of a worker VM as the autoscaler sends it (CloudStack's CCM providerID).
pub fn worker_node(w: &(String, String, VmState)) -> pb::ExternalGrpcNode {
    super::node(&format!("external-cloudstack://{}", w.0), &w.1)
}
