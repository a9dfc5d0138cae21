//! The keeper: one task that starts the refresh rounds `cks_domain::keeper` says are due, so
//! that no snapshot depends on an autoscaler's RPC reaching the provider (a replica Kubernetes
//! stopped routing to would never hear one), and the liveness verdict built on it.
//!
//! It only carries out the plan: which group is due, with which backoff and jitter, and when
//! to look again are the domain's; the rounds themselves are `refresh`'s, shared with the
//! Refreshes (one round per group at a time, under the same permits and rate limit).

use super::{Provider, now};
use std::sync::atomic::Ordering;

impl Provider {
    /// Starts the keeper (once per process; a second call does nothing): the first snapshot of
    /// every group, retried with backoff while CloudStack does not answer, then every group kept
    /// within the staleness bound, and at the rate limit's pace while an autoscaler asks for it.
    /// The task holds no strong reference between its wake-ups: it ends with the provider.
    pub fn spawn_keeper(&self) -> tokio::task::JoinHandle<()> {
        let first = !self.inner.keeping.swap(true, Ordering::AcqRel);
        let weak = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            if !first {
                return;
            }
            let mut loaded = false;
            let mut said_waiting = false;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let p = Provider { inner };
                let policy = super::refresh::refresh_policy(&p.inner);
                let at = now();
                let clocks: Vec<_> = (0..p.inner.groups.len())
                    .map(|gi| p.cluster(gi).group_clock())
                    .collect();
                if !loaded {
                    if clocks.iter().all(|c| c.fetched.is_some()) {
                        loaded = true;
                        tracing::info!("first CloudStack snapshot loaded for every node group");
                    } else if !said_waiting && clocks.iter().any(|c| c.failures > 0) {
                        said_waiting = true;
                        tracing::info!(
                            "serving without a snapshot until CloudStack answers; the provider retries on its own with backoff"
                        );
                    }
                }
                let plan = policy.plan(&clocks, at);
                for gi in plan.start {
                    p.cluster(gi).start_round();
                }
                // Looked at again when a round ends, when the next group is due, and at least
                // every refresh interval (an autoscaler that starts asking shortens a group's
                // keep age).
                let look_again = cks_domain::timing::keeper_look_again(policy.min_interval);
                let wake = plan
                    .wake
                    .map_or(look_again, |w| w.saturating_duration_since(at))
                    .min(look_again);
                let woken = p.inner.keeper_wake.clone();
                drop(p);
                tokio::select! {
                    () = tokio::time::sleep(wake) => {}
                    () = woken.notified() => {}
                }
            }
        })
    }
}
