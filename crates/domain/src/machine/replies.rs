//! When a caller hears OK. An OK to IncreaseSize or DeleteNodes is a promise the autoscaler
//! acts on (it keeps a node's deletion taint and counts it gone, or waits for the nodes it
//! asked for), so it is answered only once the ledger holding it is written: the machine
//! numbers its ledger at each promise ([`ScaleMachine::ledger_rev`]), the store reports the
//! number it wrote ([`super::Event::Recorded`]), and the machine releases the replies that
//! waited for it ([`super::Step::replies`]). The shell holds only the reply handles.
//!
//! A caller whose deadline comes before its record still hears OK
//! ([`super::Event::CallerDeadline`]): what it asked is under way (a request sent, removals
//! owed), and an error would have the autoscaler count nodes back that CloudStack is removing;
//! the machine says so loudly ([`super::Effect::AnsweredUnrecorded`]). The store was written
//! just before the request went out, so this is a store that failed in between.

use super::{Effect, ScaleMachine, Step};

/// A scale RPC's caller waiting for its OK, as the shell numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

/// A reply the machine releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub call: CallId,
    /// The ledger holding its promise is written (always, without a store: there is nothing
    /// to wait for).
    pub recorded: bool,
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
}

impl ScaleMachine {
    /// Whether this machine's promises are recorded (a store is configured): its OKs then
    /// wait for [`super::Event::Recorded`].
    pub fn set_durable(&mut self, yes: bool) {
        self.replies.durable = yes;
    }

    /// The number of the ledger as it is now ([`ScaleMachine::ledger`]): the store reads it
    /// with the ledger it writes and reports it back once written.
    pub fn ledger_rev(&self) -> u64 {
        self.replies.rev
    }

    /// `call` hears OK: what it asked is decided and in the machine's state (queued, owed,
    /// sent). The reply goes once the ledger holding it is written; at once without a store.
    pub fn reply_ok(&mut self, call: CallId) -> Step {
        if !self.replies.durable {
            return Step::replying(call, true);
        }
        self.replies.rev += 1;
        self.replies.waiting.push((call, self.replies.rev));
        Step::default()
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
                    recorded: true,
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
        let mut step = Step::replying(call, false);
        step.effects.push(Effect::AnsweredUnrecorded);
        step
    }

    /// Whether `call` waits for its record.
    #[cfg(test)]
    pub(crate) fn waits_for_record(&self, call: CallId) -> bool {
        self.replies.waiting.iter().any(|&(c, _)| c == call)
    }
}

impl Step {
    fn replying(call: CallId, recorded: bool) -> Step {
        Step {
            replies: vec![Reply { call, recorded }],
            ..Step::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, Timings};
    use super::*;
    use std::time::Instant;

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
                recorded: true
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
        let calls: Vec<_> = step.replies.iter().map(|r| (r.call, r.recorded)).collect();
        assert_eq!(calls, vec![(CallId(1), true), (CallId(2), true)]);
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
                recorded: false
            }]
        );
        assert_eq!(step.effects, vec![Effect::AnsweredUnrecorded]);
        // Answered: neither its deadline again nor a record answers it twice.
        let again = m.handle(Event::CallerDeadline { call: CallId(7) }, now);
        assert_eq!(again, Step::default());
        let rev = m.ledger_rev();
        assert!(m.handle(Event::Recorded { rev }, now).replies.is_empty());
    }
}
