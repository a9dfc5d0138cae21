//! Each group's loop: one task per configured cluster that carries out what the group does
//! in the background, one thing at a time. It sends every `scaleKubernetesCluster` of its
//! cluster (queued ones, and those a caller waits for), closes its removal windows, and
//! follows what the machine waits for: its job, polled when the machine says
//! (`ScaleMachine::next_job_poll`), or, when no job id can tell (a lost answer, a job no
//! listing names), the cluster's state, read every `--job-poll-interval`
//! (`ScaleMachine::follows_state`). It stops the VMs of owed removals whose drain would fail
//! when the machine says (`ScaleMachine::next_stop_at`, `take_stops`) and follows each stop
//! job to its end. What to follow is read from the machine at every turn, never remembered
//! apart from it.
//!
//! Callers and other tasks hand it work ([`Provider::sending`]), wake it
//! ([`Provider::wake_loop`]) or have it poll its job at once ([`Provider::poll_now`]); none
//! runs that work in its own future, so an autoscaler that hangs up mid-call never leaves a
//! request half way, and no task is spawned per call or per job.
//! One at a time is enough: the machine starts a request only from `Idle` and none while a
//! removal window is open, and a job is followed only while no request is being sent, so
//! nothing waits behind another.

use super::{Error, Provider, Result, now};
use cks_domain::machine::JobEnd;
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

/// A `stopVirtualMachine` job the loop follows to its end.
struct Stopping {
    vm: String,
    job: String,
    next: Instant,
    /// Not followed past this (`--job-max-follow`): the next snapshot tells what became of
    /// the VM.
    until: Instant,
}

/// The job the loop follows, and how its polls went.
struct Following {
    job: String,
    /// Polls in a row that got no answer (the machine backs off after them).
    failures: u32,
    /// Said once: the job runs past the follow limit.
    overdue: bool,
    next: Instant,
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

    /// When the followed job is to be polled next (the machine's pace).
    fn next_poll(&self, gi: usize, job: &str, failures: u32) -> Instant {
        let s = &self.inner.settings;
        let wait = self.inner.groups[gi].read().scale.next_job_poll(
            job,
            now(),
            s.job_poll_interval,
            failures,
            s.job_max_follow,
        );
        Instant::now() + wait
    }

    /// Polls the followed job once; at its end, reads the cluster and settles it with the
    /// machine. Returns whether it ended.
    async fn poll_job(&self, gi: usize, f: &mut Following) -> bool {
        let outcome = match self.inner.cs.query_job(&f.job).await {
            Err(e) => {
                f.failures += 1;
                f.next = self.next_poll(gi, &f.job, f.failures);
                tracing::warn!(job = %f.job, error = %e, "polling the scale job failed; retrying");
                return false;
            }
            Ok(job) => job.outcome(),
        };
        f.failures = 0;
        let Some(end) = super::follow::job_end(outcome) else {
            self.inner.groups[gi]
                .lock()
                .scale
                .job_pending(&f.job, now());
            f.next = self.next_poll(gi, &f.job, 0);
            let delay = f.next.saturating_duration_since(Instant::now());
            if delay > self.inner.settings.job_poll_interval && !f.overdue {
                f.overdue = true;
                tracing::error!(job = %f.job, limit = ?self.inner.settings.job_max_follow,
                    "scale job still running after the follow limit; it stays this cluster's operation and is polled every {delay:?}");
            }
            return false;
        };
        let fetched = self.fetch_after_job(gi, None).await;
        self.settle(gi, &f.job, &end, fetched, false).await;
        true
    }

    /// Polls a stop job once: `None` while it runs (or its poll got no answer), else how it
    /// ended (`Some(None)` succeeded, `Some(Some(text))` failed or was cancelled).
    async fn poll_stop(&self, s: &Stopping) -> Option<Option<String>> {
        let outcome = self.inner.cs.query_job(&s.job).await.ok()?;
        match super::follow::job_end(outcome.outcome())? {
            JobEnd::Succeeded => Some(None),
            JobEnd::Failed { text, .. } => Some(Some(text)),
            JobEnd::Cancelled => Some(Some("the job was cancelled".into())),
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

/// The loop of group `gi`: handed work first, then what is due (the job's poll, a read of the
/// cluster's state), then it sleeps until the next is due, work arrives or it is woken.
async fn run(
    provider: Weak<super::Inner>,
    gi: usize,
    mut inbox: mpsc::UnboundedReceiver<Work>,
    wake: Arc<Notify>,
    poke: Arc<Notify>,
) {
    let mut following: Option<Following> = None;
    let mut state_read: Option<Instant> = None;
    let mut stopping: Vec<Stopping> = Vec::new();
    loop {
        let Some(inner) = provider.upgrade() else {
            return;
        };
        let p = Provider { inner };
        let poll = p.inner.settings.job_poll_interval;
        if let Ok(work) = inbox.try_recv() {
            p.carry_out(gi, work).await;
            continue;
        }
        // What the machine waits for now.
        let (job, follows_state, stop_at) = {
            let st = p.inner.groups[gi].read();
            (
                st.scale.phase().job().map(str::to_string),
                st.scale.follows_state(),
                st.scale.next_stop_at(now()),
            )
        };
        if stop_at.is_some_and(|at| at <= now()) {
            let vms = p.inner.groups[gi].lock().scale.take_stops(now());
            for vm in vms {
                if let Some(job) = p.send_stop(gi, &vm).await {
                    stopping.push(Stopping {
                        vm,
                        job,
                        next: Instant::now() + poll,
                        until: Instant::now() + p.inner.settings.job_max_follow,
                    });
                }
            }
            continue;
        }
        match (&job, &following) {
            (Some(j), Some(f)) if f.job == *j => {}
            (Some(j), _) => {
                following = Some(Following {
                    job: j.clone(),
                    failures: 0,
                    overdue: false,
                    next: p.next_poll(gi, j, 0),
                });
            }
            (None, _) => following = None,
        }
        if !follows_state {
            state_read = None;
        }
        let state_at = follows_state.then(|| *state_read.get_or_insert(Instant::now() + poll));
        let t = Instant::now();
        if let Some(f) = following.as_mut().filter(|f| f.next <= t) {
            if p.poll_job(gi, f).await {
                following = None;
            }
            continue;
        }
        if let Some(i) = stopping.iter().position(|s| s.next <= t) {
            let mut s = stopping.swap_remove(i);
            if let Some(ended) = p.poll_stop(&s).await {
                p.stop_ended(gi, &s.vm, &s.job, ended.as_deref()).await;
            } else if Instant::now() < s.until {
                s.next = Instant::now() + poll;
                stopping.push(s);
            }
            continue;
        }
        if state_at.is_some_and(|at| at <= t) {
            state_read = Some(Instant::now() + poll);
            if let Err(e) = p.fetch_and_act(gi).await {
                tracing::debug!(group = %p.group_label(gi), error = %e, "following the cluster's state: fetch failed");
            }
            continue;
        }
        let due = [following.as_ref().map(|f| f.next), state_at]
            .into_iter()
            .chain(stopping.iter().map(|s| Some(s.next)))
            .chain([stop_at.map(Instant::from_std)])
            .flatten()
            .min();
        // Not kept alive while asleep: the loop ends with the provider.
        drop(p);
        let sleep = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
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
            () = poke.notified() => {
                if let Some(f) = following.as_mut() {
                    f.next = Instant::now();
                }
            }
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}
