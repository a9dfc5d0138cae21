//! Letting go of jobs: Cleanup (the autoscaler's, for its groups, or the provider's, for
//! all) stops following them, and shutdown waits a grace period for them to end. Jobs keep
//! running in CloudStack either way; a later Refresh, or a restarted provider, adopts them.
//! Kept together because both must leave each machine able to adopt its job again.

use super::{Provider, Result, Scoped};
use cks_domain::machine::Phase;
use std::time::Duration;

impl Provider {
    /// Stops following every group's job (each group's loop lets it go). Jobs keep running in
    /// CloudStack; a later Refresh adopts them again.
    pub fn cleanup(&self) {
        self.inner.shutdown.send_replace(true);
        for g in &self.inner.groups {
            g.lock().scale.cleanup();
        }
        self.inner.shutdown.send_replace(false);
    }

    /// Waits until no scale operation is in flight, or `grace` passes: on shutdown, running
    /// jobs are followed only as long as the grace period allows (CloudStack finishes them
    /// anyway; a restarted provider adopts them).
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        let until = tokio::time::Instant::now() + grace;
        loop {
            let busy = self
                .inner
                .groups
                .iter()
                .any(|g| g.read().scale.phase() != &Phase::Idle);
            if !busy {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                tracing::warn!(
                    "shutdown grace period over with a scale job still running; a restarted provider adopts it"
                );
                return false;
            }
            tokio::time::sleep(cks_domain::timing::IDLE_CHECK).await;
        }
    }
}

impl Scoped<'_> {
    /// Stops following the caller's groups' jobs (they keep running in CloudStack; a later
    /// Refresh adopts them again). Other groups are left alone; the admin address's caller
    /// changes nothing ([`super::Error::ReadOnly`]).
    pub fn cleanup(&self) -> Result<()> {
        self.may_change()?;
        for gi in self.visible() {
            let g = &self.p.inner.groups[gi];
            g.lock().scale.cleanup();
            // The group's loop wakes and finds no job of the group's to follow.
            g.wake.notify_one();
        }
        Ok(())
    }
}
