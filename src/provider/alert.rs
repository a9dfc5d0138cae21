//! The provider-wide verdict on whether the CloudStack behind it scales clusters in Alert
//! (CloudStack PR 14604), and how it is kept honest.
//!
//! A verdict of "unsupported" learned from one refusal is not forever: the refusal may have
//! been a race (a worker restarted between the provider's check and the job) or the texts of
//! the Alert-scaling PR's own refusals may contain the same words (they are *unverified*). So a
//! learned verdict is dropped after `alert_recheck`, and at once when `listCapabilities`
//! reports another `cloudstackversion` (an upgrade). Only the verdict configured with
//! `--alert-scaling` stays.

use super::{Provider, now};
use cks_domain::rules::AlertScaling;
use std::time::{Duration, Instant};

/// How often, at most, `listCapabilities` is asked while a learned verdict stands.
const VERSION_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// How often otherwise: the version a verdict is learned under must be known before it is
/// learned, or an upgrade right after would go unnoticed.
const VERSION_CHECK_IDLE_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// The verdict and what it rests on.
#[derive(Debug, Clone)]
pub(crate) struct AlertVerdict {
    pub scaling: AlertScaling,
    /// When CloudStack's refusal taught it (`None`: configured, or not learned).
    pub learned_at: Option<Instant>,
    /// CloudStack's version when it was learned, once known.
    pub version: Option<String>,
    /// When `listCapabilities` was last asked.
    pub version_checked: Option<Instant>,
}

impl AlertVerdict {
    pub fn new(scaling: AlertScaling) -> Self {
        AlertVerdict {
            scaling,
            learned_at: None,
            version: None,
            version_checked: None,
        }
    }
}

/// What an operator is shown of the verdict (probe, debug line, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertVerdictView {
    /// `unknown`, `supported` or `unsupported`.
    pub verdict: &'static str,
    /// CloudStack's refusal, or why it is configured so.
    pub reason: Option<String>,
    /// How long ago CloudStack's refusal taught it (`None` when not learned).
    pub age: Option<Duration>,
    /// When it is dropped and CloudStack asked again (`None` when it is not).
    pub recheck_in: Option<Duration>,
}

fn verdict_name(a: &AlertScaling) -> &'static str {
    match a {
        AlertScaling::Unknown => "unknown",
        AlertScaling::Supported => "supported",
        AlertScaling::Unsupported { .. } => "unsupported",
    }
}

impl Provider {
    fn verdict(&self) -> std::sync::MutexGuard<'_, AlertVerdict> {
        self.inner.alert.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The verdict the rules apply now; a learned "unsupported" older than `alert_recheck` is
    /// dropped first (the next request in Alert goes to CloudStack, whose answer tells).
    pub(crate) fn alert_scaling(&self) -> AlertScaling {
        let recheck = self.inner.settings.alert_recheck;
        let mut v = self.verdict();
        if let Some(at) = v.learned_at
            && now().saturating_duration_since(at) >= recheck
        {
            tracing::info!(after = ?recheck,
                "asking CloudStack again whether it scales clusters in Alert (the verdict learned from its refusal has expired)");
            v.scaling = AlertScaling::Unknown;
            v.learned_at = None;
        }
        v.scaling.clone()
    }

    /// CloudStack refused a request every rule allows because the cluster is in Alert.
    pub(crate) fn set_alert_unsupported(&self, text: &str) {
        let mut v = self.verdict();
        if matches!(v.scaling, AlertScaling::Unsupported { .. }) {
            return;
        }
        tracing::warn!(
            cloudstack_error = text,
            recheck = ?self.inner.settings.alert_recheck,
            "this CloudStack refuses to scale clusters in Alert (it predates the Alert-scaling change); \
             scale requests for clusters in Alert are refused without calling CloudStack until the \
             verdict is re-checked"
        );
        let version = v.version.clone();
        *v = AlertVerdict {
            scaling: AlertScaling::Unsupported {
                cloudstack_error: text.to_string(),
            },
            learned_at: Some(now()),
            version,
            version_checked: v.version_checked,
        };
    }

    /// Asks `listCapabilities` for CloudStack's version (at most once a minute while a learned
    /// verdict stands, every ten minutes otherwise): another `cloudstackversion` (an upgrade)
    /// drops a learned verdict at once.
    pub(crate) async fn check_cloudstack_version(&self) {
        let due = {
            let v = self.verdict();
            let interval = if v.learned_at.is_some() {
                VERSION_CHECK_INTERVAL
            } else {
                VERSION_CHECK_IDLE_INTERVAL
            };
            v.version_checked
                .is_none_or(|t| now().saturating_duration_since(t) >= interval)
        };
        if !due {
            return;
        }
        let seen = match self.inner.cs.cloudstack_version().await {
            Ok(version) => version,
            Err(e) => {
                tracing::debug!(error = %e, "listCapabilities failed");
                self.verdict().version_checked = Some(now());
                return;
            }
        };
        let mut v = self.verdict();
        v.version_checked = Some(now());
        match &v.version {
            None => v.version = Some(seen),
            Some(known) if *known != seen && v.learned_at.is_some() => {
                tracing::info!(from = %known, to = %seen,
                    "CloudStack's version changed: asking it again whether it scales clusters in Alert");
                v.scaling = AlertScaling::Unknown;
                v.learned_at = None;
                v.version = Some(seen);
            }
            Some(_) => v.version = Some(seen),
        }
    }

    /// The verdict as an operator sees it.
    pub fn alert_verdict(&self) -> AlertVerdictView {
        let scaling = self.alert_scaling();
        let v = self.verdict();
        let age = v.learned_at.map(|at| now().saturating_duration_since(at));
        AlertVerdictView {
            verdict: verdict_name(&scaling),
            reason: match &scaling {
                AlertScaling::Unsupported { cloudstack_error } => Some(cloudstack_error.clone()),
                _ => None,
            },
            age,
            recheck_in: age.map(|a| self.inner.settings.alert_recheck.saturating_sub(a)),
        }
    }
}
