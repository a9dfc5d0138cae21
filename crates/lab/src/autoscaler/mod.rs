//! A mock cluster-autoscaler: a gRPC client that replays the real autoscaler's use of the
//! externalgrpc protocol against a provider, for tests and the demo.
//!
//! It follows `cluster-autoscaler/` at the tags cluster-autoscaler-1.33.0 and 1.35.0 (1.36.0
//! where it differs, chosen with [`AutoscalerConfig::release`]); each imitated behaviour names
//! its upstream file and function in a comment beside the code.
//!
//! The client speaks the externalgrpc message shapes of that release, its [`WireGeneration`]
//! ([`AutoscalerConfig::wire_generation`]; [`AutoscalerConfig::wire`] overrides it, e.g. for
//! 1.34.2, which a minor number cannot name), after `externalgrpc_node_group.go` at the
//! release's tag: `NodeGroupTemplateNodeInfo` read from field 1 up to 1.34.1, from field 2
//! (else 1) in 1.34.2, from field 2 from 1.35; `NodeGroupGetOptions` sent with the flags as
//! `defaults` and read back in the fields the release has (durations as meta.v1.Duration in
//! 3, 4, and 5 from 1.29, up to 1.34.x; as google.protobuf.Duration in 8-10 from 1.34.2; the
//! fields a release does not read are 0 for it). 1.28 takes `Unimplemented` from both RPCs for
//! an error. An answer the release would crash on ends the loop at that call, reported
//! aborted ("the autoscaler process crashed: …"): up to 1.34.1 an options answer missing one
//! of the durations in 3-5 it dereferences (`NodeGroup.GetOptions`; in 1.34.2 only when 8-10
//! miss too), and for every release an OK template answer without the field it reads (the
//! template pass dereferences the nil NodeInfo). A crash in a background deletion ends that
//! deletion, and the next loop is reported aborted before it calls anything; so does, up to
//! 1.29, a scale-down deletion whose NodeGroupForNode fails or answers "" (a nil node group in
//! `delete_in_batch.go`; from 1.30 that deletion fails). The real process restarts with empty
//! state; the mock keeps its own unless the test calls [`MockAutoscaler::restart`]. Apart from
//! the wire and the points named here, every release runs the 1.33 / 1.35 core described
//! here.
//!
//! Before the first loop (`ClusterStateRegistry.Start`) the NodeGroupNodes cache is filled:
//! `NodeGroups`, then `NodeGroupNodes` per group, before any `Refresh`. Each
//! [`MockAutoscaler::run_once`] is then one loop of the real `StaticAutoscaler.RunOnce`:
//!
//! 1. list the Kubernetes nodes from a [`NodeSource`] (the simulator's kubelet emulation through
//!    [`SimNodeSource`], or a [`StaticNodeSource`] a test edits); the first loop asks
//!    `NodeGroupForNode` for each (`cleanUpIfRequired`); `GPULabel` for every Ready node until
//!    an answer is cached (a Ready node with that label and no GPU allocatable counts as
//!    NotReady); the results of background work are collected (below);
//! 2. `Refresh` (an error aborts the loop); `NodeGroups` (cached until the next Refresh);
//!    the template pass: `NodeGroupForNode` for every node, then a node template per group
//!    (below); cluster state: `NodeGroupTargetSize` per group (an error aborts the loop),
//!    the instances per group from the cache (`node_instances_cache.go`: refreshed every
//!    [`AutoscalerConfig::instances_cache_refresh_interval`] in the background, listed again
//!    every loop for a group scaling up and after deleting failed or unregistered instances;
//!    a failing listing of a missing entry aborts the loop), readiness (`NodeGroupForNode` per
//!    node; from 1.35 twice more, with `NodeGroupGetOptions` per autoscaled node for its
//!    startup time), and per instance without a node its fake node's group and
//!    `NodeGroupGetOptions` (max provision time). Like the real client, NodeGroupForNode
//!    answers are cached by name+providerID until the next Refresh, except answers with id "";
//! 3. decisions, in the real order: instances without a node past their group's max
//!    provision time are deleted with fake nodes (name = providerID = instance id), down to
//!    the group's min; instances Creating with an errorInfo are deleted with fake nodes every
//!    loop, and back the group off only while it is scaling up; a target that registered
//!    nodes stay below for the provision time is lowered with `NodeGroupDecreaseTargetSize`
//!    (its error, or a failing `NodeGroupGetOptions`, aborts the loop; when it acts, the rest
//!    of the loop is skipped, and an OK answer that leaves the target where it was keeps the
//!    mismatch's first observation, so it acts again every loop:
//!    [`Timeline::longest_size_fix_streak`]); a scale-up not fulfilled in time backs the group
//!    off (and from 1.36 is reverted with `NodeGroupDecreaseTargetSize`); pending demand not
//!    covered by upcoming nodes scales the first group that is neither backed off nor at max
//!    and has a node template that the pending pods fit (`GetAvailableGPUTypes` once, a
//!    failed `NodeGroupIncreaseSize` backs it off, 5 min doubling to 30 min); scale-down
//!    (below). Upcoming nodes are target − (Ready + Unready + LongUnregistered) per group,
//!    recorded every loop ([`Observation::Upcoming`], [`Timeline::phantom_upcoming_nodes`]);
//!    up to 1.35 every group's count, from 1.36 only that of a group with a scale-up request
//!    and no backoff, become template copies that pending pods fit on.
//!
//! Scale-down follows `core/scaledown/`: Ready nodes beyond the demand and NotReady nodes
//! become unneeded (candidates also cost two `NodeGroupGetOptions` each, the removable ones
//! one more); after the group's unneeded / unready time they are tainted and deleted as real
//! nodes, never below the min of the group NodeGroupForNode returned (deletions in progress
//! counted), never nodes with group id "", within `--max-scale-down-parallelism` and
//! `--max-drain-parallelism` (a node with [`KubeNode::movable_pods`] is drained first). The
//! deletions run in background tasks, as the real goroutines do: after
//! `--node-delete-delay-after-taint`, `NodeGroupGetOptions` then one `NodeGroupDeleteNodes` per
//! node, all at once (`--node-deletion-batcher-interval` 0, the default; with an interval, one
//! call per group per interval). The loop does not wait for them; the next loop collects their
//! outcome. Each deletion asks `NodeGroupForNode` first (through the client's cache, empty
//! after a Refresh) and deletes from the group it names. A failed call untaints its node, which
//! the next loop tries again (its unneeded time kept); only with
//! [`AutoscalerConfig::scale_down_delay_type_local`] does the group wait
//! `--scale-down-delay-after-failure` first. An OK call keeps the ToBeDeleted taint: while the
//! node is listed it is unschedulable, no template, and counted Deleted by cluster state (the
//! client has no HasInstance), so a target that still counts it makes a phantom upcoming
//! node. A node still there after the max deletion time (5 min) is deleted again.
//! [`MockAutoscaler::settle_deletions`] waits for the deletions in flight;
//! [`MockAutoscaler::exit`] is the autoscaler's exit: `Cleanup` (with
//! `--write-status-configmap`, the default) and the background work stopped;
//! [`MockAutoscaler::restart`] exits and starts a new process (fresh caches and state, the
//! Kubernetes side kept), whose first loop removes the ToBeDeleted taint from every node
//! NodeGroupForNode places in a group ([`Decision::ToBeDeletedTaintsCleaned`]).
//!
//! Every RPC runs under [`AutoscalerConfig::call_deadline`] (5 s by default), sent as
//! `grpc-timeout` and enforced locally: a late answer is a `DeadlineExceeded` failure, as in the
//! real client. Everything lands in a [`Timeline`]: calls with request, outcome and latency
//! (background calls as [`EventKind::BackgroundCall`] when a loop collects them),
//! observations, decisions with reasons, and one [`LoopSummary`] per loop whose `Display` is the
//! demo's progress line. From 1.29, `Unimplemented` from `NodeGroupTemplateNodeInfo` and
//! `NodeGroupGetOptions` is no error ([`Call::is_not_implemented`]): real nodes, resp. the
//! flags, apply. Each `MockAutoscaler` owns all its state, so several can drive the same
//! provider at once.
//!
//! Node templates follow `MixedTemplateNodeInfoProvider`: a group's template is its first
//! Ready node not being deleted (remembered, so a group whose nodes all go NotReady keeps it
//! while this `MockAutoscaler` lives), else the remembered one, else
//! `NodeGroupTemplateNodeInfo` (the field the release reads decoded as a Kubernetes-protobuf
//! `v1.Node`; answers cached per group until the next Refresh, errors never cached), else a
//! NotReady node of the group. `Unimplemented` leaves the group to that last resort (from
//! 1.29), and a group with no template is no scale-up candidate; any other error, or bytes
//! that are no Node, aborts the loop, as the real template pass fails the whole `RunOnce`. Templates are built every loop,
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
//! it, and a NotReady node that was never Ready is "starting" (upcoming) for its startup time.
//!
//! What the real autoscaler does that this one does not:
//! - the scheduler beyond requests, selectors and taints (affinity, spread, DaemonSet pods,
//!   extended resources), utilization (the options' utilization thresholds and
//!   `ignoreDaemonSetsUtilization` are asked for but not used), and pod eviction itself (a
//!   drain is [`AutoscalerConfig::drain_time`]);
//! - `zeroOrMaxNodeScaling` (atomic groups: batched deletions, delete-all on failure, atomic
//!   scale-up); pricing calls; `GetAvailableGPUTypes` from the background deletions;
//! - the one-minute Ready stability a template node needs, the expander (the first eligible
//!   group wins), balancing similar groups, aborting the loop on a `NodeGroupForNode` error in
//!   the template pass;
//! - `--force-delete-unregistered-nodes` / `--force-delete-failed-nodes` (the client has no
//!   ForceDeleteNodes anyway), `--enforce-node-group-min-size`, node-group auto-provisioning;
//! - the cores of releases before 1.33 beyond their wire and the nil node group of 1.28 and
//!   1.29 deletions (they run the 1.33 loop), and the restart after a crash (the mock goes on
//!   with its state unless the test calls [`MockAutoscaler::restart`]);
//! - the `Suspended` node condition (1.36 readiness) and scale-down requests in the acceptable
//!   range;
//! - the first NodeGroupNodes cache fill runs concurrently with the first loop in the real
//!   autoscaler; here the first loop waits for it. The NodeGroupNodes cache entries older
//!   than 5 minutes only produce a warning upstream, so nothing here either.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cks_lab::autoscaler::{AutoscalerConfig, MockAutoscaler, Rpc, SimNodeSource};
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
mod wire;

#[cfg(test)]
mod tests;

pub use config::{AutoscalerConfig, NEWEST_RELEASE};
pub use engine::MockAutoscaler;
pub use nodes::{
    FAKE_NODE_CREATE_ERROR, FAKE_NODE_REASON_ANNOTATION, FAKE_NODE_UNREGISTERED, KubeNode,
    NodeListFuture, NodeSource, SimNodeSource, StaticNodeSource, fake_reason,
};
pub use pods::{
    NodeTaint, NodeTemplate, PodSpec, Resources, TemplateSource, Toleration, check_fit,
    quantity_ceil,
};
pub use timeline::{
    Call, Decision, Event, EventKind, GroupObservation, InstanceCounts, LoopSummary, Observation,
    RemovedNode, Reply, Request, Rpc, RpcError, ScaleDownReason, Timeline, UpcomingNodes,
};
pub use wire::{NodeGroupOptions, OptionsAnswer, WireGeneration};
