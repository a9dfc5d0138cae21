//! When to look at a followed job again. CloudStack says nothing of a job until it is asked,
//! and the next request of a cluster waits for the job before it to be seen ending: a job seen
//! one poll interval late delays every removal queued behind it by that much. The machine
//! learns how long this cluster's jobs of each shape take (a removal of n VMs, a scale-up by
//! n) and, from when the next such job is due, polls it often for a short while; otherwise
//! every `--job-poll-interval`.

use super::events::{JobEnd, poll_delay};
use super::{OpKind, Phase, ScaleMachine};
use crate::cluster::ClusterState;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A job's shape, for how long it takes: CloudStack removes VMs one after another and creates
/// them in parallel, so the count is what changes the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Shape {
    Remove(usize),
    Increase(u32),
}

impl Shape {
    fn of(kind: &OpKind) -> Self {
        match kind {
            OpKind::Remove { vm_ids, .. } => Shape::Remove(vm_ids.len()),
            OpKind::Increase { from, to, .. } => Shape::Increase(to.saturating_sub(*from)),
        }
    }
}

/// What the machine knows of its jobs' lengths.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobPace {
    /// The last successful job of each shape: how long it ran at least (from its request to
    /// the last poll that saw it running).
    learned: HashMap<Shape, Duration>,
    /// The followed job and when a poll last saw it running.
    pending: Option<(String, Instant)>,
}

/// How often a job is polled around the time it is due: an eighth of the poll interval (a
/// job is then seen at most that late), not under 50 ms.
fn fine(poll: Duration) -> Duration {
    (poll / 8).max(Duration::from_millis(50)).min(poll)
}

/// What a scale RPC's look at the job it just started says, while its caller waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// Not past CloudStack's validation yet: look again (`timing::watch_step`).
    LookAgain,
    /// Past validation: the job ended well, or the cluster shows Scaling (the job moves it
    /// there once its checks passed). The caller hears OK; the group's loop follows the job.
    PastValidation,
    /// The job ended without doing the work: CloudStack's refusal (or failure), which the
    /// caller hears as the machine settles it (`Settled::watched_answer`).
    Ended(JobEnd),
}

impl ScaleMachine {
    /// A scale RPC's look at its new job: `end` is what the poll said (`None`: still
    /// running). CloudStack validates a scale request inside its job
    /// (`KubernetesClusterScaleWorker` checks the cluster's state and sizes before it moves
    /// the cluster to Scaling), so its refusals arrive as the job's failure within moments,
    /// and the cluster listed Scaling, in the snapshot this machine holds, means the checks
    /// passed.
    pub fn watched(&self, end: Option<&JobEnd>) -> Watched {
        match end {
            Some(JobEnd::Succeeded) => Watched::PastValidation,
            Some(end) => Watched::Ended(end.clone()),
            None if self
                .snap
                .as_ref()
                .is_some_and(|s| s.snap.state == ClusterState::Scaling) =>
            {
                Watched::PastValidation
            }
            None => Watched::LookAgain,
        }
    }

    /// A poll saw the followed job still running.
    pub(crate) fn job_pending(&mut self, job: &str, at: Instant) {
        if self.phase.job() == Some(job) {
            self.pace.pending = Some((job.to_string(), at));
        }
    }

    /// How long the follower of `job` waits before polling it again: the regular pace
    /// ([`poll_delay`]: every `poll`, backing off after failed polls, rarely past
    /// `max_follow`), except around the time a job of this shape is due to end, learned from
    /// the last one: it wakes when the job is due, then polls every eighth of `poll` for two
    /// poll intervals; a job of a shape not learned yet with work queued behind it is polled
    /// every quarter of `poll`.
    pub(crate) fn next_job_poll(
        &self,
        job: &str,
        now: Instant,
        poll: Duration,
        failed_polls: u32,
        max_follow: Duration,
    ) -> Duration {
        let (op, since) = match &self.phase {
            Phase::Running {
                op, job: j, since, ..
            } if j == job => (op, *since),
            // Adopted: started elsewhere, its length unknown; followed since it was found.
            Phase::Adopted {
                job: Some(j),
                since,
            } if j == job => {
                let following = now.saturating_duration_since(*since);
                return poll_delay(poll, failed_polls, following, max_follow);
            }
            _ => return poll_delay(poll, failed_polls, Duration::ZERO, max_follow),
        };
        let following = now.saturating_duration_since(since);
        let regular = poll_delay(poll, failed_polls, following, max_follow);
        if failed_polls > 0 || following > max_follow {
            return regular;
        }
        let Some(length) = self.pace.learned.get(&Shape::of(&op.kind)) else {
            // Work waits behind a job whose length is not known yet: every moment it is seen
            // late, that work waits too, so it is looked at four times as often.
            if self.queue.remove.is_empty() && self.queue.increase.is_empty() {
                return regular;
            }
            return (poll / 4).max(fine(poll)).min(regular);
        };
        let due = since + *length;
        if now < due {
            return due.saturating_duration_since(now).min(regular);
        }
        if now < due + 2 * poll {
            return fine(poll);
        }
        regular
    }

    /// A followed job of this provider ended: a success teaches how long its shape takes.
    pub(super) fn learn_job_length(&mut self, job: &str, end: &JobEnd) {
        let pending = self.pace.pending.take();
        let Phase::Running { op, since, .. } = &self.phase else {
            return;
        };
        if *end != JobEnd::Succeeded {
            return;
        }
        // Ran at least until its last pending poll; none seen: it may have been quick.
        let ran = match pending {
            Some((j, at)) if j == job => at.saturating_duration_since(*since),
            _ => Duration::ZERO,
        };
        self.pace.learned.insert(Shape::of(&op.kind), ran);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Timings;
    use super::super::tests::running3;
    use super::*;
    use crate::rules::AlertScaling;

    const POLL: Duration = Duration::from_secs(2);
    const MAX: Duration = Duration::from_secs(7200);

    /// A machine following job `j` of a one-VM removal sent at `t`.
    fn removing(m: &mut ScaleMachine, j: &str, t: Instant) {
        m.snapshot_installed(running3(t), &AlertScaling::Supported, t);
        m.phase = Phase::Running {
            op: super::super::Op {
                kind: OpKind::Remove {
                    from: 3,
                    vm_ids: vec!["w1".into()],
                    names: vec!["w1".into()],
                    sent: Vec::new(),
                },
                origin: super::super::Origin::Rpc,
            },
            job: j.into(),
            since: t,
        };
    }

    #[test]
    fn a_job_is_polled_often_from_when_its_shape_is_due() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
        removing(&mut m, "j1", t0);
        // Nothing learned: the regular pace; a quarter of it while work waits behind.
        assert_eq!(m.next_job_poll("j1", t0, POLL, 0, MAX), POLL);
        m.queue.remove.push(super::super::QueuedRemoval::new(
            "w2".into(),
            "w2".into(),
            t0,
            false,
        ));
        assert_eq!(m.next_job_poll("j1", t0, POLL, 0, MAX), ms(500));
        m.queue.remove.clear();
        m.job_pending("j1", t0 + s(4));
        m.learn_job_length("j1", &JobEnd::Succeeded);
        // The next one-VM removal: wakes when it is due (4 s after its request), then every
        // 250 ms for two poll intervals, then the regular pace again.
        let t1 = t0 + s(10);
        removing(&mut m, "j2", t1);
        assert_eq!(m.next_job_poll("j2", t1, POLL, 0, MAX), POLL);
        assert_eq!(m.next_job_poll("j2", t1 + s(3), POLL, 0, MAX), s(1));
        assert_eq!(m.next_job_poll("j2", t1 + s(4), POLL, 0, MAX), ms(250));
        assert_eq!(m.next_job_poll("j2", t1 + ms(7900), POLL, 0, MAX), ms(250));
        assert_eq!(m.next_job_poll("j2", t1 + s(8), POLL, 0, MAX), POLL);
        // Failed polls back off as before; another job's shape is not known.
        assert_eq!(m.next_job_poll("j2", t1 + s(4), POLL, 1, MAX), s(4));
        assert_eq!(m.next_job_poll("other", t1 + s(4), POLL, 0, MAX), POLL);
        // A failure teaches nothing; its pending poll is forgotten.
        m.job_pending("j2", t1 + s(1));
        m.learn_job_length(
            "j2",
            &JobEnd::Failed {
                code: 530,
                text: "drain".into(),
            },
        );
        removing(&mut m, "j3", t1);
        assert_eq!(m.next_job_poll("j3", t1 + s(4), POLL, 0, MAX), ms(250));
    }
}
