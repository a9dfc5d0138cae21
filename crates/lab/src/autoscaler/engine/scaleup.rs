//! Scale-up: the upcoming nodes each group counts, and the choice of a group and its increase
//! for the pending demand they leave. Follows `clusterstate/clusterstate.go`
//! (`GetUpcomingNodes`), `core/static_autoscaler.go` (`addUpcomingNodesToClusterSnapshot`) and
//! `core/scaleup/orchestrator/orchestrator.go` (`ScaleUpOrchestrator.ScaleUp`) at
//! cluster-autoscaler-1.33.0 and 1.35.0 (1.36.0 where it differs).

use super::demand::Pending;
use super::scale_requests::OTHER_ERROR_CLASS;
use super::{GroupView, MockAutoscaler, Snapshot};
use crate::autoscaler::pods::{PodSpec, TemplateSource, place};
use crate::autoscaler::timeline::{Decision, EventKind, Observation, UpcomingNodes};

impl MockAutoscaler {
    /// `GetUpcomingNodes` (`clusterstate/clusterstate.go`) with `addUpcomingNodesToClusterSnapshot`
    /// (`core/static_autoscaler.go`), checked at cluster-autoscaler-1.28.0, 1.33.0, 1.35.0 and
    /// 1.36.0: per group, target − (Ready + Unready + LongUnregistered); Deleted nodes (the
    /// ToBeDeleted taint, as the client has no HasInstance: `hasCloudProviderInstance`) and
    /// NotStarted and unregistered ones are not subtracted, so they count as upcoming. From
    /// 1.36 (commit 251652c2ee) a group without a scale-up request, or backed off, has none;
    /// a group without a template gets no copies (`getUpcomingNodeInfos`). Each group's count
    /// is recorded ([`Observation::Upcoming`]); returns those injected, by group.
    pub(super) fn upcoming_nodes(&mut self, snap: &Snapshot) -> Vec<(String, u32)> {
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
    pub(super) async fn scale_up(
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
