//! What the mock autoscaler asked and got: the externalgrpc RPCs ([`Rpc`]), each request and
//! successful answer, the failures, and one [`Call`] per RPC with its latency and the wire
//! generation spoken. The RPCs are those of the externalgrpc service
//! (`cloudprovider/externalgrpc/protos/externalgrpc.proto`), as the client in
//! `cloudprovider/externalgrpc/externalgrpc_cloud_provider.go` and
//! `externalgrpc_node_group.go` issues them.

use std::fmt;
use std::time::Duration;

use super::{InstanceCounts, ms};
use crate::autoscaler::wire::WireGeneration;
use crate::pb;

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
}
