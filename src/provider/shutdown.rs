//! Letting go of jobs: Cleanup (the autoscaler's, for its groups, or the provider's, for
//! all) stops following them, and shutdown waits a grace period for them to end. Jobs keep
//! running in CloudStack either way; a later Refresh, or a restarted provider, adopts them.
//! Kept together because both must leave each machine able to adopt its job again.

use super::Cluster;
use super::cluster_loop::Change;
use super::{Provider, Result, Scoped};
use cks_domain::machine::Phase;
use std::time::Duration;

impl Provider {
    /// Stops following every group's job; returns once each group's loop let its job go, so
    /// whatever comes after (the last state write, a Refresh) finds it let go. Jobs keep
    /// running in CloudStack; a later Refresh adopts them again.
    pub async fn cleanup(&self) {
        self.all_groups().let_go().await;
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

impl Cluster {
    /// Cleanup of the group, in its loop: its job let go (the agenda no longer finds it to
    /// follow) and its removals not sent dropped.
    pub(crate) fn cleanup_here(&self) {
        self.group().lock().scale.cleanup();
    }
}

impl Scoped<'_> {
    /// Stops following the caller's groups' jobs (they keep running in CloudStack; a later
    /// Refresh adopts them again); returns once each group's loop let its job go. Other groups
    /// are left alone; the admin address's caller changes nothing
    /// ([`super::Error::ReadOnly`]).
    pub async fn cleanup(&self) -> Result<()> {
        self.may_change()?;
        self.let_go().await;
        Ok(())
    }

    /// Has each of the caller's groups' loops let its job go, and waits until all have: each
    /// loop does it beside whatever it has under way, a poll CloudStack is slow to answer
    /// included.
    async fn let_go(&self) {
        self.p.change_each(self.visible(), || Change::Cleanup).await;
    }
}
