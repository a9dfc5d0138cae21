//! The autoscaler's externalgrpc client, as the mock replays it: one deadline for every call
//! (sent as `grpc-timeout` and enforced locally), NodeGroups and NodeGroupForNode answers
//! cached until the next Refresh (a NodeGroupForNode answer with id "" never cached),
//! NodeGroupTemplateNodeInfo answers cached per node group until the next Refresh (the real
//! client caches them on node-group objects it rebuilds at each Refresh; errors are never
//! cached), nothing else cached. Every call lands in the timeline, but NodeGroupGetOptions
//! ([`ExternalGrpcClient::get_options`]), which the timeline has no request kind for yet.
//!
//! # Wire generations
//!
//! Which fields the client reads and sends in NodeGroupTemplateNodeInfo and NodeGroupGetOptions
//! depends on the release it imitates ([`WireGeneration`], chosen with
//! [`ExternalGrpcClient::with_generation`]). Each behaviour follows upstream
//! `cluster-autoscaler/cloudprovider/externalgrpc/externalgrpc_node_group.go` at the release's
//! tag: `NodeGroup.TemplateNodeInfo` and `NodeGroup.GetOptions`. The messages are this crate's
//! own (`proto/externalgrpc.proto`), which hold every field any release uses; a generation only
//! ever fills or reads the fields its release has.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use super::nodes::KubeNode;
use super::timeline::{Call, Event, EventKind, Reply, Request, RpcError, Timeline};
use crate::pb;
use crate::pb::cloud_provider_client::CloudProviderClient;

/// The meta.v1.Duration of releases up to 1.34.x (nanoseconds).
type MetaDuration = k8s_pb::apimachinery::pkg::apis::meta::v1::Duration;

/// The externalgrpc message shapes a cluster-autoscaler release speaks (upstream
/// `cloudprovider/externalgrpc/protos/externalgrpc.proto`; `tests/protos/` has each shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the engine keeps the default until MockAutoscaler lets a caller choose; \
                  the tests below run every generation"
    )
)]
pub enum WireGeneration {
    /// 1.28.x: template in field 1; options with durations 3 and 4 only; no gRPC code means
    /// "not implemented".
    V1_28,
    /// 1.29.0 to 1.32.x: template in field 1; options durations 3, 4, 5 (no 6, 7).
    V1_29,
    /// 1.33.0 to 1.34.1: template in field 1; options 1 to 7.
    V1_33,
    /// 1.34.2 to 1.34.x: template in field 2, else field 1; sends durations in 3-5 and 8-10,
    /// reads 8-10, each falling back to 3-5.
    V1_34_2,
    /// 1.35.0 onward (1.36 and master too): template in field 2; durations 8-10 only.
    #[default]
    V1_35,
}

/// The per-group options the autoscaler works with (its `config.NodeGroupAutoscalingOptions`,
/// the fields the externalgrpc protocol carries).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeGroupOptions {
    /// `ScaleDownUtilizationThreshold`
    pub scale_down_utilization_threshold: f64,
    /// `ScaleDownGpuUtilizationThreshold`
    pub scale_down_gpu_utilization_threshold: f64,
    /// `ScaleDownUnneededTime`
    pub scale_down_unneeded_time: Duration,
    /// `ScaleDownUnreadyTime`
    pub scale_down_unready_time: Duration,
    /// `MaxNodeProvisionTime`
    pub max_node_provision_time: Duration,
    /// `ZeroOrMaxNodeScaling`
    pub zero_or_max_node_scaling: bool,
    /// `IgnoreDaemonSetsUtilization`
    pub ignore_daemonsets_utilization: bool,
}

/// What `NodeGroup.GetOptions` gives the core.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionsAnswer {
    /// Options built from the answer (fields the release does not read are zero).
    Options(NodeGroupOptions),
    /// The autoscaler's flags apply: the answer held no options (`pbOpts == nil`), or the
    /// provider answered Unimplemented (understood from 1.29).
    Flags,
}

/// Why `NodeGroup.GetOptions` gave the core no options.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionsFailure {
    /// The call failed; the core reports the error (and skips what needed the options).
    Rpc(RpcError),
    /// The real client would dereference a missing meta.v1.Duration and crash the autoscaler.
    Crash(String),
}

#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the engine keeps the default until MockAutoscaler lets a caller choose; \
                  the tests below run every generation"
    )
)]
impl WireGeneration {
    /// Every generation, oldest first.
    pub const ALL: [WireGeneration; 5] = [
        WireGeneration::V1_28,
        WireGeneration::V1_29,
        WireGeneration::V1_33,
        WireGeneration::V1_34_2,
        WireGeneration::V1_35,
    ];

    /// The generation of a cluster-autoscaler release, `1.33.4` or `v1.33.4` (a minor alone,
    /// `1.34`, means its first patch). Releases before 1.28 are not supported.
    pub fn of_release(release: &str) -> Result<WireGeneration, String> {
        let bad = || format!("{release:?} is not a cluster-autoscaler release such as 1.33.4");
        let version = release.trim().trim_start_matches('v');
        let mut parts = version.split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let patch = match parts.next() {
            None => 0,
            Some(Ok(p)) => p,
            Some(Err(_)) => return Err(bad()),
        };
        if parts.next().is_some() || major != 1 {
            return Err(bad());
        }
        Ok(match (minor, patch) {
            (0..=27, _) => return Err(format!("cluster-autoscaler {release} is older than 1.28")),
            (28, _) => WireGeneration::V1_28,
            (29..=32, _) => WireGeneration::V1_29,
            (33, _) | (34, 0..=1) => WireGeneration::V1_33,
            (34, _) => WireGeneration::V1_34_2,
            _ => WireGeneration::V1_35,
        })
    }

    /// The template node bytes this release takes from an answer (empty: no node).
    /// `NodeGroup.TemplateNodeInfo`: up to 1.34.1 `res.GetNodeInfo()` (field 1, a v1.Node
    /// message, whose encoding is the Node's bytes); 1.34.2 `res.GetNodeBytes()` when set,
    /// else `res.GetNodeInfo()`; from 1.35 `res.GetNodeBytes()` only.
    pub fn template_node(self, response: &pb::NodeGroupTemplateNodeInfoResponse) -> &[u8] {
        match self {
            WireGeneration::V1_28 | WireGeneration::V1_29 | WireGeneration::V1_33 => {
                &response.node_info
            }
            WireGeneration::V1_34_2 if response.node_bytes.is_empty() => &response.node_info,
            WireGeneration::V1_34_2 | WireGeneration::V1_35 => &response.node_bytes,
        }
    }

    /// The `defaults` this release sends (`NodeGroup.GetOptions`): thresholds always; the
    /// durations as meta.v1.Duration in fields 3, 4 (and 5 from 1.29) up to 1.34.x, as
    /// google.protobuf.Duration in 8-10 from 1.34.2; the two booleans from 1.33.
    pub fn options_request(self, flags: &NodeGroupOptions) -> pb::NodeGroupAutoscalingOptions {
        let meta = |d: Duration| {
            Some(MetaDuration {
                duration: Some(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            })
        };
        let proto = |d: Duration| {
            Some(prost_types::Duration {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
            })
        };
        let mut o = pb::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: flags.scale_down_utilization_threshold,
            scale_down_gpu_utilization_threshold: flags.scale_down_gpu_utilization_threshold,
            ..Default::default()
        };
        if self != WireGeneration::V1_35 {
            o.scale_down_unneeded_time = meta(flags.scale_down_unneeded_time);
            o.scale_down_unready_time = meta(flags.scale_down_unready_time);
        }
        if matches!(
            self,
            WireGeneration::V1_29 | WireGeneration::V1_33 | WireGeneration::V1_34_2
        ) {
            o.max_node_provision_time = meta(flags.max_node_provision_time);
        }
        if matches!(
            self,
            WireGeneration::V1_33 | WireGeneration::V1_34_2 | WireGeneration::V1_35
        ) {
            o.zero_or_max_node_scaling = flags.zero_or_max_node_scaling;
            o.ignore_daemon_sets_utilization = flags.ignore_daemonsets_utilization;
        }
        if matches!(self, WireGeneration::V1_34_2 | WireGeneration::V1_35) {
            o.scale_down_unneeded_duration = proto(flags.scale_down_unneeded_time);
            o.scale_down_unready_duration = proto(flags.scale_down_unready_time);
            o.max_node_provision_duration = proto(flags.max_node_provision_time);
        }
        o
    }

    /// What this release makes of an OK answer (`NodeGroup.GetOptions`): no options message is
    /// "use the flags"; otherwise the fields it reads, every other one zero. Up to 1.34.1 it
    /// reads `pbOpts.GetScaleDownUnneededTime().Duration` (and 4, and 5 from 1.29) with no nil
    /// check, 1.34.2 falls back to them when 8-10 are missing: a missing one is a crash.
    pub fn read_options(
        self,
        answer: Option<&pb::NodeGroupAutoscalingOptions>,
    ) -> Result<OptionsAnswer, OptionsFailure> {
        let Some(a) = answer else {
            return Ok(OptionsAnswer::Flags);
        };
        let deref = |field: Option<MetaDuration>, name: &str| {
            field
                .map(|d| Duration::from_nanos(u64::try_from(d.duration.unwrap_or(0)).unwrap_or(0)))
                .ok_or_else(|| {
                    OptionsFailure::Crash(format!(
                        "cluster-autoscaler {self:?} dereferences the missing {name}: nil pointer \
                         dereference"
                    ))
                })
        };
        let google = |field: Option<prost_types::Duration>| {
            field.map(|d| {
                Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))
                    .saturating_add(Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0)))
            })
        };
        let mut o = NodeGroupOptions {
            scale_down_utilization_threshold: a.scale_down_utilization_threshold,
            scale_down_gpu_utilization_threshold: a.scale_down_gpu_utilization_threshold,
            scale_down_unneeded_time: Duration::ZERO,
            scale_down_unready_time: Duration::ZERO,
            max_node_provision_time: Duration::ZERO,
            zero_or_max_node_scaling: false,
            ignore_daemonsets_utilization: false,
        };
        match self {
            WireGeneration::V1_28 | WireGeneration::V1_29 | WireGeneration::V1_33 => {
                o.scale_down_unneeded_time = deref(
                    a.scale_down_unneeded_time,
                    "scaleDownUnneededTime (field 3)",
                )?;
                o.scale_down_unready_time =
                    deref(a.scale_down_unready_time, "scaleDownUnreadyTime (field 4)")?;
                if self != WireGeneration::V1_28 {
                    o.max_node_provision_time =
                        deref(a.max_node_provision_time, "MaxNodeProvisionTime (field 5)")?;
                }
            }
            WireGeneration::V1_34_2 => {
                o.scale_down_unneeded_time = match google(a.scale_down_unneeded_duration) {
                    Some(d) => d,
                    None => deref(
                        a.scale_down_unneeded_time,
                        "scaleDownUnneededTime (field 3)",
                    )?,
                };
                o.scale_down_unready_time = match google(a.scale_down_unready_duration) {
                    Some(d) => d,
                    None => deref(a.scale_down_unready_time, "scaleDownUnreadyTime (field 4)")?,
                };
                o.max_node_provision_time = match google(a.max_node_provision_duration) {
                    Some(d) => d,
                    None => deref(a.max_node_provision_time, "MaxNodeProvisionTime (field 5)")?,
                };
            }
            WireGeneration::V1_35 => {
                o.scale_down_unneeded_time =
                    google(a.scale_down_unneeded_duration).unwrap_or_default();
                o.scale_down_unready_time =
                    google(a.scale_down_unready_duration).unwrap_or_default();
                o.max_node_provision_time =
                    google(a.max_node_provision_duration).unwrap_or_default();
            }
        }
        if !matches!(self, WireGeneration::V1_28 | WireGeneration::V1_29) {
            o.zero_or_max_node_scaling = a.zero_or_max_node_scaling;
            o.ignore_daemonsets_utilization = a.ignore_daemon_sets_utilization;
        }
        Ok(OptionsAnswer::Options(o))
    }

    /// Whether this release's client turns an Unimplemented answer to NodeGroupTemplateNodeInfo
    /// or NodeGroupGetOptions into "not implemented" (`codes.Unimplemented` →
    /// `cloudprovider.ErrNotImplemented`, from 1.29); 1.28 returns it as an error.
    pub fn understands_unimplemented(self) -> bool {
        self != WireGeneration::V1_28
    }
}

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
    /// NodeGroupTemplateNodeInfo node bytes by group id, until the next Refresh. Only successes.
    templates: HashMap<String, Vec<u8>>,
    /// The release whose message shapes the client speaks.
    generation: WireGeneration,
}

impl ExternalGrpcClient {
    /// A client of the newest wire generation ([`WireGeneration::default`]).
    pub(crate) fn new(grpc: CloudProviderClient<Channel>, deadline: Duration) -> Self {
        Self::with_generation(grpc, deadline, WireGeneration::default())
    }

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
            group_for_node: HashMap::new(),
            templates: HashMap::new(),
            generation,
        }
    }

    /// The wire generation spoken.
    #[cfg_attr(not(test), allow(dead_code, reason = "read by the tests below"))]
    pub(crate) fn generation(&self) -> WireGeneration {
        self.generation
    }

    /// Speaks `generation` from the next call on (cached templates are dropped: they were read
    /// from the other generation's field).
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "for the engine once MockAutoscaler lets a caller choose"
        )
    )]
    pub(crate) fn set_generation(&mut self, generation: WireGeneration) {
        self.generation = generation;
        self.templates.clear();
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

    /// NodeGroupGetOptions as this client's release makes it (`NodeGroup.GetOptions`): `flags`
    /// sent as `defaults` in the fields the release has ([`WireGeneration::options_request`]),
    /// the answer read as it reads it ([`WireGeneration::read_options`]). Not recorded in the
    /// timeline (it has no NodeGroupGetOptions request kind yet).
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "for the engine once it asks for options")
    )]
    pub(crate) async fn get_options(
        &mut self,
        id: &str,
        flags: &NodeGroupOptions,
    ) -> Result<OptionsAnswer, OptionsFailure> {
        let request = with_deadline(
            pb::NodeGroupAutoscalingOptionsRequest {
                id: id.to_owned(),
                defaults: Some(self.generation.options_request(flags)),
            },
            self.deadline,
        );
        let timed = invoke(self.deadline, self.grpc.node_group_get_options(request)).await;
        match timed.outcome {
            Ok(r) => self
                .generation
                .read_options(r.node_group_autoscaling_options.as_ref()),
            Err(e)
                if e.code == tonic::Code::Unimplemented
                    && self.generation.understands_unimplemented() =>
            {
                Ok(OptionsAnswer::Flags)
            }
            Err(e) => Err(OptionsFailure::Rpc(e)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::{NodeTemplate, PodSpec};
    use crate::extras::ProviderExtras;
    use crate::options::parse_overrides_spec;
    use crate::testkit::{Stack, sim_config};
    use std::sync::Arc;

    const MIN: u64 = 60;
    const GI: u64 = 1 << 30;

    fn meta(secs: u64) -> Option<MetaDuration> {
        Some(MetaDuration {
            duration: Some(i64::try_from(secs * 1_000_000_000).unwrap()),
        })
    }

    fn google(secs: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration {
            seconds: secs,
            nanos: 0,
        })
    }

    fn flags() -> NodeGroupOptions {
        NodeGroupOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.4,
            scale_down_unneeded_time: Duration::from_secs(10 * MIN),
            scale_down_unready_time: Duration::from_secs(20 * MIN),
            max_node_provision_time: Duration::from_secs(25 * MIN),
            zero_or_max_node_scaling: true,
            ignore_daemonsets_utilization: true,
        }
    }

    #[test]
    fn releases_map_to_their_generation() {
        for (release, want) in [
            ("1.28.0", WireGeneration::V1_28),
            ("v1.28.7", WireGeneration::V1_28),
            ("1.29.5", WireGeneration::V1_29),
            ("1.32.7", WireGeneration::V1_29),
            ("1.33.0", WireGeneration::V1_33),
            ("1.34.1", WireGeneration::V1_33),
            ("1.34", WireGeneration::V1_33),
            ("1.34.2", WireGeneration::V1_34_2),
            ("v1.34.5", WireGeneration::V1_34_2),
            ("1.35.0", WireGeneration::V1_35),
            ("1.36.1", WireGeneration::V1_35),
        ] {
            assert_eq!(WireGeneration::of_release(release), Ok(want), "{release}");
        }
        for bad in ["1.27.9", "2.0.0", "1", "1.x", "1.33.1.2", ""] {
            assert!(WireGeneration::of_release(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_generation_reads_the_template_from_its_field() {
        let old_only = pb::NodeGroupTemplateNodeInfoResponse {
            node_info: b"field 1".to_vec(),
            node_bytes: Vec::new(),
        };
        let new_only = pb::NodeGroupTemplateNodeInfoResponse {
            node_info: Vec::new(),
            node_bytes: b"field 2".to_vec(),
        };
        let both = pb::NodeGroupTemplateNodeInfoResponse {
            node_info: b"field 1".to_vec(),
            node_bytes: b"field 2".to_vec(),
        };
        use WireGeneration::*;
        for (g, old, new, both_read) in [
            (V1_28, "field 1", "", "field 1"),
            (V1_29, "field 1", "", "field 1"),
            (V1_33, "field 1", "", "field 1"),
            (V1_34_2, "field 1", "field 2", "field 2"),
            (V1_35, "", "field 2", "field 2"),
        ] {
            assert_eq!(g.template_node(&old_only), old.as_bytes(), "{g:?}");
            assert_eq!(g.template_node(&new_only), new.as_bytes(), "{g:?}");
            assert_eq!(g.template_node(&both), both_read.as_bytes(), "{g:?}");
        }
    }

    #[test]
    fn each_generation_sends_the_option_fields_its_release_has() {
        let f = flags();
        use WireGeneration::*;
        let sent = |g: WireGeneration| g.options_request(&f);
        let v1_28 = sent(V1_28);
        assert_eq!(
            (
                v1_28.scale_down_unneeded_time,
                v1_28.scale_down_unready_time
            ),
            (meta(10 * MIN), meta(20 * MIN))
        );
        assert_eq!(v1_28.max_node_provision_time, None);
        assert!(!v1_28.zero_or_max_node_scaling);
        assert_eq!(sent(V1_29).max_node_provision_time, meta(25 * MIN));
        assert!(!sent(V1_29).ignore_daemon_sets_utilization);
        assert!(sent(V1_33).ignore_daemon_sets_utilization);
        assert_eq!(sent(V1_33).scale_down_unneeded_duration, None);
        let v1_34_2 = sent(V1_34_2);
        assert_eq!(v1_34_2.max_node_provision_time, meta(25 * MIN));
        assert_eq!(v1_34_2.max_node_provision_duration, google(25 * 60));
        let v1_35 = sent(V1_35);
        assert_eq!(v1_35.scale_down_unneeded_time, None);
        assert_eq!(v1_35.max_node_provision_time, None);
        assert_eq!(v1_35.scale_down_unready_duration, google(20 * 60));
        assert!(v1_35.zero_or_max_node_scaling);
        for g in WireGeneration::ALL {
            assert_eq!(sent(g).scale_down_gpu_utilization_threshold, 0.4, "{g:?}");
        }
    }

    #[test]
    fn releases_up_to_1_34_1_crash_on_options_without_fields_3_to_5() {
        // An answer as a provider that only knows the 1.35 shape gives it.
        let new_only = WireGeneration::V1_35.options_request(&flags());
        use WireGeneration::*;
        for g in [V1_28, V1_29, V1_33] {
            match g.read_options(Some(&new_only)) {
                Err(OptionsFailure::Crash(why)) => {
                    assert!(why.contains("scaleDownUnneededTime (field 3)"), "{why}")
                }
                other => panic!("{g:?}: {other:?}"),
            }
        }
        // 1.34.2 falls back to 3-5 only when 8-10 are missing.
        assert!(matches!(
            V1_34_2.read_options(Some(&new_only)),
            Ok(OptionsAnswer::Options(_))
        ));
        let old_only = V1_33.options_request(&flags());
        assert_eq!(
            V1_34_2.read_options(Some(&old_only)),
            Ok(OptionsAnswer::Options(flags()))
        );
        // 1.35 reads an answer without 8-10 as zero durations.
        match V1_35.read_options(Some(&old_only)) {
            Ok(OptionsAnswer::Options(o)) => {
                assert_eq!(o.scale_down_unneeded_time, Duration::ZERO)
            }
            other => panic!("{other:?}"),
        }
        // No options at all: every release uses its flags.
        for g in WireGeneration::ALL {
            assert_eq!(g.read_options(None), Ok(OptionsAnswer::Flags), "{g:?}");
        }
    }

    #[test]
    fn older_releases_drop_the_fields_they_do_not_know() {
        use WireGeneration::*;
        let both = V1_34_2.options_request(&flags());
        let read = |g: WireGeneration| match g.read_options(Some(&both)) {
            Ok(OptionsAnswer::Options(o)) => o,
            other => panic!("{g:?}: {other:?}"),
        };
        let v1_28 = read(V1_28);
        assert_eq!(v1_28.max_node_provision_time, Duration::ZERO);
        assert!(!v1_28.zero_or_max_node_scaling);
        let v1_29 = read(V1_29);
        assert_eq!(v1_29.max_node_provision_time, Duration::from_secs(25 * MIN));
        assert!(!v1_29.ignore_daemonsets_utilization);
        for g in [V1_33, V1_34_2, V1_35] {
            assert_eq!(read(g), flags(), "{g:?}");
        }
    }

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

            let got = client.get_options(&id, &flags()).await;
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
                client.get_options(&stack.cluster_id, &flags()).await,
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
        let mut client = ExternalGrpcClient::new(stack.client.clone(), Duration::from_secs(5));
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
