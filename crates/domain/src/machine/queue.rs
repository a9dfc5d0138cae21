//! The work accepted but not sent yet ([`Queue`]): the collection window that merges
//! removals into one request, the next request when the phase returns to `Idle` (removals
//! first, then increases), and the removals still owed after a failure or a refusal: retried
//! after a pause, abandoned, or their VM stopped first.

use super::error::{ScaleError, refused_error};
use super::{Effect, IndexedSnapshot, OpKind, Origin, Phase, ScaleMachine};
use crate::cluster::ClusterState;
use crate::removal::{Candidate, StopStage, pick_batch};
use crate::rules::{AlertScaling, Refusal, ScaleRequest, check_scale};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Work accepted but not sent yet, sent when the phase returns to idle.
///
/// Increases are merged into one size request; removals into one `nodeids` request. The real
/// autoscaler deletes scale-down candidates with one NodeGroupDeleteNodes per node, in
/// parallel (`core/scaledown/actuation/actuator.go` `deleteNodesAsync` →
/// `group_deletion_scheduler.go` `ScheduleDeletion`), so removals arriving together are
/// collected in a short window ([`ScaleMachine::close_window`]) and sent as one request;
/// removals arriving while a job runs go out together when it ends.
///
/// Order when both wait: removals first, then increases. An increase is a size computed on
/// top of the VMs listed when it is sent; sent while accepted removals still wait, it would
/// take CloudStack's size past the group's maximum on the way (size + delta before the
/// removals take their nodes). So an increase arriving while removals are queued waits for
/// them too. Each request is computed from the snapshot at rest when its turn comes, so
/// neither is lost or miscounted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queue {
    /// One placeholder instance id per queued node.
    pub increase: Vec<String>,
    /// Worker VMs accepted for removal, in arrival order.
    pub remove: Vec<QueuedRemoval>,
    /// A DeleteNodes at rest opened the collection window; the removals are sent when the
    /// shell closes it ([`ScaleMachine::close_window`]), not with the next snapshot.
    pub window_open: bool,
    /// VMs whose removal a failure dropped before their callers were answered OK: a caller
    /// whose deadline comes now must hear the window's error, not OK
    /// ([`ScaleMachine::promise_removals`]). Cleared when the shell answers the window's
    /// callers ([`ScaleMachine::window_closed`]).
    pub dropped: Vec<String>,
}

/// A worker VM accepted for removal and not sent to CloudStack yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedRemoval {
    pub vm_id: String,
    /// Its name, lower-cased (a later DeleteNodes may name it so).
    pub name: String,
    pub since: Instant,
    /// Its caller has not been answered OK: it waits for the window's answer, or heard an
    /// error. Such a removal is not owed: a failure drops it (the autoscaler untaints the
    /// node), and its VM is not stopped. Cleared once the caller hears OK (the window's
    /// answer, or its own deadline: [`ScaleMachine::promise_removals`]); a removal accepted
    /// behind an operation in flight is answered OK at once and never has it.
    pub in_window: bool,
    /// Removal jobs that failed and left this VM.
    pub attempts: u32,
    /// Why it has not happened yet (a failed job, a refusal, a drain that cannot work):
    /// shown on its instance and in the logs.
    pub trouble: Option<String>,
    /// Not sent before this (the backoff after a failure or a refusal).
    pub not_before: Option<Instant>,
    /// Whether its VM must be stopped first (it runs, and its drain would fail).
    pub stop: StopStage,
    /// The next `stopVirtualMachine` not before this (after a failed one).
    pub stop_not_before: Option<Instant>,
    /// Given up after [`MAX_REMOVAL_ATTEMPTS`] failed jobs: still out of the target and
    /// reported, sent again only once its VM is down.
    pub abandoned: bool,
}

impl QueuedRemoval {
    pub(super) fn new(vm_id: String, name: String, since: Instant, in_window: bool) -> Self {
        QueuedRemoval {
            vm_id,
            name,
            since,
            in_window,
            attempts: 0,
            trouble: None,
            not_before: None,
            stop: StopStage::NotNeeded,
            stop_not_before: None,
            abandoned: false,
        }
    }
}

/// How long the collection window waits after its last arrival. The autoscaler sends the
/// DeleteNodes calls of one batch from parallel goroutines at once
/// (`core/scaledown/actuation/group_deletion_scheduler.go`, with the default
/// `--node-deletion-batcher-interval` of 0): they arrive within milliseconds of each other,
/// and a node it drained first arrives when its own drain ends, seconds apart, which no window
/// worth its wait would catch. So the window closes once the calls stop coming for this long,
/// rather than always waiting out `--removal-window`, which stays its cap: a lone removal waits
/// 0.1 s, not 0.5 s, before CloudStack starts on it.
pub const WINDOW_QUIET: Duration = Duration::from_millis(100);

impl ScaleMachine {
    /// When the open collection window closes: [`WINDOW_QUIET`] after its last arrival, at
    /// most `cap` (`--removal-window`) after its first. `None` when no caller waits in it
    /// (close it at once).
    pub fn window_closes_at(&self, cap: Duration) -> Option<Instant> {
        let arrivals = self
            .queue
            .remove
            .iter()
            .filter(|r| r.in_window)
            .map(|r| r.since);
        let (first, last) = arrivals.fold((None::<Instant>, None::<Instant>), |(f, l), t| {
            (
                Some(f.map_or(t, |f| f.min(t))),
                Some(l.map_or(t, |l| l.max(t))),
            )
        });
        Some((last? + WINDOW_QUIET.min(cap)).min(first? + cap))
    }

    /// The collection window ends: the queued removals go out as one request, or wait behind
    /// an operation that started meanwhile. `Err`: the rules refuse the merged request now;
    /// its removals are dropped (the target comes back) and the error says why.
    pub fn close_window(
        &mut self,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Vec<Effect>, ScaleError> {
        if !self.queue.window_open {
            return Ok(Vec::new());
        }
        self.queue.window_open = false;
        let at_rest = self.phase == Phase::Idle
            && self
                .snap
                .as_ref()
                .is_some_and(|s| s.snap.state != ClusterState::Scaling);
        if !at_rest {
            return Ok(Vec::new());
        }
        let sent = self.next_removal(Origin::Rpc, alert, now);
        match sent {
            // Nothing to send now (VMs to stop first): increases that waited go now.
            Ok(e) if e.is_empty() => Ok(self.next_from_queue(alert, now)),
            Err(e) => {
                self.window_answered(false);
                Err(e)
            }
            // Increases that waited for the window go with the next snapshot at rest.
            other => other,
        }
    }

    /// The window's removals cannot be decided (no fresh snapshot): those whose callers were
    /// not answered OK are dropped, so the callers' error is the whole truth. Removals already
    /// promised (accepted behind an operation, or a caller answered at its deadline) stay
    /// queued, owed.
    pub(crate) fn abort_window(&mut self) {
        if std::mem::take(&mut self.queue.window_open) {
            self.drop_unpromised_queued();
        }
    }

    /// The window's callers are answered: with OK its removals are owed from now on, queued or
    /// in the request in flight (the autoscaler keeps their nodes tainted and counts them as
    /// gone); with an error those not promised already are dropped (the autoscaler untaints
    /// the nodes and may delete them again later).
    pub(crate) fn window_answered(&mut self, ok: bool) {
        if ok {
            for r in self.queue.remove.iter_mut().chain(sent_in(&mut self.phase)) {
                r.in_window = false;
            }
        } else {
            self.drop_unpromised_queued();
        }
    }

    /// The shell has told the window's outcome to every caller waiting for it: the record of
    /// what a failure dropped is no longer needed.
    pub(crate) fn window_closed(&mut self) {
        self.queue.dropped.clear();
    }

    /// A caller's deadline came before its window's answer: its removals (`vm_ids`, the VMs
    /// its DeleteNodes queued) are owed from now on, wherever they are (queued, or in the
    /// request in flight), and the caller hears OK. `false` when a failure already dropped one
    /// of them: the caller must hear the window's error instead. A removal that completed
    /// meanwhile needs nothing.
    pub(crate) fn promise_removals(&mut self, vm_ids: &[String]) -> bool {
        if vm_ids.iter().any(|v| self.queue.dropped.contains(v)) {
            return false;
        }
        for r in self.queue.remove.iter_mut().chain(sent_in(&mut self.phase)) {
            if vm_ids.contains(&r.vm_id) {
                r.in_window = false;
            }
        }
        true
    }

    /// Drops the queued removals whose callers were not answered OK, noting their VMs.
    fn drop_unpromised_queued(&mut self) {
        let queued = std::mem::take(&mut self.queue.remove);
        self.queue.remove = self.owed_only(queued);
    }

    /// Of removals a failure leaves, those owed (their callers heard OK); the others are
    /// dropped and noted, so a caller whose deadline comes now hears the error.
    pub(super) fn owed_only(&mut self, removals: Vec<QueuedRemoval>) -> Vec<QueuedRemoval> {
        let (owed, dropped): (Vec<_>, Vec<_>) = removals.into_iter().partition(|r| !r.in_window);
        self.queue
            .dropped
            .extend(dropped.into_iter().map(|r| r.vm_id));
        owed
    }

    /// The next `nodeids` request from the owed removals: VMs that vanished meanwhile are
    /// done and forgotten; of those due (not backing off, not waiting to be stopped, not
    /// abandoned unless down) the request takes what CloudStack can finish
    /// ([`pick_batch`]: one VM that needs a drain, and down VMs). `Err`: the rules refuse it
    /// now; a window's removals (`Origin::Rpc`, callers not answered yet) are then dropped by
    /// the shell's [`ScaleMachine::window_answered`]; owed ones wait and are tried again.
    fn next_removal(
        &mut self,
        origin: Origin,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Vec<Effect>, ScaleError> {
        let Some(snap) = self.snap.clone() else {
            return Ok(Vec::new());
        };
        let listed = |id: &str| {
            snap.by_id
                .get(id)
                .is_some_and(|&i| !snap.snap.vms[i].state.is_gone())
        };
        self.queue.remove.retain(|r| listed(&r.vm_id));
        let down = |id: &str| snap.snap.vm(id).is_some_and(|v| v.state.is_down());
        let blocked = self.block_down_removals(&snap, alert);
        let mut seen = HashSet::new();
        let candidates: Vec<Candidate> = self
            .queue
            .remove
            .iter()
            .filter(|r| seen.insert(r.vm_id.as_str()))
            .filter(|r| !blocked.held.contains(&r.vm_id))
            .filter(|r| r.not_before.is_none_or(|t| t <= now))
            .filter(|r| {
                let d = down(&r.vm_id);
                d || (r.stop == StopStage::NotNeeded && !r.abandoned)
            })
            .map(|r| Candidate {
                vm_id: &r.vm_id,
                down: down(&r.vm_id),
            })
            .collect();
        let vm_ids = pick_batch(&snap.snap, &candidates);
        if vm_ids.is_empty() {
            return Ok(blocked.effects);
        }
        let request = ScaleRequest::RemoveNodes {
            vm_ids: vm_ids.clone(),
        };
        if let Err(r) = check_scale(&snap.snap, &request, alert) {
            if origin == Origin::Rpc {
                return Err(ScaleError::Refused(r));
            }
            let mut effects = blocked.effects;
            effects.extend(self.refused_now(&vm_ids, &r, now));
            return Ok(effects);
        }
        // The sent VMs leave the queue; a window's others stay in it, sent one request after
        // another.
        let (sent, rest) = std::mem::take(&mut self.queue.remove)
            .into_iter()
            .partition(|q| vm_ids.contains(&q.vm_id));
        self.queue.remove = rest;
        let names = vm_ids
            .iter()
            .filter_map(|v| snap.snap.vm(v).map(|vm| vm.name.to_ascii_lowercase()))
            .collect();
        self.begin(
            OpKind::Remove {
                from: snap.snap.size,
                vm_ids,
                names,
                sent,
            },
            origin,
            now,
        );
        let mut effects = blocked.effects;
        effects.push(Effect::Submit(request));
        Ok(effects)
    }

    /// Owed removals of down VMs on a CloudStack without Alert scaling: never sent (CloudStack
    /// would drain them, fail, and put the cluster in Alert, where every request is refused),
    /// never counted as failed attempts, said once each (`RemovalBlocked`) and on their
    /// instance. They go out as soon as the VM runs again or the verdict changes; an operator
    /// who removes the VM in CloudStack ends them.
    fn block_down_removals(&mut self, snap: &IndexedSnapshot, alert: &AlertScaling) -> Blocked {
        let mut out = Blocked::default();
        let AlertScaling::Unsupported { cloudstack_error } = alert else {
            return out;
        };
        let mut newly = Vec::new();
        for q in self.queue.remove.iter_mut() {
            let Some(vm) = snap.snap.vm(&q.vm_id).filter(|v| v.state.is_down()) else {
                continue;
            };
            out.held.insert(q.vm_id.clone());
            if q.trouble.as_deref().is_some_and(|t| t.starts_with(BLOCKED)) {
                continue;
            }
            let refusal = Refusal::DownWorkerNotRemovable {
                cluster: snap.snap.name.clone(),
                vms: vec![format!("{} ({})", vm.name, vm.state)],
                cloudstack_error: cloudstack_error.clone(),
            };
            q.trouble = Some(format!("{BLOCKED}: {refusal}"));
            newly.push((vm.name.clone(), refusal.to_string()));
        }
        if let Some((_, reason)) = newly.first() {
            out.effects.push(Effect::RemovalBlocked {
                vms: newly.iter().map(|(n, _)| n.clone()).collect(),
                reason: reason.clone(),
            });
        }
        out
    }

    /// The removals whose VM must be stopped first and whose stop is not sent yet, marked
    /// sent: the shell calls `stopVirtualMachine` for each and reports
    /// [`ScaleMachine::stop_answered`].
    pub fn take_stops(&mut self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        if self.stops_held() {
            return out;
        }
        for r in &mut self.queue.remove {
            if stop_wanted(r)
                && r.stop_not_before.is_none_or(|t| t <= now)
                && !out.contains(&r.vm_id)
            {
                r.stop = StopStage::Sent;
                out.push(r.vm_id.clone());
            }
        }
        out
    }

    /// When [`ScaleMachine::take_stops`] has a VM to stop next: `now` when one is due, the
    /// end of the earliest backoff otherwise, `None` while none is wanted or a scale-up holds
    /// them.
    pub(crate) fn next_stop_at(&self, now: Instant) -> Option<Instant> {
        if self.stops_held() {
            return None;
        }
        self.queue
            .remove
            .iter()
            .filter(|r| stop_wanted(r))
            .map(|r| r.stop_not_before.map_or(now, |t| t.max(now)))
            .min()
    }

    /// A scale-up in flight waits for every new VM to be Ready: stopping one of them (or one
    /// CloudStack is about to count) makes CloudStack fail the scale-up and leave its VMs.
    /// Stops wait for it to end.
    fn stops_held(&self) -> bool {
        matches!(
            self.phase.op().map(|o| &o.kind),
            Some(OpKind::Increase { .. })
        ) || matches!(self.phase, Phase::Adopted { .. })
    }

    /// The queued work as the next request, when nothing is in flight and the cluster is at
    /// rest (a cluster still Scaling has a job this provider is about to find): removals
    /// first, then increases (see [`Queue`]). A request the rules refuse is not lost
    /// silently: queued removals are reported as dropped, queued increases become failed
    /// instances (their RPC answered OK long ago); then the other kind gets its turn.
    pub(super) fn next_from_queue(&mut self, alert: &AlertScaling, now: Instant) -> Vec<Effect> {
        if self.phase != Phase::Idle {
            return Vec::new();
        }
        let Some(snap) = self.snap.clone() else {
            return Vec::new();
        };
        if snap.snap.state == ClusterState::Scaling {
            return Vec::new();
        }
        let mut effects = Vec::new();
        if self.queue.window_open {
            // Its removals go first, when the shell closes it.
            return effects;
        }
        if !self.queue.remove.is_empty() {
            // Owed removals never fail here: refused now, they wait and are tried again. While
            // none can go (backing off, waiting for a stop), queued increases do.
            let next = self
                .next_removal(Origin::Queue, alert, now)
                .unwrap_or_default();
            if next.iter().any(|e| matches!(e, Effect::Submit(_))) {
                return next;
            }
            effects.extend(next);
        }
        if self.queue.increase.is_empty() {
            return effects;
        }
        let suspects = self.cordon_suspects();
        if !suspects.is_empty() {
            // A scale-up now would time out on a cordoned node. While this provider owes the
            // removal of every suspect, it will end the suspicion itself (the VM stopped, then
            // removed): the increases wait. Otherwise only an operator can (uncordon, or stop
            // the VM): they are reported failed with the reason, so the autoscaler deletes
            // them and backs off instead of waiting a provision time for nodes that cannot
            // come, and the operator reads what to do in its log.
            let all_owed = self.drain_sent.iter().all(|id| {
                self.snap
                    .as_ref()
                    .and_then(|s| s.snap.vm(id))
                    .is_none_or(|v| v.state.is_down() || v.state.is_gone())
                    || self
                        .queue
                        .remove
                        .iter()
                        .any(|r| r.vm_id == *id && !r.abandoned)
            });
            if !all_owed {
                let placeholders = std::mem::take(&mut self.queue.increase);
                let why = ScaleError::CordonSuspected { vms: suspects }.to_string();
                self.record_failed(&refused_error(why), Vec::new(), placeholders, now);
            }
            return effects;
        }
        let from = snap.snap.size;
        let to = from.saturating_add(self.queue.increase.len() as u32);
        if !self.queue.remove.is_empty() && self.max_size.is_some_and(|max| to > max) {
            // CloudStack's size still counts the VMs of owed removals that cannot go now: the
            // increase on top of it would take the cluster past the group's maximum. It waits
            // for them (and is cancelled by DecreaseTargetSize if they never go).
            return effects;
        }
        let mut placeholders = std::mem::take(&mut self.queue.increase);
        // Never a request past the group's maximum, whatever moved CloudStack's size since
        // these increases were accepted (another client's scale-up, removals written off):
        // what does not fit is reported failed, as a refused increase is.
        let room = self
            .max_size
            .map_or(placeholders.len(), |max| max.saturating_sub(from) as usize);
        if placeholders.len() > room {
            let over = placeholders.split_off(room);
            let why = format!(
                "CloudStack's size is {from}: {} more node(s) would exceed the group's maximum {}",
                over.len() + placeholders.len(),
                self.max_size.unwrap_or_default()
            );
            self.record_failed(&refused_error(why), Vec::new(), over, now);
            if placeholders.is_empty() {
                return effects;
            }
        }
        let to = from.saturating_add(placeholders.len() as u32);
        let request = ScaleRequest::Resize { new_size: to };
        // Accepted before the cluster listed an external node (or before a failure taught
        // that CloudStack fails them): reported failed, never sent to strand the cluster.
        if let Err(ScaleError::Refused(r)) = self.refuse_external_scale_up() {
            self.record_failed(&refused_error(r.to_string()), Vec::new(), placeholders, now);
            return effects;
        }
        if let Err(r) = check_scale(&snap.snap, &request, alert) {
            self.record_failed(&refused_error(r.to_string()), Vec::new(), placeholders, now);
            return effects;
        }
        self.begin(
            OpKind::Increase {
                from,
                to,
                vms_before: snap.snap.workers().map(|v| v.id.clone()).collect(),
                placeholders,
            },
            Origin::Queue,
            now,
        );
        effects.push(Effect::Submit(request));
        effects
    }

    /// A VM's name as the operator knows it (its id when not listed).
    pub(super) fn vm_label(&self, vm_id: &str) -> String {
        self.snap
            .as_ref()
            .and_then(|s| s.snap.vm(vm_id))
            .map_or_else(|| vm_id.to_string(), |v| v.name.clone())
    }
}

/// How the trouble of a removal [`ScaleMachine::block_down_removals`] holds begins.
const BLOCKED: &str = "removal waits for an operator";

/// What [`ScaleMachine::block_down_removals`] held back, and what it says.
#[derive(Debug, Default)]
struct Blocked {
    held: HashSet<String>,
    effects: Vec<Effect>,
}

/// Whether this removal's VM is to be stopped (and the stop not sent yet). A removal not
/// promised yet may still be refused: its VM stays as it is.
fn stop_wanted(r: &QueuedRemoval) -> bool {
    r.stop == StopStage::Wanted && !r.abandoned && !r.in_window
}

/// The removals in the request in flight, if one is.
fn sent_in(phase: &mut Phase) -> impl Iterator<Item = &mut QueuedRemoval> {
    let op = match phase {
        Phase::Submitting { op, .. } | Phase::AnswerLost { op, .. } | Phase::Running { op, .. } => {
            Some(op)
        }
        Phase::Idle | Phase::Adopted { .. } => None,
    };
    op.into_iter().flat_map(|op| match &mut op.kind {
        OpKind::Remove { sent, .. } => sent.iter_mut(),
        OpKind::Increase { .. } => [].iter_mut(),
    })
}
