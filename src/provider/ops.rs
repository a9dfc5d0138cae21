//! The scale RPCs: IncreaseSize, DeleteNodes, DecreaseTargetSize. Each is checked in the
//! caller's future (`Scoped::scale`: limited to the caller's groups, another client's group is
//! not found and nothing is sent for it) and carried out in the group's loop (`cluster_loop`,
//! `Call`), which answers it: the machine's commands are given from the loop only. Each asks
//! the machine, fetches a fresh snapshot when the machine needs one, sends at most one
//! `scaleKubernetesCluster` (size only, or nodeids only) when the machine says so, and returns
//! within the request's deadline without waiting for the job. A caller that hangs up (an
//! autoscaler killed mid-call) is not answered, but the request it started is carried through
//! (`Work::Send`): left half way, the machine would wait for an answer nobody reads and every
//! later scale-up would queue behind it. A refused request changes nothing: the machine
//! validates before it changes state.

use super::Cluster;
use super::cluster_loop::{Work, loop_ended};
use super::{Error, Result, before, now};
use cks_cloudstack::Class;
use cks_domain::cluster::IndexedSnapshot;
use cks_domain::machine::{
    Accepted, Admission, Answer, CallId, Effect, Event, Heard, Hold, JobEnd, JobKind, NodeRef,
    ScaleError, Sent, Started, Step, Watched, WatchedAnswer,
};
use cks_domain::rules::ScaleRequest;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};

use cks_domain::timing::watch_step;

impl Cluster {
    fn scale_error(&self, source: ScaleError) -> Error {
        if let ScaleError::Refused(r) = &source {
            tracing::info!(group = %self.label(), rule = r.rule(), "scale request refused: {r}");
            crate::metrics::record_refusal(&self.id(), r.rule());
        }
        Error::Scale {
            group: self.label(),
            source,
        }
    }

    /// The group's min and max.
    pub(crate) fn bounds(&self) -> (u32, u32) {
        let g = self.group();
        g.read().bounds(&g.spec)
    }

    /// A snapshot fresh from CloudStack, or the cached one when CloudStack cannot answer in
    /// time and the cached one is within the staleness bound.
    async fn fresh_snapshot(&self, deadline: Instant) -> Result<Arc<IndexedSnapshot>> {
        use cks_domain::freshness::{Fetch, SnapshotChoice, choose_snapshot};
        let fetched = timeout_at(before(deadline), self.fetch_and_act()).await;
        let cached = self.group().read().scale.snapshot().cloned();
        let age = cached
            .as_ref()
            .map(|c| now().saturating_duration_since(c.fetched_at));
        let fetch = match &fetched {
            Ok(Ok(_)) => Fetch::Fetched,
            Ok(Err(Error::CloudStack(cs))) if cs.is_transient() => Fetch::Transient,
            Ok(Err(_)) => Fetch::Failed,
            Err(_) => Fetch::TimedOut,
        };
        match (
            choose_snapshot(fetch, age, self.p.inner.settings.staleness_bound),
            fetched,
            cached,
        ) {
            (SnapshotChoice::Fetched, Ok(Ok(s)), _) => Ok(s),
            (SnapshotChoice::Cached, fetched, Some(c)) => {
                if let Ok(Err(e)) = fetched {
                    tracing::warn!(error = %e, "using the cached snapshot: CloudStack did not answer");
                }
                Ok(c)
            }
            (_, Ok(Err(e)), _) => Err(e),
            _ => Err(Error::Deadline {
                group: self.label(),
                command: "listKubernetesClusters",
            }),
        }
    }

    /// A request the machine queued and now sends (no caller waits for it): its refusal is
    /// recorded by the machine as failed instances.
    pub(crate) fn send_queued(&self, request: ScaleRequest) {
        tracing::info!(group = %self.label(), ?request, "sending the queued scale request");
        self.sending(Work::Send {
            request,
            deadline: None,
            reply: None,
        });
    }

    /// Sends the request the machine started for a caller that waits for its answer (until
    /// `deadline`), from the group's loop: the caller hanging up does not stop it half way.
    async fn send(&self, request: ScaleRequest, deadline: Instant) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.sending(Work::Send {
            request,
            deadline: Some(deadline),
            reply: Some(reply),
        });
        answer.await.unwrap_or_else(|e| Err(loop_ended(e)))
    }

    /// Sends the request the machine started (the phase is `Submitting`), reports the answer
    /// back to the machine, watches the job for an immediate refusal while the deadline allows,
    /// then leaves it to the group's loop to follow.
    pub(crate) async fn submit(
        &self,
        request: ScaleRequest,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let g = self.group();
        let label = self.label();
        let cluster_id = g.read().scale.cluster_id.clone();
        let Some(cluster_id) = cluster_id else {
            let why = Sent::NotSent("the cluster id is not resolved yet");
            self.tell(Event::Sent(why)).await;
            return Err(Error::Internal(format!(
                "node group {label}: cluster id not resolved yet"
            )));
        };
        // A caller waits for this request's answer, and an OK is a promise: the store is
        // written first, so that a store that cannot be written is an error the caller hears
        // before anything is sent or promised.
        if let Some(d) = deadline {
            let until = cks_domain::timing::store_check_by(d.into_std(), now());
            if let Err(e) = self.p.inner.store.writable(Instant::from_std(until)).await {
                tracing::warn!(group = %label, error = %e, "scaleKubernetesCluster not sent: the promise it makes cannot be recorded");
                let why = e.to_string();
                self.tell(Event::Sent(Sent::NotSent(&why))).await;
                return Err(e);
            }
        }
        // The fence: a replica that does not lead (any more) sends nothing; the leader's
        // ledger holds what it owes.
        if !self.p.health().acting() {
            tracing::warn!(group = %label, "scaleKubernetesCluster not sent: this replica does not hold the leader lease");
            let why = Sent::NotSent("this replica does not lead");
            self.tell(Event::Sent(why)).await;
            return Err(Error::NotLeader {
                leader: self.p.health().leader(),
            });
        }
        let cs = &self.p.inner.cs;
        let call = async {
            match &request {
                ScaleRequest::Resize { new_size } => {
                    cs.scale_cluster_size(&cluster_id, *new_size).await
                }
                ScaleRequest::RemoveNodes { vm_ids } => {
                    cs.scale_cluster_remove_nodes(&cluster_id, vm_ids).await
                }
            }
        };
        let answer = match deadline {
            Some(d) => timeout_at(before(d), call).await,
            None => Ok(call.await),
        };
        let job_id = match answer {
            Err(_) => {
                tracing::warn!(group = %label, "scaleKubernetesCluster not answered in time; the next refresh tells whether CloudStack accepted it");
                return self.answer_lost("CloudStack did not answer scaleKubernetesCluster within the request's deadline".into()).await;
            }
            Ok(Err(e)) if e.class() == Class::Unknown => {
                // The request may have reached CloudStack (a dropped connection, a garbled
                // answer, a proxy's page sent after CloudStack took the request): nothing more
                // is sent until a snapshot shows whether it became a job.
                tracing::warn!(group = %label, error = %e, "scaleKubernetesCluster answer lost; the next refresh tells whether CloudStack accepted it");
                return self.answer_lost(e.to_string()).await;
            }
            Ok(Err(e)) if e.class() == Class::Throttled => {
                // Refused before it ran: nothing changed, nothing failed. Queued work waits
                // its turn again; callers waiting hear UNAVAILABLE.
                tracing::warn!(group = %label, error = %e, "scaleKubernetesCluster throttled by CloudStack; nothing changed, it is sent again later");
                self.tell(Event::Sent(Sent::Throttled)).await;
                return Err(Error::CloudStack(e));
            }
            Ok(Err(e)) => {
                tracing::warn!(group = %label, error = %e, "scaleKubernetesCluster refused");
                let alert = self.p.inner.alert.scaling();
                let text = e.to_string();
                let refused = Sent::Refused {
                    text: &text,
                    alert: &alert,
                };
                self.tell(Event::Sent(refused)).await;
                return Err(Error::CloudStack(e));
            }
            Ok(Ok(job)) => job,
        };
        let accepted = Sent::Accepted(job_id.clone());
        self.tell(Event::Sent(accepted)).await;
        tracing::info!(group = %label, job = %job_id, "scale job accepted by CloudStack");
        let kind = match &request {
            ScaleRequest::Resize { .. } => JobKind::ScaleUp,
            ScaleRequest::RemoveNodes { .. } => JobKind::RemoveNodes,
        };
        crate::metrics::record_job_started(&cluster_id, kind);
        if let Some(d) = deadline
            && let Some(end) = self.watch(&job_id, d).await
        {
            return self.failed_in_watch(&job_id, end, d).await;
        }
        // Followed by the group's loop, which runs this.
        Ok(())
    }

    /// The submission's answer was lost: settled later by reading CloudStack (the group's
    /// loop watches the cluster's state meanwhile). Its callers hear what the machine says: OK
    /// when it promised what they asked (a window's removals), else the loss.
    async fn answer_lost(&self, detail: String) -> Result<()> {
        let answer = self.tell(Event::Sent(Sent::Lost)).await;
        // The group's loop, which runs this, follows the cluster's state until it is settled.
        if answer == Some(Answer::Owed) {
            tracing::info!(group = %self.label(), detail = %detail,
                "scale-down: CloudStack's answer was lost; the removals are owed and carried through");
            return Ok(());
        }
        Err(Error::AnswerLost {
            group: self.label(),
            detail,
        })
    }

    /// A caller's reply handle, opened before the machine hears of the caller: whatever the
    /// machine releases for it ([`cks_domain::machine::Step::replies`]) reaches it.
    fn open_call(&self) -> (CallId, oneshot::Receiver<Heard>) {
        let call = CallId(self.p.inner.calls.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.group()
            .replies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(call, tx);
        (call, rx)
    }

    /// What the machine says `call` hears. Its deadline is told twice: early enough that a
    /// promise made then can still be recorded (`ScaleMachine::promise_at`: a window caller is
    /// promised its removals), and at the last moment (an OK waiting for its record goes, said
    /// loudly). A window caller whose removals a failure dropped hears that failure when the
    /// window's loop tells it.
    async fn hear(
        &self,
        call: CallId,
        mut rx: oneshot::Receiver<Heard>,
        deadline: Instant,
    ) -> Result<Heard> {
        let promise_at = self
            .group()
            .read()
            .scale
            .promise_at(deadline.into_std(), now());
        if let Ok(heard) = timeout_at(Instant::from_std(promise_at), &mut rx).await {
            return heard.map_err(loop_ended);
        }
        self.tell(Event::PromiseDue { call }).await;
        if let Ok(heard) = timeout_at(before(deadline), &mut rx).await {
            return heard.map_err(loop_ended);
        }
        self.tell(Event::CallerDeadline { call }).await;
        rx.await.map_err(loop_ended)
    }

    /// The caller hears OK once the machine releases it: once the ledger holding its promise
    /// is written (at once without a store), or at its deadline: then OK when what it asked is
    /// under way, else the store's error, what it asked taken back (`hold`).
    async fn answer_ok(&self, deadline: Instant, hold: Hold) -> Result<()> {
        let (call, rx) = self.open_call();
        let step = self.group().lock().scale.reply_ok(call, hold);
        self.carry(step).await;
        match self.hear(call, rx, deadline).await? {
            Heard::Withdrawn => Err(self.p.inner.store.unrecorded()),
            Heard::Ok { .. } | Heard::WindowFailed => Ok(()),
        }
    }

    /// Watches a just-accepted job until it is past CloudStack's validation, which runs
    /// inside the job: the job failed (a refusal), ended, or the cluster shows Scaling (the
    /// job moves it there once validated). Bounded by `scale_watch` and the deadline. Returns
    /// the failure, or `None` when the job runs past validation, succeeded, or the watch
    /// ran out.
    async fn watch(&self, job_id: &str, deadline: Instant) -> Option<JobEnd> {
        let watch = self.p.inner.settings.scale_watch;
        let g = self.group();
        let until = g
            .read()
            .scale
            .watch_until(watch, deadline.into_std(), now());
        let until = Instant::from_std(until);
        let mut looks = 0u32;
        loop {
            let step = watch_step(looks);
            looks = looks.saturating_add(1);
            if Instant::now() + step >= until {
                return None;
            }
            tokio::time::sleep(step).await;
            let Ok(Ok(job)) = timeout_at(until, self.p.inner.cs.query_job(job_id)).await else {
                return None;
            };
            let end = super::follow::job_end(job.outcome());
            match g.read().scale.watched(end.as_ref()) {
                Watched::LookAgain => {}
                Watched::PastValidation => return None,
                Watched::Ended(end) => return Some(end),
            }
            if timeout_at(until, self.fetch_and_act()).await.is_err() {
                return None;
            }
            if g.read().scale.watched(None) == Watched::PastValidation {
                return None;
            }
        }
    }

    /// A job that failed while its scale RPC still watched it: settled as a followed job's end
    /// is, then answered as the machine says (`Settled::watched_answer`).
    async fn failed_in_watch(&self, job_id: &str, end: JobEnd, deadline: Instant) -> Result<()> {
        let label = self.label();
        // Unsure whether it created anything (CloudStack did not answer in time): the machine
        // treats it as a failed scale-up, which at worst reports placeholders to delete.
        let fetched = self.fetch_after_job(Some(deadline)).await;
        let Some(Answer::Watched(answer)) = self.settle(job_id, &end, fetched, true).await else {
            return Ok(());
        };
        let (code, text) = end.failure().unwrap_or((0, ""));
        let job = job_id.to_string();
        match answer {
            WatchedAnswer::CarriedThrough => {
                tracing::warn!(group = %label, job = job_id, code,
                    "the removal failed while DeleteNodes watched it ({text}); it is carried through: the VM is stopped if it can be, then removed as a down VM");
                Ok(())
            }
            WatchedAnswer::FailedCreations => {
                tracing::warn!(group = %label, job = job_id,
                    "the scale-up failed part-way while IncreaseSize watched it; its instances are reported as failed creations");
                Ok(())
            }
            WatchedAnswer::Cancelled => Err(Error::JobCancelled { group: label, job }),
            WatchedAnswer::Refused {
                code,
                text,
                alert_unsupported,
                key_not_permitted,
            } => {
                tracing::info!(group = %label, job = job_id, code, "CloudStack refused the scale request: {text}");
                Err(Error::JobRefused {
                    group: label,
                    job,
                    code,
                    text,
                    alert_unsupported,
                    key_not_permitted,
                })
            }
            WatchedAnswer::Failed { code, text } => Err(Error::JobFailed {
                group: label,
                job,
                code,
                text,
            }),
        }
    }

    /// Ends a removal window: after `removal_window` (or before the first caller's deadline),
    /// on a fresh snapshot, the queued removals go out as one request; the machine says what
    /// each caller of the window hears. Runs in the group's loop: a caller giving up never
    /// strands the queue.
    pub(crate) async fn close_window(&self, deadline: Instant) {
        let g = self.group();
        // When it closes is the machine's: it moves with each arrival.
        let cap = self.p.inner.settings.removal_window;
        loop {
            let Some(at) = g.read().scale.window_closes_at(cap) else {
                break;
            };
            let at = Instant::from_std(at).min(before(deadline));
            if Instant::now() >= at {
                break;
            }
            tokio::time::sleep_until(at).await;
        }
        // The window's own request accepted, its answer told to the machine at once.
        let mut told = false;
        let outcome = match self.fresh_snapshot(deadline).await {
            Err(e) => {
                self.tell(Event::WindowAborted).await;
                Err(e)
            }
            Ok(_) => {
                let alert = self.p.inner.alert.scaling();
                let closed = g.lock().scale.close_window(&alert, now());
                match closed.map_err(|e| self.scale_error(e)) {
                    Err(e) => Err(e),
                    Ok(effects) => {
                        let mut result = Ok(());
                        let mut others = Vec::new();
                        for effect in effects {
                            match effect {
                                // The window's own request: its callers hear the answer.
                                Effect::Submit(request @ ScaleRequest::RemoveNodes { .. }) => {
                                    tracing::info!(group = %self.label(), ?request, "scale-down: sending scaleKubernetesCluster nodeids");
                                    // Sent from here: this runs in the group's loop.
                                    result = self.submit(request, Some(deadline)).await;
                                    if result.is_ok() {
                                        // Owed from now on, before anything else is awaited:
                                        // the loop seeing the job fail must carry them on.
                                        let ok = Event::WindowAnswered { ok: true };
                                        self.tell(ok).await;
                                        told = true;
                                    }
                                }
                                // Increases that waited for the window (nothing was left to
                                // remove) go as queued work does.
                                other => others.push(other),
                            }
                        }
                        self.run_effects(others).await;
                        result
                    }
                }
            }
        };
        // From here the callers' answers stand: an OK makes the removals owed, an error drops
        // those not promised already (the autoscaler untaints those nodes). The failure is
        // kept where its callers read it before the machine releases their replies.
        if let Err(e) = &outcome {
            tracing::warn!(group = %self.label(), error = %e, "the removals of this window were not sent");
        }
        let step = {
            let mut st = g.lock();
            let ok = outcome.is_ok();
            if let Err(e) = outcome {
                st.window_failure = Some(Arc::new(e));
            }
            let mut step = if told {
                Step::default()
            } else {
                st.scale.handle(Event::WindowAnswered { ok }, now())
            };
            step.effects
                .extend(st.scale.handle(Event::WindowClosed, now()).effects);
            step
        };
        // Carrying it out wakes the group's loop (`run_effects`).
        self.carry(step).await;
    }
}

impl Cluster {
    /// NodeGroupIncreaseSize of the group, in its loop (`Call::Increase`).
    pub(crate) async fn increase_here(&self, delta: u32, deadline: Instant) -> Result<()> {
        let g = self.group();
        let (_, max) = self.bounds();
        let alert = self.p.inner.alert.scaling();
        let admitted = g.lock().scale.admit_increase(delta, max, &alert);
        match admitted.map_err(|e| self.scale_error(e))? {
            Admission::Queued(hold) => {
                tracing::info!(group = %self.label(), delta,
                    "scale-up queued behind the scale operation in flight; it is sent when that ends");
                return self.answer_ok(deadline, hold).await;
            }
            Admission::NeedsFreshSnapshot => {}
        }
        self.fresh_snapshot(deadline).await?;
        let (_, max) = self.bounds();
        let alert = self.p.inner.alert.scaling();
        let started = g.lock().scale.start_increase(delta, max, &alert, now());
        match started.map_err(|e| self.scale_error(e))? {
            Started::Submit(request) => {
                tracing::info!(group = %self.label(), ?request, "scale-up: sending scaleKubernetesCluster");
                self.send(request, deadline).await?;
                // Sent: nothing of it can be taken back.
                self.answer_ok(deadline, Hold::default()).await
            }
            Started::Queued(hold) => self.answer_ok(deadline, hold).await,
        }
    }

    /// NodeGroupDeleteNodes of the group, in its loop (`Call::Delete`). The real autoscaler
    /// sends one call per node, several at once (`core/scaledown/actuation/actuator.go`
    /// `deleteNodesAsync`): each call is validated and queued by the machine, and answered OK
    /// once queued. Calls at rest are collected for `removal_window` and sent as one `nodeids`
    /// request; each such call waits for that request's answer within its deadline, so
    /// CloudStack's refusal reaches every caller. Calls arriving while a job runs are answered
    /// at once and go out together when it ends. A fake "unregistered" node of a VM whose node
    /// any client reported within the max-node-provision-time is refused.
    pub(crate) async fn delete_here(&self, nodes: Vec<NodeRef>, deadline: Instant) -> Result<()> {
        let g = self.group();
        let (min, _) = self.bounds();
        let alert = self.p.inner.alert.scaling();
        let (call, heard) = self.open_call();
        // Decided, and what the caller hears with it, in one critical section.
        let accepted = {
            let mut st = g.lock();
            let registered = g.registered.lock().unwrap_or_else(|p| p.into_inner());
            st.scale
                .accept_removals(&nodes, min, &alert, &registered, now())
                .map(|a| {
                    let step = st.scale.reply_to_removal(call, &a);
                    (a, step)
                })
        };
        let (acceptance, step) = match accepted {
            Ok(a) => a,
            Err(e) => {
                g.replies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&call);
                return Err(self.scale_error(e));
            }
        };
        tracing::info!(group = %self.label(), nodes = nodes.len(), accepted = ?acceptance.accepted, "scale-down: nodes accepted for removal");
        if acceptance.accepted == Accepted::OpensWindow {
            self.sending(Work::CloseWindow { deadline });
        }
        self.carry(step).await;
        self.wake_loop();
        // Fake "unregistered" nodes of VMs whose node is registered were refused; the others
        // of the call go ahead, and the caller hears about the refused ones.
        let guarded = acceptance
            .refused
            .into_iter()
            .next()
            .map(|e| self.scale_error(e));
        match self.hear(call, heard, deadline).await? {
            Heard::Ok { .. } => guarded.map_or(Ok(()), Err),
            Heard::Withdrawn => Err(self.p.inner.store.unrecorded()),
            Heard::WindowFailed => Err(match g.lock().window_failure.clone() {
                Some(e) => Error::Batch(e),
                None => Error::Internal("the removal window failed without saying why".into()),
            }),
        }
    }

    /// NodeGroupDecreaseTargetSize of the group, in its loop (`Call::Decrease`): cancels as
    /// many requested nodes that do not exist and will not be created (queued requests,
    /// failed scale-up placeholders) as asked, or, when there are fewer, answers
    /// FAILED_PRECONDITION saying so and changes nothing: after an OK the target has dropped
    /// by the delta (docs/decrease-target-size.md).
    pub(crate) fn decrease_here(&self, delta: u32) -> Result<()> {
        let g = self.group();
        let decreased = g.lock().scale.decrease_target(delta);
        let d = decreased.map_err(|e| self.scale_error(e))?;
        tracing::info!(group = %self.label(), cancelled = d.cancelled, "target size decreased (requests cancelled)");
        Ok(())
    }
}
