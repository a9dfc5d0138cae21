//! The provider-wide verdict on whether the CloudStack behind it scales clusters in Alert
//! (CloudStack PR 14604), and when it stops being believed.
//!
//! A verdict of "unsupported" learned from one refusal is not forever: the refusal may have
//! been a race (a worker restarted between the provider's check and the job) or the texts of
//! the Alert-scaling PR's own refusals may contain the same words (they are *unverified*). So a
//! learned verdict is dropped after the recheck time, and at once when CloudStack reports
//! another version (an upgrade). Only a configured verdict stays. The shell holds the value
//! behind its lock, asks `listCapabilities` when [`AlertVerdict::version_check_due`] says so,
//! and logs what the transitions return.

use crate::rules::AlertScaling;
use std::time::{Duration, Instant};

/// How often, at most, CloudStack's version is asked while a learned verdict stands.
pub const VERSION_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// How often otherwise: the version a verdict is learned under must be known before it is
/// learned, or an upgrade right after would go unnoticed.
pub const VERSION_CHECK_IDLE_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// The verdict and what it rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertVerdict {
    scaling: AlertScaling,
    /// When CloudStack's refusal taught it (`None`: configured, or not learned).
    learned_at: Option<Instant>,
    /// CloudStack's version when it was learned, once known.
    version: Option<String>,
    /// When the version was last asked.
    version_checked: Option<Instant>,
}

/// The verdict's name, as operators and metric labels see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerdictName {
    Unknown,
    Supported,
    Unsupported,
}

impl VerdictName {
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictName::Unknown => "unknown",
            VerdictName::Supported => "supported",
            VerdictName::Unsupported => "unsupported",
        }
    }

    pub fn of(a: &AlertScaling) -> VerdictName {
        match a {
            AlertScaling::Unknown => VerdictName::Unknown,
            AlertScaling::Supported => VerdictName::Supported,
            AlertScaling::Unsupported { .. } => VerdictName::Unsupported,
        }
    }
}

/// What an operator is shown of the verdict (probe, debug line, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertVerdictView {
    pub verdict: VerdictName,
    /// CloudStack's refusal, when it is the reason.
    pub reason: Option<String>,
    /// How long ago CloudStack's refusal taught it (`None` when not learned).
    pub age: Option<Duration>,
    /// When it is dropped and CloudStack asked again (`None` when it is not).
    pub recheck_in: Option<Duration>,
}

/// What a version answer did to the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionSeen {
    /// Nothing changed (first version known, or the same, or no learned verdict to drop).
    Kept,
    /// Another version while a learned verdict stood: the verdict is dropped.
    Upgraded { from: String, to: String },
}

impl AlertVerdict {
    /// A verdict as configured (`--alert-scaling`), or `Unknown` for `auto`.
    pub fn new(scaling: AlertScaling) -> Self {
        AlertVerdict {
            scaling,
            learned_at: None,
            version: None,
            version_checked: None,
        }
    }

    /// The verdict the rules apply at `now`: a learned one older than `recheck` is dropped
    /// first (the next request in Alert goes to CloudStack, whose answer tells). Returns
    /// whether it was dropped now.
    pub fn current(&mut self, now: Instant, recheck: Duration) -> (AlertScaling, bool) {
        let expired = self.expired(now, recheck);
        if expired {
            self.scaling = AlertScaling::Unknown;
            self.learned_at = None;
        }
        (self.scaling.clone(), expired)
    }

    /// [`AlertVerdict::current`] without changing anything, for readers that share the
    /// verdict: `None` when a learned verdict is due to be dropped, which only `current` does.
    pub fn standing(&self, now: Instant, recheck: Duration) -> Option<&AlertScaling> {
        (!self.expired(now, recheck)).then_some(&self.scaling)
    }

    /// Whether a learned verdict is `recheck` old at `now`.
    fn expired(&self, now: Instant, recheck: Duration) -> bool {
        self.learned_at
            .is_some_and(|at| now.saturating_duration_since(at) >= recheck)
    }

    /// CloudStack refused a request every rule allows because the cluster is in Alert.
    /// Returns `false` when the verdict already was "unsupported" (nothing learned).
    pub fn learn_unsupported(&mut self, cloudstack_error: &str, now: Instant) -> bool {
        if matches!(self.scaling, AlertScaling::Unsupported { .. }) {
            return false;
        }
        self.scaling = AlertScaling::Unsupported {
            cloudstack_error: cloudstack_error.to_string(),
        };
        self.learned_at = Some(now);
        true
    }

    /// Whether CloudStack's version should be asked at `now`.
    pub fn version_check_due(&self, now: Instant) -> bool {
        let interval = if self.learned_at.is_some() {
            VERSION_CHECK_INTERVAL
        } else {
            VERSION_CHECK_IDLE_INTERVAL
        };
        self.version_checked
            .is_none_or(|t| now.saturating_duration_since(t) >= interval)
    }

    /// The version check failed at `now`: not asked again before the interval.
    pub fn version_unknown(&mut self, now: Instant) {
        self.version_checked = Some(now);
    }

    /// CloudStack reported `seen` at `now`.
    pub fn version_seen(&mut self, seen: &str, now: Instant) -> VersionSeen {
        self.version_checked = Some(now);
        let change = match &self.version {
            Some(known) if known != seen && self.learned_at.is_some() => {
                self.scaling = AlertScaling::Unknown;
                self.learned_at = None;
                VersionSeen::Upgraded {
                    from: known.clone(),
                    to: seen.to_string(),
                }
            }
            _ => VersionSeen::Kept,
        };
        self.version = Some(seen.to_string());
        change
    }

    /// The verdict as an operator sees it at `now`. Call [`AlertVerdict::current`] first: it
    /// drops an expired verdict, which this only reads.
    pub fn view(&self, now: Instant, recheck: Duration) -> AlertVerdictView {
        let age = self.learned_at.map(|at| now.saturating_duration_since(at));
        AlertVerdictView {
            verdict: VerdictName::of(&self.scaling),
            reason: match &self.scaling {
                AlertScaling::Unsupported { cloudstack_error } => Some(cloudstack_error.clone()),
                _ => None,
            },
            age,
            recheck_in: age.map(|a| recheck.saturating_sub(a)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECHECK: Duration = Duration::from_secs(3600);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// One row: a configured verdict, what happens (refusal at t, version answers at t), and
    /// the verdict the rules apply at the row's last time.
    #[test]
    fn when_the_verdict_is_believed_and_when_it_is_dropped() {
        enum Step {
            Refused(u64),
            Version(u64, &'static str),
        }
        use Step::*;
        let unsupported = VerdictName::Unsupported;
        let rows: &[(&str, AlertScaling, &[Step], u64, VerdictName)] = &[
            (
                "nothing learned",
                AlertScaling::Unknown,
                &[],
                10,
                VerdictName::Unknown,
            ),
            (
                "configured on stays",
                AlertScaling::Supported,
                &[Version(0, "4.20"), Version(100, "4.21")],
                99_999,
                VerdictName::Supported,
            ),
            (
                "learned from a refusal",
                AlertScaling::Unknown,
                &[Refused(10)],
                20,
                unsupported,
            ),
            (
                "still believed just before the recheck",
                AlertScaling::Unknown,
                &[Refused(10)],
                10 + 3599,
                unsupported,
            ),
            (
                "dropped at the recheck time",
                AlertScaling::Unknown,
                &[Refused(10)],
                10 + 3600,
                VerdictName::Unknown,
            ),
            (
                "an upgrade drops it at once",
                AlertScaling::Unknown,
                &[Version(0, "4.19"), Refused(10), Version(70, "4.20")],
                71,
                VerdictName::Unknown,
            ),
            (
                "the same version keeps it",
                AlertScaling::Unknown,
                &[Version(0, "4.19"), Refused(10), Version(70, "4.19")],
                71,
                unsupported,
            ),
            (
                "a version first known after learning is not an upgrade",
                AlertScaling::Unknown,
                &[Refused(10), Version(70, "4.20")],
                71,
                unsupported,
            ),
            (
                "a second refusal does not restart the clock",
                AlertScaling::Unknown,
                &[Refused(10), Refused(3000)],
                10 + 3600,
                VerdictName::Unknown,
            ),
        ];
        for (name, configured, steps, at, want) in rows {
            let t0 = Instant::now();
            let mut v = AlertVerdict::new(configured.clone());
            for step in *steps {
                match step {
                    Refused(t) => {
                        v.current(t0 + secs(*t), RECHECK);
                        v.learn_unsupported("cluster in Alert", t0 + secs(*t));
                    }
                    Version(t, seen) => {
                        v.version_seen(seen, t0 + secs(*t));
                    }
                }
            }
            let standing = v.standing(t0 + secs(*at), RECHECK).cloned();
            let (scaling, expired) = v.current(t0 + secs(*at), RECHECK);
            assert_eq!(VerdictName::of(&scaling), *want, "{name}");
            // A reader's look agrees, or leaves the drop to `current`.
            assert_eq!(standing.is_none(), expired, "{name}");
            assert!(standing.is_none_or(|s| s == scaling), "{name}");
        }
    }

    #[test]
    fn the_version_is_asked_every_minute_while_a_learned_verdict_stands_else_every_ten() {
        let t0 = Instant::now();
        let mut v = AlertVerdict::new(AlertScaling::Unknown);
        assert!(v.version_check_due(t0), "never asked: due");
        v.version_seen("4.20", t0);
        assert!(!v.version_check_due(t0 + secs(599)));
        assert!(v.version_check_due(t0 + secs(600)));
        v.learn_unsupported("refused", t0 + secs(1));
        assert!(!v.version_check_due(t0 + secs(59)));
        assert!(v.version_check_due(t0 + secs(60)));
        v.version_unknown(t0 + secs(60));
        assert!(
            !v.version_check_due(t0 + secs(119)),
            "a failed check waits too"
        );
    }

    #[test]
    fn the_operators_view_names_the_refusal_its_age_and_the_recheck() {
        let t0 = Instant::now();
        let mut v = AlertVerdict::new(AlertScaling::Unknown);
        assert_eq!(
            v.view(t0, RECHECK),
            AlertVerdictView {
                verdict: VerdictName::Unknown,
                reason: None,
                age: None,
                recheck_in: None
            }
        );
        assert!(v.learn_unsupported("cluster in Alert", t0));
        assert!(!v.learn_unsupported("again", t0 + secs(5)), "learned once");
        assert_eq!(
            v.view(t0 + secs(600), RECHECK),
            AlertVerdictView {
                verdict: VerdictName::Unsupported,
                reason: Some("cluster in Alert".into()),
                age: Some(secs(600)),
                recheck_in: Some(secs(3000)),
            }
        );
        assert_eq!(
            v.version_seen("4.20", t0 + secs(601)),
            VersionSeen::Kept,
            "first version known"
        );
        assert_eq!(
            v.version_seen("4.21", t0 + secs(700)),
            VersionSeen::Upgraded {
                from: "4.20".into(),
                to: "4.21".into()
            }
        );
        assert_eq!(
            v.view(t0 + secs(700), RECHECK).verdict,
            VerdictName::Unknown
        );
    }
}
