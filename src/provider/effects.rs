//! The machine's effects carried out: the group's loop woken to follow a job, queued requests
//! handed to it, the job search awaited, retried and abandoned removals told to the operator;
//! and the stops of VMs whose drain would fail, sent and ended for the group's loop. The
//! machine only says what is to be done; this is the one place that turns its effects into
//! CloudStack calls and work for the loop, so none is forgotten.

use super::Cluster;
use super::cluster_loop::Change;
use super::{Provider, now};
use cks_cloudstack::Class;
use cks_domain::machine::{
    Answer, Effect, Event, JobEnd, JobKind, Reply, SearchNews, Step, StopAnswer,
};

impl Provider {
    /// Tells every group's machine whether the key may call `stopVirtualMachine` (one key
    /// serves them all), each in its group's loop; returns once every loop has told it, so
    /// what follows (the round's fetch that may promise a stop) finds it known.
    pub(crate) async fn tell_may_stop_vms(&self, yes: bool) {
        self.change_each(0..self.inner.groups.len(), || Change::MayStopVms(yes))
            .await;
    }
}

impl Cluster {
    /// Tells the group's machine what happened and carries out what it asks for; returns
    /// what a caller waiting on the event hears.
    pub(crate) async fn tell(&self, event: Event<'_>) -> Option<Answer> {
        let step = self.group().lock().scale.handle(event, now());
        self.carry(step).await
    }

    /// Carries out a step of the group's machine: its effects, and the replies it releases;
    /// returns what a caller waiting on its event hears.
    pub(crate) async fn carry(&self, step: Step) -> Option<Answer> {
        self.reply(&step.replies);
        self.run_effects(step.effects).await;
        step.answer
    }

    /// Sends the replies the machine released to their callers (one that hung up is gone).
    pub(crate) fn reply(&self, replies: &[Reply]) {
        if replies.is_empty() {
            return;
        }
        let mut waiting = self
            .group()
            .replies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for r in replies {
            if let Some(tx) = waiting.remove(&r.call) {
                let _ = tx.send(r.heard);
            }
        }
    }

    /// Carries out what the machine asked for. `FindJob` is awaited (so a Refresh answers
    /// with the adopted job counted); requests are sent by the group's loop.
    pub(crate) async fn run_effects(&self, effects: Vec<Effect>) {
        let mut effects = std::collections::VecDeque::from(effects);
        while let Some(effect) = effects.pop_front() {
            match effect {
                Effect::PollNow => self.poll_now(),
                // The group's loop follows what the machine waits for: woken, it looks.
                Effect::Follow(_) => self.wake_loop(),
                Effect::Submit(request) => self.send_queued(request),
                Effect::FindJob => {
                    effects.extend(self.find_and_follow().await);
                    self.wake_loop();
                }
                Effect::RemovalRetried {
                    vms,
                    reason,
                    retry_in,
                } => {
                    crate::metrics::record_removals_retried(vms.len());
                    tracing::warn!(group = %self.label(), vms = %vms.join(","), ?retry_in,
                        "accepted node removals did not happen yet; they stay out of the target size and are sent again: {reason}");
                }
                Effect::RemovalAbandoned { vms, reason } => {
                    crate::metrics::record_removals_abandoned(vms.len());
                    tracing::error!(group = %self.label(), vms = %vms.join(","),
                        "accepted node removals abandoned after repeated failures: the autoscaler counts these nodes as gone and they stay cordoned; remove the VMs by hand, or stop them and the provider removes them: {reason}");
                }
                Effect::RemovalBlocked { vms, reason } => {
                    // Counted with the abandoned ones: both need an operator's hand.
                    crate::metrics::record_removals_abandoned(vms.len());
                    tracing::error!(group = %self.label(), vms = %vms.join(","),
                        "accepted removals of down VMs cannot be carried out by this CloudStack: the autoscaler counts these nodes as gone; start the VMs (they are then removed) or remove them in CloudStack: {reason}");
                }
                Effect::KeyMayNotStop { reason } => {
                    self.p.tell_may_stop_vms(false).await;
                    tracing::warn!(group = %self.label(), "this CloudStack key may not call stopVirtualMachine: VMs whose drain would fail are no longer stopped by the provider, and their removal is refused until an operator stops them: {reason}");
                }
                Effect::JobEnded {
                    job,
                    kind,
                    end,
                    alert_refusal,
                } => self.job_ended(&job, kind, &end, alert_refusal),
                Effect::Searched(news) => self.searched(news),
                Effect::RemovalsWithdrawn { vms } => {
                    for vm in &vms {
                        tracing::warn!(group = %self.label(), vm = %vm,
                            "removal withdrawn: the node no longer carries the autoscaler's ToBeDeletedByClusterAutoscaler mark (the autoscaler restarted, or gave the node up)");
                    }
                    crate::metrics::record_removals_withdrawn(vms.len());
                }
                Effect::PromisedAtDeadline { vms } => {
                    tracing::info!(group = %self.label(), vms = %vms.join(","),
                        "scale-down: the request's deadline came before CloudStack's answer; the removals are owed and carried through");
                }
                Effect::Stranding(news) => self.stranding(news),
                Effect::ExternallyManaged => {
                    let name = self.label();
                    tracing::warn!(group = %name,
                        "cluster {name} is externally managed (clustertype ExternalManaged): CloudStack does not scale it; \
                         this provider lists its workers but refuses every scale request for it");
                }
                Effect::NodeOfFailedVm { vm, node } => {
                    tracing::info!(group = %self.label(), vm = %vm, node = %node,
                        "the node of a VM a failed scale-up left registered: it is a node of the group, no longer a failed creation");
                }
                Effect::OwnProviderId {
                    vm,
                    node,
                    provider_id,
                } => {
                    tracing::warn!(group = %self.label(), vm = %vm, node = %node, provider_id = %provider_id,
                        "node carries a providerID other than CloudStack's CCM default; reporting the instance under the node's own id");
                }
                Effect::PromiseWithdrawn { vms, placeholders } => {
                    crate::metrics::record_withdrawn_unrecorded();
                    tracing::warn!(group = %self.label(), vms = %vms.join(","), nodes = placeholders,
                        "the store could not record a promise before its caller had to be answered: what it asked was only queued, so it is taken back and the caller hears that nothing was accepted");
                }
                Effect::AnsweredUnrecorded => {
                    crate::metrics::record_unrecorded_ok();
                    tracing::error!(group = %self.label(),
                        "answered OK before the promise was recorded (the store cannot be written now): a restart before it is kept would forget it");
                }
                Effect::SizeNotReached { job, asked, listed } => {
                    tracing::error!(group = %self.label(), %job, asked, listed,
                        "CloudStack ended the scale-up job successfully but lists size {listed}, not {asked}: the missing VMs are reported as failed creations. Check the cluster's node offerings (apache/cloudstack#11994) and the management server's log for this job");
                }
            }
        }
        // VMs to stop are the loop's to take.
        self.wake_loop();
    }

    /// [`Provider::tell_may_stop_vms`] in the group's loop. The event asks for nothing.
    pub(crate) fn may_stop_here(&self, yes: bool) {
        let _ = self
            .group()
            .lock()
            .scale
            .handle(Event::MayStopVms(yes), now());
    }

    /// A job's end told: the log, the job metrics, and the provider-wide verdict when its
    /// failure shows this CloudStack does not scale a cluster in Alert.
    fn job_ended(&self, job: &str, kind: JobKind, end: &JobEnd, alert_refusal: bool) {
        let label = self.label();
        let group_id = self.id();
        match end.failure() {
            None => {
                tracing::info!(group = %label, job, "scale job succeeded");
                crate::metrics::record_job(&group_id, kind, "succeeded");
            }
            Some((code, text)) if end.key_not_permitted() => {
                tracing::error!(group = %label, job, code,
                    "scale job failed: {text}{}", super::error::KEY_NOT_PERMITTED_TO_SCALE);
                crate::metrics::record_job(&group_id, kind, "failed");
            }
            Some((code, text)) => {
                tracing::warn!(group = %label, job, code, "scale job failed: {text}{}",
                    cks_domain::status::cluster_max_size_note(text));
                crate::metrics::record_job(&group_id, kind, "failed");
                if alert_refusal {
                    self.p.inner.alert.learn_unsupported(text);
                }
            }
        }
    }

    /// What a job search changed, told.
    fn searched(&self, news: SearchNews) {
        let cluster_id = self.id();
        match news {
            SearchNews::LostBecameJob { job, kind } => {
                tracing::info!(group = %cluster_id, job = %job, "the scale request whose answer was lost became a job; following it");
                crate::metrics::record_job_started(&cluster_id, kind);
            }
            SearchNews::Adopted { job } => {
                tracing::info!(group = %cluster_id, job = %job, "adopting a running scale job this provider did not start");
                crate::metrics::record_job_started(&cluster_id, JobKind::Adopted);
            }
            SearchNews::LostForgotten => {
                tracing::warn!(group = %cluster_id, "the scale request whose answer was lost did not become a job; forgetting it")
            }
            SearchNews::AdoptedBlind => {
                tracing::info!(group = %cluster_id,
                    "the cluster is Scaling under a job CloudStack does not name; its end is seen when the cluster leaves Scaling")
            }
            SearchNews::Nothing => {}
        }
    }

    /// Sends `stopVirtualMachine` for a VM the machine handed out (`take_stops`) and tells the
    /// machine its answer; returns the stop job to follow (the group's loop polls it and calls
    /// [`Cluster::stop_ended`]).
    pub(crate) async fn send_stop(&self, vm: &str) -> Option<String> {
        let label = self.label();
        if !self.p.health().acting() {
            tracing::warn!(group = %label, vm = %vm, "stopVirtualMachine not sent: this replica does not hold the leader lease");
            let answer = StopAnswer::Failed("this replica does not lead");
            self.tell(Event::StopAnswered { vm, answer }).await;
            return None;
        }
        tracing::info!(group = %label, vm = %vm, "stopping the VM before its removal: a drain of it would fail");
        let answer = self.p.inner.cs.stop_virtual_machine(vm, false).await;
        let failure = match &answer {
            Ok(_) => None,
            Err(e) => {
                let not_permitted = e.is_not_permitted();
                let unknown = e.class() == Class::Unknown;
                // A refused command is said by the machine's effect, once for every group.
                if unknown {
                    tracing::warn!(group = %label, vm = %vm, error = %e, "stopVirtualMachine not answered; the next snapshot tells whether the VM stops, else it is asked again");
                } else if !not_permitted {
                    tracing::warn!(group = %label, vm = %vm, error = %e, "stopping the VM failed; retrying later");
                }
                Some((e.to_string(), not_permitted, unknown))
            }
        };
        let stop = match &failure {
            None => StopAnswer::Stopping,
            Some((t, true, _)) => StopAnswer::NotPermitted(t),
            Some((t, _, true)) => StopAnswer::Unknown(t),
            Some((t, _, _)) => StopAnswer::Failed(t),
        };
        self.tell(Event::StopAnswered { vm, answer: stop }).await;
        answer.ok()
    }

    /// A stop job ended (`failed`: CloudStack's text). Succeeded, the cluster is read again:
    /// it shows the VM down and its removal goes out without a drain, with no need to wait
    /// for the autoscaler's next Refresh. Failed, the stop is tried again later.
    pub(crate) async fn stop_ended(&self, vm: &str, job: &str, failed: Option<&str>) {
        let label = self.label();
        match failed {
            Some(text) => {
                tracing::warn!(group = %label, vm = %vm, job = %job, "the stop job failed; retrying later: {text}");
                let failed = format!("stopVirtualMachine job {job} failed: {text}");
                let answer = StopAnswer::Failed(&failed);
                self.tell(Event::StopAnswered { vm, answer }).await;
            }
            None => {
                if let Err(e) = self.fetch_and_act().await {
                    tracing::debug!(group = %label, error = %e, "reading the cluster after a stop failed; the next refresh sends the removal");
                }
            }
        }
    }
}
