//! Async jobs: creation, completion, and the tasks that carry out accepted scale requests and
//! VM start/stop. Each step takes the world lock briefly and releases it before sleeping.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::Shared;
use super::access::NO_PERMISSION;
use super::accounts::Caller;
use super::clock::{format_stamp, now_stamp};
use super::config::{JobFailure, SimSettings};
use super::model::{
    ClusterState, Job, JobKind, JobResult, JobStatus, NetworkKind, VmRole, VmState, World,
};
use super::render;
use super::rules::{self, ScalePlan, ScaleRequest, SizePlan};

/// CloudStack's INTERNAL_ERROR, the code of every failed scale job.
pub const INTERNAL_ERROR: u32 = 530;

/// Registers a new in-progress job of `submitter` and returns its id.
pub fn new_job(w: &mut World, kind: JobKind, instance_id: &str, submitter: &Caller) -> String {
    if kind == JobKind::StopVm {
        w.note_stop(instance_id);
    }
    let id = w.ids.uuid();
    if kind.instance_type().is_some() {
        w.pending_vm_jobs
            .insert(instance_id.to_string(), id.clone());
    }
    w.jobs.insert(
        id.clone(),
        Job {
            id: id.clone(),
            kind,
            instance_id: instance_id.to_string(),
            submitter: submitter.clone(),
            created: now_stamp(),
            completed: None,
            status: JobStatus::InProgress,
            result_code: 0,
            result: None,
        },
    );
    w.job_order.push(id.clone());
    id
}

/// Adds `count` scale jobs of `cluster_id` created at `created_unix` (seconds), ordered before
/// every existing job (CloudStack orders jobs by id, and these are older): succeeded ones, or,
/// with `running`, ones still pending (another client's jobs that never end here).
pub fn add_past_jobs(
    w: &mut World,
    cluster_id: &str,
    count: usize,
    created_unix: u64,
    running: bool,
) {
    let created = format_stamp(created_unix);
    let result = cluster_result(w, cluster_id);
    let submitter = w.key_caller();
    let (status, completed, result) = if running {
        (JobStatus::InProgress, None, None)
    } else {
        (JobStatus::Succeeded, Some(created.clone()), Some(result))
    };
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        let id = w.ids.uuid();
        w.jobs.insert(
            id.clone(),
            Job {
                id: id.clone(),
                kind: JobKind::ScaleCluster,
                instance_id: cluster_id.to_string(),
                submitter: submitter.clone(),
                created: created.clone(),
                completed: completed.clone(),
                status,
                result_code: 0,
                result: result.clone(),
            },
        );
        ids.push(id);
    }
    w.job_order.splice(0..0, ids);
}

/// A VM job has ended: the VM no longer shows it.
fn vm_job_ended(w: &mut World, job_id: &str) {
    if let Some(j) = w.jobs.get(job_id)
        && w.pending_vm_jobs.get(&j.instance_id) == Some(&j.id)
    {
        let vm = j.instance_id.clone();
        w.pending_vm_jobs.remove(&vm);
    }
}

/// Marks a job succeeded with `result` as its `jobresult`.
pub fn succeed(w: &mut World, job_id: &str, result: JobResult) {
    vm_job_ended(w, job_id);
    if let Some(j) = w.jobs.get_mut(job_id) {
        j.status = JobStatus::Succeeded;
        j.result_code = 0;
        j.result = Some(result);
        j.completed = Some(now_stamp());
    }
}

/// Marks a job failed with CloudStack's `{errorcode, errortext}` result.
pub fn fail(w: &mut World, job_id: &str, code: u32, text: &str) {
    tracing::debug!(job = job_id, code, text, "job failed");
    vm_job_ended(w, job_id);
    if let Some(j) = w.jobs.get_mut(job_id) {
        j.status = JobStatus::Failed;
        j.result_code = code;
        j.result = Some(JobResult::Json(
            json!({ "errorcode": code, "errortext": text }),
        ));
        j.completed = Some(now_stamp());
    }
}

/// `{"kubernetescluster": {...}}` for a cluster as it is now (null if it is gone).
pub fn cluster_result(w: &World, cluster_id: &str) -> JobResult {
    match w.cluster(cluster_id) {
        Some(c) => JobResult::Cluster(Box::new(c.clone())),
        None => JobResult::Json(serde_json::Value::Null),
    }
}

/// Sleeps `d`, or returns `false` at once if the simulator shuts down.
async fn pause(sh: &Shared, d: Duration) -> bool {
    let mut rx = sh.shutdown.subscribe();
    if *rx.borrow() {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = rx.changed() => false,
    }
}

/// Changes cores/memory as CloudStack's size scaling records them: the worker type's previous
/// capacity is replaced by the *cluster* offering times the new size (a known CloudStack quirk).
fn record_size(w: &mut World, cluster_id: &str, new_size: u64) {
    let Some(c) = w.cluster(cluster_id) else {
        return;
    };
    let prev = w
        .offering(c.existing_offering_for(VmRole::Worker))
        .map(|o| (o.cpu, o.memory))
        .unwrap_or((0, 0));
    let cur = w
        .offering(&c.offering_id)
        .map(|o| (o.cpu, o.memory))
        .unwrap_or((0, 0));
    let old_size = c.size;
    if let Some(c) = w.cluster_mut(cluster_id) {
        c.cores = (c.cores + cur.0 * new_size).saturating_sub(prev.0 * old_size);
        c.memory = (c.memory + cur.1 * new_size).saturating_sub(prev.1 * old_size);
        c.size = new_size;
    }
}

fn apply_offerings(w: &mut World, cluster_id: &str, plan: &ScalePlan) {
    for (role, new_id) in &plan.offerings {
        let Some(c) = w.cluster(cluster_id) else {
            return;
        };
        let count = match role {
            VmRole::Control => c.control_count,
            VmRole::Etcd => c.etcd_count,
            _ => c.size,
        };
        let prev = w
            .offering(c.existing_offering_for(*role))
            .map(|o| (o.cpu, o.memory))
            .unwrap_or((0, 0));
        let new = w
            .offering(new_id)
            .map(|o| (o.cpu, o.memory))
            .unwrap_or((0, 0));
        let Some(c) = w.cluster_mut(cluster_id) else {
            return;
        };
        for vm in c
            .vms
            .iter_mut()
            .filter(|v| v.role == *role || (*role == VmRole::Worker && v.role == VmRole::External))
        {
            if vm.role == *role {
                vm.offering_id = new_id.clone();
            }
        }
        c.cores = (c.cores + new.0 * count).saturating_sub(prev.0 * count);
        c.memory = (c.memory + new.1 * count).saturating_sub(prev.1 * count);
        match role {
            VmRole::Control => c.control_offering_id = Some(new_id.clone()),
            VmRole::Etcd => c.etcd_offering_id = Some(new_id.clone()),
            _ => c.worker_offering_id = Some(new_id.clone()),
        }
    }
    if let Some(o) = &plan.cluster_offering
        && let Some(c) = w.cluster_mut(cluster_id)
    {
        c.offering_id = o.clone();
    }
}

/// A worker picks up scale job `job_id`: CloudStack's `ScaleKubernetesClusterCmd.execute`
/// calls `KubernetesClusterManagerImpl.scaleKubernetesCluster`, which validates the request
/// against the cluster as it is now (`validateKubernetesClusterScaleParameters`); the scale
/// worker (`KubernetesClusterScaleWorker.scaleCluster`) runs its own checks (capacity plan,
/// VM count) and then moves Running or Alert to Scaling. A refusal fails the job (530) and
/// changes nothing. Returns what the job goes on to do, or `None` when it has ended here
/// (refused, or nothing to wait for). Called under the world lock, so the check and the move
/// to Scaling are one step: of two jobs picked up together, the second finds Scaling.
pub fn start_scale(
    w: &mut World,
    job_id: &str,
    req: &ScaleRequest,
) -> Option<(ScalePlan, SimSettings)> {
    let cluster_id = req.cluster_id.as_str();
    let Some(c) = w.cluster(cluster_id) else {
        fail(w, job_id, INTERNAL_ERROR, "Invalid Kubernetes cluster ID");
        return None;
    };
    // The caller's right to operate on the cluster is checked inside the job, before the
    // request's own validation: a role allowing only `list*`
    // (`errors_13_perm_bob_listonly_scale_job_final`), another account's cluster
    // (`errors_17_perm_alice_scale_other_account_cluster_job_final`).
    let allowed = w.jobs.get(job_id).is_none_or(|j| {
        j.submitter.role.may_scale() && w.can_operate(&j.submitter, &w.ownership(c))
    });
    if !allowed {
        fail(w, job_id, INTERNAL_ERROR, NO_PERMISSION);
        return None;
    }
    let checked = rules::validate(w, c, req).and_then(|plan| {
        rules::pre_transition_checks(w, c, &plan, w.settings.job_failure).map(|()| plan)
    });
    let plan = match checked {
        Ok(plan) => plan,
        Err(text) => {
            fail(w, job_id, INTERNAL_ERROR, &text);
            return None;
        }
    };
    if w.settings.size_job_returns_early && req.is_size_only() && plan.offerings.is_empty() {
        // The stored worker's loop returns at CONTROL (see `size_job_returns_early`).
        let result = cluster_result(w, cluster_id);
        succeed(w, job_id, result);
        return None;
    }
    if let SizePlan::Record { new_size } = plan.size
        && let Some(c) = w.cluster_mut(cluster_id)
    {
        c.size = new_size;
    }
    if plan.is_noop() || matches!(plan.size, SizePlan::Record { .. }) {
        let result = cluster_result(w, cluster_id);
        succeed(w, job_id, result);
        return None;
    }
    if let Some(c) = w.cluster_mut(cluster_id)
        && matches!(c.state, ClusterState::Running | ClusterState::Alert)
    {
        c.state = ClusterState::Scaling;
    }
    Some((plan, w.settings.clone()))
}

/// A queued scale job (`SimSettings::pickup_delay` > 0): after `delay` a worker picks it up
/// ([`start_scale`]) and, if it passes, runs it. Until then the job is in progress and the
/// cluster keeps its state and size. The delay stands for CloudStack's async job executor
/// taking the job from its queue (`AsyncJobManagerImpl`); its real length is not documented
/// and depends on the management server's load (*unverified*).
pub async fn run_pickup(sh: Arc<Shared>, job_id: String, req: ScaleRequest, delay: Duration) {
    if !pause(&sh, delay).await {
        return;
    }
    let started = start_scale(&mut sh.lock(), &job_id, &req);
    if let Some((plan, settings)) = started {
        run_scale(sh, job_id, req.cluster_id, plan, settings).await;
    }
}

/// Carries out an accepted scale job; the cluster is already in Scaling (or Created/Stopped).
pub async fn run_scale(
    sh: Arc<Shared>,
    job_id: String,
    cluster_id: String,
    plan: ScalePlan,
    s: SimSettings,
) {
    let started = tokio::time::Instant::now();
    let outcome = scale_steps(&sh, &cluster_id, &plan, &s, started).await;
    let Some(outcome) = outcome else { return }; // shut down mid-job
    let mut w = sh.lock();
    let in_scaling = w
        .cluster(&cluster_id)
        .is_some_and(|c| c.state == ClusterState::Scaling);
    match outcome {
        Ok(()) => {
            if in_scaling && let Some(c) = w.cluster_mut(&cluster_id) {
                c.state = ClusterState::Running;
            }
            let result = cluster_result(&w, &cluster_id);
            succeed(&mut w, &job_id, result);
        }
        Err(text) => {
            if in_scaling && let Some(c) = w.cluster_mut(&cluster_id) {
                c.state = ClusterState::Alert;
            }
            fail(&mut w, &job_id, INTERNAL_ERROR, &text);
        }
    }
}

/// The job's steps. `None` when the simulator shut down; `Some(Err)` with CloudStack's text
/// when the job fails.
async fn scale_steps(
    sh: &Shared,
    cid: &str,
    plan: &ScalePlan,
    s: &SimSettings,
    started: tokio::time::Instant,
) -> Option<Result<(), String>> {
    let name = sh
        .lock()
        .cluster(cid)
        .map(|c| c.name.clone())
        .unwrap_or_default();
    if !plan.offerings.is_empty() || plan.cluster_offering.is_some() {
        if plan.size == SizePlan::None && !pause(sh, s.job_duration).await {
            return None;
        }
        apply_offerings(&mut sh.lock(), cid, plan);
    }
    if let Some((enabled, min, max)) = plan.autoscale {
        if !pause(sh, s.job_duration).await {
            return None;
        }
        let mut w = sh.lock();
        if let Some(c) = w.cluster_mut(cid) {
            c.autoscaling = enabled;
            c.min_size = min;
            c.max_size = max;
        }
        return Some(Ok(()));
    }
    match &plan.size {
        SizePlan::None | SizePlan::Record { .. } => Some(Ok(())),
        SizePlan::Up { new_size, add } => {
            scale_up(sh, cid, &name, *new_size, *add, s, started).await
        }
        SizePlan::Down { new_size, remove } => {
            scale_down(sh, cid, &name, *new_size, remove, s, started).await
        }
    }
}

async fn scale_up(
    sh: &Shared,
    cid: &str,
    name: &str,
    new_size: u64,
    add: u64,
    s: &SimSettings,
    started: tokio::time::Instant,
) -> Option<Result<(), String>> {
    let new_vms: Vec<String> = {
        let mut w = sh.lock();
        let now = sh.clock.now_ms();
        let Some(ci) = w.clusters.iter().position(|c| c.id == cid) else {
            return Some(Err(format!(
                "Scaling failed for Kubernetes cluster : {name}, cluster not found"
            )));
        };
        let vms: Vec<String> = (0..add)
            .map(|_| w.new_vm(ci, VmRole::Worker, VmState::Starting, now))
            .collect();
        w.provisioning.extend(vms.iter().cloned());
        vms
    };
    let outcome = provision(sh, cid, name, new_size, &new_vms, s, started).await;
    let mut w = sh.lock();
    for id in &new_vms {
        w.provisioning.remove(id);
    }
    outcome
}

/// Starts the VMs a scale-up created and waits for their nodes, as
/// `KubernetesClusterScaleWorker.scaleUpKubernetesClusterSize` does.
async fn provision(
    sh: &Shared,
    cid: &str,
    name: &str,
    new_size: u64,
    new_vms: &[String],
    s: &SimSettings,
    started: tokio::time::Instant,
) -> Option<Result<(), String>> {
    if !pause(sh, s.job_duration / 2).await {
        return None;
    }
    {
        let mut w = sh.lock();
        let now = sh.clock.now_ms();
        let partial = s.job_failure == JobFailure::Partial;
        for (i, id) in new_vms.iter().enumerate() {
            if partial && i + 1 == new_vms.len() {
                w.set_vm_state(id, VmState::Error, now);
            } else {
                w.set_vm_running(id, now);
            }
        }
        if partial {
            return Some(Err(format!(
                "Scaling failed for Kubernetes cluster : {name}, unable to provision node VM in the cluster"
            )));
        }
        // apache/cloudstack#12633 (open; reported on 4.22, the code path is 4.21's too): once
        // the new VMs run, `scaleUpKubernetesClusterSize` rewrites the SSH firewall range and
        // port forwards for the cluster's VMs with the external nodes among them, which fails
        // on an isolated network; the job fails "unable to update network rules" (the caller
        // moves the cluster to Alert), the new VMs stay, the size is not raised
        // (`setNodeCount` comes after).
        let external = w.cluster(cid).is_some_and(|c| {
            c.network == NetworkKind::Isolated && c.vms.iter().any(|v| v.role == VmRole::External)
        });
        if external {
            return Some(Err(format!(
                "Scaling failed for Kubernetes cluster : {name}, unable to update network rules"
            )));
        }
    }
    if s.job_failure == JobFailure::Never {
        loop {
            if !pause(sh, Duration::from_secs(3600)).await {
                return None;
            }
        }
    }
    let earliest = started + s.job_duration;
    let deadline = started + s.scale_timeout;
    loop {
        let ready = {
            let mut w = sh.lock();
            let now = sh.clock.now_ms();
            w.refresh_nodes(now);
            match w.cluster(cid) {
                None => {
                    return Some(Err(format!(
                        "Scaling failed for Kubernetes cluster : {name}, cluster not found"
                    )));
                }
                Some(c) => c
                    .vms
                    .iter()
                    .filter(|v| v.role.is_kubernetes_node())
                    .all(|v| {
                        let must_be_ready =
                            !s.alert_scaling || !v.state.is_down() || new_vms.contains(&v.id);
                        !must_be_ready || w.node_counted_ready(v, now)
                    }),
            }
        };
        let now = tokio::time::Instant::now();
        if ready && now >= earliest {
            break;
        }
        if now >= deadline {
            return Some(Err(format!(
                "Scaling unsuccessful for Kubernetes cluster : {name} as it does not have desired number of nodes in ready state"
            )));
        }
        let wait = if ready {
            earliest - now
        } else {
            s.ready_poll.min(deadline - now)
        };
        if !pause(sh, wait).await {
            return None;
        }
    }
    record_size(&mut sh.lock(), cid, new_size);
    Some(Ok(()))
}

/// Removes `remove` (already in CloudStack's order) one VM at a time, as
/// `KubernetesClusterScaleWorker.scaleDownKubernetesClusterSize` hands them to
/// `removeNodesFromCluster`: for each VM, `removeKubernetesClusterNode` drains its node and
/// deletes it (`kubectl drain <host> --ignore-daemonsets --delete-emptydir-data`, then
/// `kubectl delete node`), then the VM is destroyed and expunged and its VM-map row removed
/// (`kubernetesClusterVmMapDao.expunge`), then the scale timeout is checked. A failure ends
/// the job there (the caller moves the cluster to Alert): the VMs removed so far stay removed
/// and `size`, written only at the end (`updateKubernetesClusterEntryForNodeType`), is unchanged.
async fn scale_down(
    sh: &Shared,
    cid: &str,
    name: &str,
    new_size: u64,
    remove: &[String],
    s: &SimSettings,
    started: tokio::time::Instant,
) -> Option<Result<(), String>> {
    let step = if s.removal_per_node.is_zero() {
        s.job_duration / (remove.len().max(1) as u32)
    } else {
        // The job's own part (start, state change, reaching the control node), then each
        // node in turn.
        if !pause(sh, s.job_duration).await {
            return None;
        }
        s.removal_per_node
    };
    // Each VM's time: the drain, the destroy, the expunge.
    let (drain, destroy) = (step / 3, step / 3);
    let expunge = step.saturating_sub(drain + destroy);
    for id in remove {
        let failure = {
            let mut w = sh.lock();
            let now = sh.clock.now_ms();
            w.refresh_nodes(now);
            let Some(state) = w.find_vm(id).map(|(_, vm)| vm.state) else {
                continue;
            };
            drain_node(&mut w, id, state, name, s, now)
        };
        if !pause(sh, drain).await {
            return None;
        }
        if let Some(text) = failure {
            return Some(Err(text));
        }
        // `kubectl delete node`, then `UserVmService.destroyVm(id, expunge=true)`.
        if let Some(vm) = sh.lock().find_vm_mut(id) {
            vm.node_registered_ms = None;
            vm.kubelet_gone = true;
            vm.state = VmState::Expunging;
        }
        if !pause(sh, destroy).await {
            return None;
        }
        sh.lock().set_vm_state(id, VmState::Destroyed, 0);
        if !pause(sh, expunge).await {
            return None;
        }
        {
            let mut w = sh.lock();
            if let Some(c) = w.cluster_mut(cid) {
                c.vms.retain(|v| &v.id != id);
            }
            w.removed_vms.insert(id.clone());
        }
        if started.elapsed() > s.scale_timeout {
            return Some(Err(format!(
                "Scaling Kubernetes cluster {name} failed, scaling action timed out"
            )));
        }
    }
    record_size(&mut sh.lock(), cid, new_size);
    Some(Ok(()))
}

/// The drain of VM `id`'s node before it is removed; `Some(text)` when it fails.
///
/// With Alert scaling on (PR 14604), a down VM's node is not drained: it is deleted directly.
/// Every other VM is drained (`KubernetesClusterScaleWorker.removeKubernetesClusterNode`), and
/// `kubectl drain` fails when the node does not exist (a kubelet that never joined: NotFound),
/// when it is NotReady (the evicted pods' deletion is never confirmed; the drain times out),
/// and for an injected transient failure (`SimSettings::fail_drains`). The drain cordons an
/// existing node first and a failed drain leaves it cordoned. CloudStack retries the SSH
/// call only on an exception, not on a failed `kubectl drain`, so a failure fails the job.
fn drain_node(
    w: &mut World,
    id: &str,
    state: VmState,
    cluster_name: &str,
    s: &SimSettings,
    now: u64,
) -> Option<String> {
    let (ci, vm) = w.find_vm(id)?;
    if !vm.role.is_kubernetes_node() || (s.alert_scaling && state.is_down()) {
        return None;
    }
    let exists = vm.node_registered_ms.is_some();
    let ready = w.node_ready(vm, now);
    // The shape of `recorded/running_35_scale_down_nodeids_query_final`: the cluster and the VM
    // as their `toString()` prints them, the VM with its state when the drain ran (a stopped
    // VM's drain fails on a CloudStack without Alert scaling, and its text says "Stopped").
    // The numeric ids are positions here; a real CloudStack's are database ids.
    let cluster_id = w
        .clusters
        .get(ci)
        .map(|c| c.id.as_str())
        .unwrap_or_default();
    let vm_number = w
        .clusters
        .get(ci)
        .and_then(|c| c.vms.iter().position(|v| v.id == id))
        .map_or(0, |p| p + 1);
    let text = format!(
        "Scaling failed for Kubernetes cluster KubernetesCluster {{\"id\":{},\"name\":\"{cluster_name}\",\"uuid\":\"{cluster_id}\"}}, failed to remove Kubernetes node: {} running on VM : VM instance {{\"id\":{vm_number},\"instanceName\":\"i-2-{vm_number}-VM\",\"state\":\"{}\",\"type\":\"User\",\"uuid\":\"{}\"}}",
        ci + 1,
        vm.node_name(),
        state.as_str(),
        vm.id
    );
    if exists && let Some(vm) = w.find_vm_mut(id) {
        vm.cordoned = true;
    }
    let injected = w.settings.fail_drains > 0;
    if injected {
        w.settings.fail_drains -= 1;
    }
    (!exists || !ready || injected).then_some(text)
}

/// Carries out `startVirtualMachine` (`start`) or `stopVirtualMachine`.
pub async fn run_vm_op(sh: Arc<Shared>, job_id: String, vm_id: String, start: bool, d: Duration) {
    if !pause(&sh, d).await {
        return;
    }
    let mut w = sh.lock();
    let now = sh.clock.now_ms();
    let state = w.find_vm(&vm_id).map(|(_, v)| v.state);
    match state {
        Some(VmState::Starting) if start => {
            w.set_vm_running(&vm_id, now);
        }
        Some(VmState::Stopping) if !start => {
            w.set_vm_state(&vm_id, VmState::Stopped, now);
        }
        Some(_) => {}
        None => {
            fail(
                &mut w,
                &job_id,
                INTERNAL_ERROR,
                &format!("Unable to find VM with ID {vm_id}"),
            );
            return;
        }
    }
    let result = vm_result(&w, &vm_id);
    succeed(&mut w, &job_id, result);
}

/// `{"virtualmachine": {...}}` for a VM.
pub fn vm_result(w: &World, vm_id: &str) -> JobResult {
    JobResult::Json(vm_json(w, vm_id))
}

/// `{"virtualmachine": {...}}` for a VM, as JSON.
pub fn vm_json(w: &World, vm_id: &str) -> serde_json::Value {
    let Some((ci, vm)) = w.find_vm(vm_id) else {
        return serde_json::Value::Null;
    };
    let c = &w.clusters[ci];
    match w.zone(&c.zone_id).or(w.zones.first()) {
        Some(z) => {
            json!({ "virtualmachine": serde_json::to_value(render::vm(w, c, z, vm)).unwrap_or_default() })
        }
        None => serde_json::Value::Null,
    }
}
