//! The autoscaler's externalgrpc client, as the mock replays it: one deadline for every call
//! (sent as `grpc-timeout` and enforced locally), NodeGroups and NodeGroupForNode answers
//! cached until the next Refresh (a NodeGroupForNode answer with id "" never cached),
//! NodeGroupTemplateNodeInfo answers cached per node group until the next Refresh (the real
//! client caches them on node-group objects it rebuilds at each Refresh; errors are never
//! cached), nothing else cached. Every call lands in the timeline.
//!
//! # Wire generations
//!
//! Which fields the client reads and sends in NodeGroupTemplateNodeInfo and NodeGroupGetOptions
//! depends on the release it imitates ([`WireGeneration`], chosen with
//! [`ExternalGrpcClient::with_generation`]; the engine takes it from
//! `AutoscalerConfig::wire_generation`). Each behaviour follows upstream
//! `cluster-autoscaler/cloudprovider/externalgrpc/externalgrpc_node_group.go` at the release's
//! tag: `NodeGroup.TemplateNodeInfo` and `NodeGroup.GetOptions`. The messages are this crate's
//! own (`crates/proto/proto/externalgrpc.proto`), which hold every field any release uses; a generation only
//! ever fills or reads the fields its release has.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use super::nodes::KubeNode;
use super::timeline::{Call, Event, EventKind, Reply, Request, RpcError, Timeline};
use super::wire::{NodeGroupOptions, OptionsAnswer, WireGeneration};
use crate::pb;
use cks_proto::cloud_provider_client::CloudProviderClient;

/// Why `NodeGroup.GetOptions` gave the core no options.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionsFailure {
    /// The call failed; the core reports the error (and skips what needed the options).
    Rpc(RpcError),
    /// The real client would dereference a missing meta.v1.Duration and crash the autoscaler.
    Crash(String),
}

impl fmt::Display for OptionsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsFailure::Rpc(e) => e.fmt(f),
            OptionsFailure::Crash(why) => write!(f, "crash: {why}"),
        }
    }
}

/// Appends to the timeline with the current loop number and the time since start.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) start: Instant,
    pub(crate) loop_no: u64,
    pub(crate) timeline: Timeline,
    /// The wire generation spoken, recorded with every call.
    pub(crate) wire: WireGeneration,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            loop_no: 0,
            timeline: Timeline::default(),
            wire: WireGeneration::default(),
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
            wire: self.wire,
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
    /// Shared with the scale-down deletions, which ask through the same client object
    /// (`deleteNodesFromCloudProvider`), as the real client's one cache behind its mutex.
    pub(crate) group_for_node: GroupForNodeCache,
    /// NodeGroupTemplateNodeInfo node bytes by group id, until the next Refresh. Only successes.
    templates: HashMap<String, Vec<u8>>,
    /// The release whose message shapes the client speaks.
    generation: WireGeneration,
}

impl ExternalGrpcClient {
    /// A client speaking the message shapes of `generation`.
    pub(crate) fn with_generation(
        grpc: CloudProviderClient<Channel>,
        deadline: Duration,
        generation: WireGeneration,
    ) -> Self {
        Self {
            grpc,
            deadline,
            node_groups: None,
            group_for_node: GroupForNodeCache::default(),
            templates: HashMap::new(),
            generation,
        }
    }

    /// The wire generation spoken.
    pub(crate) fn generation(&self) -> WireGeneration {
        self.generation
    }

    /// Speaks `generation` from the next call on (cached templates are dropped: they were read
    /// from the other generation's field).
    pub(crate) fn set_generation(&mut self, generation: WireGeneration) {
        self.generation = generation;
        self.templates.clear();
    }

    /// Refresh; the caches are dropped first, whatever the outcome.
    pub(crate) async fn refresh(&mut self, rec: &mut Recorder) -> Result<(), RpcError> {
        self.node_groups = None;
        lock(&self.group_for_node).clear();
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
        let (result, call) =
            node_group_for_node_cached(&self.grpc, self.deadline, &self.group_for_node, node).await;
        if let Some((request, started, timed)) = call {
            rec.record_call(request, started, timed);
        }
        result
    }

    /// NodeGroupTemplateNodeInfo's node bytes, from the field this client's generation reads
    /// ([`WireGeneration::template_node`]; empty when that field is), from the cache when this
    /// Refresh already got them. For a 1.28 client an Unimplemented answer comes back as an
    /// `Unknown` error, which the engine treats as the real core does.
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
        let generation = self.generation;
        let timed = Timed {
            outcome: timed.outcome.map(|r| generation.template_node(&r).to_vec()),
            latency: timed.latency,
        };
        let result = match timed.outcome.clone() {
            // 1.28's `NodeGroup.TemplateNodeInfo` returns the gRPC error as it came, and the
            // core skips a group only on `cloudprovider.ErrNotImplemented`: for it an
            // Unimplemented answer is an error like any other (the timeline keeps the real code).
            Err(e)
                if e.code == tonic::Code::Unimplemented
                    && !generation.understands_unimplemented() =>
            {
                Err(RpcError {
                    code: tonic::Code::Unknown,
                    message: format!(
                        "{} (cluster-autoscaler 1.28 takes Unimplemented for an error)",
                        e.message
                    ),
                })
            }
            other => other,
        };
        if let Ok(bytes) = &result {
            self.templates.insert(id.to_owned(), bytes.clone());
        }
        rec.record_call(
            Request::NodeGroupTemplateNodeInfo { id: id.to_owned() },
            started,
            map_timed(timed, Reply::TemplateNode),
        );
        result
    }

    /// NodeGroupGetOptions as this client's release makes it ([`get_options_call`]),
    /// recorded.
    pub(crate) async fn get_options(
        &mut self,
        id: &str,
        flags: &NodeGroupOptions,
        rec: &mut Recorder,
    ) -> Result<OptionsAnswer, OptionsFailure> {
        let ((request, started, timed), answer) =
            get_options_call(self.grpc.clone(), self.deadline, self.generation, id, flags).await;
        rec.record_call(request, started, timed);
        answer
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

/// The client's NodeGroupForNode cache (`externalgrpc_cloud_provider.go`
/// `nodeGroupForNodeCache`): group by node name + providerID, non-empty ids only, dropped at
/// Refresh.
pub(crate) type GroupForNodeCache = Arc<Mutex<HashMap<String, pb::NodeGroup>>>;

/// `externalGrpcCloudProvider.NodeGroupForNode`: the cached group, else the RPC (on its own
/// client handle, so background tasks can ask too), whose non-empty answer is cached.
/// `Ok(None)`: id "" (not managed, not cached). Returns the call made, if any, for the caller
/// to record.
pub(crate) async fn node_group_for_node_cached(
    grpc: &CloudProviderClient<Channel>,
    deadline: Duration,
    cache: &GroupForNodeCache,
    node: &KubeNode,
) -> (
    Result<Option<pb::NodeGroup>, RpcError>,
    Option<(Request, Instant, Timed<Reply>)>,
) {
    let key = node.cache_key();
    if let Some(group) = lock(cache).get(&key) {
        return (Ok(Some(group.clone())), None);
    }
    let grpc_node = node.to_grpc();
    let started = Instant::now();
    let request = with_deadline(
        pb::NodeGroupForNodeRequest {
            node: Some(grpc_node.clone()),
        },
        deadline,
    );
    let timed = invoke(deadline, grpc.clone().node_group_for_node(request)).await;
    let timed = map_timed(timed, |r| {
        Reply::NodeGroup(r.node_group.unwrap_or_default())
    });
    let result = match &timed.outcome {
        Ok(Reply::NodeGroup(group)) if !group.id.is_empty() => {
            lock(cache).insert(key, group.clone());
            Ok(Some(group.clone()))
        }
        Ok(_) => Ok(None),
        Err(e) => Err(e.clone()),
    };
    let call = (
        Request::NodeGroupForNode { node: grpc_node },
        started,
        timed,
    );
    (result, Some(call))
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

/// NodeGroupGetOptions as `generation`'s release makes it (`NodeGroup.GetOptions`), on its
/// own client handle (background tasks call it too): `flags` sent as `defaults` in the fields
/// the release has ([`WireGeneration::options_request`]), the answer read as it reads it
/// ([`WireGeneration::read_options`]); Unimplemented is "use the flags" from 1.29 and an error
/// for 1.28. Returns what the timeline records and what the core gets.
pub(crate) async fn get_options_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
    generation: WireGeneration,
    id: &str,
    flags: &NodeGroupOptions,
) -> (
    (Request, Instant, Timed<Reply>),
    Result<OptionsAnswer, OptionsFailure>,
) {
    let defaults = generation.options_request(flags);
    let started = Instant::now();
    let request = with_deadline(
        pb::NodeGroupAutoscalingOptionsRequest {
            id: id.to_owned(),
            defaults: Some(defaults),
        },
        deadline,
    );
    let timed = invoke(deadline, grpc.node_group_get_options(request)).await;
    let answer = match &timed.outcome {
        Ok(r) => generation
            .read_options(r.node_group_autoscaling_options.as_ref())
            .map_err(OptionsFailure::Crash),
        Err(e)
            if e.code == tonic::Code::Unimplemented && generation.understands_unimplemented() =>
        {
            Ok(OptionsAnswer::Flags)
        }
        Err(e) => Err(OptionsFailure::Rpc(e.clone())),
    };
    let recorded = (
        Request::NodeGroupGetOptions {
            id: id.to_owned(),
            defaults,
        },
        started,
        map_timed(timed, |r| Reply::Options(r.node_group_autoscaling_options)),
    );
    (recorded, answer)
}

fn map_timed<T>(timed: Timed<T>, f: impl FnOnce(T) -> Reply) -> Timed<Reply> {
    Timed {
        outcome: timed.outcome.map(f),
        latency: timed.latency,
    }
}

/// Locks a mutex of the mock's shared state. A panic while holding one of these locks can only
/// come from a bug in a task; keep the data rather than poisoning the autoscaler.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::{NodeTemplate, PodSpec};
    use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
    use cks_autoscaler_provider::options::parse_overrides_spec;
    use cks_testkit::{Stack, sim_config};
    use std::sync::Arc;

    const MIN: u64 = 60;
    const GI: u64 = 1 << 30;

    use crate::autoscaler::wire::test_flags as flags;

    /// Per generation, against a provider on loopback: the template-based part of a scale-up
    /// (the group's template decoded from the field the release reads, a pending pod checked
    /// against it, IncreaseSize) and NodeGroupGetOptions with an override configured.
    #[tokio::test(start_paused = true)]
    async fn every_generation_scales_up_from_the_template_and_gets_its_options() {
        for generation in WireGeneration::ALL {
            let mut extras = ProviderExtras::default();
            let (cluster, overrides) =
                parse_overrides_spec("demo:scale-down-unneeded=5m").expect("spec");
            extras.overrides.insert(cluster, overrides);
            let stack =
                Stack::start_with_extras(sim_config(), "demo", |_| {}, Arc::new(extras)).await;
            let mut client = ExternalGrpcClient::with_generation(
                stack.client.clone(),
                Duration::from_secs(5),
                generation,
            );
            assert_eq!(client.generation(), generation);
            let mut rec = Recorder::new();
            client.refresh(&mut rec).await.expect("Refresh");
            let groups = client.node_groups(&mut rec).await;
            assert_eq!(groups.len(), 1, "{generation:?}");
            let id = groups[0].id.clone();

            let bytes = client
                .template_node_info(&id, &mut rec)
                .await
                .expect("NodeGroupTemplateNodeInfo");
            let template = NodeTemplate::decode(&bytes)
                .unwrap_or_else(|e| panic!("{generation:?}: no template node: {e}"));
            // The demo cluster's workers are cks-medium: 2 vCPU, 4 GiB.
            assert_eq!(
                template
                    .labels
                    .get("node.kubernetes.io/instance-type")
                    .map(String::as_str),
                Some("cks-medium"),
                "{generation:?}"
            );
            let fits = PodSpec::new("fits", 1500, GI);
            let too_big = PodSpec::new("too-big", 2500, GI);
            assert_eq!(template.check(&fits), Ok(()), "{generation:?}");
            assert!(template.check(&too_big).is_err(), "{generation:?}");
            let before = client.target_size(&id, &mut rec).await.expect("target");
            client
                .increase_size(&id, 1, &mut rec)
                .await
                .expect("NodeGroupIncreaseSize");
            assert_eq!(
                client.target_size(&id, &mut rec).await.expect("target"),
                before + 1,
                "{generation:?}"
            );

            let got = client.get_options(&id, &flags(), &mut rec).await;
            let recorded = rec
                .timeline
                .calls(crate::autoscaler::Rpc::NodeGroupGetOptions);
            assert!(
                matches!(
                    recorded.as_slice(),
                    [Call { request: Request::NodeGroupGetOptions { defaults, .. }, .. }]
                        if *defaults == generation.options_request(&flags())
                ),
                "{generation:?}: the call is recorded with the defaults sent: {recorded:?}"
            );
            if generation == WireGeneration::V1_28 {
                // No options for 1.28: its flags apply (options would zero its provision time).
                assert_eq!(got, Ok(OptionsAnswer::Flags));
            } else {
                let Ok(OptionsAnswer::Options(o)) = got else {
                    panic!("{generation:?}: {got:?}");
                };
                let want = NodeGroupOptions {
                    scale_down_unneeded_time: Duration::from_secs(5 * MIN),
                    ..flags()
                };
                let want = if generation == WireGeneration::V1_29 {
                    NodeGroupOptions {
                        zero_or_max_node_scaling: false,
                        ignore_daemonsets_utilization: false,
                        ..want
                    }
                } else {
                    want
                };
                assert_eq!(o, want, "{generation:?}");
            }
            stack.shutdown().await;
        }
    }

    /// Without overrides the provider answers Unimplemented, which releases from 1.29 take for
    /// "use the flags"; 1.28 would take it for an error, so it gets an answer without options.
    #[tokio::test(start_paused = true)]
    async fn without_overrides_every_generation_keeps_its_flags() {
        let stack = Stack::start_with_extras(
            sim_config(),
            "demo",
            |_| {},
            Arc::new(ProviderExtras::default()),
        )
        .await;
        for generation in WireGeneration::ALL {
            let mut client = ExternalGrpcClient::with_generation(
                stack.client.clone(),
                Duration::from_secs(5),
                generation,
            );
            let mut rec = Recorder::new();
            client.refresh(&mut rec).await.expect("Refresh");
            assert_eq!(
                client
                    .get_options(&stack.cluster_id, &flags(), &mut rec)
                    .await,
                Ok(OptionsAnswer::Flags),
                "{generation:?}"
            );
        }
        stack.shutdown().await;
    }

    /// A provider without template nodes answers Unimplemented: from 1.29 the group is skipped,
    /// 1.28 takes it for an error (its loop fails while the group has no node to copy).
    #[tokio::test(start_paused = true)]
    async fn only_1_28_takes_an_unimplemented_template_for_an_error() {
        let stack = Stack::start_with_extras(
            sim_config(),
            "demo",
            |_| {},
            Arc::new(ProviderExtras::without_template()),
        )
        .await;
        for generation in WireGeneration::ALL {
            let mut client = ExternalGrpcClient::with_generation(
                stack.client.clone(),
                Duration::from_secs(5),
                generation,
            );
            let mut rec = Recorder::new();
            client.refresh(&mut rec).await.expect("Refresh");
            let err = client
                .template_node_info(&stack.cluster_id, &mut rec)
                .await
                .expect_err("no templates");
            let want = if generation == WireGeneration::V1_28 {
                tonic::Code::Unknown
            } else {
                tonic::Code::Unimplemented
            };
            assert_eq!(err.code, want, "{generation:?}: {err}");
            let recorded = rec.timeline.events.iter().find_map(|e| match &e.kind {
                EventKind::Call(c) => match (&c.request, &c.outcome) {
                    (Request::NodeGroupTemplateNodeInfo { .. }, Err(e)) => Some(e.code),
                    _ => None,
                },
                _ => None,
            });
            assert_eq!(recorded, Some(tonic::Code::Unimplemented), "{generation:?}");
        }
        stack.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn switching_generation_drops_templates_read_from_the_other_field() {
        let stack = Stack::start_with_extras(
            sim_config(),
            "demo",
            |_| {},
            Arc::new(ProviderExtras::default()),
        )
        .await;
        let mut client = ExternalGrpcClient::with_generation(
            stack.client.clone(),
            Duration::from_secs(5),
            WireGeneration::default(),
        );
        assert_eq!(client.generation(), WireGeneration::V1_35);
        let mut rec = Recorder::new();
        client.refresh(&mut rec).await.expect("Refresh");
        let id = stack.cluster_id.clone();
        let new = client
            .template_node_info(&id, &mut rec)
            .await
            .expect("v1.35");
        client.set_generation(WireGeneration::V1_33);
        let old = client
            .template_node_info(&id, &mut rec)
            .await
            .expect("v1.33");
        assert!(!new.is_empty());
        assert_eq!(
            old, new,
            "the provider sends the same Node in fields 1 and 2"
        );
        let calls = rec
            .timeline
            .events
            .iter()
            .filter(|e| {
                matches!(&e.kind, EventKind::Call(c)
                    if matches!(c.request, Request::NodeGroupTemplateNodeInfo { .. }))
            })
            .count();
        assert_eq!(calls, 2, "the switch dropped the cached template");
        stack.shutdown().await;
    }
}
