//! The record of what the mock autoscaler saw, asked and got: every RPC with its answer and
//! latency, what each loop observed, and every decision with its reason. Tests assert on it;
//! the demo prints it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::pods::{NodeTemplate, PodSpec};
use super::wire::WireGeneration;
use crate::pb;
use cks_proto::instance_status::InstanceState;

/// The externalgrpc RPCs the mock autoscaler issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rpc {
    /// `Refresh`
    Refresh,
    /// `NodeGroups`
    NodeGroups,
    /// `NodeGroupForNode`
    NodeGroupForNode,
    /// `NodeGroupTargetSize`
    NodeGroupTargetSize,
    /// `NodeGroupNodes`
    NodeGroupNodes,
    /// `NodeGroupIncreaseSize`
    NodeGroupIncreaseSize,
    /// `NodeGroupDeleteNodes`
    NodeGroupDeleteNodes,
    /// `NodeGroupDecreaseTargetSize`
    NodeGroupDecreaseTargetSize,
    /// `NodeGroupTemplateNodeInfo`
    NodeGroupTemplateNodeInfo,
    /// `NodeGroupGetOptions`
    NodeGroupGetOptions,
    /// `GPULabel`
    GpuLabel,
    /// `GetAvailableGPUTypes`
    GetAvailableGpuTypes,
    /// `Cleanup`
    Cleanup,
}

impl Rpc {
    /// Every RPC the mock autoscaler issues.
    pub const ALL: [Rpc; 13] = [
        Rpc::Refresh,
        Rpc::NodeGroups,
        Rpc::NodeGroupForNode,
        Rpc::NodeGroupTargetSize,
        Rpc::NodeGroupNodes,
        Rpc::NodeGroupIncreaseSize,
        Rpc::NodeGroupDeleteNodes,
        Rpc::NodeGroupDecreaseTargetSize,
        Rpc::NodeGroupTemplateNodeInfo,
        Rpc::NodeGroupGetOptions,
        Rpc::GpuLabel,
        Rpc::GetAvailableGpuTypes,
        Rpc::Cleanup,
    ];

    /// The RPC's name in the proto service.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Refresh => "Refresh",
            Rpc::NodeGroups => "NodeGroups",
            Rpc::NodeGroupForNode => "NodeGroupForNode",
            Rpc::NodeGroupTargetSize => "NodeGroupTargetSize",
            Rpc::NodeGroupNodes => "NodeGroupNodes",
            Rpc::NodeGroupIncreaseSize => "NodeGroupIncreaseSize",
            Rpc::NodeGroupDeleteNodes => "NodeGroupDeleteNodes",
            Rpc::NodeGroupDecreaseTargetSize => "NodeGroupDecreaseTargetSize",
            Rpc::NodeGroupTemplateNodeInfo => "NodeGroupTemplateNodeInfo",
            Rpc::NodeGroupGetOptions => "NodeGroupGetOptions",
            Rpc::GpuLabel => "GPULabel",
            Rpc::GetAvailableGpuTypes => "GetAvailableGPUTypes",
            Rpc::Cleanup => "Cleanup",
        }
    }

    /// True for the RPCs that change the provider's state.
    pub fn is_mutation(self) -> bool {
        matches!(
            self,
            Rpc::NodeGroupIncreaseSize
                | Rpc::NodeGroupDeleteNodes
                | Rpc::NodeGroupDecreaseTargetSize
                | Rpc::Cleanup
        )
    }
}

impl std::str::FromStr for Rpc {
    type Err = String;

    /// Parses the proto name, e.g. `"NodeGroupIncreaseSize"`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Rpc::ALL
            .into_iter()
            .find(|rpc| rpc.name() == s)
            .ok_or_else(|| format!("{s:?} is not an RPC the mock autoscaler issues"))
    }
}

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What was asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `Refresh`
    Refresh,
    /// `NodeGroups`
    NodeGroups,
    /// `NodeGroupForNode` for this node.
    NodeGroupForNode {
        /// The node as sent.
        node: pb::ExternalGrpcNode,
    },
    /// `NodeGroupTargetSize`
    NodeGroupTargetSize {
        /// Node group id.
        id: String,
    },
    /// `NodeGroupNodes`
    NodeGroupNodes {
        /// Node group id.
        id: String,
    },
    /// `NodeGroupIncreaseSize`
    NodeGroupIncreaseSize {
        /// Node group id.
        id: String,
        /// Nodes to add (positive).
        delta: i32,
    },
    /// `NodeGroupDeleteNodes`
    NodeGroupDeleteNodes {
        /// Node group id.
        id: String,
        /// The nodes as sent (real or fake nodes).
        nodes: Vec<pb::ExternalGrpcNode>,
    },
    /// `NodeGroupDecreaseTargetSize`
    NodeGroupDecreaseTargetSize {
        /// Node group id.
        id: String,
        /// Negative delta.
        delta: i32,
    },
    /// `NodeGroupTemplateNodeInfo`
    NodeGroupTemplateNodeInfo {
        /// Node group id.
        id: String,
    },
    /// `NodeGroupGetOptions`.
    NodeGroupGetOptions {
        /// Node group id.
        id: String,
        /// The autoscaler's flags as sent, in the fields of the wire generation spoken
        /// ([`WireGeneration::options_request`]).
        defaults: pb::NodeGroupAutoscalingOptions,
    },
    /// `GPULabel`
    GpuLabel,
    /// `GetAvailableGPUTypes`
    GetAvailableGpuTypes,
    /// `Cleanup`
    Cleanup,
}

impl Request {
    /// Which RPC this is.
    pub fn rpc(&self) -> Rpc {
        match self {
            Request::Refresh => Rpc::Refresh,
            Request::NodeGroups => Rpc::NodeGroups,
            Request::NodeGroupForNode { .. } => Rpc::NodeGroupForNode,
            Request::NodeGroupTargetSize { .. } => Rpc::NodeGroupTargetSize,
            Request::NodeGroupNodes { .. } => Rpc::NodeGroupNodes,
            Request::NodeGroupIncreaseSize { .. } => Rpc::NodeGroupIncreaseSize,
            Request::NodeGroupDeleteNodes { .. } => Rpc::NodeGroupDeleteNodes,
            Request::NodeGroupDecreaseTargetSize { .. } => Rpc::NodeGroupDecreaseTargetSize,
            Request::NodeGroupTemplateNodeInfo { .. } => Rpc::NodeGroupTemplateNodeInfo,
            Request::NodeGroupGetOptions { .. } => Rpc::NodeGroupGetOptions,
            Request::GpuLabel => Rpc::GpuLabel,
            Request::GetAvailableGpuTypes => Rpc::GetAvailableGpuTypes,
            Request::Cleanup => Rpc::Cleanup,
        }
    }

    /// The node group the request is about, if any.
    pub fn group(&self) -> Option<&str> {
        match self {
            Request::Refresh
            | Request::NodeGroups
            | Request::NodeGroupForNode { .. }
            | Request::GpuLabel
            | Request::GetAvailableGpuTypes
            | Request::Cleanup => None,
            Request::NodeGroupTargetSize { id }
            | Request::NodeGroupGetOptions { id, .. }
            | Request::NodeGroupNodes { id }
            | Request::NodeGroupIncreaseSize { id, .. }
            | Request::NodeGroupDeleteNodes { id, .. }
            | Request::NodeGroupDecreaseTargetSize { id, .. }
            | Request::NodeGroupTemplateNodeInfo { id } => Some(id),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rpc = self.rpc();
        match self {
            Request::Refresh
            | Request::NodeGroups
            | Request::GpuLabel
            | Request::GetAvailableGpuTypes
            | Request::Cleanup => write!(f, "{rpc}"),
            Request::NodeGroupForNode { node } => {
                write!(f, "{rpc}({} {:?})", node.name, node.provider_id)
            }
            Request::NodeGroupTargetSize { id }
            | Request::NodeGroupNodes { id }
            | Request::NodeGroupTemplateNodeInfo { id }
            | Request::NodeGroupGetOptions { id, .. } => write!(f, "{rpc}({id})"),
            Request::NodeGroupIncreaseSize { id, delta }
            | Request::NodeGroupDecreaseTargetSize { id, delta } => {
                write!(f, "{rpc}({id}, {delta:+})")
            }
            Request::NodeGroupDeleteNodes { id, nodes } => {
                let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                write!(f, "{rpc}({id}, [{}])", names.join(", "))
            }
        }
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An empty response message.
    Empty,
    /// `NodeGroups` answer.
    NodeGroups(Vec<pb::NodeGroup>),
    /// `NodeGroupForNode` answer; id "" means the node is not managed.
    NodeGroup(pb::NodeGroup),
    /// `NodeGroupTargetSize` answer.
    TargetSize(i32),
    /// `NodeGroupNodes` answer.
    Instances(Vec<pb::Instance>),
    /// `NodeGroupTemplateNodeInfo` answer: `nodeBytes` as received.
    TemplateNode(Vec<u8>),
    /// `NodeGroupGetOptions` answer: the options message, if the answer carried one.
    Options(Option<pb::NodeGroupAutoscalingOptions>),
    /// `GPULabel` answer.
    GpuLabel(String),
    /// `GetAvailableGPUTypes` answer: the type names.
    GpuTypes(Vec<String>),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Empty => f.write_str("ok"),
            Reply::NodeGroups(groups) => {
                let list: Vec<String> = groups.iter().map(group_text).collect();
                write!(f, "[{}]", list.join(", "))
            }
            Reply::NodeGroup(g) if g.id.is_empty() => f.write_str("not managed"),
            Reply::NodeGroup(g) => f.write_str(&group_text(g)),
            Reply::TargetSize(t) => write!(f, "target {t}"),
            Reply::Instances(instances) => write!(f, "{}", InstanceCounts::of(instances)),
            Reply::TemplateNode(bytes) => write!(f, "template node ({} bytes)", bytes.len()),
            Reply::Options(None) => f.write_str("no options"),
            Reply::Options(Some(o)) => {
                let meta = |d: Option<&k8s_pb::apimachinery::pkg::apis::meta::v1::Duration>| {
                    d.map(|d| {
                        let nanos = d.duration.unwrap_or(0);
                        prost_types::Duration {
                            seconds: nanos.div_euclid(1_000_000_000),
                            nanos: i32::try_from(nanos.rem_euclid(1_000_000_000)).unwrap_or(0),
                        }
                    })
                };
                write!(
                    f,
                    "options (unneeded {}, unready {}, provision {}; fields 3-5: {}, {}, {})",
                    duration_text(o.scale_down_unneeded_duration.as_ref()),
                    duration_text(o.scale_down_unready_duration.as_ref()),
                    duration_text(o.max_node_provision_duration.as_ref()),
                    duration_text(meta(o.scale_down_unneeded_time.as_ref()).as_ref()),
                    duration_text(meta(o.scale_down_unready_time.as_ref()).as_ref()),
                    duration_text(meta(o.max_node_provision_time.as_ref()).as_ref()),
                )
            }
            Reply::GpuLabel(label) => write!(f, "label {label:?}"),
            Reply::GpuTypes(types) => write!(f, "[{}]", types.join(", ")),
        }
    }
}

fn duration_text(d: Option<&prost_types::Duration>) -> String {
    match d {
        None => "unset".into(),
        Some(d) => format!("{}.{:03}s", d.seconds, d.nanos / 1_000_000),
    }
}

fn group_text(g: &pb::NodeGroup) -> String {
    format!("{} ({}..{})", g.id, g.min_size, g.max_size)
}

/// A failed call, as the autoscaler's client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// gRPC status code (`DeadlineExceeded` when the deadline passed first).
    pub code: tonic::Code,
    /// Status message.
    pub message: String,
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for RpcError {}

/// One RPC: what was asked, what came back, how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Loop number (1-based).
    pub loop_no: u64,
    /// When the call was sent, since the autoscaler was created.
    pub at: Duration,
    /// The request.
    pub request: Request,
    /// The answer or the failure.
    pub outcome: Result<Reply, RpcError>,
    /// Time until the answer (or the deadline).
    pub latency: Duration,
    /// The wire generation the client spoke.
    pub wire: WireGeneration,
}

impl Call {
    /// Which RPC.
    pub fn rpc(&self) -> Rpc {
        self.request.rpc()
    }

    /// The failure, if the call failed.
    pub fn error(&self) -> Option<&RpcError> {
        self.outcome.as_ref().err()
    }

    /// True if the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The call failed with `Unimplemented` where the client takes that as "not implemented"
    /// rather than as an error (NodeGroupTemplateNodeInfo, NodeGroupGetOptions: the core
    /// falls back on real nodes, resp. its own flags), which releases from 1.29 do
    /// ([`WireGeneration::understands_unimplemented`]).
    pub fn is_not_implemented(&self) -> bool {
        self.wire.understands_unimplemented()
            && matches!(
                self.rpc(),
                Rpc::NodeGroupTemplateNodeInfo | Rpc::NodeGroupGetOptions
            )
            && self
                .error()
                .is_some_and(|e| e.code == tonic::Code::Unimplemented)
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Ok(reply) => write!(f, "{} -> {reply} ({})", self.request, ms(self.latency)),
            Err(err) => write!(f, "{} -> FAILED {err} ({})", self.request, ms(self.latency)),
        }
    }
}

/// Instances of a node group by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstanceCounts {
    /// `instanceRunning`
    pub running: usize,
    /// `instanceCreating` without an error.
    pub creating: usize,
    /// `instanceDeleting`
    pub deleting: usize,
    /// No state (`unspecified`).
    pub unspecified: usize,
    /// Any state with an errorInfo (non-empty error code).
    pub errored: usize,
}

impl InstanceCounts {
    /// Counts `instances`.
    pub fn of(instances: &[pb::Instance]) -> Self {
        let mut c = Self::default();
        for i in instances {
            let state = i.status.as_ref().map_or(0, |s| s.instance_state);
            if has_error(i) {
                c.errored += 1;
            } else if state == InstanceState::InstanceRunning as i32 {
                c.running += 1;
            } else if state == InstanceState::InstanceCreating as i32 {
                c.creating += 1;
            } else if state == InstanceState::InstanceDeleting as i32 {
                c.deleting += 1;
            } else {
                c.unspecified += 1;
            }
        }
        c
    }

    fn add(&mut self, o: &Self) {
        self.running += o.running;
        self.creating += o.creating;
        self.deleting += o.deleting;
        self.unspecified += o.unspecified;
        self.errored += o.errored;
    }
}

impl fmt::Display for InstanceCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} running", self.running)?;
        for (n, what) in [
            (self.creating, "creating"),
            (self.deleting, "deleting"),
            (self.errored, "failed"),
            (self.unspecified, "unknown"),
        ] {
            if n > 0 {
                write!(f, " {n} {what}")?;
            }
        }
        Ok(())
    }
}

/// The client's rule: an errorInfo counts only with a non-empty error code.
pub(crate) fn has_error(i: &pb::Instance) -> bool {
    i.status
        .as_ref()
        .and_then(|s| s.error_info.as_ref())
        .is_some_and(|e| !e.error_code.is_empty())
}

/// What one loop saw of one node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupObservation {
    /// Node group id.
    pub id: String,
    /// Min size from NodeGroups.
    pub min_size: i32,
    /// Max size from NodeGroups.
    pub max_size: i32,
    /// NodeGroupTargetSize answer.
    pub target: i32,
    /// NodeGroupNodes answer by state.
    pub instances: InstanceCounts,
    /// Registered Ready nodes (not being deleted).
    pub ready: usize,
    /// Registered NotReady nodes past their startup time.
    pub unready: usize,
    /// Registered NotReady nodes still starting.
    pub not_started: usize,
    /// Registered nodes the autoscaler has asked to delete.
    pub being_deleted: usize,
    /// Instances without a node, still within the provision time.
    pub unregistered: usize,
    /// Instances without a node for longer than the provision time.
    pub long_unregistered: usize,
    /// The group is backed off after a failed scale-up.
    pub backed_off: bool,
    /// A scale-up of this group is in progress (requested, not all nodes there yet).
    pub scale_up_in_progress: bool,
}

/// Something a loop observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// Kubernetes nodes: managed ones by readiness, plus those no group claims.
    Nodes {
        /// Managed, Ready.
        ready: usize,
        /// Managed, NotReady.
        not_ready: usize,
        /// Not managed by any group (control plane, id "").
        unmanaged: usize,
    },
    /// One node group.
    Group(GroupObservation),
    /// The workload the scenario set: nodes it needs and how many are pending.
    Demand {
        /// Nodes the workload needs in total.
        needed: u32,
        /// Nodes' worth of pods that have nowhere to run.
        pending: u32,
    },
    /// The node template of a group this loop, or why it has none (such a group is no
    /// scale-up candidate).
    NodeTemplate {
        /// Node group id.
        group: String,
        /// The template, or why there is none.
        template: Result<NodeTemplate, String>,
    },
    /// Pending pods the scenario set were scheduled on a node that came after them.
    PodsScheduled {
        /// Node name.
        node: String,
        /// Pod names.
        pods: Vec<String>,
    },
    /// Pods the scenario set that have nowhere to run yet.
    PendingPods {
        /// The pods.
        pods: Vec<PodSpec>,
    },
    /// Ready nodes carrying the provider's GPU label but no GPU allocatable, counted as
    /// NotReady (the real autoscaler's GPU processor takes their drivers as still installing).
    GpuUnready {
        /// Node names.
        nodes: Vec<String>,
    },
    /// What `GetUpcomingNodes` found for one node group, once per loop that gets that far
    /// (past `fixNodeGroupSize`), for every group.
    Upcoming(UpcomingNodes),
}

/// One node group's upcoming nodes in one loop (`clusterstate.go` `GetUpcomingNodes`):
/// `target − (ready + unready + long_unregistered)`. Nodes with the ToBeDeleted taint count as
/// Deleted, in none of the three: a target that still includes one (a provider that put a
/// removed VM back) makes a phantom upcoming node, on which pending pods "fit".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpcomingNodes {
    /// Node group id.
    pub group: String,
    /// NodeGroupTargetSize answer of the loop.
    pub target: i32,
    /// Registered Ready nodes (not Deleted).
    pub ready: usize,
    /// Registered NotReady nodes past their startup time (not Deleted).
    pub unready: usize,
    /// Instances without a node for longer than the provision time.
    pub long_unregistered: usize,
    /// Registered nodes counted Deleted (tainted ToBeDeleted), outside the subtraction.
    pub deleted: usize,
    /// The upcoming nodes upstream computes (never below 0).
    pub upcoming: i32,
    /// The increase of the group's scale-up request, if it has one.
    pub requested: Option<i32>,
    /// Whether they are injected into the snapshot as template copies, so pending pods fit
    /// on them: up to 1.35 always; from 1.36 only for a group with a scale-up request and no
    /// backoff; never for a group without a node template.
    pub counted: bool,
}

impl UpcomingNodes {
    /// Upcoming nodes no scale-up request of the autoscaler accounts for (e.g. a target the
    /// provider keeps above the nodes it still has).
    pub fn phantom(&self) -> i32 {
        (self.upcoming - self.requested.unwrap_or(0)).max(0)
    }
}

impl fmt::Display for UpcomingNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} upcoming in {} (target {} - {} ready - {} unready - {} long unregistered; {} deleted",
            self.upcoming,
            self.group,
            self.target,
            self.ready,
            self.unready,
            self.long_unregistered,
            self.deleted
        )?;
        if let Some(r) = self.requested {
            write!(f, "; scale-up request +{r}")?;
        }
        let phantom = self.phantom();
        if phantom > 0 {
            write!(f, "; {phantom} phantom")?;
        }
        f.write_str(if self.counted { ")" } else { "; not counted)" })
    }
}

/// Why scale-down removes a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleDownReason {
    /// Ready but not needed for longer than the unneeded time.
    Unneeded,
    /// NotReady for longer than the unready time.
    Unready,
}

/// A node removed by scale-down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedNode {
    /// Node name.
    pub name: String,
    /// Node providerID.
    pub provider_id: String,
    /// Why.
    pub reason: ScaleDownReason,
}

/// A decision of the loop, with its reason.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Scale a group up.
    ScaleUp {
        /// Node group id.
        group: String,
        /// Nodes requested.
        delta: i32,
        /// Pending nodes' worth of pods.
        pending: u32,
        /// Nodes already on the way.
        upcoming: u32,
    },
    /// Pending pods, but no scale-up.
    NoScaleUp {
        /// Why.
        reason: String,
    },
    /// A pending pod does not fit a group's node template, so it cannot make that group scale.
    PodDoesNotFit {
        /// Pod name.
        pod: String,
        /// Node group id.
        group: String,
        /// Every check it fails against the template (resources, selector, taints).
        reason: String,
    },
    /// A scale-up finished: every requested node is there.
    ScaleUpCompleted {
        /// Node group id.
        group: String,
    },
    /// A scale-up did not finish within the provision time; its capacity is given back.
    ScaleUpTimedOut {
        /// Node group id.
        group: String,
        /// Nodes requested and still missing.
        increase: i32,
    },
    /// A group is backed off after a failure.
    BackOff {
        /// Node group id.
        group: String,
        /// Error class (1 OutOfResources, 99 Other).
        error_class: i32,
        /// Error code (`cloudProviderError`, `timeout`, or the instance's code).
        error_code: String,
        /// Error message.
        message: String,
        /// For how long.
        duration: Duration,
    },
    /// Delete instances that never registered, with fake nodes.
    DeleteUnregistered {
        /// Node group id (from NodeGroupForNode on the fake node).
        group: String,
        /// Instance ids.
        instances: Vec<String>,
    },
    /// An unregistered instance past the provision time is kept.
    KeepUnregistered {
        /// Instance id.
        instance: String,
        /// Why.
        reason: String,
    },
    /// Delete instances whose creation failed, with fake nodes.
    DeleteCreateErrors {
        /// Node group id.
        group: String,
        /// Instance ids.
        instances: Vec<String>,
    },
    /// Give back target size no instance stands for.
    FixNodeGroupSize {
        /// Node group id.
        group: String,
        /// Registered nodes.
        registered: i32,
        /// Target size.
        target: i32,
        /// Negative delta sent.
        delta: i32,
    },
    /// Instances whose creation failed were seen while their group was not scaling up
    /// (`IsNodeGroupScalingUp`): no backoff, nothing taken off a scale-up request.
    FailedCreationsNotCounted {
        /// Node group id.
        group: String,
        /// Their error code.
        error_code: String,
        /// How many were seen failed for the first time.
        instances: u32,
    },
    /// A node became a scale-down candidate; its timer starts.
    NodeUnneeded {
        /// Node name.
        node: String,
        /// Why.
        reason: ScaleDownReason,
    },
    /// Remove nodes.
    ScaleDown {
        /// Node group id.
        group: String,
        /// The nodes.
        nodes: Vec<RemovedNode>,
    },
    /// A scale-down deletion failed: the node is untainted and stays (the next loop may
    /// pick it again; with per-group delays its group waits the delay after failure).
    ScaleDownFailed {
        /// Node group id.
        group: String,
        /// Node name.
        node: String,
        /// What failed (NodeGroupGetOptions or NodeGroupDeleteNodes, with the error).
        error: String,
    },
    /// A node due for removal is kept.
    ScaleDownBlocked {
        /// Node name.
        node: String,
        /// Why.
        reason: String,
    },
    /// No scale-down yet after a scale-up or a failed deletion.
    ScaleDownCooldown {
        /// Time left.
        remaining: Duration,
    },
    /// Too many unready nodes: the loop stops before any scaling.
    ClusterUnhealthy {
        /// Unready nodes.
        unready: usize,
        /// All nodes.
        total: usize,
    },
    /// The rest of the loop is skipped.
    SkipRestOfLoop {
        /// Why.
        reason: String,
    },
    /// A new autoscaler process, in its first loop (`cleanUpIfRequired`), removed the
    /// ToBeDeleted taint from these nodes, left by an earlier process: they are schedulable
    /// and no longer counted Deleted. Only nodes NodeGroupForNode placed in a group are
    /// cleaned.
    ToBeDeletedTaintsCleaned {
        /// Node names.
        nodes: Vec<String>,
    },
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::ScaleUp {
                group,
                delta,
                pending,
                upcoming,
            } => write!(
                f,
                "scale up {group} by {delta} ({pending} pending, {upcoming} upcoming)"
            ),
            Decision::NoScaleUp { reason } => write!(f, "no scale-up: {reason}"),
            Decision::PodDoesNotFit { pod, group, reason } => {
                write!(
                    f,
                    "pod {pod} does not fit the template of {group}: {reason}"
                )
            }
            Decision::ScaleUpCompleted { group } => write!(f, "scale-up of {group} complete"),
            Decision::ScaleUpTimedOut { group, increase } => {
                write!(f, "scale-up of {group} by {increase} timed out")
            }
            Decision::BackOff {
                group,
                error_class,
                error_code,
                message,
                duration,
            } => write!(
                f,
                "back off {group} for {} (class {error_class}, {error_code}: {message})",
                secs(*duration)
            ),
            Decision::DeleteUnregistered { group, instances } => {
                write!(f, "delete unregistered {group} [{}]", instances.join(", "))
            }
            Decision::KeepUnregistered { instance, reason } => {
                write!(f, "keep unregistered {instance}: {reason}")
            }
            Decision::DeleteCreateErrors { group, instances } => {
                write!(
                    f,
                    "delete failed instances {group} [{}]",
                    instances.join(", ")
                )
            }
            Decision::FixNodeGroupSize {
                group,
                registered,
                target,
                delta,
            } => write!(
                f,
                "fix size of {group}: {registered} registered, target {target}, delta {delta}"
            ),
            Decision::FailedCreationsNotCounted {
                group,
                error_code,
                instances,
            } => write!(
                f,
                "{instances} failed creation(s) in {group} ({error_code}) while it is not scaling up: no backoff"
            ),
            Decision::NodeUnneeded { node, reason } => write!(f, "{node} is {reason:?}"),
            Decision::ScaleDown { group, nodes } => {
                let list: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("{} ({:?})", n.name, n.reason))
                    .collect();
                write!(f, "scale down {group} [{}]", list.join(", "))
            }
            Decision::ScaleDownFailed { group, node, error } => {
                write!(f, "deleting {node} from {group} failed: {error}")
            }
            Decision::ScaleDownBlocked { node, reason } => write!(f, "keep {node}: {reason}"),
            Decision::ScaleDownCooldown { remaining } => {
                write!(f, "scale-down cooling down ({} left)", secs(*remaining))
            }
            Decision::ClusterUnhealthy { unready, total } => {
                write!(f, "cluster unhealthy: {unready} of {total} nodes unready")
            }
            Decision::SkipRestOfLoop { reason } => write!(f, "rest of loop skipped: {reason}"),
            Decision::ToBeDeletedTaintsCleaned { nodes } => {
                write!(f, "clean ToBeDeleted taints from [{}]", nodes.join(", "))
            }
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// A loop began.
    LoopStarted,
    /// An RPC of the loop.
    Call(Call),
    /// An RPC sent by a background task (scale-down deletions, the NodeGroupNodes cache
    /// refresh), recorded when a loop collects it; its `loop_no` is the loop it was sent
    /// during or after.
    BackgroundCall(Call),
    /// Something observed.
    Observed(Observation),
    /// Something decided.
    Decided(Decision),
    /// The loop stopped early.
    LoopAborted {
        /// Why.
        reason: String,
    },
    /// The loop ended.
    LoopFinished {
        /// How long it took.
        duration: Duration,
    },
    /// The autoscaler process was restarted
    /// ([`MockAutoscaler::restart`](super::MockAutoscaler::restart)): the old one exited
    /// (Cleanup with the status configmap), the new one starts with empty caches and state;
    /// its `loop_no` is the last loop of the old process.
    Restarted,
}

/// One entry of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Loop number (1-based).
    pub loop_no: u64,
    /// Time since the autoscaler was created.
    pub at: Duration,
    /// What happened.
    pub kind: EventKind,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:>9}] loop {:>3}  ", secs(self.at), self.loop_no)?;
        match &self.kind {
            EventKind::LoopStarted => f.write_str("start"),
            EventKind::Call(call) => write!(f, "call {call}"),
            EventKind::BackgroundCall(call) => write!(f, "call {call} [background]"),
            EventKind::Observed(o) => match o {
                Observation::Nodes {
                    ready,
                    not_ready,
                    unmanaged,
                } => write!(
                    f,
                    "saw nodes {ready} Ready/{not_ready} NotReady, {unmanaged} unmanaged"
                ),
                Observation::Group(g) => write!(
                    f,
                    "saw group {} target {} ({}..{}), instances {}, nodes {} ready {} unready {} starting {} deleting, {} unregistered ({} long){}{}",
                    g.id,
                    g.target,
                    g.min_size,
                    g.max_size,
                    g.instances,
                    g.ready,
                    g.unready,
                    g.not_started,
                    g.being_deleted,
                    g.unregistered + g.long_unregistered,
                    g.long_unregistered,
                    if g.backed_off { ", backed off" } else { "" },
                    if g.scale_up_in_progress {
                        ", scaling up"
                    } else {
                        ""
                    },
                ),
                Observation::Demand { needed, pending } => {
                    write!(f, "demand {needed} nodes, {pending} pending")
                }
                Observation::NodeTemplate { group, template } => match template {
                    Ok(t) => write!(f, "template of {group} {t}"),
                    Err(why) => write!(f, "no template for {group}: {why}"),
                },
                Observation::PodsScheduled { node, pods } => {
                    write!(f, "scheduled on {node}: {}", pods.join(", "))
                }
                Observation::PendingPods { pods } => {
                    let list: Vec<String> = pods.iter().map(ToString::to_string).collect();
                    write!(f, "{} pending pod(s): {}", pods.len(), list.join(", "))
                }
                Observation::GpuUnready { nodes } => {
                    write!(f, "GPU not ready yet on {}", nodes.join(", "))
                }
                Observation::Upcoming(u) => write!(f, "saw {u}"),
            },
            EventKind::Decided(d) => write!(f, "decide {d}"),
            EventKind::LoopAborted { reason } => write!(f, "ABORTED: {reason}"),
            EventKind::LoopFinished { duration } => write!(f, "end ({})", ms(*duration)),
            EventKind::Restarted => f.write_str("RESTARTED: a new autoscaler process"),
        }
    }
}

/// One loop in brief: what the demo prints per loop.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopSummary {
    /// Loop number (1-based).
    pub loop_no: u64,
    /// When it began, since the autoscaler was created.
    pub at: Duration,
    /// How long it took.
    pub duration: Duration,
    /// Node groups as observed (empty if the loop stopped before).
    pub groups: Vec<GroupObservation>,
    /// Managed Ready nodes.
    pub ready: usize,
    /// Managed NotReady nodes.
    pub not_ready: usize,
    /// Nodes no group claims.
    pub unmanaged: usize,
    /// Every call of the loop, then the background calls this loop collected.
    pub calls: Vec<Call>,
    /// Every decision of the loop.
    pub decisions: Vec<Decision>,
    /// Why the loop stopped early, if it did.
    pub aborted: Option<String>,
}

impl LoopSummary {
    pub(crate) fn from_events(
        loop_no: u64,
        at: Duration,
        duration: Duration,
        events: &[Event],
    ) -> Self {
        let mut s = Self {
            loop_no,
            at,
            duration,
            groups: Vec::new(),
            ready: 0,
            not_ready: 0,
            unmanaged: 0,
            calls: Vec::new(),
            decisions: Vec::new(),
            aborted: None,
        };
        let mut background = Vec::new();
        for e in events {
            match &e.kind {
                EventKind::Call(c) if e.loop_no == loop_no => s.calls.push(c.clone()),
                EventKind::BackgroundCall(c) => background.push(c.clone()),
                EventKind::Decided(d) => s.decisions.push(d.clone()),
                EventKind::Observed(Observation::Group(g)) => s.groups.push(g.clone()),
                EventKind::Observed(Observation::Nodes {
                    ready,
                    not_ready,
                    unmanaged,
                }) => {
                    s.ready = *ready;
                    s.not_ready = *not_ready;
                    s.unmanaged = *unmanaged;
                }
                EventKind::LoopAborted { reason } => s.aborted = Some(reason.clone()),
                _ => {}
            }
        }
        s.calls.extend(background);
        s
    }

    /// Target size of `group` seen in this loop.
    pub fn target(&self, group: &str) -> Option<i32> {
        self.groups.iter().find(|g| g.id == group).map(|g| g.target)
    }

    /// Number of calls of `rpc` in this loop.
    pub fn count(&self, rpc: Rpc) -> usize {
        self.calls.iter().filter(|c| c.rpc() == rpc).count()
    }

    /// `fixNodeGroupSize` acted in this loop (asked NodeGroupDecreaseTargetSize for some
    /// group), which ends the loop, or aborts it if the call failed.
    pub fn fixed_node_group_size(&self) -> bool {
        self.decisions
            .iter()
            .any(|d| matches!(d, Decision::FixNodeGroupSize { .. }))
    }
}

impl fmt::Display for LoopSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loop {} (+{}): ", self.loop_no, secs(self.at))?;
        if let Some(reason) = &self.aborted {
            write!(f, "ABORTED ({reason}); ")?;
        }
        if !self.groups.is_empty() {
            match self.groups.as_slice() {
                [g] => write!(f, "target {}, ", g.target)?,
                groups => {
                    let t: Vec<String> = groups
                        .iter()
                        .map(|g| format!("{}={}", g.id, g.target))
                        .collect();
                    write!(f, "target {}, ", t.join(" "))?;
                }
            }
            write!(f, "nodes {} Ready/{} NotReady", self.ready, self.not_ready)?;
            if self.unmanaged > 0 {
                write!(f, " (+{} unmanaged)", self.unmanaged)?;
            }
            let mut counts = InstanceCounts::default();
            for g in &self.groups {
                counts.add(&g.instances);
            }
            write!(f, ", instances {counts}")?;
            if self.groups.iter().any(|g| g.backed_off) {
                f.write_str(", backed off")?;
            }
            f.write_str(", ")?;
        }
        f.write_str("calls: ")?;
        // Reads are counted; mutations are listed one by one with their outcome.
        let mut reads: BTreeMap<Rpc, (usize, usize)> = BTreeMap::new();
        let mut parts: Vec<String> = Vec::new();
        for c in &self.calls {
            if c.rpc().is_mutation() {
                continue;
            }
            let entry = reads.entry(c.rpc()).or_default();
            entry.0 += 1;
            if !c.is_ok() {
                entry.1 += 1;
            }
        }
        for (rpc, (n, failed)) in &reads {
            let mut p = if *n == 1 {
                rpc.name().to_owned()
            } else {
                format!("{rpc}×{n}")
            };
            if *failed > 0 {
                p.push_str(&format!(" ({failed} failed)"));
            }
            parts.push(p);
        }
        for c in self.calls.iter().filter(|c| c.rpc().is_mutation()) {
            match &c.outcome {
                Ok(_) => parts.push(format!("{} ok", c.request)),
                Err(e) => parts.push(format!("{} FAILED {:?}", c.request, e.code)),
            }
        }
        f.write_str(&parts.join(", "))?;
        let notable: Vec<String> = self
            .decisions
            .iter()
            .filter(|d| !matches!(d, Decision::NodeUnneeded { .. }))
            .map(ToString::to_string)
            .collect();
        if !notable.is_empty() {
            write!(f, "; {}", notable.join("; "))?;
        }
        Ok(())
    }
}

/// Everything the mock autoscaler recorded.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub(crate) events: Vec<Event>,
    pub(crate) loops: Vec<LoopSummary>,
}

impl Timeline {
    /// Every event, in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// One summary per finished loop.
    pub fn loops(&self) -> &[LoopSummary] {
        &self.loops
    }

    /// Every call, in the order recorded (a background call when a loop collected it).
    pub fn all_calls(&self) -> impl Iterator<Item = &Call> {
        self.events.iter().filter_map(|e| match &e.kind {
            EventKind::Call(c) | EventKind::BackgroundCall(c) => Some(c),
            _ => None,
        })
    }

    /// Every call of `rpc`, in order.
    pub fn calls(&self, rpc: Rpc) -> Vec<&Call> {
        self.all_calls().filter(|c| c.rpc() == rpc).collect()
    }

    /// Every call of loop `loop_no`.
    pub fn calls_in_loop(&self, loop_no: u64) -> Vec<&Call> {
        self.all_calls().filter(|c| c.loop_no == loop_no).collect()
    }

    /// Every failed call, but for the answers the client takes as "not implemented"
    /// ([`Call::is_not_implemented`]).
    pub fn errors(&self) -> Vec<&Call> {
        self.all_calls()
            .filter(|c| !c.is_ok() && !c.is_not_implemented())
            .collect()
    }

    /// Every decision with its loop number.
    pub fn decisions(&self) -> Vec<(u64, &Decision)> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Decided(d) => Some((e.loop_no, d)),
                _ => None,
            })
            .collect()
    }

    /// Every observation with its loop number.
    pub fn observations(&self) -> Vec<(u64, &Observation)> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Observed(o) => Some((e.loop_no, o)),
                _ => None,
            })
            .collect()
    }

    /// The last target size `group` reported through a successful NodeGroupTargetSize.
    pub fn last_target(&self, group: &str) -> Option<i32> {
        self.all_calls()
            .filter_map(|c| match (&c.request, &c.outcome) {
                (Request::NodeGroupTargetSize { id }, Ok(Reply::TargetSize(t))) if id == group => {
                    Some(*t)
                }
                _ => None,
            })
            .last()
    }

    /// The node templates (or why none) `group` had, with the loop number.
    pub fn templates(&self, group: &str) -> Vec<(u64, &Result<NodeTemplate, String>)> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Observed(Observation::NodeTemplate { group: g, template })
                    if g == group =>
                {
                    Some((e.loop_no, template))
                }
                _ => None,
            })
            .collect()
    }

    /// What `GetUpcomingNodes` found for `group`, per loop that got that far.
    pub fn upcoming_nodes(&self, group: &str) -> Vec<(u64, &UpcomingNodes)> {
        self.observations()
            .into_iter()
            .filter_map(|(n, o)| match o {
                Observation::Upcoming(u) if u.group == group => Some((n, u)),
                _ => None,
            })
            .collect()
    }

    /// Every group's upcoming nodes with a phantom ([`UpcomingNodes::phantom`]): more
    /// upcoming nodes than the group's scale-up request accounts for, with the loop number.
    pub fn phantom_upcoming_nodes(&self) -> Vec<(u64, &UpcomingNodes)> {
        self.observations()
            .into_iter()
            .filter_map(|(n, o)| match o {
                Observation::Upcoming(u) if u.phantom() > 0 => Some((n, u)),
                _ => None,
            })
            .collect()
    }

    /// The loops in which `fixNodeGroupSize` acted ([`LoopSummary::fixed_node_group_size`]).
    pub fn size_fix_loops(&self) -> Vec<u64> {
        self.loops
            .iter()
            .filter(|l| l.fixed_node_group_size())
            .map(|l| l.loop_no)
            .collect()
    }

    /// The longest run of consecutive loops in which `fixNodeGroupSize` acted: above 1, a
    /// NodeGroupDecreaseTargetSize that left the target where it was (the incorrect size
    /// keeps its first observation, so it is due again at once), each such loop skipping
    /// scale-up and scale-down.
    pub fn longest_size_fix_streak(&self) -> usize {
        let mut longest = 0;
        let mut run = 0;
        for l in &self.loops {
            if l.fixed_node_group_size() {
                run += 1;
                longest = longest.max(run);
            } else {
                run = 0;
            }
        }
        longest
    }

    /// The loop numbers after which the autoscaler process was restarted.
    pub fn restarts(&self) -> Vec<u64> {
        self.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Restarted))
            .map(|e| e.loop_no)
            .collect()
    }

    /// Loops that stopped early, with the reason.
    pub fn aborted_loops(&self) -> Vec<(u64, &str)> {
        self.loops
            .iter()
            .filter_map(|l| l.aborted.as_deref().map(|r| (l.loop_no, r)))
            .collect()
    }
}

impl fmt::Display for Timeline {
    /// The whole timeline, one event per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_names_round_trip() {
        for rpc in Rpc::ALL {
            assert_eq!(rpc.name().parse::<Rpc>(), Ok(rpc));
        }
        assert_eq!("GPULabel".parse::<Rpc>(), Ok(Rpc::GpuLabel));
        assert!(
            "PricingNodePrice"
                .parse::<Rpc>()
                .unwrap_err()
                .contains("PricingNodePrice")
        );
    }

    #[test]
    fn instance_counts_follow_the_client_rules() {
        let with = |state: i32, code: &str| pb::Instance {
            id: "i".into(),
            status: Some(pb::InstanceStatus {
                instance_state: state,
                error_info: Some(pb::InstanceErrorInfo {
                    error_code: code.into(),
                    error_message: "m".into(),
                    instance_error_class: 99,
                }),
            }),
        };
        let counts = InstanceCounts::of(&[
            with(1, ""),
            with(2, ""),
            with(2, "QUOTA"),
            with(3, ""),
            pb::Instance {
                id: "n".into(),
                status: None,
            },
        ]);
        // An errorInfo with an empty code is no error.
        assert_eq!(
            counts,
            InstanceCounts {
                running: 1,
                creating: 1,
                deleting: 1,
                unspecified: 1,
                errored: 1
            }
        );
        assert_eq!(
            counts.to_string(),
            "1 running 1 creating 1 deleting 1 failed 1 unknown"
        );
    }
}
