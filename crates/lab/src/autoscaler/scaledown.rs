//! Scale-down as the real loop plans and starts it (`core/static_autoscaler.go` `RunOnce`,
//! scale-down part, at cluster-autoscaler-1.33.0 and 1.35.0), with the workload standing in
//! for the scheduler simulation. The deletions themselves run in the background
//! (`background.rs`).

use std::cmp::Reverse;
use std::collections::HashMap;

use tokio::time::Instant;

use super::background::{Deletion, passed};
use super::engine::{InProgress, MockAutoscaler, Snapshot, to_i32};
use super::nodes::KubeNode;
use super::timeline::{Decision, EventKind, RemovedNode, ScaleDownReason};
use crate::pb;

/// A node scale-down may remove this loop.
#[derive(Debug, Clone)]
struct Unneeded {
    index: usize,
    reason: ScaleDownReason,
    group: pb::NodeGroup,
    /// It has pods to move: drained, not deleted empty.
    drain: bool,
}

/// The nodes a loop starts deleting, per group.
type StartedByGroup = Vec<(String, Vec<(KubeNode, ScaleDownReason, bool)>)>;

impl MockAutoscaler {
    /// Scale-down, in the real order:
    ///
    /// 1. candidates (`PreFilteringScaleDownNodeProcessor.GetScaleDownCandidates`):
    ///    NodeGroupTargetSize of every group, NodeGroupForNode per node; nodes of no group, of
    ///    a group at or below its min size, registered nodes still starting, and nodes whose
    ///    deletion is in progress (`filterOutOngoingDeletions`) are left out; with per-group
    ///    delays, nodes of a group that recently scaled up, deleted or failed to delete
    ///    (`ScaleDownCandidatesDelayProcessor`);
    /// 2. eligibility (`eligibility.go` `unremovableReasonAndNodeUtilization`): a node tainted
    ///    for deletion within the max deletion time is skipped; every other candidate asks
    ///    NodeGroupGetOptions twice (daemon-set utilization, utilization threshold), an error
    ///    making it ineligible;
    /// 3. unneeded nodes (the workload here): Ready nodes beyond the need, and NotReady ones;
    ///    each keeps the time it became unneeded while it stays so (`unneeded.Nodes.Update`);
    /// 4. cooldown (`isScaleDownInCooldown`): after a scale-up (delay after add) or a started
    ///    deletion (delay after delete); never after a failed NodeGroupDeleteNodes with the
    ///    global delays, which are the default;
    /// 5. `NodesToDelete` (`unneeded.Nodes.RemovableAt`): NodeGroupTargetSize of every group;
    ///    per unneeded node its group's NodeGroupGetOptions (unneeded or unready time; an error
    ///    keeps the node), the time check, and the min size (`verifyMinSize`: target minus
    ///    deletions in progress must stay above the min of the group NodeGroupForNode named);
    /// 6. budgets (`ScaleDownBudgetProcessor.CropNodes`): empty nodes first, within
    ///    `--max-scale-down-parallelism` minus deletions in progress, then nodes to drain, also
    ///    within `--max-drain-parallelism` minus drains in progress;
    /// 7. `StartDeletion`: every node tainted, its deletion started in the background, then
    ///    the cluster state recalculated (NodeGroupTargetSize of every group).
    pub(super) async fn scale_down(&mut self, snap: &Snapshot, needed: Option<u32>) {
        let now = snap.now;
        let local = self.config.scale_down_delay_type_local;
        let group_ids: Vec<String> = snap.groups.iter().map(|v| v.group.id.clone()).collect();

        // 1. Candidates.
        let mut sizes: HashMap<String, i32> = HashMap::new();
        for id in &group_ids {
            if let Ok(t) = self.client.target_size(id, &mut self.rec).await {
                sizes.insert(id.clone(), t);
            }
        }
        let mut candidate_group: Vec<Option<pb::NodeGroup>> = Vec::with_capacity(snap.nodes.len());
        for node in &snap.nodes {
            let answer = self.client.node_group_for_node(node, &mut self.rec).await;
            candidate_group.push(answer.ok().flatten());
        }
        let not_started: Vec<usize> = snap
            .groups
            .iter()
            .flat_map(|v| v.not_started.iter().copied())
            .collect();
        let mut candidates: Vec<usize> = Vec::new();
        for (i, node) in snap.nodes.iter().enumerate() {
            let Some(group) = &candidate_group[i] else {
                continue;
            };
            let Some(size) = sizes.get(&group.id) else {
                continue;
            };
            if *size <= group.min_size
                || not_started.contains(&i)
                || self.state.deleting.contains_key(&node.cache_key())
                || (local && self.in_group_delay(&group.id, now))
            {
                continue;
            }
            candidates.push(i);
        }

        // 2. Eligibility.
        let mut eligible: Vec<usize> = Vec::new();
        for i in candidates {
            let key = snap.nodes[i].cache_key();
            // `IsNodeBeingDeleted`: tainted less than the max deletion time ago.
            let being_deleted = self
                .state
                .tainted
                .get(&key)
                .is_some_and(|t| *t + self.config.max_cloud_provider_node_deletion_time > now);
            if being_deleted {
                continue;
            }
            let Some(group) = candidate_group[i].clone() else {
                continue;
            };
            if self.options(&group.id).await.is_err() || self.options(&group.id).await.is_err() {
                continue;
            }
            eligible.push(i);
        }

        // 3. Unneeded nodes.
        // A node tainted longer ago than the max deletion time is eligible again, and counts
        // beside the Ready nodes.
        let (mut ready, unready): (Vec<usize>, Vec<usize>) =
            eligible.iter().partition(|i| snap.nodes[**i].ready);
        let stale_tainted = ready
            .iter()
            .filter(|i| {
                self.state
                    .tainted
                    .contains_key(&snap.nodes[**i].cache_key())
            })
            .count();
        let surplus = needed.map_or(0, |n| {
            (snap.ready_managed + stale_tainted).saturating_sub(n as usize)
        });
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
        let mut unneeded: Vec<Unneeded> = Vec::new();
        let picked = ready
            .into_iter()
            .take(surplus)
            .map(|i| (i, ScaleDownReason::Unneeded))
            .chain(unready.into_iter().map(|i| (i, ScaleDownReason::Unready)));
        for (index, reason) in picked {
            if let Some(group) = candidate_group[index].clone() {
                unneeded.push(Unneeded {
                    index,
                    reason,
                    group,
                    drain: snap.nodes[index].movable_pods > 0,
                });
            }
        }
        let keys: Vec<String> = unneeded
            .iter()
            .map(|u| snap.nodes[u.index].cache_key())
            .collect();
        self.state.unneeded_since.retain(|k, _| keys.contains(k));
        for u in &unneeded {
            let key = snap.nodes[u.index].cache_key();
            if let std::collections::hash_map::Entry::Vacant(e) =
                self.state.unneeded_since.entry(key)
            {
                e.insert(now);
                self.rec.record(EventKind::Decided(Decision::NodeUnneeded {
                    node: snap.nodes[u.index].name.clone(),
                    reason: u.reason,
                }));
            }
        }

        // 4. Cooldown.
        if !local {
            let cooldown_end = [
                self.state
                    .last_scale_up
                    .map(|t| t + self.config.scale_down_delay_after_add),
                self.state
                    .last_scale_down_delete
                    .map(|t| t + self.config.scale_down_delay_after_delete),
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
        }
        if unneeded.is_empty() {
            return;
        }

        // 5. NodesToDelete.
        let mut sizes: HashMap<String, i32> = HashMap::new();
        for id in &group_ids {
            if let Ok(t) = self.client.target_size(id, &mut self.rec).await {
                sizes.insert(id.clone(), t);
            }
        }
        unneeded.sort_by(|a, b| {
            let since = |u: &Unneeded| {
                self.state
                    .unneeded_since
                    .get(&snap.nodes[u.index].cache_key())
                    .copied()
            };
            since(a)
                .cmp(&since(b))
                .then_with(|| snap.nodes[a.index].name.cmp(&snap.nodes[b.index].name))
        });
        let mut removable: Vec<Unneeded> = Vec::new();
        for u in unneeded {
            let node = &snap.nodes[u.index];
            let Some(since) = self.state.unneeded_since.get(&node.cache_key()).copied() else {
                continue;
            };
            let options = match self.options(&u.group.id).await {
                Ok(o) => o,
                Err(e) => {
                    self.blocked(
                        node,
                        format!("NodeGroupGetOptions({}) failed: {e}", u.group.id),
                    );
                    continue;
                }
            };
            let wait = match u.reason {
                ScaleDownReason::Unneeded => options.scale_down_unneeded_time,
                ScaleDownReason::Unready => options.scale_down_unready_time,
            };
            if !passed(since, wait, now) {
                continue;
            }
            let Some(size) = sizes.get_mut(&u.group.id) else {
                continue;
            };
            let in_progress = to_i32(
                self.state
                    .deleting
                    .values()
                    .filter(|d| d.group == u.group.id)
                    .count(),
            );
            if *size - in_progress <= u.group.min_size {
                self.blocked(
                    node,
                    format!(
                        "{} would go below its min size {} (target {}, {} being deleted)",
                        u.group.id, u.group.min_size, size, in_progress
                    ),
                );
                continue;
            }
            *size -= 1;
            removable.push(u);
        }

        // 6. Budgets.
        let drains_in_progress = self.state.deleting.values().filter(|d| d.drain).count();
        let mut budget = self
            .config
            .max_scale_down_parallelism
            .saturating_sub(self.state.deleting.len());
        let mut chosen: Vec<Unneeded> = Vec::new();
        let mut cropped: Vec<(usize, String)> = Vec::new();
        let (drained, empty): (Vec<Unneeded>, Vec<Unneeded>) =
            removable.into_iter().partition(|u| u.drain);
        for r in empty {
            if budget == 0 {
                cropped.push((r.index, "--max-scale-down-parallelism reached".into()));
                continue;
            }
            budget -= 1;
            chosen.push(r);
        }
        let mut drain_budget = self
            .config
            .max_drain_parallelism
            .saturating_sub(drains_in_progress)
            .min(budget);
        for r in drained {
            if drain_budget == 0 {
                cropped.push((r.index, "--max-drain-parallelism reached".into()));
                continue;
            }
            drain_budget -= 1;
            chosen.push(r);
        }
        for (i, why) in cropped {
            self.blocked(&snap.nodes[i], why);
        }
        if chosen.is_empty() {
            return;
        }

        // 7. StartDeletion.
        let mut by_group: StartedByGroup = Vec::new();
        for u in chosen {
            let node = snap.nodes[u.index].clone();
            let entry = (node, u.reason, u.drain);
            match by_group.iter_mut().find(|(g, _)| *g == u.group.id) {
                Some((_, list)) => list.push(entry),
                None => by_group.push((u.group.id.clone(), vec![entry])),
            }
        }
        for (group, list) in by_group {
            self.rec.record(EventKind::Decided(Decision::ScaleDown {
                group: group.clone(),
                nodes: list
                    .iter()
                    .map(|(n, reason, _)| RemovedNode {
                        name: n.name.clone(),
                        provider_id: n.provider_id.clone(),
                        reason: *reason,
                    })
                    .collect(),
            }));
            let mut deletions = Vec::with_capacity(list.len());
            for (node, _, drain) in list {
                let key = node.cache_key();
                self.state.tainted.insert(key.clone(), now);
                self.state.deleting.insert(
                    key,
                    InProgress {
                        group: group.clone(),
                        drain,
                    },
                );
                deletions.push(Deletion { node, drain });
            }
            let client = (self.client.grpc.clone(), self.client.group_for_node.clone());
            self.bg
                .start_deletion(client, &self.config, &group, deletions);
        }
        self.state.last_scale_down_delete = Some(now);
        self.recalculate(&group_ids).await;
    }

    fn blocked(&mut self, node: &KubeNode, reason: String) {
        self.rec
            .record(EventKind::Decided(Decision::ScaleDownBlocked {
                node: node.name.clone(),
                reason,
            }));
    }

    /// `ScaleDownCandidatesDelayProcessor.GetScaleDownCandidates`: the group scaled up,
    /// deleted a node, or failed to delete one within the matching delay.
    fn in_group_delay(&self, group: &str, now: Instant) -> bool {
        let Some(d) = self.state.group_delays.get(group) else {
            return false;
        };
        let recent = |t: Option<Instant>, delay| t.is_some_and(|t| t + delay > now);
        recent(d.scale_up, self.config.scale_down_delay_after_add)
            || recent(d.scale_down, self.config.scale_down_delay_after_delete)
            || recent(d.failure, self.config.scale_down_delay_after_failure)
    }
}
