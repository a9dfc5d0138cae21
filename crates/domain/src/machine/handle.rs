//! The machine's one way in for what happened: [`ScaleMachine::handle`] takes an [`Event`]
//! (CloudStack's answers, already classified; a listing of the cluster; the Nodes' marks; the
//! ledger recorded before a restart) and returns a [`Step`]: the effects to carry out, the
//! operator's news among them, and what a caller waiting on the event hears. What the
//! autoscaler asks (accept removals, admit an increase, decrease the target) are the
//! machine's commands, which answer at once; what to do next and when is the group's loop's
//! agenda's ([`super::Agenda`]).

use super::{Effect, JobEnd, Ledger, ScaleMachine, StopAnswer, WatchedAnswer};
use crate::cluster::IndexedSnapshot;
use crate::jobs::JobSearch;
use crate::registry::Registrations;
use crate::rules::AlertScaling;
use std::sync::Arc;
use std::time::Instant;

/// What happened to a cluster, as its machine hears it.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// A fresh listing of the cluster (`listKubernetesClusters` and its VMs).
    Listed {
        snap: Arc<IndexedSnapshot>,
        alert: &'a AlertScaling,
    },
    /// CloudStack's answer to the `scaleKubernetesCluster` the machine started.
    Sent(Sent<'a>),
    /// A poll saw the followed `job` still running at `at` (the last such poll, told at its
    /// end: how long it ran at least).
    JobRan { job: &'a str, at: Instant },
    /// The followed `job` ended. `fetched`: a listing taken after its end is installed;
    /// `watched`: the scale RPC that sent it still waits and hears [`Step::answer`].
    JobEnded {
        job: &'a str,
        end: &'a JobEnd,
        fetched: bool,
        watched: bool,
        alert: &'a AlertScaling,
        /// The nodes an autoscaler reported registered: a VM the job left as a failed
        /// creation whose node is among them is a node of the group.
        registered: &'a Registrations,
    },
    /// What a search for the cluster's running scale job found.
    JobSearched {
        search: &'a JobSearch,
        alert: &'a AlertScaling,
    },
    /// What became of `stopVirtualMachine` of `vm` (or of its job).
    StopAnswered { vm: &'a str, answer: StopAnswer<'a> },
    /// The removal window's request was answered: `ok`, its callers hear OK and its removals
    /// are owed.
    WindowAnswered { ok: bool },
    /// The removal window's callers have their answer: the window is over.
    WindowClosed,
    /// The removal window closes without a request (no listing could be read in time).
    WindowAborted,
    /// The ledger recorded before a restart, taken over.
    Restored(Ledger),
    /// These nodes, suspected of a cordon a failed drain left, were read Ready and
    /// schedulable (asked at `asked`).
    NodesReady {
        vm_ids: &'a [String],
        asked: Instant,
    },
    /// These nodes exist without the autoscaler's deletion mark.
    MarksGone(&'a [String]),
    /// Whether the key may call `stopVirtualMachine`, as learned (or recorded).
    MayStopVms(bool),
    /// The group's own autoscaler reported a real node of worker VM `vm_id` named `node`
    /// (NodeGroupForNode). `provider_id`: the node's, when the machine pairs the VM with
    /// another; `joined`: the VM is one a failed scale-up left, and up.
    NodeReported {
        vm_id: &'a str,
        node: &'a str,
        provider_id: Option<&'a str>,
        joined: bool,
    },
    /// The store wrote the ledger numbered `rev` ([`ScaleMachine::ledger_rev`], read with
    /// it): the OKs that waited for it go.
    Recorded { rev: u64 },
    /// The deadline of `call` nears: time to promise a window caller's removals, leaving the
    /// store time to record them before it must be answered (`timing::promise_by`).
    PromiseDue { call: super::CallId },
    /// The deadline of `call`, told OK and waiting for its record, came first.
    CallerDeadline { call: super::CallId },
}

/// CloudStack's answer to a `scaleKubernetesCluster`, classified once
/// (`cks_cloudstack::Class`).
#[derive(Debug, Clone)]
pub enum Sent<'a> {
    /// Accepted as this job.
    Accepted(String),
    /// Refused by CloudStack (its own error), nothing changed.
    Refused {
        text: &'a str,
        alert: &'a AlertScaling,
    },
    /// Throttled before it ran: nothing changed.
    Throttled,
    /// Never sent (why): the store could not record its promise, this replica does not
    /// lead, the cluster's id is not known yet.
    NotSent(&'a str),
    /// The answer was lost (no answer in time, a dropped connection, a proxy's page): the
    /// request may have become a job, which reading CloudStack settles.
    Lost,
}

/// What a caller waiting on an event hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The request's answer was lost, but what its callers asked is owed (a window's
    /// removals): OK.
    Owed,
    /// The request's answer was lost and nothing was promised: the loss.
    Lost,
    /// The job the caller watched ended without doing the work.
    Watched(WatchedAnswer),
}

/// What the machine asks for after an event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct Step {
    /// What to carry out, in order (the operator's news among them).
    pub effects: Vec<Effect>,
    /// What the caller waiting on the event hears, when one does.
    pub answer: Option<Answer>,
    /// The callers told OK whose reply goes now (`replies`): never before the record of
    /// their promise, unless their deadline came first.
    pub replies: Vec<super::Reply>,
}

impl From<Vec<Effect>> for Step {
    fn from(effects: Vec<Effect>) -> Self {
        Step {
            effects,
            ..Step::default()
        }
    }
}

impl ScaleMachine {
    /// Takes in what happened; returns what to do about it.
    pub fn handle(&mut self, event: Event<'_>, now: Instant) -> Step {
        match event {
            Event::Listed { snap, alert } => {
                let newly_external = snap.snap.externally_managed
                    && self
                        .snap
                        .as_ref()
                        .is_none_or(|s| !s.snap.externally_managed);
                let mut effects = self.snapshot_installed(snap, alert, now);
                // The operator's news, said once per change, not on every listing.
                if newly_external {
                    effects.insert(0, Effect::ExternallyManaged);
                }
                if let Some(news) = self.note_stranded() {
                    effects.insert(0, Effect::Stranding(news));
                }
                effects.into()
            }
            Event::Sent(Sent::Accepted(job)) => {
                self.submission_answered(job, now);
                Step::default()
            }
            Event::Sent(Sent::Refused { text, alert }) => {
                self.submission_refused(text, alert, now).into()
            }
            Event::Sent(Sent::Throttled) => {
                self.submission_throttled(now);
                Step::default()
            }
            Event::Sent(Sent::NotSent(why)) => {
                self.submission_not_sent(why, now);
                Step::default()
            }
            Event::Sent(Sent::Lost) => Step {
                answer: Some(if self.submission_lost() {
                    Answer::Owed
                } else {
                    Answer::Lost
                }),
                ..Step::default()
            },
            Event::JobRan { job, at } => {
                self.job_pending(job, at);
                Step::default()
            }
            Event::JobEnded {
                job,
                end,
                fetched,
                watched,
                alert,
                registered,
            } => {
                let Some(settled) = self.job_finished(job, end, fetched, watched, alert, now)
                else {
                    return Step::default();
                };
                let joined = self.failed_vms_registered(registered, now);
                let answer = (watched && *end != JobEnd::Succeeded)
                    .then(|| Answer::Watched(settled.watched_answer(end)));
                let mut effects = vec![Effect::JobEnded {
                    job: job.to_string(),
                    kind: settled.kind,
                    end: end.clone(),
                    alert_refusal: settled.alert_refusal,
                }];
                effects.extend(settled.effects);
                effects.extend(joined);
                Step {
                    effects,
                    answer,
                    ..Step::default()
                }
            }
            Event::JobSearched { search, alert } => {
                let (mut effects, news) = self.job_searched(search, alert, now);
                if news != super::SearchNews::Nothing {
                    effects.insert(0, Effect::Searched(news));
                }
                effects.into()
            }
            Event::StopAnswered { vm, answer } => self.stop_answered(vm, answer, now).into(),
            Event::WindowAnswered { ok } => {
                self.window_answered(ok);
                let mut step = Step::default();
                self.window_replies(ok, &mut step);
                step
            }
            Event::WindowClosed => {
                self.window_closed();
                Step::default()
            }
            Event::WindowAborted => {
                self.abort_window();
                Step::default()
            }
            Event::Restored(ledger) => self.restore(ledger, now).into(),
            Event::NodesReady { vm_ids, asked } => {
                self.nodes_counted_ready(vm_ids, asked);
                Step::default()
            }
            Event::MarksGone(vm_ids) => {
                let withdrawn = self.removals_withdrawn(vm_ids);
                if withdrawn.is_empty() {
                    return Step::default();
                }
                vec![Effect::RemovalsWithdrawn { vms: withdrawn }].into()
            }
            Event::MayStopVms(yes) => {
                self.set_can_stop_vms(yes);
                Step::default()
            }
            Event::Recorded { rev } => self.recorded(rev),
            Event::NodeReported {
                vm_id,
                node,
                provider_id,
                joined,
            } => {
                let mut effects = Vec::new();
                if joined && self.node_registered(vm_id) {
                    effects.push(Effect::NodeOfFailedVm {
                        vm: vm_id.to_string(),
                        node: node.to_string(),
                    });
                }
                if let Some(provider_id) = provider_id
                    && self.learn(vm_id, provider_id, node)
                {
                    effects.push(Effect::OwnProviderId {
                        vm: vm_id.to_string(),
                        node: node.to_string(),
                        provider_id: provider_id.to_string(),
                    });
                }
                effects.into()
            }
            Event::PromiseDue { call } => self.promise_due(call),
            Event::CallerDeadline { call } => self.caller_deadline(call),
        }
    }
}
