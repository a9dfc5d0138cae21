//! The scale RPCs: IncreaseSize, DeleteNodes, DecreaseTargetSize. Each validates against
//! the latest snapshot, applies the CKS rules, sends at most one `scaleKubernetesCluster`
//! (size only, or nodeids only) and returns within the request's deadline without waiting
//! for the job. All-or-nothing: a refused request changes nothing.

use super::{FailedInstance, Indexed, Op, OpKind, Provider, cs_status};
use crate::cloudstack::CsError;
use crate::domain::cluster::NodeRole;
use crate::domain::nodeid::FAKE_NODE_REASON_ANNOTATION;
use crate::domain::rules::{ScaleRequest, check_scale};
use crate::domain::status::{ErrorClass, InstanceError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::timeout_at;
use tonic::Status;

/// Time kept back from the caller's deadline for the answer to travel back.
const DEADLINE_MARGIN: Duration = Duration::from_millis(300);

/// A node named in NodeGroupDeleteNodes.
#[derive(Debug, Clone, Default)]
pub struct NodeRef {
    pub provider_id: String,
    pub name: String,
    pub annotations: HashMap<String, String>,
}

/// CloudStack's refusal of a request because the cluster is in Alert (pre-Alert-scaling
/// CloudStack, cloudstack-api.md §4 rule 7).
pub(crate) fn is_alert_refusal(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("in alert state and can not be scaled")
}

/// IncreaseSize may not take the target above the group's maximum.
fn check_max(label: &str, target: u32, delta: u32, max: u32) -> Result<(), Status> {
    let wanted = u64::from(target) + u64::from(delta);
    if wanted > u64::from(max) {
        return Err(Status::out_of_range(format!(
            "node group {label}: target size {target} + {delta} = {wanted} exceeds the maximum {max}"
        )));
    }
    Ok(())
}

/// `deadline` less the margin the answer needs to travel back (never in the past).
pub(crate) fn before(deadline: Instant) -> tokio::time::Instant {
    let now = Instant::now();
    let d = deadline
        .checked_sub(DEADLINE_MARGIN)
        .unwrap_or(now)
        .max(now);
    tokio::time::Instant::from_std(d)
}

impl Provider {
    async fn lock_ops<'a>(
        &'a self,
        gi: usize,
        deadline: Instant,
    ) -> Result<tokio::sync::MutexGuard<'a, ()>, Status> {
        timeout_at(before(deadline), self.inner.groups[gi].op_lock.lock())
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "node group {}: another scale request for this cluster is being submitted to CloudStack; retry",
                    self.group_label(gi)
                ))
            })
    }

    /// A snapshot fresh from CloudStack, or the cached one when CloudStack cannot answer in
    /// time and the cached one is within the staleness bound.
    async fn fresh_snapshot(&self, gi: usize, deadline: Instant) -> Result<Arc<Indexed>, Status> {
        let fetched = timeout_at(before(deadline), self.fetch_group(gi)).await;
        let cached = self.inner.groups[gi].read().snap.clone();
        let stale = self.inner.settings.staleness_bound;
        match fetched {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => match cached {
                Some(c) if c.fetched_at.elapsed() < stale && e.is_transient() => {
                    tracing::warn!(error = %e, "using the cached snapshot: CloudStack did not answer");
                    Ok(c)
                }
                _ => Err(cs_status(&e)),
            },
            Err(_) => match cached {
                Some(c) if c.fetched_at.elapsed() < stale => Ok(c),
                _ => Err(Status::unavailable(format!(
                    "node group {}: CloudStack did not answer listKubernetesClusters within the request's deadline",
                    self.group_label(gi)
                ))),
            },
        }
    }

    fn refusal_status(&self, gi: usize, r: &crate::domain::rules::Refusal) -> Status {
        tracing::info!(group = %self.group_label(gi), rule = r.rule(), "scale request refused: {r}");
        Status::failed_precondition(r.to_string())
    }

    /// NodeGroupIncreaseSize.
    pub async fn increase_size(
        &self,
        id: &str,
        delta: i32,
        deadline: Instant,
    ) -> Result<(), Status> {
        if delta <= 0 {
            return Err(Status::invalid_argument(format!(
                "delta must be positive, got {delta}"
            )));
        }
        let (gi, g) = self.group(id)?;
        let _ops = self.lock_ops(gi, deadline).await?;
        let label = self.group_label(gi);
        let delta_u = delta.unsigned_abs();
        {
            let mut st = g.lock();
            let target = st.target().ok_or_else(|| {
                Status::unavailable(format!("node group {label}: no CloudStack snapshot yet"))
            })?;
            let (_, max) = st.min_max(&g.spec);
            check_max(&label, target, delta_u, max)?;
            if let Some(op) = &st.op {
                if op.job_id.is_none() {
                    return Err(Status::failed_precondition(format!(
                        "node group {label}: CloudStack's answer to the previous scale request was lost; \
                         nothing more is sent until the next refresh shows whether it was accepted"
                    )));
                }
                // Merged into the next request once the running job ends.
                st.queued_increase += delta_u;
                for _ in 0..delta_u {
                    let pid = self.next_placeholder_id(&mut st);
                    st.queued_placeholders.push(pid);
                }
                tracing::info!(group = %label, delta, queued = st.queued_increase,
                    "scale-up queued behind the running scale job; it is sent when that job ends");
                return Ok(());
            }
        }
        let snap = self.fresh_snapshot(gi, deadline).await?;
        let (from, new_size) = {
            let st = g.read();
            if let Some(op) = &st.op {
                return Err(Status::failed_precondition(format!(
                    "node group {label}: cluster {} is {} with a scale job this provider did not start (job {}); retry when it ends",
                    snap.snap.name,
                    snap.snap.state,
                    op.job_id.as_deref().unwrap_or("unknown")
                )));
            }
            let target = st.target().unwrap_or(snap.snap.size);
            let (_, max) = st.min_max(&g.spec);
            check_max(&label, target, delta_u, max)?;
            (snap.snap.size, snap.snap.size + delta_u)
        };
        let request = ScaleRequest::Resize { new_size };
        if let Err(r) = check_scale(&snap.snap, &request, &self.alert_scaling()) {
            return Err(self.refusal_status(gi, &r));
        }
        let placeholders = {
            let mut st = g.lock();
            (0..delta_u)
                .map(|_| self.next_placeholder_id(&mut st))
                .collect()
        };
        let kind = OpKind::Increase {
            from,
            to: new_size,
            vms_before: snap.snap.workers().map(|v| v.id.clone()).collect(),
            placeholders,
        };
        tracing::info!(group = %label, from, to = new_size, "scale-up: sending scaleKubernetesCluster size={new_size}");
        self.submit(gi, request, kind, Some(deadline)).await
    }

    pub(crate) fn next_placeholder_id(&self, st: &mut super::GroupState) -> String {
        st.next_placeholder += 1;
        format!(
            "cks-placeholder://{}/{}",
            st.cluster_id.as_deref().unwrap_or("unknown"),
            st.next_placeholder
        )
    }

    /// Sends the request, records the operation, watches the job for an immediate refusal
    /// while the deadline allows, then leaves it to a follower.
    pub(crate) async fn submit(
        &self,
        gi: usize,
        request: ScaleRequest,
        kind: OpKind,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let g = &self.inner.groups[gi];
        let label = self.group_label(gi);
        let cluster_id = g.read().cluster_id.clone().ok_or_else(|| {
            Status::unavailable(format!("node group {label}: cluster id not resolved yet"))
        })?;
        g.lock().op = Some(Op {
            job_id: None,
            kind,
            started: Instant::now(),
        });
        let cs = &self.inner.cs;
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
                return Err(Status::unavailable(format!(
                    "node group {label}: CloudStack did not answer scaleKubernetesCluster within the request's deadline; \
                     it may still accept it, so nothing more is sent for this cluster until the next refresh tells"
                )));
            }
            Ok(Err(e @ (CsError::Unreachable { .. } | CsError::Malformed { .. }))) => {
                // The request may have reached CloudStack (a dropped connection, a garbled
                // answer): keep it as "answer lost" so nothing more is sent until a refresh
                // shows whether it became a job. (An HTTP error page means a proxy answered
                // instead of CloudStack.)
                tracing::warn!(group = %label, error = %e, "scaleKubernetesCluster answer lost; the next refresh tells whether CloudStack accepted it");
                return Err(Status::unavailable(format!(
                    "node group {label}: {e}; CloudStack may still have accepted the request, so nothing more \
                     is sent for this cluster until the next refresh tells"
                )));
            }
            Ok(Err(e)) => {
                g.lock().op = None;
                tracing::warn!(group = %label, error = %e, "scaleKubernetesCluster refused");
                return Err(cs_status(&e));
            }
            Ok(Ok(job)) => job,
        };
        if let Some(op) = g.lock().op.as_mut() {
            op.job_id = Some(job_id.clone());
        }
        tracing::info!(group = %label, job = %job_id, "scale job accepted by CloudStack");
        if let Some(d) = deadline {
            let until = tokio::time::Instant::now() + self.inner.settings.scale_watch;
            let until = until.min(before(d));
            let step = Duration::from_millis(100).max(
                self.inner
                    .settings
                    .job_poll_interval
                    .min(Duration::from_millis(400)),
            );
            loop {
                if tokio::time::Instant::now() + step >= until {
                    break;
                }
                tokio::time::sleep(step).await;
                let Ok(Ok(job)) = timeout_at(until, cs.query_job(&job_id)).await else {
                    break;
                };
                use crate::cloudstack::types::JobOutcome;
                match job.outcome() {
                    JobOutcome::Pending => {}
                    JobOutcome::Succeeded(_) => break,
                    JobOutcome::Failed {
                        errortext,
                        errorcode,
                    } => {
                        return self
                            .failed_in_watch(gi, &job_id, errorcode, errortext, false, d)
                            .await;
                    }
                    JobOutcome::Cancelled => {
                        let text = "the job was cancelled".to_string();
                        return self.failed_in_watch(gi, &job_id, 0, text, true, d).await;
                    }
                }
            }
        }
        self.spawn_follower(gi, job_id);
        Ok(())
    }

    /// A job that failed while its scale RPC still watched it. CloudStack validates inside the
    /// job, so a failure this early is usually a refusal: nothing was created, and the RPC
    /// fails with CloudStack's text, leaving the group as it was. A job that already changed
    /// the cluster (VMs created, then one failed) is settled exactly as the follower settles
    /// it: its VMs, and the ones it never created, become failed instances that count in the
    /// target.
    ///
    /// Such a scale-up answers OK. The autoscaler then records the scale-up request, sees the
    /// failed instances (Creating with an error) as failed creations of that request, backs
    /// the group off with their error class and code, and deletes them. An error instead
    /// would back the group off as a generic `cloudProviderError` with no scale-up request,
    /// so the failed instances would count against nothing, the VMs CloudStack left behind
    /// would look like unrequested nodes, and the autoscaler could ask for more on top of
    /// them once the backoff ends. A removal that failed part-way still fails the RPC: the
    /// autoscaler keeps the nodes CloudStack did not remove.
    async fn failed_in_watch(
        &self,
        gi: usize,
        job_id: &str,
        code: i64,
        text: String,
        cancelled: bool,
        deadline: Instant,
    ) -> Result<(), Status> {
        let g = &self.inner.groups[gi];
        let label = self.group_label(gi);
        let fetched = matches!(
            timeout_at(before(deadline), self.fetch_cluster_only(gi)).await,
            Ok(Ok(()))
        );
        // Unsure whether it created anything (CloudStack did not answer in time): treat it as
        // a failed scale-up, which at worst reports placeholders the autoscaler deletes.
        let changed = {
            let st = g.read();
            match (&st.op, &st.snap) {
                (Some(op), Some(s)) if fetched => {
                    super::follow::job_changed_cluster(&op.kind, &s.snap)
                }
                _ => true,
            }
        };
        if !changed {
            g.lock().op = None;
            if cancelled {
                return Err(Status::aborted(format!(
                    "node group {label}: CloudStack cancelled scale job {job_id}"
                )));
            }
            return Err(self.job_refusal(gi, job_id, code, &text));
        }
        match self.settle_job(gi, job_id, Some(&(code, text.clone())), fetched) {
            Some(OpKind::Increase { from, to, .. }) => {
                tracing::warn!(group = %label, job = job_id, from, to,
                    "the scale-up failed part-way while IncreaseSize watched it; its instances are reported as failed creations");
                Ok(())
            }
            _ => Err(Status::failed_precondition(format!(
                "node group {label}: CloudStack scale job {job_id} failed (code {code}): {text}"
            ))),
        }
    }

    /// The status for a job CloudStack failed at once (it validates inside the job).
    fn job_refusal(&self, gi: usize, job_id: &str, code: i64, text: &str) -> Status {
        let label = self.group_label(gi);
        let in_alert = self.inner.groups[gi]
            .read()
            .snap
            .as_ref()
            .is_some_and(|s| s.snap.state == crate::domain::cluster::ClusterState::Alert);
        if is_alert_refusal(text) && in_alert {
            self.set_alert_unsupported(text);
            return Status::failed_precondition(format!(
                "node group {label}: CloudStack refused the scale request (job {job_id}, code {code}): {text}. \
                 This CloudStack does not scale clusters in Alert (it predates the Alert-scaling change): \
                 start the down VM so the cluster returns to Running, or upgrade CloudStack"
            ));
        }
        tracing::info!(group = %label, job = job_id, code, "CloudStack refused the scale request: {text}");
        Status::failed_precondition(format!(
            "node group {label}: CloudStack refused the scale request (job {job_id}, code {code}): {text}"
        ))
    }

    /// NodeGroupDeleteNodes.
    pub async fn delete_nodes(
        &self,
        id: &str,
        nodes: Vec<NodeRef>,
        deadline: Instant,
    ) -> Result<(), Status> {
        if nodes.is_empty() {
            return Err(Status::invalid_argument("no nodes to delete were given"));
        }
        let (gi, g) = self.group(id)?;
        let _ops = self.lock_ops(gi, deadline).await?;
        let label = self.group_label(gi);
        let plan = self.plan_delete(gi, &label, &nodes)?;
        if plan.vms.is_empty() {
            self.apply_local_drops(gi, &plan);
            return Ok(());
        }
        if let Some(op) = &g.read().op {
            return Err(Status::failed_precondition(format!(
                "node group {label}: a scale job is running ({}); CloudStack runs one scale operation per cluster at a time, retry when it ends",
                describe(&op.kind, op.job_id.as_deref())
            )));
        }
        let snap = self.fresh_snapshot(gi, deadline).await?;
        // VMs that vanished meanwhile are already gone: nothing to send for them.
        let vm_ids: Vec<String> = plan
            .vms
            .iter()
            .filter(|v| {
                snap.by_id
                    .get(*v)
                    .is_some_and(|&i| !snap.snap.vms[i].state.is_gone())
            })
            .cloned()
            .collect();
        if vm_ids.is_empty() {
            self.apply_local_drops(gi, &plan);
            return Ok(());
        }
        let request = ScaleRequest::RemoveNodes {
            vm_ids: vm_ids.clone(),
        };
        if let Err(r) = check_scale(&snap.snap, &request, &self.alert_scaling()) {
            return Err(self.refusal_status(gi, &r));
        }
        if g.read().op.is_some() {
            return Err(Status::failed_precondition(format!(
                "node group {label}: cluster {} is {} with a scale job this provider did not start; retry when it ends",
                snap.snap.name, snap.snap.state
            )));
        }
        let names: Vec<String> = vm_ids
            .iter()
            .filter_map(|v| {
                snap.snap
                    .vm(v)
                    .map(|vm| format!("{} ({})", vm.name, vm.state))
            })
            .collect();
        tracing::info!(group = %label, vms = %names.join(", "), "scale-down: sending scaleKubernetesCluster nodeids");
        // Keys under which a later DeleteNodes may name these VMs once they are gone.
        let removed_keys: Vec<String> = vm_ids
            .iter()
            .cloned()
            .chain(
                vm_ids
                    .iter()
                    .filter_map(|v| snap.snap.vm(v).map(|vm| vm.name.to_ascii_lowercase())),
            )
            .collect();
        let kind = OpKind::Remove {
            from: snap.snap.size,
            vm_ids,
        };
        self.submit(gi, request, kind, Some(deadline)).await?;
        // CloudStack destroys the VMs one by one while the job runs, so a VM can leave the
        // listing long before the job ends and its follower records it as removed. A
        // DeleteNodes naming it in that window (a second autoscaler replica, a node list that
        // lags) must be a no-op, not NotFound. Recording the VMs as soon as CloudStack accepted
        // the job is safe: a VM still listed (the job failed) resolves as a VM first.
        {
            let mut st = g.lock();
            let now = Instant::now();
            for key in removed_keys {
                st.recently_removed.insert(key, now);
            }
        }
        self.apply_local_drops(gi, &plan);
        Ok(())
    }

    fn plan_delete(&self, gi: usize, label: &str, nodes: &[NodeRef]) -> Result<DeletePlan, Status> {
        let g = &self.inner.groups[gi];
        let st = g.read();
        let Some(s) = st.snap.clone() else {
            return Err(Status::unavailable(format!(
                "node group {label}: no CloudStack snapshot yet"
            )));
        };
        let mut plan = DeletePlan::default();
        let mut seen = HashSet::new();
        let mut counted = 0u32;
        for n in nodes {
            let shown = if n.name.is_empty() {
                &n.provider_id
            } else {
                &n.name
            };
            let reason = n
                .annotations
                .get(FAKE_NODE_REASON_ANNOTATION)
                .map(String::as_str);
            let Some(hit) = st.resolve(&n.provider_id, &n.name) else {
                let gone = crate::domain::nodeid::vm_id_from_provider_id(&n.provider_id)
                    .is_some_and(|id| st.recently_removed.contains_key(id))
                    || (!n.name.is_empty()
                        && st
                            .recently_removed
                            .contains_key(&n.name.to_ascii_lowercase()));
                if gone {
                    // Already removed by this provider: deleting it again is done.
                    continue;
                }
                return Err(Status::not_found(format!(
                    "node {shown} (providerID {:?}) is not a worker VM of node group {label}; nothing was deleted",
                    n.provider_id
                )));
            };
            match hit {
                super::view::Hit::Vm(i) => {
                    let vm = &s.snap.vms[i];
                    if vm.role != NodeRole::Worker {
                        return Err(Status::failed_precondition(format!(
                            "node {shown} is the {} VM {} of cluster {}; this provider never removes control, etcd or external nodes; nothing was deleted",
                            vm.role.as_str(),
                            vm.name,
                            s.snap.name
                        )));
                    }
                    if reason == Some("unregistered")
                        && let Some(l) = st.learned.get(&vm.id)
                    {
                        tracing::error!(vm = %vm.name, node = %l.node_name, provider_id = %l.provider_id,
                                "refusing to delete a VM as unregistered: its Kubernetes node is registered under another providerID");
                        return Err(Status::failed_precondition(format!(
                            "refusing to delete VM {} as unregistered: its node {} is registered (providerID {:?}); \
                                 the autoscaler matched instance {} to no node because the providerIDs differ; nothing was deleted",
                            vm.name, l.node_name, l.provider_id, n.provider_id
                        )));
                    }
                    let removing = st.op.as_ref().is_some_and(|op| {
                        matches!(&op.kind, OpKind::Remove { vm_ids, .. } if vm_ids.contains(&vm.id))
                    });
                    if removing || vm.state.is_gone() || !seen.insert(vm.id.clone()) {
                        continue;
                    }
                    let failed_vm = st.failed.iter().any(|f| f.vm_id.as_deref() == Some(&vm.id));
                    if reason != Some("create-error") && !failed_vm {
                        counted += 1;
                    }
                    plan.vms.push(vm.id.clone());
                }
                super::view::Hit::FailedPlaceholder(id) => {
                    if seen.insert(id.clone()) {
                        plan.failed.push(id);
                    }
                }
                super::view::Hit::Pending(id) => {
                    if st.queued_placeholders.contains(&id) {
                        if seen.insert(id.clone()) {
                            plan.queued.push(id);
                        }
                    } else {
                        return Err(Status::failed_precondition(format!(
                            "instance {id} is being created by a running CloudStack job, which cannot be cancelled; \
                             delete its VM once it exists; nothing was deleted"
                        )));
                    }
                }
            }
        }
        if counted > 0 {
            let target = st.target().unwrap_or(s.snap.size);
            let (min, _) = st.min_max(&g.spec);
            let removed = counted + (plan.failed.len() + plan.queued.len()) as u32;
            if target.saturating_sub(removed) < min {
                return Err(Status::failed_precondition(format!(
                    "node group {label}: deleting {removed} node(s) would take the target size from {target} below the minimum {min}; nothing was deleted"
                )));
            }
        }
        Ok(plan)
    }

    fn apply_local_drops(&self, gi: usize, plan: &DeletePlan) {
        let mut st = self.inner.groups[gi].lock();
        st.failed.retain(|f| {
            !plan.failed.contains(&f.id) && !f.vm_id.as_ref().is_some_and(|v| plan.vms.contains(v))
        });
        let before = st.queued_placeholders.len();
        st.queued_placeholders.retain(|p| !plan.queued.contains(p));
        let dropped = (before - st.queued_placeholders.len()) as u32;
        st.queued_increase = st.queued_increase.saturating_sub(dropped);
    }

    /// NodeGroupDecreaseTargetSize: cancels only requested nodes that do not exist and will
    /// not be created (queued requests, failed scale-up placeholders).
    pub async fn decrease_target_size(
        &self,
        id: &str,
        delta: i32,
        deadline: Instant,
    ) -> Result<(), Status> {
        if delta >= 0 {
            return Err(Status::invalid_argument(format!(
                "delta must be negative, got {delta}"
            )));
        }
        let (gi, g) = self.group(id)?;
        let _ops = self.lock_ops(gi, deadline).await?;
        let label = self.group_label(gi);
        let n = delta.unsigned_abs();
        let mut st = g.lock();
        let failed_placeholders = st.failed.iter().filter(|f| f.vm_id.is_none()).count() as u32;
        let cancellable = st.queued_increase + failed_placeholders;
        if n > cancellable {
            let in_flight = match &st.op {
                Some(op) => format!(
                    "; {} cannot be cancelled",
                    describe(&op.kind, op.job_id.as_deref())
                ),
                None => String::new(),
            };
            return Err(Status::failed_precondition(format!(
                "node group {label}: decreasing the target by {n} would delete existing or already requested VMs: \
                 only {cancellable} requested node(s) can be cancelled ({} queued, {failed_placeholders} from a failed scale-up){in_flight}",
                st.queued_increase
            )));
        }
        let mut left = n;
        while left > 0 && st.queued_increase > 0 {
            st.queued_increase -= 1;
            st.queued_placeholders.pop();
            left -= 1;
        }
        while left > 0 {
            if let Some(pos) = st.failed.iter().rposition(|f| f.vm_id.is_none()) {
                st.failed.remove(pos);
            }
            left -= 1;
        }
        tracing::info!(group = %label, delta, "target size decreased (requests cancelled)");
        Ok(())
    }

    /// Records the instances of a failed scale-up so the autoscaler sees them as failed
    /// creations (and deletes them, backing the group off).
    pub(crate) fn record_failed_increase(
        st: &mut super::GroupState,
        error: &InstanceError,
        new_vm_ids: Vec<String>,
        placeholders: Vec<String>,
    ) {
        let now = Instant::now();
        for vm in new_vm_ids {
            let id = st.instance_id(&vm);
            st.failed.push(FailedInstance {
                id,
                vm_id: Some(vm),
                error: error.clone(),
                since: now,
            });
        }
        for p in placeholders {
            st.failed.push(FailedInstance {
                id: p,
                vm_id: None,
                error: error.clone(),
                since: now,
            });
        }
    }
}

/// Queued requests refused when their turn came become failed instances too.
pub(crate) fn refused_error(text: String) -> InstanceError {
    InstanceError {
        code: "scale-up-refused".into(),
        message: text,
        class: ErrorClass::Other,
    }
}

pub(crate) fn describe(kind: &OpKind, job: Option<&str>) -> String {
    let job = job.unwrap_or("answer lost");
    match kind {
        OpKind::Increase { from, to, .. } => format!("scale-up {from}->{to}, job {job}"),
        OpKind::Remove { vm_ids, .. } => format!("removal of {} VM(s), job {job}", vm_ids.len()),
        OpKind::Adopted => format!("scale job {job} started elsewhere"),
    }
}

#[derive(Debug, Default)]
struct DeletePlan {
    vms: Vec<String>,
    failed: Vec<String>,
    queued: Vec<String>,
}
