//! The shell around the Alert-scaling verdict ([`cks_domain::verdict`], where what is believed
//! and for how long is decided): the lock it lives behind, the `listCapabilities` call its
//! version check needs, and the log lines of its transitions.

use super::{Provider, now};
use cks_domain::rules::AlertScaling;
use cks_domain::verdict::{AlertVerdict, AlertVerdictView, VersionSeen};
use std::sync::atomic::Ordering;
use std::sync::{PoisonError, RwLockReadGuard, RwLockWriteGuard};

impl Provider {
    /// The verdict, to change it.
    fn verdict(&self) -> RwLockWriteGuard<'_, AlertVerdict> {
        self.inner
            .alert
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The verdict, to read it: every NodeGroups and NodeGroupForNode answer reads it, and
    /// none waits for another.
    fn verdict_read(&self) -> RwLockReadGuard<'_, AlertVerdict> {
        self.inner
            .alert
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The verdict the rules apply now; a learned "unsupported" older than `alert_recheck` is
    /// dropped first (the next request in Alert goes to CloudStack, whose answer tells).
    pub(crate) fn alert_scaling(&self) -> AlertScaling {
        let recheck = self.inner.settings.alert_recheck;
        let at = now();
        if let Some(scaling) = self.verdict_read().standing(at, recheck) {
            return scaling.clone();
        }
        let (scaling, expired) = self.verdict().current(at, recheck);
        if expired {
            tracing::info!(after = ?recheck,
                "asking CloudStack again whether it scales clusters in Alert (the verdict learned from its refusal has expired)");
        }
        scaling
    }

    /// CloudStack refused a request every rule allows because the cluster is in Alert.
    pub(crate) fn set_alert_unsupported(&self, text: &str) {
        if self.verdict().learn_unsupported(text, now()) {
            tracing::warn!(
                cloudstack_error = text,
                recheck = ?self.inner.settings.alert_recheck,
                "this CloudStack refuses to scale clusters in Alert (it predates the Alert-scaling change); \
                 scale requests for clusters in Alert are refused without calling CloudStack until the \
                 verdict is re-checked"
            );
        }
    }

    /// Asks `listCapabilities` for CloudStack's version when the verdict's check is due:
    /// another `cloudstackversion` (an upgrade) drops a learned verdict at once.
    pub(crate) async fn check_cloudstack_version(&self) {
        let optional = &self.inner.optional.capabilities;
        if !optional.load(Ordering::Relaxed) || !self.verdict_read().version_check_due(now()) {
            return;
        }
        // Rounds of many clusters end at once: one of them asks, the others go on.
        if self.inner.version_check.swap(true, Ordering::AcqRel) {
            return;
        }
        let answer = self.inner.cs.cloudstack_version().await;
        self.inner.version_check.store(false, Ordering::Release);
        match answer {
            Err(e) if e.is_not_permitted() => {
                optional.store(false, Ordering::Relaxed);
                tracing::warn!(error = %e, cloudstack = self.inner.cs.api_url(), recheck = ?self.inner.settings.alert_recheck,
                    "this CloudStack key may not call listCapabilities (optional): {}", super::WITHOUT_LIST_CAPABILITIES);
            }
            Ok(seen) => {
                if let VersionSeen::Upgraded { from, to } =
                    self.verdict().version_seen(&seen, now())
                {
                    tracing::info!(from = %from, to = %to,
                        "CloudStack's version changed: asking it again whether it scales clusters in Alert");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "listCapabilities failed");
                self.verdict().version_unknown(now());
            }
        }
    }

    /// The verdict as an operator sees it.
    pub fn alert_verdict(&self) -> AlertVerdictView {
        // Expired first, and logged, through `alert_scaling`: the view only reads.
        self.alert_scaling();
        self.verdict_read()
            .view(now(), self.inner.settings.alert_recheck)
    }
}
