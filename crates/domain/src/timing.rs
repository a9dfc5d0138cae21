//! The provider's waits and retries that belong to no one machine: how long the shell waits
//! before it tries something again, each with the reason for its length. The shell sleeps
//! for these; it chooses none of them.

use std::time::{Duration, Instant};

/// Time kept back from a caller's deadline for the answer to travel back.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(300);

/// When a caller with `deadline` must be answered: [`DEADLINE_MARGIN`] before it, never
/// before `now`.
pub fn answer_by(deadline: Instant, now: Instant) -> Instant {
    deadline
        .checked_sub(DEADLINE_MARGIN)
        .unwrap_or(now)
        .max(now)
}

/// How long the check that a caller's promise can be recorded (a write of the store, just
/// before its request is sent) may take: half the time left to answer, since the request
/// needs the rest. A store that takes longer is as good as down for this caller: it hears
/// so, and nothing is sent.
pub fn store_check_by(deadline: Instant, now: Instant) -> Instant {
    now + answer_by(deadline, now).saturating_duration_since(now) / 2
}

/// How long before a caller must be answered the store is left to record what it is
/// promised at its deadline: a write of the ConfigMap takes tens of milliseconds, and a second
/// leaves room for a conflict read again and a second write.
pub const RECORD_ALLOWANCE: Duration = Duration::from_secs(1);

/// When a DeleteNodes caller still waiting for its window's request is promised its removals
/// instead (an OK it will hear whatever becomes of the request): [`RECORD_ALLOWANCE`] before
/// it must be answered, or half the time left when that is shorter, so the promise can be
/// recorded before the OK.
pub fn promise_by(deadline: Instant, now: Instant) -> Instant {
    let by = answer_by(deadline, now);
    let left = by.saturating_duration_since(now);
    by - RECORD_ALLOWANCE.min(left / 2)
}

/// Until when a scale RPC watches the job it just started for CloudStack's refusal, which
/// arrives as the job's failure within moments (`--scale-watch`), and never past when its
/// caller must be answered.
pub fn watch_until(scale_watch: Duration, deadline: Instant, now: Instant) -> Instant {
    (now + scale_watch).min(answer_by(deadline, now))
}

/// How long after a submission whose answer was lost a cluster not in Scaling means the
/// request never became a job: a request given up on may still be on its way to CloudStack
/// (or queued there), so the longest a request may take (`request_timeout`) plus a moment for
/// the job to start (a poll interval, at least a second).
pub fn lost_settle(request_timeout: Duration, poll: Duration) -> Duration {
    request_timeout + poll.max(Duration::from_secs(1))
}

/// How long queued work waits after CloudStack throttled its request: its window is a second
/// by default and the client already waited within its request timeout, so the account is
/// over its limit for longer than that; ten seconds lets the other calls through.
pub const THROTTLED_RETRY: Duration = Duration::from_secs(10);

/// How long a scale RPC's watch of its new job waits before its `looks`-th look (from 0):
/// CloudStack's validation usually takes a moment, so the first look is soon (50 ms), then
/// every 100 ms until the watch's end.
pub fn watch_step(looks: u32) -> Duration {
    if looks == 0 {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(100)
    }
}

/// How long after a failed read of an offering it is read again: the template node it serves
/// is only needed to scale from zero, and the offering rarely changes.
pub const OFFERING_RETRY: Duration = Duration::from_secs(60);

/// How long a failed write of the durable store waits before it is tried again after
/// `failures` failures: 250 ms, doubling, at most 5 s (an OK waits for the write, so the
/// first tries come soon; a store down for minutes is not hammered).
pub fn store_retry(failures: u32) -> Duration {
    let min = Duration::from_millis(250);
    (min * 2u32.saturating_pow(failures.saturating_sub(1).min(5))).min(Duration::from_secs(5))
}

/// How long the read of the cluster after a job's end waits before its next try, after
/// `failures` failed tries: a poll interval more each time, three tries in all (`None`: no
/// more; the next refresh reads it). The job's outcome is judged on that read, so it is worth a
/// few seconds, not a retry loop of its own.
pub fn post_job_read_wait(failures: u32, poll: Duration) -> Option<Duration> {
    (failures < 3).then(|| poll * failures)
}

/// How long the last write of the store at shutdown is tried before the process ends
/// without it (within the pod's termination grace period).
pub const FINAL_WRITE_BOUND: Duration = Duration::from_secs(10);

/// How often the shutdown grace looks whether a scale job still runs.
pub const IDLE_CHECK: Duration = Duration::from_millis(100);

/// The longest the keeper sleeps between two looks at the groups: a refresh interval, at
/// least a second (an autoscaler that starts asking shortens a group's keep age).
pub fn keeper_look_again(min_interval: Duration) -> Duration {
    min_interval.max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_is_answered_a_margin_before_its_deadline_and_never_in_the_past() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(answer_by(t + ms(5000), t), t + ms(4700));
        assert_eq!(answer_by(t + ms(100), t), t);
        // Half the time left checks the store; the request has the rest.
        assert_eq!(store_check_by(t + ms(5000), t), t + ms(2350));
        assert_eq!(store_check_by(t + ms(100), t), t);
        // The watch ends at `--scale-watch`, or when the caller must be answered.
        assert_eq!(watch_until(ms(1500), t + ms(5000), t), t + ms(1500));
        assert_eq!(watch_until(ms(1500), t + ms(1000), t), t + ms(700));
    }

    #[test]
    fn store_retries_double_from_a_quarter_second_to_five() {
        let ms = Duration::from_millis;
        let got: Vec<Duration> = (1..=7).map(store_retry).collect();
        assert_eq!(
            got,
            [
                ms(250),
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(5000),
                ms(5000)
            ]
        );
        assert_eq!(store_retry(u32::MAX), ms(5000));
    }

    #[test]
    fn the_cluster_is_read_three_times_after_a_job_at_most() {
        let s = Duration::from_secs;
        let waits: Vec<_> = (1..=4).map(|f| post_job_read_wait(f, s(2))).collect();
        assert_eq!(waits, [Some(s(2)), Some(s(4)), None, None]);
    }

    #[test]
    fn a_lost_answer_settles_after_the_longest_request_and_a_poll() {
        let s = Duration::from_secs;
        assert_eq!(lost_settle(s(30), s(2)), s(32));
        assert_eq!(lost_settle(s(30), Duration::from_millis(20)), s(31));
    }
}
