//! What CloudStack says moves the phase: a new snapshot, the answer to a submission
//! (answered, refused, lost), a running job found or not, a job's end and what it leaves
//! behind (failed instances, removals still owed); and Cleanup. Also how often a followed job
//! is polled.

use super::error::{is_alert_refusal, is_down_vm_drain_failure, is_drain_failure, refused_error};
use super::queue::QueuedRemoval;
use super::{Effect, FailedInstance, JobKind, Op, OpKind, Origin, Phase, ScaleMachine};
use crate::cluster::{ClusterSnapshot, ClusterState, IndexedSnapshot};
use crate::rules::{AlertScaling, check_scale};
use crate::status::{InstanceError, scale_up_failure, size_not_reached};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a removed VM's id and name are remembered, so a repeated DeleteNodes for it is a
/// no-op rather than NotFound.
const REMOVED_MEMORY: Duration = Duration::from_secs(3600);

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    Succeeded,
    Failed { code: i64, text: String },
    Cancelled,
}

impl JobEnd {
    /// CloudStack refused the key, not the request: its scale job failed its check of the
    /// caller's right to operate on the cluster (530 "Caller does not have permission to
    /// operate with provided resource.", recorded from a CloudStack 4.21.0.0 for a role that
    /// allows only `list*` and for another account's cluster:
    /// `errors_13_perm_bob_listonly_scale_job_final`, `errors_17_…_job_final`). A role whose
    /// rules do not name `scaleKubernetesCluster` still submits it, so only the job tells.
    pub fn key_not_permitted(&self) -> bool {
        matches!(self, JobEnd::Failed { code: 530, text }
            if text.to_ascii_lowercase().contains("does not have permission"))
    }

    /// The failure's code and text (a cancellation is a failure with code 0).
    pub fn failure(&self) -> Option<(i64, &str)> {
        match self {
            JobEnd::Succeeded => None,
            JobEnd::Failed { code, text } => Some((*code, text.as_str())),
            JobEnd::Cancelled => Some((0, "the job was cancelled")),
        }
    }
}

/// The end of a job as the machine settled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// What the job did (a metric label).
    pub kind: JobKind,
    /// The operation that ended (`None` for an adopted job).
    pub op: Option<Op>,
    /// Whether the job changed the cluster (VMs created or removed, size moved). A job that
    /// failed without changing anything was refused while CloudStack validated it.
    pub changed: bool,
    /// CloudStack refused because the cluster is in Alert: it predates Alert scaling.
    pub alert_refusal: bool,
    /// Requests that follow (the queue).
    pub effects: Vec<Effect>,
    /// A removal that failed (a drain) and is carried through: its VMs stay owed, so the
    /// scale RPC that watched it answers OK.
    pub owed: bool,
}

/// What the caller of a scale RPC hears when the job it watched (`--scale-watch`) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchedAnswer {
    /// OK: a removal that failed (a drain) is carried through, its VMs still owed.
    CarriedThrough,
    /// OK: a scale-up that failed part-way; its instances are reported as failed creations.
    /// The autoscaler then records the scale-up request, sees those instances (Creating with
    /// an error) as its failed creations, backs the group off with their error class and
    /// deletes them; an error instead would back it off as a generic cloud-provider error
    /// with no request, so the VMs CloudStack left behind would look unrequested and more
    /// could be asked for on top of them once the backoff ends.
    FailedCreations,
    /// The job was cancelled before it changed anything.
    Cancelled,
    /// CloudStack refused the request while validating it (nothing changed).
    Refused {
        code: i64,
        text: String,
        /// Because the cluster is in Alert and this CloudStack does not scale in Alert.
        alert_unsupported: bool,
        /// Because the key may not scale the cluster (the key's, not the request's).
        key_not_permitted: bool,
    },
    /// A removal that failed part-way: the autoscaler keeps the nodes CloudStack did not
    /// remove.
    Failed { code: i64, text: String },
}

impl Settled {
    /// What the caller who watched the job hears, its end being `end` (a failure).
    pub(crate) fn watched_answer(&self, end: &JobEnd) -> WatchedAnswer {
        let (code, text) = end.failure().unwrap_or((0, ""));
        if self.owed {
            return WatchedAnswer::CarriedThrough;
        }
        if !self.changed {
            if *end == JobEnd::Cancelled {
                return WatchedAnswer::Cancelled;
            }
            return WatchedAnswer::Refused {
                code,
                text: text.to_string(),
                alert_unsupported: self.alert_refusal,
                key_not_permitted: end.key_not_permitted(),
            };
        }
        match self.kind {
            JobKind::ScaleUp => WatchedAnswer::FailedCreations,
            _ => WatchedAnswer::Failed {
                code,
                text: text.to_string(),
            },
        }
    }
}

impl ScaleMachine {
    /// A new snapshot from CloudStack. Forgets expired failed instances and a lost submission
    /// that did not become a job, and says whether to look for a running job or poll the
    /// followed one now.
    pub(crate) fn snapshot_installed(
        &mut self,
        snap: Arc<IndexedSnapshot>,
        alert: &AlertScaling,
        now: Instant,
    ) -> Vec<Effect> {
        let scaling = snap.snap.state == ClusterState::Scaling;
        self.cluster_id = Some(snap.snap.id.clone());
        self.recheck_size_scaling(&snap.snap);
        self.recheck_external_scale_up(&snap.snap);
        let ttl = self.timings.failed_ttl;
        self.failed.retain(|f| {
            let vm_alive = f.vm_id.as_ref().is_none_or(|id| {
                snap.by_id
                    .get(id)
                    .is_some_and(|&i| !snap.snap.vms[i].state.is_gone())
            });
            vm_alive && now.saturating_duration_since(f.since) < ttl
        });
        self.recently_removed
            .retain(|_, t| now.saturating_duration_since(*t) < REMOVED_MEMORY);
        // Only CloudStack's status scanner proves that no node is cordoned: it moves a
        // cluster from Alert to Running only with every node counted Ready
        // (`reconcileAlertCluster`). A job's success also lists the cluster Running, cordon or
        // not. So: this listing Running, the one before it Alert, both asked for after our
        // last removal or job ended, and nothing of ours in flight.
        let after_ours =
            |s: &IndexedSnapshot| self.drain_fresh_after.is_none_or(|t| s.asked_at > t);
        let reconciled = snap.snap.state == ClusterState::Running
            && self
                .snap
                .as_ref()
                .is_some_and(|prev| prev.snap.state == ClusterState::Alert && after_ours(prev))
            && after_ours(&snap)
            && matches!(self.phase, Phase::Idle);
        if reconciled {
            self.drain_sent.clear();
        } else {
            self.drain_sent.retain(|id| {
                snap.snap
                    .vm(id)
                    .is_some_and(|v| !v.state.is_down() && !v.state.is_gone())
            });
        }
        self.snap = Some(snap);
        match &self.phase {
            Phase::Adopted { job: None, .. } if !scaling => {
                // The unidentified job is over.
                self.phase = Phase::Idle;
                self.drain_fresh_after = Some(now);
                self.next_from_queue(alert, now)
            }
            Phase::Running { .. } | Phase::Adopted { .. } if !scaling => vec![Effect::PollNow],
            Phase::Idle if scaling => vec![Effect::FindJob],
            Phase::AnswerLost { .. } if scaling => vec![Effect::FindJob],
            // A request given up on may still be on its way to CloudStack: only once it is
            // older than the longest a request may take can it be settled. Even then "not
            // Scaling" does not mean it never became a job: CloudStack queues the job and
            // moves the cluster to Scaling only once a worker picked it up and validated it.
            // So the job list is asked first ([`ScaleMachine::no_job_found`] settles it).
            Phase::AnswerLost { since, .. }
                if now.saturating_duration_since(*since) > self.timings.lost_settle =>
            {
                vec![Effect::FindJob]
            }
            // Work left queued by a job that ended unseen (Cleanup forgot it) goes out now.
            Phase::Idle => self.next_from_queue(alert, now),
            _ => Vec::new(),
        }
    }

    /// CloudStack accepted the submission as `job`. A removal's failed VMs stop being reported
    /// as failed creations now, and its VMs are remembered as removed: CloudStack destroys them one by one while the job runs,
    /// so a DeleteNodes naming one that already left the listing is a no-op, not NotFound (a
    /// VM still listed resolves as a VM first).
    pub(crate) fn submission_answered(&mut self, job: String, now: Instant) {
        let Some((op, since)) = self.take_submission() else {
            return;
        };
        if let OpKind::Remove { vm_ids, names, .. } = &op.kind {
            for key in vm_ids.iter().chain(names) {
                self.recently_removed.insert(key.clone(), now);
            }
            self.failed
                .retain(|f| !f.vm_id.as_ref().is_some_and(|v| vm_ids.contains(v)));
        }
        self.phase = Phase::Running { op, job, since };
    }

    /// CloudStack refused the submission outright. A queued request's refusal becomes failed
    /// instances; then the queue goes out.
    pub(crate) fn submission_refused(
        &mut self,
        text: &str,
        alert: &AlertScaling,
        now: Instant,
    ) -> Vec<Effect> {
        let Some((op, _)) = self.take_submission() else {
            return Vec::new();
        };
        self.not_drained(&op);
        let mut effects = Vec::new();
        if let (Origin::Rpc, OpKind::Remove { .. }) = (op.origin, &op.kind) {
            // The window's callers waiting for its answer hear the refusal: their removals
            // are not owed.
            self.window_answered(false);
        }
        match op.kind {
            OpKind::Increase { placeholders, .. } if op.origin == Origin::Queue => self
                .record_failed(
                    &refused_error(text.to_string()),
                    Vec::new(),
                    placeholders,
                    now,
                ),
            OpKind::Increase { .. } => {}
            // Removals promised before (owed ones the request carried, callers answered at
            // their deadline) stay owed whatever the request's origin.
            OpKind::Remove { sent, .. } => {
                let owed = self.owed_only(sent);
                effects.extend(self.requeue_failed(owed, text, now));
            }
        }
        effects.extend(self.next_from_queue(alert, now));
        effects
    }

    /// CloudStack throttled the submission (its API rate limit, `api.throttling`): refused
    /// before the command ran, so nothing changed there, and nothing here counts it as a
    /// failure. Work from the queue goes back as it was: removals keep their attempts and are
    /// sent again after `retry_in`, increases are queued again (never failed instances). A
    /// request of callers waiting for its answer (a window, an IncreaseSize) is theirs to
    /// send again: they hear UNAVAILABLE, and removals not promised are dropped.
    pub(crate) fn submission_throttled(&mut self, now: Instant) {
        self.submission_not_sent(
            "CloudStack throttles this API key (api.throttling): sent again shortly",
            now,
        )
    }

    /// The submission was not sent (CloudStack throttled it, the promise it would make could
    /// not be recorded first, or this replica does not lead): as
    /// [`ScaleMachine::submission_throttled`], with `why` as the owed removals' trouble. The
    /// owed removals go again after `timing::THROTTLED_RETRY`: nothing failed, so no backoff
    /// grows.
    pub(crate) fn submission_not_sent(&mut self, why: &str, now: Instant) {
        let Some((op, _)) = self.take_submission() else {
            return;
        };
        self.not_drained(&op);
        match op.kind {
            OpKind::Increase { placeholders, .. } if op.origin == Origin::Queue => {
                self.queue.increase.splice(0..0, placeholders);
            }
            OpKind::Increase { .. } => {}
            OpKind::Remove { sent, .. } => {
                if op.origin == Origin::Rpc {
                    self.window_answered(false);
                }
                let owed = self.owed_only(sent);
                self.requeue_not_sent(owed, why, now);
            }
        }
    }

    /// The submission's answer was lost (timeout, dropped connection, garbled answer, a
    /// proxy's page): CloudStack may have accepted it, so nothing more is sent until a snapshot
    /// or the job list tells. Returns whether callers waiting for it hear OK: a window's
    /// removals are then owed from now on (CloudStack may be removing the nodes, and an error
    /// would have the autoscaler untaint nodes that leave; a request that never became a job
    /// is sent again once the loss is settled). An IncreaseSize's caller hears the loss
    /// instead: nothing is owed to it, and the autoscaler asks again if it still needs nodes.
    pub(crate) fn submission_lost(&mut self) -> bool {
        let Some((op, since)) = self.take_submission() else {
            return false;
        };
        let window = op.origin == Origin::Rpc && matches!(op.kind, OpKind::Remove { .. });
        self.phase = Phase::AnswerLost { op, since };
        if window {
            self.window_answered(true);
        }
        window
    }

    /// `op` never ran in CloudStack: the VMs it would have drained are not suspected of a
    /// cordon on its account.
    fn not_drained(&mut self, op: &Op) {
        if let OpKind::Remove { vm_ids, .. } = &op.kind {
            for v in vm_ids {
                self.drain_sent.remove(v);
            }
        }
    }

    /// The submission in flight, leaving the phase `Idle`; `None` (phase untouched) when
    /// nothing is being submitted, so a late or repeated answer changes nothing.
    fn take_submission(&mut self) -> Option<(Op, Instant)> {
        if !matches!(self.phase, Phase::Submitting { .. }) {
            return None;
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Submitting { op, since } => Some((op, since)),
            _ => None,
        }
    }

    /// A running scale job found for the cluster: the lost submission's job, or one started
    /// elsewhere (adopted). Returns `Follow` when it is news.
    pub(crate) fn job_found(&mut self, job: String, now: Instant) -> Vec<Effect> {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::AnswerLost { op, since } => {
                self.phase = Phase::Running {
                    op,
                    job: job.clone(),
                    since,
                };
                vec![Effect::Follow(job)]
            }
            Phase::Idle => {
                self.phase = Phase::Adopted {
                    job: Some(job.clone()),
                    since: now,
                };
                vec![Effect::Follow(job)]
            }
            Phase::Adopted { job: None, since } => {
                self.phase = Phase::Adopted {
                    job: Some(job.clone()),
                    since,
                };
                vec![Effect::Follow(job)]
            }
            other => {
                self.phase = other;
                Vec::new()
            }
        }
    }

    /// The job list shows no scale job this cluster's phase could be waiting for. A lost
    /// submission older than `lost_settle`, with the cluster not Scaling, never became a job:
    /// forgotten, and the queue goes out. A cluster Scaling with no job this provider knows
    /// is adopted without a job id (its end is seen in the snapshots).
    pub(crate) fn no_job_found(&mut self, alert: &AlertScaling, now: Instant) -> Vec<Effect> {
        let scaling = self
            .snap
            .as_ref()
            .is_some_and(|s| s.snap.state == ClusterState::Scaling);
        match &self.phase {
            Phase::AnswerLost { since, .. }
                if !scaling && now.saturating_duration_since(*since) > self.timings.lost_settle =>
            {
                let lost = std::mem::replace(&mut self.phase, Phase::Idle);
                self.drain_fresh_after = Some(now);
                // listAsyncJobs lists running jobs only (`recorded/running_30_…`): a job that
                // ended before the search (one refused in validation ends within
                // milliseconds) is never found, so "no job" means "never a job, or a job that
                // ended", told apart only by what the snapshot shows. A removal job that
                // failed on a drain leaves the cluster in Alert: its nodes stay suspected of
                // a cordon. Listed otherwise, nothing was left cordoned.
                let alert_now = self
                    .snap
                    .as_ref()
                    .is_some_and(|s| s.snap.state == ClusterState::Alert);
                if let Phase::AnswerLost { op, .. } = &lost
                    && !alert_now
                {
                    self.not_drained(op);
                }
                if let Phase::AnswerLost { op, .. } = &lost {
                    self.settle_lost_increase(op, now);
                }
                // The request never became a job. Its owed removals (owed before it was sent,
                // or promised to a caller at its deadline) are still owed (a VM it removed
                // after all is left out of the next request); the others' callers heard
                // that the answer was lost.
                if let Phase::AnswerLost {
                    op:
                        Op {
                            kind: OpKind::Remove { sent, .. },
                            ..
                        },
                    ..
                } = lost
                {
                    let owed = self.owed_only(sent);
                    self.requeue_never_a_job(owed);
                }
                self.next_from_queue(alert, now)
            }
            Phase::Idle if scaling => {
                self.phase = Phase::Adopted {
                    job: None,
                    since: now,
                };
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// A lost scale-up settled without a job found: it never became a job, or its job ended
    /// (listAsyncJobs no longer lists it). CloudStack's size tells which way it went. Sent
    /// from the queue, its callers heard OK long ago: what the size does not show is reported
    /// failed (the new VMs listed, and placeholders for the rest), as a refused queued increase
    /// is, so the autoscaler sees failed creations instead of a target that silently drops. A
    /// caller of IncreaseSize heard the lost answer as an error and counts nothing.
    fn settle_lost_increase(&mut self, op: &Op, now: Instant) {
        let OpKind::Increase {
            from,
            to,
            vms_before,
            placeholders,
        } = &op.kind
        else {
            return;
        };
        let Some(snap) = self.snap.clone() else {
            return;
        };
        if op.origin != Origin::Queue || snap.snap.size >= *to {
            return;
        }
        let new_vms: Vec<String> = snap
            .snap
            .workers()
            .filter(|v| !vms_before.contains(&v.id) && !v.state.is_gone())
            .map(|v| v.id.clone())
            .collect();
        let requested = to.saturating_sub(*from) as usize;
        let missing = requested.saturating_sub(new_vms.len());
        let ph = placeholders.iter().rev().take(missing).cloned().collect();
        let why = format!(
            "the answer to scaleKubernetesCluster size={to} was lost and CloudStack's size is still              {}: the scale-up did not happen (CloudStack lists no job for it)",
            snap.snap.size
        );
        self.record_failed(&refused_error(why), new_vms, ph, now);
    }

    /// The followed `job` ended. `fetched`: whether a snapshot taken after its end is
    /// installed (otherwise the outcome is judged conservatively). `watched`: the scale RPC
    /// that submitted it is still waiting and reports a pure refusal itself, so such a
    /// failure leaves nothing behind. Returns `None` when `job` is not the followed job.
    pub(crate) fn job_finished(
        &mut self,
        job: &str,
        end: &JobEnd,
        fetched: bool,
        watched: bool,
        alert: &AlertScaling,
        now: Instant,
    ) -> Option<Settled> {
        if self.phase.job() != Some(job) {
            return None;
        }
        self.learn_job_length(job, end);
        // Any job may have drained nodes (an adopted one may be a removal of ours).
        self.drain_fresh_after = Some(now);
        let op = match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Running { op, .. } => Some(op),
            _ => None,
        };
        let snap = self.snap.clone();
        let changed = match (&op, &snap) {
            (Some(op), Some(s)) if fetched => op_changed_cluster(&op.kind, s),
            _ => true,
        };
        let kind = JobKind::of(op.as_ref().map(|o| &o.kind));
        let mut alert_refusal = false;
        if let Some((code, text)) = end.failure() {
            self.learn_size_scaling_broken(op.as_ref().map(|o| &o.kind), text);
            self.learn_external_scale_up_failed(op.as_ref().map(|o| &o.kind), text);
            // "This CloudStack cannot scale in Alert" only when the provider's own rules, on a
            // snapshot taken after the job, still allow the request: a refusal the rules
            // explain (a worker HA restarted between the check and the job: rule 7) says
            // nothing about the CloudStack version. The texts of the Alert-scaling PR's own
            // refusals are unknown and may contain the same words.
            // A drain failure naming a down VM teaches the same: only a CloudStack without
            // the Alert-scaling change drains a down node.
            alert_refusal = is_down_vm_drain_failure(text)
                || is_alert_refusal(text)
                    && fetched
                    && match (&snap, &op) {
                        (Some(s), Some(op)) => {
                            s.snap.state == ClusterState::Alert
                                && check_scale(
                                    &s.snap,
                                    &op.kind.request(),
                                    &AlertScaling::Supported,
                                )
                                .is_ok()
                        }
                        _ => false,
                    };
            let leave_behind = changed || !watched;
            if leave_behind
                && let Some(Op {
                    kind:
                        OpKind::Increase {
                            from,
                            to,
                            vms_before,
                            placeholders,
                        },
                    ..
                }) = &op
            {
                let err = scale_up_failure(job, code, text);
                let new_vms: Vec<String> = snap
                    .as_ref()
                    .map(|s| {
                        s.snap
                            .workers()
                            .filter(|v| !vms_before.contains(&v.id) && !v.state.is_gone())
                            .map(|v| v.id.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                // Without a snapshot taken after the job, VMs may exist that we do not see:
                // report placeholders for everything requested.
                let requested = to.saturating_sub(*from) as usize;
                let missing = if fetched {
                    requested.saturating_sub(new_vms.len())
                } else {
                    requested
                };
                let ph = placeholders.iter().rev().take(missing).cloned().collect();
                self.record_failed(&err, new_vms, ph, now);
            }
        }
        let mut effects = Vec::new();
        if end.failure().is_none()
            && fetched
            && let (Some(op), Some(s)) = (&op, &snap)
        {
            effects.extend(self.size_not_reached(job, op, &s.snap, now));
        }
        let mut owed = false;
        match (op.as_ref().map(|o| &o.kind), end.failure()) {
            // Drained and removed: no cordon left behind.
            (Some(OpKind::Remove { vm_ids, .. }), None) => {
                for v in vm_ids {
                    self.drain_sent.remove(v);
                }
            }
            // CloudStack drains one VM at a time and stops at the first drain that fails,
            // which its text names: only that node was left cordoned. A failure that is not a
            // drain's (a refusal when the job was picked up) drained nothing.
            (Some(OpKind::Remove { vm_ids, .. }), Some((_, text))) => {
                let lower = text.to_ascii_lowercase();
                let drain_failed = is_drain_failure(text);
                let named = |v: &String| {
                    snap.as_ref()
                        .and_then(|s| s.snap.vm(v))
                        .is_some_and(|vm| lower.contains(&vm.name.to_ascii_lowercase()))
                };
                self.drain_sent
                    .retain(|v| !vm_ids.contains(v) || (drain_failed && named(v)));
            }
            // A scale-up that succeeded waited for every node to be counted Ready: none was
            // cordoned then.
            (Some(OpKind::Increase { .. }), None) => self.drain_sent.clear(),
            _ => {}
        }
        if let (Some((_, text)), Some(op)) = (end.failure(), &op)
            && let OpKind::Remove { sent, .. } = &op.kind
        {
            // The VMs the failed removal left are still owed: back in the queue, out of the
            // target, sent again after a pause. Without a snapshot after the job, every one
            // may have stayed (the next request leaves out those that are gone).
            let stayed: Vec<QueuedRemoval> = sent
                .iter()
                .filter(|r| {
                    !fetched
                        || snap.as_ref().is_some_and(|s| {
                            s.snap.vm(&r.vm_id).is_some_and(|v| !v.state.is_gone())
                        })
                })
                .cloned()
                .collect();
            for r in &stayed {
                self.recently_removed.remove(&r.vm_id);
                self.recently_removed.remove(&r.name);
            }
            let reason = format!("scale job {job} failed: {text}");
            let drain_failed = watched && is_drain_failure(text);
            let requeued = if drain_failed {
                // A failed drain leaves the cluster in Alert with the node cordoned and no
                // worker down, where CloudStack refuses every request: the removal is
                // carried through (the VM stopped, then removed as a down VM), never left
                // to the autoscaler, whose retry would be refused. The callers watching
                // hear OK.
                owed = true;
                stayed
            } else {
                if watched && op.origin == Origin::Rpc {
                    // The callers watching hear this failure.
                    self.window_answered(false);
                } else {
                    owed = true;
                }
                // Removals whose callers heard an error (this failure, or a lost answer) are
                // not owed; those promised before are (owed ones the request carried,
                // callers answered OK at their deadline).
                self.owed_only(stayed)
            };
            effects.extend(self.requeue_failed(requeued, &reason, now));
        }
        // A failure that shows this CloudStack does not scale in Alert holds from now on:
        // what is owed is judged by it at once (a down VM's removal held and said so), not
        // once the provider-wide verdict it also sets reaches this machine with a later event.
        let learned;
        let alert = match end.failure() {
            Some((_, text)) if alert_refusal => {
                learned = AlertScaling::Unsupported {
                    cloudstack_error: text.to_string(),
                };
                &learned
            }
            _ => alert,
        };
        effects.extend(self.next_from_queue(alert, now));
        Some(Settled {
            kind,
            op,
            changed,
            alert_refusal,
            effects,
            owed,
        })
    }

    /// Cleanup: followers stop, so the jobs they followed are forgotten; the next snapshot
    /// that shows the cluster Scaling adopts them again.
    ///
    /// Removals not sent yet are dropped: the autoscaler calls Cleanup when it exits, and the
    /// next one clears every `ToBeDeleted` taint when it starts (`cleanUpIfRequired`), so those
    /// nodes are schedulable again and must not be taken without a new DeleteNodes.
    pub fn cleanup(&mut self) {
        if matches!(self.phase, Phase::Running { .. } | Phase::Adopted { .. }) {
            self.phase = Phase::Idle;
        }
        self.queue.remove.clear();
    }

    /// A size job that ended successfully is not trusted: a stored version of CloudStack's
    /// `KubernetesClusterScaleWorker.scaleCluster` returns success from its node-type loop
    /// before it reaches the workers (a size request whose offering map holds the control
    /// node's own offering), and a Created cluster's size job never writes the size. Only the
    /// size CloudStack lists after the job says whether the VMs were asked for; the ones it
    /// does not show are reported as a failed scale-up's are (failed creations, so the
    /// autoscaler backs the group off instead of waiting for nodes that never come).
    fn size_not_reached(
        &mut self,
        job: &str,
        op: &Op,
        snap: &ClusterSnapshot,
        now: Instant,
    ) -> Option<Effect> {
        let OpKind::Increase {
            from,
            to,
            placeholders,
            ..
        } = &op.kind
        else {
            return None;
        };
        if snap.size >= *to {
            return None;
        }
        let missing = to.saturating_sub(snap.size.max(*from)) as usize;
        let err = size_not_reached(job, *to, snap.size);
        let ph = placeholders.iter().rev().take(missing).cloned().collect();
        self.record_failed(&err, Vec::new(), ph, now);
        Some(Effect::SizeNotReached {
            job: job.to_string(),
            asked: *to,
            listed: snap.size,
        })
    }

    /// Records the instances of a failed scale-up so the autoscaler sees them as failed
    /// creations (and deletes them, backing the group off).
    pub(super) fn record_failed(
        &mut self,
        error: &InstanceError,
        vms: Vec<String>,
        placeholders: Vec<String>,
        now: Instant,
    ) {
        for vm in vms {
            let id = self.instance_id(&vm);
            self.failed.push(FailedInstance {
                id,
                vm_id: Some(vm),
                error: error.clone(),
                since: now,
            });
        }
        for p in placeholders {
            self.failed.push(FailedInstance {
                id: p,
                vm_id: None,
                error: error.clone(),
                since: now,
            });
        }
    }
}

/// A job still running after the follow limit is polled this many times less often.
pub const OVERDUE_POLL_FACTOR: u32 = 30;

/// How long a follower waits before polling its job again: `poll`; after consecutive failed
/// polls, doubled per failure up to 32 times but never above 30 s; past `max_follow` of
/// following a job that still runs, `OVERDUE_POLL_FACTOR` times `poll`. The job stays the
/// cluster's operation past the limit: dropping it would let the target fall to CloudStack's
/// size until a Refresh adopted it again, and so on every limit.
pub(crate) fn poll_delay(
    poll: Duration,
    failed_polls: u32,
    following_for: Duration,
    max_follow: Duration,
) -> Duration {
    if failed_polls > 0 {
        return (poll * 2u32.saturating_pow(failed_polls.min(5))).min(Duration::from_secs(30));
    }
    if following_for > max_follow {
        return poll * OVERDUE_POLL_FACTOR;
    }
    poll
}

/// Whether an operation changed the cluster: a scale-up that created worker VMs (or moved
/// `size`), a removal that took VMs. A job CloudStack refused while validating it changed
/// nothing.
pub(crate) fn op_changed_cluster(kind: &OpKind, s: &IndexedSnapshot) -> bool {
    let snap = &s.snap;
    match kind {
        OpKind::Increase {
            from, vms_before, ..
        } => snap.size != *from || snap.workers().any(|v| !vms_before.contains(&v.id)),
        OpKind::Remove { from, vm_ids, .. } => {
            snap.size != *from
                || vm_ids
                    .iter()
                    .any(|id| snap.vm(id).is_none_or(|v| v.state.is_gone()))
        }
    }
}
