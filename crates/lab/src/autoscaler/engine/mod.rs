//! The mock autoscaler's loop: the real `StaticAutoscaler.RunOnce` order of calls and its
//! decisions (node templates, cluster state, unregistered and failed instances, size fixes,
//! scale-up with backoff and template fit), simplified to what a cloud provider can observe.
//! Scale-down lives in `scaledown.rs`, the work done beside the loop in `background.rs`.
//!
//! Upstream references are `cluster-autoscaler/` paths at cluster-autoscaler-1.33.0 and
//! 1.35.0 (1.36.0 where it differs): `core/static_autoscaler.go` (`RunOnce`),
//! `clusterstate/clusterstate.go` (`UpdateNodes`), `core/scaleup/orchestrator/`.
//!
//! This file owns the `MockAutoscaler` itself, after `core/static_autoscaler.go`
//! (`StaticAutoscaler`, `ExitCleanUp`): what it remembers between loops (`CoreState`: the
//! workload, cluster state, backoffs, scale-up requests, scale-down timers), the view each loop
//! builds (`Snapshot`), its public API, the collection of background results, and the calls
//! the phases share (NodeGroupGetOptions, the GPU answers, `Recalculate`, the crash of the real
//! process). The phases, in `RunOnce` order, each in its own file:
//! - `run_once.rs`: the loop driver, `RunOnce` itself;
//! - `cluster_state.rs`: `ClusterStateRegistry.Start`, the node lists, and the cluster-state
//!   update (`UpdateNodes`: target sizes, the NodeGroupNodes cache, readiness, unregistered
//!   instances);
//! - `templates.rs`: the template pass (`MixedTemplateNodeInfoProvider`);
//! - `scale_requests.rs`: scale-up requests, failed creations and backoff (clusterstate);
//! - `repairs.rs`: incorrect sizes, old unregistered instances, the health check, failed
//!   creations deleted, `fixNodeGroupSize`;
//! - `demand.rs`: the workload as the scheduler would place it;
//! - `scaleup.rs`: upcoming nodes and scale-up (`core/scaleup/orchestrator/`).

mod cluster_state;
mod demand;
mod repairs;
mod run_once;
mod scale_requests;
mod scaleup;
mod templates;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::background::{Background, Done};
use super::calls::{ClientExtras, GroupOptions, cleanup_call, gpu_label_call, gpu_types_call};
use super::client::{ExternalGrpcClient, OptionsFailure, Recorder};
use super::config::AutoscalerConfig;
use super::nodes::{KubeNode, NodeSource};
use super::pods::{NodeTemplate, PodSpec, Resources};
use super::timeline::{Call, Decision, Event, EventKind, LoopSummary, Reply, RpcError, Timeline};
use crate::pb;
use cks_proto::cloud_provider_client::CloudProviderClient;

/// A cluster-autoscaler stand-in driving one externalgrpc provider. See the
/// [module docs](super) for an example.
pub struct MockAutoscaler {
    pub(super) client: ExternalGrpcClient,
    pub(super) nodes: Arc<dyn NodeSource>,
    pub(super) config: AutoscalerConfig,
    pub(super) rec: Recorder,
    pub(super) state: CoreState,
    /// GPULabel and GetAvailableGPUTypes answers, cached forever after a success.
    pub(super) extras: ClientExtras,
    pub(super) bg: Background,
    pub(super) crash: Crash,
}

/// A crash of the real autoscaler process that this mock turns into the failure of a loop
/// (see [`MockAutoscaler::crash`]).
#[derive(Debug, Default)]
pub(super) struct Crash {
    /// What the real process would have died of, until a loop reports it.
    reason: Option<String>,
    /// Ends the loop in which the crash happened, at the point it happened.
    signal: Arc<Notify>,
}

impl std::fmt::Debug for MockAutoscaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockAutoscaler")
            .field("config", &self.config)
            .field("loops", &self.rec.loop_no)
            .finish_non_exhaustive()
    }
}

/// The workload a scenario sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Demand {
    /// Nothing set: no scale-up, and every Ready node is needed.
    #[default]
    Unset,
    /// This many nodes' worth of pods beyond what runs on the Ready nodes of the next loop.
    Pending(u32),
    /// The workload needs this many nodes in total.
    Total(u32),
    /// These pods beyond what runs on the Ready nodes of the next loop; every Ready node is
    /// needed.
    Pods(PodDemand),
}

/// Pods a scenario set, and the room nodes that came after them still have.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct PodDemand {
    /// Not scheduled yet, in the order given.
    pending: Vec<PodSpec>,
    /// Cache keys of the Ready nodes of the first loop after the pods appeared: full, as for
    /// [`Demand::Pending`]. `None` until that loop.
    full: Option<HashSet<String>>,
    /// Room left on each node that came later, by cache key.
    free: HashMap<String, Resources>,
}

/// The template of every node group this loop, or why a group has none.
type Templates = HashMap<String, Result<NodeTemplate, String>>;

#[derive(Debug, Clone, Copy)]
struct Backoff {
    until: Instant,
    duration: Duration,
    last_failure: Instant,
}

/// `clusterstate.ScaleUpRequest`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ScaleUpRequest {
    increase: i32,
    expected_add_time: Instant,
    /// The group's template came from NodeGroupTemplateNodeInfo in the loop of the scale-up,
    /// so the node-group object kept in the request has it cached (up to 1.35 a timeout asks
    /// that object for it again).
    template_cached: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IncorrectSize {
    current: i32,
    expected: i32,
    first_observed: Instant,
}

/// A scale-down deletion in progress (`NodeDeletionTracker`).
#[derive(Debug, Clone)]
pub(super) struct InProgress {
    pub(super) group: String,
    pub(super) drain: bool,
}

/// Per node group scale-down delays (`--scale-down-delay-type-local`,
/// `processors/scaledowncandidates/scale_down_candidates_delay_processor.go`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct GroupDelays {
    pub(super) scale_up: Option<Instant>,
    pub(super) scale_down: Option<Instant>,
    pub(super) failure: Option<Instant>,
}

/// What the autoscaler remembers between loops (clusterstate, backoff, scale-down state).
#[derive(Debug, Default)]
pub(super) struct CoreState {
    pub(super) demand: Demand,
    backoffs: HashMap<String, Backoff>,
    scale_ups: HashMap<String, ScaleUpRequest>,
    incorrect_sizes: HashMap<String, IncorrectSize>,
    /// Instance id → first seen without a node.
    unregistered_since: HashMap<String, Instant>,
    /// Node cache key → first seen. Stands in for the node's creation time.
    pub(super) node_first_seen: HashMap<String, Instant>,
    /// Nodes that were Ready at least once: a NotReady one is unready, not starting.
    ever_ready: HashSet<String>,
    /// Node cache key → since when it is unneeded (`unneeded.Nodes`).
    pub(super) unneeded_since: HashMap<String, Instant>,
    /// Node cache key → when scale-down tainted it ToBeDeleted. A failed deletion untaints; an
    /// accepted one keeps it. The taint is on the Kubernetes node, so a restart keeps it until
    /// the new process's `cleanUpIfRequired`.
    pub(super) tainted: HashMap<String, Instant>,
    /// Node cache key → its scale-down deletion, until its result is collected.
    pub(super) deleting: HashMap<String, InProgress>,
    /// Create-error instances of the previous listing (each backs the group off once).
    known_create_errors: HashSet<String>,
    pub(super) last_scale_up: Option<Instant>,
    pub(super) last_scale_down_delete: Option<Instant>,
    pub(super) group_delays: HashMap<String, GroupDelays>,
    /// Group id → template built from its last good node (the real autoscaler's node-info
    /// cache: kept while the group exists, lost when the autoscaler restarts).
    node_info_cache: HashMap<String, NodeTemplate>,
    /// `cleanUpIfRequired` ran (first loop).
    initialized: bool,
    /// Group id → (target of its acceptable range, registered minus not started nodes), as
    /// the last cluster-state update (and `Recalculate`) left them: `IsNodeGroupScalingUp`
    /// before the next update.
    last_sizes: HashMap<String, (i32, i32)>,
}

/// One node group as this loop sees it. Node references are indices into `Snapshot::nodes`.
#[derive(Debug)]
pub(super) struct GroupView {
    pub(super) group: pb::NodeGroup,
    pub(super) target: i32,
    pub(super) instances: Vec<pb::Instance>,
    pub(super) ready: Vec<usize>,
    pub(super) unready: Vec<usize>,
    pub(super) not_started: Vec<usize>,
    pub(super) being_deleted: Vec<usize>,
    pub(super) unregistered: Vec<String>,
    pub(super) long_unregistered: Vec<String>,
    pub(super) create_errors: Vec<String>,
}

impl GroupView {
    pub(super) fn registered(&self) -> usize {
        self.ready.len() + self.unready.len() + self.not_started.len() + self.being_deleted.len()
    }

    /// Nodes requested but not there yet: target − (Ready + Unready + LongUnregistered).
    fn upcoming(&self) -> i32 {
        let present = self.ready.len() + self.unready.len() + self.long_unregistered.len();
        (self.target - to_i32(present)).max(0)
    }

    /// `getProvisionedAndTargetSizesForNodeGroup`: registered nodes that are not still
    /// starting.
    fn provisioned(&self) -> i32 {
        to_i32(self.registered() - self.not_started.len())
    }
}

#[derive(Debug)]
pub(super) struct Snapshot {
    pub(super) now: Instant,
    pub(super) nodes: Vec<KubeNode>,
    pub(super) groups: Vec<GroupView>,
    /// Every instance without a node, with the time it was first seen so, whatever its group.
    unregistered: Vec<(String, Instant)>,
    unmanaged: usize,
    unready_total: usize,
    pub(super) ready_managed: usize,
    templates: Templates,
}

impl Snapshot {
    pub(super) fn group(&self, id: &str) -> Option<&GroupView> {
        self.groups.iter().find(|g| g.group.id == id)
    }
}

pub(super) fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl MockAutoscaler {
    /// An autoscaler using an existing client.
    pub fn new(
        client: CloudProviderClient<Channel>,
        nodes: Arc<dyn NodeSource>,
        config: AutoscalerConfig,
    ) -> Self {
        let wire = config.wire_generation();
        let mut rec = Recorder::new();
        rec.wire = wire;
        Self {
            client: ExternalGrpcClient::with_generation(client, config.call_deadline, wire),
            nodes,
            config,
            rec,
            state: CoreState::default(),
            extras: ClientExtras::default(),
            bg: Background::default(),
            crash: Crash::default(),
        }
    }

    /// An autoscaler for the provider at `address` (`host:port` as in the autoscaler's
    /// cloud-config, or a full `http://` URI). Like the real client it does not wait for the
    /// connection: a provider that is down makes the calls fail, not this function.
    pub async fn connect(
        address: &str,
        nodes: Arc<dyn NodeSource>,
        config: AutoscalerConfig,
    ) -> anyhow::Result<Self> {
        let uri = if address.contains("://") {
            address.to_owned()
        } else {
            format!("http://{address}")
        };
        let endpoint = Endpoint::from_shared(uri.clone())
            .with_context(|| {
                format!("provider address {address:?} is not a valid host:port or URI")
            })?
            .connect_timeout(config.call_deadline);
        let channel = endpoint.connect_lazy();
        Ok(Self::new(CloudProviderClient::new(channel), nodes, config))
    }

    /// The settings.
    pub fn config(&self) -> &AutoscalerConfig {
        &self.config
    }

    /// Changes settings between loops (the call deadline included). Deletions and the
    /// NodeGroupNodes cache refresh already running keep the settings they started with.
    pub fn config_mut(&mut self) -> &mut AutoscalerConfig {
        &mut self.config
    }

    /// Pending pods worth `pending_nodes` nodes appear: from the next loop the workload needs
    /// the nodes Ready then plus these. New Ready nodes absorb the pending pods.
    pub fn set_demand(&mut self, pending_nodes: u32) {
        self.state.demand = Demand::Pending(pending_nodes);
    }

    /// The workload needs `nodes` nodes in total (over all managed groups): fewer Ready nodes
    /// means pending pods, more means unneeded nodes.
    pub fn set_needed_nodes(&mut self, nodes: u32) {
        self.state.demand = Demand::Total(nodes);
    }

    /// Pending pods appear: from the next loop they wait for room beyond the nodes Ready
    /// then (those are full), and scale up a group only if they fit its node template. Each
    /// node that becomes Ready later takes the pods that fit its allocatable, labels and
    /// taints. Every Ready node counts as needed while this demand is set.
    pub fn set_pending_pods(&mut self, pods: Vec<PodSpec>) {
        self.state.demand = Demand::Pods(PodDemand {
            pending: pods,
            ..PodDemand::default()
        });
    }

    /// The pods set with [`Self::set_pending_pods`] that no node has taken yet (as of the last
    /// loop); empty for the other kinds of demand.
    pub fn pending_pods(&self) -> &[PodSpec] {
        match &self.state.demand {
            Demand::Pods(d) => &d.pending,
            _ => &[],
        }
    }

    /// Forgets the workload: no scale-up, and no Ready node is unneeded.
    pub fn clear_demand(&mut self) {
        self.state.demand = Demand::Unset;
    }

    /// Number of loops run so far.
    pub fn loops_run(&self) -> u64 {
        self.rec.loop_no
    }

    /// Everything recorded so far.
    pub fn timeline(&self) -> &Timeline {
        &self.rec.timeline
    }

    /// Every call of `rpc` (see [`Timeline::calls`]).
    pub fn calls(&self, rpc: super::Rpc) -> Vec<&Call> {
        self.rec.timeline.calls(rpc)
    }

    /// Every failed call (see [`Timeline::errors`]).
    pub fn errors(&self) -> Vec<&Call> {
        self.rec.timeline.errors()
    }

    /// The last target size `group` reported (see [`Timeline::last_target`]).
    pub fn last_target(&self, group: &str) -> Option<i32> {
        self.rec.timeline.last_target(group)
    }

    /// Summary of the last finished loop.
    pub fn last_loop(&self) -> Option<&LoopSummary> {
        self.rec.timeline.loops.last()
    }

    /// Time left in `group`'s backoff, if it is backed off now.
    pub fn backoff_remaining(&self, group: &str) -> Option<Duration> {
        let now = Instant::now();
        self.state
            .backoffs
            .get(group)
            .filter(|b| b.until > now)
            .map(|b| b.until - now)
    }

    /// Scale-down deletions started and not yet known to have ended (as of the last
    /// collection: the start of each loop, [`Self::settle_deletions`]).
    pub fn deletions_in_progress(&self) -> usize {
        self.state.deleting.len()
    }

    /// Waits until every scale-down deletion started so far has ended, and records what the
    /// background tasks did, as the start of the next loop would.
    pub async fn settle_deletions(&mut self) {
        loop {
            let changed = self.bg.outbox.changed();
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.collect_background();
            if self.state.deleting.is_empty() || self.bg.stopped() {
                return;
            }
            notified.await;
        }
    }

    /// The autoscaler exits (`StaticAutoscaler.ExitCleanUp`, run on SIGTERM): with
    /// [`AutoscalerConfig::write_status_configmap`] (the default) it calls `Cleanup`; the
    /// background work stops either way. Finished background results are recorded first.
    pub async fn exit(&mut self) {
        self.collect_background();
        if self.config.write_status_configmap {
            let (request, started, timed) =
                cleanup_call(self.client.grpc.clone(), self.config.call_deadline).await;
            self.rec.record_call(request, started, timed);
        }
        self.bg.stop();
    }

    /// The autoscaler process is restarted (a rollout, an eviction, a crash): [`Self::exit`]
    /// (`ExitCleanUp`: Cleanup with [`AutoscalerConfig::write_status_configmap`]; the
    /// deletions in flight die with the process), then a new process with fresh client caches
    /// (NodeGroups, NodeGroupForNode, templates, GPU answers), an empty NodeGroupNodes cache
    /// filled again before its first loop, and empty core state (cluster state, backoffs,
    /// scale-up requests, unneeded timers, the node-info cache). What lives in Kubernetes stays:
    /// the workload, the nodes' creation times (first seen) and their ToBeDeleted taints, which
    /// the new process's first loop removes from every node NodeGroupForNode places in a group
    /// (`core/static_autoscaler.go` `cleanUpIfRequired`, `filterNodesFromSelectedGroups`, at
    /// cluster-autoscaler-1.33.0 … 1.36.0). The timeline goes on; [`EventKind::Restarted`]
    /// marks the restart.
    pub async fn restart(&mut self) {
        self.exit().await;
        self.client = ExternalGrpcClient::with_generation(
            self.client.grpc.clone(),
            self.config.call_deadline,
            self.config.wire_generation(),
        );
        self.extras = ClientExtras::default();
        self.bg = Background::default();
        self.crash = Crash::default();
        let old = std::mem::take(&mut self.state);
        self.state.demand = old.demand;
        self.state.node_first_seen = old.node_first_seen;
        self.state.tainted = old.tainted;
        self.rec.record(EventKind::Restarted);
    }

    /// Records what background tasks finished: their calls, and the end of scale-down
    /// deletions (`NodeDeletionTracker` results, read through `CheckStatus` before the
    /// loop's Refresh). A failed deletion untaints its node
    /// (`CleanUpAndRecordFailedScaleDownEvent`), which is then a candidate again, its unneeded
    /// time kept if it was unneeded when the deletion started; with per-group delays its group
    /// also waits the delay after failure (`ScaleDownCandidatesDelayProcessor`).
    pub(super) fn collect_background(&mut self) {
        let local = self.config.scale_down_delay_type_local;
        for done in self.bg.outbox.take() {
            match done {
                Done::Call { loop_no, finished } => {
                    let (request, started, timed) = *finished;
                    let at = self.rec.since_start(started);
                    let call = Call {
                        loop_no,
                        at,
                        request,
                        outcome: timed.outcome,
                        latency: timed.latency,
                        wire: self.rec.wire,
                    };
                    self.rec.timeline.events.push(Event {
                        loop_no: self.rec.loop_no,
                        at,
                        kind: EventKind::BackgroundCall(call),
                    });
                }
                Done::Crash { reason } => {
                    self.crash.reason.get_or_insert(reason);
                }
                Done::Deletion {
                    key,
                    group,
                    node,
                    result,
                    at,
                } => {
                    self.state.deleting.remove(&key);
                    let delays = self.state.group_delays.entry(group.clone()).or_default();
                    match result {
                        Ok(()) => {
                            if local {
                                delays.scale_down = Some(at);
                            }
                        }
                        Err(error) => {
                            if local {
                                delays.failure = Some(at);
                            }
                            self.state.tainted.remove(&key);
                            self.rec
                                .record(EventKind::Decided(Decision::ScaleDownFailed {
                                    group,
                                    node,
                                    error,
                                }));
                        }
                    }
                }
            }
        }
    }

    /// `NodeGroupGetOptions` for `group` in the fields of the wire generation spoken, the
    /// autoscaler's flags as `defaults`, resolved as `DelegatingNodeGroupConfigProcessor`
    /// does; never cached (`externalgrpc_node_group.go` `NodeGroup.GetOptions`). An answer
    /// the release's client would crash on (up to 1.34.1: a missing duration in fields 3-5,
    /// dereferenced without a nil check) ends the loop here ([`Self::crash`]).
    pub(super) async fn options(&mut self, group: &str) -> Result<GroupOptions, RpcError> {
        let flags = self.config.node_group_defaults();
        let answer = self.client.get_options(group, &flags, &mut self.rec).await;
        match GroupOptions::resolve(&self.config, answer) {
            Ok(options) => Ok(options),
            Err(OptionsFailure::Rpc(e)) => Err(e),
            Err(OptionsFailure::Crash(why)) => self.crash(why).await,
        }
    }

    /// The real autoscaler process dies here (a nil pointer dereference in its client or
    /// core): nothing more of this loop happens, and the loop is reported aborted with `why`.
    /// Never returns; only for code that runs inside [`Self::run_once`], whose loop it ends.
    ///
    /// The real process is restarted with empty caches and state, crashing again at the same
    /// point for as long as the provider answers the same way; this mock goes on with its
    /// state, each such loop reported aborted.
    async fn crash<T>(&mut self, why: String) -> T {
        self.crash.reason.get_or_insert(why);
        self.crash.signal.notify_one();
        std::future::pending().await
    }

    /// `GPULabel()`: cached forever after a success, "" after a failure (asked again at the
    /// next use).
    async fn gpu_label(&mut self) -> String {
        if let Some(label) = &self.extras.gpu_label {
            return label.clone();
        }
        let (request, started, timed) =
            gpu_label_call(self.client.grpc.clone(), self.client.deadline).await;
        let label = match &timed.outcome {
            Ok(Reply::GpuLabel(label)) => {
                self.extras.gpu_label = Some(label.clone());
                label.clone()
            }
            _ => String::new(),
        };
        self.rec.record_call(request, started, timed);
        label
    }

    /// `GetAvailableGPUTypes()`: cached forever after a success.
    async fn gpu_types(&mut self) {
        if self.extras.gpu_types.is_some() {
            return;
        }
        let (request, started, timed) =
            gpu_types_call(self.client.grpc.clone(), self.client.deadline).await;
        if let Ok(Reply::GpuTypes(types)) = &timed.outcome {
            self.extras.gpu_types = Some(types.clone());
        }
        self.rec.record_call(request, started, timed);
    }

    /// `Recalculate`: every group's target size again (errors only logged); the acceptable
    /// ranges take the new targets.
    pub(super) async fn recalculate(&mut self, groups: &[String]) {
        for id in groups {
            if let Ok(t) = self.client.target_size(id, &mut self.rec).await {
                self.state.last_sizes.entry(id.clone()).or_insert((0, 0)).0 = t;
            }
        }
    }
}
