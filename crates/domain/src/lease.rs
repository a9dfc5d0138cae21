//! Leader election on a Kubernetes Lease (`--leader-elect`): which replica may act (submit to
//! CloudStack, write the ledger, promise), and when it must stop.
//!
//! The rules follow client-go's `LeaderElector` (`tools/leaderelection/leaderelection.go`,
//! `tryAcquireOrRenew`, `isLeaseValid`, `renew`; the autoscaler runs it): a Lease held by
//! another is taken only once its record has not changed, as seen by this replica's own clock,
//! for the record's `leaseDurationSeconds` (the holder's timestamps are never compared with
//! this clock, so clock skew between replicas does not matter); a leader that has not renewed
//! for the renew deadline stops leading. The renew deadline is shorter than the lease
//! duration, so a leader cut off from the API server stops acting before any other replica can
//! take the Lease: the fence.
//!
//! Unlike client-go, "stopped leading" here is measured from when the last successful renewal
//! was *sent*, not from when its answer came: the API server committed it after it was sent, so
//! no other replica can see the Lease expire before `sent + lease duration`.

use std::time::{Duration, Instant};

/// client-go's `JitterFactor`: the renew deadline must exceed the retry period by this factor
/// (`NewLeaderElector`'s check), so a renewal gets more than one try.
const JITTER_FACTOR: f64 = 1.2;

/// The three durations of leader election, as the autoscaler's own flags name them
/// (`--leader-elect-lease-duration` 15 s, `--leader-elect-renew-deadline` 10 s,
/// `--leader-elect-retry-period` 2 s: `componentbaseconfig.LeaderElectionConfiguration`'s
/// defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        LeaseTimings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaseTimings {
    /// client-go's checks: lease duration > renew deadline > 1.2 × retry period, and the
    /// lease duration a whole number of seconds of at least one (the Lease stores seconds).
    pub fn check(&self) -> Result<(), String> {
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return Err(format!(
                "the lease duration must be a whole number of seconds, at least 1s (the Lease stores seconds), not {:?}",
                self.lease_duration
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "the lease duration ({:?}) must be longer than the renew deadline ({:?}): a leader that cannot renew must stop before another replica may take the lease",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return Err(format!(
                "the renew deadline ({:?}) must be longer than 1.2 × the retry period ({:?}), as client-go requires",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }
}

/// A Lease's spec, as far as leader election reads and writes it
/// (`coordination.k8s.io/v1` `LeaseSpec`). Times are kept as the API server wrote them
/// (RFC 3339, microseconds): shown to people, never compared with a clock here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `holderIdentity`; empty when nobody holds it (released).
    pub holder: String,
    /// `leaseDurationSeconds`.
    pub duration_secs: u32,
    /// `acquireTime`.
    pub acquire_time: String,
    /// `renewTime`.
    pub renew_time: String,
    /// `leaseTransitions`.
    pub transitions: u32,
}

/// What to do with the Lease this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// It does not exist: create it holding this record.
    Create(LeaseRecord),
    /// Replace it (at the version read) with this record.
    Update(LeaseRecord),
    /// Another replica holds it and it has not expired: wait for the next round.
    Held { holder: String },
}

/// One replica's view of the Lease.
#[derive(Debug, Clone)]
pub struct Elector {
    identity: String,
    timings: LeaseTimings,
    /// The record last read or written, and when (this clock) it was first seen as it is.
    observed: Option<(LeaseRecord, Instant)>,
    /// When the last successful write of this replica as holder was sent.
    renewed: Option<Instant>,
}

impl Elector {
    pub fn new(identity: impl Into<String>, timings: LeaseTimings) -> Elector {
        Elector {
            identity: identity.into(),
            timings,
            observed: None,
            renewed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timings(&self) -> LeaseTimings {
        self.timings
    }

    /// Whether this replica may act at `now`: it holds the Lease and renewed it (sent the
    /// renewal that succeeded) less than the renew deadline ago.
    pub fn leading(&self, now: Instant) -> bool {
        self.renewed
            .is_some_and(|t| now.saturating_duration_since(t) < self.timings.renew_deadline)
    }

    /// The holder as last seen (empty: nobody), for logs and the standby's answers.
    pub fn holder(&self) -> Option<&str> {
        self.observed
            .as_ref()
            .map(|(r, _)| r.holder.as_str())
            .filter(|h| !h.is_empty())
    }

    /// The round's decision from the Lease as just read (`None`: it does not exist), at `now`,
    /// `wall` being the wall-clock time to write (RFC 3339, microseconds).
    pub fn attempt(&mut self, read: Option<&LeaseRecord>, now: Instant, wall: &str) -> Attempt {
        let Some(read) = read else {
            return Attempt::Create(LeaseRecord {
                holder: self.identity.clone(),
                duration_secs: self.lease_secs(),
                acquire_time: wall.to_string(),
                renew_time: wall.to_string(),
                transitions: 0,
            });
        };
        // The expiry counts from when the record was first seen as it is now.
        if self.observed.as_ref().is_none_or(|(r, _)| r != read) {
            self.observed = Some((read.clone(), now));
        }
        let since = self.observed.as_ref().map_or(now, |(_, t)| *t);
        let ours = read.holder == self.identity;
        let valid = now.saturating_duration_since(since)
            < Duration::from_secs(u64::from(read.duration_secs));
        if !read.holder.is_empty() && !ours && valid {
            return Attempt::Held {
                holder: read.holder.clone(),
            };
        }
        Attempt::Update(LeaseRecord {
            holder: self.identity.clone(),
            duration_secs: self.lease_secs(),
            acquire_time: if ours {
                read.acquire_time.clone()
            } else {
                wall.to_string()
            },
            renew_time: wall.to_string(),
            transitions: if ours {
                read.transitions
            } else {
                read.transitions.saturating_add(1)
            },
        })
    }

    /// The write of `record` (from [`Elector::attempt`]), sent at `sent`, succeeded.
    pub fn written(&mut self, record: LeaseRecord, sent: Instant) {
        if record.holder == self.identity {
            self.renewed = Some(sent);
        }
        self.observed = Some((record, sent));
    }

    /// The record that gives the Lease up at once (`wall`: now), for a leader that stops on
    /// purpose; `None` when this replica does not hold it. As client-go's `release`: no holder,
    /// a one-second duration, so the standby takes it at its next round.
    pub fn release(&mut self, wall: &str) -> Option<LeaseRecord> {
        let (held, _) = self.observed.as_ref()?;
        if held.holder != self.identity {
            return None;
        }
        self.renewed = None;
        Some(LeaseRecord {
            holder: String::new(),
            duration_secs: 1,
            acquire_time: wall.to_string(),
            renew_time: wall.to_string(),
            transitions: held.transitions,
        })
    }

    fn lease_secs(&self) -> u32 {
        u32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: &str = "2026-12-04T10:00:00.000000Z";

    fn held_by(holder: &str, transitions: u32) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            duration_secs: 15,
            acquire_time: "2026-12-04T09:00:00.000000Z".into(),
            renew_time: "2026-12-04T09:59:58.000000Z".into(),
            transitions,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn timings_are_checked_as_client_go_checks_them() {
        let t = |l, r, p| LeaseTimings {
            lease_duration: Duration::from_millis(l),
            renew_deadline: Duration::from_millis(r),
            retry_period: Duration::from_millis(p),
        };
        let table = [
            (LeaseTimings::default(), None),
            (
                t(15_000, 15_000, 2_000),
                Some("longer than the renew deadline"),
            ),
            (
                t(15_000, 16_000, 2_000),
                Some("longer than the renew deadline"),
            ),
            (t(15_000, 2_400, 2_000), Some("1.2 × the retry period")),
            (t(15_000, 2_500, 2_000), None),
            (t(15_500, 10_000, 2_000), Some("whole number of seconds")),
            (t(0, 0, 0), Some("whole number of seconds")),
        ];
        for (i, (timings, want)) in table.into_iter().enumerate() {
            match (timings.check(), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "row {i}: {e}"),
                (got, want) => panic!("row {i}: {got:?}, want {want:?}"),
            }
        }
    }

    /// Each row: the Lease as read, how long ago (this clock) it was first seen as it is,
    /// whether this replica ("b") held it before, and the decision.
    #[test]
    fn a_lease_is_taken_only_when_free_expired_or_ours() {
        let t0 = Instant::now();
        enum Want {
            Create,
            Take { transitions: u32 },
            Renew,
            Held,
        }
        let rows: Vec<(Option<LeaseRecord>, u64, Want)> = vec![
            (None, 0, Want::Create),
            // Held by "a", seen unchanged for less than its duration: wait.
            (Some(held_by("a", 3)), 0, Want::Held),
            (Some(held_by("a", 3)), 14, Want::Held),
            // Unchanged for its whole duration: "a" stopped renewing; taken.
            (Some(held_by("a", 3)), 15, Want::Take { transitions: 4 }),
            // Released (no holder): taken at once.
            (
                Some(LeaseRecord {
                    holder: String::new(),
                    duration_secs: 1,
                    ..held_by("", 3)
                }),
                0,
                Want::Take { transitions: 4 },
            ),
            // Ours: renewed, acquire time and transitions kept.
            (Some(held_by("b", 7)), 0, Want::Renew),
            (Some(held_by("b", 7)), 60, Want::Renew),
        ];
        for (i, (read, age, want)) in rows.into_iter().enumerate() {
            let mut e = Elector::new("b", LeaseTimings::default());
            if let Some(r) = &read {
                // First seen `age` seconds before the round.
                assert!(matches!(
                    e.attempt(Some(r), t0, WALL),
                    Attempt::Held { .. } | Attempt::Update(_)
                ));
            }
            let got = e.attempt(read.as_ref(), t0 + secs(age), WALL);
            match (got, want) {
                (Attempt::Create(r), Want::Create) => {
                    assert_eq!((r.holder.as_str(), r.transitions), ("b", 0), "row {i}");
                    assert_eq!(r.duration_secs, 15, "row {i}");
                }
                (Attempt::Update(r), Want::Take { transitions }) => {
                    assert_eq!(r.holder, "b", "row {i}");
                    assert_eq!(r.transitions, transitions, "row {i}");
                    assert_eq!(r.acquire_time, WALL, "row {i}");
                    assert_eq!(r.renew_time, WALL, "row {i}");
                }
                (Attempt::Update(r), Want::Renew) => {
                    let before = read.as_ref().expect("read");
                    assert_eq!(r.holder, "b", "row {i}");
                    assert_eq!(r.transitions, before.transitions, "row {i}");
                    assert_eq!(r.acquire_time, before.acquire_time, "row {i}");
                    assert_eq!(r.renew_time, WALL, "row {i}");
                }
                (Attempt::Held { holder }, Want::Held) => assert_eq!(holder, "a", "row {i}"),
                (got, _) => panic!("row {i}: {got:?}"),
            }
        }
    }

    /// A holder that keeps renewing changes the record each time: the expiry counts again
    /// from each change seen, however long the standby has been watching.
    #[test]
    fn a_renewing_holder_is_never_taken_over() {
        let t0 = Instant::now();
        let mut e = Elector::new("b", LeaseTimings::default());
        for round in 0..30u64 {
            let mut r = held_by("a", 1);
            r.renew_time = format!("renewed {}", round / 5);
            let got = e.attempt(Some(&r), t0 + secs(2 * round), WALL);
            assert!(
                matches!(got, Attempt::Held { .. }),
                "round {round}: {got:?}"
            );
        }
    }

    /// The fence: a leader leads from the renewal it sent until the renew deadline after the
    /// last one that succeeded, never as long as the lease duration another replica waits.
    #[test]
    fn a_leader_stops_leading_a_renew_deadline_after_its_last_renewal_was_sent() {
        let t0 = Instant::now();
        let timings = LeaseTimings::default();
        let mut e = Elector::new("b", timings);
        assert!(!e.leading(t0));
        let Attempt::Create(r) = e.attempt(None, t0, WALL) else {
            panic!("create")
        };
        e.written(r, t0);
        assert!(e.leading(t0));
        assert!(e.leading(t0 + secs(9)));
        assert!(!e.leading(t0 + secs(10)));
        assert!(timings.renew_deadline < timings.lease_duration);
        // A renewal sent at 4 s and answered: leading until 14 s.
        let read = e.observed.as_ref().map(|(r, _)| r.clone());
        let Attempt::Update(r) = e.attempt(read.as_ref(), t0 + secs(4), WALL) else {
            panic!("renew")
        };
        e.written(r, t0 + secs(4));
        assert!(e.leading(t0 + secs(13)));
        assert!(!e.leading(t0 + secs(14)));
    }

    #[test]
    fn only_the_holder_releases_and_stops_leading_at_once() {
        let t0 = Instant::now();
        let mut e = Elector::new("b", LeaseTimings::default());
        assert_eq!(e.release(WALL), None);
        e.attempt(Some(&held_by("a", 2)), t0, WALL);
        assert_eq!(e.release(WALL), None, "held by another");
        let Attempt::Update(r) = e.attempt(Some(&held_by("a", 2)), t0 + secs(15), WALL) else {
            panic!("take")
        };
        e.written(r, t0 + secs(15));
        assert!(e.leading(t0 + secs(15)));
        let released = e.release(WALL).expect("ours");
        assert_eq!(released.holder, "");
        assert_eq!(released.duration_secs, 1);
        assert_eq!(released.transitions, 3);
        assert!(!e.leading(t0 + secs(15)));
        assert_eq!(e.holder(), Some("b"));
    }
}
