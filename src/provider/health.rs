//! What the probes, the metrics and an operator read of the provider as a whole
//! ([`Provider::health`]): whether it serves and is ready for traffic, whether its snapshots
//! are fresh, whether it is stuck in itself, the Alert-scaling verdict and the clients
//! judged to run in another cluster. Each group's own reads are its caller's view's
//! ([`Scoped`](super::Scoped)).

use super::{Provider, now};
use cks_domain::verdict::AlertVerdictView;
use std::sync::atomic::Ordering;
use tokio::sync::watch;

/// The provider as its probes and metrics read it. Cheap: a borrow.
#[derive(Clone, Copy)]
pub struct Health<'a> {
    pub(crate) p: &'a Provider,
}

impl Provider {
    /// What the probes, the metrics and an operator read of the provider as a whole.
    pub fn health(&self) -> Health<'_> {
        Health { p: self }
    }
}

impl Health<'_> {
    /// Whether this process may act (send CloudStack requests that change anything): always,
    /// unless it runs with leader election and does not lead now.
    pub fn acting(&self) -> bool {
        self.p
            .inner
            .settings
            .leadership
            .as_ref()
            .is_none_or(|l| l.leading())
    }

    /// Whether RPCs are answered: always, unless it runs with leader election and does not
    /// lead now or has not taken over the ledger yet.
    pub fn serving(&self) -> bool {
        self.p
            .inner
            .settings
            .leadership
            .as_ref()
            .is_none_or(|l| l.serving())
    }

    /// The replica holding the leader lease as last read, with leader election.
    pub fn leader(&self) -> Option<String> {
        self.p.inner.settings.leadership.as_ref()?.holder()
    }

    /// Becomes true once every group has a first snapshot (gRPC health SERVING).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.p.inner.ready.subscribe()
    }

    /// Readiness (`/readyz`, gRPC health of the whole server): whether this replica can take
    /// the autoscaler's calls in its role. A single replica always can, and so can a leader
    /// once it took over the recorded promises: CloudStack being unreachable, or a snapshot
    /// past the staleness bound, makes no replica unready, since kube-proxy sends a Service's
    /// traffic only to ready endpoints and the autoscaler would then hear a refused connection
    /// instead of UNAVAILABLE naming CloudStack. A standby is ready while it can read the
    /// recorded promises (it could take over): a rolling update halts before it replaces the
    /// leader with pods that could not; the Service reaches only the leader, by its pod label.
    pub fn ready_for_traffic(&self) -> bool {
        match &self.p.inner.settings.leadership {
            Some(l) if !l.serving() => l.ready_standby(),
            _ => true,
        }
    }

    /// Whether every group has a snapshot and none is stale (older than the staleness bound
    /// while it cannot be refreshed): the gRPC health of the CloudProvider service, and what
    /// `cks_provider_node_group_snapshot_stale` says per group.
    pub fn healthy(&self) -> bool {
        (0..self.p.inner.groups.len()).all(|gi| {
            self.p.cluster(gi).snapshot_age_of().is_some() && !self.p.cluster(gi).stale_group()
        })
    }
    /// Why the provider is stuck in itself, when it is: with the keeper running, a group whose
    /// round has asked CloudStack for longer than its requests can take, or whose due round
    /// never started (`cks_domain::keeper::Policy::stalled`). CloudStack being down is not
    /// this: every request ends within its timeout and the rounds go on failing.
    /// `/healthz` fails on it, so the kubelet restarts the process.
    pub fn stalled(&self) -> Option<String> {
        if !self.p.inner.keeping.load(Ordering::Acquire) {
            return None;
        }
        let policy = super::refresh::refresh_policy(&self.p.inner);
        let at = now();
        let stuck: Vec<String> = (0..self.p.inner.groups.len())
            .filter_map(|gi| {
                let clock = self.p.cluster(gi).group_clock();
                let since = policy.stalled(&clock, at)?;
                let what = if clock.round.is_some() {
                    "its refresh round has been asking CloudStack"
                } else {
                    "its refresh round has been due and not started"
                };
                Some(format!(
                    "{}: {what} for {:.0}s (limit {:.0}s)",
                    self.p.cluster(gi).label(),
                    since.as_secs_f64(),
                    policy.stall_after.as_secs_f64()
                ))
            })
            .collect();
        (!stuck.is_empty()).then(|| stuck.join("; "))
    }

    /// The Alert-scaling verdict as an operator sees it.
    pub fn alert_verdict(&self) -> AlertVerdictView {
        self.p.inner.alert.view()
    }
}
