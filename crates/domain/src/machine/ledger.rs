//! The ledger: what a cluster's machine owes the autoscaler and has in flight, in a form that
//! outlives the process. Taken from the machine ([`ScaleMachine::ledger`]) whenever the shell
//! records it, and given back to a new machine ([`ScaleMachine::restore`]) at start, before its
//! first snapshot.
//!
//! It holds every promise: removals answered OK (owed: queued, backing off, waiting for a
//! stop, abandoned, or in the request in flight), increases answered OK and not sent yet, and
//! the id of the scale job this provider's request became. A removal whose caller has not
//! heard OK is not in it: a restart answers that caller with an error (its connection ends).
//! Times are kept as waits from the moment the ledger was taken, so no clock is written.

use super::queue::QueuedRemoval;
use super::{Effect, OpKind, Phase, ScaleMachine};
use crate::removal::StopStage;
use std::time::{Duration, Instant};

/// One cluster's promises.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Removals owed, in the order they are sent.
    pub removals: Vec<OwedRemoval>,
    /// Nodes of IncreaseSize calls answered OK and not sent yet.
    pub queued_increase: u32,
    /// The scale job this provider's request became, when one runs.
    pub job: Option<String>,
    /// VMs this provider had CloudStack drain since the cluster was last Running, still
    /// running: their nodes may be cordoned (`ScaleMachine::cordon_suspects`). Kept so that a
    /// restart does not send a scale-up CloudStack would time out on them.
    pub drained: Vec<String>,
}

/// A removal answered OK and not done yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwedRemoval {
    pub vm_id: String,
    /// Its name, lower-cased.
    pub name: String,
    /// Removal jobs that failed and left it.
    pub attempts: u32,
    /// Why it has not happened yet.
    pub trouble: Option<String>,
    /// How long after the ledger was taken it may be sent again (its backoff).
    pub wait: Option<Duration>,
    /// Its VM is to be stopped first (it runs and its drain would fail). A stop sent before
    /// the ledger was taken is asked again: the next snapshot tells whether it happened.
    pub stop_first: bool,
    /// The provider may not stop it: it waits for an operator.
    pub stop_impossible: bool,
    /// Given up after repeated failures: sent again only once its VM is down.
    pub abandoned: bool,
}

impl Ledger {
    /// Nothing is owed or in flight.
    pub fn is_empty(&self) -> bool {
        self.removals.is_empty()
            && self.queued_increase == 0
            && self.job.is_none()
            && self.drained.is_empty()
    }
}

impl ScaleMachine {
    /// The machine's promises as of `now`.
    pub fn ledger(&self, now: Instant) -> Ledger {
        let sent: &[QueuedRemoval] = match self.phase.op().map(|op| &op.kind) {
            Some(OpKind::Remove { sent, .. }) => sent,
            _ => &[],
        };
        let mut seen = std::collections::HashSet::new();
        let removals = sent
            .iter()
            .chain(&self.queue.remove)
            .filter(|r| !r.in_window && seen.insert(r.vm_id.as_str()))
            .map(|r| OwedRemoval {
                vm_id: r.vm_id.clone(),
                name: r.name.clone(),
                attempts: r.attempts,
                trouble: r.trouble.clone(),
                wait: r
                    .not_before
                    .map(|t| t.saturating_duration_since(now))
                    .filter(|w| !w.is_zero()),
                stop_first: matches!(r.stop, StopStage::Wanted | StopStage::Sent),
                stop_impossible: r.stop == StopStage::Impossible,
                abandoned: r.abandoned,
            })
            .collect();
        Ledger {
            removals,
            queued_increase: u32::try_from(self.queue.increase.len()).unwrap_or(u32::MAX),
            job: self.phase.job().map(str::to_string),
            drained: {
                let mut d: Vec<String> = self.drain_sent.iter().cloned().collect();
                d.sort();
                d
            },
        }
    }

    /// Takes over a ledger recorded by an earlier process, before the first snapshot: the
    /// removals are owed again (the next snapshot leaves out those whose VM is gone), queued
    /// increases are queued again, and a job recorded as running is adopted and followed
    /// (the returned `Follow`), so nothing is sent while it runs and nothing twice.
    pub(crate) fn restore(&mut self, ledger: Ledger, now: Instant) -> Vec<Effect> {
        for o in ledger.removals {
            if self.queue.remove.iter().any(|r| r.vm_id == o.vm_id) {
                continue;
            }
            let mut r = QueuedRemoval::new(o.vm_id, o.name, now, false);
            r.attempts = o.attempts;
            r.trouble = o.trouble;
            r.not_before = o.wait.map(|w| now + w);
            r.stop = if o.stop_impossible {
                StopStage::Impossible
            } else if o.stop_first {
                StopStage::Wanted
            } else {
                StopStage::NotNeeded
            };
            r.abandoned = o.abandoned;
            self.queue.remove.push(r);
        }
        self.drain_sent.extend(ledger.drained);
        for _ in 0..ledger.queued_increase {
            let id = self.placeholder();
            self.queue.increase.push(id);
        }
        match ledger.job {
            Some(job) if self.phase == Phase::Idle => {
                self.phase = Phase::Adopted {
                    job: Some(job.clone()),
                    since: now,
                };
                vec![Effect::Follow(job)]
            }
            _ => Vec::new(),
        }
    }
}
