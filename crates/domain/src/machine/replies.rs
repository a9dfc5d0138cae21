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
//! A caller whose deadline comes before its record still hears OK
//! ([`super::Event::CallerDeadline`]): what it asked is under way (a request sent, removals
//! owed), and an error would have the autoscaler count nodes back that CloudStack is removing;
//! the machine says so loudly ([`super::Effect::AnsweredUnrecorded`]). The store was written
//! just before the request went out, so this is a store that failed in between.

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
    /// Callers told OK and waiting for their record, with the number it needs.
    waiting: Vec<(CallId, u64)>,
    /// DeleteNodes callers waiting for the open window's request, with the VMs they asked to
    /// remove.
    window: Vec<(CallId, Vec<String>)>,
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
    pub fn reply_ok(&mut self, call: CallId) -> Step {
        let mut step = Step::default();
        self.promised(&[call], &mut step);
        step
    }

    /// The DeleteNodes `call` was accepted as `acceptance` says: OK when its removals need
    /// nothing more (queued behind the operation in flight, or nothing for CloudStack); the
    /// answer to the window's request when they wait for one.
    pub fn reply_to_removal(&mut self, call: CallId, acceptance: &Acceptance) -> Step {
        match acceptance.accepted {
            Accepted::OpensWindow | Accepted::JoinsWindow => {
                self.replies.window.push((call, acceptance.vm_ids.clone()));
                Step::default()
            }
            Accepted::Behind | Accepted::Done => self.reply_ok(call),
        }
    }

    /// `calls` are promised: their OKs wait for the next ledger's record.
    fn promised(&mut self, calls: &[CallId], step: &mut Step) {
        if calls.is_empty() {
            return;
        }
        if !self.replies.durable {
            for &call in calls {
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
            .extend(calls.iter().map(|&call| (call, rev)));
    }

    /// The window's request was answered (`ok`: sent, its removals owed) or failed: its
    /// callers hear OK once that is recorded, or the failure now. A caller one of whose
    /// removals a failure dropped meanwhile (a refusal told before this) hears the failure
    /// whatever `ok` says: its removal is no longer owed.
    pub(crate) fn window_replies(&mut self, ok: bool, step: &mut Step) {
        let mut promised = Vec::new();
        for (call, vms) in std::mem::take(&mut self.replies.window) {
            // The same judgment as at a caller's deadline: owed unless a failure dropped one.
            if ok && self.promise_removals(&vms) {
                promised.push(call);
            } else {
                step.replies.push(Reply {
                    call,
                    heard: Heard::WindowFailed,
                });
            }
        }
        self.promised(&promised, step);
    }

    /// `call`'s deadline nears, leaving the store time to write: a window caller not answered
    /// yet is promised its removals (they are owed whatever becomes of the window's request)
    /// and hears OK once that is recorded. Unless the window already failed and dropped one
    /// of them: it hears the failure with the window's other callers.
    pub(crate) fn promise_due(&mut self, call: CallId) -> Step {
        let mut step = Step::default();
        let Some(at) = self.replies.window.iter().position(|(c, _)| *c == call) else {
            return step;
        };
        if self.promise_removals(&self.replies.window[at].1.clone()) {
            let (_, vms) = self.replies.window.remove(at);
            step.effects.push(Effect::PromisedAtDeadline { vms });
            self.promised(&[call], &mut step);
        }
        step
    }

    /// The store wrote the ledger numbered `rev`: the replies waiting for it go.
    pub(crate) fn recorded(&mut self, rev: u64) -> Step {
        self.replies.recorded = self.replies.recorded.max(rev);
        let upto = self.replies.recorded;
        let mut step = Step::default();
        self.replies.waiting.retain(|&(call, needs)| {
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

    /// `call`'s deadline came before its record: it hears OK anyway (what it asked is under
    /// way), said loudly. Nothing when it was answered already.
    pub(crate) fn caller_deadline(&mut self, call: CallId) -> Step {
        let before = self.replies.waiting.len();
        self.replies.waiting.retain(|&(c, _)| c != call);
        if self.replies.waiting.len() == before {
            return Step::default();
        }
        Step {
            replies: vec![Reply {
                call,
                heard: Heard::Ok { recorded: false },
            }],
            effects: vec![Effect::AnsweredUnrecorded],
            ..Step::default()
        }
    }

    /// Whether `call` waits for its record.
    #[cfg(test)]
    pub(crate) fn waits_for_record(&self, call: CallId) -> bool {
        self.replies.waiting.iter().any(|&(c, _)| c == call)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, Timings};
    use super::*;

    fn machine(durable: bool) -> ScaleMachine {
        let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
        m.set_durable(durable);
        m
    }

    #[test]
    fn without_a_store_an_ok_goes_at_once() {
        let mut m = machine(false);
        let step = m.reply_ok(CallId(1));
        assert_eq!(
            step.replies,
            vec![Reply {
                call: CallId(1),
                heard: Heard::Ok { recorded: true }
            }]
        );
    }

    #[test]
    fn an_ok_waits_for_the_record_written_after_it() {
        let now = Instant::now();
        let mut m = machine(true);
        // A write that read the ledger before the promise does not release it.
        let read_before = m.ledger_rev();
        assert!(m.reply_ok(CallId(1)).replies.is_empty());
        let step = m.handle(Event::Recorded { rev: read_before }, now);
        assert!(step.replies.is_empty(), "released by an older record");
        assert!(m.waits_for_record(CallId(1)));
        // Two promises, one write after both: both go, in one step.
        assert!(m.reply_ok(CallId(2)).replies.is_empty());
        let rev = m.ledger_rev();
        let step = m.handle(Event::Recorded { rev }, now);
        let calls: Vec<_> = step.replies.iter().map(|r| (r.call, r.heard)).collect();
        let ok = Heard::Ok { recorded: true };
        assert_eq!(calls, vec![(CallId(1), ok), (CallId(2), ok)]);
        // A late report of an older write changes nothing.
        assert!(m.reply_ok(CallId(3)).replies.is_empty());
        let step = m.handle(Event::Recorded { rev: rev - 1 }, now);
        assert!(step.replies.is_empty());
    }

    #[test]
    fn a_deadline_before_the_record_answers_ok_loudly_and_once() {
        let now = Instant::now();
        let mut m = machine(true);
        let _ = m.reply_ok(CallId(7));
        let step = m.handle(Event::CallerDeadline { call: CallId(7) }, now);
        assert_eq!(
            step.replies,
            vec![Reply {
                call: CallId(7),
                heard: Heard::Ok { recorded: false }
            }]
        );
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
        assert_eq!(
            failed.replies,
            vec![Reply {
                call: CallId(1),
                heard: Heard::WindowFailed
            }]
        );
        let rev = m.ledger_rev();
        let recorded = m.handle(Event::Recorded { rev }, now);
        assert_eq!(
            recorded.replies,
            vec![Reply {
                call: CallId(2),
                heard: Heard::Ok { recorded: true }
            }]
        );
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
