//! The mock autoscaler's loop: the real `StaticAutoscaler.RunOnce` order of calls and its
//! decisions (node templates, cluster state, unregistered and failed instances, size fixes,
//! scale-up with backoff and template fit, scale-down with min size), simplified to what a
//! cloud provider can observe.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::client::{ExternalGrpcClient, Recorder, Timed, delete_nodes_call};
use super::config::{AutoscalerConfig, DeleteBatching};
use super::nodes::{FAKE_NODE_CREATE_ERROR, FAKE_NODE_UNREGISTERED, KubeNode, NodeSource};
use super::pods::{NodeTemplate, PodSpec, Resources, TemplateSource, place};
use super::timeline::{
    Call, Decision, EventKind, GroupObservation, InstanceCounts, LoopSummary, Observation,
    RemovedNode, Reply, Request, Rpc, RpcError, ScaleDownReason, Timeline, has_error,
};
use crate::pb;
use crate::pb::cloud_provider_client::CloudProviderClient;
use crate::pb::instance_status::InstanceState;

/// Error class the autoscaler records for a failed IncreaseSize and a scale-up timeout.
const OTHER_ERROR_CLASS: i32 = 99;

/// A cluster-autoscaler stand-in driving one externalgrpc provider. See the
/// [module docs](super) for an example.
pub struct MockAutoscaler {
    client: ExternalGrpcClient,
    nodes: Arc<dyn NodeSource>,
    config: AutoscalerConfig,
    rec: Recorder,
    state: CoreState,
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
enum Demand {
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
struct PodDemand {
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

#[derive(Debug, Clone, Copy)]
struct ScaleUpRequest {
    increase: i32,
    expected_add_time: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IncorrectSize {
    current: i32,
    expected: i32,
    first_observed: Instant,
}

/// What the autoscaler remembers between loops (clusterstate, backoff, scale-down timers).
#[derive(Debug, Default)]
struct CoreState {
    demand: Demand,
    backoffs: HashMap<String, Backoff>,
    scale_ups: HashMap<String, ScaleUpRequest>,
    incorrect_sizes: HashMap<String, IncorrectSize>,
    /// Instance id → first seen without a node.
    unregistered_since: HashMap<String, Instant>,
    /// Node cache key → first seen. Stands in for the node's creation time.
    node_first_seen: HashMap<String, Instant>,
    /// Nodes that were Ready at least once: a NotReady one is unready, not starting.
    ever_ready: HashSet<String>,
    /// Node cache key → since when it is a scale-down candidate.
    unneeded_since: HashMap<String, Instant>,
    /// Nodes DeleteNodes accepted (the real autoscaler taints them ToBeDeleted).
    being_deleted: HashSet<String>,
    /// Create-error instances already accounted for (each backs the group off once).
    known_create_errors: HashSet<String>,
    last_scale_up: Option<Instant>,
    last_scale_down_failure: Option<Instant>,
    /// Group id → template built from its last good node (the real autoscaler's node-info
    /// cache: kept while the group exists, lost when the autoscaler restarts).
    node_info_cache: HashMap<String, NodeTemplate>,
}

/// One node group as this loop sees it. Node references are indices into `Snapshot::nodes`.
#[derive(Debug)]
struct GroupView {
    group: pb::NodeGroup,
    target: i32,
    instances: Vec<pb::Instance>,
    ready: Vec<usize>,
    unready: Vec<usize>,
    not_started: Vec<usize>,
    being_deleted: Vec<usize>,
    unregistered: Vec<String>,
    long_unregistered: Vec<String>,
    create_errors: Vec<String>,
}

impl GroupView {
    fn registered(&self) -> usize {
        self.ready.len() + self.unready.len() + self.not_started.len() + self.being_deleted.len()
    }

    /// Nodes requested but not there yet: target − (Ready + Unready + LongUnregistered).
    fn upcoming(&self) -> i32 {
        let present = self.ready.len() + self.unready.len() + self.long_unregistered.len();
        (self.target - to_i32(present)).max(0)
    }
}

#[derive(Debug)]
struct Snapshot {
    now: Instant,
    nodes: Vec<KubeNode>,
    groups: Vec<GroupView>,
    /// Every instance without a node (id, past the provision time), whatever its group.
    unregistered: Vec<(String, bool)>,
    unmanaged: usize,
    unready_total: usize,
    ready_managed: usize,
    templates: Templates,
}

impl Snapshot {
    fn group(&self, id: &str) -> Option<&GroupView> {
        self.groups.iter().find(|g| g.group.id == id)
    }
}

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Status nil (state unspecified), or neither Deleting nor failed: the instance should become
/// a node, so without one it counts as unregistered.
fn expected_to_register(i: &pb::Instance) -> bool {
    match &i.status {
        None => true,
        Some(s) if s.instance_state == 0 => true,
        Some(s) => s.instance_state != InstanceState::InstanceDeleting as i32 && !has_error(i),
    }
}

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
        Self {
            client: ExternalGrpcClient::new(client, config.call_deadline),
            nodes,
            config,
            rec: Recorder::new(),
            state: CoreState::default(),
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

    /// Changes settings between loops (the call deadline included).
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
    pub fn calls(&self, rpc: Rpc) -> Vec<&Call> {
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
    pub async fn run_once(&mut self) -> LoopSummary {
        self.client.deadline = self.config.call_deadline;
        self.rec.loop_no += 1;
        let started = Instant::now();
        let first_event = self.rec.timeline.events.len();
        self.rec.record(EventKind::LoopStarted);
        if let Err(reason) = self.loop_body().await {
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

    async fn loop_body(&mut self) -> Result<(), String> {
        let now = Instant::now();
        let nodes = self
            .nodes
            .list_nodes()
            .await
            .map_err(|e| format!("listing Kubernetes nodes failed: {e:#}"))?;
        self.state.track_nodes(&nodes, now);

        self.client
            .refresh(&mut self.rec)
            .await
            .map_err(|e| format!("Refresh failed: {e}"))?;
        let groups = self.client.node_groups(&mut self.rec).await;

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
        let mut instances = Vec::with_capacity(groups.len());
        for g in &groups {
            match self.client.nodes(&g.id, &mut self.rec).await {
                Ok(list) => instances.push(list),
                Err(e) => {
                    self.state.unneeded_since.clear();
                    return Err(format!("NodeGroupNodes({}) failed: {e}", g.id));
                }
            }
        }

        // Readiness: clusterstate asks twice per node, then once per unregistered instance (its
        // fake node), and counts the instance in whatever group the answer names.
        let mut node_group = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let _ = self.client.node_group_for_node(node, &mut self.rec).await;
            let answer = self.client.node_group_for_node(node, &mut self.rec).await;
            node_group.push(answer.ok().flatten());
        }
        let unregistered = self.state.track_unregistered(
            &nodes,
            &instances,
            now,
            self.config.max_node_provision_time,
        );
        let mut unregistered_group = HashMap::new();
        for (id, _) in &unregistered {
            let fake = KubeNode::fake(id, FAKE_NODE_UNREGISTERED);
            if let Ok(Some(group)) = self.client.node_group_for_node(&fake, &mut self.rec).await {
                unregistered_group.insert(id.clone(), group.id);
            }
        }

        let mut snap = self.build_snapshot(
            now,
            nodes,
            &node_group,
            (groups, targets, instances),
            unregistered,
            &unregistered_group,
        );
        snap.templates = templates;
        self.observe(&snap);
        self.update_scale_requests(&snap).await;
        self.handle_creation_errors(&snap);
        self.update_incorrect_sizes(&snap);

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
        let (needed, pending) = self.resolve_demand(&snap);
        self.scale_up(&snap, pending).await;
        self.scale_down(&snap, needed).await;
        Ok(())
    }

    fn build_snapshot(
        &self,
        now: Instant,
        nodes: Vec<KubeNode>,
        node_group: &[Option<pb::NodeGroup>],
        (groups, targets, instances): (Vec<pb::NodeGroup>, Vec<i32>, Vec<Vec<pb::Instance>>),
        unregistered: Vec<(String, bool)>,
        unregistered_group: &HashMap<String, String>,
    ) -> Snapshot {
        let st = &self.state;
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
                if st.being_deleted.contains(&key) {
                    view.being_deleted.push(i);
                } else if node.ready {
                    view.ready.push(i);
                } else if st.is_starting(&key, now, self.config.max_node_startup_time) {
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
            for (id, long) in &unregistered {
                if unregistered_group.get(id) == Some(&view.group.id) {
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
            .filter(|n| {
                let key = n.cache_key();
                !n.ready
                    && !st.being_deleted.contains(&key)
                    && !st.is_starting(&key, now, self.config.max_node_startup_time)
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
            |i: usize| nodes[i].ready && !self.state.being_deleted.contains(&nodes[i].cache_key());
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

    /// clusterstate's `updateScaleRequests`: a request with nothing upcoming is done; one past
    /// its expected time has failed (backoff, and its capacity is given back).
    async fn update_scale_requests(&mut self, snap: &Snapshot) {
        let mut ids: Vec<String> = self.state.scale_ups.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let Some(request) = self.state.scale_ups.get(&id).copied() else {
                continue;
            };
            let Some(view) = snap.group(&id) else {
                continue;
            };
            if view.upcoming() == 0 {
                self.state.scale_ups.remove(&id);
                self.rec
                    .record(EventKind::Decided(Decision::ScaleUpCompleted { group: id }));
                continue;
            }
            if request.expected_add_time < snap.now {
                self.state.scale_ups.remove(&id);
                self.rec
                    .record(EventKind::Decided(Decision::ScaleUpTimedOut {
                        group: id.clone(),
                        increase: request.increase,
                    }));
                let message = format!(
                    "scale-up of {} node(s) did not complete in time",
                    request.increase
                );
                self.back_off(&id, OTHER_ERROR_CLASS, "timeout", message, snap.now);
                if self.config.revert_timed_out_scale_ups {
                    // Failure is only logged by the autoscaler.
                    let _ = self
                        .client
                        .decrease_target_size(&id, -request.increase, &mut self.rec)
                        .await;
                }
            }
        }
    }

    /// clusterstate's `handleInstanceCreationErrors`: each newly failed instance backs its group
    /// off (once per error code) and no longer counts towards the scale-up request.
    fn handle_creation_errors(&mut self, snap: &Snapshot) {
        let mut current = HashSet::new();
        for v in &snap.groups {
            let mut new_by_code: Vec<(String, i32, String, usize)> = Vec::new();
            for inst in v.instances.iter().filter(|i| is_create_error(i)) {
                current.insert(inst.id.clone());
                if self.state.known_create_errors.contains(&inst.id) {
                    continue;
                }
                let Some(info) = inst.status.as_ref().and_then(|s| s.error_info.as_ref()) else {
                    continue;
                };
                match new_by_code
                    .iter_mut()
                    .find(|(code, ..)| *code == info.error_code)
                {
                    Some(entry) => entry.3 += 1,
                    None => new_by_code.push((
                        info.error_code.clone(),
                        info.instance_error_class,
                        info.error_message.clone(),
                        1,
                    )),
                }
            }
            let mut failed = 0;
            for (code, class, message, count) in new_by_code {
                failed += count;
                self.back_off(&v.group.id, class, &code, message, snap.now);
            }
            if failed > 0
                && let Some(req) = self.state.scale_ups.get_mut(&v.group.id)
            {
                req.increase -= to_i32(failed);
                if req.increase <= 0 {
                    self.state.scale_ups.remove(&v.group.id);
                }
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

    /// `removeOldUnregisteredNodes`: instances without a node past the provision time are
    /// deleted with fake nodes, through the group NodeGroupForNode names, down to its min.
    async fn remove_old_unregistered(&mut self, snap: &Snapshot) {
        let mut by_group: Vec<(pb::NodeGroup, Vec<KubeNode>)> = Vec::new();
        let long = snap.unregistered.iter().filter(|(_, long)| *long);
        for (id, _) in long {
            let fake = KubeNode::fake(id, FAKE_NODE_UNREGISTERED);
            let reason = match self.client.node_group_for_node(&fake, &mut self.rec).await {
                Ok(Some(group)) => {
                    match by_group.iter_mut().find(|(g, _)| g.id == group.id) {
                        Some((_, list)) => list.push(fake),
                        None => by_group.push((group, vec![fake])),
                    }
                    continue;
                }
                Ok(None) => "NodeGroupForNode names no node group for it".to_owned(),
                Err(e) => format!("NodeGroupForNode failed: {e}"),
            };
            self.rec
                .record(EventKind::Decided(Decision::KeepUnregistered {
                    instance: id.clone(),
                    reason,
                }));
        }
        for (group, mut fakes) in by_group {
            let Ok(target) = self.client.target_size(&group.id, &mut self.rec).await else {
                continue;
            };
            let possible = usize::try_from(target - group.min_size).unwrap_or(0);
            let kept = fakes.split_off(possible.min(fakes.len()));
            for k in kept {
                self.rec
                    .record(EventKind::Decided(Decision::KeepUnregistered {
                        instance: k.name,
                        reason: format!(
                            "{} is at its min size {} (target {target})",
                            group.id, group.min_size
                        ),
                    }));
            }
            if fakes.is_empty() {
                continue;
            }
            self.rec
                .record(EventKind::Decided(Decision::DeleteUnregistered {
                    group: group.id.clone(),
                    instances: fakes.iter().map(|f| f.name.clone()).collect(),
                }));
            // Failure is only logged by the autoscaler; it retries next loop.
            let _ = self
                .client
                .delete_nodes(&group.id, &fakes, &mut self.rec)
                .await;
        }
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

    /// `deleteCreatedNodesWithErrors`: every instance Creating with an errorInfo is deleted,
    /// with fake nodes, every loop it is listed.
    async fn delete_created_with_errors(&mut self, snap: &Snapshot) {
        for v in snap.groups.iter().filter(|v| !v.create_errors.is_empty()) {
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
            let _ = self
                .client
                .delete_nodes(&v.group.id, &fakes, &mut self.rec)
                .await;
        }
    }

    /// `fixNodeGroupSize`: a group whose registered count stayed below target for longer than
    /// the provision time has its target lowered by the difference. True if anything was fixed;
    /// an error aborts the loop.
    async fn fix_node_group_sizes(&mut self, snap: &Snapshot) -> Result<bool, String> {
        let mut fixed = false;
        for v in &snap.groups {
            let Some(inc) = self.state.incorrect_sizes.get(&v.group.id).copied() else {
                continue;
            };
            if inc.first_observed + self.config.max_node_provision_time >= snap.now {
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

    /// Scale-up: what upcoming nodes do not cover goes to the first group that is neither
    /// backed off nor at max, has a node template, and (for pods) has a template some pending
    /// pod fits; the increase is capped at max.
    async fn scale_up(&mut self, snap: &Snapshot, pending: Pending) {
        let now = snap.now;
        // Upcoming nodes count only for groups with a live scale-up request and no backoff.
        let upcoming_groups: Vec<&GroupView> = snap
            .groups
            .iter()
            .filter(|v| {
                self.state.scale_ups.contains_key(&v.group.id)
                    && !self.state.backed_off(&v.group.id, now)
            })
            .collect();
        let upcoming =
            u32::try_from(upcoming_groups.iter().map(|v| v.upcoming()).sum::<i32>()).unwrap_or(0);
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
                for v in &upcoming_groups {
                    let Some(Ok(t)) = snap.templates.get(&v.group.id) else {
                        continue;
                    };
                    let mut room = vec![t.allocatable; usize::try_from(v.upcoming()).unwrap_or(0)];
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
            if v.target >= v.group.max_size {
                reasons.push(format!("{id} at max size {}", v.group.max_size));
                continue;
            }
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
            let need = i32::try_from(nodes).unwrap_or(i32::MAX);
            let delta = need.min(v.group.max_size - v.target);
            self.rec.record(EventKind::Decided(Decision::ScaleUp {
                group: id.clone(),
                delta,
                pending: pending_nodes,
                upcoming,
            }));
            match self.client.increase_size(id, delta, &mut self.rec).await {
                Ok(()) => {
                    let expected_add_time = now + self.config.max_node_provision_time;
                    self.state
                        .scale_ups
                        .entry(id.clone())
                        .and_modify(|r| {
                            r.increase += delta;
                            r.expected_add_time = expected_add_time;
                        })
                        .or_insert(ScaleUpRequest {
                            increase: delta,
                            expected_add_time,
                        });
                    self.state.last_scale_up = Some(now);
                    // The autoscaler recalculates cluster state right after a scale-up.
                    for g in &snap.groups {
                        let _ = self.client.target_size(&g.group.id, &mut self.rec).await;
                    }
                }
                Err(e) => {
                    self.back_off(
                        id,
                        OTHER_ERROR_CLASS,
                        "cloudProviderError",
                        e.to_string(),
                        now,
                    );
                }
            }
            return;
        }
        if reasons.is_empty() {
            reasons.push("no node group".into());
        }
        self.rec.record(EventKind::Decided(Decision::NoScaleUp {
            reason: reasons.join(", "),
        }));
    }

    /// Scale-down: Ready nodes beyond the workload's need and NotReady nodes become candidates;
    /// after the unneeded (resp. unready) time they are deleted as real nodes, never below the
    /// min size of the group NodeGroupForNode returns for them.
    async fn scale_down(&mut self, snap: &Snapshot, needed: Option<u32>) {
        let now = snap.now;
        // The scale-down pre-filter asks for every node's group again (cached unless id "").
        let mut candidate_group: Vec<Option<pb::NodeGroup>> = Vec::with_capacity(snap.nodes.len());
        for node in &snap.nodes {
            let answer = self.client.node_group_for_node(node, &mut self.rec).await;
            candidate_group.push(answer.ok().flatten());
        }
        let managed = |i: &usize| {
            candidate_group[*i]
                .as_ref()
                .is_some_and(|g| snap.group(&g.id).is_some())
        };

        let mut ready: Vec<usize> = snap
            .groups
            .iter()
            .flat_map(|v| v.ready.iter().copied())
            .filter(managed)
            .collect();
        let unready: Vec<usize> = snap
            .groups
            .iter()
            .flat_map(|v| v.unready.iter().copied())
            .filter(managed)
            .collect();
        let surplus = needed.map_or(0, |n| snap.ready_managed.saturating_sub(n as usize));
        // Keep the same nodes unneeded from loop to loop; otherwise the newest first.
        ready.sort_by_key(|&i| {
            let node = &snap.nodes[i];
            let key = node.cache_key();
            (
                !self.state.unneeded_since.contains_key(&key),
                Reverse(self.state.node_first_seen.get(&key).copied()),
                Reverse(node.name.clone()),
            )
        });
        let mut candidates: Vec<(usize, ScaleDownReason)> = ready
            .into_iter()
            .take(surplus)
            .map(|i| (i, ScaleDownReason::Unneeded))
            .collect();
        candidates.extend(unready.into_iter().map(|i| (i, ScaleDownReason::Unready)));

        let keys: HashSet<String> = candidates
            .iter()
            .map(|(i, _)| snap.nodes[*i].cache_key())
            .collect();
        self.state.unneeded_since.retain(|k, _| keys.contains(k));
        for (i, reason) in &candidates {
            let key = snap.nodes[*i].cache_key();
            if let std::collections::hash_map::Entry::Vacant(e) =
                self.state.unneeded_since.entry(key)
            {
                e.insert(now);
                self.rec.record(EventKind::Decided(Decision::NodeUnneeded {
                    node: snap.nodes[*i].name.clone(),
                    reason: *reason,
                }));
            }
        }
        if candidates.is_empty() {
            return;
        }

        let cooldown_end = [
            self.state
                .last_scale_up
                .map(|t| t + self.config.scale_down_delay_after_add),
            self.state
                .last_scale_down_failure
                .map(|t| t + self.config.scale_down_delay_after_failure),
        ]
        .into_iter()
        .flatten()
        .max();
        if let Some(end) = cooldown_end.filter(|end| *end > now) {
            self.rec
                .record(EventKind::Decided(Decision::ScaleDownCooldown {
                    remaining: end - now,
                }));
            return;
        }

        let mut due: Vec<(usize, ScaleDownReason, Instant)> = candidates
            .into_iter()
            .filter_map(|(i, reason)| {
                let since = *self.state.unneeded_since.get(&snap.nodes[i].cache_key())?;
                let wait = match reason {
                    ScaleDownReason::Unneeded => self.config.scale_down_unneeded_time,
                    ScaleDownReason::Unready => self.config.scale_down_unready_time,
                };
                (since + wait <= now).then_some((i, reason, since))
            })
            .collect();
        due.sort_by(|a, b| {
            a.2.cmp(&b.2)
                .then_with(|| snap.nodes[a.0].name.cmp(&snap.nodes[b.0].name))
        });

        let mut chosen_per_group: HashMap<String, i32> = HashMap::new();
        let mut batches: Vec<(String, Vec<(KubeNode, ScaleDownReason)>)> = Vec::new();
        for (i, reason, _) in due {
            let node = &snap.nodes[i];
            let Some(group) = &candidate_group[i] else {
                continue;
            };
            let Some(view) = snap.group(&group.id) else {
                continue;
            };
            let chosen = chosen_per_group.entry(group.id.clone()).or_default();
            if view.target - *chosen - 1 < group.min_size {
                self.rec
                    .record(EventKind::Decided(Decision::ScaleDownBlocked {
                        node: node.name.clone(),
                        reason: format!(
                            "{} would go below its min size {} (target {}, {} already chosen)",
                            group.id, group.min_size, view.target, chosen
                        ),
                    }));
                continue;
            }
            *chosen += 1;
            let entry = (node.clone(), reason);
            match self.config.delete_batching {
                DeleteBatching::PerGroup => {
                    match batches.iter_mut().find(|(g, _)| *g == group.id) {
                        Some((_, list)) => list.push(entry),
                        None => batches.push((group.id.clone(), vec![entry])),
                    }
                }
                DeleteBatching::PerNode => batches.push((group.id.clone(), vec![entry])),
            }
        }
        if batches.is_empty() {
            return;
        }
        for (group, list) in &batches {
            self.rec.record(EventKind::Decided(Decision::ScaleDown {
                group: group.clone(),
                nodes: list
                    .iter()
                    .map(|(n, reason)| RemovedNode {
                        name: n.name.clone(),
                        provider_id: n.provider_id.clone(),
                        reason: *reason,
                    })
                    .collect(),
            }));
        }
        let results = self.run_deletions(&batches).await;
        for ((_, list), (request, started, timed)) in batches.iter().zip(results) {
            if timed.outcome.is_ok() {
                for (node, _) in list {
                    let key = node.cache_key();
                    self.state.unneeded_since.remove(&key);
                    self.state.being_deleted.insert(key);
                }
            } else {
                self.state.last_scale_down_failure = Some(now);
            }
            self.rec.record_call(request, started, timed);
        }
    }

    async fn run_deletions(
        &self,
        batches: &[(String, Vec<(KubeNode, ScaleDownReason)>)],
    ) -> Vec<(Request, Instant, Timed<Reply>)> {
        let deadline = self.config.call_deadline;
        let jobs = batches.iter().map(|(group, list)| {
            (
                group.clone(),
                list.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
            )
        });
        if !self.config.parallel_deletes {
            let mut out = Vec::with_capacity(batches.len());
            for (group, nodes) in jobs {
                out.push(
                    delete_nodes_call(self.client.grpc.clone(), deadline, &group, &nodes).await,
                );
            }
            return out;
        }
        let handles: Vec<_> = jobs
            .map(|(group, nodes)| {
                let grpc = self.client.grpc.clone();
                let started = Instant::now();
                let request = Request::NodeGroupDeleteNodes {
                    id: group.clone(),
                    nodes: nodes.iter().map(KubeNode::to_grpc).collect(),
                };
                let handle =
                    tokio::spawn(
                        async move { delete_nodes_call(grpc, deadline, &group, &nodes).await },
                    );
                (request, started, handle)
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for (request, started, handle) in handles {
            out.push(handle.await.unwrap_or_else(|e| {
                let failed = Timed {
                    outcome: Err(RpcError {
                        code: tonic::Code::Internal,
                        message: format!("deletion task failed: {e}"),
                    }),
                    latency: started.elapsed(),
                };
                (request, started, failed)
            }));
        }
        out
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
    /// register (not Deleting, no error), with whether they passed the provision time.
    fn track_unregistered(
        &mut self,
        nodes: &[KubeNode],
        instances: &[Vec<pb::Instance>],
        now: Instant,
        provision: Duration,
    ) -> Vec<(String, bool)> {
        let provider_ids: HashSet<&str> = nodes
            .iter()
            .map(|n| n.provider_id.as_str())
            .filter(|p| !p.is_empty())
            .collect();
        let mut out: Vec<(String, bool)> = Vec::new();
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
            out.push((inst.id.clone(), since + provision < now));
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
        self.being_deleted.retain(|k| keys.contains(k));
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

    fn backed_off(&self, group: &str, now: Instant) -> bool {
        self.backoffs.get(group).is_some_and(|b| b.until > now)
    }
}
