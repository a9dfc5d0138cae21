//! How an owed removal is retried, in one place: after a failed job or CloudStack's refusal
//! ([`ScaleMachine::requeue_failed`]), when the rules refuse it now
//! ([`ScaleMachine::refused_now`]), when it was not sent at all (throttled, the store not
//! writable, not the leader: [`ScaleMachine::requeue_not_sent`]), when its request never
//! became a job ([`ScaleMachine::requeue_never_a_job`]), and when the VM it waits to
//! see stopped was not ([`ScaleMachine::stop_answered`]); how long it waits
//! ([`retry_delay`]) and when it is given up ([`MAX_REMOVAL_ATTEMPTS`]).
//!
//! An accepted removal is owed: the autoscaler keeps the node's `ToBeDeleted` taint and counts
//! it as gone once NodeGroupDeleteNodes answered OK. So a failure never drops it: it goes back
//! to the front of the queue (it was first), out of the target, with one more attempt and the
//! reason shown on its instance; abandoned removals are still out of the target and are sent
//! again only once their VM is down. A request that was never sent, or whose answer is unknown
//! (settled by reading CloudStack: `events`), costs no attempt.

use super::queue::QueuedRemoval;
use super::{Effect, ScaleMachine};
use crate::removal::StopStage;
use crate::rules::Refusal;
use crate::timing::THROTTLED_RETRY;
use std::time::{Duration, Instant};

/// Failed removal jobs (or refusals) after which a removal is abandoned.
pub const MAX_REMOVAL_ATTEMPTS: u32 = 6;

/// How long a removal waits after its `attempts`-th failure: 30 s, doubling, at most 10 min.
/// A failed drain moves the cluster to Alert; CloudStack's status scanner (every 30 s) moves it
/// back once every node is Ready, so the first retry comes after that.
pub(crate) fn retry_delay(attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(5);
    (Duration::from_secs(30) * 2u32.pow(exp)).min(Duration::from_secs(600))
}

/// One more failed attempt of `r` (a failed job, or a refusal): it waits [`retry_delay`]
/// from `now`. Returns the wait, and whether this attempt gives it up (it is abandoned now,
/// after [`MAX_REMOVAL_ATTEMPTS`]).
fn failed_once(r: &mut QueuedRemoval, now: Instant) -> (Duration, bool) {
    r.attempts += 1;
    let delay = retry_delay(r.attempts);
    r.not_before = Some(now + delay);
    let gives_up = r.attempts >= MAX_REMOVAL_ATTEMPTS && !r.abandoned;
    r.abandoned |= gives_up;
    (delay, gives_up)
}

/// What the operator is told of removals that failed once more: those tried again after
/// `retry_in`, and those given up now, both for `reason`.
fn told(
    retried: Vec<String>,
    abandoned: Vec<String>,
    reason: &str,
    retry_in: Duration,
) -> Vec<Effect> {
    let mut effects = Vec::new();
    if !retried.is_empty() {
        effects.push(Effect::RemovalRetried {
            vms: retried,
            reason: reason.to_string(),
            retry_in,
        });
    }
    if !abandoned.is_empty() {
        effects.push(Effect::RemovalAbandoned {
            vms: abandoned,
            reason: reason.to_string(),
        });
    }
    effects
}

impl ScaleMachine {
    /// Failed removals back in the queue (front, they were first), each with one more attempt,
    /// the reason, and the next try after [`retry_delay`]; abandoned after
    /// [`MAX_REMOVAL_ATTEMPTS`]. A Running VM left by the failure could not be drained: it is
    /// stopped first when the provider can, so its next removal needs no drain.
    pub(super) fn requeue_failed(
        &mut self,
        stayed: Vec<QueuedRemoval>,
        reason: &str,
        now: Instant,
    ) -> Vec<Effect> {
        if stayed.is_empty() {
            return Vec::new();
        }
        let can_stop = self.can_stop_vms;
        let down = |id: &str| {
            self.snap
                .as_ref()
                .and_then(|s| s.snap.vm(id))
                .is_some_and(|v| v.state.is_down())
        };
        let mut retried = Vec::new();
        let mut abandoned = Vec::new();
        let mut delay = retry_delay(1);
        let mut requeued = Vec::with_capacity(stayed.len());
        for mut r in stayed {
            r.in_window = false;
            let gives_up;
            (delay, gives_up) = failed_once(&mut r, now);
            let mut trouble = format!("removal attempt {} failed: {reason}", r.attempts);
            if !down(&r.vm_id) {
                if can_stop && r.stop == StopStage::NotNeeded {
                    r.stop = StopStage::Wanted;
                    trouble.push_str("; the VM is stopped, then removed as a down VM (no drain)");
                } else if !can_stop {
                    trouble.push_str(&format!(
                        "; if its node is NotReady or gone the drain cannot succeed: stop the VM \
                         (stopVirtualMachine id={}) and the provider removes it as a down VM",
                        r.vm_id
                    ));
                }
            }
            if gives_up {
                trouble = format!(
                    "removal abandoned after {} failed jobs: {reason}; the node stays cordoned; remove VM {} by hand, or stop it and the provider removes it",
                    r.attempts, r.vm_id
                );
                abandoned.push(self.vm_label(&r.vm_id));
            } else if !r.abandoned {
                retried.push(self.vm_label(&r.vm_id));
            }
            r.trouble = Some(trouble);
            requeued.push(r);
        }
        self.queue.remove.splice(0..0, requeued);
        told(retried, abandoned, reason, delay)
    }

    /// The rules refuse the removal of `vm_ids` now (an owed request from the queue; a window's
    /// refusal is its callers' to hear instead). Each refusal counts as a failed attempt: a
    /// removal CloudStack keeps refusing backs off further and is abandoned, loudly, like one
    /// whose jobs keep failing.
    pub(super) fn refused_now(
        &mut self,
        vm_ids: &[String],
        r: &Refusal,
        now: Instant,
    ) -> Vec<Effect> {
        let snap = self.snap.clone();
        let down = |id: &str| {
            snap.as_ref()
                .and_then(|s| s.snap.vm(id))
                .is_some_and(|v| v.state.is_down())
        };
        let mut delay = retry_delay(1);
        let (mut retried, mut abandoned) = (Vec::new(), Vec::new());
        // Alert with no worker down (rule 7; typically a node a failed drain left cordoned,
        // whose outcome this provider did not see): a down worker may leave an Alert cluster,
        // and the autoscaler drained these nodes before asking, so the remedy is to stop the
        // promised VMs and remove them as down VMs.
        let stop_them = self.can_stop_vms && matches!(r, Refusal::AlertWithoutDownWorker { .. });
        for q in self
            .queue
            .remove
            .iter_mut()
            .filter(|q| vm_ids.contains(&q.vm_id))
        {
            if stop_them && q.stop == StopStage::NotNeeded && !down(&q.vm_id) {
                q.stop = StopStage::Wanted;
            }
            let gives_up;
            (delay, gives_up) = failed_once(q, now);
            if gives_up {
                q.trouble = Some(format!(
                    "removal abandoned after CloudStack refused it {} times: {r}; the node stays cordoned; repair the cluster, then remove VM {} by hand or stop it and the provider removes it",
                    q.attempts, q.vm_id
                ));
                abandoned.push(q.vm_id.clone());
            } else {
                q.trouble = Some(format!("CloudStack would refuse its removal now: {r}"));
                retried.push(q.vm_id.clone());
            }
        }
        let label = |vms: Vec<String>| vms.iter().map(|v| self.vm_label(v)).collect();
        told(label(retried), label(abandoned), &r.to_string(), delay)
    }

    /// Owed removals of a request whose answer was lost and that never became a job (settled
    /// by reading CloudStack: `events`): back at the front of the queue as they were, sent
    /// with the next request; nothing is known to have failed, so no attempt is counted. A VM
    /// it removed after all is left out of the next request (no longer listed).
    pub(super) fn requeue_never_a_job(&mut self, owed: Vec<QueuedRemoval>) {
        self.queue.remove.splice(0..0, owed);
    }

    /// Owed removals of a request that was not sent (CloudStack throttled it, the promise it
    /// would make could not be recorded, this replica does not lead): back at the front of the
    /// queue, sent again after [`THROTTLED_RETRY`] with `why` shown; nothing failed, so no
    /// attempt is counted and no backoff grows.
    pub(super) fn requeue_not_sent(
        &mut self,
        mut owed: Vec<QueuedRemoval>,
        why: &str,
        now: Instant,
    ) {
        for r in &mut owed {
            r.not_before = Some(now + THROTTLED_RETRY);
            r.trouble = Some(why.into());
        }
        self.queue.remove.splice(0..0, owed);
    }

    /// The answer to `stopVirtualMachine` for `vm_id` (see [`StopAnswer`]). A removal that can
    /// no longer be carried out without an operator is abandoned, loudly (the returned
    /// effect): its VM is still removed once an operator stops it. The first refusal of the
    /// command itself is news for every group ([`Effect::KeyMayNotStop`]).
    pub(crate) fn stop_answered(
        &mut self,
        vm_id: &str,
        answer: StopAnswer<'_>,
        now: Instant,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        if let StopAnswer::NotPermitted(text) = answer
            && std::mem::replace(&mut self.can_stop_vms, false)
        {
            effects.push(Effect::KeyMayNotStop {
                reason: text.to_string(),
            });
        }
        let mut abandoned = Vec::new();
        let mut reason = String::new();
        for r in self.queue.remove.iter_mut().filter(|r| r.vm_id == vm_id) {
            match answer {
                StopAnswer::Unknown(text) => {
                    // Whether the VM is stopping is read from CloudStack, never guessed: a
                    // snapshot showing it down sends its removal; otherwise it is asked again,
                    // and the unknown answer counts as no failure.
                    r.stop = StopStage::Wanted;
                    r.stop_not_before = Some(now + retry_delay(r.attempts.max(1)));
                    r.trouble = Some(format!(
                        "stopping VM {vm_id}: CloudStack's answer was lost, asked again unless \
                         it shows the VM down: {text}"
                    ));
                }
                StopAnswer::Stopping => {
                    // Removed as soon as a snapshot shows it down.
                    r.not_before = None;
                    r.trouble = Some(format!(
                        "stopping VM {vm_id} before its removal (its drain would fail)"
                    ));
                }
                StopAnswer::NotPermitted(text) => {
                    r.stop = StopStage::Impossible;
                    reason = format!(
                        "its drain would fail and this provider may not stop it ({text}): stop \
                         the VM (stopVirtualMachine id={vm_id}) and the provider removes it as \
                         a down VM"
                    );
                }
                StopAnswer::Failed(text) => {
                    r.attempts += 1;
                    if r.attempts < MAX_REMOVAL_ATTEMPTS {
                        r.stop = StopStage::Wanted;
                        r.stop_not_before = Some(now + retry_delay(r.attempts));
                        r.trouble = Some(format!("stopping VM {vm_id} failed, retrying: {text}"));
                        continue;
                    }
                    r.stop = StopStage::Impossible;
                    reason = format!(
                        "stopping it failed {} times ({text}): stop the VM \
                         (stopVirtualMachine id={vm_id}) and the provider removes it as a down VM",
                        r.attempts
                    );
                }
            }
            if !reason.is_empty() && !r.abandoned {
                r.abandoned = true;
                r.trouble = Some(reason.clone());
                abandoned.push(vm_id.to_string());
            }
        }
        if !abandoned.is_empty() {
            let vms = abandoned.iter().map(|v| self.vm_label(v)).collect();
            effects.push(Effect::RemovalAbandoned { vms, reason });
        }
        effects
    }
}

/// What became of a `stopVirtualMachine` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAnswer<'a> {
    /// Accepted (its job ended well, or runs): the VM shows down in a later snapshot and is
    /// then removed.
    Stopping,
    /// Refused or failed (CloudStack's text): tried again after a pause, up to
    /// [`MAX_REMOVAL_ATTEMPTS`] failures.
    Failed(&'a str),
    /// The key may not call `stopVirtualMachine`.
    NotPermitted(&'a str),
    /// Whether it was accepted is unknown (no answer, a proxy's page): settled by the next
    /// snapshot, and no failure.
    Unknown(&'a str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_ten_minutes() {
        let secs: Vec<u64> = (1..=8).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(secs, [30, 60, 120, 240, 480, 600, 600, 600]);
    }
}
