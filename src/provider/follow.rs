//! Following scale jobs in the background: one task per job, polling
//! `queryAsyncJobResult`, then installing the outcome (a fresh snapshot, failed instances,
//! the next queued request). Also adopts jobs this provider did not start (after a restart
//! or a lost answer), found through the cluster's Scaling state and `listAsyncJobs`.

use super::ops::{is_alert_refusal, refused_error};
use super::{Op, OpKind, Provider};
use crate::cloudstack::types::{JobOutcome, cloudstack_date};
use crate::domain::cluster::{ClusterSnapshot, ClusterState};
use crate::domain::rules::{ScaleRequest, check_scale};
use crate::domain::status::scale_up_failure;
use std::time::{Duration, Instant};

/// A job still running after `Settings::job_max_follow` is polled this many times less often.
const OVERDUE_POLL_FACTOR: u32 = 30;

impl Provider {
    pub(crate) fn spawn_follower(&self, gi: usize, job_id: String) {
        let p = self.clone();
        tokio::spawn(async move { p.follow(gi, job_id).await });
    }

    fn still_following(&self, gi: usize, job_id: &str) -> bool {
        self.inner.groups[gi]
            .read()
            .op
            .as_ref()
            .and_then(|o| o.job_id.as_deref())
            == Some(job_id)
    }

    async fn follow(&self, gi: usize, job_id: String) {
        let poll = self.inner.settings.job_poll_interval;
        let started = Instant::now();
        let mut stop = self.inner.shutdown.subscribe();
        let mut delay = poll;
        let mut failures = 0u32;
        let mut overdue = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.inner.groups[gi].poke.notified() => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
            if !self.still_following(gi, &job_id) {
                return;
            }
            match self.inner.cs.query_job(&job_id).await {
                Err(e) => {
                    failures += 1;
                    delay =
                        (poll * 2u32.saturating_pow(failures.min(5))).min(Duration::from_secs(30));
                    tracing::warn!(job = %job_id, error = %e, "polling the scale job failed; retrying");
                }
                Ok(job) => {
                    failures = 0;
                    delay = poll;
                    match job.outcome() {
                        JobOutcome::Pending => {
                            // Past the follow limit the job stays the group's operation (it
                            // still runs: dropping it would let the target fall to CloudStack's
                            // size until a Refresh adopted it again, and so on every limit), but
                            // it is polled rarely.
                            if started.elapsed() > self.inner.settings.job_max_follow {
                                if !overdue {
                                    overdue = true;
                                    tracing::error!(job = %job_id, limit = ?self.inner.settings.job_max_follow,
                                        "scale job still running after the follow limit; it stays this cluster's operation and is polled every {:?}",
                                        poll * OVERDUE_POLL_FACTOR);
                                }
                                delay = poll * OVERDUE_POLL_FACTOR;
                            }
                        }
                        JobOutcome::Succeeded(_) => return self.finish(gi, &job_id, None).await,
                        JobOutcome::Failed {
                            errorcode,
                            errortext,
                        } => {
                            return self.finish(gi, &job_id, Some((errorcode, errortext))).await;
                        }
                        JobOutcome::Cancelled => {
                            return self
                                .finish(gi, &job_id, Some((0, "the job was cancelled".into())))
                                .await;
                        }
                    }
                }
            }
        }
    }

    /// Installs a finished job's outcome atomically, then sends the queued request, if any.
    async fn finish(&self, gi: usize, job_id: &str, failure: Option<(i64, String)>) {
        let g = &self.inner.groups[gi];
        let _ops = g.op_lock.lock().await;
        let label = self.group_label(gi);
        // The outcome is judged on a snapshot taken after the job ended.
        let mut fetched = false;
        for attempt in 0..3u32 {
            match self.fetch_cluster_only(gi).await {
                Ok(()) => {
                    fetched = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(group = %label, error = %e, "fetching the cluster after the job failed");
                    tokio::time::sleep(self.inner.settings.job_poll_interval * (attempt + 1)).await;
                }
            }
        }
        if self
            .settle_job(gi, job_id, failure.as_ref(), fetched)
            .is_none()
        {
            return;
        }
        self.send_queued(gi).await;
    }

    /// Sends the increases queued behind an operation that has ended, if any. The caller holds
    /// the op lock and no operation is in flight.
    async fn send_queued(&self, gi: usize) {
        let queued = {
            let mut st = self.inner.groups[gi].lock();
            if st.op.is_none() && st.queued_increase > 0 {
                let n = std::mem::take(&mut st.queued_increase);
                let ph = std::mem::take(&mut st.queued_placeholders);
                Some((n, ph))
            } else {
                None
            }
        };
        if let Some((n, placeholders)) = queued {
            self.submit_queued(gi, n, placeholders).await;
        }
    }

    /// Installs the end of a job on the group's state in one critical section: forgets the
    /// operation, records the VMs a removal took, and turns a failed scale-up's VMs (and the
    /// ones it never created) into failed instances. The one path for a job's end, whether
    /// the follower or the scale RPC's own watch saw it; the caller holds the op lock and has
    /// just tried to fetch the cluster (`fetched`: whether that worked). Returns the finished
    /// operation's kind, or `None` when the job is no longer the group's operation.
    pub(crate) fn settle_job(
        &self,
        gi: usize,
        job_id: &str,
        failure: Option<&(i64, String)>,
        fetched: bool,
    ) -> Option<OpKind> {
        let g = &self.inner.groups[gi];
        let label = self.group_label(gi);
        let mut st = g.lock();
        let ours = st.op.as_ref().and_then(|o| o.job_id.as_deref()) == Some(job_id);
        if !ours {
            return None;
        }
        let op = st.op.take()?;
        if let OpKind::Remove { vm_ids, .. } = &op.kind {
            let now = Instant::now();
            st.recently_removed
                .retain(|_, t| now.duration_since(*t) < Duration::from_secs(3600));
            let names: Vec<String> = st
                .snap
                .as_ref()
                .map(|s| {
                    vm_ids
                        .iter()
                        .filter_map(|id| s.snap.vm(id).map(|v| v.name.to_ascii_lowercase()))
                        .collect()
                })
                .unwrap_or_default();
            for key in vm_ids.iter().cloned().chain(names) {
                st.recently_removed.insert(key, now);
            }
        }
        match failure {
            None => {
                tracing::info!(group = %label, job = job_id, "scale job succeeded");
                crate::metrics::record_job(op_kind_label(&op.kind), "succeeded");
            }
            Some((code, text)) => {
                tracing::warn!(group = %label, job = job_id, code, "scale job failed: {text}");
                crate::metrics::record_job(op_kind_label(&op.kind), "failed");
                if is_alert_refusal(text) {
                    let alert = st
                        .snap
                        .as_ref()
                        .is_some_and(|s| s.snap.state == ClusterState::Alert);
                    if alert {
                        self.set_alert_unsupported(text);
                    }
                }
                if let OpKind::Increase {
                    from,
                    to,
                    vms_before,
                    placeholders,
                } = &op.kind
                {
                    let err = scale_up_failure(job_id, *code, text);
                    let new_vms: Vec<String> = st
                        .snap
                        .as_ref()
                        .map(|s| {
                            s.snap
                                .workers()
                                .filter(|v| !vms_before.contains(&v.id) && !v.state.is_gone())
                                .map(|v| v.id.clone())
                                .collect()
                        })
                        .unwrap_or_default();
                    // When the snapshot could not be refreshed, VMs may exist that we do not
                    // see; report only placeholders for what is surely missing.
                    let requested = to.saturating_sub(*from) as usize;
                    let missing = if fetched {
                        requested.saturating_sub(new_vms.len())
                    } else {
                        requested
                    };
                    let ph: Vec<String> =
                        placeholders.iter().rev().take(missing).cloned().collect();
                    Provider::record_failed_increase(&mut st, &err, new_vms, ph);
                }
            }
        }
        Some(op.kind)
    }

    async fn submit_queued(&self, gi: usize, n: u32, placeholders: Vec<String>) {
        let g = &self.inner.groups[gi];
        let label = self.group_label(gi);
        let Some(snap) = g.read().snap.clone() else {
            return;
        };
        let new_size = snap.snap.size + n;
        let request = ScaleRequest::Resize { new_size };
        let refuse = |text: String| {
            tracing::warn!(group = %label, "queued scale-up refused: {text}");
            let mut st = g.lock();
            Provider::record_failed_increase(
                &mut st,
                &refused_error(text),
                Vec::new(),
                placeholders.clone(),
            );
        };
        if let Err(r) = check_scale(&snap.snap, &request, &self.alert_scaling()) {
            return refuse(r.to_string());
        }
        tracing::info!(group = %label, to = new_size, "sending the queued scale-up");
        let kind = OpKind::Increase {
            from: snap.snap.size,
            to: new_size,
            vms_before: snap.snap.workers().map(|v| v.id.clone()).collect(),
            placeholders: placeholders.clone(),
        };
        if let Err(status) = self.submit(gi, request, kind, None).await {
            refuse(status.message().to_string());
        }
    }

    /// Fetches the cluster without the adoption step (used while holding the op lock).
    pub(crate) async fn fetch_cluster_only(
        &self,
        gi: usize,
    ) -> Result<(), crate::cloudstack::CsError> {
        let id = self.inner.groups[gi].read().cluster_id.clone();
        let Some(id) = id else { return Ok(()) };
        match self.inner.cs.get_cluster(&id).await? {
            Some(c) => {
                self.install_snapshot(gi, c);
                Ok(())
            }
            None => Err(crate::cloudstack::CsError::Malformed {
                command: "listKubernetesClusters".into(),
                detail: format!("cluster {id} is no longer listed"),
            }),
        }
    }

    /// After a snapshot: settles a submission whose answer was lost, and adopts a scale job
    /// this provider did not start, so nothing is sent twice and the target stays right.
    pub(crate) async fn after_snapshot(&self, gi: usize) {
        let g = &self.inner.groups[gi];
        let (scaling, unconfirmed, idle, cluster_id) = {
            let st = g.read();
            let scaling = st
                .snap
                .as_ref()
                .is_some_and(|s| s.snap.state == ClusterState::Scaling);
            let unconfirmed = st.op.as_ref().is_some_and(|o| o.job_id.is_none());
            (scaling, unconfirmed, st.op.is_none(), st.cluster_id.clone())
        };
        let Some(cluster_id) = cluster_id else { return };
        if !scaling {
            if unconfirmed {
                let mut st = g.lock();
                let age = st
                    .op
                    .as_ref()
                    .map(|o| o.started.elapsed())
                    .unwrap_or_default();
                // A request given up on may still be on its way to CloudStack (or queued
                // there): only once it is older than the longest a request may take, plus a
                // moment for the job to start, does a cluster not Scaling mean it never came.
                let settle = self.inner.cs.request_timeout()
                    + self
                        .inner
                        .settings
                        .job_poll_interval
                        .max(Duration::from_secs(1));
                if age > settle {
                    tracing::warn!(group = %cluster_id, "the scale request whose answer was lost did not become a job; forgetting it");
                    st.op = None;
                    // Increases queued behind it go out now, as after any other operation.
                    // In a task of its own: the caller may hold the op lock.
                    if st.queued_increase > 0 {
                        let p = self.clone();
                        tokio::spawn(async move {
                            let _ops = p.inner.groups[gi].op_lock.lock().await;
                            p.send_queued(gi).await;
                        });
                    }
                }
            }
            return;
        }
        if !(idle || unconfirmed) {
            return;
        }
        let job_id = match self.find_running_scale_job(&cluster_id).await {
            Ok(Some(id)) => id,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "listAsyncJobs failed; cannot adopt the running scale job yet");
                return;
            }
        };
        {
            let mut st = g.lock();
            match st.op.as_mut() {
                Some(op) if op.job_id.is_none() => {
                    tracing::info!(group = %cluster_id, job = %job_id, "the scale request whose answer was lost became a job; following it");
                    op.job_id = Some(job_id.clone());
                }
                None => {
                    tracing::info!(group = %cluster_id, job = %job_id, "adopting a running scale job this provider did not start");
                    st.op = Some(Op {
                        job_id: Some(job_id.clone()),
                        kind: OpKind::Adopted,
                        started: Instant::now(),
                    });
                }
                Some(_) => return,
            }
        }
        self.spawn_follower(gi, job_id);
    }

    /// The running `scaleKubernetesCluster` job of a cluster, read from `listAsyncJobs` one
    /// page at a time and only as far back as such a job can have started: CloudStack ends a
    /// scale job after its scale timeout (1 h by default), and this provider follows one for
    /// `job_max_follow` (2 h by default) before polling it rarely, so older jobs cannot matter.
    /// CloudStack keeps finished jobs for a day and lists them oldest first, so without
    /// `startdate` every check would read the account's whole day of jobs.
    ///
    /// `startdate` is the only place the provider reads the wall clock; it goes back an extra
    /// [`ADOPTION_CLOCK_SLACK`] so a clock a little ahead of CloudStack's still finds the job.
    async fn find_running_scale_job(
        &self,
        cluster_id: &str,
    ) -> Result<Option<String>, crate::cloudstack::CsError> {
        let window = self.inner.settings.job_max_follow + ADOPTION_CLOCK_SLACK;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let startdate = cloudstack_date(now.saturating_sub(window.as_secs()));
        for page in 1..=ADOPTION_MAX_PAGES {
            let (jobs, more) = self.inner.cs.list_async_jobs_page(&startdate, page).await?;
            if let Some(job) = jobs.into_iter().find(|j| j.is_running_scale_of(cluster_id)) {
                return Ok(Some(job.jobid));
            }
            if !more {
                return Ok(None);
            }
        }
        tracing::warn!(
            cluster = cluster_id,
            pages = ADOPTION_MAX_PAGES,
            "no running scale job found in the first pages of listAsyncJobs since {startdate}; not reading further"
        );
        Ok(None)
    }
}

/// How far before the follow limit a job search looks, for clock differences with CloudStack.
const ADOPTION_CLOCK_SLACK: Duration = Duration::from_secs(15 * 60);

/// A safety net on the pages one job search reads (each of `DEFAULT_PAGE_SIZE` jobs): the
/// `startdate` window bounds them already, unless the account starts thousands of jobs an hour.
const ADOPTION_MAX_PAGES: u32 = 20;

/// Whether a failed job changed the cluster: a scale-up that created worker VMs (or moved
/// `size`), a removal that took VMs. A job CloudStack refused while validating it changed
/// nothing.
pub(crate) fn job_changed_cluster(kind: &OpKind, snap: &ClusterSnapshot) -> bool {
    match kind {
        OpKind::Increase {
            from, vms_before, ..
        } => snap.size != *from || snap.workers().any(|v| !vms_before.contains(&v.id)),
        OpKind::Remove { from, vm_ids } => {
            snap.size != *from
                || vm_ids
                    .iter()
                    .any(|id| snap.vm(id).is_none_or(|v| v.state.is_gone()))
        }
        OpKind::Adopted => true,
    }
}

fn op_kind_label(kind: &OpKind) -> &'static str {
    match kind {
        OpKind::Increase { .. } => "scale_up",
        OpKind::Remove { .. } => "remove_nodes",
        OpKind::Adopted => "adopted",
    }
}
