//! Cluster state: `ClusterStateRegistry.Start` (the NodeGroupNodes cache filled before the
//! first loop), the node list with the GPU readiness filter, and the cluster-state update that
//! builds each loop's [`Snapshot`]: the instances per group through the cache, readiness and
//! startup times, unregistered instances and their groups, node and group observations.
//! Follows `clusterstate/clusterstate.go` (`UpdateNodes`, `updateReadinessStats`,
//! `getNotRegisteredNodes`), `core/static_autoscaler.go` (`obtainNodeLists`) and
//! `clusterstate/utils/node_instances_cache.go` at cluster-autoscaler-1.33.0 and 1.35.0.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{CoreState, GroupView, MockAutoscaler, Snapshot, Templates};
use crate::autoscaler::background::{lock, passed};
use crate::autoscaler::calls::nodes_call;
use crate::autoscaler::nodes::{FAKE_NODE_UNREGISTERED, KubeNode};
use crate::autoscaler::timeline::{
    EventKind, GroupObservation, InstanceCounts, Observation, Reply, has_error,
};
use crate::pb;
use cks_proto::instance_status::InstanceState;

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
pub(super) fn is_create_error(i: &pb::Instance) -> bool {
    i.status
        .as_ref()
        .is_some_and(|s| s.instance_state == InstanceState::InstanceCreating as i32)
        && has_error(i)
}

impl MockAutoscaler {
    /// `ClusterStateRegistry.Start`, before the first loop: the NodeGroupNodes cache is filled
    /// (`CloudProviderNodeInstancesCache.Refresh`: NodeGroups, then every group's instances;
    /// a failed listing is stored as an empty one) and refreshed every
    /// [`AutoscalerConfig::instances_cache_refresh_interval`][interval] from then on. The real
    /// one runs the first refresh in that goroutine too; here the first loop waits for it, so
    /// its calls come first, before any Refresh, as they in practice do.
    ///
    /// [interval]: crate::autoscaler::AutoscalerConfig::instances_cache_refresh_interval
    pub(super) async fn start_cluster_state(&mut self) {
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
    pub(super) async fn filter_gpu_unready(&mut self, nodes: &mut [KubeNode]) {
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
    pub(super) async fn cloud_provider_node_instances(
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
    pub(super) async fn readiness_lookups(
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
    pub(super) async fn classify_unregistered(
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

    pub(super) fn build_snapshot(
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

    pub(super) fn observe(&mut self, snap: &Snapshot) {
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
}

impl CoreState {
    /// Instances listed by NodeGroupNodes whose id is no node's providerID and that should
    /// register (not Deleting, no error), with when each was first seen so
    /// (`getNotRegisteredNodes`, `updateUnregisteredNodes`).
    pub(super) fn track_unregistered(
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

    pub(super) fn track_nodes(&mut self, nodes: &[KubeNode], now: Instant) {
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
}
