//! The shell around the Alert-scaling verdict ([`cks_domain::verdict`], where what is believed
//! and for how long is decided): the lock it lives behind, the `listCapabilities` call its
//! version check needs, and the log lines of its transitions.

use super::now;
use cks_cloudstack::Client;
use cks_domain::rules::AlertScaling;
use cks_domain::verdict::{AlertVerdict, AlertVerdictView, VersionSeen};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// The Alert-scaling verdict every group's rules apply, shared by the provider: read by every
/// NodeGroups and NodeGroupForNode answer, changed only when CloudStack teaches something.
pub(crate) struct Alert {
    verdict: RwLock<AlertVerdict>,
    /// How long a learned "unsupported" stands (`--alert-recheck`).
    recheck: Duration,
    /// A `listCapabilities` check is in flight: concurrent rounds do not ask again.
    version_check: AtomicBool,
}

impl Alert {
    pub(crate) fn new(start: AlertScaling, recheck: Duration) -> Self {
        Alert {
            verdict: RwLock::new(AlertVerdict::new(start)),
            recheck,
            version_check: AtomicBool::new(false),
        }
    }

    /// The verdict, to change it.
    fn write(&self) -> RwLockWriteGuard<'_, AlertVerdict> {
        self.verdict.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The verdict, to read it: every NodeGroups and NodeGroupForNode answer reads it, and
    /// none waits for another.
    fn read(&self) -> RwLockReadGuard<'_, AlertVerdict> {
        self.verdict.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The verdict the rules apply now; a learned "unsupported" older than `alert_recheck` is
    /// dropped first (the next request in Alert goes to CloudStack, whose answer tells).
    pub(crate) fn scaling(&self) -> AlertScaling {
        let recheck = self.recheck;
        let at = now();
        if let Some(scaling) = self.read().standing(at, recheck) {
            return scaling.clone();
        }
        let (scaling, expired) = self.write().current(at, recheck);
        if expired {
            tracing::info!(after = ?recheck,
                "asking CloudStack again whether it scales clusters in Alert (the verdict learned from its refusal has expired)");
        }
        scaling
    }

    /// CloudStack refused a request every rule allows because the cluster is in Alert.
    pub(crate) fn learn_unsupported(&self, text: &str) {
        if self.write().learn_unsupported(text, now()) {
            tracing::warn!(
                cloudstack_error = text,
                recheck = ?self.recheck,
                "this CloudStack refuses to scale clusters in Alert (it predates the Alert-scaling change); \
                 scale requests for clusters in Alert are refused without calling CloudStack until the \
                 verdict is re-checked"
            );
        }
    }

    /// Asks `listCapabilities` for CloudStack's version when the verdict's check is due:
    /// another `cloudstackversion` (an upgrade) drops a learned verdict at once. `optional`:
    /// whether the key may call it (learned here from its 432).
    pub(crate) async fn check_version(&self, cs: &Client, optional: &AtomicBool) {
        if !optional.load(Ordering::Relaxed) || !self.read().version_check_due(now()) {
            return;
        }
        // Rounds of many clusters end at once: one of them asks, the others go on.
        if self.version_check.swap(true, Ordering::AcqRel) {
            return;
        }
        let answer = cs.cloudstack_version().await;
        self.version_check.store(false, Ordering::Release);
        match answer {
            Err(e) if e.is_not_permitted() => {
                optional.store(false, Ordering::Relaxed);
                tracing::warn!(error = %e, cloudstack = cs.api_url(), recheck = ?self.recheck,
                    "this CloudStack key may not call listCapabilities (optional): {}", super::WITHOUT_LIST_CAPABILITIES);
            }
            Ok(seen) => {
                if let VersionSeen::Upgraded { from, to } = self.write().version_seen(&seen, now())
                {
                    tracing::info!(from = %from, to = %to,
                        "CloudStack's version changed: asking it again whether it scales clusters in Alert");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "listCapabilities failed");
                self.write().version_unknown(now());
            }
        }
    }

    /// The verdict as an operator sees it.
    pub(crate) fn view(&self) -> AlertVerdictView {
        // Expired first, and logged, through `scaling`: the view only reads.
        self.scaling();
        self.read().view(now(), self.recheck)
    }
}
