//! How fast the client sends: its own rate limit ([`crate::ClientConfig::max_rps`]) and what
//! it does when CloudStack's API throttling refuses a request anyway ([`Backoff`]: wait, then
//! send again). Both on tokio's clock, so tests on paused time drive them.
//!
//! CloudStack counts an account's calls in fixed windows (`api.throttling.max` per
//! `api.throttling.interval`, `ApiRateLimitServiceImpl`) and refuses the ones past the limit
//! with a 429 before the command runs (`ApiServer.verifyRequest`): a throttled request did
//! nothing, whatever the command, so sending it again is safe.

use std::time::Duration;
use tokio::time::Instant;

/// Requests at least `1 / max_rps` apart, in the order callers asked for their turn.
///
/// No burst: CloudStack counts in fixed windows, and a burst after a quiet spell would spend
/// a window's allowance at once, on top of the calls at the end of the previous window.
#[derive(Debug)]
pub(crate) struct RateLimit {
    spacing: Duration,
    /// When the next request may go (`None`: at once). A tokio mutex, held by a caller while
    /// it waits for its turn: tokio's mutex hands itself over in the order callers asked
    /// (FIFO), so callers go in that order and none starves (a cluster with many calls cannot
    /// overtake another's call queued before them), and a caller that gives up while waiting
    /// (its future dropped) leaves its place to the next one, so no turn is lost.
    next: tokio::sync::Mutex<Option<Instant>>,
}

impl RateLimit {
    /// A limit of `max_rps` requests per second; `Err` unless it is a positive, finite
    /// number (at least one request a day).
    pub(crate) fn new(max_rps: f64) -> Result<Self, String> {
        const DAY: f64 = 86_400.0;
        if !(max_rps.is_finite() && max_rps * DAY >= 1.0) {
            return Err(format!(
                "max_rps must be a positive number of requests per second (at least one a \
                 day), got {max_rps}"
            ));
        }
        let spacing = Duration::try_from_secs_f64(1.0 / max_rps)
            .map_err(|e| format!("max_rps {max_rps}: {e}"))?;
        Ok(RateLimit {
            spacing,
            next: tokio::sync::Mutex::new(None),
        })
    }

    /// Waits for this caller's turn to send one request.
    pub(crate) async fn turn(&self) {
        let mut next = self.next.lock().await;
        if let Some(at) = *next {
            tokio::time::sleep_until(at).await;
        }
        *next = Some(Instant::now() + self.spacing);
    }
}

/// First wait after a throttled answer; each further one doubles, up to [`MAX_DELAY`].
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(250);

/// Longest wait between two tries of a throttled request.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(4);

/// Added to what CloudStack says is left of its window: a call at the window's last
/// millisecond still counts in it (`StoreEntryImpl.isExpired` is `now > expiry`).
pub(crate) const HINT_MARGIN: Duration = Duration::from_millis(10);

/// The waits of one request that CloudStack throttles: growing, at least what CloudStack
/// says is left of its window, and all within the request timeout, counted from the first
/// send (a caller waits no longer for a throttled request than for an unanswered one). Once
/// the grown wait no longer fits, the request is tried as each of CloudStack's windows ends
/// (one try per window) while that is in time.
#[derive(Debug)]
pub(crate) struct Backoff {
    deadline: Instant,
    next: Duration,
}

impl Backoff {
    /// Starts counting `timeout` now (the first send).
    pub(crate) fn new(timeout: Duration) -> Self {
        Backoff {
            deadline: Instant::now() + timeout,
            next: FIRST_DELAY,
        }
    }

    /// The time left before the deadline, `None` once it has passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// The wait before sending again after a throttled answer that named `hint` as what is
    /// left of CloudStack's window, or `None` when the next try would start at or past the
    /// deadline (the throttled answer then stands).
    pub(crate) fn delay(&mut self, hint: Option<Duration>) -> Option<Duration> {
        let window_end = hint.map(|h| h + HINT_MARGIN);
        let grown = self.next.max(window_end.unwrap_or_default());
        self.next = (self.next * 2).min(MAX_DELAY);
        let fits = |d: Duration| Instant::now() + d < self.deadline;
        [Some(grown), window_end]
            .into_iter()
            .flatten()
            .find(|d| fits(*d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_finite_rates_are_limits() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-9] {
            assert!(RateLimit::new(bad).is_err(), "{bad}");
        }
        assert_eq!(
            RateLimit::new(4.0).unwrap().spacing,
            Duration::from_millis(250)
        );
        assert_eq!(RateLimit::new(0.5).unwrap().spacing, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn waits_grow_honour_the_hint_and_stop_at_the_deadline() {
        let mut b = Backoff::new(Duration::from_secs(10));
        assert_eq!(b.delay(None), Some(FIRST_DELAY));
        assert_eq!(b.delay(None), Some(Duration::from_millis(500)));
        // CloudStack's window ends later than the backoff: its word wins.
        assert_eq!(
            b.delay(Some(Duration::from_millis(1500))),
            Some(Duration::from_millis(1500) + HINT_MARGIN)
        );
        // A shorter one does not shorten the backoff.
        assert_eq!(
            b.delay(Some(Duration::from_millis(100))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(b.delay(None), Some(MAX_DELAY));
        assert_eq!(b.delay(None), Some(MAX_DELAY));
        tokio::time::sleep(Duration::from_secs(7)).await;
        // 3 s left: a 4 s wait would end past the deadline, and so would CloudStack's window.
        assert_eq!(b.remaining(), Some(Duration::from_secs(3)));
        assert_eq!(b.delay(None), None);
        assert_eq!(b.delay(Some(Duration::from_secs(60))), None);
        // A window that ends in time: a try as it ends.
        assert_eq!(
            b.delay(Some(Duration::from_millis(700))),
            Some(Duration::from_millis(700) + HINT_MARGIN)
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(b.remaining(), None);
    }
}
