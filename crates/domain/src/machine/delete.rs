//! DeleteNodes: the named nodes resolved, all or nothing, and guarded (workers only, never the
//! last one, the group's minimum, no VM whose node is registered named as "unregistered", no
//! drain bound to fail); then their VMs accepted into the queue, which sends them, and
//! placeholders dropped locally.

use super::error::ScaleError;
use super::nodes::Hit;
use super::queue::QueuedRemoval;
use super::{Hold, Phase, ScaleMachine};
use crate::cluster::{ClusterState, NodeRole};
use crate::nodeid::{FAKE_NODE_REASON_ANNOTATION, vm_id_from_provider_id};
use crate::registry::Registrations;
use crate::removal::StopStage;
use crate::rules::{AlertScaling, Refusal, ScaleRequest, check_down_removal, check_scale};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// The outcome of an accepted DeleteNodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Nothing needs CloudStack: every node was gone, already queued or being removed, or only
    /// placeholders were dropped.
    Done,
    /// Queued at rest, and this call opened the collection window: the shell closes it after
    /// the window ([`ScaleMachine::close_window`]).
    OpensWindow,
    /// Queued into the open window.
    JoinsWindow,
    /// Queued behind the operation in flight; sent when it ends.
    Behind,
}

/// An accepted DeleteNodes: how it was accepted, and the fake "unregistered" nodes of it
/// that were refused (a VM whose node is registered). The core's `removeOldUnregisteredNodes`
/// sends all of a group's unregistered nodes in one call; one guarded VM must not keep the
/// others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acceptance {
    pub accepted: Accepted,
    pub refused: Vec<ScaleError>,
    /// The VMs this call queued for removal: the removals its caller is promised
    /// ([`ScaleMachine::promise_removals`] when its deadline comes before the window's answer).
    pub vm_ids: Vec<String>,
    /// What of its promise is only queued and its caller's alone, for
    /// [`ScaleMachine::reply_to_removal`].
    pub hold: Hold,
}

/// Instances a removal drops without CloudStack (they have no VM, or their VM goes with it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalDrops {
    /// Failed-instance ids (placeholders or VMs of a failed scale-up).
    pub failed: Vec<String>,
    /// Placeholders of queued increases.
    pub queued: Vec<String>,
}

/// A node named in NodeGroupDeleteNodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRef {
    pub provider_id: String,
    pub name: String,
    pub annotations: HashMap<String, String>,
}

/// What a DeleteNodes resolved to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeletePlan {
    /// Worker VMs to remove through CloudStack.
    pub vms: Vec<String>,
    /// Those of `vms` that run without a node: stopped first, then removed as down VMs.
    pub stops: Vec<String>,
    /// Instances dropped locally.
    pub drops: LocalDrops,
    /// Fake "unregistered" nodes refused because their VM's node is registered.
    pub guarded: Vec<ScaleError>,
    /// VMs already queued or in the removal in flight: this call's OK promises them too.
    pub joined: Vec<String>,
}

impl ScaleMachine {
    /// Why a Running VM without a node cannot be stopped before its removal, if it cannot:
    /// the key lacks `stopVirtualMachine`, or this CloudStack refuses scaling in Alert (where
    /// a stopped worker puts the cluster) and drains down VMs too.
    fn stop_blocked(&self, alert: &AlertScaling) -> Option<&'static str> {
        if matches!(alert, AlertScaling::Unsupported { .. }) {
            Some(
                "This CloudStack does not scale a cluster in Alert, so a stopped VM cannot be \
                 removed either; remove it by hand",
            )
        } else if !self.can_stop_vms {
            Some("The CloudStack key of this provider may not call stopVirtualMachine")
        } else {
            None
        }
    }

    /// DeleteNodes: resolves every node (all or nothing); checks the bounds against everything
    /// queued and in flight (the group's minimum, never the last worker, never a control, etcd
    /// or external VM, never a VM whose node is `registered` through a fake "unregistered"
    /// node) and, with the cluster at rest, CloudStack's rules for the merged request; then
    /// queues the VMs (the target drops at once) and drops placeholders locally. A refusal
    /// changes nothing. The rules are checked again when the merged request is sent (a job
    /// running now may change the cluster).
    #[cfg(test)]
    pub(crate) fn accept_removal(
        &mut self,
        nodes: &[NodeRef],
        min: u32,
        alert: &AlertScaling,
        registered: &Registrations,
        now: Instant,
    ) -> Result<Accepted, ScaleError> {
        self.accept_removals(nodes, min, alert, registered, now)
            .map(|a| a.accepted)
    }

    /// `accept_removal` (the single-call form the tests use), also naming the fake
    /// "unregistered" nodes refused because their VM's node is registered (the others of the
    /// call are accepted).
    pub fn accept_removals(
        &mut self,
        nodes: &[NodeRef],
        min: u32,
        alert: &AlertScaling,
        registered: &Registrations,
        now: Instant,
    ) -> Result<Acceptance, ScaleError> {
        let mut plan = self.plan_removal(nodes, min, alert, registered, now)?;
        let refused = std::mem::take(&mut plan.guarded);
        let snap = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
        let at_rest = self.phase == Phase::Idle && snap.snap.state != ClusterState::Scaling;
        // Whatever is in flight, a down worker's removal can never succeed on a CloudStack
        // without Alert scaling: refused before it is promised.
        check_down_removal(&snap.snap, &plan.vms, alert).map_err(ScaleError::Refused)?;
        if !plan.vms.is_empty() {
            let mut merged: Vec<String> = self
                .queue
                .remove
                .iter()
                .filter(|r| r.stop == StopStage::NotNeeded && !r.abandoned)
                .map(|r| r.vm_id.clone())
                .collect();
            merged.extend(plan.vms.iter().cloned());
            let removing = self.removing();
            let live = snap.snap.workers().filter(|v| !v.state.is_gone()).count();
            let staying = snap
                .snap
                .workers()
                .filter(|v| {
                    !v.state.is_gone()
                        && !removing.contains(v.id.as_str())
                        && !plan.vms.contains(&v.id)
                })
                .count();
            if staying == 0 {
                return Err(ScaleError::Refused(Refusal::RemovesAllWorkers {
                    cluster: snap.snap.name.clone(),
                    workers: u32::try_from(live).unwrap_or(u32::MAX),
                }));
            }
            // VMs to be stopped first are checked when they are down and their turn comes.
            merged.retain(|v| !plan.stops.contains(v));
            if at_rest && !merged.is_empty() {
                check_scale(
                    &snap.snap,
                    &ScaleRequest::RemoveNodes { vm_ids: merged },
                    alert,
                )
                .map_err(ScaleError::Refused)?;
            } else if at_rest
                && let Some(s) = self.stranded()
                && s.rule == crate::stranded::StrandRule::VmCount
            {
                // Only VMs to stop first: a stop cannot mend CloudStack's VM count (Alert rule
                // 5), so their removal would be refused once they are down; refused now,
                // before a VM is stopped for nothing.
                return Err(ScaleError::Refused(s.refusal()));
            }
        }
        self.apply_drops(&plan.drops);
        // VMs it names that another caller's promise holds are neither caller's alone.
        let mut named = plan.joined.clone();
        named.extend(plan.vms.iter().cloned());
        let shared = self.pin_holds(&named);
        let hold = if !shared
            && plan.joined.is_empty()
            && plan.drops.failed.is_empty()
            && plan.drops.queued.is_empty()
        {
            Hold::removals(plan.vms.clone())
        } else {
            Hold::pinned()
        };
        if plan.vms.is_empty() {
            // Answered OK now: a removal it names that is queued or in flight for another
            // caller, whose answer may still be an error, is owed from now on.
            self.promise_removals(&plan.joined);
            return Ok(Acceptance {
                accepted: Accepted::Done,
                refused,
                vm_ids: plan.joined,
                hold: Hold::default(),
            });
        }
        let mut vm_ids = plan.vms.clone();
        vm_ids.extend(plan.joined.iter().cloned());
        for vm_id in plan.vms {
            let name = snap
                .snap
                .vm(&vm_id)
                .map(|v| v.name.to_ascii_lowercase())
                .unwrap_or_default();
            let mut r = QueuedRemoval::new(vm_id, name, now, at_rest);
            if plan.stops.contains(&r.vm_id) {
                r.stop = StopStage::Wanted;
            }
            self.queue.remove.push(r);
        }
        let accepted = if !at_rest {
            Accepted::Behind
        } else if self.queue.window_open {
            Accepted::JoinsWindow
        } else {
            self.queue.window_open = true;
            Accepted::OpensWindow
        };
        Ok(Acceptance {
            accepted,
            refused,
            vm_ids,
            hold,
        })
    }

    /// Resolves the nodes of a DeleteNodes (all or nothing) and checks the group's minimum.
    /// An empty `vms` means nothing needs CloudStack.
    pub(super) fn plan_removal(
        &self,
        nodes: &[NodeRef],
        min: u32,
        alert: &AlertScaling,
        registered: &Registrations,
        now: Instant,
    ) -> Result<DeletePlan, ScaleError> {
        let s = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
        let removing = self.removing();
        let mut plan = DeletePlan::default();
        let mut seen = HashSet::new();
        let mut counted = 0u32;
        for n in nodes {
            let shown = if n.name.is_empty() {
                &n.provider_id
            } else {
                &n.name
            };
            let reason = n
                .annotations
                .get(FAKE_NODE_REASON_ANNOTATION)
                .map(String::as_str);
            let Some(hit) = self.resolve(&n.provider_id, &n.name) else {
                let gone = vm_id_from_provider_id(&n.provider_id)
                    .is_some_and(|id| self.recently_removed.contains_key(id))
                    || (!n.name.is_empty()
                        && self
                            .recently_removed
                            .contains_key(&n.name.to_ascii_lowercase()));
                // A placeholder of this group's that is no longer pending: its request was
                // fulfilled (a VM took its place) or cancelled. Either way it is gone.
                let spent_placeholder = self.cluster_id.as_ref().is_some_and(|c| {
                    n.provider_id
                        .strip_prefix("cks-placeholder://")
                        .and_then(|rest| rest.strip_prefix(c.as_str()))
                        .is_some_and(|rest| rest.starts_with('/'))
                });
                if gone || spent_placeholder {
                    // Already removed by this provider: deleting it again is done.
                    continue;
                }
                return Err(ScaleError::UnknownNode {
                    node: shown.clone(),
                    provider_id: n.provider_id.clone(),
                });
            };
            match hit {
                Hit::Vm(i) => {
                    let vm = &s.snap.vms[i];
                    if vm.role != NodeRole::Worker {
                        return Err(ScaleError::NotWorker {
                            node: shown.clone(),
                            role: vm.role.as_str(),
                            vm: vm.name.clone(),
                            cluster: s.snap.name.clone(),
                        });
                    }
                    if reason == Some("unregistered")
                        && let Some(l) = self.learned.get(&vm.id)
                    {
                        plan.guarded.push(ScaleError::RegisteredElsewhere {
                            vm: vm.name.clone(),
                            node: l.node_name.clone(),
                            provider_id: l.provider_id.clone(),
                            instance: n.provider_id.clone(),
                        });
                        continue;
                    }
                    if reason == Some("unregistered")
                        && let Some(r) = registered.recent(&vm.id, now)
                    {
                        plan.guarded.push(ScaleError::RecentlyRegistered {
                            vm: vm.name.clone(),
                            instance: shown.clone(),
                            node: r.node.clone(),
                            ago_secs: now.saturating_duration_since(r.seen).as_secs(),
                            window_secs: registered.window().as_secs(),
                        });
                        continue;
                    }
                    // Named twice, queued already or in the removal in flight: sent once.
                    if removing.contains(vm.id.as_str()) {
                        if seen.insert(vm.id.clone()) {
                            plan.joined.push(vm.id.clone());
                        }
                        continue;
                    }
                    if vm.state.is_gone() || !seen.insert(vm.id.clone()) {
                        continue;
                    }
                    let failed_vm = self
                        .failed
                        .iter()
                        .any(|f| f.vm_id.as_deref() == Some(&vm.id));
                    if reason != Some("create-error") && !failed_vm {
                        counted += 1;
                    }
                    // A fake node: the VM has no Kubernetes node. Running, CloudStack would
                    // drain it and fail (KubernetesClusterScaleWorker.removeKubernetesClusterNode
                    // runs `kubectl drain` for every Running VM).
                    if reason.is_some() && !vm.state.is_down() {
                        if let Some(why) = self.stop_blocked(alert) {
                            return Err(ScaleError::DrainWouldFail {
                                vm: vm.name.clone(),
                                vm_id: vm.id.clone(),
                                node: shown.clone(),
                                why,
                            });
                        }
                        plan.stops.push(vm.id.clone());
                    }
                    plan.vms.push(vm.id.clone());
                }
                Hit::FailedPlaceholder(id) => {
                    if seen.insert(id.clone()) {
                        plan.drops.failed.push(id);
                    }
                }
                Hit::Pending(id) => {
                    if !self.queue.increase.contains(&id) {
                        return Err(ScaleError::BeingCreated { instance: id });
                    }
                    if seen.insert(id.clone()) {
                        plan.drops.queued.push(id);
                    }
                }
            }
        }
        if plan.vms.is_empty()
            && plan.drops.failed.is_empty()
            && plan.drops.queued.is_empty()
            && let Some(first) = plan.guarded.first()
        {
            return Err(first.clone());
        }
        // The minimum binds removals of healthy nodes: failed creations go whatever the
        // minimum, as the core's deleteCreatedNodesWithErrors sends them. The target already
        // excludes everything queued, so the bound holds against all of it.
        if counted > 0 {
            let target = self.target().unwrap_or(s.snap.size);
            let removed =
                (plan.vms.len() + plan.drops.failed.len() + plan.drops.queued.len()) as u32;
            if target.saturating_sub(removed) < min {
                return Err(ScaleError::BelowMin {
                    removed,
                    target,
                    min,
                });
            }
        }
        Ok(plan)
    }

    /// Drops the failed placeholders and queued increases a removal names (nothing needs
    /// CloudStack for them).
    fn apply_drops(&mut self, drops: &LocalDrops) {
        self.failed.retain(|f| !drops.failed.contains(&f.id));
        self.queue.increase.retain(|p| !drops.queued.contains(p));
    }
}
