//! Keeping every group's snapshot fresh without waiting for an autoscaler to ask: when a
//! refresh round is due, how a Refresh is answered, and when the provider is stuck in itself.
//!
//! Why the provider refreshes on its own: in Kubernetes a pod that fails its readiness probe
//! is not a ready endpoint of its Service, and kube-proxy sends a Service's traffic only to
//! ready endpoints. Anything that waits for an RPC to recover would wait for good once the
//! provider stopped being Ready. So recovery after a CloudStack outage is this module's
//! decision alone: a group whose last round failed is tried again after a backoff with
//! jitter (at most one round per group per backoff step, spread across groups, so a
//! CloudStack coming back is not met by every cluster at once), and a group whose snapshot
//! nears the staleness bound is refreshed before it gets there.
//!
//! Why a rate limit changes how a Refresh is answered: with `--cloudstack-max-rps` the
//! provider cannot read every cluster as often as the autoscalers ask (500 clusters at 20
//! rounds a second is one read per cluster every 25 s). It keeps the clusters an autoscaler
//! asks about at that pace, spread over them; a Refresh whose snapshot is as fresh as that
//! pace allows is answered at once instead of waiting for a round the rate limit cannot give
//! it before the caller's deadline. Without a rate limit the pace is the refresh interval and
//! a Refresh waits for its round, as the autoscaler's loop expects (one CloudStack call).
//!
//! Nothing here reads a clock: the shell passes the instants it observed.

use std::time::{Duration, Instant};

/// The share of `--cloudstack-max-rps` that keeping snapshots fresh may use: the rest is left
/// for what cannot wait (scale requests, job polls, VM stops), which share the same pace.
const REFRESH_SHARE_OF_RATE: f64 = 0.8;

/// The first retry after a failed round; doubled after each failure up to
/// [`Policy::backoff_cap`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest backoff without a rate limit: a retry within 15 s of CloudStack's return lets
/// the autoscaler's second 10 s loop after it succeed, while 500 failing clusters cost a
/// recovering CloudStack at most about 35-70 calls a second (and the rate limit, when set).
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// A group nobody asks about is read again once its snapshot is this share of the staleness
/// bound old: it never reaches the bound, so owed removals and followed work on it go on, and
/// a group whose autoscaler comes back finds a snapshot it can be answered from.
const IDLE_SHARE_OF_BOUND: f64 = 0.75;

/// How many CloudStack requests one round may make one after the other (the stop-permission
/// probe, the cluster's pages, the job search, the offering, the version check): each is
/// bounded by the request timeout, so a round asking for longer than this many timeouts, plus
/// the staleness bound as slack, is not waiting for CloudStack.
const REQUESTS_PER_ROUND: u32 = 12;

/// How the provider paces its refresh rounds, from the operator's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// `--refresh-min-interval`: a snapshot younger than this is never read again for a
    /// Refresh.
    pub min_interval: Duration,
    /// `--staleness-bound`: how old a snapshot may be and still be answered from.
    pub staleness_bound: Duration,
    /// How often each group can be read within the rate limit's share for refreshes
    /// (`Duration::ZERO` without a rate limit).
    pub pace: Duration,
    /// How long a round may ask CloudStack, or a due round wait to start, before the provider
    /// counts as stuck in itself (`/healthz` fails, the kubelet restarts it).
    pub stall_after: Duration,
}

impl Policy {
    /// The policy for `groups` groups, with CloudStack requests limited to `max_rps` a second
    /// (`None`: no limit) and each bounded by `request_timeout`.
    pub fn new(
        min_interval: Duration,
        staleness_bound: Duration,
        groups: usize,
        max_rps: Option<f64>,
        request_timeout: Duration,
    ) -> Self {
        let pace = match max_rps {
            Some(rps) if rps.is_finite() && rps > 0.0 => {
                Duration::from_secs_f64(groups as f64 / (rps * REFRESH_SHARE_OF_RATE))
            }
            _ => Duration::ZERO,
        };
        let stall_after = (request_timeout * REQUESTS_PER_ROUND + staleness_bound)
            .max(staleness_bound * 2)
            + pace;
        Policy {
            min_interval,
            staleness_bound,
            pace,
            stall_after,
        }
    }

    /// The age from which a snapshot is read again for a Refresh, and kept at by the provider
    /// for a group an autoscaler asks about: the refresh interval, or the rate limit's pace
    /// when that is longer.
    pub fn refresh_after(&self) -> Duration {
        self.min_interval.max(self.pace)
    }

    /// The age from which a Refresh waits for the round it joined or started: one pace past
    /// [`Policy::refresh_after`], where the provider fell behind the pace it keeps. Without a
    /// rate limit this is `refresh_after` itself: a round costs one call and the caller
    /// waits for it.
    pub fn wait_after(&self) -> Duration {
        self.refresh_after() + self.pace
    }

    /// The longest wait between two rounds of a failing group: a quarter of the staleness
    /// bound (a snapshot comes again well inside it), at least the refresh interval, at most
    /// [`MAX_BACKOFF`], and never shorter than the rate limit's pace (retrying a group faster
    /// than it can be read gains nothing).
    pub fn backoff_cap(&self) -> Duration {
        (self.staleness_bound / 4)
            .max(self.min_interval)
            .max(FIRST_BACKOFF)
            .min(MAX_BACKOFF)
            .max(self.pace.min(Duration::from_secs(60)))
    }

    /// The wait after the `failures`-th failed round in a row, with equal jitter: between half
    /// and all of the doubled step, `jitter` (in `[0, 1)`) choosing where, so groups that
    /// failed together do not come back together.
    pub fn backoff(&self, failures: u32, jitter: f64) -> Duration {
        let cap = self.backoff_cap();
        let step = FIRST_BACKOFF
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
            .min(cap);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        step / 2 + step.mul_f64(jitter / 2.0)
    }

    /// How old a group's snapshot may get before the provider reads it again on its own.
    fn keep_age(&self, demanded: bool) -> Duration {
        if demanded && self.pace > self.min_interval {
            self.pace
        } else {
            self.staleness_bound.mul_f64(IDLE_SHARE_OF_BOUND)
        }
    }

    /// Whether an autoscaler asking at `demanded` still counts as asking at `now`.
    fn demanded(&self, g: &GroupClock, now: Instant) -> bool {
        g.demanded
            .is_some_and(|d| now.saturating_duration_since(d) < self.staleness_bound)
    }

    /// When group `g` should have a round started, `now` or earlier meaning at once; `None`
    /// while a round is in flight.
    pub fn due(&self, g: &GroupClock, now: Instant) -> Option<Instant> {
        if g.round.is_some() {
            return None;
        }
        if g.failures > 0 {
            let after = g.last_end.unwrap_or(now);
            return Some(after + self.backoff(g.failures, g.jitter));
        }
        match g.fetched {
            None => Some(now),
            Some(f) => Some(f + self.keep_age(self.demanded(g, now))),
        }
    }

    /// The groups of `groups` whose round is due at `now`, and when the next one is due
    /// (`None`: none, every group has a round in flight).
    pub fn plan(&self, groups: &[GroupClock], now: Instant) -> Plan {
        let mut start = Vec::new();
        let mut wake = None::<Instant>;
        for (i, g) in groups.iter().enumerate() {
            match self.due(g, now) {
                Some(d) if d <= now => start.push(i),
                Some(d) => wake = Some(wake.map_or(d, |w| w.min(d))),
                None => {}
            }
        }
        Plan { start, wake }
    }

    /// What a Refresh does about group `g`.
    pub fn on_refresh(&self, g: &GroupClock, now: Instant) -> RefreshStep {
        let age = g.fetched.map(|f| now.saturating_duration_since(f));
        let wait = age.is_none_or(|a| a >= self.wait_after());
        if g.round.is_some() {
            return if wait {
                RefreshStep::Join
            } else {
                RefreshStep::Answer
            };
        }
        if g.failures > 0 {
            // Backing off: the round comes when the backoff ends, whoever asks; until then the
            // answer is the snapshot there is (or the error that there is none).
            let retry = g.last_end.unwrap_or(now) + self.backoff(g.failures, g.jitter);
            if retry > now {
                return RefreshStep::Answer;
            }
        } else if age.is_some_and(|a| a < self.refresh_after()) {
            return RefreshStep::Answer;
        }
        RefreshStep::Start { wait }
    }

    /// How long group `g` has been stuck at `now`, when longer than [`Policy::stall_after`]:
    /// a round asking CloudStack for longer than its requests can take, or a round due and
    /// not started. A round waiting for its turn (the permits, the rate limit) is not stuck:
    /// the turn is bounded by the rounds ahead of it, each of which is.
    pub fn stalled(&self, g: &GroupClock, now: Instant) -> Option<Duration> {
        let since = match g.round {
            Some(RoundState::Asking { since }) => since,
            Some(RoundState::Queued) => return None,
            None => self.due(g, now)?,
        };
        let stuck = now.checked_duration_since(since)?;
        (stuck > self.stall_after).then_some(stuck)
    }
}

/// What the provider knows of one group's refreshes, as observed by the shell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupClock {
    /// When the snapshot served now was asked for; `None`: no snapshot yet.
    pub fetched: Option<Instant>,
    /// When an autoscaler last asked for the group (Refresh).
    pub demanded: Option<Instant>,
    /// Failed rounds in a row (0 after a round that installed a snapshot).
    pub failures: u32,
    /// When the last round ended.
    pub last_end: Option<Instant>,
    /// The round in flight.
    pub round: Option<RoundState>,
    /// This group's draw in `[0, 1)` for the backoff's jitter, drawn again after each failure.
    pub jitter: f64,
}

impl GroupClock {
    /// A group with no snapshot and nothing in flight.
    pub fn new(jitter: f64) -> Self {
        GroupClock {
            fetched: None,
            demanded: None,
            failures: 0,
            last_end: None,
            round: None,
            jitter,
        }
    }
}

/// A round in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundState {
    /// Waiting for its turn to ask CloudStack.
    Queued,
    /// Asking CloudStack since then.
    Asking { since: Instant },
}

/// The rounds to start now, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub start: Vec<usize>,
    pub wake: Option<Instant>,
}

/// What a Refresh does about one of its groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshStep {
    /// Answer from the snapshot there is, starting nothing.
    Answer,
    /// Wait for the round in flight (until the caller's deadline).
    Join,
    /// Start a round; wait for it (until the caller's deadline) only when `wait`.
    Start { wait: bool },
}

/// A draw in `[0, 1)` for group `index`'s `attempt`-th backoff, from the process's `seed`:
/// the domain has no source of randomness, and a hash spreads groups as well as a random
/// number does for this purpose (splitmix64's finaliser).
pub fn jitter(seed: u64, index: usize, attempt: u32) -> f64 {
    let mut z = seed
        ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(attempt).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn unthrottled() -> Policy {
        Policy::new(5 * S, 120 * S, 3, None, 10 * S)
    }

    /// 500 clusters under CloudStack's default throttling (25 calls a second).
    fn throttled() -> Policy {
        Policy::new(5 * S, 120 * S, 500, Some(25.0), 10 * S)
    }

    fn fetched_at(t: Instant) -> GroupClock {
        GroupClock {
            fetched: Some(t),
            ..GroupClock::new(0.5)
        }
    }

    #[test]
    fn the_pace_shares_the_rate_limit_between_the_groups() {
        assert_eq!(unthrottled().pace, Duration::ZERO);
        assert_eq!(unthrottled().refresh_after(), 5 * S);
        assert_eq!(unthrottled().wait_after(), 5 * S);
        let p = throttled();
        assert_eq!(p.pace, 25 * S, "500 groups at 20 rounds a second");
        assert_eq!(p.refresh_after(), 25 * S);
        assert_eq!(p.wait_after(), 50 * S);
    }

    #[test]
    fn a_refresh_waits_only_for_a_snapshot_staler_than_the_pace_allows() {
        let t0 = Instant::now();
        let p = unthrottled();
        let g = fetched_at(t0);
        assert_eq!(p.on_refresh(&g, t0 + 4 * S), RefreshStep::Answer);
        assert_eq!(
            p.on_refresh(&g, t0 + 6 * S),
            RefreshStep::Start { wait: true },
            "without a rate limit a round is one call: the caller waits for it"
        );
        let t = throttled();
        assert_eq!(t.on_refresh(&g, t0 + 20 * S), RefreshStep::Answer);
        assert_eq!(
            t.on_refresh(&g, t0 + 30 * S),
            RefreshStep::Start { wait: false },
            "as fresh as the pace allows: answered at once, read in the background"
        );
        assert_eq!(
            t.on_refresh(&g, t0 + 51 * S),
            RefreshStep::Start { wait: true }
        );
        let none = GroupClock::new(0.5);
        assert_eq!(t.on_refresh(&none, t0), RefreshStep::Start { wait: true });
        let joining = GroupClock {
            round: Some(RoundState::Queued),
            ..g
        };
        assert_eq!(t.on_refresh(&joining, t0 + 30 * S), RefreshStep::Answer);
        assert_eq!(t.on_refresh(&joining, t0 + 60 * S), RefreshStep::Join);
    }

    #[test]
    fn a_failing_group_is_tried_once_per_backoff_step_whoever_asks() {
        let t0 = Instant::now();
        let p = unthrottled();
        let g = GroupClock {
            failures: 3,
            last_end: Some(t0),
            jitter: 0.0,
            ..fetched_at(t0 - 200 * S)
        };
        // Third failure: a 4 s step, equal jitter at 0 gives its half.
        assert_eq!(p.due(&g, t0), Some(t0 + 2 * S));
        assert_eq!(p.on_refresh(&g, t0 + S), RefreshStep::Answer);
        assert_eq!(
            p.on_refresh(&g, t0 + 2 * S),
            RefreshStep::Start { wait: true }
        );
        assert_eq!(p.plan(&[g], t0 + S).start, Vec::<usize>::new());
        assert_eq!(p.plan(&[g], t0 + S).wake, Some(t0 + 2 * S));
        assert_eq!(p.plan(&[g], t0 + 2 * S).start, vec![0]);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_jitter_spreads_it() {
        let p = unthrottled();
        assert_eq!(p.backoff_cap(), 15 * S);
        assert_eq!(p.backoff(1, 0.0), S / 2);
        assert_eq!(p.backoff(1, 0.999_999), S.mul_f64(0.999_999_5));
        assert_eq!(p.backoff(2, 0.0), S);
        assert_eq!(p.backoff(40, 0.0), 15 * S / 2);
        assert_eq!(p.backoff(40, 1.0), 15 * S);
        assert_eq!(p.backoff(40, f64::NAN), 15 * S / 2);
        // A short staleness bound keeps the cap short: the snapshot comes back well inside it.
        let short = Policy::new(5 * S, 10 * S, 1, None, 10 * S);
        assert_eq!(short.backoff_cap(), 5 * S);
        // A rate limit's pace is a floor: retrying a group faster than it is read gains nothing.
        assert_eq!(throttled().backoff_cap(), 25 * S);
        let slow = Policy::new(5 * S, 120 * S, 2000, Some(25.0), 10 * S);
        assert_eq!(slow.backoff_cap(), 60 * S);
        // Draws differ between groups and attempts, and stay in [0, 1).
        let draws: Vec<f64> = (0..100).map(|i| jitter(7, i, 1)).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let spread = draws.iter().cloned().fold(f64::MAX, f64::min)
            ..draws.iter().cloned().fold(f64::MIN, f64::max);
        assert!(spread.start < 0.1 && spread.end > 0.9, "{spread:?}");
        assert_ne!(jitter(7, 3, 1), jitter(7, 3, 2));
    }

    #[test]
    fn the_provider_refreshes_on_its_own_before_the_bound_and_at_the_pace() {
        let t0 = Instant::now();
        let p = unthrottled();
        let idle = fetched_at(t0);
        assert_eq!(p.due(&idle, t0), Some(t0 + 90 * S), "3/4 of the bound");
        let asked = GroupClock {
            demanded: Some(t0),
            ..idle
        };
        assert_eq!(
            p.due(&asked, t0),
            Some(t0 + 90 * S),
            "without a rate limit the autoscaler's Refresh keeps it fresh"
        );
        let t = throttled();
        assert_eq!(t.due(&asked, t0 + S), Some(t0 + 25 * S), "kept at the pace");
        assert_eq!(
            t.due(&asked, t0 + 200 * S),
            Some(t0 + 90 * S),
            "nobody asked for a staleness bound: kept only within the bound"
        );
        assert_eq!(p.due(&GroupClock::new(0.1), t0), Some(t0));
        let flying = GroupClock {
            round: Some(RoundState::Queued),
            ..asked
        };
        assert_eq!(p.due(&flying, t0 + 500 * S), None);
        let plan = p.plan(&[idle, flying, GroupClock::new(0.1)], t0 + S);
        assert_eq!(plan.start, vec![2]);
        assert_eq!(plan.wake, Some(t0 + 90 * S));
    }

    #[test]
    fn stuck_is_a_round_asking_past_its_requests_or_a_due_round_never_started() {
        let t0 = Instant::now();
        let p = unthrottled();
        assert_eq!(
            p.stall_after,
            240 * S,
            "12 timeouts and the bound, or twice the bound"
        );
        let asking = GroupClock {
            round: Some(RoundState::Asking { since: t0 }),
            ..fetched_at(t0)
        };
        assert_eq!(p.stalled(&asking, t0 + 240 * S), None);
        assert_eq!(p.stalled(&asking, t0 + 241 * S), Some(241 * S));
        let queued = GroupClock {
            round: Some(RoundState::Queued),
            ..asking
        };
        assert_eq!(p.stalled(&queued, t0 + 1000 * S), None);
        let never = fetched_at(t0);
        assert_eq!(p.stalled(&never, t0 + 90 * S + 240 * S), None);
        assert!(p.stalled(&never, t0 + 90 * S + 241 * S).is_some());
    }
}
