//! When a caller hears OK. An OK to IncreaseSize or DeleteNodes is a promise the autoscaler
//! acts on (it keeps a node's deletion taint and counts it gone, or waits for the nodes it
//! asked for), so it is answered only once the ledger holding it is written: the machine
//! numbers its ledger at each promise ([`ScaleMachine::ledger_rev`]), the store reports the
//! number it wrote ([`super::Event::Recorded`]), and the machine releases the replies that
//! waited for it ([`super::Step::replies`]). The shell holds only the reply handles.
//!
//! A DeleteNodes caller whose removals wait for a window's request hears that request's
//! outcome: OK once it is sent (its removals are owed from then on), the window's failure
//! otherwise ([`Heard::WindowFailed`]). When its deadline nears first
//! ([`super::Event::PromiseDue`], early enough for the store to write), its removals are
//! promised and it hears OK once they are recorded.
//!
//! A caller whose deadline comes before its record ([`super::Event::CallerDeadline`]) is
//! answered by what became of what it asked:
//! - still only queued here (an increase or removals waiting behind the operation in flight, or
//!   a window caller's removals promised at its deadline), its alone and nothing of it started:
//!   it is taken back ([`Hold`]) and the caller hears that nothing was accepted
//!   ([`Heard::Withdrawn`], [`super::Effect::PromiseWithdrawn`]). The autoscaler then untaints
//!   the node, or asks for the nodes again, on a later loop: no promise is left that a restart
//!   would forget;
//! - under way (a request sent, a stop begun, another caller's promise holding the same VM):
//!   it still hears OK, since an error would have the autoscaler count nodes back that
//!   CloudStack is removing, and the machine says so loudly
//!   ([`super::Effect::AnsweredUnrecorded`]). The store was written just before the request
//!   went out, so this is a store that failed in between.

use super::{Acceptance, Accepted, Effect, ScaleMachine, Step};
use std::time::{Duration, Instant};

/// A scale RPC's caller waiting for its OK, as the shell numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

/// A reply the machine releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub call: CallId,
    pub heard: Heard,
}

/// What a caller hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// OK. `recorded`: the ledger holding its promise is written (always, without a store:
    /// there is nothing to wait for).
    Ok { recorded: bool },
    /// The removal window it waited for failed (its request refused, or not sent): the error
    /// the shell holds for the window. Its removals are dropped.
    WindowFailed,
    /// Its deadline came before the ledger holding its promise was written, and what it
    /// asked was still only queued: taken back, nothing accepted (the store's error).
    Withdrawn,
}

/// What a caller's OK would promise that nothing has started yet: taken back when the promise
/// cannot be recorded before the caller must hear ([`ScaleMachine::caller_deadline`]). Built
/// by the commands that queue (`Admission::Queued`, `Started::Queued`, [`Acceptance`]); the
/// default holds nothing, for what is under way once the caller hears.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hold {
    /// Removals this caller queued (no other caller's).
    vms: Vec<String>,
    /// Placeholders of the nodes this caller's increase queued.
    placeholders: Vec<String>,
    /// Part of the promise cannot be taken back (queued increases or failed creations the
    /// call dropped, a VM another caller asked for too): the caller hears OK whatever comes.
    pinned: bool,
}

impl Hold {
    pub(crate) fn removals(vms: Vec<String>) -> Self {
        Hold {
            vms,
            ..Hold::default()
        }
    }

    pub(crate) fn increase(placeholders: Vec<String>) -> Self {
        Hold {
            placeholders,
            ..Hold::default()
        }
    }

    /// A promise of which some part cannot be taken back.
    pub(crate) fn pinned() -> Self {
        Hold {
            pinned: true,
            ..Hold::default()
        }
    }
}

/// The ledger's numbering and the callers waiting for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Replies {
    /// Whether promises are recorded at all (a store is configured). Without one a reply
    /// goes at once: a restart loses what is owed, which the shell says at start.
    durable: bool,
    /// The ledger's number: raised at each promise, so a record of this number or a later
    /// one holds every promise made so far.
    rev: u64,
    /// The highest number the store reported written.
    recorded: u64,
    /// Callers told OK and waiting for their record, with the number it needs and what their
    /// promise holds that nothing has started yet.
    waiting: Vec<(CallId, u64, Hold)>,
    /// DeleteNodes callers waiting for the open window's request, with the VMs they asked to
    /// remove and what of it is theirs alone.
    window: Vec<(CallId, Vec<String>, Hold)>,
}

impl ScaleMachine {
    /// Whether this machine's promises are recorded (a store is configured): its OKs then
    /// wait for [`super::Event::Recorded`].
    pub fn set_durable(&mut self, yes: bool) {
        self.replies.durable = yes;
    }

    /// When a caller with `deadline` is told `Event::PromiseDue`: a window caller whose
    /// request is not answered by then is promised its removals early enough for the store to
    /// record the promise before it must be answered (`timing::promise_by`); without a store
    /// there is nothing to record, and it waits until it must be answered.
    pub fn promise_at(&self, deadline: Instant, now: Instant) -> Instant {
        if self.replies.durable {
            crate::timing::promise_by(deadline, now)
        } else {
            crate::timing::answer_by(deadline, now)
        }
    }

    /// Until when a scale RPC with `deadline` watches the job it just started for
    /// CloudStack's refusal (`timing::watch_until`): never past [`ScaleMachine::promise_at`],
    /// so the OK it ends with can still be recorded before its caller must hear it.
    pub fn watch_until(&self, scale_watch: Duration, deadline: Instant, now: Instant) -> Instant {
        crate::timing::watch_until(scale_watch, deadline, now).min(self.promise_at(deadline, now))
    }

    /// The number of the ledger as it is now ([`ScaleMachine::ledger`]): the store reads it
    /// with the ledger it writes and reports it back once written.
    pub fn ledger_rev(&self) -> u64 {
        self.replies.rev
    }

    /// `call` hears OK: what it asked is decided and in the machine's state (queued, owed,
    /// sent). The reply goes once the ledger holding it is written; at once without a store.
    /// `hold`: what of it is only queued (the command's), taken back should its deadline come
    /// first; `Hold::default()` for what is under way.
    pub fn reply_ok(&mut self, call: CallId, hold: Hold) -> Step {
        let mut step = Step::default();
        self.promised(vec![(call, hold)], &mut step);
        step
    }

    /// The DeleteNodes `call` was accepted as `acceptance` says: OK when its removals need
    /// nothing more (queued behind the operation in flight, or nothing for CloudStack); the
    /// answer to the window's request when they wait for one.
    pub fn reply_to_removal(&mut self, call: CallId, acceptance: &Acceptance) -> Step {
        match acceptance.accepted {
            Accepted::OpensWindow | Accepted::JoinsWindow => {
                self.replies.window.push((
                    call,
                    acceptance.vm_ids.clone(),
                    acceptance.hold.clone(),
                ));
                Step::default()
            }
            Accepted::Behind | Accepted::Done => self.reply_ok(call, acceptance.hold.clone()),
        }
    }

    /// `calls` are promised: their OKs wait for the next ledger's record.
    fn promised(&mut self, calls: Vec<(CallId, Hold)>, step: &mut Step) {
        if calls.is_empty() {
            return;
        }
        if !self.replies.durable {
            for (call, _) in calls {
                step.replies.push(Reply {
                    call,
                    heard: Heard::Ok { recorded: true },
                });
            }
            return;
        }
        self.replies.rev += 1;
        let rev = self.replies.rev;
        self.replies
            .waiting
            .extend(calls.into_iter().map(|(call, hold)| (call, rev, hold)));
    }

    /// A new caller's promise holds these VMs: a waiting caller whose hold names one can no
    /// longer have it taken back (it named them while they were queued, or queued them again
    /// after they were let go). Returns whether any did, so that the new caller's own hold is
    /// pinned too.
    pub(crate) fn pin_holds(&mut self, vms: &[String]) -> bool {
        let mut pinned = false;
        let holds = self.replies.waiting.iter_mut().map(|(_, _, h)| h);
        for hold in holds.chain(self.replies.window.iter_mut().map(|(_, _, h)| h)) {
            if hold.vms.iter().any(|v| vms.contains(v)) {
                hold.pinned = true;
                pinned = true;
            }
        }
        pinned
    }

    /// Takes back what `hold` promised if nothing of it has started and it is its caller's
    /// alone: the removals still queued, never sent and no stop begun, or the increase's
    /// placeholders still queued. Returns whether it did, and what.
    fn take_back(&mut self, hold: &Hold) -> Option<(Vec<String>, usize)> {
        if hold.pinned || (hold.vms.is_empty() && hold.placeholders.is_empty()) {
            return None;
        }
        let untouched = |v: &String| {
            self.queue.remove.iter().any(|r| {
                r.vm_id == *v
                    && r.attempts == 0
                    && !r.abandoned
                    && matches!(
                        r.stop,
                        crate::removal::StopStage::NotNeeded | crate::removal::StopStage::Wanted
                    )
            })
        };
        if !hold.vms.iter().all(untouched) {
            return None;
        }
        // Sent increases leave the queue all at once: any placeholder still queued means none
        // of this caller's was sent (another caller's DeleteNodes may have dropped some).
        let placeholders: Vec<String> = hold
            .placeholders
            .iter()
            .filter(|p| self.queue.increase.contains(p))
            .cloned()
            .collect();
        if hold.vms.is_empty() && placeholders.is_empty() {
            return None;
        }
        self.queue.remove.retain(|r| !hold.vms.contains(&r.vm_id));
        self.queue.increase.retain(|p| !placeholders.contains(p));
        Some((hold.vms.clone(), placeholders.len()))
    }

    /// The window's request was answered (`ok`: sent, its removals owed) or failed: its
    /// callers hear OK once that is recorded, or the failure now. A caller one of whose
    /// removals a failure dropped meanwhile (a refusal told before this) hears the failure
    /// whatever `ok` says: its removal is no longer owed.
    pub(crate) fn window_replies(&mut self, ok: bool, step: &mut Step) {
        let mut promised = Vec::new();
        for (call, vms, hold) in std::mem::take(&mut self.replies.window) {
            // The same judgment as at a caller's deadline: owed unless a failure dropped one.
            // Sent, they are no longer queued and cannot be taken back; left queued behind an
            // operation that started meanwhile, they still can.
            if ok && self.promise_removals(&vms) {
                promised.push((call, hold));
            } else {
                step.replies.push(Reply {
                    call,
                    heard: Heard::WindowFailed,
                });
            }
        }
        self.promised(promised, step);
    }

    /// `call`'s deadline nears, leaving the store time to write: a window caller not answered
    /// yet is promised its removals (they are owed whatever becomes of the window's request)
    /// and hears OK once that is recorded. Unless the window already failed and dropped one
    /// of them: it hears the failure with the window's other callers.
    pub(crate) fn promise_due(&mut self, call: CallId) -> Step {
        let mut step = Step::default();
        let Some(at) = self.replies.window.iter().position(|(c, ..)| *c == call) else {
            return step;
        };
        if self.promise_removals(&self.replies.window[at].1.clone()) {
            let (_, vms, hold) = self.replies.window.remove(at);
            step.effects.push(Effect::PromisedAtDeadline { vms });
            // Still queued, unless the window's request takes them before the caller must
            // hear: then they are under way.
            self.promised(vec![(call, hold)], &mut step);
        }
        step
    }

    /// The store wrote the ledger numbered `rev`: the replies waiting for it go.
    pub(crate) fn recorded(&mut self, rev: u64) -> Step {
        self.replies.recorded = self.replies.recorded.max(rev);
        let upto = self.replies.recorded;
        let mut step = Step::default();
        self.replies.waiting.retain(|&(call, needs, _)| {
            let go = needs <= upto;
            if go {
                step.replies.push(Reply {
                    call,
                    heard: Heard::Ok { recorded: true },
                });
            }
            !go
        });
        step
    }

    /// `call`'s deadline came before its record: what it asked is taken back when nothing of
    /// it has started (it hears [`Heard::Withdrawn`]), else it hears OK anyway, said loudly.
    /// Nothing when it was answered already.
    pub(crate) fn caller_deadline(&mut self, call: CallId) -> Step {
        let Some(at) = self.replies.waiting.iter().position(|(c, ..)| *c == call) else {
            return Step::default();
        };
        let (_, _, hold) = self.replies.waiting.remove(at);
        let (heard, effect) = match self.take_back(&hold) {
            Some((vms, placeholders)) => (
                Heard::Withdrawn,
                Effect::PromiseWithdrawn { vms, placeholders },
            ),
            None => (Heard::Ok { recorded: false }, Effect::AnsweredUnrecorded),
        };
        Step {
            replies: vec![Reply { call, heard }],
            effects: vec![effect],
            ..Step::default()
        }
    }

    /// Whether `call` waits for its record.
    #[cfg(test)]
    pub(crate) fn waits_for_record(&self, call: CallId) -> bool {
        self.replies.waiting.iter().any(|(c, ..)| *c == call)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, Timings};
    use super::*;

    /// The one reply `call` hears.
    fn one(call: u64, heard: Heard) -> Vec<Reply> {
        vec![Reply {
            call: CallId(call),
            heard,
        }]
    }

    fn machine(durable: bool) -> ScaleMachine {
        let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
        m.set_durable(durable);
        m
    }

    #[test]
    fn without_a_store_an_ok_goes_at_once() {
        let mut m = machine(false);
        let step = m.reply_ok(CallId(1), Hold::default());
        assert_eq!(step.replies, one(1, Heard::Ok { recorded: true }));
    }

    #[test]
    fn an_ok_waits_for_the_record_written_after_it() {
        let now = Instant::now();
        let mut m = machine(true);
        // A write that read the ledger before the promise does not release it.
        let read_before = m.ledger_rev();
        assert!(m.reply_ok(CallId(1), Hold::default()).replies.is_empty());
        let step = m.handle(Event::Recorded { rev: read_before }, now);
        assert!(step.replies.is_empty(), "released by an older record");
        assert!(m.waits_for_record(CallId(1)));
        // Two promises, one write after both: both go, in one step.
        assert!(m.reply_ok(CallId(2), Hold::default()).replies.is_empty());
        let rev = m.ledger_rev();
        let step = m.handle(Event::Recorded { rev }, now);
        let calls: Vec<_> = step.replies.iter().map(|r| (r.call, r.heard)).collect();
        let ok = Heard::Ok { recorded: true };
        assert_eq!(calls, vec![(CallId(1), ok), (CallId(2), ok)]);
        // A late report of an older write changes nothing.
        assert!(m.reply_ok(CallId(3), Hold::default()).replies.is_empty());
        let step = m.handle(Event::Recorded { rev: rev - 1 }, now);
        assert!(step.replies.is_empty());
    }

    #[test]
    fn a_deadline_before_the_record_answers_ok_loudly_and_once() {
        let now = Instant::now();
        let mut m = machine(true);
        let _ = m.reply_ok(CallId(7), Hold::default());
        let step = m.handle(Event::CallerDeadline { call: CallId(7) }, now);
        assert_eq!(step.replies, one(7, Heard::Ok { recorded: false }));
        assert_eq!(step.effects, vec![Effect::AnsweredUnrecorded]);
        // Answered: neither its deadline again nor a record answers it twice.
        let again = m.handle(Event::CallerDeadline { call: CallId(7) }, now);
        assert_eq!(again, Step::default());
        let rev = m.ledger_rev();
        assert!(m.handle(Event::Recorded { rev }, now).replies.is_empty());
    }

    #[test]
    fn a_window_caller_hears_its_request_or_is_promised_at_its_deadline() {
        use super::super::NodeRef;
        use super::super::tests::{ALERT, no_reports, running3};
        let now = Instant::now();
        let mut m = machine(true);
        let _ = m.handle(
            Event::Listed {
                snap: running3(now),
                alert: &ALERT,
            },
            now,
        );
        let node = |w: &str| NodeRef {
            provider_id: format!("external-cloudstack://{w}"),
            ..NodeRef::default()
        };
        let accept = |m: &mut ScaleMachine, call: u64, w: &str| {
            let a = m
                .accept_removals(&[node(w)], 1, &ALERT, &no_reports(), now)
                .expect("accepted");
            m.reply_to_removal(CallId(call), &a)
        };
        // Both wait for the window's request: nothing is heard yet.
        assert!(accept(&mut m, 1, "w1").replies.is_empty());
        assert!(accept(&mut m, 2, "w2").replies.is_empty());
        // The second's deadline nears first: its removal is owed, said, and its OK waits for
        // the record.
        let due = m.handle(Event::PromiseDue { call: CallId(2) }, now);
        assert_eq!(
            due.effects,
            vec![Effect::PromisedAtDeadline {
                vms: vec!["w2".into()]
            }]
        );
        assert!(due.replies.is_empty());
        assert!(m.waits_for_record(CallId(2)));
        // The request fails: the first hears the failure; the second, promised, does not.
        let failed = m.handle(Event::WindowAnswered { ok: false }, now);
        assert_eq!(failed.replies, one(1, Heard::WindowFailed));
        let rev = m.ledger_rev();
        let recorded = m.handle(Event::Recorded { rev }, now);
        assert_eq!(recorded.replies, one(2, Heard::Ok { recorded: true }));
    }

    #[test]
    fn a_queued_increase_not_recorded_by_its_deadline_is_taken_back() {
        use super::super::Admission;
        use super::super::tests::{ALERT, machine_in};
        let now = Instant::now();
        let mut m = machine_in("running", now);
        m.set_durable(true);
        let target = m.target();
        let Ok(Admission::Queued(hold)) = m.admit_increase(2, 10, &ALERT) else {
            panic!("queued behind the job in flight");
        };
        assert_eq!(m.target(), target.map(|t| t + 2));
        assert!(m.reply_ok(CallId(1), hold).replies.is_empty());
        // The store never writes it: at the deadline nothing of it was sent.
        let step = m.handle(Event::CallerDeadline { call: CallId(1) }, now);
        assert_eq!(step.replies, one(1, Heard::Withdrawn));
        assert_eq!(
            step.effects,
            vec![Effect::PromiseWithdrawn {
                vms: vec![],
                placeholders: 2
            }]
        );
        assert_eq!(
            m.target(),
            target,
            "the nodes asked for are not upcoming any more"
        );
        assert!(m.queue().increase.is_empty());
    }

    #[test]
    fn a_queued_removal_another_caller_asked_for_too_is_answered_ok_at_the_deadline() {
        use super::super::NodeRef;
        use super::super::tests::{ALERT, machine_in, no_reports};
        let now = Instant::now();
        let mut m = machine_in("running", now);
        m.set_durable(true);
        let node = NodeRef {
            provider_id: "external-cloudstack://w1".into(),
            ..NodeRef::default()
        };
        let ask = |m: &mut ScaleMachine, call: u64, accepted: Accepted| {
            let a = m
                .accept_removals(std::slice::from_ref(&node), 1, &ALERT, &no_reports(), now)
                .expect("accepted behind the job");
            assert_eq!(a.accepted, accepted);
            assert!(m.reply_to_removal(CallId(call), &a).replies.is_empty());
        };
        ask(&mut m, 1, Accepted::Behind);
        // Alone, it could be taken back; a second caller's promise now holds the same VM
        // (queued already: nothing more for CloudStack).
        ask(&mut m, 2, Accepted::Done);
        for call in [1, 2] {
            let step = m.handle(Event::CallerDeadline { call: CallId(call) }, now);
            assert_eq!(step.replies, one(call, Heard::Ok { recorded: false }));
            assert_eq!(step.effects, vec![Effect::AnsweredUnrecorded]);
        }
        assert!(
            m.queue().remove.iter().any(|r| r.vm_id == "w1"),
            "still owed"
        );
    }

    #[test]
    fn a_queued_removal_not_recorded_by_its_deadline_is_taken_back_unless_sent() {
        use super::super::NodeRef;
        use super::super::tests::{ALERT, machine_in, no_reports};
        let now = Instant::now();
        let node = |w: &str| NodeRef {
            provider_id: format!("external-cloudstack://{w}"),
            ..NodeRef::default()
        };
        let mut m = machine_in("running", now);
        m.set_durable(true);
        let target = m.target();
        let a = m
            .accept_removals(&[node("w1")], 1, &ALERT, &no_reports(), now)
            .expect("accepted behind the job");
        assert!(m.reply_to_removal(CallId(1), &a).replies.is_empty());
        let step = m.handle(Event::CallerDeadline { call: CallId(1) }, now);
        assert_eq!(step.replies[0].heard, Heard::Withdrawn);
        assert_eq!(
            step.effects,
            vec![Effect::PromiseWithdrawn {
                vms: vec!["w1".into()],
                placeholders: 0
            }]
        );
        assert_eq!(m.target(), target, "the node counts again");
        assert!(m.queue().remove.is_empty());
        assert!(m.ledger(now).removals.is_empty(), "nothing owed");
    }

    #[test]
    fn a_watch_leaves_the_record_its_time_only_with_a_store() {
        use std::time::Duration;
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        let must_answer = crate::timing::answer_by(deadline, now);
        let watch = Duration::from_secs(30);
        // Without a store, the watch may run until the caller must be answered.
        assert_eq!(
            machine(false).watch_until(watch, deadline, now),
            must_answer
        );
        // With one, it ends a second before, for the write that records the OK.
        let with_store = machine(true).watch_until(watch, deadline, now);
        assert_eq!(must_answer - with_store, crate::timing::RECORD_ALLOWANCE);
        // A short watch is not lengthened.
        let short = Duration::from_millis(300);
        assert_eq!(machine(true).watch_until(short, deadline, now), now + short);
    }
}
