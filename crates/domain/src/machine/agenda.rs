//! The group's loop's agenda: what the loop is to do next for the machine it serves, and when
//! to wake for it. The machine says what it waits for (its job, the cluster's state, VMs to
//! stop); the agenda keeps the times of the looks at them and the counts they depend on (polls
//! that got no answer, the overdue warning said once, the stop jobs followed), so the loop
//! only carries out what [`Agenda::next`] returns and reports how it went.
//!
//! Kept apart from the machine on purpose: its bookkeeping changes at every poll, and a change
//! of the machine publishes a new read view (and drops the answers derived from it), which a
//! poll that saw nothing new must not cost.

use super::ScaleMachine;
use std::time::{Duration, Instant};

/// What the loop is to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Take the VMs the machine wants stopped ([`ScaleMachine::take_stops`]), send each its
    /// `stopVirtualMachine` and report the jobs ([`Agenda::stop_sent`]).
    StopVms,
    /// Poll the followed scale job and report it ([`Agenda::job_polled`]) while it runs. At its
    /// end, tell the machine how long it ran at least (`seen_running`: when a poll last saw
    /// it running, [`super::Event::JobRan`]); the agenda drops it once the machine no longer
    /// waits for it.
    PollJob {
        job: String,
        seen_running: Option<Instant>,
    },
    /// Poll a VM's stop job and report it ([`Agenda::stop_polled`]).
    PollStop { vm: String, job: String },
    /// Read the cluster: the machine waits on its state, which no job id can tell.
    ReadState,
}

/// The agenda's answer to "what now?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Do(Due),
    /// Nothing is due: sleep until then (`None`: until woken).
    Sleep(Option<Instant>),
}

/// What a poll of the followed job said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobPoll {
    /// CloudStack did not answer (or answered garbage).
    NoAnswer,
    /// The job still runs.
    Running,
}

#[derive(Debug, Clone)]
struct Follow {
    job: String,
    /// Polls in a row that got no answer: the machine's pace backs off after them.
    failures: u32,
    /// The job runs past `--job-max-follow`, said once.
    overdue: bool,
    next: Instant,
    /// When a poll last saw it running: how long it ran at least, which the machine learns
    /// from at its end ([`ScaleMachine::job_pending`]).
    seen_running: Option<Instant>,
}

#[derive(Debug, Clone)]
struct StopJob {
    vm: String,
    job: String,
    next: Instant,
    /// Not followed past this (`--job-max-follow`): the next snapshot tells what became of
    /// the VM.
    until: Instant,
}

/// One group's loop's agenda. See the module's doc.
#[derive(Debug, Clone)]
pub struct Agenda {
    poll: Duration,
    max_follow: Duration,
    follow: Option<Follow>,
    /// When the cluster's state is read next, while the machine follows it.
    state_read: Option<Instant>,
    stops: Vec<StopJob>,
}

impl Agenda {
    /// `poll`: `--job-poll-interval`; `max_follow`: `--job-max-follow`.
    pub fn new(poll: Duration, max_follow: Duration) -> Self {
        Agenda {
            poll,
            max_follow,
            follow: None,
            state_read: None,
            stops: Vec::new(),
        }
    }

    /// What to do now for `m`, or when to look again. First brings the agenda in line with
    /// what the machine waits for: a new job is followed from the machine's pace
    /// ([`ScaleMachine::next_job_poll`]), a job the machine no longer waits for is dropped,
    /// and the cluster's state is read every poll interval while the machine follows it.
    /// VMs to stop come first (each waits on its stop before its removal), then the job,
    /// then the stop jobs, then the state.
    pub fn next(&mut self, m: &ScaleMachine, now: Instant) -> Next {
        let stop_at = m.next_stop_at(now);
        if stop_at.is_some_and(|at| at <= now) {
            return Next::Do(Due::StopVms);
        }
        match (m.phase().job(), &self.follow) {
            (Some(j), Some(f)) if f.job == j => {}
            (Some(j), _) => {
                self.follow = Some(Follow {
                    job: j.to_string(),
                    failures: 0,
                    overdue: false,
                    next: now + m.next_job_poll(j, now, self.poll, 0, self.max_follow),
                    seen_running: None,
                });
            }
            (None, _) => self.follow = None,
        }
        let state_at = if m.follows_state() {
            Some(*self.state_read.get_or_insert(now + self.poll))
        } else {
            self.state_read = None;
            None
        };
        if let Some(f) = self.follow.as_ref().filter(|f| f.next <= now) {
            return Next::Do(Due::PollJob {
                job: f.job.clone(),
                seen_running: f.seen_running,
            });
        }
        if let Some(s) = self.stops.iter().find(|s| s.next <= now) {
            return Next::Do(Due::PollStop {
                vm: s.vm.clone(),
                job: s.job.clone(),
            });
        }
        if state_at.is_some_and(|at| at <= now) {
            self.state_read = Some(now + self.poll);
            return Next::Do(Due::ReadState);
        }
        let wake = [self.follow.as_ref().map(|f| f.next), state_at, stop_at]
            .into_iter()
            .chain(self.stops.iter().map(|s| Some(s.next)))
            .flatten()
            .min();
        Next::Sleep(wake)
    }

    /// Poll the followed job now, not when it was due: a snapshot suggests it is over, or
    /// CloudStack answers again after polls that failed.
    pub fn poll_now(&mut self, now: Instant) {
        if let Some(f) = self.follow.as_mut() {
            f.next = now;
        }
    }

    /// A poll of `job` got no answer or saw it running: its next poll is the machine's pace
    /// from here. Returns, once per job, how long the next poll waits when the job runs past
    /// the follow limit (polled only every few intervals from then on), for the operator.
    pub fn job_polled(
        &mut self,
        m: &ScaleMachine,
        job: &str,
        poll: JobPoll,
        now: Instant,
    ) -> Option<Duration> {
        let f = self.follow.as_mut().filter(|f| f.job == job)?;
        match poll {
            JobPoll::NoAnswer => f.failures += 1,
            JobPoll::Running => {
                f.failures = 0;
                f.seen_running = Some(now);
            }
        }
        let wait = m.next_job_poll(job, now, self.poll, f.failures, self.max_follow);
        f.next = now + wait;
        if poll == JobPoll::Running && wait > self.poll && !f.overdue {
            f.overdue = true;
            return Some(wait);
        }
        None
    }

    /// `stopVirtualMachine` of `vm` was accepted as `job`: polled every poll interval until it
    /// ends or the follow limit passes.
    pub fn stop_sent(&mut self, vm: String, job: String, now: Instant) {
        self.stops.push(StopJob {
            vm,
            job,
            next: now + self.poll,
            until: now + self.max_follow,
        });
    }

    /// A poll of stop job `job`: `ended` when it ended (how is the machine's to hear). One
    /// that still runs is polled again, unless it is past the follow limit: then it is
    /// dropped, and the next snapshot tells what became of the VM.
    pub fn stop_polled(&mut self, job: &str, ended: bool, now: Instant) {
        let Some(i) = self.stops.iter().position(|s| s.job == job) else {
            return;
        };
        if ended || now >= self.stops[i].until {
            self.stops.swap_remove(i);
        } else {
            self.stops[i].next = now + self.poll;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::running3;
    use super::super::{Op, OpKind, Origin, Phase, QueuedRemoval, Timings};
    use super::*;
    use crate::rules::AlertScaling;

    const POLL: Duration = Duration::from_secs(2);
    const MAX: Duration = Duration::from_secs(60);

    fn machine(t: Instant) -> ScaleMachine {
        let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
        m.snapshot_installed(running3(t), &AlertScaling::Supported, t);
        m
    }

    fn running(m: &mut ScaleMachine, job: &str, t: Instant) {
        m.phase = Phase::Running {
            op: Op {
                kind: OpKind::Remove {
                    from: 3,
                    vm_ids: vec!["w1".into()],
                    names: vec!["w1".into()],
                    sent: Vec::new(),
                },
                origin: Origin::Rpc,
            },
            job: job.into(),
            since: t,
        };
    }

    #[test]
    fn an_idle_machine_asks_for_nothing() {
        let t = Instant::now();
        let mut a = Agenda::new(POLL, MAX);
        assert_eq!(a.next(&machine(t), t), Next::Sleep(None));
    }

    #[test]
    fn a_job_is_polled_at_the_machines_pace_and_backs_off_without_answers() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let mut m = machine(t);
        running(&mut m, "j1", t);
        let mut a = Agenda::new(POLL, MAX);
        assert_eq!(a.next(&m, t), Next::Sleep(Some(t + POLL)));
        // Looking again before it is due changes nothing: the time is kept, not moved.
        assert_eq!(a.next(&m, t + s(1)), Next::Sleep(Some(t + POLL)));
        let poll_j1 = |seen_running| {
            Next::Do(Due::PollJob {
                job: "j1".into(),
                seen_running,
            })
        };
        assert_eq!(a.next(&m, t + POLL), poll_j1(None));
        assert_eq!(a.job_polled(&m, "j1", JobPoll::NoAnswer, t + POLL), None);
        assert_eq!(a.next(&m, t + POLL), Next::Sleep(Some(t + POLL + s(4))));
        assert_eq!(a.job_polled(&m, "j1", JobPoll::NoAnswer, t + s(6)), None);
        assert_eq!(a.next(&m, t + s(6)), Next::Sleep(Some(t + s(6) + s(8))));
        // An answer resets the backoff.
        assert_eq!(a.job_polled(&m, "j1", JobPoll::Running, t + s(14)), None);
        assert_eq!(a.next(&m, t + s(14)), Next::Sleep(Some(t + s(16))));
        // Asked to poll now: due at once, with when it was last seen running (for the
        // machine at its end); once the machine no longer waits for it, it is not followed.
        a.poll_now(t + s(15));
        assert_eq!(a.next(&m, t + s(15)), poll_j1(Some(t + s(14))));
        m.phase = Phase::Idle;
        assert_eq!(a.next(&m, t + s(15)), Next::Sleep(None));
    }

    #[test]
    fn a_job_past_the_follow_limit_is_said_once() {
        let t = Instant::now();
        let mut m = machine(t);
        running(&mut m, "j1", t);
        let mut a = Agenda::new(POLL, MAX);
        a.next(&m, t);
        let late = t + MAX + POLL;
        let said = a.job_polled(&m, "j1", JobPoll::Running, late);
        assert!(said.is_some_and(|w| w > POLL), "{said:?}");
        assert_eq!(a.job_polled(&m, "j1", JobPoll::Running, late + POLL), None);
    }

    #[test]
    fn a_new_job_replaces_the_followed_one_and_idle_drops_it() {
        let t = Instant::now();
        let mut m = machine(t);
        running(&mut m, "j1", t);
        let mut a = Agenda::new(POLL, MAX);
        a.next(&m, t);
        a.job_polled(&m, "j1", JobPoll::NoAnswer, t);
        running(&mut m, "j2", t + POLL);
        // j2 starts from the regular pace, not j1's backoff; a report about j1 is ignored.
        assert_eq!(a.next(&m, t + POLL), Next::Sleep(Some(t + 2 * POLL)));
        assert_eq!(a.job_polled(&m, "j1", JobPoll::Running, t + POLL), None);
        assert_eq!(
            a.next(&m, t + 2 * POLL),
            Next::Do(Due::PollJob {
                job: "j2".into(),
                seen_running: None
            })
        );
        m.phase = Phase::Idle;
        assert_eq!(a.next(&m, t + 2 * POLL), Next::Sleep(None));
    }

    #[test]
    fn a_state_the_machine_follows_is_read_every_poll_interval() {
        let t = Instant::now();
        let mut m = machine(t);
        m.phase = Phase::Adopted {
            job: None,
            since: t,
        };
        let mut a = Agenda::new(POLL, MAX);
        assert_eq!(a.next(&m, t), Next::Sleep(Some(t + POLL)));
        assert_eq!(a.next(&m, t + POLL), Next::Do(Due::ReadState));
        assert_eq!(a.next(&m, t + POLL), Next::Sleep(Some(t + 2 * POLL)));
        // Settled: no more reads, and a later follow starts a full interval out.
        m.phase = Phase::Idle;
        assert_eq!(a.next(&m, t + 2 * POLL), Next::Sleep(None));
        m.phase = Phase::Adopted {
            job: None,
            since: t,
        };
        assert_eq!(a.next(&m, t + 5 * POLL), Next::Sleep(Some(t + 6 * POLL)));
    }

    #[test]
    fn stops_come_first_and_their_jobs_are_followed_until_the_limit() {
        let t = Instant::now();
        let mut m = machine(t);
        let mut r = QueuedRemoval::new("w1".into(), "w1".into(), t, false);
        r.stop = crate::removal::StopStage::Wanted;
        m.queue.remove.push(r);
        let mut a = Agenda::new(POLL, MAX);
        assert_eq!(a.next(&m, t), Next::Do(Due::StopVms));
        assert_eq!(m.take_stops(t), vec!["w1".to_string()]);
        a.stop_sent("w1".into(), "s1".into(), t);
        assert_eq!(a.next(&m, t), Next::Sleep(Some(t + POLL)));
        let poll_stop = Next::Do(Due::PollStop {
            vm: "w1".into(),
            job: "s1".into(),
        });
        assert_eq!(a.next(&m, t + POLL), poll_stop);
        a.stop_polled("s1", false, t + POLL);
        assert_eq!(a.next(&m, t + POLL), Next::Sleep(Some(t + 2 * POLL)));
        // Past the limit a running stop job is dropped.
        a.stop_polled("s1", false, t + MAX);
        assert_eq!(a.next(&m, t + MAX), Next::Sleep(None));
    }
}
