//! Each group's loop: one task per configured cluster that carries out what the group does
//! in the background, one thing at a time. It sends every `scaleKubernetesCluster` of its
//! cluster (queued ones, and those a caller waits for), closes its removal windows, and
//! carries out what its agenda (`cks_domain::machine::Agenda`) says is due for what the
//! machine waits for: its job's polls (at the machine's pace, `ScaleMachine::next_job_poll`),
//! the reads of the cluster's state when no job id can tell (`ScaleMachine::follows_state`),
//! the VMs of owed removals to stop (`ScaleMachine::next_stop_at`, `take_stops`) and their
//! stop jobs' polls. The agenda is asked again at every turn, and it decides every time and
//! count here (backoff, follow limit, the overdue warning); the loop only reports how each
//! look went.
//!
//! Callers and other tasks hand it work ([`Provider::sending`]), wake it
//! ([`Provider::wake_loop`]) or have it poll its job at once ([`Provider::poll_now`]); none
//! runs that work in its own future, so an autoscaler that hangs up mid-call never leaves a
//! request half way, and no task is spawned per call or per job.
//! One at a time is enough: the machine starts a request only from `Idle` and none while a
//! removal window is open, and a job is followed only while no request is being sent, so
//! nothing waits behind another.

use super::{Error, Provider, Result, now};
use cks_domain::machine::{Agenda, Due, Event, JobEnd, JobPoll, Next};
use cks_domain::rules::ScaleRequest;
use std::sync::{Arc, Weak};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

/// The outcome of a removal window, shared by its callers.
pub(crate) type WindowOutcome = Option<std::result::Result<(), Arc<Error>>>;
pub(crate) type WindowSender = watch::Sender<WindowOutcome>;

/// The work a group's loop is handed.
pub(crate) enum Work {
    /// A `scaleKubernetesCluster` the machine started (the phase is `Submitting`), and who
    /// waits for its answer: `deadline` is the waiting caller's (its answer is awaited and the
    /// job watched until then).
    Send {
        request: ScaleRequest,
        deadline: Option<Instant>,
        reply: Option<oneshot::Sender<Result<()>>>,
    },
    /// The removal window a DeleteNodes opened: closed when the machine says, its request sent
    /// and its callers answered through `tx`.
    CloseWindow { tx: WindowSender, deadline: Instant },
}

impl Provider {
    /// Hands work to the group's loop (started on first use).
    pub(crate) fn sending(&self, gi: usize, work: Work) {
        if self.group_loop(gi).send(work).is_err() {
            tracing::error!(group = %self.group_label(gi), "the group's loop ended: the scale request is not sent");
        }
    }

    /// Wakes the group's loop (started on first use) to look at what the machine waits for:
    /// a new job to follow, a state to watch, a VM to stop.
    pub(crate) fn wake_loop(&self, gi: usize) {
        self.group_loop(gi);
        self.inner.groups[gi].wake.notify_one();
    }

    /// Has the group's loop poll the followed job now, not when it was due: a snapshot
    /// suggests it is over, or CloudStack answers again after polls that failed.
    pub(crate) fn poll_now(&self, gi: usize) {
        self.group_loop(gi);
        self.inner.groups[gi].poke.notify_one();
    }

    /// The group's loop's inbox. The loop holds the provider weakly: it ends with it.
    fn group_loop(&self, gi: usize) -> &mpsc::UnboundedSender<Work> {
        self.inner.groups[gi].inbox.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel::<Work>();
            let provider = Arc::downgrade(&self.inner);
            let g = &self.inner.groups[gi];
            tokio::spawn(run(provider, gi, rx, g.wake.clone(), g.poke.clone()));
            tx
        })
    }

    /// Polls the followed job once and reports it to the agenda; at its end, reads the
    /// cluster and settles it with the machine.
    async fn poll_job(&self, gi: usize, agenda: &mut Agenda, job: &str) {
        let g = &self.inner.groups[gi];
        let polled = match self.inner.cs.query_job(job).await {
            Err(e) => {
                tracing::warn!(job, error = %e, "polling the scale job failed; retrying");
                JobPoll::NoAnswer
            }
            Ok(j) => match super::follow::job_end(j.outcome()) {
                None => JobPoll::Running,
                Some(end) => {
                    // How long it ran at least, for the pace of the next job of its shape:
                    // told once at its end, not at every poll (each change of the machine
                    // publishes a new view).
                    if let Some(seen) = agenda.job_ended(job) {
                        let _ = g
                            .lock()
                            .scale
                            .handle(Event::JobRan { job, at: seen }, now());
                    }
                    let fetched = self.fetch_after_job(gi, None).await;
                    self.settle(gi, job, &end, fetched, false).await;
                    return;
                }
            },
        };
        if let Some(wait) = agenda.job_polled(&g.read().scale, job, polled, now()) {
            tracing::error!(job, limit = ?self.inner.settings.job_max_follow,
                "scale job still running after the follow limit; it stays this cluster's operation and is polled every {wait:?}");
        }
    }

    /// Polls a stop job once: `None` while it runs (or its poll got no answer), else how it
    /// ended (`Some(None)` succeeded, `Some(Some(text))` failed or was cancelled).
    async fn poll_stop(&self, job: &str) -> Option<Option<String>> {
        let outcome = self.inner.cs.query_job(job).await.ok()?;
        match super::follow::job_end(outcome.outcome())? {
            JobEnd::Succeeded => Some(None),
            JobEnd::Failed { text, .. } => Some(Some(text)),
            JobEnd::Cancelled => Some(Some("the job was cancelled".into())),
        }
    }

    /// Carries out what the agenda says is due.
    async fn do_due(&self, gi: usize, agenda: &mut Agenda, due: Due) {
        match due {
            Due::StopVms => {
                let vms = self.inner.groups[gi].lock().scale.take_stops(now());
                for vm in vms {
                    if let Some(job) = self.send_stop(gi, &vm).await {
                        agenda.stop_sent(vm, job, now());
                    }
                }
            }
            Due::PollJob(job) => self.poll_job(gi, agenda, &job).await,
            Due::PollStop { vm, job } => {
                let ended = self.poll_stop(&job).await;
                agenda.stop_polled(&job, ended.is_some(), now());
                if let Some(ended) = ended {
                    self.stop_ended(gi, &vm, &job, ended.as_deref()).await;
                }
            }
            Due::ReadState => {
                if let Err(e) = self.fetch_and_act(gi).await {
                    tracing::debug!(group = %self.group_label(gi), error = %e, "following the cluster's state: fetch failed");
                }
            }
        }
    }

    /// One piece of handed work.
    async fn carry_out(&self, gi: usize, work: Work) {
        match work {
            Work::CloseWindow { tx, deadline } => self.close_window(gi, tx, deadline).await,
            Work::Send {
                request,
                deadline,
                reply,
            } => {
                let result = self.submit(gi, request, deadline).await;
                match reply {
                    Some(reply) => {
                        let _ = reply.send(result);
                    }
                    None => {
                        if let Err(e) = result {
                            tracing::warn!(group = %self.group_label(gi), error = %e, "queued scale request not accepted");
                        }
                    }
                }
            }
        }
    }
}

/// The loop of group `gi`: handed work first, then what its agenda says is due (the job's
/// poll, VMs to stop, a read of the cluster's state), then it sleeps until the agenda's next
/// time, work arrives or it is woken.
async fn run(
    provider: Weak<super::Inner>,
    gi: usize,
    mut inbox: mpsc::UnboundedReceiver<Work>,
    wake: Arc<Notify>,
    poke: Arc<Notify>,
) {
    let mut agenda = match provider.upgrade() {
        Some(inner) => Agenda::new(
            inner.settings.job_poll_interval,
            inner.settings.job_max_follow,
        ),
        None => return,
    };
    loop {
        let Some(inner) = provider.upgrade() else {
            return;
        };
        let p = Provider { inner };
        if let Ok(work) = inbox.try_recv() {
            p.carry_out(gi, work).await;
            continue;
        }
        let next = agenda.next(&p.inner.groups[gi].read().scale, now());
        let wake_at = match next {
            Next::Do(due) => {
                p.do_due(gi, &mut agenda, due).await;
                continue;
            }
            Next::Sleep(at) => at,
        };
        // Not kept alive while asleep: the loop ends with the provider.
        drop(p);
        let sleep = async {
            match wake_at {
                Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            work = inbox.recv() => {
                let (Some(work), Some(inner)) = (work, provider.upgrade()) else {
                    return;
                };
                Provider { inner }.carry_out(gi, work).await;
            }
            () = poke.notified() => agenda.poll_now(now()),
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}
