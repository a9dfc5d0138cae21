//! What the loop repairs before it scales: node group sizes that do not match their nodes
//! (tracked by cluster state, fixed by `fixNodeGroupSize`), instances that never registered
//! and those whose creation failed (deleted with fake nodes), and the health check that stops
//! the loop when too many nodes are unready. Follows `core/static_autoscaler.go`
//! (`removeOldUnregisteredNodes`, `deleteCreatedNodesWithErrors`, `fixNodeGroupSize`) and
//! `clusterstate/clusterstate.go` (`updateIncorrectNodeGroupSizes`, `IsClusterHealthy`) at
//! cluster-autoscaler-1.33.0 and 1.35.0.

use std::collections::HashSet;

use super::{IncorrectSize, MockAutoscaler, Snapshot, to_i32};
use crate::autoscaler::background::{lock, passed};
use crate::autoscaler::nodes::{FAKE_NODE_CREATE_ERROR, FAKE_NODE_UNREGISTERED, KubeNode};
use crate::autoscaler::timeline::{Decision, EventKind};
use crate::pb;

impl MockAutoscaler {
    /// clusterstate's `updateIncorrectNodeGroupSizes`.
    pub(super) fn update_incorrect_sizes(&mut self, snap: &Snapshot) {
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
    pub(super) async fn remove_old_unregistered(&mut self, snap: &Snapshot) {
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

    pub(super) fn cluster_unhealthy(&mut self, snap: &Snapshot) -> bool {
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
    pub(super) async fn delete_created_with_errors(&mut self, snap: &Snapshot) {
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
    pub(super) async fn fix_node_group_sizes(&mut self, snap: &Snapshot) -> Result<bool, String> {
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
}
