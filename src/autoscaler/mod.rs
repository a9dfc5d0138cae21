//! A mock cluster-autoscaler: a gRPC client that replays the real autoscaler's use of the
//! externalgrpc protocol against a provider, for tests and the demo.
//!
//! Each [`MockAutoscaler::run_once`] is one loop of the real `StaticAutoscaler.RunOnce`:
//!
//! 1. list the Kubernetes nodes from a [`NodeSource`] (the simulator's kubelet emulation through
//!    [`SimNodeSource`], or a [`StaticNodeSource`] a test edits);
//! 2. `Refresh` (an error aborts the loop); `NodeGroups` (cached until the next Refresh);
//!    the template pass: `NodeGroupForNode` for every node, then a node template per group
//!    (below); `NodeGroupTargetSize` and `NodeGroupNodes` per group (an error aborts the
//!    loop); then cluster state: `NodeGroupForNode` twice per node and once
//!    per instance without a node (its fake node decides which group counts it). Like the real
//!    client, NodeGroupForNode answers are cached by name+providerID until the next Refresh,
//!    except answers with id "": a managed node costs one RPC per loop, a control-plane node
//!    four (template pass, readiness twice, scale-down pre-filter);
//! 3. decisions, in the real order: instances without a node past the max provision time are
//!    deleted with fake nodes (name = providerID = instance id), down to the group's min;
//!    instances Creating with an errorInfo are deleted with fake nodes and back the group off;
//!    a target that registered nodes stay below for the provision time is lowered with
//!    `NodeGroupDecreaseTargetSize`; pending demand not covered by upcoming nodes scales the
//!    first group that is neither backed off nor at max and has a node template that the
//!    pending pods fit (a failed `NodeGroupIncreaseSize` backs it off, 5 min doubling to
//!    30 min); Ready nodes beyond the demand and NotReady
//!    nodes are deleted as real nodes after the unneeded / unready time, never below the min of
//!    the group NodeGroupForNode returned, never nodes with group id "".
//!
//! Every RPC runs under [`AutoscalerConfig::call_deadline`] (5 s by default), sent as
//! `grpc-timeout` and enforced locally: a late answer is a `DeadlineExceeded` failure, as in the
//! real client. Everything lands in a [`Timeline`]: calls with request, outcome and latency,
//! observations, decisions with reasons, and one [`LoopSummary`] per loop whose `Display` is the
//! demo's progress line. Each `MockAutoscaler` owns all its state, so several can drive the same
//! provider at once.
//!
//! Node templates follow `MixedTemplateNodeInfoProvider`: a group's template is its first
//! Ready node not being deleted (remembered, so a group whose nodes all go NotReady keeps it
//! while this `MockAutoscaler` lives), else the remembered one, else
//! `NodeGroupTemplateNodeInfo` (its `nodeBytes` decoded as a Kubernetes-protobuf `v1.Node`;
//! answers cached per group until the next Refresh, errors never cached), else a NotReady node
//! of the group. `Unimplemented` leaves the group to that last resort, and a group with no
//! template is no scale-up candidate; any other error, or bytes that are no Node, aborts the
//! loop, as the real template pass fails the whole `RunOnce`. Templates are built every loop,
//! so a group with no node costs one `NodeGroupTemplateNodeInfo` per loop.
//!
//! The workload is either a node count ([`MockAutoscaler::set_demand`],
//! [`MockAutoscaler::set_needed_nodes`]: any template holds a node's worth) or pending pods
//! ([`MockAutoscaler::set_pending_pods`]): cpu and memory requests, node selector and
//! tolerations, checked against the template's allocatable (cpu, memory, pods), labels and
//! `NoSchedule`/`NoExecute` taints; the pods that fit are packed first-fit on template nodes
//! to size the increase, and each node that becomes Ready takes the pods that fit it (see
//! [`PodSpec`], [`NodeTemplate`]).
//!
//! Node timing uses the mock's own clock: a node's age counts from when the mock first listed
//! it, and a NotReady node that was never Ready is "starting" (upcoming) for
//! [`AutoscalerConfig::max_node_startup_time`].
//!
//! What the real autoscaler does that this one does not: `NodeGroupGetOptions`, `GPULabel`
//! and pricing calls, the scheduler beyond requests, selectors and taints (affinity, spread,
//! DaemonSet pods, extended resources), the one-minute Ready stability a template node needs,
//! the expander (the first eligible group wins), aborting the loop on a `NodeGroupForNode`
//! error in the template pass, and scale-down drain.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cks_autoscaler_provider::autoscaler::{AutoscalerConfig, MockAutoscaler, Rpc, SimNodeSource};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let nodes = SimNodeSource::new("http://127.0.0.1:8080/client/api")?.for_cluster("cluster-uuid");
//! // Autoscaler timers 600 times faster: 15 min provision time = 1.5 s, loops every ~17 ms.
//! let mut config = AutoscalerConfig::time_scaled(600);
//! config.loop_interval = Duration::from_millis(200);
//! let mut ca = MockAutoscaler::connect("127.0.0.1:8086", Arc::new(nodes), config).await?;
//!
//! ca.set_demand(2); // two nodes' worth of pending pods
//! let summary = ca.run_once().await;
//! println!("{summary}"); // loop 1 (+0.000s): target 5, nodes 3 Ready/0 NotReady, ...
//! assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);
//!
//! // Keep looping until the new nodes are Ready.
//! ca.run_until(Duration::from_secs(30), |ca| ca.last_loop().is_some_and(|l| l.ready == 5)).await?;
//! assert!(ca.errors().is_empty(), "{}", ca.timeline());
//! # Ok(()) }
//! ```

mod background;
mod calls;
mod client;
mod config;
mod engine;
mod nodes;
mod pods;
mod scaledown;
mod timeline;

#[cfg(test)]
mod tests;

pub use config::{AutoscalerConfig, NEWEST_RELEASE};
pub use engine::MockAutoscaler;
pub use nodes::{
    FAKE_NODE_CREATE_ERROR, FAKE_NODE_REASON_ANNOTATION, FAKE_NODE_UNREGISTERED, KubeNode,
    NodeListFuture, NodeSource, SimNodeSource, StaticNodeSource,
};
pub use pods::{
    NodeTaint, NodeTemplate, PodSpec, Resources, TemplateSource, Toleration, check_fit,
    quantity_ceil,
};
pub use timeline::{
    Call, Decision, Event, EventKind, GroupObservation, InstanceCounts, LoopSummary, Observation,
    RemovedNode, Reply, Request, Rpc, RpcError, ScaleDownReason, Timeline,
};
