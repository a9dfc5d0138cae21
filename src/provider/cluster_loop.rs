//! Each group's loop: one task per configured cluster that carries out what the group does.
//! It answers the group's scale RPCs (`Call`: the machine's commands are given from here
//! only), sends every `scaleKubernetesCluster` of its cluster (queued ones, and those a caller
//! waits for), closes its removal windows, runs its refresh rounds, and carries out what its
//! agenda (`cks_domain::machine::Agenda`) says is due for what the machine waits for: its
//! job's polls (at the machine's pace, `ScaleMachine::next_job_poll`), the reads of the
//! cluster's state when no job id can tell (`ScaleMachine::follows_state`), the VMs of owed
//! removals to stop (`ScaleMachine::next_stop_at`, `take_stops`) and their stop jobs' polls.
//! The agenda is asked again at every turn, and it decides every time and count here
//! (backoff, follow limit, the overdue warning); the loop only reports how each look went.
//!
//! Callers and other tasks hand it calls ([`Scoped::scale`]), work ([`Cluster::sending`])
//! and the other changes of its machine ([`Cluster::change`]: a node report's lesson,
//! Cleanup, the key's `stopVirtualMachine` permission), ask it for a round (`start_round`),
//! wake it ([`Cluster::wake_loop`]) or have it poll its job at once ([`Cluster::poll_now`]);
//! none runs that work in its own future, so an autoscaler that hangs up mid-call never leaves
//! a request half way, no task is spawned per call, per job or per round, and the machine is
//! changed from the loop only (but for a restart's ledger, taken over before any loop runs:
//! `Provider::load_state`). The loop polls what it has under way itself, each piece beside
//! the others ([`run`]): one piece of handed work at a time (the machine starts a request only
//! from `Idle` and none while a removal window is open, so work does not wait behind work), so
//! a window's request never waits for a slow poll, stop or round to end.

use super::Cluster;
use super::{Error, Provider, Result, Scoped, now};
use cks_domain::machine::{Agenda, Due, Event, JobEnd, JobPoll, Next};
use cks_domain::rules::ScaleRequest;
use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

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
    /// The removal window a DeleteNodes opened: closed when the machine says, its request sent,
    /// and what its callers hear told to the machine.
    CloseWindow { deadline: Instant },
    /// What a machine asked for that nothing carried out yet: on taking over its recorded
    /// ledger, the job to follow.
    Effects(Vec<cks_domain::machine::Effect>),
}

/// A scale RPC of the autoscaler's, as [`Scoped::scale`] takes it: checked there (the caller
/// may change the group, the arguments hold), then carried out and answered by the group's
/// loop: the machine's commands are given from the loop only.
pub enum Call {
    /// NodeGroupIncreaseSize: `delta` nodes more (positive).
    Increase { delta: i32, deadline: Instant },
    /// NodeGroupDeleteNodes.
    Delete {
        nodes: Vec<cks_domain::machine::NodeRef>,
        deadline: Instant,
    },
    /// NodeGroupDecreaseTargetSize: `delta` requested nodes fewer (negative).
    Decrease { delta: i32 },
}

/// A call and where its answer goes.
type Asked = (Call, oneshot::Sender<Result<()>>);

/// A change of the group's machine that is not a scale call. Each is one short critical
/// section with nothing to ask CloudStack: the loop makes it as soon as it is handed over,
/// beside whatever it has under way, so whoever hands it over waits for nothing else.
pub(crate) enum Change {
    /// What a real node the group's own autoscaler reported teaches (NodeGroupForNode).
    Learn(Lesson),
    /// The group's job let go and its removals not sent dropped (Cleanup).
    Cleanup,
    /// Whether the key may call `stopVirtualMachine`: one key serves every group.
    MayStopVms(bool),
}

/// What a real node of one of the group's worker VMs, reported by the group's own autoscaler,
/// teaches the group (NodeGroupForNode): taught in the group's loop (`Cluster::learn_here`).
pub(crate) struct Lesson {
    pub vm_id: String,
    pub node_name: String,
    /// The node's providerID, when the machine pairs the VM with another (or none).
    pub provider_id: Option<String>,
    /// The node's labels, for the template node, when the group has none yet.
    pub labels: Option<Arc<std::collections::BTreeMap<String, String>>>,
    /// The VM is one a failed scale-up left, and up.
    pub joined: bool,
}

/// A change and who waits for it to be made.
type Changing = (Change, oneshot::Sender<()>);

/// The ways into a group's loop.
pub(crate) struct Inbox {
    work: mpsc::UnboundedSender<Work>,
    calls: mpsc::UnboundedSender<Asked>,
    changes: mpsc::UnboundedSender<Changing>,
}

impl Provider {
    /// Hands each of these groups' loops a change (`change` makes each) and returns once
    /// every loop has made it: each makes it beside whatever it has under way.
    pub(crate) async fn change_each(
        &self,
        groups: impl IntoIterator<Item = usize>,
        change: impl Fn() -> Change,
    ) {
        let making: Vec<_> = groups
            .into_iter()
            .map(|gi| self.cluster(gi).change(change()))
            .collect();
        for made in making {
            made.await;
        }
    }
}

impl Scoped<'_> {
    /// A scale RPC of one of the caller's groups (NodeGroupIncreaseSize, NodeGroupDeleteNodes,
    /// NodeGroupDecreaseTargetSize), checked in the caller's future: another client's group is
    /// not found and nothing is sent for it, the arguments must hold, and no promise is made
    /// while the store cannot be written. Then handed to the group's loop, which carries it
    /// out and answers it (`Cluster::increase_here`, `delete_here`, `decrease_here`); the
    /// caller waits for that answer.
    pub async fn scale(&self, id: &str, call: Call) -> Result<()> {
        self.may_change()?;
        match &call {
            Call::Increase { delta, .. } if *delta <= 0 => {
                return Err(Error::InvalidArgument(format!(
                    "delta must be positive, got {delta}"
                )));
            }
            Call::Delete { nodes, .. } if nodes.is_empty() => {
                return Err(Error::InvalidArgument(
                    "no nodes to delete were given".into(),
                ));
            }
            Call::Decrease { delta } if *delta >= 0 => {
                return Err(Error::InvalidArgument(format!(
                    "delta must be negative, got {delta}"
                )));
            }
            _ => {}
        }
        let (gi, _) = self.group(id)?;
        // An OK to a scale-up or a removal is a promise; DecreaseTargetSize promises nothing.
        if !matches!(call, Call::Decrease { .. }) {
            self.p.inner.store.check()?;
        }
        let (reply, answer) = oneshot::channel();
        if self
            .p
            .cluster(gi)
            .group_loop()
            .calls
            .send((call, reply))
            .is_err()
        {
            return Err(Error::Internal("the group's loop ended".into()));
        }
        answer.await.unwrap_or_else(|e| Err(loop_ended(e)))
    }
}

/// What a caller hears when the group's loop dropped its reply handle: the loop ended (the
/// provider with it) or a bug panicked the piece that held it.
pub(crate) fn loop_ended(_: oneshot::error::RecvError) -> Error {
    Error::Internal("the group's loop ended without an answer".into())
}

impl Cluster {
    /// Polls a stop job once: `None` while it runs (or its poll got no answer), else how it
    /// ended (`Some(None)` succeeded, `Some(Some(text))` failed or was cancelled).
    async fn poll_stop(&self, job: &str) -> Option<Option<String>> {
        let outcome = self.p.inner.cs.query_job(job).await.ok()?;
        match super::follow::job_end(outcome.outcome())? {
            JobEnd::Succeeded => Some(None),
            JobEnd::Failed { text, .. } => Some(Some(text)),
            JobEnd::Cancelled => Some(Some("the job was cancelled".into())),
        }
    }

    /// Carries out a call in the group's loop and answers it. A caller that hangs up is not
    /// answered, and what it asked goes no further than it had when it hung up, as when the
    /// call ran in the caller's own future: a request already handed over is carried through
    /// (`Work::Send`), and removals already queued stay with their window.
    async fn answer(self, call: Call, mut reply: oneshot::Sender<Result<()>>) {
        let carried = async {
            match call {
                // Their signs were checked by `Scoped::scale`.
                Call::Increase { delta, deadline } => {
                    self.increase_here(delta.unsigned_abs(), deadline).await
                }
                Call::Delete { nodes, deadline } => self.delete_here(nodes, deadline).await,
                Call::Decrease { delta } => self.decrease_here(delta.unsigned_abs()),
            }
        };
        tokio::select! {
            result = carried => {
                let _ = reply.send(result);
            }
            () = reply.closed() => {}
        }
    }

    /// Hands a change of its machine to the group's loop (started on first use) now; the
    /// future resolves once the loop made it: `false` when the loop ended without making it
    /// (a bug panicked it). Handed over before it is awaited, so changes of several groups
    /// are made at once.
    pub(crate) fn change(&self, change: Change) -> impl Future<Output = bool> + use<> {
        let (done, made) = oneshot::channel();
        let handed = self.group_loop().changes.send((change, done)).is_ok();
        async move { handed && made.await.is_ok() }
    }

    /// Makes a change in the group's loop.
    fn make(&self, change: Change) {
        match change {
            Change::Learn(lesson) => self.learn_here(lesson),
            Change::Cleanup => self.cleanup_here(),
            Change::MayStopVms(yes) => self.may_stop_here(yes),
        }
    }

    /// Hands work to the group's loop (started on first use).
    pub(crate) fn sending(&self, work: Work) {
        if self.group_loop().work.send(work).is_err() {
            tracing::error!(group = %self.label(), "the group's loop ended: the work handed to it is not done");
        }
    }

    /// Wakes the group's loop (started on first use) to look at what the machine waits for:
    /// a new job to follow, a state to watch, a VM to stop.
    pub(crate) fn wake_loop(&self) {
        self.group_loop();
        self.group().wake.notify_one();
    }

    /// Has the group's loop poll the followed job now, not when it was due: a snapshot
    /// suggests it is over, or CloudStack answers again after polls that failed.
    pub(crate) fn poll_now(&self) {
        self.group_loop();
        self.group().poke.notify_one();
    }

    /// The group's loop's inbox. The loop holds the provider weakly: it ends with it.
    fn group_loop(&self) -> &Inbox {
        self.group().inbox.get_or_init(|| {
            let (work, work_rx) = mpsc::unbounded_channel::<Work>();
            let (calls, calls_rx) = mpsc::unbounded_channel::<Asked>();
            let (changes, changes_rx) = mpsc::unbounded_channel::<Changing>();
            let provider = Arc::downgrade(&self.p.inner);
            let g = self.group();
            let ways = Ways {
                work: work_rx,
                calls: calls_rx,
                changes: changes_rx,
                wake: g.wake.clone(),
                poke: g.poke.clone(),
                recorded: g.recorded.subscribe(),
            };
            tokio::spawn(run(provider, self.gi, ways));
            Inbox {
                work,
                calls,
                changes,
            }
        })
    }

    /// Polls the followed job once; at its end, reads the cluster and settles it with the
    /// machine (`seen`: when a poll last saw it running, told to the machine at its end).
    async fn poll_job(&self, job: String, seen: Option<std::time::Instant>) -> Report {
        let poll = match self.p.inner.cs.query_job(&job).await {
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
                    if let Some(at) = seen {
                        self.tell(Event::JobRan { job: &job, at }).await;
                    }
                    let fetched = self.fetch_after_job(None).await;
                    self.settle(&job, &end, fetched, false).await;
                    // The machine no longer waits for it: the agenda drops it at its next look.
                    return Report::Nothing;
                }
            },
        };
        Report::JobPolled { job, poll }
    }

    /// Carries out what the agenda says is due; what it came to, for the agenda.
    async fn do_due(self, due: Due) -> Report {
        match due {
            Due::StopVms => {
                let vms = self.group().lock().scale.take_stops(now());
                let mut sent = Vec::new();
                for vm in vms {
                    if let Some(job) = self.send_stop(&vm).await {
                        sent.push((vm, job));
                    }
                }
                Report::StopsSent(sent)
            }
            Due::PollJob { job, seen_running } => self.poll_job(job, seen_running).await,
            Due::PollStop { vm, job } => {
                let ended = self.poll_stop(&job).await;
                if let Some(ended) = &ended {
                    self.stop_ended(&vm, &job, ended.as_deref()).await;
                }
                Report::StopPolled {
                    job,
                    ended: ended.is_some(),
                }
            }
            Due::ReadState => {
                if let Err(e) = self.fetch_and_act().await {
                    tracing::debug!(group = %self.label(), error = %e, "following the cluster's state: fetch failed");
                }
                Report::Nothing
            }
        }
    }

    /// One piece of handed work.
    async fn carry_out(self, work: Work) {
        match work {
            Work::CloseWindow { deadline } => self.close_window(deadline).await,
            Work::Effects(effects) => self.run_effects(effects).await,
            Work::Send {
                request,
                deadline,
                reply,
            } => {
                let result = self.submit(request, deadline).await;
                match reply {
                    Some(reply) => {
                        let _ = reply.send(result);
                    }
                    None => {
                        if let Err(e) = result {
                            tracing::warn!(group = %self.label(), error = %e, "queued scale request not accepted");
                        }
                    }
                }
            }
        }
    }
}

/// What a due item came to, for the agenda.
enum Report {
    /// Stops sent: each VM and its stop job.
    StopsSent(Vec<(String, String)>),
    JobPolled {
        job: String,
        poll: JobPoll,
    },
    StopPolled {
        job: String,
        ended: bool,
    },
    /// Nothing for the agenda: it reads what the machine waits for at its next look.
    Nothing,
}

/// A piece of the loop's work under way: polled by the loop itself, no task of its own. Its
/// panic ends it, not the loop (the group's only actor: without it nothing of the group would
/// move again).
type Flight<T> = Option<Pin<Box<dyn Future<Output = std::thread::Result<T>> + Send>>>;

fn flight<T>(f: impl Future<Output = T> + Send + 'static) -> Flight<T> {
    Some(Box::pin(AssertUnwindSafe(f).catch_unwind()))
}

/// The end of `flight` (never, while there is none); `None` when it panicked, said here.
async fn landing<T>(flight: &mut Flight<T>, gi: usize, what: &str) -> Option<T> {
    let ended = match flight {
        Some(f) => f.await,
        None => std::future::pending().await,
    };
    *flight = None;
    unless_panicked(ended, gi, what)
}

/// What a piece of the loop's work came to; `None` when it panicked, said here.
fn unless_panicked<T>(ended: std::thread::Result<T>, gi: usize, what: &str) -> Option<T> {
    match ended {
        Ok(t) => Some(t),
        Err(_) => {
            tracing::error!(
                group_index = gi,
                "a bug: the group's loop's {what} panicked; the loop goes on without it"
            );
            None
        }
    }
}

/// What reaches a group's loop.
struct Ways {
    work: mpsc::UnboundedReceiver<Work>,
    calls: mpsc::UnboundedReceiver<Asked>,
    changes: mpsc::UnboundedReceiver<Changing>,
    wake: Arc<Notify>,
    poke: Arc<Notify>,
    /// The number of the group's last ledger the store wrote.
    recorded: watch::Receiver<u64>,
}

/// The loop of group `gi`. Under way at once, each polled by the loop itself: the scale calls
/// being answered (any number), one piece of handed work (a request sent, a window closed),
/// one refresh round and one item of the agenda (a poll, stops, a read of the cluster), so a
/// caller's work never waits behind a slow poll, stop or round; a handed change is made
/// between two looks at them. The agenda is asked only while no work is under way: a
/// request's own watch follows its new job until its caller is answered, and a poll beside it
/// would settle the job before the watch hears CloudStack's refusal. Otherwise it sleeps until
/// the agenda's next time, work arrives, or it is woken.
async fn run(provider: Weak<super::Inner>, gi: usize, ways: Ways) {
    let Ways {
        work: mut inbox,
        mut calls,
        mut changes,
        wake,
        poke,
        mut recorded,
    } = ways;
    let mut agenda = match provider.upgrade() {
        Some(inner) => Agenda::new(
            inner.settings.job_poll_interval,
            inner.settings.job_max_follow,
        ),
        None => return,
    };
    let mut work: Flight<()> = None;
    let mut due: Flight<Report> = None;
    let mut round: Flight<()> = None;
    // The calls being answered: any number at once (the autoscaler calls DeleteNodes once
    // per node, concurrently, and each waits for its window).
    let mut answering = FuturesUnordered::new();
    // After a look that panicked, the agenda is not asked again before this.
    let mut pause: Option<std::time::Instant> = None;
    loop {
        let Some(c) = alive(&provider, gi) else {
            return;
        };
        if round.is_none()
            && let Some(r) = c.take_round()
        {
            round = flight(r);
        }
        if work.is_none()
            && let Ok(w) = inbox.try_recv()
        {
            work = flight(c.clone().carry_out(w));
        }
        let mut wake_at = None;
        if pause.is_some_and(|until| until <= now()) {
            pause = None;
        }
        if let Some(until) = pause {
            wake_at = Some(until);
        } else if work.is_none() && due.is_none() {
            match agenda.next(&c.group().read().scale, now()) {
                Next::Do(d) => {
                    due = flight(c.clone().do_due(d));
                }
                Next::Sleep(at) => wake_at = at,
            }
        }
        // Not kept alive while asleep: the loop ends with the provider.
        drop(c);
        let idle = work.is_none() && due.is_none();
        let sleep = async {
            match wake_at {
                Some(at) if idle => tokio::time::sleep_until(Instant::from_std(at)).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = landing(&mut work, gi, "work"), if work.is_some() => {}
            _ = landing(&mut round, gi, "refresh round"), if round.is_some() => {}
            report = landing(&mut due, gi, "look at what the machine waits for"), if due.is_some() => {
                let Some(c) = alive(&provider, gi) else {
                    return;
                };
                match report {
                    Some(report) => heard(&c, &mut agenda, report),
                    // Not asked again at once: the same look would panic again.
                    None => pause = Some(now() + c.p.inner.settings.job_poll_interval),
                }
            }
            Some(answered) = answering.next(), if !answering.is_empty() => {
                // Its caller hears the loop ended without an answer.
                let _: Option<()> = unless_panicked(answered, gi, "answer to a scale call");
            }
            changing = changes.recv() => {
                let (Some((change, done)), Some(c)) = (changing, alive(&provider, gi)) else {
                    return;
                };
                let made = std::panic::catch_unwind(AssertUnwindSafe(|| c.make(change)));
                // Its waiter hears it was not made.
                if unless_panicked(made, gi, "change of the machine").is_some() {
                    let _ = done.send(());
                }
            }
            asked = calls.recv() => {
                let (Some((call, reply)), Some(c)) = (asked, alive(&provider, gi)) else {
                    return;
                };
                let answer = c.answer(call, reply);
                answering.push(AssertUnwindSafe(answer).catch_unwind());
            }
            w = inbox.recv(), if work.is_none() => {
                let (Some(w), Some(c)) = (w, alive(&provider, gi)) else {
                    return;
                };
                work = flight(c.carry_out(w));
            }
            Ok(()) = recorded.changed() => {
                let rev = *recorded.borrow_and_update();
                let Some(c) = alive(&provider, gi) else {
                    return;
                };
                // The OKs that waited for this record go.
                c.tell(Event::Recorded { rev }).await;
            }
            () = poke.notified() => agenda.poll_now(now()),
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}

/// Group `gi`'s share of the provider while the provider lives.
fn alive(provider: &Weak<super::Inner>, gi: usize) -> Option<Cluster> {
    Some(
        Provider {
            inner: provider.upgrade()?,
        }
        .cluster(gi),
    )
}

/// What a due item came to, told to the agenda.
fn heard(c: &Cluster, agenda: &mut Agenda, report: Report) {
    match report {
        Report::StopsSent(sent) => {
            for (vm, job) in sent {
                agenda.stop_sent(vm, job, now());
            }
        }
        Report::JobPolled { job, poll } => {
            let view = c.group().read();
            if let Some(wait) = agenda.job_polled(&view.scale, &job, poll, now()) {
                tracing::error!(job, limit = ?c.p.inner.settings.job_max_follow,
                    "scale job still running after the follow limit; it stays this cluster's operation and is polled every {wait:?}");
            }
        }
        Report::StopPolled { job, ended } => agenda.stop_polled(&job, ended, now()),
        Report::Nothing => {}
    }
}
