//! The mock autoscaler's loop: the real `StaticAutoscaler.RunOnce` order of calls and its
//! decisions (node templates, cluster state, unregistered and failed instances, size fixes,
//! scale-up with backoff and template fit), simplified to what a cloud provider can observe.
//! Scale-down lives in `scaledown.rs`, the work done beside the loop in `background.rs`.
//!
//! Upstream references are `cluster-autoscaler/` paths at cluster-autoscaler-1.33.0 and
//! 1.35.0 (1.36.0 where it differs): `core/static_autoscaler.go` (`RunOnce`),
//! `clusterstate/clusterstate.go` (`UpdateNodes`), `core/scaleup/orchestrator/`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::background::{Background, Done, lock, passed};
use super::calls::{
    ClientExtras, GroupOptions, cleanup_call, gpu_label_call, gpu_types_call, nodes_call,
};
use super::client::{ExternalGrpcClient, OptionsFailure, Recorder};
use super::config::AutoscalerConfig;
use super::nodes::{FAKE_NODE_CREATE_ERROR, FAKE_NODE_UNREGISTERED, KubeNode, NodeSource};
use super::pods::{NodeTemplate, PodSpec, Resources, TemplateSource, place};
use super::timeline::{
    Call, Decision, Event, EventKind, GroupObservation, InstanceCounts, LoopSummary, Observation,
    Reply, RpcError, Timeline, UpcomingNodes, has_error,
};
use crate::pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_proto::instance_status::InstanceState;

/// Error class the autoscaler records for a failed IncreaseSize and a scale-up timeout.
const OTHER_ERROR_CLASS: i32 = 99;

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

/// What scale-up has to find room for this loop.
#[derive(Debug)]
enum Pending {
    /// Nodes' worth of pods (any template holds one).
    Nodes(u32),
    /// These pods, each checked against the templates.
    Pods(Vec<PodSpec>),
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

/// Status nil (state unspecified), or neither Deleting nor failed: the instance should become
/// a node, so without one it counts as unregistered (`clusterstate.go` `getNotRegisteredNodes`).
fn expected_to_register(i: &pb::Instance) -> bool {
    match &i.status {
        None => true,
        Some(s) if s.instance_state == 0 => true,
        Some(s) => s.instance_state != InstanceState::InstanceDeleting as i32 && !has_error(i),
    }
}

/// `buildInstanceToErrorCodeMappings`: only Creating with an errorInfo is a failed creation.
fn is_create_error(i: &pb::Instance) -> bool {
    i.status
        .as_ref()
        .is_some_and(|s| s.instance_state == InstanceState::InstanceCreating as i32)
        && has_error(i)
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

    /// Runs `n` loops, `loop_interval` apart, and returns their summaries.
    pub async fn run_loops(&mut self, n: usize) -> Vec<LoopSummary> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 {
                tokio::time::sleep(self.config.loop_interval).await;
            }
            out.push(self.run_once().await);
        }
        out
    }

    /// Runs loops `loop_interval` apart until `done` holds after a loop, for at most
    /// `max_wait`. Returns the number of loops run; the error names the last loop seen.
    pub async fn run_until(
        &mut self,
        max_wait: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> anyhow::Result<u64> {
        let give_up = Instant::now() + max_wait;
        let mut loops = 0;
        loop {
            self.run_once().await;
            loops += 1;
            if done(self) {
                return Ok(loops);
            }
            if Instant::now() + self.config.loop_interval > give_up {
                let last = self
                    .last_loop()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                anyhow::bail!(
                    "condition not met after {loops} loops in {max_wait:?}; last: {last}"
                );
            }
            tokio::time::sleep(self.config.loop_interval).await;
        }
    }

    /// One autoscaler loop. Failures are part of the result (and the timeline), not errors.
    /// An answer the real autoscaler would crash on (see the [module docs](super)) ends the
    /// loop where it comes, and the crash is the loop's abort reason.
    pub async fn run_once(&mut self) -> LoopSummary {
        self.client.deadline = self.config.call_deadline;
        let wire = self.config.wire_generation();
        if self.client.generation() != wire {
            self.client.set_generation(wire);
        }
        self.rec.wire = wire;
        self.rec.loop_no += 1;
        self.bg.outbox.set_loop(self.rec.loop_no);
        let started = Instant::now();
        let first_event = self.rec.timeline.events.len();
        self.rec.record(EventKind::LoopStarted);
        let crashed = self.crash.signal.clone();
        let outcome = tokio::select! {
            biased;
            () = crashed.notified() => Ok(()),
            outcome = self.loop_body() => outcome,
        };
        let outcome = match self.crash.reason.take() {
            Some(why) => Err(format!("the autoscaler process crashed: {why}")),
            None => outcome,
        };
        if let Err(reason) = outcome {
            self.rec.record(EventKind::LoopAborted { reason });
        }
        let duration = started.elapsed();
        self.rec.record(EventKind::LoopFinished { duration });
        let summary = LoopSummary::from_events(
            self.rec.loop_no,
            self.rec.since_start(started),
            duration,
            &self.rec.timeline.events[first_event..],
        );
        self.rec.timeline.loops.push(summary.clone());
        summary
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

impl MockAutoscaler {
    async fn loop_body(&mut self) -> Result<(), String> {
        let now = Instant::now();
        // A crash a background task ran into, collected between loops (`settle_deletions`):
        // this loop only reports it (`run_once`).
        if self.crash.reason.is_some() {
            return Ok(());
        }
        if !self.bg.started {
            self.start_cluster_state().await;
        }
        let listed = self.nodes.list_nodes().await;
        if !self.state.initialized {
            // `cleanUpIfRequired`, once per process, before anything else of the first loop
            // (`core/static_autoscaler.go`, cluster-autoscaler-1.33.0 … 1.36.0): the
            // ToBeDeleted taints an earlier process left are removed from the nodes of the
            // groups `filterNodesFromSelectedGroups` finds, asking NodeGroupForNode per node
            // (before any Refresh; the answers stay cached until it). A node whose
            // NodeGroupForNode fails or answers "" keeps its taint.
            self.state.initialized = true;
            if let Ok(nodes) = &listed {
                let mut cleaned = Vec::new();
                for node in nodes {
                    let group = self.client.node_group_for_node(node, &mut self.rec).await;
                    if matches!(group, Ok(Some(_)))
                        && self.state.tainted.remove(&node.cache_key()).is_some()
                    {
                        cleaned.push(node.name.clone());
                    }
                }
                if !cleaned.is_empty() {
                    self.rec
                        .record(EventKind::Decided(Decision::ToBeDeletedTaintsCleaned {
                            nodes: cleaned,
                        }));
                }
            }
        }
        let mut nodes = listed.map_err(|e| format!("listing Kubernetes nodes failed: {e:#}"))?;
        self.filter_gpu_unready(&mut nodes).await;
        self.state.track_nodes(&nodes, now);
        // The scale-down actuation status is read before the cloud provider refreshes.
        self.collect_background();
        if self.crash.reason.is_some() {
            // A background task crashed the process (`run_once` reports why).
            return Ok(());
        }

        self.client
            .refresh(&mut self.rec)
            .await
            .map_err(|e| format!("Refresh failed: {e}"))?;
        let groups = self.client.node_groups(&mut self.rec).await;
        *lock(&self.bg.known_groups) = groups.iter().map(|g| g.id.clone()).collect();

        // The template pass looks up every node's group first, then builds a template for
        // each group; a template error other than Unimplemented aborts the loop.
        let mut template_group = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let answer = self.client.node_group_for_node(node, &mut self.rec).await;
            template_group.push(answer.ok().flatten());
        }
        let templates = self
            .build_templates(&nodes, &template_group, &groups)
            .await?;

        // clusterstate `UpdateNodes`: target sizes (any error aborts the loop), instances
        // through the cache, readiness, unregistered instances.
        let mut targets = Vec::with_capacity(groups.len());
        for g in &groups {
            match self.client.target_size(&g.id, &mut self.rec).await {
                Ok(t) => targets.push(t),
                Err(e) => {
                    // A failed cluster-state update resets the scale-down timers.
                    self.state.unneeded_since.clear();
                    return Err(format!("NodeGroupTargetSize({}) failed: {e}", g.id));
                }
            }
        }
        let instances = match self.cloud_provider_node_instances(&groups).await {
            Ok(i) => i,
            Err(e) => {
                self.state.unneeded_since.clear();
                return Err(e);
            }
        };
        let (node_group, startup) = self.readiness_lookups(&nodes).await;
        let unregistered = self.state.track_unregistered(&nodes, &instances, now);
        let unregistered_group = self.classify_unregistered(&unregistered, now).await;

        let mut snap = self.build_snapshot(
            now,
            nodes,
            (&node_group, &startup),
            (groups, targets, instances),
            unregistered,
            &unregistered_group,
        );
        snap.templates = templates;
        self.observe(&snap);
        self.update_scale_requests(&snap).await;
        self.handle_creation_errors(&snap).await;
        self.update_incorrect_sizes(&snap);
        self.state.last_sizes = snap
            .groups
            .iter()
            .map(|v| (v.group.id.clone(), (v.target, v.provisioned())))
            .collect();

        self.remove_old_unregistered(&snap).await;
        if self.cluster_unhealthy(&snap) {
            self.state.unneeded_since.clear();
            return Ok(());
        }
        self.delete_created_with_errors(&snap).await;
        if self.fix_node_group_sizes(&snap).await? {
            self.rec
                .record(EventKind::Decided(Decision::SkipRestOfLoop {
                    reason: "a node group size was fixed".into(),
                }));
            return Ok(());
        }
        let upcoming = self.upcoming_nodes(&snap);
        let (needed, pending) = self.resolve_demand(&snap);
        self.scale_up(&snap, &upcoming, pending).await;
        self.scale_down(&snap, needed).await;
        Ok(())
    }

    /// `ClusterStateRegistry.Start`, before the first loop: the NodeGroupNodes cache is filled
    /// (`CloudProviderNodeInstancesCache.Refresh`: NodeGroups, then every group's instances;
    /// a failed listing is stored as an empty one) and refreshed every
    /// [`AutoscalerConfig::instances_cache_refresh_interval`] from then on. The real one runs
    /// the first refresh in that goroutine too; here the first loop waits for it, so its
    /// calls come first, before any Refresh, as they in practice do.
    async fn start_cluster_state(&mut self) {
        self.bg.started = true;
        let groups = self.client.node_groups(&mut self.rec).await;
        for g in &groups {
            let (request, started, timed) =
                nodes_call(self.client.grpc.clone(), self.client.deadline, &g.id).await;
            let list = match &timed.outcome {
                Ok(Reply::Instances(list)) => list.clone(),
                _ => Vec::new(),
            };
            lock(&self.bg.instances).insert(&g.id, list);
            self.rec.record_call(request, started, timed);
        }
        *lock(&self.bg.known_groups) = groups.iter().map(|g| g.id.clone()).collect();
        self.bg
            .start_refresher(self.client.grpc.clone(), &self.config);
    }

    /// `obtainNodeLists` with `GpuCustomResourcesProcessor.FilterOutNodesWithUnreadyResources`:
    /// every Ready node is checked against `GPULabel()` (one RPC per Ready node until an
    /// answer is cached); one carrying the label with no GPU allocatable counts as NotReady
    /// (its GPU drivers are taken as still installing).
    async fn filter_gpu_unready(&mut self, nodes: &mut [KubeNode]) {
        let mut unready = Vec::new();
        for node in nodes.iter_mut().filter(|n| n.ready) {
            let label = self.gpu_label().await;
            if !label.is_empty() && node.labels.contains_key(&label) && node.gpus == 0 {
                node.ready = false;
                unready.push(node.name.clone());
            }
        }
        if !unready.is_empty() {
            self.rec
                .record(EventKind::Observed(Observation::GpuUnready {
                    nodes: unready,
                }));
        }
    }

    /// `getCloudProviderNodeInstances`: the cached entries of groups scaling up (as of the
    /// last cluster-state update) are dropped; `GetCloudProviderNodeInstances` fetches every
    /// missing entry concurrently (a failure only logged), then reads each group, fetching a
    /// still missing one again, whose error aborts the loop.
    async fn cloud_provider_node_instances(
        &mut self,
        groups: &[pb::NodeGroup],
    ) -> Result<Vec<Vec<pb::Instance>>, String> {
        let scaling_up: Vec<&str> = groups
            .iter()
            .map(|g| g.id.as_str())
            .filter(|id| self.state.was_scaling_up(id))
            .collect();
        {
            let mut cache = lock(&self.bg.instances);
            for id in scaling_up {
                cache.invalidate(id);
            }
        }
        let missing: Vec<String> = {
            let cache = lock(&self.bg.instances);
            groups
                .iter()
                .filter(|g| cache.get(&g.id).is_none())
                .map(|g| g.id.clone())
                .collect()
        };
        let mut fetches = JoinSet::new();
        for id in missing {
            let grpc = self.client.grpc.clone();
            let deadline = self.client.deadline;
            fetches.spawn(async move { nodes_call(grpc, deadline, &id).await });
        }
        let mut fetched = Vec::new();
        while let Some(done) = fetches.join_next().await {
            if let Ok(f) = done {
                fetched.push(f);
            }
        }
        fetched.sort_by_key(|(_, started, _)| *started);
        for (request, started, timed) in fetched {
            if let (Some(id), Ok(Reply::Instances(list))) = (request.group(), &timed.outcome) {
                lock(&self.bg.instances).insert(id, list.clone());
            }
            self.rec.record_call(request, started, timed);
        }
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let cached = lock(&self.bg.instances).get(&g.id).cloned();
            match cached {
                Some(list) => out.push(list),
                None => {
                    let list = self
                        .client
                        .nodes(&g.id, &mut self.rec)
                        .await
                        .map_err(|e| format!("NodeGroupNodes({}) failed: {e}", g.id))?;
                    lock(&self.bg.instances).insert(&g.id, list.clone());
                    out.push(list);
                }
            }
        }
        Ok(out)
    }

    /// `updateReadinessStats`: NodeGroupForNode per node. From 1.35 each node is counted
    /// twice more (in its group, if it has one, and in the total), each time asking
    /// NodeGroupForNode again and, for an autoscaled node, `GetMaxNodeStartupTime` through
    /// NodeGroupGetOptions; an error keeps the startup time of the node before (the variable
    /// is shared). Before 1.35 the startup time is a constant. Returns each node's group and
    /// startup time.
    async fn readiness_lookups(
        &mut self,
        nodes: &[KubeNode],
    ) -> (Vec<Option<pb::NodeGroup>>, Vec<Duration>) {
        let mut node_group = Vec::with_capacity(nodes.len());
        let mut startup_times = Vec::with_capacity(nodes.len());
        let mut startup = self.config.max_node_startup_time;
        for node in nodes {
            let answer = self
                .client
                .node_group_for_node(node, &mut self.rec)
                .await
                .ok()
                .flatten();
            if self.config.startup_time_from_options() {
                let updates = if answer.is_some() { 2 } else { 1 };
                for _ in 0..updates {
                    if let Ok(Some(g)) = self.client.node_group_for_node(node, &mut self.rec).await
                        && let Ok(o) = self.options(&g.id).await
                    {
                        startup = o.max_node_startup_time;
                    }
                }
            }
            node_group.push(answer);
            startup_times.push(startup);
        }
        (node_group, startup_times)
    }

    /// The unregistered part of `updateReadinessStats`: per instance without a node, its fake
    /// node's group (NodeGroupForNode) and that group's max provision time
    /// (NodeGroupGetOptions); an error on either leaves the instance out of every group's
    /// count. Returns instance id → (group, past the provision time).
    async fn classify_unregistered(
        &mut self,
        unregistered: &[(String, Instant)],
        now: Instant,
    ) -> HashMap<String, (String, bool)> {
        let mut out = HashMap::new();
        for (id, since) in unregistered {
            let fake = KubeNode::fake(id, FAKE_NODE_UNREGISTERED);
            let Ok(Some(group)) = self.client.node_group_for_node(&fake, &mut self.rec).await
            else {
                continue;
            };
            if let Ok(o) = self.options(&group.id).await {
                let long = passed(*since, o.max_node_provision_time, now);
                out.insert(id.clone(), (group.id, long));
            }
        }
        out
    }

    fn build_snapshot(
        &self,
        now: Instant,
        nodes: Vec<KubeNode>,
        (node_group, startup): (&[Option<pb::NodeGroup>], &[Duration]),
        (groups, targets, instances): (Vec<pb::NodeGroup>, Vec<i32>, Vec<Vec<pb::Instance>>),
        unregistered: Vec<(String, Instant)>,
        unregistered_group: &HashMap<String, (String, bool)>,
    ) -> Snapshot {
        let st = &self.state;
        let starting = |i: usize, key: &str| {
            let d = startup
                .get(i)
                .copied()
                .unwrap_or(self.config.max_node_startup_time);
            st.is_starting(key, now, d)
        };
        let mut views = Vec::with_capacity(groups.len());
        for ((group, target), instances) in groups.into_iter().zip(targets).zip(instances) {
            let mut view = GroupView {
                group,
                target,
                instances,
                ready: Vec::new(),
                unready: Vec::new(),
                not_started: Vec::new(),
                being_deleted: Vec::new(),
                unregistered: Vec::new(),
                long_unregistered: Vec::new(),
                create_errors: Vec::new(),
            };
            for (i, node) in nodes.iter().enumerate() {
                if node_group[i].as_ref().is_none_or(|g| g.id != view.group.id) {
                    continue;
                }
                let key = node.cache_key();
                // A node with the ToBeDeleted taint is "deleted" (the client has no
                // HasInstance: `getCloudProviderDeletedNodes` falls back on the taint).
                if st.tainted.contains_key(&key) {
                    view.being_deleted.push(i);
                } else if node.ready {
                    view.ready.push(i);
                } else if starting(i, &key) {
                    view.not_started.push(i);
                } else {
                    view.unready.push(i);
                }
            }
            view.create_errors = view
                .instances
                .iter()
                .filter(|i| is_create_error(i))
                .map(|i| i.id.clone())
                .collect();
            for (id, _) in &unregistered {
                if let Some((g, long)) = unregistered_group.get(id)
                    && *g == view.group.id
                {
                    if *long {
                        view.long_unregistered.push(id.clone());
                    } else {
                        view.unregistered.push(id.clone());
                    }
                }
            }
            views.push(view);
        }

        let unmanaged = node_group.iter().filter(|g| g.is_none()).count();
        let unready_total = nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| {
                let key = n.cache_key();
                !n.ready && !st.tainted.contains_key(&key) && !starting(*i, &key)
            })
            .count();
        let ready_managed = views.iter().map(|v| v.ready.len()).sum();
        Snapshot {
            now,
            nodes,
            groups: views,
            unregistered,
            unmanaged,
            unready_total,
            ready_managed,
            templates: Templates::new(),
        }
    }

    /// `MixedTemplateNodeInfoProvider.Process`: a group's template is its first good node
    /// (Ready, not being deleted; also remembered), else the remembered one, else
    /// `NodeGroupTemplateNodeInfo`, else, as a last resort, a NotReady node of the group. An
    /// Unimplemented answer leaves the group to that last resort; any other error, or bytes
    /// that are no Node, fails the whole pass and so the loop.
    async fn build_templates(
        &mut self,
        nodes: &[KubeNode],
        node_group: &[Option<pb::NodeGroup>],
        groups: &[pb::NodeGroup],
    ) -> Result<Templates, String> {
        let good =
            |i: usize| nodes[i].ready && !self.state.tainted.contains_key(&nodes[i].cache_key());
        let mut found: HashMap<String, NodeTemplate> = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            let Some(group) = &node_group[i] else {
                continue;
            };
            if !good(i) || found.contains_key(&group.id) {
                continue;
            }
            let template =
                NodeTemplate::from_node(node, TemplateSource::ReadyNode(node.name.clone()));
            found.insert(group.id.clone(), template);
        }
        for (id, t) in &found {
            self.state.node_info_cache.insert(id.clone(), t.clone());
        }

        let mut unimplemented: HashMap<String, String> = HashMap::new();
        for g in groups {
            if found.contains_key(&g.id) {
                continue;
            }
            if let Some(cached) = self.state.node_info_cache.get(&g.id) {
                let mut t = cached.clone();
                if let TemplateSource::ReadyNode(name) = &cached.source {
                    t.source = TemplateSource::Cached(name.clone());
                }
                found.insert(g.id.clone(), t);
                continue;
            }
            match self.client.template_node_info(&g.id, &mut self.rec).await {
                Ok(bytes) if bytes.is_empty() => {
                    // The field the release reads is unset: its `NodeGroup.TemplateNodeInfo`
                    // returns (nil, nil), and the core dereferences the nil NodeInfo
                    // (`core/utils/utils.go` `GetNodeInfoFromTemplate` up to 1.32,
                    // `simulator/node_info_utils.go` `SanitizedTemplateNodeInfoFromNodeGroup`
                    // from 1.33, called by `MixedTemplateNodeInfoProvider.Process`).
                    let why = format!(
                        "cluster-autoscaler {} finds no template node in the \
                         NodeGroupTemplateNodeInfo answer for {} ({} unset) and dereferences \
                         the nil NodeInfo: nil pointer dereference",
                        self.client.generation(),
                        g.id,
                        self.client.generation().template_field()
                    );
                    return self.crash(why).await;
                }
                Ok(bytes) => {
                    let t = NodeTemplate::decode(&bytes).map_err(|e| {
                        format!(
                            "building node templates failed: NodeGroupTemplateNodeInfo({}): {e}",
                            g.id
                        )
                    })?;
                    found.insert(g.id.clone(), t);
                }
                Err(e) if e.code == tonic::Code::Unimplemented => {
                    unimplemented.insert(
                        g.id.clone(),
                        format!("NodeGroupTemplateNodeInfo answered {e}"),
                    );
                }
                Err(e) => {
                    return Err(format!(
                        "building node templates failed: NodeGroupTemplateNodeInfo({}) failed: {e}",
                        g.id
                    ));
                }
            }
        }
        self.state
            .node_info_cache
            .retain(|id, _| groups.iter().any(|g| g.id == *id));

        for (i, node) in nodes.iter().enumerate() {
            let Some(group) = &node_group[i] else {
                continue;
            };
            if good(i) || found.contains_key(&group.id) {
                continue;
            }
            let template =
                NodeTemplate::from_node(node, TemplateSource::UnreadyNode(node.name.clone()));
            found.insert(group.id.clone(), template);
        }

        let mut out = Templates::new();
        for g in groups {
            let template = match found.remove(&g.id) {
                Some(t) => Ok(t),
                None => Err(format!(
                    "no Ready node, no node seen Ready since the autoscaler started, {}, and no NotReady node to fall back on",
                    unimplemented
                        .remove(&g.id)
                        .unwrap_or_else(|| "no NodeGroupTemplateNodeInfo answer".into())
                )),
            };
            self.rec
                .record(EventKind::Observed(Observation::NodeTemplate {
                    group: g.id.clone(),
                    template: template.clone(),
                }));
            out.insert(g.id.clone(), template);
        }
        Ok(out)
    }

    fn observe(&mut self, snap: &Snapshot) {
        let mut ready = 0;
        let mut not_ready = 0;
        for v in &snap.groups {
            ready += v.ready.len();
            not_ready += v.unready.len() + v.not_started.len();
            let obs = GroupObservation {
                id: v.group.id.clone(),
                min_size: v.group.min_size,
                max_size: v.group.max_size,
                target: v.target,
                instances: InstanceCounts::of(&v.instances),
                ready: v.ready.len(),
                unready: v.unready.len(),
                not_started: v.not_started.len(),
                being_deleted: v.being_deleted.len(),
                unregistered: v.unregistered.len(),
                long_unregistered: v.long_unregistered.len(),
                backed_off: self.state.backed_off(&v.group.id, snap.now),
                scale_up_in_progress: self.state.scale_ups.contains_key(&v.group.id),
            };
            self.rec
                .record(EventKind::Observed(Observation::Group(obs)));
        }
        self.rec.record(EventKind::Observed(Observation::Nodes {
            ready,
            not_ready,
            unmanaged: snap.unmanaged,
        }));
    }

    /// Turns a pending demand into a total, and reports (needed, what scale-up must find room
    /// for). Pending pods are first scheduled on the nodes that came after them.
    fn resolve_demand(&mut self, snap: &Snapshot) -> (Option<u32>, Pending) {
        let ready = to_u32(snap.ready_managed);
        let needed = match &mut self.state.demand {
            Demand::Unset => return (None, Pending::Nodes(0)),
            Demand::Pending(p) => {
                let total = ready.saturating_add(*p);
                self.state.demand = Demand::Total(total);
                total
            }
            Demand::Total(t) => *t,
            Demand::Pods(d) => {
                let scheduled = schedule_on_new_nodes(d, snap);
                let pending = d.pending.clone();
                for (node, pods) in scheduled {
                    self.rec
                        .record(EventKind::Observed(Observation::PodsScheduled {
                            node,
                            pods,
                        }));
                }
                self.rec
                    .record(EventKind::Observed(Observation::PendingPods {
                        pods: pending.clone(),
                    }));
                return (None, Pending::Pods(pending));
            }
        };
        let pending = needed.saturating_sub(ready);
        self.rec
            .record(EventKind::Observed(Observation::Demand { needed, pending }));
        (Some(needed), Pending::Nodes(pending))
    }

    fn back_off(
        &mut self,
        group: &str,
        error_class: i32,
        error_code: &str,
        message: String,
        now: Instant,
    ) {
        let duration = match self.state.backoffs.get(group) {
            Some(b) if b.last_failure + self.config.backoff_reset_timeout > now => {
                (b.duration * 2).min(self.config.max_backoff)
            }
            _ => self.config.initial_backoff,
        };
        self.state.backoffs.insert(
            group.to_owned(),
            Backoff {
                until: now + duration,
                duration,
                last_failure: now,
            },
        );
        self.rec.record(EventKind::Decided(Decision::BackOff {
            group: group.to_owned(),
            error_class,
            error_code: error_code.to_owned(),
            message,
            duration,
        }));
    }

    /// clusterstate's `updateScaleRequests`: a request whose group has no node left to come
    /// (`areThereUpcomingNodesInNodeGroup`: target ≤ registered − not started) is done; one
    /// past its expected add time has timed out: the group backs off (`timeout`); up to 1.35
    /// the failure asks for GetAvailableGPUTypes and the group's template (for metrics), from
    /// 1.36 the request's increase is given back with NodeGroupDecreaseTargetSize, whose
    /// error is only logged. Either way the request is dropped.
    async fn update_scale_requests(&mut self, snap: &Snapshot) {
        let mut ids: Vec<String> = self.state.scale_ups.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let Some(request) = self.state.scale_ups.get(&id).copied() else {
                continue;
            };
            let finished = snap
                .group(&id)
                .is_none_or(|view| view.target <= view.provisioned());
            if finished {
                self.state.scale_ups.remove(&id);
                self.rec
                    .record(EventKind::Decided(Decision::ScaleUpCompleted { group: id }));
                continue;
            }
            if request.expected_add_time >= snap.now {
                continue;
            }
            self.state.scale_ups.remove(&id);
            self.rec
                .record(EventKind::Decided(Decision::ScaleUpTimedOut {
                    group: id.clone(),
                    increase: request.increase,
                }));
            if self.config.failures_ask_for_template() {
                self.gpu_types().await;
                if !request.template_cached {
                    let _ = self.client.template_node_info(&id, &mut self.rec).await;
                }
            }
            let message = format!(
                "scale-up of {} node(s) did not complete in time",
                request.increase
            );
            self.back_off(&id, OTHER_ERROR_CLASS, "timeout", message, snap.now);
            if self.config.reverts_timed_out_scale_ups() && request.increase > 0 {
                let _ = self
                    .client
                    .decrease_target_size(&id, -request.increase, &mut self.rec)
                    .await;
            }
        }
    }

    /// `registerOrUpdateScaleUpNoLock`: the group's max provision time from
    /// NodeGroupGetOptions (an error leaves the request as it was), then a new request, or the
    /// existing one changed by `delta` (gone at 0; a positive delta moves its expected time).
    async fn register_or_update_scale_up(
        &mut self,
        id: &str,
        delta: i32,
        now: Instant,
        template_cached: bool,
    ) {
        let Ok(options) = self.options(id).await else {
            return;
        };
        let expected_add_time = now + options.max_node_provision_time;
        match self.state.scale_ups.get_mut(id) {
            None if delta > 0 => {
                self.state.scale_ups.insert(
                    id.to_owned(),
                    ScaleUpRequest {
                        increase: delta,
                        expected_add_time,
                        template_cached,
                    },
                );
            }
            None => {}
            Some(r) if r.increase + delta <= 0 => {
                self.state.scale_ups.remove(id);
            }
            Some(r) => {
                r.increase += delta;
                if delta > 0 {
                    r.expected_add_time = expected_add_time;
                }
            }
        }
    }

    /// clusterstate's `handleInstanceCreationErrorsForNodeGroup`: instances Creating with an
    /// errorInfo not seen failed in the previous listing, by (code, class), count only while
    /// the group `IsNodeGroupScalingUp` (a scale-up request and nodes still to come): then the
    /// request shrinks by their number and the group backs off with their class and code. A
    /// group not scaling up (its request timed out or done, or an instance failed outside any
    /// scale-up) is not backed off.
    async fn handle_creation_errors(&mut self, snap: &Snapshot) {
        let mut current = HashSet::new();
        for v in &snap.groups {
            let mut unseen: Vec<(String, i32, String, i32)> = Vec::new();
            for inst in v.instances.iter().filter(|i| is_create_error(i)) {
                current.insert(inst.id.clone());
                if self.state.known_create_errors.contains(&inst.id) {
                    continue;
                }
                let Some(info) = inst.status.as_ref().and_then(|s| s.error_info.as_ref()) else {
                    continue;
                };
                match unseen.iter_mut().find(|(code, class, ..)| {
                    *code == info.error_code && *class == info.instance_error_class
                }) {
                    Some(entry) => entry.3 += 1,
                    None => unseen.push((
                        info.error_code.clone(),
                        info.instance_error_class,
                        info.error_message.clone(),
                        1,
                    )),
                }
            }
            let id = &v.group.id;
            for (code, class, message, count) in unseen {
                let scaling_up =
                    self.state.scale_ups.contains_key(id) && v.target > v.provisioned();
                if !scaling_up {
                    self.rec
                        .record(EventKind::Decided(Decision::FailedCreationsNotCounted {
                            group: id.clone(),
                            error_code: code,
                            instances: to_u32(usize::try_from(count).unwrap_or(0)),
                        }));
                    continue;
                }
                if self.config.failures_ask_for_template() {
                    self.gpu_types().await;
                    let _ = self.client.template_node_info(id, &mut self.rec).await;
                }
                self.register_or_update_scale_up(id, -count, snap.now, false)
                    .await;
                self.back_off(id, class, &code, message, snap.now);
            }
        }
        self.state.known_create_errors = current;
    }
    /// clusterstate's `updateIncorrectNodeGroupSizes`.
    fn update_incorrect_sizes(&mut self, snap: &Snapshot) {
        let mut seen = HashSet::new();
        for v in &snap.groups {
            let registered = to_i32(v.registered());
            let unregistered = to_i32(v.unregistered.len() + v.long_unregistered.len());
            // Only groups with some node or instance have readiness data in the autoscaler.
            if registered == 0 && unregistered == 0 {
                continue;
            }
            if registered > v.target || registered < v.target - unregistered {
                seen.insert(v.group.id.clone());
                let fresh = IncorrectSize {
                    current: registered,
                    expected: v.target,
                    first_observed: snap.now,
                };
                let entry = self
                    .state
                    .incorrect_sizes
                    .entry(v.group.id.clone())
                    .or_insert(fresh);
                if entry.current != fresh.current || entry.expected != fresh.expected {
                    *entry = fresh;
                }
            }
        }
        self.state.incorrect_sizes.retain(|id, _| seen.contains(id));
    }

    /// `removeOldUnregisteredNodes` (`oldUnregisteredNodes` first): for every instance without
    /// a node, its fake node's group (NodeGroupForNode; none or an error: kept) and that
    /// group's max provision time (NodeGroupGetOptions; an error ends the removal for this
    /// loop); those past it are deleted per group with fake nodes, after NodeGroupTargetSize
    /// (an error skips the group), down to the group's min, and after NodeGroupGetOptions (the
    /// zero-or-max check; an error skips the group). Each NodeGroupDeleteNodes drops the
    /// group's cached instances; a failed one ends the removal for this loop.
    async fn remove_old_unregistered(&mut self, snap: &Snapshot) {
        let mut by_group: Vec<(pb::NodeGroup, Vec<KubeNode>)> = Vec::new();
        for (id, since) in &snap.unregistered {
            let fake = KubeNode::fake(id, FAKE_NODE_UNREGISTERED);
            let group = match self.client.node_group_for_node(&fake, &mut self.rec).await {
                Ok(Some(group)) => group,
                Ok(None) => {
                    self.keep_unregistered(id, "NodeGroupForNode names no node group for it");
                    continue;
                }
                Err(e) => {
                    self.keep_unregistered(id, &format!("NodeGroupForNode failed: {e}"));
                    continue;
                }
            };
            let options = match self.options(&group.id).await {
                Ok(o) => o,
                Err(e) => {
                    self.keep_unregistered(
                        id,
                        &format!(
                            "NodeGroupGetOptions({}) failed: {e}; no unregistered node removed this loop",
                            group.id
                        ),
                    );
                    return;
                }
            };
            if !passed(*since, options.max_node_provision_time, snap.now) {
                continue;
            }
            match by_group.iter_mut().find(|(g, _)| g.id == group.id) {
                Some((_, list)) => list.push(fake),
                None => by_group.push((group, vec![fake])),
            }
        }
        by_group.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        for (answered, mut fakes) in by_group {
            // The group object is the NodeGroups one (`nodeGroupsById`), with its min size; a
            // group NodeGroupForNode named that NodeGroups does not list is a nil NodeGroup,
            // whose TargetSize call kills the process.
            let Some(group) = snap.group(&answered.id).map(|v| v.group.clone()) else {
                let why = format!(
                    "removeOldUnregisteredNodes: NodeGroupForNode placed {} in node group {}, \
                     which NodeGroups does not list, and the nil node group's TargetSize is \
                     called: nil pointer dereference",
                    fakes.first().map_or("", |f| f.name.as_str()),
                    answered.id
                );
                return self.crash(why).await;
            };
            let Ok(target) = self.client.target_size(&group.id, &mut self.rec).await else {
                continue;
            };
            let possible = usize::try_from(target - group.min_size).unwrap_or(0);
            let kept = fakes.split_off(possible.min(fakes.len()));
            for k in kept {
                self.keep_unregistered(
                    &k.name,
                    &format!(
                        "{} is at its min size {} (target {target})",
                        group.id, group.min_size
                    ),
                );
            }
            if fakes.is_empty() {
                continue;
            }
            if let Err(e) = self.options(&group.id).await {
                for f in &fakes {
                    self.keep_unregistered(&f.name, &format!("NodeGroupGetOptions failed: {e}"));
                }
                continue;
            }
            self.rec
                .record(EventKind::Decided(Decision::DeleteUnregistered {
                    group: group.id.clone(),
                    instances: fakes.iter().map(|f| f.name.clone()).collect(),
                }));
            let result = self
                .client
                .delete_nodes(&group.id, &fakes, &mut self.rec)
                .await;
            lock(&self.bg.instances).invalidate(&group.id);
            if result.is_err() {
                return;
            }
        }
    }

    fn keep_unregistered(&mut self, instance: &str, reason: &str) {
        self.rec
            .record(EventKind::Decided(Decision::KeepUnregistered {
                instance: instance.to_owned(),
                reason: reason.to_owned(),
            }));
    }
    fn cluster_unhealthy(&mut self, snap: &Snapshot) -> bool {
        let total = snap.nodes.len();
        let unready = snap.unready_total;
        #[allow(clippy::cast_precision_loss)] // node counts are small
        let too_many = unready > self.config.ok_total_unready_count
            && unready as f64 > self.config.max_total_unready_percentage / 100.0 * total as f64;
        if too_many {
            self.rec
                .record(EventKind::Decided(Decision::ClusterUnhealthy {
                    unready,
                    total,
                }));
        }
        too_many
    }

    /// `deleteCreatedNodesWithErrors`: every loop, per group listing instances Creating with
    /// an errorInfo, NodeGroupGetOptions (the zero-or-max check; an error skips the group) and
    /// NodeGroupDeleteNodes with their fake nodes (an error is only logged). A success drops
    /// the group's cached instances; after any success the cluster state is recalculated.
    async fn delete_created_with_errors(&mut self, snap: &Snapshot) {
        let mut deleted_any = false;
        for v in snap.groups.iter().filter(|v| !v.create_errors.is_empty()) {
            if self.options(&v.group.id).await.is_err() {
                continue;
            }
            let fakes: Vec<KubeNode> = v
                .create_errors
                .iter()
                .map(|id| KubeNode::fake(id, FAKE_NODE_CREATE_ERROR))
                .collect();
            self.rec
                .record(EventKind::Decided(Decision::DeleteCreateErrors {
                    group: v.group.id.clone(),
                    instances: v.create_errors.clone(),
                }));
            if self
                .client
                .delete_nodes(&v.group.id, &fakes, &mut self.rec)
                .await
                .is_ok()
            {
                deleted_any = true;
                lock(&self.bg.instances).invalidate(&v.group.id);
            }
        }
        if deleted_any {
            let ids: Vec<String> = snap.groups.iter().map(|v| v.group.id.clone()).collect();
            self.recalculate(&ids).await;
        }
    }

    /// `fixNodeGroupSize`: for each group with an incorrect size, its max provision time from
    /// NodeGroupGetOptions (an error aborts the loop); a group whose registered count stayed
    /// below target for longer than that has its target lowered by the difference with
    /// NodeGroupDecreaseTargetSize, whose error aborts the loop. True if anything was fixed.
    async fn fix_node_group_sizes(&mut self, snap: &Snapshot) -> Result<bool, String> {
        let mut fixed = false;
        for v in &snap.groups {
            let Some(inc) = self.state.incorrect_sizes.get(&v.group.id).copied() else {
                continue;
            };
            let options = self.options(&v.group.id).await.map_err(|e| {
                format!(
                    "fixing node group sizes failed: no max node provision time for {}: {e}",
                    v.group.id
                )
            })?;
            if !passed(
                inc.first_observed,
                options.max_node_provision_time,
                snap.now,
            ) {
                continue;
            }
            let delta = inc.current - inc.expected;
            if delta >= 0 {
                continue;
            }
            self.rec
                .record(EventKind::Decided(Decision::FixNodeGroupSize {
                    group: v.group.id.clone(),
                    registered: inc.current,
                    target: inc.expected,
                    delta,
                }));
            self.client
                .decrease_target_size(&v.group.id, delta, &mut self.rec)
                .await
                .map_err(|e| format!("fixing the size of {} failed: {e}", v.group.id))?;
            fixed = true;
        }
        Ok(fixed)
    }

    /// `GetUpcomingNodes` (`clusterstate/clusterstate.go`) with `addUpcomingNodesToClusterSnapshot`
    /// (`core/static_autoscaler.go`), checked at cluster-autoscaler-1.28.0, 1.33.0, 1.35.0 and
    /// 1.36.0: per group, target − (Ready + Unready + LongUnregistered); Deleted nodes (the
    /// ToBeDeleted taint, as the client has no HasInstance: `hasCloudProviderInstance`) and
    /// NotStarted and unregistered ones are not subtracted, so they count as upcoming. From
    /// 1.36 (commit 251652c2ee) a group without a scale-up request, or backed off, has none;
    /// a group without a template gets no copies (`getUpcomingNodeInfos`). Each group's count
    /// is recorded ([`Observation::Upcoming`]); returns those injected, by group.
    fn upcoming_nodes(&mut self, snap: &Snapshot) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for v in &snap.groups {
            let id = &v.group.id;
            let request = self.state.scale_ups.get(id).map(|r| r.increase);
            let release_counts = !self.config.upcoming_needs_scale_up_request()
                || (request.is_some() && !self.state.backed_off(id, snap.now));
            let has_template = matches!(snap.templates.get(id), Some(Ok(_)));
            let upcoming = v.upcoming();
            let counted = upcoming > 0 && release_counts && has_template;
            self.rec
                .record(EventKind::Observed(Observation::Upcoming(UpcomingNodes {
                    group: id.clone(),
                    target: v.target,
                    ready: v.ready.len(),
                    unready: v.unready.len(),
                    long_unregistered: v.long_unregistered.len(),
                    deleted: v.being_deleted.len(),
                    upcoming,
                    requested: request,
                    counted,
                })));
            if counted {
                out.push((id.clone(), u32::try_from(upcoming).unwrap_or(0)));
            }
        }
        out
    }

    /// Scale-up (`ScaleUpOrchestrator.ScaleUp`): what upcoming nodes do not cover goes to the
    /// first group that is neither backed off nor at max, has a node template, and (for pods)
    /// has a template some pending pod fits; the increase is capped at max. Every group is
    /// looked at as the real orchestrator does before its expander picks: backoff, then
    /// NodeGroupTargetSize (an error skips the group), max size, NodeGroupGetOptions (the
    /// zero-or-max check; errors only logged), the template and the pods, and
    /// NodeGroupGetOptions again for a group the pods fit (`computeExpansionOption`). The
    /// executor asks GetAvailableGPUTypes, then NodeGroupIncreaseSize; a success registers
    /// the scale-up request (NodeGroupGetOptions: the max provision time) and recalculates.
    async fn scale_up(
        &mut self,
        snap: &Snapshot,
        upcoming_nodes: &[(String, u32)],
        pending: Pending,
    ) {
        let now = snap.now;
        // The upcoming nodes `GetUpcomingNodes` counts, injected as template copies.
        let upcoming_groups: Vec<(&GroupView, u32)> = upcoming_nodes
            .iter()
            .filter_map(|(id, n)| snap.group(id).map(|v| (v, *n)))
            .collect();
        let upcoming: u32 = upcoming_groups.iter().map(|(_, n)| n).sum();
        enum Work {
            /// Pending nodes' worth, and how many of them upcoming nodes leave.
            Nodes { pending: u32, need: u32 },
            /// The pods upcoming nodes leave.
            Pods(Vec<PodSpec>),
        }
        let work = match pending {
            Pending::Nodes(0) => return,
            Pending::Nodes(n) if n <= upcoming => {
                self.rec.record(EventKind::Decided(Decision::NoScaleUp {
                    reason: format!("{n} pending node(s) covered by {upcoming} upcoming"),
                }));
                return;
            }
            Pending::Nodes(n) => Work::Nodes {
                pending: n,
                need: n - upcoming,
            },
            Pending::Pods(pods) if pods.is_empty() => return,
            Pending::Pods(pods) => {
                // As the real autoscaler, pods that fit on upcoming nodes (template copies)
                // trigger nothing more.
                let mut remaining = pods;
                for (v, n) in &upcoming_groups {
                    let Some(Ok(t)) = snap.templates.get(&v.group.id) else {
                        continue;
                    };
                    let mut room = vec![t.allocatable; usize::try_from(*n).unwrap_or(0)];
                    remaining.retain(|p| !place(p, &mut room, &t.labels, &t.taints));
                }
                if remaining.is_empty() {
                    self.rec.record(EventKind::Decided(Decision::NoScaleUp {
                        reason: format!("the pending pod(s) fit on {upcoming} upcoming node(s)"),
                    }));
                    return;
                }
                Work::Pods(remaining)
            }
        };
        let mut reasons = Vec::new();
        // (group, target, pending nodes' worth, nodes to add)
        let mut options: Vec<(String, i32, u32, u32)> = Vec::new();
        for v in &snap.groups {
            let id = &v.group.id;
            if let Some(left) = self
                .state
                .backoffs
                .get(id)
                .filter(|b| b.until > now)
                .map(|b| b.until - now)
            {
                reasons.push(format!("{id} backed off for {:.3}s", left.as_secs_f64()));
                continue;
            }
            let Ok(target) = self.client.target_size(id, &mut self.rec).await else {
                reasons.push(format!("{id} has no target size"));
                continue;
            };
            if target >= v.group.max_size {
                reasons.push(format!("{id} at max size {}", v.group.max_size));
                continue;
            }
            let _ = self.options(id).await;
            let template = match snap.templates.get(id) {
                Some(Ok(t)) => t,
                Some(Err(why)) => {
                    reasons.push(format!("{id} has no node template ({why})"));
                    continue;
                }
                None => {
                    reasons.push(format!("{id} has no node template"));
                    continue;
                }
            };
            let (pending_nodes, nodes) = match &work {
                Work::Nodes { pending, need } => (*pending, *need),
                Work::Pods(pods) => {
                    let mut fitting = Vec::new();
                    for pod in pods {
                        match template.check(pod) {
                            Ok(()) => fitting.push(pod),
                            Err(reason) => {
                                self.rec.record(EventKind::Decided(Decision::PodDoesNotFit {
                                    pod: pod.name.clone(),
                                    group: id.clone(),
                                    reason: format!("{reason} (template from {})", template.source),
                                }))
                            }
                        }
                    }
                    if fitting.is_empty() {
                        reasons.push(format!(
                            "no pending pod fits the template of {id} ({})",
                            template.source
                        ));
                        continue;
                    }
                    let n = u32::try_from(template.nodes_needed(&fitting)).unwrap_or(u32::MAX);
                    (n, n)
                }
            };
            let _ = self.options(id).await;
            options.push((id.clone(), target, pending_nodes, nodes));
        }
        // The expander: the first option wins.
        let Some((id, target, pending_nodes, nodes)) = options.into_iter().next() else {
            if reasons.is_empty() {
                reasons.push("no node group".into());
            }
            self.rec.record(EventKind::Decided(Decision::NoScaleUp {
                reason: reasons.join(", "),
            }));
            return;
        };
        let Some(view) = snap.group(&id) else {
            return;
        };
        let need = i32::try_from(nodes).unwrap_or(i32::MAX);
        let delta = need.min(view.group.max_size - target);
        self.rec.record(EventKind::Decided(Decision::ScaleUp {
            group: id.clone(),
            delta,
            pending: pending_nodes,
            upcoming,
        }));
        self.gpu_types().await;
        match self.client.increase_size(&id, delta, &mut self.rec).await {
            Ok(()) => {
                let template_cached = matches!(
                    snap.templates.get(&id),
                    Some(Ok(t)) if t.source == TemplateSource::Provider
                );
                self.register_or_update_scale_up(&id, delta, now, template_cached)
                    .await;
                self.state.last_scale_up = Some(now);
                self.state
                    .group_delays
                    .entry(id.clone())
                    .or_default()
                    .scale_up = Some(now);
                // The autoscaler recalculates cluster state right after a scale-up.
                let ids: Vec<String> = snap.groups.iter().map(|v| v.group.id.clone()).collect();
                self.recalculate(&ids).await;
            }
            Err(e) => {
                self.back_off(
                    &id,
                    OTHER_ERROR_CLASS,
                    "cloudProviderError",
                    e.to_string(),
                    now,
                );
            }
        }
    }
}
/// The scheduler's part of a pod demand: the first time, every managed Ready node is full;
/// after that, each managed Ready node not seen then takes the pending pods that fit its room
/// left (its allocatable at first), labels and taints, in name order. Returns the pods placed
/// per node.
fn schedule_on_new_nodes(d: &mut PodDemand, snap: &Snapshot) -> Vec<(String, Vec<String>)> {
    let mut ready: Vec<&KubeNode> = snap
        .groups
        .iter()
        .flat_map(|v| v.ready.iter().map(|i| &snap.nodes[*i]))
        .collect();
    ready.sort_by(|a, b| a.name.cmp(&b.name));
    let full = d
        .full
        .get_or_insert_with(|| ready.iter().map(|n| n.cache_key()).collect());
    let mut out = Vec::new();
    for node in ready {
        let key = node.cache_key();
        if full.contains(&key) {
            continue;
        }
        let room = d
            .free
            .entry(key)
            .or_insert_with(|| node.allocatable.unwrap_or(Resources::UNBOUNDED));
        let mut placed = Vec::new();
        d.pending.retain(|pod| {
            let fits = place(pod, std::slice::from_mut(room), &node.labels, &node.taints);
            if fits {
                placed.push(pod.name.clone());
            }
            !fits
        });
        if !placed.is_empty() {
            out.push((node.name.clone(), placed));
        }
    }
    let present: HashSet<String> = snap.nodes.iter().map(KubeNode::cache_key).collect();
    d.free.retain(|k, _| present.contains(k));
    out
}

impl CoreState {
    /// Instances listed by NodeGroupNodes whose id is no node's providerID and that should
    /// register (not Deleting, no error), with when each was first seen so
    /// (`getNotRegisteredNodes`, `updateUnregisteredNodes`).
    fn track_unregistered(
        &mut self,
        nodes: &[KubeNode],
        instances: &[Vec<pb::Instance>],
        now: Instant,
    ) -> Vec<(String, Instant)> {
        let provider_ids: HashSet<&str> = nodes
            .iter()
            .map(|n| n.provider_id.as_str())
            .filter(|p| !p.is_empty())
            .collect();
        let mut out: Vec<(String, Instant)> = Vec::new();
        for inst in instances.iter().flatten() {
            if provider_ids.contains(inst.id.as_str())
                || !expected_to_register(inst)
                || out.iter().any(|(id, _)| *id == inst.id)
            {
                continue;
            }
            let since = *self
                .unregistered_since
                .entry(inst.id.clone())
                .or_insert(now);
            out.push((inst.id.clone(), since));
        }
        self.unregistered_since
            .retain(|id, _| out.iter().any(|(u, _)| u == id));
        out
    }

    fn track_nodes(&mut self, nodes: &[KubeNode], now: Instant) {
        let keys: HashSet<String> = nodes.iter().map(KubeNode::cache_key).collect();
        for node in nodes {
            let key = node.cache_key();
            if node.ready {
                self.ever_ready.insert(key.clone());
            }
            self.node_first_seen.entry(key).or_insert(now);
        }
        self.node_first_seen.retain(|k, _| keys.contains(k));
        self.ever_ready.retain(|k| keys.contains(k));
        self.tainted.retain(|k, _| keys.contains(k));
        self.unneeded_since.retain(|k, _| keys.contains(k));
    }

    /// NotReady, never Ready, and younger than the startup time.
    fn is_starting(&self, key: &str, now: Instant, startup: Duration) -> bool {
        !self.ever_ready.contains(key)
            && self
                .node_first_seen
                .get(key)
                .is_some_and(|t| *t + startup > now)
    }

    pub(super) fn backed_off(&self, group: &str, now: Instant) -> bool {
        self.backoffs.get(group).is_some_and(|b| b.until > now)
    }

    /// `IsNodeGroupScalingUp` between two cluster-state updates: a scale-up request, and a
    /// target (as last updated or recalculated) above the provisioned nodes of the last update.
    fn was_scaling_up(&self, group: &str) -> bool {
        self.scale_ups.contains_key(group)
            && self
                .last_sizes
                .get(group)
                .is_some_and(|(target, provisioned)| target > provisioned)
    }
}
