//! The mock autoscaler against a scripted in-process CloudProvider server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request as GrpcRequest, Response, Status};

use super::*;
use crate::pb;
use cks_proto::cloud_provider_server::{CloudProvider, CloudProviderServer};
use cks_proto::instance_status::InstanceState;

const G: &str = "workers";

/// What the fake provider was asked, as it saw it.
#[derive(Debug, Clone)]
struct ServerCall {
    rpc: &'static str,
    grpc_timeout: Option<String>,
    started: Instant,
    ended: Instant,
}

/// Scripted provider state: one or more groups, instances per group, and failures to inject.
#[derive(Debug, Default)]
struct FakeState {
    groups: Vec<pb::NodeGroup>,
    targets: HashMap<String, i32>,
    instances: HashMap<String, Vec<pb::Instance>>,
    /// providerIDs of nodes that belong to a group though no instance lists them.
    extra_members: HashMap<String, String>,
    refresh_error: Option<Status>,
    /// NodeGroupTemplateNodeInfo answer; `None`: Unimplemented (a provider without templates).
    /// Sent in both template fields, as the provider does, unless `template_field_2_only`.
    template: Option<Result<Vec<u8>, Status>>,
    /// The template answer leaves field 1 (`nodeInfo`, read up to 1.34.1) unset.
    template_field_2_only: bool,
    target_size_error: Option<Status>,
    increase_error: Option<Status>,
    nodes_error: Option<Status>,
    delete_error: Option<Status>,
    decrease_error: Option<Status>,
    /// NodeGroupGetOptions answer; `None`: Unimplemented (a provider without options).
    options: Option<Result<Option<pb::NodeGroupAutoscalingOptions>, Status>>,
    /// Every NodeGroupGetOptions request as it arrived.
    options_requests: Vec<pb::NodeGroupAutoscalingOptionsRequest>,
    /// GPULabel answer; `None`: Unimplemented.
    gpu_label: Option<String>,
    delays: HashMap<&'static str, Duration>,
    /// DeleteNodes removes the instances (else it only lowers the target).
    delete_removes_instances: bool,
    /// DeleteNodes answers OK and changes nothing: the VM stays, and so does the target (a
    /// provider that put a removed VM back).
    delete_changes_nothing: bool,
    /// NodeGroupForNode answers this for every node (a default group: id "", as a provider
    /// that just restarted and knows no VM yet).
    for_node_answer: Option<pb::NodeGroup>,
    log: Vec<ServerCall>,
    deleted: Vec<(String, Vec<pb::ExternalGrpcNode>)>,
    deleted_refused: Vec<(String, Vec<pb::ExternalGrpcNode>)>,
}

#[derive(Clone, Default)]
struct FakeProvider(Arc<Mutex<FakeState>>);

impl FakeProvider {
    fn with_group(min: i32, max: i32, target: i32, instances: Vec<pb::Instance>) -> Self {
        let fake = Self::default();
        fake.edit(|s| {
            s.groups.push(pb::NodeGroup {
                id: G.into(),
                min_size: min,
                max_size: max,
                debug: String::new(),
            });
            s.targets.insert(G.into(), target);
            s.instances.insert(G.into(), instances);
            s.delete_removes_instances = true;
            s.gpu_label = Some(String::new());
        });
        fake
    }

    fn edit<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }

    fn target(&self) -> i32 {
        self.edit(|s| s.targets[G])
    }

    fn log_count(&self, rpc: &str) -> usize {
        self.edit(|s| s.log.iter().filter(|c| c.rpc == rpc).count())
    }

    async fn enter<T>(&self, rpc: &'static str, req: &GrpcRequest<T>) -> Instant {
        let started = Instant::now();
        let delay = self.edit(|s| s.delays.get(rpc).copied());
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let grpc_timeout = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.edit(|s| {
            s.log.push(ServerCall {
                rpc,
                grpc_timeout,
                started,
                ended: Instant::now(),
            })
        });
        started
    }

    fn group_of(s: &FakeState, provider_id: &str) -> Option<pb::NodeGroup> {
        let id = s
            .instances
            .iter()
            .find(|(_, list)| list.iter().any(|i| i.id == provider_id))
            .map(|(g, _)| g.clone())
            .or_else(|| s.extra_members.get(provider_id).cloned())?;
        s.groups.iter().find(|g| g.id == id).cloned()
    }
}

#[tonic::async_trait]
impl CloudProvider for FakeProvider {
    async fn refresh(
        &self,
        req: GrpcRequest<pb::RefreshRequest>,
    ) -> Result<Response<pb::RefreshResponse>, Status> {
        self.enter("Refresh", &req).await;
        match self.edit(|s| s.refresh_error.clone()) {
            Some(e) => Err(e),
            None => Ok(Response::new(pb::RefreshResponse {})),
        }
    }

    async fn node_groups(
        &self,
        req: GrpcRequest<pb::NodeGroupsRequest>,
    ) -> Result<Response<pb::NodeGroupsResponse>, Status> {
        self.enter("NodeGroups", &req).await;
        Ok(Response::new(pb::NodeGroupsResponse {
            node_groups: self.edit(|s| s.groups.clone()),
        }))
    }

    async fn node_group_for_node(
        &self,
        req: GrpcRequest<pb::NodeGroupForNodeRequest>,
    ) -> Result<Response<pb::NodeGroupForNodeResponse>, Status> {
        self.enter("NodeGroupForNode", &req).await;
        let provider_id = req.into_inner().node.unwrap_or_default().provider_id;
        let group = self
            .edit(|s| {
                s.for_node_answer
                    .clone()
                    .or_else(|| Self::group_of(s, &provider_id))
            })
            .unwrap_or_default();
        Ok(Response::new(pb::NodeGroupForNodeResponse {
            node_group: Some(group),
        }))
    }

    async fn node_group_target_size(
        &self,
        req: GrpcRequest<pb::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupTargetSizeResponse>, Status> {
        self.enter("NodeGroupTargetSize", &req).await;
        self.edit(|s| {
            if let Some(e) = &s.target_size_error {
                return Err(e.clone());
            }
            let id = &req.get_ref().id;
            let target_size = *s
                .targets
                .get(id)
                .ok_or_else(|| Status::not_found(id.clone()))?;
            Ok(Response::new(pb::NodeGroupTargetSizeResponse {
                target_size,
            }))
        })
    }

    async fn node_group_nodes(
        &self,
        req: GrpcRequest<pb::NodeGroupNodesRequest>,
    ) -> Result<Response<pb::NodeGroupNodesResponse>, Status> {
        self.enter("NodeGroupNodes", &req).await;
        self.edit(|s| {
            if let Some(e) = &s.nodes_error {
                return Err(e.clone());
            }
            let instances = s
                .instances
                .get(&req.get_ref().id)
                .cloned()
                .unwrap_or_default();
            Ok(Response::new(pb::NodeGroupNodesResponse { instances }))
        })
    }

    async fn node_group_increase_size(
        &self,
        req: GrpcRequest<pb::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<pb::NodeGroupIncreaseSizeResponse>, Status> {
        self.enter("NodeGroupIncreaseSize", &req).await;
        self.edit(|s| {
            if let Some(e) = &s.increase_error {
                return Err(e.clone());
            }
            let r = req.get_ref();
            *s.targets.entry(r.id.clone()).or_default() += r.delta;
            Ok(Response::new(pb::NodeGroupIncreaseSizeResponse {}))
        })
    }

    async fn node_group_delete_nodes(
        &self,
        req: GrpcRequest<pb::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<pb::NodeGroupDeleteNodesResponse>, Status> {
        self.enter("NodeGroupDeleteNodes", &req).await;
        let r = req.into_inner();
        self.edit(|s| {
            if let Some(e) = &s.delete_error {
                s.deleted_refused.push((r.id.clone(), r.nodes.clone()));
                return Err(e.clone());
            }
            if s.delete_changes_nothing {
                s.deleted.push((r.id, r.nodes));
                return Ok(Response::new(pb::NodeGroupDeleteNodesResponse {}));
            }
            *s.targets.entry(r.id.clone()).or_default() -= i32::try_from(r.nodes.len()).unwrap();
            if s.delete_removes_instances {
                let ids: Vec<&str> = r.nodes.iter().map(|n| n.provider_id.as_str()).collect();
                if let Some(list) = s.instances.get_mut(&r.id) {
                    list.retain(|i| !ids.contains(&i.id.as_str()));
                }
            }
            s.deleted.push((r.id, r.nodes));
            Ok(Response::new(pb::NodeGroupDeleteNodesResponse {}))
        })
    }

    async fn node_group_template_node_info(
        &self,
        req: GrpcRequest<pb::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<pb::NodeGroupTemplateNodeInfoResponse>, Status> {
        self.enter("NodeGroupTemplateNodeInfo", &req).await;
        match self.edit(|s| (s.template.clone(), s.template_field_2_only)) {
            (None, _) => Err(Status::unimplemented("no templates here")),
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(node_bytes)), field_2_only) => {
                Ok(Response::new(pb::NodeGroupTemplateNodeInfoResponse {
                    node_info: if field_2_only {
                        Vec::new()
                    } else {
                        node_bytes.clone()
                    },
                    node_bytes,
                }))
            }
        }
    }

    async fn node_group_decrease_target_size(
        &self,
        req: GrpcRequest<pb::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupDecreaseTargetSizeResponse>, Status> {
        self.enter("NodeGroupDecreaseTargetSize", &req).await;
        let r = req.into_inner();
        // Like a careful provider: never below the instances that exist.
        self.edit(|s| {
            if let Some(e) = &s.decrease_error {
                return Err(e.clone());
            }
            let existing = i32::try_from(s.instances.get(&r.id).map_or(0, Vec::len)).unwrap();
            let target = s.targets.entry(r.id).or_default();
            *target = (*target + r.delta).max(existing);
            Ok(Response::new(pb::NodeGroupDecreaseTargetSizeResponse {}))
        })
    }

    async fn node_group_get_options(
        &self,
        req: GrpcRequest<pb::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<pb::NodeGroupAutoscalingOptionsResponse>, Status> {
        self.enter("NodeGroupGetOptions", &req).await;
        let request = req.into_inner();
        match self.edit(|s| {
            s.options_requests.push(request);
            s.options.clone()
        }) {
            None => Err(Status::unimplemented("no options here")),
            Some(Err(e)) => Err(e),
            Some(Ok(node_group_autoscaling_options)) => {
                Ok(Response::new(pb::NodeGroupAutoscalingOptionsResponse {
                    node_group_autoscaling_options,
                }))
            }
        }
    }

    async fn gpu_label(
        &self,
        req: GrpcRequest<pb::GpuLabelRequest>,
    ) -> Result<Response<pb::GpuLabelResponse>, Status> {
        self.enter("GPULabel", &req).await;
        match self.edit(|s| s.gpu_label.clone()) {
            None => Err(Status::unimplemented("no GPU label here")),
            Some(label) => Ok(Response::new(pb::GpuLabelResponse { label })),
        }
    }

    async fn get_available_gpu_types(
        &self,
        req: GrpcRequest<pb::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<pb::GetAvailableGpuTypesResponse>, Status> {
        self.enter("GetAvailableGPUTypes", &req).await;
        Ok(Response::new(pb::GetAvailableGpuTypesResponse::default()))
    }

    async fn cleanup(
        &self,
        req: GrpcRequest<pb::CleanupRequest>,
    ) -> Result<Response<pb::CleanupResponse>, Status> {
        self.enter("Cleanup", &req).await;
        Ok(Response::new(pb::CleanupResponse {}))
    }
}

async fn serve(fake: FakeProvider) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(CloudProviderServer::new(fake))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await
    });
    addr
}

fn instance(id: &str, state: InstanceState) -> pb::Instance {
    pb::Instance {
        id: id.into(),
        status: Some(pb::InstanceStatus {
            instance_state: state as i32,
            error_info: None,
        }),
    }
}

fn running(id: &str) -> pb::Instance {
    instance(id, InstanceState::InstanceRunning)
}

fn failed(id: &str, class: i32, code: &str) -> pb::Instance {
    let mut i = instance(id, InstanceState::InstanceCreating);
    if let Some(s) = i.status.as_mut() {
        s.error_info = Some(pb::InstanceErrorInfo {
            error_code: code.into(),
            error_message: format!("{code} happened"),
            instance_error_class: class,
        });
    }
    i
}

fn pid(n: &str) -> String {
    format!("external-cloudstack://{n}")
}

fn worker(n: &str) -> KubeNode {
    KubeNode::new(n, pid(n)).with_label("role", "worker")
}

/// Test timings: long enough that a loaded machine does not trip them, short enough to wait.
fn config() -> AutoscalerConfig {
    AutoscalerConfig {
        call_deadline: Duration::from_secs(5),
        loop_interval: Duration::from_millis(20),
        scale_down_unneeded_time: Duration::from_millis(300),
        scale_down_unready_time: Duration::from_millis(400),
        max_node_provision_time: Duration::from_millis(400),
        max_node_startup_time: Duration::from_millis(200),
        initial_backoff: Duration::from_millis(300),
        max_backoff: Duration::from_secs(2),
        scale_down_delay_after_add: Duration::ZERO,
        scale_down_delay_after_failure: Duration::ZERO,
        node_delete_delay_after_taint: Duration::from_millis(10),
        max_cloud_provider_node_deletion_time: Duration::from_secs(600),
        // Long enough that only the tests about it see the periodic refresh.
        instances_cache_refresh_interval: Duration::from_secs(600),
        ..AutoscalerConfig::default()
    }
}

async fn start(
    fake: &FakeProvider,
    nodes: &StaticNodeSource,
    config: AutoscalerConfig,
) -> MockAutoscaler {
    let addr = serve(fake.clone()).await;
    MockAutoscaler::connect(&addr.to_string(), Arc::new(nodes.clone()), config)
        .await
        .unwrap()
}

fn loop_start(ca: &MockAutoscaler, loop_no: u64) -> Duration {
    ca.timeline().loops()[usize::try_from(loop_no).unwrap() - 1].at
}

const WAIT: Duration = Duration::from_secs(20);

fn for_node_calls(ca: &MockAutoscaler, provider_id: &str, loop_no: u64) -> usize {
    ca.calls(Rpc::NodeGroupForNode)
        .into_iter()
        .filter(|c| c.loop_no == loop_no)
        .filter(|c| matches!(&c.request, Request::NodeGroupForNode { node } if node.provider_id == provider_id))
        .count()
}

#[tokio::test(start_paused = true)]
async fn node_group_for_node_is_cached_per_loop_except_for_unmanaged_nodes() {
    let fake = FakeProvider::with_group(1, 5, 2, vec![running(&pid("w1")), running(&pid("w2"))]);
    let nodes = StaticNodeSource::new(vec![
        worker("w1"),
        worker("w2"),
        KubeNode::new("cp", pid("cp")),
    ]);
    let mut ca = start(&fake, &nodes, config()).await;

    ca.run_loops(3).await;

    for loop_no in 1..=3 {
        let first = loop_no == 1;
        // The first loop also asks for every node's group before its Refresh
        // (`cleanUpIfRequired`).
        assert_eq!(
            for_node_calls(&ca, &pid("w1"), loop_no),
            if first { 2 } else { 1 },
            "{}",
            ca.timeline()
        );
        assert_eq!(
            for_node_calls(&ca, &pid("w2"), loop_no),
            if first { 2 } else { 1 }
        );
        // The control-plane node's answer (id "") is never cached: asked at each use (template
        // pass, twice in readiness, scale-down pre-filter).
        assert_eq!(
            for_node_calls(&ca, &pid("cp"), loop_no),
            if first { 5 } else { 4 }
        );
        let calls = ca.timeline().calls_in_loop(loop_no);
        let count = |rpc| calls.iter().filter(|c| c.rpc() == rpc).count();
        assert_eq!(count(Rpc::Refresh), 1);
        // The first loop fills the NodeGroupNodes cache (NodeGroups, then each group) before
        // anything else; the cache answers the next loops.
        assert_eq!(count(Rpc::NodeGroups), if first { 2 } else { 1 });
        assert_eq!(count(Rpc::NodeGroupNodes), usize::from(first));
        // Cluster state, then the scale-down pre-filter.
        assert_eq!(count(Rpc::NodeGroupTargetSize), 2);
        // Readiness twice per autoscaled node (1.36), eligibility twice per candidate.
        assert_eq!(count(Rpc::NodeGroupGetOptions), 8);
        // Answered once, cached for good.
        assert_eq!(count(Rpc::GpuLabel), usize::from(first));
    }
    // The server saw exactly what the timeline says.
    assert_eq!(
        fake.log_count("NodeGroupForNode"),
        ca.calls(Rpc::NodeGroupForNode).len()
    );
    assert_eq!(ca.calls(Rpc::NodeGroupForNode).len(), 9 + 2 * (1 + 1 + 4));
    assert_eq!(
        fake.log_count("NodeGroupGetOptions"),
        ca.calls(Rpc::NodeGroupGetOptions).len()
    );
    // Every call carried the deadline.
    assert!(fake.edit(|s| {
        s.log
            .iter()
            .all(|c| c.grpc_timeout.as_deref() == Some("5000000u"))
    }));
    let last = ca.last_loop().unwrap();
    assert_eq!((last.ready, last.not_ready, last.unmanaged), (2, 0, 1));
    // Unimplemented options are no error: the flags apply.
    assert!(ca.errors().is_empty(), "{:?}", ca.errors());
    assert!(
        ca.calls(Rpc::NodeGroupGetOptions)
            .iter()
            .all(|c| c.is_not_implemented())
    );
}

#[tokio::test(start_paused = true)]
async fn a_refresh_error_aborts_the_loop() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(2);
    fake.edit(|s| s.refresh_error = Some(Status::unavailable("CloudStack unreachable")));

    let summary = ca.run_once().await;

    let reason = summary.aborted.as_deref().expect("loop should abort");
    assert!(
        reason.contains("Refresh") && reason.contains("CloudStack unreachable"),
        "{reason}"
    );
    // Only what comes before the Refresh: the NodeGroupNodes cache's first fill, the taint
    // clean-up's group lookups and the GPU label.
    let rpcs: Vec<Rpc> = summary.calls.iter().map(Call::rpc).collect();
    assert_eq!(
        rpcs,
        [
            Rpc::NodeGroups,
            Rpc::NodeGroupNodes,
            Rpc::NodeGroupForNode,
            Rpc::GpuLabel,
            Rpc::Refresh
        ],
        "{summary}"
    );
    assert_eq!(ca.errors().len(), 1);
    assert_eq!(
        ca.errors()[0].error().unwrap().code,
        tonic::Code::Unavailable
    );
    assert_eq!(fake.log_count("NodeGroupIncreaseSize"), 0);
    assert!(summary.to_string().contains("ABORTED"), "{summary}");

    fake.edit(|s| s.refresh_error = None);
    let summary = ca.run_once().await;
    assert!(summary.aborted.is_none());
    assert_eq!(summary.count(Rpc::NodeGroupIncreaseSize), 1, "{summary}");
    assert_eq!(ca.timeline().aborted_loops().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_target_size_error_aborts_the_loop_before_any_decision() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(1);
    fake.edit(|s| s.target_size_error = Some(Status::internal("boom")));
    let summary = ca.run_once().await;
    assert!(
        summary
            .aborted
            .as_deref()
            .unwrap()
            .contains("NodeGroupTargetSize(workers)")
    );
    // Nothing of the cluster-state update after the target sizes, no decision.
    assert_eq!(summary.count(Rpc::NodeGroupGetOptions), 0, "{summary}");
    assert_eq!(summary.count(Rpc::NodeGroupIncreaseSize), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_past_the_deadline_is_a_failure_and_backs_the_group_off() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    fake.edit(|s| {
        s.delays
            .insert("NodeGroupIncreaseSize", Duration::from_secs(3));
    });
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.call_deadline = Duration::from_millis(500);
    cfg.initial_backoff = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(1);

    let started = Instant::now();
    let summary = ca.run_once().await;

    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the loop waited for the slow call"
    );
    let inc = ca.calls(Rpc::NodeGroupIncreaseSize);
    assert_eq!(inc.len(), 1);
    let err = inc[0].error().expect("late answer must fail");
    assert_eq!(err.code, tonic::Code::DeadlineExceeded);
    assert!(inc[0].latency >= Duration::from_millis(500));
    assert!(
        summary
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::BackOff { error_code, .. } if error_code == "cloudProviderError")),
        "{summary}"
    );
    // No scale-up was registered, and the group is skipped while backed off.
    assert!(ca.backoff_remaining(G).is_some());
    let next = ca.run_once().await;
    assert_eq!(next.count(Rpc::NodeGroupIncreaseSize), 0, "{next}");
    assert!(
        next.decisions
            .iter()
            .any(|d| matches!(d, Decision::NoScaleUp { reason } if reason.contains("backed off")))
    );
    // The server was told the deadline.
    assert!(fake.edit(|s| {
        s.log
            .iter()
            .all(|c| c.grpc_timeout.as_deref() == Some("500000u"))
    }));
}

#[tokio::test(start_paused = true)]
async fn scale_up_covers_pending_demand_once_and_target_is_read_back() {
    let fake = FakeProvider::with_group(1, 4, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.max_node_provision_time = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(5);

    let first = ca.run_once().await;
    // Capped by max 4: +3.
    let inc = ca.calls(Rpc::NodeGroupIncreaseSize);
    assert_eq!(inc.len(), 1, "{first}");
    assert!(matches!(
        inc[0].request,
        Request::NodeGroupIncreaseSize { delta: 3, .. }
    ));
    assert_eq!(
        ca.last_target(G),
        Some(4),
        "target read back after the scale-up"
    );
    assert_eq!(fake.target(), 4);

    // The new nodes are upcoming: no second scale-up while they come (and the group is at max).
    fake.edit(|s| {
        s.instances
            .get_mut(G)
            .unwrap()
            .extend(["w2", "w3", "w4"].map(|n| instance(&pid(n), InstanceState::InstanceCreating)))
    });
    ca.run_loops(3).await;
    assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);

    // Nodes register: the scale-up completes and demand (6) is capped by max, so nothing more.
    for n in ["w2", "w3", "w4"] {
        nodes.add(worker(n));
    }
    let summary = ca.run_once().await;
    assert!(
        summary
            .decisions
            .contains(&Decision::ScaleUpCompleted { group: G.into() }),
        "{summary}"
    );
    assert_eq!(summary.ready, 4);
    assert!(
        summary
            .to_string()
            .contains("target 4, nodes 4 Ready/0 NotReady"),
        "{summary}"
    );
    assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_increase_backs_off_with_doubling_durations() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    fake.edit(|s| s.increase_error = Some(Status::failed_precondition("cluster is in Alert")));
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(1);

    ca.run_until(WAIT, |ca| ca.calls(Rpc::NodeGroupIncreaseSize).len() >= 3)
        .await
        .unwrap();

    let backoffs: Vec<Duration> = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter_map(|(_, d)| match d {
            Decision::BackOff {
                duration,
                error_class: 99,
                ..
            } => Some(*duration),
            _ => None,
        })
        .collect();
    assert_eq!(
        backoffs,
        vec![
            Duration::from_millis(300),
            Duration::from_millis(600),
            Duration::from_millis(1200)
        ]
    );
    // Attempts are spaced by the backoff (counted from the failing loop's start), not by the
    // loop interval.
    let inc = ca.calls(Rpc::NodeGroupIncreaseSize);
    assert!(inc[1].at - loop_start(&ca, inc[0].loop_no) >= Duration::from_millis(300));
    assert!(inc[2].at - loop_start(&ca, inc[1].loop_no) >= Duration::from_millis(600));
    assert!(
        inc.iter()
            .all(|c| c.error().unwrap().code == tonic::Code::FailedPrecondition)
    );
    assert_eq!(fake.target(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_that_never_completes_is_reverted_and_backed_off() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.initial_backoff = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(2);
    let first = ca.run_once().await;
    assert_eq!(first.count(Rpc::NodeGroupIncreaseSize), 1);
    assert_eq!(fake.target(), 3);

    ca.run_until(WAIT, |ca| {
        !ca.calls(Rpc::NodeGroupDecreaseTargetSize).is_empty()
    })
    .await
    .unwrap();
    let dec = ca.calls(Rpc::NodeGroupDecreaseTargetSize)[0].clone();
    assert!(matches!(
        dec.request,
        Request::NodeGroupDecreaseTargetSize { delta: -2, .. }
    ));
    assert!(dec.at - first.at >= Duration::from_millis(400));
    let summary = ca.last_loop().unwrap();
    assert!(summary.decisions.contains(&Decision::ScaleUpTimedOut {
        group: G.into(),
        increase: 2
    }));
    assert!(summary.decisions.iter().any(
        |d| matches!(d, Decision::BackOff { error_code, error_class: 99, .. } if error_code == "timeout")
    ));
    assert_eq!(fake.target(), 1);
    // Backed off: the still pending demand waits.
    let next = ca.run_once().await;
    assert_eq!(next.count(Rpc::NodeGroupIncreaseSize), 0, "{next}");
}

/// Failed creations outside any scale-up: deleted every loop they are listed, but they back
/// nothing off (`handleInstanceCreationErrorsForNodeGroup` counts them only while the group
/// `IsNodeGroupScalingUp`); see `upstream::create_errors_back_off_only_while_the_group_is_scaling_up`.
#[tokio::test(start_paused = true)]
async fn create_error_instances_are_deleted_with_fake_nodes_every_loop() {
    let fake = FakeProvider::with_group(
        1,
        5,
        3,
        vec![
            running(&pid("w1")),
            failed("vm-a", 1, "OutOfResources"),
            failed("vm-b", 1, "OutOfResources"),
        ],
    );
    fake.edit(|s| s.delete_removes_instances = false);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(2);

    let summary = ca.run_once().await;

    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert_eq!(deletes.len(), 1, "{summary}");
    let Request::NodeGroupDeleteNodes { id, nodes: sent } = &deletes[0].request else {
        unreachable!()
    };
    assert_eq!(id, G);
    let names: Vec<(&str, &str)> = sent
        .iter()
        .map(|n| (n.name.as_str(), n.provider_id.as_str()))
        .collect();
    assert_eq!(names, vec![("vm-a", "vm-a"), ("vm-b", "vm-b")]);
    for n in sent {
        assert_eq!(fake_reason(n), Some("create-error"));
        assert!(n.labels.is_empty());
    }
    // No scale-up in progress: no backoff, so the pending demand scales the group.
    assert!(
        !summary
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::BackOff { .. })),
        "{summary}"
    );
    assert!(
        summary
            .decisions
            .contains(&Decision::FailedCreationsNotCounted {
                group: G.into(),
                error_code: "OutOfResources".into(),
                instances: 2
            })
    );
    assert_eq!(summary.count(Rpc::NodeGroupIncreaseSize), 1, "{summary}");
    assert_eq!(summary.groups[0].instances.errored, 2);

    // Still listed next loop: deleted again (as the autoscaler does), but no new backoff.
    let next = ca.run_once().await;
    assert_eq!(next.count(Rpc::NodeGroupDeleteNodes), 1);
    assert!(
        !next
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::BackOff { .. }))
    );
}

#[tokio::test(start_paused = true)]
async fn unregistered_instances_are_deleted_after_the_provision_time_only() {
    let fake = FakeProvider::with_group(
        1,
        5,
        3,
        vec![
            running(&pid("w1")),
            running(&pid("w2")),
            instance("vm-lost", InstanceState::InstanceRunning),
        ],
    );
    let nodes = StaticNodeSource::new(vec![worker("w1"), worker("w2")]);
    let mut ca = start(&fake, &nodes, config()).await;

    let first = ca.run_once().await;
    assert_eq!(first.groups[0].unregistered, 1);
    assert_eq!(first.count(Rpc::NodeGroupDeleteNodes), 0);

    ca.run_until(WAIT, |ca| !ca.calls(Rpc::NodeGroupDeleteNodes).is_empty())
        .await
        .unwrap();

    let del = ca.calls(Rpc::NodeGroupDeleteNodes)[0].clone();
    assert!(
        del.at - first.at >= Duration::from_millis(400),
        "deleted too early: {}",
        ca.timeline()
    );
    let Request::NodeGroupDeleteNodes { id, nodes: sent } = &del.request else {
        unreachable!()
    };
    assert_eq!(id, G);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].name.as_str(), sent[0].provider_id.as_str()),
        ("vm-lost", "vm-lost")
    );
    assert_eq!(fake_reason(&sent[0]), Some("unregistered"));
    // The fake node was resolved through NodeGroupForNode first.
    let for_fake = ca
        .calls(Rpc::NodeGroupForNode)
        .into_iter()
        .filter(
            |c| matches!(&c.request, Request::NodeGroupForNode { node } if node.name == "vm-lost"),
        )
        .count();
    assert!(for_fake >= 1);
    // Registered nodes' instances were never touched.
    assert!(fake.edit(|s| {
        s.deleted
            .iter()
            .all(|(_, n)| n.iter().all(|n| n.provider_id == "vm-lost"))
    }));
}

#[tokio::test(start_paused = true)]
async fn registered_instances_are_never_deleted_as_unregistered() {
    let fake = FakeProvider::with_group(1, 5, 2, vec![running(&pid("w1")), running(&pid("w2"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1"), worker("w2")]);
    let mut ca = start(&fake, &nodes, config()).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1200) {
        ca.run_once().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ca.calls(Rpc::NodeGroupDeleteNodes).is_empty(),
        "{}",
        ca.timeline()
    );
    assert!(ca.calls(Rpc::NodeGroupDecreaseTargetSize).is_empty());
    assert!(ca.last_loop().unwrap().groups[0].unregistered == 0);
}

#[tokio::test(start_paused = true)]
async fn unregistered_deletion_stops_at_min_size() {
    // min 2, target 3: only one of the two lost instances may go.
    let fake = FakeProvider::with_group(
        2,
        5,
        3,
        vec![running(&pid("w1")), running("vm-x"), running("vm-y")],
    );
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.run_until(WAIT, |ca| !ca.calls(Rpc::NodeGroupDeleteNodes).is_empty())
        .await
        .unwrap();
    let Request::NodeGroupDeleteNodes { nodes: sent, .. } =
        &ca.calls(Rpc::NodeGroupDeleteNodes)[0].request
    else {
        unreachable!()
    };
    assert_eq!(sent.len(), 1);
    let summary = ca.last_loop().unwrap();
    assert!(summary.decisions.iter().any(
        |d| matches!(d, Decision::KeepUnregistered { reason, .. } if reason.contains("min size 2"))
    ));
}

#[tokio::test(start_paused = true)]
async fn scale_down_respects_the_min_size_and_sends_real_nodes() {
    let names = ["w1", "w2", "w3", "w4"];
    let fake = FakeProvider::with_group(2, 5, 4, names.map(|n| running(&pid(n))).to_vec());
    let nodes = StaticNodeSource::new(
        names
            .map(|n| worker(n).with_annotation("note", format!("{n}-a")))
            .to_vec(),
    );
    nodes.add(KubeNode::new("cp", pid("cp")));
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(0);

    let first = ca.run_once().await;
    assert_eq!(
        first.count(Rpc::NodeGroupDeleteNodes),
        0,
        "nothing before the unneeded time"
    );
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    ca.settle_deletions().await;
    // Target 4, min 2: two nodes, one call each.
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert_eq!(deletes.len(), 2, "{}", ca.timeline());
    for del in &deletes {
        assert!(del.at - first.at >= Duration::from_millis(300));
        let Request::NodeGroupDeleteNodes { id, nodes: sent } = &del.request else {
            unreachable!()
        };
        assert_eq!(id, G);
        assert_eq!(sent.len(), 1, "{del}");
        let n = &sent[0];
        assert_eq!(n.provider_id, pid(&n.name));
        assert_eq!(n.labels.get("role").map(String::as_str), Some("worker"));
        assert_eq!(n.annotations.get("note"), Some(&format!("{}-a", n.name)));
    }
    assert!(ca.timeline().decisions().iter().any(
        |(_, d)| matches!(d, Decision::ScaleDownBlocked { reason, .. } if reason.contains("min size 2"))
    ), "{}", ca.timeline());
    // Deleted nodes stay listed for a while: they are not deleted again, and at min nothing else goes.
    ca.run_loops(10).await;
    assert_eq!(
        ca.calls(Rpc::NodeGroupDeleteNodes).len(),
        2,
        "{}",
        ca.timeline()
    );
    assert_eq!(fake.target(), 2);
    assert!(fake.edit(|s| {
        s.deleted
            .iter()
            .all(|(_, n)| n.iter().all(|n| n.name != "cp"))
    }));
}

#[tokio::test(start_paused = true)]
async fn not_ready_nodes_are_removed_after_the_unready_time_down_to_min() {
    let names = ["w1", "w2", "w3"];
    let fake = FakeProvider::with_group(2, 5, 3, names.map(|n| running(&pid(n))).to_vec());
    let nodes = StaticNodeSource::new(names.map(worker).to_vec());
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(3);
    let first = ca.run_once().await;
    assert!(first.decisions.is_empty(), "{first}");

    // Two nodes go down; the workload now fits on the remaining one (no pending pods).
    ca.set_needed_nodes(1);
    nodes.set_ready("w2", false);
    nodes.set_ready("w3", false);
    let went_down = ca.run_once().await;
    assert_eq!(went_down.not_ready, 2);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    ca.settle_deletions().await;
    let del = ca.calls(Rpc::NodeGroupDeleteNodes)[0].clone();
    assert!(
        del.at - went_down.at >= Duration::from_millis(400),
        "{}",
        ca.timeline()
    );
    let Request::NodeGroupDeleteNodes { nodes: sent, .. } = &del.request else {
        unreachable!()
    };
    // Target 3, min 2: one of the two NotReady nodes, and never the Ready one.
    assert_eq!(sent.len(), 1);
    assert!(sent[0].name == "w2" || sent[0].name == "w3");
    ca.run_loops(5).await;
    assert_eq!(
        ca.calls(Rpc::NodeGroupDeleteNodes).len(),
        1,
        "{}",
        ca.timeline()
    );
}

#[tokio::test(start_paused = true)]
async fn missing_instances_past_the_provision_time_decrease_the_target() {
    // At max, so the pending demand cannot scale up before the fix.
    let fake = FakeProvider::with_group(1, 3, 3, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(3);

    let first = ca.run_once().await;
    assert_eq!(first.count(Rpc::NodeGroupDecreaseTargetSize), 0);
    ca.run_until(WAIT, |ca| {
        !ca.calls(Rpc::NodeGroupDecreaseTargetSize).is_empty()
    })
    .await
    .unwrap();
    let dec = ca.calls(Rpc::NodeGroupDecreaseTargetSize)[0].clone();
    assert!(matches!(
        dec.request,
        Request::NodeGroupDecreaseTargetSize { delta: -2, .. }
    ));
    assert!(dec.at - first.at >= Duration::from_millis(400));
    let summary = ca.last_loop().unwrap();
    // A fix ends the loop: no scale-up in the same loop despite the demand.
    assert_eq!(summary.count(Rpc::NodeGroupIncreaseSize), 0, "{summary}");
    assert!(
        summary
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::SkipRestOfLoop { .. }))
    );
    assert_eq!(fake.target(), 1);
    assert!(
        ca.calls(Rpc::NodeGroupIncreaseSize)
            .iter()
            .all(|c| c.loop_no > dec.loop_no)
    );
    // With the size fixed, the next loop scales up for the demand.
    let next = ca.run_once().await;
    assert_eq!(next.count(Rpc::NodeGroupIncreaseSize), 1, "{next}");
}

#[tokio::test(start_paused = true)]
async fn the_timeline_records_observations_decisions_and_a_readable_line_per_loop() {
    let fake = FakeProvider::with_group(
        1,
        5,
        2,
        vec![
            running(&pid("w1")),
            instance(&pid("w2"), InstanceState::InstanceCreating),
        ],
    );
    let nodes = StaticNodeSource::new(vec![worker("w1"), KubeNode::new("cp", "")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(2);
    let summary = ca.run_once().await;

    let obs = ca.timeline().observations();
    let group = obs
        .iter()
        .find_map(|(_, o)| match o {
            Observation::Group(g) => Some(g.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((group.target, group.ready, group.unregistered), (2, 1, 1));
    assert_eq!((group.instances.running, group.instances.creating), (1, 1));
    assert!(obs.iter().any(|(_, o)| **o
        == Observation::Demand {
            needed: 3,
            pending: 2
        }));
    // 2 pending, 0 upcoming (no scale-up request yet for the creating instance).
    assert!(summary.decisions.contains(&Decision::ScaleUp {
        group: G.into(),
        delta: 2,
        pending: 2,
        upcoming: 0
    }));
    let line = summary.to_string();
    println!("{line}\n{}", ca.timeline());
    for part in [
        "loop 1",
        "target 2",
        "nodes 1 Ready/0 NotReady (+1 unmanaged)",
        "instances 1 running 1 creating",
        "Refresh",
        // w1 twice (the first loop's taint clean-up, the template pass), cp (id "") five
        // times, the unregistered w2 instance's fake node once.
        "NodeGroupForNode×8",
        "NodeGroupIncreaseSize(workers, +2) ok",
        "scale up workers by 2",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    assert!(!line.contains('\n'));
    let full = ca.timeline().to_string();
    assert!(
        full.contains("call NodeGroupIncreaseSize(workers, +2) -> ok"),
        "{full}"
    );
    assert!(full.lines().count() >= summary.calls.len());
    assert_eq!(ca.last_target(G), Some(4));
}

#[tokio::test(start_paused = true)]
async fn a_node_listing_failure_aborts_the_loop_before_any_call() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    nodes.set_error(Some("apiserver down".into()));
    let summary = ca.run_once().await;
    assert!(summary.aborted.unwrap().contains("apiserver down"));
    // Only the NodeGroupNodes cache's first fill, which starts before the first loop.
    let rpcs: Vec<Rpc> = summary.calls.iter().map(Call::rpc).collect();
    assert_eq!(rpcs, [Rpc::NodeGroups, Rpc::NodeGroupNodes]);
    let summary = ca.run_once().await;
    assert!(
        summary
            .aborted
            .as_deref()
            .is_some_and(|r| r.contains("apiserver down"))
    );
    assert!(summary.calls.is_empty(), "{summary}");
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_provider_fails_calls_instead_of_hanging() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.call_deadline = Duration::from_secs(2);
    let mut ca = MockAutoscaler::connect(&addr.to_string(), Arc::new(nodes), cfg)
        .await
        .unwrap();
    let summary = ca.run_once().await;
    assert!(summary.aborted.is_some());
    // Every call failed, up to the Refresh that ended the loop.
    assert_eq!(ca.errors().len(), summary.calls.len());
    assert_eq!(summary.calls.last().map(Call::rpc), Some(Rpc::Refresh));
    assert!(
        MockAutoscaler::connect(
            "not a uri ::",
            Arc::new(StaticNodeSource::default()),
            config()
        )
        .await
        .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn several_autoscalers_share_a_provider_without_sharing_state() {
    let fake = FakeProvider::with_group(1, 10, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let addr = serve(fake.clone()).await;
    let mut handles = Vec::new();
    for _ in 0..3 {
        let mut ca = MockAutoscaler::connect(&addr.to_string(), Arc::new(nodes.clone()), config())
            .await
            .unwrap();
        ca.set_demand(1);
        handles.push(tokio::spawn(async move {
            ca.run_loops(2).await;
            ca
        }));
    }
    for h in handles {
        let ca = h.await.unwrap();
        assert_eq!(ca.loops_run(), 2);
        // Each autoscaler made its own decision from its own state.
        assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);
    }
    assert_eq!(fake.log_count("NodeGroupIncreaseSize"), 3);
}

const GI: u64 = 1 << 30;

/// A template node as a provider would encode it: 2 cpu, 4Gi, 110 pods, one label, and
/// `taints` (`key=value:effect`).
fn template_bytes(taints: &[(&str, &str, &str)]) -> Vec<u8> {
    use k8s_pb::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use prost::Message;
    let q = |s: &str| Quantity {
        string: Some(s.to_owned()),
    };
    Node {
        metadata: Some(ObjectMeta {
            labels: std::collections::BTreeMap::from([("pool".to_owned(), "workers".to_owned())]),
            ..Default::default()
        }),
        spec: Some(NodeSpec {
            taints: taints
                .iter()
                .map(|(k, v, e)| Taint {
                    key: Some((*k).to_owned()),
                    value: Some((*v).to_owned()),
                    effect: Some((*e).to_owned()),
                    time_added: None,
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: std::collections::BTreeMap::from([
                ("cpu".to_owned(), q("2")),
                ("memory".to_owned(), q("4Gi")),
                ("pods".to_owned(), q("110")),
            ]),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn template_calls_in(ca: &MockAutoscaler, loop_no: u64) -> usize {
    ca.calls(Rpc::NodeGroupTemplateNodeInfo)
        .iter()
        .filter(|c| c.loop_no == loop_no)
        .count()
}

fn last_template(ca: &MockAutoscaler) -> Result<NodeTemplate, String> {
    ca.timeline()
        .templates(G)
        .last()
        .map(|(_, t)| (*t).clone())
        .expect("a template observation")
}

fn no_scale_up_reason(summary: &LoopSummary) -> String {
    summary
        .decisions
        .iter()
        .find_map(|d| match d {
            Decision::NoScaleUp { reason } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no NoScaleUp decision: {summary}"))
}

#[tokio::test(start_paused = true)]
async fn templates_come_from_a_ready_node_then_the_cache_then_the_provider() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    fake.edit(|s| s.template = Some(Ok(template_bytes(&[]))));
    let alloc = Resources::new(1500, 3 * GI, 50);
    let nodes = StaticNodeSource::new(vec![worker("w1").with_allocatable(alloc)]);
    let mut ca = start(&fake, &nodes, config()).await;

    ca.run_once().await;
    assert_eq!(template_calls_in(&ca, 1), 0, "{}", ca.timeline());
    let t = last_template(&ca).unwrap();
    assert_eq!(t.source, TemplateSource::ReadyNode("w1".into()));
    assert_eq!(t.allocatable, alloc);
    assert_eq!(t.labels.get("role").map(String::as_str), Some("worker"));

    // The node goes NotReady: the template built from it while it was Ready is kept.
    nodes.set_ready("w1", false);
    ca.run_loops(2).await;
    assert!(ca.calls(Rpc::NodeGroupTemplateNodeInfo).is_empty());
    assert_eq!(
        last_template(&ca).unwrap().source,
        TemplateSource::Cached("w1".into())
    );

    // A restarted autoscaler has no cache: it asks the provider, once per loop.
    let mut fresh = start(&fake, &nodes, config()).await;
    fresh.run_loops(3).await;
    for loop_no in 1..=3 {
        assert_eq!(
            template_calls_in(&fresh, loop_no),
            1,
            "{}",
            fresh.timeline()
        );
    }
    let t = last_template(&fresh).unwrap();
    assert_eq!(t.source, TemplateSource::Provider);
    assert_eq!(t.allocatable, Resources::new(2000, 4 * GI, 110));
    assert_eq!(fake.log_count("NodeGroupTemplateNodeInfo"), 3);
    let line = fresh.last_loop().unwrap().to_string();
    assert!(line.contains("NodeGroupTemplateNodeInfo"), "{line}");
}

#[tokio::test(start_paused = true)]
async fn a_node_less_group_scales_from_zero_for_pods_that_fit_its_template() {
    let fake = FakeProvider::with_group(0, 5, 0, Vec::new());
    fake.edit(|s| s.template = Some(Ok(template_bytes(&[]))));
    let nodes = StaticNodeSource::new(Vec::new());
    let mut cfg = config();
    cfg.max_node_provision_time = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    // 1.5 cpu each on 2-cpu nodes: one node per pod.
    ca.set_pending_pods(PodSpec::replicas("web", 3, 1500, GI));

    let first = ca.run_once().await;
    assert_eq!(first.count(Rpc::NodeGroupTemplateNodeInfo), 1, "{first}");
    assert!(
        first.decisions.contains(&Decision::ScaleUp {
            group: G.into(),
            delta: 3,
            pending: 3,
            upcoming: 0
        }),
        "{first}"
    );
    assert_eq!(fake.target(), 3);

    // Upcoming nodes (template copies) hold the pods: no second scale-up.
    fake.edit(|s| {
        s.instances
            .get_mut(G)
            .unwrap()
            .extend(["w1", "w2", "w3"].map(|n| instance(&pid(n), InstanceState::InstanceCreating)))
    });
    for l in ca.run_loops(3).await {
        assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 0, "{l}");
        assert!(no_scale_up_reason(&l).contains("upcoming"), "{l}");
    }
    assert_eq!(ca.pending_pods().len(), 3);

    // The nodes come: each takes one pod (1.5 of its 2 cpu), and the provider is no longer
    // asked for a template.
    for n in ["w1", "w2", "w3"] {
        nodes.add(worker(n).with_allocatable(Resources::new(2000, 4 * GI, 110)));
    }
    let done = ca.run_once().await;
    assert!(ca.pending_pods().is_empty(), "{}", ca.timeline());
    assert_eq!(done.count(Rpc::NodeGroupTemplateNodeInfo), 0, "{done}");
    assert!(
        done.decisions
            .contains(&Decision::ScaleUpCompleted { group: G.into() })
    );
    let scheduled: Vec<(String, Vec<String>)> = ca
        .timeline()
        .observations()
        .into_iter()
        .filter_map(|(_, o)| match o {
            Observation::PodsScheduled { node, pods } => Some((node.clone(), pods.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(scheduled.len(), 3, "{scheduled:?}");
    assert!(scheduled.iter().all(|(_, pods)| pods.len() == 1));
    ca.run_loops(2).await;
    assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn pods_that_do_not_fit_the_template_scale_nothing_and_say_why() {
    let fake = FakeProvider::with_group(0, 5, 0, Vec::new());
    fake.edit(|s| s.template = Some(Ok(template_bytes(&[("dedicated", "batch", "NoSchedule")]))));
    let nodes = StaticNodeSource::new(Vec::new());
    let mut ca = start(&fake, &nodes, config()).await;
    let batch = Toleration::equal("dedicated", "batch", "NoSchedule");
    ca.set_pending_pods(vec![
        PodSpec::new("huge", 500, 8 * GI).tolerating(batch.clone()),
        PodSpec::new("untolerated", 500, GI),
        PodSpec::new("elsewhere", 500, GI)
            .tolerating(batch.clone())
            .with_node_selector("pool", "gpu"),
    ]);

    let summary = ca.run_once().await;
    assert_eq!(summary.count(Rpc::NodeGroupIncreaseSize), 0, "{summary}");
    let misfits: Vec<(String, String)> = summary
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::PodDoesNotFit { pod, group, reason } if group == G => {
                Some((pod.clone(), reason.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(misfits.len(), 3, "{summary}");
    assert!(
        misfits[0].1.contains("memory 8Gi > allocatable 4Gi"),
        "{misfits:?}"
    );
    assert!(
        misfits[1]
            .1
            .contains("taint dedicated=batch:NoSchedule not tolerated"),
        "{misfits:?}"
    );
    assert!(
        misfits[2]
            .1
            .contains("node selector pool=gpu but the label is pool=workers"),
        "{misfits:?}"
    );
    assert!(
        no_scale_up_reason(&summary).contains("no pending pod fits the template of workers"),
        "{summary}"
    );
    assert!(summary.to_string().contains("does not fit"), "{summary}");

    // One pod that fits (it tolerates the taint) scales the group by one; the others still do not.
    ca.set_pending_pods(vec![
        PodSpec::new("huge", 500, 8 * GI).tolerating(batch.clone()),
        PodSpec::new("ok", 500, GI).tolerating(batch),
    ]);
    let summary = ca.run_once().await;
    assert!(
        summary.decisions.contains(&Decision::ScaleUp {
            group: G.into(),
            delta: 1,
            pending: 1,
            upcoming: 0
        }),
        "{summary}"
    );
    assert!(
        summary
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::PodDoesNotFit { pod, .. } if pod == "huge"))
    );
    assert_eq!(fake.target(), 1);
}

#[tokio::test(start_paused = true)]
async fn unimplemented_templates_leave_a_node_less_group_out_and_the_loop_goes_on() {
    let fake = FakeProvider::with_group(0, 5, 0, Vec::new());
    let nodes = StaticNodeSource::new(Vec::new());
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(2);
    ca.set_pending_pods(PodSpec::replicas("web", 2, 100, GI));

    for l in ca.run_loops(3).await {
        assert!(l.aborted.is_none(), "{l}");
        assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 0, "{l}");
        // An Unimplemented answer is not cached: asked again each loop.
        assert_eq!(l.count(Rpc::NodeGroupTemplateNodeInfo), 1, "{l}");
        let reason = no_scale_up_reason(&l);
        assert!(
            reason.contains("workers has no node template") && reason.contains("Unimplemented"),
            "{reason}"
        );
        // The rest of the loop ran: cluster state, the scale-up orchestrator, the scale-down
        // pre-filter each read the target.
        assert_eq!(l.count(Rpc::NodeGroupTargetSize), 3, "{l}");
    }
    assert!(last_template(&ca).unwrap_err().contains("no Ready node"));

    // Node-count demand needs a template too.
    ca.set_demand(1);
    let l = ca.run_once().await;
    assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 0, "{l}");
    assert!(no_scale_up_reason(&l).contains("no node template"), "{l}");
}

#[tokio::test(start_paused = true)]
async fn unimplemented_templates_fall_back_on_a_not_ready_node() {
    let fake = FakeProvider::with_group(0, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![
        worker("w1")
            .not_ready()
            .with_allocatable(Resources::new(2000, 4 * GI, 110)),
    ]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_pending_pods(PodSpec::replicas("web", 2, 1000, GI));

    let summary = ca.run_once().await;
    assert_eq!(
        summary.count(Rpc::NodeGroupTemplateNodeInfo),
        1,
        "{summary}"
    );
    assert_eq!(
        last_template(&ca).unwrap().source,
        TemplateSource::UnreadyNode("w1".into())
    );
    assert!(
        summary.decisions.contains(&Decision::ScaleUp {
            group: G.into(),
            delta: 1,
            pending: 1,
            upcoming: 0
        }),
        "{summary}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_error_other_than_unimplemented_aborts_the_loop() {
    let fake = FakeProvider::with_group(0, 5, 0, Vec::new());
    fake.edit(|s| s.template = Some(Err(Status::unavailable("offering not read yet"))));
    let nodes = StaticNodeSource::new(Vec::new());
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_pending_pods(PodSpec::replicas("web", 1, 100, GI));

    let summary = ca.run_once().await;
    let reason = summary.aborted.as_deref().expect("aborted");
    assert!(
        reason.contains("NodeGroupTemplateNodeInfo(workers) failed")
            && reason.contains("offering not read yet"),
        "{reason}"
    );
    assert_eq!(summary.count(Rpc::NodeGroupTargetSize), 0, "{summary}");

    // Bytes that are no Node abort it too; a good answer lets the loop scale.
    fake.edit(|s| s.template = Some(Ok(vec![0xff, 0xff, 0xff])));
    let summary = ca.run_once().await;
    assert!(
        summary
            .aborted
            .as_deref()
            .is_some_and(|r| r.contains("not a Kubernetes-protobuf v1.Node")),
        "{summary}"
    );
    fake.edit(|s| s.template = Some(Ok(template_bytes(&[]))));
    let summary = ca.run_once().await;
    assert!(summary.aborted.is_none(), "{summary}");
    assert_eq!(summary.count(Rpc::NodeGroupIncreaseSize), 1, "{summary}");
}

mod lifecycle;
mod upstream;
