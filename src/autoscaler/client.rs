//! The autoscaler's externalgrpc client, as the mock replays it: one deadline for every call
//! (sent as `grpc-timeout` and enforced locally), NodeGroups and NodeGroupForNode answers
//! cached until the next Refresh (a NodeGroupForNode answer with id "" never cached),
//! NodeGroupTemplateNodeInfo answers cached per node group until the next Refresh (the real
//! client caches them on node-group objects it rebuilds at each Refresh; errors are never
//! cached), nothing else cached. Every call lands in the timeline.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use super::nodes::KubeNode;
use super::timeline::{Call, Event, EventKind, Reply, Request, RpcError, Timeline};
use crate::pb;
use crate::pb::cloud_provider_client::CloudProviderClient;

/// Appends to the timeline with the current loop number and the time since start.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) start: Instant,
    pub(crate) loop_no: u64,
    pub(crate) timeline: Timeline,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            loop_no: 0,
            timeline: Timeline::default(),
        }
    }

    pub(crate) fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.start)
    }

    pub(crate) fn record(&mut self, kind: EventKind) {
        let at = self.since_start(Instant::now());
        self.timeline.events.push(Event {
            loop_no: self.loop_no,
            at,
            kind,
        });
    }

    pub(crate) fn record_call(&mut self, request: Request, started: Instant, timed: Timed<Reply>) {
        let call = Call {
            loop_no: self.loop_no,
            at: self.since_start(started),
            request,
            outcome: timed.outcome,
            latency: timed.latency,
        };
        self.timeline.events.push(Event {
            loop_no: self.loop_no,
            at: call.at,
            kind: EventKind::Call(call),
        });
    }
}

/// An outcome and how long it took.
#[derive(Debug)]
pub(crate) struct Timed<T> {
    pub(crate) outcome: Result<T, RpcError>,
    pub(crate) latency: Duration,
}

/// Runs one RPC under the deadline. A call still unanswered at the deadline, or answered with
/// an error after it, is `DeadlineExceeded`, as the Go client reports it.
pub(crate) async fn invoke<T>(
    deadline: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Timed<T> {
    let started = Instant::now();
    let result = tokio::time::timeout(deadline, call).await;
    let latency = started.elapsed();
    let outcome = match result {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) if latency >= deadline => Err(RpcError {
            code: tonic::Code::DeadlineExceeded,
            message: format!("deadline of {deadline:?} exceeded ({})", status.message()),
        }),
        Ok(Err(status)) => Err(RpcError {
            code: status.code(),
            message: status.message().to_owned(),
        }),
        Err(_) => Err(RpcError {
            code: tonic::Code::DeadlineExceeded,
            message: format!("no answer within the {deadline:?} deadline"),
        }),
    };
    Timed { outcome, latency }
}

/// A request carrying the deadline as `grpc-timeout`, so the server knows it too.
pub(crate) fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// The externalgrpc client with its caches.
#[derive(Debug, Clone)]
pub(crate) struct ExternalGrpcClient {
    pub(crate) grpc: CloudProviderClient<Channel>,
    pub(crate) deadline: Duration,
    /// NodeGroups answer, until the next Refresh. A failed NodeGroups is not cached.
    node_groups: Option<Vec<pb::NodeGroup>>,
    /// NodeGroupForNode answers by name+providerID, until the next Refresh. Only non-empty ids.
    group_for_node: HashMap<String, pb::NodeGroup>,
    /// NodeGroupTemplateNodeInfo `nodeBytes` by group id, until the next Refresh. Only successes.
    templates: HashMap<String, Vec<u8>>,
}

impl ExternalGrpcClient {
    pub(crate) fn new(grpc: CloudProviderClient<Channel>, deadline: Duration) -> Self {
        Self {
            grpc,
            deadline,
            node_groups: None,
            group_for_node: HashMap::new(),
            templates: HashMap::new(),
        }
    }

    /// Refresh; the caches are dropped first, whatever the outcome.
    pub(crate) async fn refresh(&mut self, rec: &mut Recorder) -> Result<(), RpcError> {
        self.node_groups = None;
        self.group_for_node.clear();
        self.templates.clear();
        let started = Instant::now();
        let request = with_deadline(pb::RefreshRequest {}, self.deadline);
        let timed = invoke(self.deadline, self.grpc.refresh(request)).await;
        let result = timed.outcome.as_ref().map(|_| ()).map_err(Clone::clone);
        rec.record_call(
            Request::Refresh,
            started,
            map_timed(timed, |_| Reply::Empty),
        );
        result
    }

    /// NodeGroups, from the cache when there is one; a failure gives an empty list.
    pub(crate) async fn node_groups(&mut self, rec: &mut Recorder) -> Vec<pb::NodeGroup> {
        if let Some(groups) = &self.node_groups {
            return groups.clone();
        }
        let started = Instant::now();
        let request = with_deadline(pb::NodeGroupsRequest {}, self.deadline);
        let timed = invoke(self.deadline, self.grpc.node_groups(request)).await;
        let groups = match &timed.outcome {
            Ok(response) => {
                self.node_groups = Some(response.node_groups.clone());
                response.node_groups.clone()
            }
            Err(_) => Vec::new(),
        };
        rec.record_call(
            Request::NodeGroups,
            started,
            map_timed(timed, |r| Reply::NodeGroups(r.node_groups)),
        );
        groups
    }

    /// NodeGroupForNode through the cache. `Ok(None)`: the node is not managed.
    pub(crate) async fn node_group_for_node(
        &mut self,
        node: &KubeNode,
        rec: &mut Recorder,
    ) -> Result<Option<pb::NodeGroup>, RpcError> {
        let key = node.cache_key();
        if let Some(group) = self.group_for_node.get(&key) {
            return Ok(Some(group.clone()));
        }
        let grpc_node = node.to_grpc();
        let started = Instant::now();
        let request = with_deadline(
            pb::NodeGroupForNodeRequest {
                node: Some(grpc_node.clone()),
            },
            self.deadline,
        );
        let timed = invoke(self.deadline, self.grpc.node_group_for_node(request)).await;
        let timed = map_timed(timed, |r| {
            Reply::NodeGroup(r.node_group.unwrap_or_default())
        });
        let result = match &timed.outcome {
            Ok(Reply::NodeGroup(group)) if !group.id.is_empty() => {
                self.group_for_node.insert(key, group.clone());
                Ok(Some(group.clone()))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(e.clone()),
        };
        rec.record_call(
            Request::NodeGroupForNode { node: grpc_node },
            started,
            timed,
        );
        result
    }

    /// NodeGroupTemplateNodeInfo's `nodeBytes`, from the cache when this Refresh already got them.
    pub(crate) async fn template_node_info(
        &mut self,
        id: &str,
        rec: &mut Recorder,
    ) -> Result<Vec<u8>, RpcError> {
        if let Some(bytes) = self.templates.get(id) {
            return Ok(bytes.clone());
        }
        let started = Instant::now();
        let request = with_deadline(
            pb::NodeGroupTemplateNodeInfoRequest { id: id.to_owned() },
            self.deadline,
        );
        let timed = invoke(
            self.deadline,
            self.grpc.node_group_template_node_info(request),
        )
        .await;
        let result = timed
            .outcome
            .as_ref()
            .map(|r| r.node_bytes.clone())
            .map_err(Clone::clone);
        if let Ok(bytes) = &result {
            self.templates.insert(id.to_owned(), bytes.clone());
        }
        rec.record_call(
            Request::NodeGroupTemplateNodeInfo { id: id.to_owned() },
            started,
            map_timed(timed, |r| Reply::TemplateNode(r.node_bytes)),
        );
        result
    }

    pub(crate) async fn target_size(
        &mut self,
        id: &str,
        rec: &mut Recorder,
    ) -> Result<i32, RpcError> {
        let started = Instant::now();
        let request = with_deadline(
            pb::NodeGroupTargetSizeRequest { id: id.to_owned() },
            self.deadline,
        );
        let timed = invoke(self.deadline, self.grpc.node_group_target_size(request)).await;
        let result = timed
            .outcome
            .as_ref()
            .map(|r| r.target_size)
            .map_err(Clone::clone);
        rec.record_call(
            Request::NodeGroupTargetSize { id: id.to_owned() },
            started,
            map_timed(timed, |r| Reply::TargetSize(r.target_size)),
        );
        result
    }

    pub(crate) async fn nodes(
        &mut self,
        id: &str,
        rec: &mut Recorder,
    ) -> Result<Vec<pb::Instance>, RpcError> {
        let started = Instant::now();
        let request = with_deadline(
            pb::NodeGroupNodesRequest { id: id.to_owned() },
            self.deadline,
        );
        let timed = invoke(self.deadline, self.grpc.node_group_nodes(request)).await;
        let result = timed
            .outcome
            .as_ref()
            .map(|r| r.instances.clone())
            .map_err(Clone::clone);
        rec.record_call(
            Request::NodeGroupNodes { id: id.to_owned() },
            started,
            map_timed(timed, |r| Reply::Instances(r.instances)),
        );
        result
    }

    pub(crate) async fn increase_size(
        &mut self,
        id: &str,
        delta: i32,
        rec: &mut Recorder,
    ) -> Result<(), RpcError> {
        let started = Instant::now();
        let request = with_deadline(
            pb::NodeGroupIncreaseSizeRequest {
                delta,
                id: id.to_owned(),
            },
            self.deadline,
        );
        let timed = invoke(self.deadline, self.grpc.node_group_increase_size(request)).await;
        let result = timed.outcome.as_ref().map(|_| ()).map_err(Clone::clone);
        rec.record_call(
            Request::NodeGroupIncreaseSize {
                id: id.to_owned(),
                delta,
            },
            started,
            map_timed(timed, |_| Reply::Empty),
        );
        result
    }

    pub(crate) async fn decrease_target_size(
        &mut self,
        id: &str,
        delta: i32,
        rec: &mut Recorder,
    ) -> Result<(), RpcError> {
        let started = Instant::now();
        let request = with_deadline(
            pb::NodeGroupDecreaseTargetSizeRequest {
                delta,
                id: id.to_owned(),
            },
            self.deadline,
        );
        let timed = invoke(
            self.deadline,
            self.grpc.node_group_decrease_target_size(request),
        )
        .await;
        let result = timed.outcome.as_ref().map(|_| ()).map_err(Clone::clone);
        rec.record_call(
            Request::NodeGroupDecreaseTargetSize {
                id: id.to_owned(),
                delta,
            },
            started,
            map_timed(timed, |_| Reply::Empty),
        );
        result
    }

    pub(crate) async fn delete_nodes(
        &mut self,
        id: &str,
        nodes: &[KubeNode],
        rec: &mut Recorder,
    ) -> Result<(), RpcError> {
        let (request, started, timed) =
            delete_nodes_call(self.grpc.clone(), self.deadline, id, nodes).await;
        let result = timed.outcome.as_ref().map(|_| ()).map_err(Clone::clone);
        rec.record_call(request, started, timed);
        result
    }
}

/// One NodeGroupDeleteNodes call on its own client handle, so several can run at once.
pub(crate) async fn delete_nodes_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
    id: &str,
    nodes: &[KubeNode],
) -> (Request, Instant, Timed<Reply>) {
    let grpc_nodes: Vec<pb::ExternalGrpcNode> = nodes.iter().map(KubeNode::to_grpc).collect();
    let started = Instant::now();
    let request = with_deadline(
        pb::NodeGroupDeleteNodesRequest {
            nodes: grpc_nodes.clone(),
            id: id.to_owned(),
        },
        deadline,
    );
    let timed = invoke(deadline, grpc.node_group_delete_nodes(request)).await;
    (
        Request::NodeGroupDeleteNodes {
            id: id.to_owned(),
            nodes: grpc_nodes,
        },
        started,
        map_timed(timed, |_| Reply::Empty),
    )
}

fn map_timed<T>(timed: Timed<T>, f: impl FnOnce(T) -> Reply) -> Timed<Reply> {
    Timed {
        outcome: timed.outcome.map(f),
        latency: timed.latency,
    }
}
