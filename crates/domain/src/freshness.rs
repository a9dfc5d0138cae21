//! Whether a cluster snapshot may still be answered from: the staleness bound as Refresh, the
//! scale RPCs' snapshot and the health check apply it. The shell measures ages on its clock
//! and reports what CloudStack did; these functions decide.

use std::time::Duration;

/// What asking CloudStack for the cluster gave, as a scale RPC sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetch {
    /// A new snapshot.
    Fetched,
    /// An error that says nothing about the cluster (unreachable, 5xx, throttled).
    Transient,
    /// Any other error (refused, garbage, the cluster gone): a cached snapshot would hide it.
    Failed,
    /// No answer before the request's deadline.
    TimedOut,
}

/// The snapshot a scale RPC decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotChoice {
    Fetched,
    /// The cached one: CloudStack did not answer, and the cache is within the bound.
    Cached,
    /// Neither: the RPC fails with the fetch's error (or the deadline).
    Fail,
}

/// Whether a snapshot `age` old (none yet: `None`) is within the staleness `bound`.
pub fn within(age: Option<Duration>, bound: Duration) -> bool {
    age.is_some_and(|a| a < bound)
}

/// The snapshot a scale RPC uses: the fetched one; else the cached one when CloudStack did not
/// answer (a transient error or the deadline) and it is within the bound.
pub fn choose_snapshot(
    fetch: Fetch,
    cached_age: Option<Duration>,
    bound: Duration,
) -> SnapshotChoice {
    match fetch {
        Fetch::Fetched => SnapshotChoice::Fetched,
        Fetch::Transient | Fetch::TimedOut if within(cached_age, bound) => SnapshotChoice::Cached,
        Fetch::Transient | Fetch::TimedOut | Fetch::Failed => SnapshotChoice::Fail,
    }
}

/// Of groups whose snapshots are `ages` old, the indexes of those Refresh reports stale (its
/// answer is OK when there are none): no snapshot yet, or one past the bound. A Refresh that
/// stopped waiting at its deadline answers from the snapshots too: CloudStack being slower than
/// the autoscaler's deadline fails nothing while the snapshots are within the bound.
pub fn stale_for_refresh(ages: &[Option<Duration>], bound: Duration) -> Vec<usize> {
    ages.iter()
        .enumerate()
        .filter(|(_, a)| !within(**a, bound))
        .map(|(i, _)| i)
        .collect()
}

/// Whether the health check reports a group stale: its snapshot is past the bound and no newer
/// one can come (the last attempt `failing`, or an autoscaler `asked_since` the snapshot was
/// taken and none came). A group with no snapshot yet is not stale, only not ready.
pub fn stale_for_health(
    age: Option<Duration>,
    bound: Duration,
    failing: bool,
    asked_since: bool,
) -> bool {
    match age {
        None => false,
        Some(a) if a < bound => false,
        Some(_) => failing || asked_since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(60);

    fn s(secs: u64) -> Option<Duration> {
        Some(Duration::from_secs(secs))
    }

    #[test]
    fn a_scale_rpc_falls_back_to_the_cache_only_when_cloudstack_did_not_answer() {
        use Fetch::*;
        use SnapshotChoice as C;
        let table = [
            (Fetched, None, C::Fetched),
            (Fetched, s(600), C::Fetched),
            (Transient, s(10), C::Cached),
            (TimedOut, s(59), C::Cached),
            (Transient, s(60), C::Fail),
            (TimedOut, None, C::Fail),
            (Failed, s(1), C::Fail),
            (Failed, None, C::Fail),
        ];
        for (fetch, age, want) in table {
            assert_eq!(
                choose_snapshot(fetch, age, BOUND),
                want,
                "{fetch:?} {age:?}"
            );
        }
    }

    #[test]
    fn refresh_names_every_group_without_a_snapshot_within_the_bound() {
        assert!(stale_for_refresh(&[s(0), s(59)], BOUND).is_empty());
        assert_eq!(stale_for_refresh(&[s(0), None, s(60), s(3)], BOUND), [1, 2]);
        assert!(stale_for_refresh(&[], BOUND).is_empty());
    }

    #[test]
    fn health_reports_stale_only_past_the_bound_with_no_newer_snapshot_coming() {
        let table = [
            (None, true, true, false),
            (s(59), true, true, false),
            (s(60), false, false, false),
            (s(60), true, false, true),
            (s(61), false, true, true),
        ];
        for (age, failing, asked, want) in table {
            assert_eq!(
                stale_for_health(age, BOUND, failing, asked),
                want,
                "{age:?} failing={failing} asked={asked}"
            );
        }
    }
}
