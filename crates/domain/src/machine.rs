//! The life of a cluster's scale operations, as one state machine per CKS cluster: every rule
//! about when a `scaleKubernetesCluster` may be sent, what is queued behind it, what its end
//! leaves behind (failed instances, removed VMs) and what the autoscaler is told meanwhile
//! (the target size) lives here.
//!
//! No I/O, no clock, no lock: the provider (`crate::provider`) feeds events in — a scale
//! request, a submission answered / refused / lost, a job found or finished, a new snapshot —
//! with the time it observed, and carries out the [`Effect`]s a transition returns (send this
//! request, follow this job, look for the running job, poll now). The target size and node
//! resolution, which its decisions use, are here too; what only the autoscaler's answers need
//! (instances and their status, the debug line) is derived in `crate::instances`.
//!
//! # Phases
//! | phase | meaning | leaves it |
//! |---|---|---|
//! | `Idle` | nothing in flight | a request is admitted (→ `Submitting`), a running job is found (→ `Adopted`) |
//! | `Submitting` | a request is on its way to CloudStack | answered (→ `Running`), refused (→ `Idle`), answer lost (→ `AnswerLost`) |
//! | `AnswerLost` | CloudStack may or may not have accepted it | the job is found (→ `Running`), a snapshot long enough after shows no Scaling (→ `Idle`) |
//! | `Running` | a job this provider started | it finishes (→ `Idle`), Cleanup (→ `Idle`, re-adopted later) |
//! | `Adopted` | a scale job started elsewhere (restart, Cleanup, another user) | it finishes, Cleanup (→ `Idle`) |
//!
//! Work arriving while a request or job is in flight is kept as data ([`Queue`]) and turned
//! into the next request when the phase returns to `Idle`; nothing else starts a submission,
//! so at most one scale job per cluster is started by this provider at a time.

use super::cluster::{ClusterState, IndexedSnapshot, NodeRole};
use super::nodeid::{FAKE_NODE_REASON_ANNOTATION, default_provider_id, vm_id_from_provider_id};
use super::registry::Registrations;
use super::removal::{Candidate, MAX_REMOVAL_ATTEMPTS, StopStage, pick_batch, retry_delay};
use super::rules::{AlertScaling, Refusal, ScaleRequest, check_scale};
use super::status::{ErrorClass, InstanceError, scale_up_failure};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a removed VM's id and name are remembered, so a repeated DeleteNodes for it is a
/// no-op rather than NotFound.
const REMOVED_MEMORY: Duration = Duration::from_secs(3600);

/// Durations the machine's decisions depend on (from the provider's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long instances of a failed scale-up are reported before they are forgotten.
    pub failed_ttl: Duration,
    /// How long after a submission whose answer was lost a cluster not in Scaling means the
    /// request never became a job: the longest a request may take to reach CloudStack plus a
    /// moment for its job to start.
    pub lost_settle: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            failed_ttl: Duration::from_secs(30 * 60),
            lost_settle: Duration::from_secs(32),
        }
    }
}

/// What a scale operation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Increase {
        from: u32,
        to: u32,
        /// Worker VMs that existed before the job: the others are the job's.
        vms_before: HashSet<String>,
        /// Instance ids shown for requested VMs CloudStack has not listed yet.
        placeholders: Vec<String>,
    },
    Remove {
        from: u32,
        vm_ids: Vec<String>,
        /// Lower-cased names of those VMs, under which a later DeleteNodes may name them.
        names: Vec<String>,
        /// The owed removals sent (their attempts and history), put back in the queue when
        /// the job leaves their VMs.
        sent: Vec<QueuedRemoval>,
    },
}

impl OpKind {
    /// The request this operation sent.
    pub fn request(&self) -> ScaleRequest {
        match self {
            OpKind::Increase { to, .. } => ScaleRequest::Resize { new_size: *to },
            OpKind::Remove { vm_ids, .. } => ScaleRequest::RemoveNodes {
                vm_ids: vm_ids.clone(),
            },
        }
    }
}

/// Where a request came from: a scale RPC (whose caller hears about a refusal) or the queue
/// (whose refusal becomes failed instances, the only way the autoscaler can hear of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Rpc,
    Queue,
}

/// A scale operation this provider submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub kind: OpKind,
    pub origin: Origin,
}

/// The phase of a cluster's scale operations (see the module's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Submitting {
        op: Op,
        since: Instant,
    },
    AnswerLost {
        op: Op,
        /// When the lost submission was started.
        since: Instant,
    },
    Running {
        op: Op,
        job: String,
        since: Instant,
    },
    Adopted {
        /// The job, when `listAsyncJobs` could tell which it is. Real scale jobs name no
        /// instance (no `jobinstanceid`), so with several clusters scaling at once it may not
        /// be known: the job's end is then seen when the cluster leaves Scaling.
        job: Option<String>,
        since: Instant,
    },
}

impl Phase {
    /// The operation this provider has in flight, if any.
    pub fn op(&self) -> Option<&Op> {
        match self {
            Phase::Submitting { op, .. }
            | Phase::AnswerLost { op, .. }
            | Phase::Running { op, .. } => Some(op),
            Phase::Idle | Phase::Adopted { .. } => None,
        }
    }

    /// The job being followed, if any.
    pub fn job(&self) -> Option<&str> {
        match self {
            Phase::Running { job, .. } | Phase::Adopted { job: Some(job), .. } => Some(job),
            _ => None,
        }
    }

    /// A short name, for logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Submitting { .. } => "submitting",
            Phase::AnswerLost { .. } => "answer-lost",
            Phase::Running { .. } => "running",
            Phase::Adopted { .. } => "adopted",
        }
    }

    /// One line for an operator: what is in flight.
    pub fn describe(&self) -> Option<String> {
        let job = match self {
            Phase::Idle => return None,
            Phase::Submitting { .. } => "being submitted".to_string(),
            Phase::AnswerLost { .. } => "answer lost, checking".to_string(),
            Phase::Running { job, .. } => format!("job {job}"),
            Phase::Adopted { job: Some(job), .. } => {
                return Some(format!("scale job {job} started elsewhere"));
            }
            Phase::Adopted { job: None, .. } => {
                return Some(
                    "a scale job started elsewhere (which one CloudStack does not say; its end \
                     is seen when the cluster leaves Scaling)"
                        .to_string(),
                );
            }
        };
        Some(match self.op().map(|o| &o.kind) {
            Some(OpKind::Increase { from, to, .. }) => format!("scale-up {from}->{to} ({job})"),
            Some(OpKind::Remove { vm_ids, .. }) => {
                format!("removing {} VM(s) ({job})", vm_ids.len())
            }
            None => job,
        })
    }
}

/// Work accepted but not sent yet, sent when the phase returns to idle.
///
/// Increases are merged into one size request; removals into one `nodeids` request. The real
/// autoscaler deletes scale-down candidates with one NodeGroupDeleteNodes per node, in
/// parallel (`core/scaledown/actuation/actuator.go` `deleteNodesAsync` →
/// `group_deletion_scheduler.go` `ScheduleDeletion`), so removals arriving together are
/// collected in a short window ([`ScaleMachine::close_window`]) and sent as one request;
/// removals arriving while a job runs go out together when it ends.
///
/// Order when both wait: removals first, then increases. An increase is a size computed on
/// top of the VMs listed when it is sent; sent while accepted removals still wait, it would
/// take CloudStack's size past the group's maximum on the way (size + delta before the
/// removals take their nodes). So an increase arriving while removals are queued waits for
/// them too. Each request is computed from the snapshot at rest when its turn comes, so
/// neither is lost or miscounted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queue {
    /// One placeholder instance id per queued node.
    pub increase: Vec<String>,
    /// Worker VMs accepted for removal, in arrival order.
    pub remove: Vec<QueuedRemoval>,
    /// A DeleteNodes at rest opened the collection window; the removals are sent when the
    /// shell closes it ([`ScaleMachine::close_window`]), not with the next snapshot.
    pub window_open: bool,
}

/// A worker VM accepted for removal and not sent to CloudStack yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedRemoval {
    pub vm_id: String,
    /// Its name, lower-cased (a later DeleteNodes may name it so).
    pub name: String,
    pub since: Instant,
    /// Accepted into the collection window (its callers wait for the window's answer), not
    /// behind an operation in flight (its caller was answered at once).
    pub in_window: bool,
    /// Removal jobs that failed and left this VM.
    pub attempts: u32,
    /// Why it has not happened yet (a failed job, a refusal, a drain that cannot work):
    /// shown on its instance and in the logs.
    pub trouble: Option<String>,
    /// Not sent before this (the backoff after a failure or a refusal).
    pub not_before: Option<Instant>,
    /// Whether its VM must be stopped first (it runs, and its drain would fail).
    pub stop: StopStage,
    /// The next `stopVirtualMachine` not before this (after a failed one).
    pub stop_not_before: Option<Instant>,
    /// Given up after [`MAX_REMOVAL_ATTEMPTS`] failed jobs: still out of the target and
    /// reported, sent again only once its VM is down.
    pub abandoned: bool,
}

impl QueuedRemoval {
    fn new(vm_id: String, name: String, since: Instant, in_window: bool) -> Self {
        QueuedRemoval {
            vm_id,
            name,
            since,
            in_window,
            attempts: 0,
            trouble: None,
            not_before: None,
            stop: StopStage::NotNeeded,
            stop_not_before: None,
            abandoned: false,
        }
    }
}

/// The outcome of an accepted DeleteNodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Nothing needs CloudStack: every node was gone, already queued or being removed, or only
    /// placeholders were dropped.
    Done,
    /// Queued at rest, and this call opened the collection window: the shell closes it after
    /// the window ([`ScaleMachine::close_window`]).
    OpensWindow,
    /// Queued into the open window.
    JoinsWindow,
    /// Queued behind the operation in flight; sent when it ends.
    Behind,
}

/// An accepted DeleteNodes: how it was accepted, and the fake "unregistered" nodes of it
/// that were refused (a VM whose node is registered). The core's `removeOldUnregisteredNodes`
/// sends all of a group's unregistered nodes in one call; one guarded VM must not keep the
/// others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acceptance {
    pub accepted: Accepted,
    pub refused: Vec<ScaleError>,
}

/// What DecreaseTargetSize did: cancelled `cancelled` requested nodes (all it was asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decreased {
    pub cancelled: u32,
}

/// Instances a removal drops without CloudStack (they have no VM, or their VM goes with it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalDrops {
    /// Failed-instance ids (placeholders or VMs of a failed scale-up).
    pub failed: Vec<String>,
    /// Placeholders of queued increases.
    pub queued: Vec<String>,
}

/// An instance of a failed scale-up, reported as Creating with an error until the autoscaler
/// deletes it (or it expires).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedInstance {
    pub id: String,
    /// The VM CloudStack left behind, or `None` for a VM that was never created.
    pub vm_id: Option<String>,
    pub error: InstanceError,
    pub since: Instant,
}

/// A node↔VM pairing learned from NodeGroupForNode: the node the autoscaler sees for a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedNode {
    pub provider_id: String,
    pub node_name: String,
}

/// What the provider must do after a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send this request to CloudStack (the phase is `Submitting` already) and report the
    /// answer back ([`ScaleMachine::submission_answered`], `_refused`, `_lost`).
    Submit(ScaleRequest),
    /// Follow this job until it ends, then report [`ScaleMachine::job_finished`].
    Follow(String),
    /// The cluster is Scaling with no job known: look for the running scale job and report
    /// [`ScaleMachine::job_found`].
    FindJob,
    /// The snapshot suggests the followed job is over: poll it now.
    PollNow,
    /// Accepted removals that did not happen yet (their job failed and these VMs stayed, or
    /// the rules refuse them now): they stay owed, out of the target, and are sent again
    /// after `retry_in`. Tell the operator.
    RemovalRetried {
        vms: Vec<String>,
        reason: String,
        retry_in: Duration,
    },
    /// Accepted removals given up after [`MAX_REMOVAL_ATTEMPTS`] failed jobs: still out of
    /// the target (the autoscaler counts their nodes as gone), sent again only once their VM
    /// is down. Tell the operator loudly: the VMs need a hand.
    RemovalAbandoned { vms: Vec<String>, reason: String },
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    Succeeded,
    Failed { code: i64, text: String },
    Cancelled,
}

/// The end of a job as the machine settled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// `scale_up`, `remove_nodes` or `adopted` (a metric label).
    pub kind: &'static str,
    /// The operation that ended (`None` for an adopted job).
    pub op: Option<Op>,
    /// Whether the job changed the cluster (VMs created or removed, size moved). A job that
    /// failed without changing anything was refused while CloudStack validated it.
    pub changed: bool,
    /// CloudStack refused because the cluster is in Alert: it predates Alert scaling.
    pub alert_refusal: bool,
    /// Requests that follow (the queue).
    pub effects: Vec<Effect>,
    /// A removal that failed (a drain) and is carried through: its VMs stay owed, so the
    /// scale RPC that watched it answers OK.
    pub owed: bool,
}

/// The second step of a scale request, once a fresh snapshot is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Send this request (the phase is `Submitting`).
    Submit(ScaleRequest),
    /// Merged into the request sent when the operation in flight ends.
    Queued,
}

/// The first step of IncreaseSize, on the cached state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Merged into the request sent when the operation in flight ends.
    Queued,
    /// Nothing in flight: decide on a snapshot fresh from CloudStack
    /// ([`ScaleMachine::start_increase`]).
    NeedsFreshSnapshot,
}

/// A node named in NodeGroupDeleteNodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRef {
    pub provider_id: String,
    pub name: String,
    pub annotations: HashMap<String, String>,
}

/// What a DeleteNodes resolved to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeletePlan {
    /// Worker VMs to remove through CloudStack.
    pub vms: Vec<String>,
    /// Those of `vms` that run without a node: stopped first, then removed as down VMs.
    pub stops: Vec<String>,
    /// Instances dropped locally.
    pub drops: LocalDrops,
    /// Fake "unregistered" nodes refused because their VM's node is registered.
    pub guarded: Vec<ScaleError>,
}

/// Why the machine refuses a request. The provider adds the group's name; the gRPC layer
/// picks the status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleError {
    NoSnapshot,
    /// IncreaseSize past the group's maximum.
    OutOfRange {
        target: u32,
        delta: u32,
        max: u32,
    },
    /// One of CloudStack's scaling rules (Alert included) refuses it.
    Refused(Refusal),
    /// The answer to the previous request was lost; nothing is sent until it is settled.
    PreviousAnswerLost,
    /// A node of no worker VM of the group (nor of anything it remembers removing).
    UnknownNode {
        node: String,
        provider_id: String,
    },
    /// A control, etcd or external node.
    NotWorker {
        node: String,
        role: &'static str,
        vm: String,
        cluster: String,
    },
    /// A fake "unregistered" node for a VM whose real node carries another providerID.
    RegisteredElsewhere {
        vm: String,
        node: String,
        provider_id: String,
        instance: String,
    },
    /// A fake "unregistered" node for a VM whose node an autoscaler reported as registered
    /// `ago_secs` before, within the autoscaler's max-node-provision-time (`window_secs`).
    /// (Whole seconds keep the error small.)
    RecentlyRegistered {
        vm: String,
        instance: String,
        node: String,
        ago_secs: u64,
        window_secs: u64,
    },
    /// An instance a running job is creating (cannot be cancelled).
    BeingCreated {
        instance: String,
    },
    /// The removal would take the target below the minimum.
    BelowMin {
        removed: u32,
        target: u32,
        min: u32,
    },
    /// A Running VM whose node never registered (a fake node): CloudStack drains every
    /// Running VM it removes, and that drain fails, leaving the cluster in Alert. The
    /// provider cannot stop the VM first (`why`).
    DrainWouldFail {
        vm: String,
        vm_id: String,
        node: String,
        why: &'static str,
    },
    /// DecreaseTargetSize asked for more than the requests that do not exist yet.
    CannotDecrease {
        asked: u32,
        cancellable: u32,
        target: u32,
    },
}

impl fmt::Display for ScaleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaleError::NoSnapshot => write!(f, "no CloudStack snapshot yet"),
            ScaleError::OutOfRange { target, delta, max } => write!(
                f,
                "target size {target} + {delta} = {} exceeds the maximum {max}",
                u64::from(*target) + u64::from(*delta)
            ),
            ScaleError::Refused(r) => write!(f, "{r}"),
            ScaleError::PreviousAnswerLost => write!(
                f,
                "CloudStack's answer to the previous scale request was lost; nothing more is sent \
                 until the next refresh shows whether it was accepted"
            ),
            ScaleError::UnknownNode { node, provider_id } => write!(
                f,
                "node {node} (providerID {provider_id:?}) is not a worker VM of this node group; \
                 nothing was deleted"
            ),
            ScaleError::NotWorker {
                node,
                role,
                vm,
                cluster,
            } => write!(
                f,
                "node {node} is the {role} VM {vm} of cluster {cluster}; this provider never removes \
                 control, etcd or external nodes; nothing was deleted"
            ),
            ScaleError::RegisteredElsewhere {
                vm,
                node,
                provider_id,
                instance,
            } => write!(
                f,
                "refusing to delete VM {vm} as unregistered: its node {node} is registered \
                 (providerID {provider_id:?}); the autoscaler matched instance {instance} to no node \
                 because the providerIDs differ; nothing was deleted"
            ),
            ScaleError::RecentlyRegistered {
                vm,
                instance,
                node,
                ago_secs,
                window_secs,
            } => write!(
                f,
                "refusing to delete VM {vm} (instance {instance}) as unregistered: its node {node} \
                 was reported registered {ago_secs}s ago, within max-node-provision-time \
                 ({window_secs}s): the node is another autoscaler's, or left the cluster less \
                 than that long ago; nothing was deleted"
            ),
            ScaleError::BeingCreated { instance } => write!(
                f,
                "instance {instance} is being created by a running CloudStack job, which cannot be \
                 cancelled; delete its VM once it exists; nothing was deleted"
            ),
            ScaleError::BelowMin {
                removed,
                target,
                min,
            } => write!(
                f,
                "deleting {removed} node(s) would take the target size from {target} below the \
                 minimum {min}; nothing was deleted"
            ),
            ScaleError::DrainWouldFail {
                vm,
                vm_id,
                node,
                why,
            } => write!(
                f,
                "refusing to remove VM {vm} (node {node}): it is Running but its node never \
                 registered, and CloudStack drains every Running VM it removes; that drain fails \
                 and leaves the cluster in Alert. {why}. Stop the VM (stopVirtualMachine \
                 id={vm_id}); the provider then removes it as a down VM, without a drain; \
                 nothing was deleted"
            ),
            ScaleError::CannotDecrease {
                asked,
                cancellable,
                target,
            } => write!(
                f,
                "cannot decrease the target size {target} by {asked}: only {cancellable} \
                 requested node(s) do not exist yet and can be cancelled; the others are VMs \
                 (existing or being created), which DecreaseTargetSize never deletes; nothing \
                 was changed"
            ),
        }
    }
}

impl std::error::Error for ScaleError {}

/// CloudStack's refusal of a request because the cluster is in Alert (a CloudStack without
/// the Alert-scaling change, cloudstack-api.md §4 rule 7).
pub fn is_alert_refusal(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("in alert state and can not be scaled")
}

/// CloudStack's failure of a removal at a node it could not drain or delete
/// (`KubernetesClusterScaleWorker.removeNodesFromCluster`: "failed to remove Kubernetes node"),
/// as opposed to a refusal while it validated the request.
pub fn is_drain_failure(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("failed to remove kubernetes node")
}

/// The error of queued requests CloudStack (or a rule) refused when their turn came.
pub fn refused_error(text: String) -> InstanceError {
    InstanceError {
        code: "scale-up-refused".into(),
        message: text,
        class: ErrorClass::Other,
    }
}

/// One cluster's scale state: the latest snapshot, the phase, queued work, failed instances,
/// and what was learned from the autoscaler. Changed only through its transitions.
#[derive(Debug, Clone)]
pub struct ScaleMachine {
    /// The cluster's id once known (configured, or resolved from its name).
    pub cluster_id: Option<String>,
    pub(crate) snap: Option<Arc<IndexedSnapshot>>,
    pub(crate) phase: Phase,
    pub(crate) queue: Queue,
    pub(crate) failed: Vec<FailedInstance>,
    pub(crate) learned: HashMap<String, LearnedNode>,
    /// Learned providerID → VM id, for fake nodes carrying an id we reported.
    pub(crate) learned_by_provider_id: HashMap<String, String>,
    /// VMs this provider removed (id and lower-cased name → when).
    pub(crate) recently_removed: HashMap<String, Instant>,
    next_placeholder: u64,
    timings: Timings,
    /// Whether this provider may stop a VM (`stopVirtualMachine`) before removing it, as the
    /// shell last learned it (a key without the command is answered 432).
    can_stop_vms: bool,
}

impl ScaleMachine {
    /// An idle machine with no snapshot.
    pub fn new(cluster_id: Option<String>, timings: Timings) -> Self {
        ScaleMachine {
            cluster_id,
            snap: None,
            phase: Phase::Idle,
            queue: Queue::default(),
            failed: Vec::new(),
            learned: HashMap::new(),
            learned_by_provider_id: HashMap::new(),
            recently_removed: HashMap::new(),
            next_placeholder: 0,
            timings,
            can_stop_vms: true,
        }
    }

    /// What the shell knows of the key: whether `stopVirtualMachine` may be called.
    pub fn set_can_stop_vms(&mut self, yes: bool) {
        self.can_stop_vms = yes;
    }

    /// Why a Running VM without a node cannot be stopped before its removal, if it cannot:
    /// the key lacks `stopVirtualMachine`, or this CloudStack refuses scaling in Alert (where
    /// a stopped worker puts the cluster) and drains down VMs too.
    fn stop_blocked(&self, alert: &AlertScaling) -> Option<&'static str> {
        if matches!(alert, AlertScaling::Unsupported { .. }) {
            Some(
                "This CloudStack does not scale a cluster in Alert, so a stopped VM cannot be \
                 removed either; remove it by hand",
            )
        } else if !self.can_stop_vms {
            Some("The CloudStack key of this provider may not call stopVirtualMachine")
        } else {
            None
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    pub fn failed(&self) -> &[FailedInstance] {
        &self.failed
    }

    pub fn snapshot(&self) -> Option<&Arc<IndexedSnapshot>> {
        self.snap.as_ref()
    }

    fn placeholder(&mut self) -> String {
        self.next_placeholder += 1;
        format!(
            "cks-placeholder://{}/{}",
            self.cluster_id.as_deref().unwrap_or("unknown"),
            self.next_placeholder
        )
    }

    // ---- queries ------------------------------------------------------------------------

    /// The target size: every instance NodeGroupNodes lists that is not Deleting — worker VMs
    /// not gone and not being removed (queued or in a removal job), down ones included —
    /// plus the requests CloudStack has not shown yet, each listed as a placeholder
    /// (the in-flight increase's VMs not listed yet, queued increases, failed scale-up
    /// placeholders).
    ///
    /// This is the invariant that keeps the real core's `fixNodeGroupSize` from asking, loop
    /// after loop, to cancel capacity that exists (docs/decrease-target-size.md): the target
    /// never counts anything the autoscaler cannot see as an instance. External nodes (in
    /// CloudStack's `size`, not workers of the group) and VMs a job has not listed yet (an
    /// adopted job's size) are not counted either.
    pub fn target(&self) -> Option<u32> {
        let s = self.snap.as_ref()?;
        let removing = self.removing();
        let workers = s
            .snap
            .workers()
            .filter(|v| !v.state.is_gone() && !removing.contains(v.id.as_str()))
            .count();
        let placeholders =
            self.pending_count() + self.failed.iter().filter(|f| f.vm_id.is_none()).count();
        Some(u32::try_from(workers + placeholders).unwrap_or(u32::MAX))
    }

    /// VMs being removed: named by the removal in flight, or queued for the next one.
    pub fn removing(&self) -> HashSet<&str> {
        let mut out: HashSet<&str> = self.queue.remove.iter().map(|r| r.vm_id.as_str()).collect();
        if let Some(OpKind::Remove { vm_ids, .. }) = self.phase.op().map(|o| &o.kind) {
            out.extend(vm_ids.iter().map(String::as_str));
        }
        out
    }

    /// The instance id reported for a VM: the providerID its node really carries when the
    /// autoscaler showed us one, else CloudStack's CCM default.
    pub fn instance_id(&self, vm_id: &str) -> String {
        match self.learned.get(vm_id) {
            Some(l) if !l.provider_id.is_empty() => l.provider_id.clone(),
            _ => default_provider_id(vm_id),
        }
    }

    /// Placeholder ids of requested VMs CloudStack does not list yet.
    pub fn pending_placeholders(&self) -> Vec<String> {
        let mut out: Vec<String> = self.in_flight_placeholders().to_vec();
        out.extend(self.queue.increase.iter().cloned());
        out
    }

    fn pending_count(&self) -> usize {
        self.in_flight_placeholders().len() + self.queue.increase.len()
    }

    /// The in-flight increase's placeholders for VMs not listed yet.
    fn in_flight_placeholders(&self) -> &[String] {
        if let Some(s) = &self.snap
            && let Some(OpKind::Increase {
                from,
                to,
                vms_before,
                placeholders,
            }) = self.phase.op().map(|o| &o.kind)
        {
            let requested = to.saturating_sub(*from) as usize;
            let appeared = s
                .snap
                .workers()
                .filter(|v| !vms_before.contains(&v.id))
                .count();
            let missing = requested.saturating_sub(appeared).min(placeholders.len());
            return &placeholders[placeholders.len() - missing..];
        }
        &[]
    }

    /// Resolves a providerID / node name to something of this group.
    pub fn resolve(&self, provider_id: &str, name: &str) -> Option<Hit> {
        self.resolve_with(provider_id, name, &self.pending_placeholders())
    }

    /// [`ScaleMachine::resolve`] with the pending placeholders given (cached by the caller).
    pub fn resolve_with(&self, provider_id: &str, name: &str, pending: &[String]) -> Option<Hit> {
        let s = self.snap.as_ref()?;
        if !provider_id.is_empty() {
            if let Some(vm_id) = self.learned_by_provider_id.get(provider_id)
                && let Some(&i) = s.by_id.get(vm_id)
            {
                return Some(Hit::Vm(i));
            }
            if self
                .failed
                .iter()
                .any(|f| f.vm_id.is_none() && f.id == provider_id)
            {
                return Some(Hit::FailedPlaceholder(provider_id.to_string()));
            }
            if pending.iter().any(|p| p == provider_id) {
                return Some(Hit::Pending(provider_id.to_string()));
            }
            if let Some(vm_id) = vm_id_from_provider_id(provider_id)
                && let Some(&i) = s.by_id.get(vm_id)
            {
                return Some(Hit::Vm(i));
            }
            // A providerID naming something else entirely is not ours, whatever the name.
            if provider_id.contains("://") {
                return None;
            }
        }
        if !name.is_empty() {
            if let Some(&i) = s.by_name.get(&name.to_ascii_lowercase()) {
                return Some(Hit::Vm(i));
            }
            if let Some(&i) = s.by_id.get(name) {
                return Some(Hit::Vm(i));
            }
        }
        None
    }

    /// Whether [`ScaleMachine::learn`] would change anything (so the common case, a node
    /// carrying the default providerID, changes no state).
    pub fn would_learn(&self, vm_id: &str, provider_id: &str, node_name: &str) -> bool {
        if provider_id == default_provider_id(vm_id) {
            return self.learned.contains_key(vm_id);
        }
        self.learned
            .get(vm_id)
            .is_none_or(|l| l.provider_id != provider_id || l.node_name != node_name)
    }

    /// Records the node the autoscaler showed for a VM when it differs from the default.
    /// Returns true when a non-default providerID was newly learned.
    pub fn learn(&mut self, vm_id: &str, provider_id: &str, node_name: &str) -> bool {
        if provider_id == default_provider_id(vm_id) {
            if let Some(old) = self.learned.remove(vm_id) {
                self.learned_by_provider_id.remove(&old.provider_id);
            }
            return false;
        }
        let new = LearnedNode {
            provider_id: provider_id.to_string(),
            node_name: node_name.to_string(),
        };
        if self.learned.get(vm_id) == Some(&new) {
            return false;
        }
        if let Some(old) = self.learned.insert(vm_id.to_string(), new) {
            self.learned_by_provider_id.remove(&old.provider_id);
        }
        if !provider_id.is_empty() {
            self.learned_by_provider_id
                .insert(provider_id.to_string(), vm_id.to_string());
        }
        true
    }

    // ---- events -------------------------------------------------------------------------

    /// A new snapshot from CloudStack. Forgets expired failed instances and a lost submission
    /// that did not become a job, and says whether to look for a running job or poll the
    /// followed one now.
    pub fn snapshot_installed(
        &mut self,
        snap: Arc<IndexedSnapshot>,
        alert: &AlertScaling,
        now: Instant,
    ) -> Vec<Effect> {
        let scaling = snap.snap.state == ClusterState::Scaling;
        self.cluster_id = Some(snap.snap.id.clone());
        let ttl = self.timings.failed_ttl;
        self.failed.retain(|f| {
            let vm_alive = f.vm_id.as_ref().is_none_or(|id| {
                snap.by_id
                    .get(id)
                    .is_some_and(|&i| !snap.snap.vms[i].state.is_gone())
            });
            vm_alive && now.saturating_duration_since(f.since) < ttl
        });
        self.recently_removed
            .retain(|_, t| now.saturating_duration_since(*t) < REMOVED_MEMORY);
        self.snap = Some(snap);
        match &self.phase {
            Phase::Adopted { job: None, .. } if !scaling => {
                // The unidentified job is over.
                self.phase = Phase::Idle;
                self.next_from_queue(alert, now)
            }
            Phase::Running { .. } | Phase::Adopted { .. } if !scaling => vec![Effect::PollNow],
            Phase::Idle if scaling => vec![Effect::FindJob],
            Phase::AnswerLost { .. } if scaling => vec![Effect::FindJob],
            // A request given up on may still be on its way to CloudStack: only once it is
            // older than the longest a request may take can it be settled. Even then "not
            // Scaling" does not mean it never became a job: CloudStack queues the job and
            // moves the cluster to Scaling only once a worker picked it up and validated it.
            // So the job list is asked first ([`ScaleMachine::no_job_found`] settles it).
            Phase::AnswerLost { since, .. }
                if now.saturating_duration_since(*since) > self.timings.lost_settle =>
            {
                vec![Effect::FindJob]
            }
            // Work left queued by a job that ended unseen (Cleanup forgot it) goes out now.
            Phase::Idle => self.next_from_queue(alert, now),
            _ => Vec::new(),
        }
    }

    /// IncreaseSize, first step on the cached state: refuses, queues behind the operation in
    /// flight, or asks for a fresh snapshot.
    pub fn admit_increase(&mut self, delta: u32, max: u32) -> Result<Admission, ScaleError> {
        let target = self.target().ok_or(ScaleError::NoSnapshot)?;
        check_max(target, delta, max)?;
        match &self.phase {
            Phase::Idle if !self.queue.remove.is_empty() => {
                self.enqueue(delta);
                Ok(Admission::Queued)
            }
            Phase::Idle => Ok(Admission::NeedsFreshSnapshot),
            // Queued, never sent while the lost answer is unsettled: once a snapshot settles
            // it, the request is computed from what CloudStack then shows.
            Phase::Submitting { .. }
            | Phase::AnswerLost { .. }
            | Phase::Running { .. }
            | Phase::Adopted { .. } => {
                self.enqueue(delta);
                Ok(Admission::Queued)
            }
        }
    }

    /// IncreaseSize, second step on a fresh snapshot: checks the maximum and CloudStack's rules
    /// and starts the submission (or queues, when an operation started meanwhile).
    pub fn start_increase(
        &mut self,
        delta: u32,
        max: u32,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Started, ScaleError> {
        let target = self.target().ok_or(ScaleError::NoSnapshot)?;
        check_max(target, delta, max)?;
        match &self.phase {
            Phase::Idle if self.queue.remove.is_empty() => {}
            _ => {
                self.enqueue(delta);
                return Ok(Started::Queued);
            }
        }
        let snap = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
        let from = snap.snap.size;
        let request = ScaleRequest::Resize {
            new_size: from.saturating_add(delta),
        };
        check_scale(&snap.snap, &request, alert).map_err(ScaleError::Refused)?;
        let placeholders = (0..delta).map(|_| self.placeholder()).collect();
        self.begin(
            OpKind::Increase {
                from,
                to: from.saturating_add(delta),
                vms_before: snap.snap.workers().map(|v| v.id.clone()).collect(),
                placeholders,
            },
            Origin::Rpc,
            now,
        );
        Ok(Started::Submit(request))
    }

    fn enqueue(&mut self, delta: u32) {
        for _ in 0..delta {
            let p = self.placeholder();
            self.queue.increase.push(p);
        }
    }

    fn begin(&mut self, kind: OpKind, origin: Origin, now: Instant) {
        self.phase = Phase::Submitting {
            op: Op { kind, origin },
            since: now,
        };
    }

    /// DeleteNodes: resolves every node (all or nothing); checks the bounds against everything
    /// queued and in flight (the group's minimum, never the last worker, never a control, etcd
    /// or external VM, never a VM whose node is `registered` through a fake "unregistered"
    /// node) and, with the cluster at rest, CloudStack's rules for the merged request; then
    /// queues the VMs (the target drops at once) and drops placeholders locally. A refusal
    /// changes nothing. The rules are checked again when the merged request is sent (a job
    /// running now may change the cluster).
    #[cfg(test)]
    pub fn accept_removal(
        &mut self,
        nodes: &[NodeRef],
        min: u32,
        alert: &AlertScaling,
        registered: &Registrations,
        now: Instant,
    ) -> Result<Accepted, ScaleError> {
        self.accept_removals(nodes, min, alert, registered, now)
            .map(|a| a.accepted)
    }

    /// [`ScaleMachine::accept_removal`], also naming the fake "unregistered" nodes refused
    /// because their VM's node is registered (the others of the call are accepted).
    pub fn accept_removals(
        &mut self,
        nodes: &[NodeRef],
        min: u32,
        alert: &AlertScaling,
        registered: &Registrations,
        now: Instant,
    ) -> Result<Acceptance, ScaleError> {
        let mut plan = self.plan_removal(nodes, min, alert, registered, now)?;
        let refused = std::mem::take(&mut plan.guarded);
        let snap = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
        let at_rest = self.phase == Phase::Idle && snap.snap.state != ClusterState::Scaling;
        if !plan.vms.is_empty() {
            let mut merged: Vec<String> = self
                .queue
                .remove
                .iter()
                .filter(|r| r.stop == StopStage::NotNeeded && !r.abandoned)
                .map(|r| r.vm_id.clone())
                .collect();
            merged.extend(plan.vms.iter().cloned());
            let removing = self.removing();
            let live = snap.snap.workers().filter(|v| !v.state.is_gone()).count();
            let staying = snap
                .snap
                .workers()
                .filter(|v| {
                    !v.state.is_gone()
                        && !removing.contains(v.id.as_str())
                        && !plan.vms.contains(&v.id)
                })
                .count();
            if staying == 0 {
                return Err(ScaleError::Refused(Refusal::RemovesAllWorkers {
                    cluster: snap.snap.name.clone(),
                    workers: u32::try_from(live).unwrap_or(u32::MAX),
                }));
            }
            // VMs to be stopped first are checked when they are down and their turn comes.
            merged.retain(|v| !plan.stops.contains(v));
            if at_rest && !merged.is_empty() {
                check_scale(
                    &snap.snap,
                    &ScaleRequest::RemoveNodes { vm_ids: merged },
                    alert,
                )
                .map_err(ScaleError::Refused)?;
            }
        }
        self.apply_drops(&plan.drops);
        if plan.vms.is_empty() {
            return Ok(Acceptance {
                accepted: Accepted::Done,
                refused,
            });
        }
        for vm_id in plan.vms {
            let name = snap
                .snap
                .vm(&vm_id)
                .map(|v| v.name.to_ascii_lowercase())
                .unwrap_or_default();
            let mut r = QueuedRemoval::new(vm_id, name, now, at_rest);
            if plan.stops.contains(&r.vm_id) {
                r.stop = StopStage::Wanted;
            }
            self.queue.remove.push(r);
        }
        let accepted = if !at_rest {
            Accepted::Behind
        } else if self.queue.window_open {
            Accepted::JoinsWindow
        } else {
            self.queue.window_open = true;
            Accepted::OpensWindow
        };
        Ok(Acceptance { accepted, refused })
    }

    /// Resolves the nodes of a DeleteNodes (all or nothing) and checks the group's minimum.
    /// An empty `vms` means nothing needs CloudStack.
    fn plan_removal(
        &self,
        nodes: &[NodeRef],
        min: u32,
        alert: &AlertScaling,
        registered: &Registrations,
        now: Instant,
    ) -> Result<DeletePlan, ScaleError> {
        let s = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
        let removing = self.removing();
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
            let Some(hit) = self.resolve(&n.provider_id, &n.name) else {
                let gone = vm_id_from_provider_id(&n.provider_id)
                    .is_some_and(|id| self.recently_removed.contains_key(id))
                    || (!n.name.is_empty()
                        && self
                            .recently_removed
                            .contains_key(&n.name.to_ascii_lowercase()));
                // A placeholder of this group's that is no longer pending: its request was
                // fulfilled (a VM took its place) or cancelled. Either way it is gone.
                let spent_placeholder = self.cluster_id.as_ref().is_some_and(|c| {
                    n.provider_id
                        .strip_prefix("cks-placeholder://")
                        .and_then(|rest| rest.strip_prefix(c.as_str()))
                        .is_some_and(|rest| rest.starts_with('/'))
                });
                if gone || spent_placeholder {
                    // Already removed by this provider: deleting it again is done.
                    continue;
                }
                return Err(ScaleError::UnknownNode {
                    node: shown.clone(),
                    provider_id: n.provider_id.clone(),
                });
            };
            match hit {
                Hit::Vm(i) => {
                    let vm = &s.snap.vms[i];
                    if vm.role != NodeRole::Worker {
                        return Err(ScaleError::NotWorker {
                            node: shown.clone(),
                            role: vm.role.as_str(),
                            vm: vm.name.clone(),
                            cluster: s.snap.name.clone(),
                        });
                    }
                    if reason == Some("unregistered")
                        && let Some(l) = self.learned.get(&vm.id)
                    {
                        plan.guarded.push(ScaleError::RegisteredElsewhere {
                            vm: vm.name.clone(),
                            node: l.node_name.clone(),
                            provider_id: l.provider_id.clone(),
                            instance: n.provider_id.clone(),
                        });
                        continue;
                    }
                    if reason == Some("unregistered")
                        && let Some(r) = registered.recent(&vm.id, now)
                    {
                        plan.guarded.push(ScaleError::RecentlyRegistered {
                            vm: vm.name.clone(),
                            instance: shown.clone(),
                            node: r.node.clone(),
                            ago_secs: now.saturating_duration_since(r.seen).as_secs(),
                            window_secs: registered.window().as_secs(),
                        });
                        continue;
                    }
                    // Named twice, queued already or in the removal in flight: sent once.
                    if removing.contains(vm.id.as_str())
                        || vm.state.is_gone()
                        || !seen.insert(vm.id.clone())
                    {
                        continue;
                    }
                    let failed_vm = self
                        .failed
                        .iter()
                        .any(|f| f.vm_id.as_deref() == Some(&vm.id));
                    if reason != Some("create-error") && !failed_vm {
                        counted += 1;
                    }
                    // A fake node: the VM has no Kubernetes node. Running, CloudStack would
                    // drain it and fail (KubernetesClusterScaleWorker.removeKubernetesClusterNode
                    // runs `kubectl drain` for every Running VM).
                    if reason.is_some() && !vm.state.is_down() {
                        if let Some(why) = self.stop_blocked(alert) {
                            return Err(ScaleError::DrainWouldFail {
                                vm: vm.name.clone(),
                                vm_id: vm.id.clone(),
                                node: shown.clone(),
                                why,
                            });
                        }
                        plan.stops.push(vm.id.clone());
                    }
                    plan.vms.push(vm.id.clone());
                }
                Hit::FailedPlaceholder(id) => {
                    if seen.insert(id.clone()) {
                        plan.drops.failed.push(id);
                    }
                }
                Hit::Pending(id) => {
                    if !self.queue.increase.contains(&id) {
                        return Err(ScaleError::BeingCreated { instance: id });
                    }
                    if seen.insert(id.clone()) {
                        plan.drops.queued.push(id);
                    }
                }
            }
        }
        if plan.vms.is_empty()
            && plan.drops.failed.is_empty()
            && plan.drops.queued.is_empty()
            && let Some(first) = plan.guarded.first()
        {
            return Err(first.clone());
        }
        // The minimum binds removals of healthy nodes: failed creations go whatever the
        // minimum, as the core's deleteCreatedNodesWithErrors sends them. The target already
        // excludes everything queued, so the bound holds against all of it.
        if counted > 0 {
            let target = self.target().unwrap_or(s.snap.size);
            let removed =
                (plan.vms.len() + plan.drops.failed.len() + plan.drops.queued.len()) as u32;
            if target.saturating_sub(removed) < min {
                return Err(ScaleError::BelowMin {
                    removed,
                    target,
                    min,
                });
            }
        }
        Ok(plan)
    }

    /// Drops the failed placeholders and queued increases a removal names (nothing needs
    /// CloudStack for them).
    fn apply_drops(&mut self, drops: &LocalDrops) {
        self.failed.retain(|f| !drops.failed.contains(&f.id));
        self.queue.increase.retain(|p| !drops.queued.contains(p));
    }

    /// The collection window ends: the queued removals go out as one request, or wait behind
    /// an operation that started meanwhile. `Err`: the rules refuse the merged request now;
    /// its removals are dropped (the target comes back) and the error says why.
    pub fn close_window(
        &mut self,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Vec<Effect>, ScaleError> {
        if !self.queue.window_open {
            return Ok(Vec::new());
        }
        self.queue.window_open = false;
        let at_rest = self.phase == Phase::Idle
            && self
                .snap
                .as_ref()
                .is_some_and(|s| s.snap.state != ClusterState::Scaling);
        if !at_rest {
            return Ok(Vec::new());
        }
        let sent = self.next_removal(Origin::Rpc, alert, now);
        match sent {
            // Nothing to send now (VMs to stop first): increases that waited go now.
            Ok(e) if e.is_empty() => Ok(self.next_from_queue(alert, now)),
            Err(e) => {
                self.window_answered(false);
                Err(e)
            }
            // Increases that waited for the window go with the next snapshot at rest.
            other => other,
        }
    }

    /// The window's removals cannot be decided (no fresh snapshot): they are dropped, so the
    /// callers' error is the whole truth. Removals accepted behind an operation that started
    /// meanwhile (their callers were answered OK) stay queued.
    pub fn abort_window(&mut self) {
        if std::mem::take(&mut self.queue.window_open) {
            self.queue.remove.retain(|r| !r.in_window);
        }
    }

    /// The window's callers were answered: with OK its removals are owed from now on (the
    /// autoscaler keeps their nodes tainted and counts them as gone); with an error they are
    /// dropped (the autoscaler untaints the nodes and may delete them again later).
    pub fn window_answered(&mut self, ok: bool) {
        if ok {
            for r in &mut self.queue.remove {
                r.in_window = false;
            }
        } else {
            self.queue.remove.retain(|r| !r.in_window);
        }
    }

    /// The next `nodeids` request from the owed removals: VMs that vanished meanwhile are
    /// done and forgotten; of those due (not backing off, not waiting to be stopped, not
    /// abandoned unless down) the request takes what CloudStack can finish
    /// ([`pick_batch`]: one VM that needs a drain, and down VMs). `Err`: the rules refuse it
    /// now; a window's removals (`Origin::Rpc`, callers not answered yet) are then dropped by
    /// the shell's [`ScaleMachine::window_answered`]; owed ones wait and are tried again.
    fn next_removal(
        &mut self,
        origin: Origin,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Vec<Effect>, ScaleError> {
        let Some(snap) = self.snap.clone() else {
            return Ok(Vec::new());
        };
        let listed = |id: &str| {
            snap.by_id
                .get(id)
                .is_some_and(|&i| !snap.snap.vms[i].state.is_gone())
        };
        self.queue.remove.retain(|r| listed(&r.vm_id));
        let down = |id: &str| snap.snap.vm(id).is_some_and(|v| v.state.is_down());
        let mut seen = HashSet::new();
        let candidates: Vec<Candidate> = self
            .queue
            .remove
            .iter()
            .filter(|r| seen.insert(r.vm_id.as_str()))
            .filter(|r| r.not_before.is_none_or(|t| t <= now))
            .filter(|r| {
                let d = down(&r.vm_id);
                d || (r.stop == StopStage::NotNeeded && !r.abandoned)
            })
            .map(|r| Candidate {
                vm_id: &r.vm_id,
                down: down(&r.vm_id),
            })
            .collect();
        let vm_ids = pick_batch(&snap.snap, &candidates);
        if vm_ids.is_empty() {
            return Ok(Vec::new());
        }
        let request = ScaleRequest::RemoveNodes {
            vm_ids: vm_ids.clone(),
        };
        if let Err(r) = check_scale(&snap.snap, &request, alert) {
            if origin == Origin::Rpc {
                return Err(ScaleError::Refused(r));
            }
            let delay = retry_delay(1);
            for q in self
                .queue
                .remove
                .iter_mut()
                .filter(|q| vm_ids.contains(&q.vm_id))
            {
                q.trouble = Some(format!("CloudStack would refuse its removal now: {r}"));
                q.not_before = Some(now + delay);
            }
            return Ok(vec![Effect::RemovalRetried {
                vms: vm_ids.iter().map(|v| self.vm_label(v)).collect(),
                reason: r.to_string(),
                retry_in: delay,
            }]);
        }
        // The sent VMs leave the queue; a window's others stay in it, sent one request after
        // another.
        let (sent, rest) = std::mem::take(&mut self.queue.remove)
            .into_iter()
            .partition(|q| vm_ids.contains(&q.vm_id));
        self.queue.remove = rest;
        let names = vm_ids
            .iter()
            .filter_map(|v| snap.snap.vm(v).map(|vm| vm.name.to_ascii_lowercase()))
            .collect();
        self.begin(
            OpKind::Remove {
                from: snap.snap.size,
                vm_ids,
                names,
                sent,
            },
            origin,
            now,
        );
        Ok(vec![Effect::Submit(request)])
    }

    /// DecreaseTargetSize: cancels `by` requested nodes that do not exist and will not be
    /// created (queued increases, then failed scale-up placeholders), or, when there are fewer
    /// than `by`, refuses and changes nothing. After an OK the target has dropped by `by`.
    ///
    /// Existing VMs and a running job are never cancelled (cloud_provider.go:
    /// DecreaseTargetSize "doesn't permit to delete any existing node"). An OK that changed
    /// nothing would make the core's `fixNodeGroupSize` act again every loop, skipping the rest
    /// of each loop, silently; upstream's providers answer an error (docs/decrease-target-size.md).
    pub fn decrease_target(&mut self, by: u32) -> Result<Decreased, ScaleError> {
        let placeholders = self.failed.iter().filter(|f| f.vm_id.is_none()).count();
        let cancellable =
            u32::try_from(self.queue.increase.len() + placeholders).unwrap_or(u32::MAX);
        if by > cancellable {
            return Err(ScaleError::CannotDecrease {
                asked: by,
                cancellable,
                target: self.target().unwrap_or(0),
            });
        }
        let mut cancelled = 0;
        while cancelled < by && self.queue.increase.pop().is_some() {
            cancelled += 1;
        }
        while cancelled < by {
            let Some(pos) = self.failed.iter().rposition(|f| f.vm_id.is_none()) else {
                break;
            };
            self.failed.remove(pos);
            cancelled += 1;
        }
        Ok(Decreased { cancelled })
    }

    /// CloudStack accepted the submission as `job`. A removal's failed VMs stop being reported
    /// as failed creations now, and its VMs are remembered as removed: CloudStack destroys them one by one while the job runs,
    /// so a DeleteNodes naming one that already left the listing is a no-op, not NotFound (a
    /// VM still listed resolves as a VM first).
    pub fn submission_answered(&mut self, job: String, now: Instant) {
        let Some((op, since)) = self.take_submission() else {
            return;
        };
        if let OpKind::Remove { vm_ids, names, .. } = &op.kind {
            for key in vm_ids.iter().chain(names) {
                self.recently_removed.insert(key.clone(), now);
            }
            self.failed
                .retain(|f| !f.vm_id.as_ref().is_some_and(|v| vm_ids.contains(v)));
        }
        self.phase = Phase::Running { op, job, since };
    }

    /// CloudStack refused the submission outright. A queued request's refusal becomes failed
    /// instances; then the queue goes out.
    pub fn submission_refused(
        &mut self,
        text: &str,
        alert: &AlertScaling,
        now: Instant,
    ) -> Vec<Effect> {
        let Some((op, _)) = self.take_submission() else {
            return Vec::new();
        };
        let mut effects = Vec::new();
        if let (Origin::Rpc, OpKind::Remove { .. }) = (op.origin, &op.kind) {
            // The window's callers hear the refusal: none of its removals is owed.
            self.window_answered(false);
        }
        if op.origin == Origin::Queue {
            match op.kind {
                OpKind::Increase { placeholders, .. } => self.record_failed(
                    &refused_error(text.to_string()),
                    Vec::new(),
                    placeholders,
                    now,
                ),
                OpKind::Remove { sent, .. } => {
                    effects.extend(self.requeue_failed(sent, text, now));
                }
            }
        }
        effects.extend(self.next_from_queue(alert, now));
        effects
    }

    /// The submission's answer was lost (timeout, dropped connection, garbled answer):
    /// CloudStack may have accepted it, so nothing more is sent until a snapshot tells.
    pub fn submission_lost(&mut self) {
        if let Some((op, since)) = self.take_submission() {
            self.phase = Phase::AnswerLost { op, since };
        }
    }

    /// The submission in flight, leaving the phase `Idle`; `None` (phase untouched) when
    /// nothing is being submitted, so a late or repeated answer changes nothing.
    fn take_submission(&mut self) -> Option<(Op, Instant)> {
        if !matches!(self.phase, Phase::Submitting { .. }) {
            return None;
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Submitting { op, since } => Some((op, since)),
            _ => None,
        }
    }

    /// A running scale job found for the cluster: the lost submission's job, or one started
    /// elsewhere (adopted). Returns `Follow` when it is news.
    pub fn job_found(&mut self, job: String, now: Instant) -> Vec<Effect> {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::AnswerLost { op, since } => {
                self.phase = Phase::Running {
                    op,
                    job: job.clone(),
                    since,
                };
                vec![Effect::Follow(job)]
            }
            Phase::Idle => {
                self.phase = Phase::Adopted {
                    job: Some(job.clone()),
                    since: now,
                };
                vec![Effect::Follow(job)]
            }
            Phase::Adopted { job: None, since } => {
                self.phase = Phase::Adopted {
                    job: Some(job.clone()),
                    since,
                };
                vec![Effect::Follow(job)]
            }
            other => {
                self.phase = other;
                Vec::new()
            }
        }
    }

    /// The job list shows no scale job this cluster's phase could be waiting for. A lost
    /// submission older than `lost_settle`, with the cluster not Scaling, never became a job:
    /// forgotten, and the queue goes out. A cluster Scaling with no job this provider knows
    /// is adopted without a job id (its end is seen in the snapshots).
    pub fn no_job_found(&mut self, alert: &AlertScaling, now: Instant) -> Vec<Effect> {
        let scaling = self
            .snap
            .as_ref()
            .is_some_and(|s| s.snap.state == ClusterState::Scaling);
        match &self.phase {
            Phase::AnswerLost { since, .. }
                if !scaling && now.saturating_duration_since(*since) > self.timings.lost_settle =>
            {
                let lost = std::mem::replace(&mut self.phase, Phase::Idle);
                // A queued removal was owed before it was sent: still owed (a VM it removed
                // after all is left out of the next request).
                if let Phase::AnswerLost {
                    op:
                        Op {
                            kind: OpKind::Remove { sent, .. },
                            origin: Origin::Queue,
                        },
                    ..
                } = lost
                {
                    self.queue.remove.splice(0..0, sent);
                }
                self.next_from_queue(alert, now)
            }
            Phase::Idle if scaling => {
                self.phase = Phase::Adopted {
                    job: None,
                    since: now,
                };
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// The followed `job` ended. `fetched`: whether a snapshot taken after its end is
    /// installed (otherwise the outcome is judged conservatively). `watched`: the scale RPC
    /// that submitted it is still waiting and reports a pure refusal itself, so such a
    /// failure leaves nothing behind. Returns `None` when `job` is not the followed job.
    pub fn job_finished(
        &mut self,
        job: &str,
        end: &JobEnd,
        fetched: bool,
        watched: bool,
        alert: &AlertScaling,
        now: Instant,
    ) -> Option<Settled> {
        if self.phase.job() != Some(job) {
            return None;
        }
        let op = match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Running { op, .. } => Some(op),
            _ => None,
        };
        let snap = self.snap.clone();
        let changed = match (&op, &snap) {
            (Some(op), Some(s)) if fetched => op_changed_cluster(&op.kind, s),
            _ => true,
        };
        let kind = match op.as_ref().map(|o| &o.kind) {
            Some(OpKind::Increase { .. }) => "scale_up",
            Some(OpKind::Remove { .. }) => "remove_nodes",
            None => "adopted",
        };
        let mut alert_refusal = false;
        if let Some((code, text)) = end.failure() {
            // "This CloudStack cannot scale in Alert" only when the provider's own rules, on a
            // snapshot taken after the job, still allow the request: a refusal the rules
            // explain (a worker HA restarted between the check and the job: rule 7) says
            // nothing about the CloudStack version. The texts of the Alert-scaling PR's own
            // refusals are unknown and may contain the same words.
            alert_refusal = is_alert_refusal(text)
                && fetched
                && match (&snap, &op) {
                    (Some(s), Some(op)) => {
                        s.snap.state == ClusterState::Alert
                            && check_scale(&s.snap, &op.kind.request(), &AlertScaling::Supported)
                                .is_ok()
                    }
                    _ => false,
                };
            let leave_behind = changed || !watched;
            if leave_behind
                && let Some(Op {
                    kind:
                        OpKind::Increase {
                            from,
                            to,
                            vms_before,
                            placeholders,
                        },
                    ..
                }) = &op
            {
                let err = scale_up_failure(job, code, text);
                let new_vms: Vec<String> = snap
                    .as_ref()
                    .map(|s| {
                        s.snap
                            .workers()
                            .filter(|v| !vms_before.contains(&v.id) && !v.state.is_gone())
                            .map(|v| v.id.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                // Without a snapshot taken after the job, VMs may exist that we do not see:
                // report placeholders for everything requested.
                let requested = to.saturating_sub(*from) as usize;
                let missing = if fetched {
                    requested.saturating_sub(new_vms.len())
                } else {
                    requested
                };
                let ph = placeholders.iter().rev().take(missing).cloned().collect();
                self.record_failed(&err, new_vms, ph, now);
            }
        }
        let mut effects = Vec::new();
        let mut owed = false;
        if let (Some((_, text)), Some(op)) = (end.failure(), &op)
            && let OpKind::Remove { sent, .. } = &op.kind
        {
            // The VMs the failed removal left are still owed: back in the queue, out of the
            // target, sent again after a pause. Without a snapshot after the job, every one
            // may have stayed (the next request leaves out those that are gone).
            let stayed: Vec<QueuedRemoval> = sent
                .iter()
                .filter(|r| {
                    !fetched
                        || snap.as_ref().is_some_and(|s| {
                            s.snap.vm(&r.vm_id).is_some_and(|v| !v.state.is_gone())
                        })
                })
                .cloned()
                .collect();
            for r in &stayed {
                self.recently_removed.remove(&r.vm_id);
                self.recently_removed.remove(&r.name);
            }
            let reason = format!("scale job {job} failed: {text}");
            if op.origin == Origin::Rpc && watched && !is_drain_failure(text) {
                // The window's callers hear this failure: none of its removals is owed.
                self.window_answered(false);
            } else {
                // A failed drain leaves the cluster in Alert with the node cordoned and no
                // worker down, where CloudStack refuses every request: the removal is
                // carried through (the VM stopped, then removed as a down VM), never left
                // to the autoscaler, whose retry would be refused.
                owed = true;
                effects.extend(self.requeue_failed(stayed, &reason, now));
            }
        }
        effects.extend(self.next_from_queue(alert, now));
        Some(Settled {
            kind,
            op,
            changed,
            alert_refusal,
            effects,
            owed,
        })
    }

    /// Cleanup: followers stop, so the jobs they followed are forgotten; the next snapshot
    /// that shows the cluster Scaling adopts them again.
    ///
    /// Removals not sent yet are dropped: the autoscaler calls Cleanup when it exits, and the
    /// next one clears every `ToBeDeleted` taint when it starts (`cleanUpIfRequired`), so those
    /// nodes are schedulable again and must not be taken without a new DeleteNodes.
    pub fn cleanup(&mut self) {
        if matches!(self.phase, Phase::Running { .. } | Phase::Adopted { .. }) {
            self.phase = Phase::Idle;
        }
        self.queue.remove.clear();
    }

    /// Failed removals back in the queue (front, they were first), each with one more attempt,
    /// the reason, and the next try after [`retry_delay`]; abandoned after
    /// [`MAX_REMOVAL_ATTEMPTS`]. A Running VM left by the failure could not be drained: it is
    /// stopped first when the provider can, so its next removal needs no drain.
    fn requeue_failed(
        &mut self,
        stayed: Vec<QueuedRemoval>,
        reason: &str,
        now: Instant,
    ) -> Vec<Effect> {
        if stayed.is_empty() {
            return Vec::new();
        }
        let can_stop = self.can_stop_vms;
        let down = |id: &str| {
            self.snap
                .as_ref()
                .and_then(|s| s.snap.vm(id))
                .is_some_and(|v| v.state.is_down())
        };
        let mut retried = Vec::new();
        let mut abandoned = Vec::new();
        let mut delay = retry_delay(1);
        let mut requeued = Vec::with_capacity(stayed.len());
        for mut r in stayed {
            r.attempts += 1;
            r.in_window = false;
            delay = retry_delay(r.attempts);
            r.not_before = Some(now + delay);
            let mut trouble = format!("removal attempt {} failed: {reason}", r.attempts);
            if !down(&r.vm_id) {
                if can_stop && r.stop == StopStage::NotNeeded {
                    r.stop = StopStage::Wanted;
                    trouble.push_str("; the VM is stopped, then removed as a down VM (no drain)");
                } else if !can_stop {
                    trouble.push_str(&format!(
                        "; if its node is NotReady or gone the drain cannot succeed: stop the VM \
                         (stopVirtualMachine id={}) and the provider removes it as a down VM",
                        r.vm_id
                    ));
                }
            }
            if r.attempts >= MAX_REMOVAL_ATTEMPTS && !r.abandoned {
                r.abandoned = true;
                trouble = format!(
                    "removal abandoned after {} failed jobs: {reason}; the node stays cordoned; remove VM {} by hand, or stop it and the provider removes it",
                    r.attempts, r.vm_id
                );
                abandoned.push(self.vm_label(&r.vm_id));
            } else if !r.abandoned {
                retried.push(self.vm_label(&r.vm_id));
            }
            r.trouble = Some(trouble);
            requeued.push(r);
        }
        self.queue.remove.splice(0..0, requeued);
        let mut effects = Vec::new();
        if !retried.is_empty() {
            effects.push(Effect::RemovalRetried {
                vms: retried,
                reason: reason.to_string(),
                retry_in: delay,
            });
        }
        if !abandoned.is_empty() {
            effects.push(Effect::RemovalAbandoned {
                vms: abandoned,
                reason: reason.to_string(),
            });
        }
        effects
    }

    /// The removals whose VM must be stopped first and whose stop is not sent yet, marked
    /// sent: the shell calls `stopVirtualMachine` for each and reports
    /// [`ScaleMachine::stop_answered`].
    pub fn take_stops(&mut self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        for r in &mut self.queue.remove {
            if r.stop == StopStage::Wanted
                && r.stop_not_before.is_none_or(|t| t <= now)
                && !out.contains(&r.vm_id)
            {
                r.stop = StopStage::Sent;
                out.push(r.vm_id.clone());
            }
        }
        out
    }

    /// The answer to `stopVirtualMachine` for `vm_id`: `Ok` (the VM shows down in a later
    /// snapshot, and is then removed), a transient failure (tried again after a pause), or
    /// `not_permitted` (the key lacks the command: the removal waits for an operator to stop
    /// the VM; the shell stops asking).
    pub fn stop_answered(&mut self, vm_id: &str, failure: Option<(&str, bool)>, now: Instant) {
        if let Some((_, true)) = failure {
            self.can_stop_vms = false;
        }
        for r in self.queue.remove.iter_mut().filter(|r| r.vm_id == vm_id) {
            match failure {
                None => {
                    // Removed as soon as a snapshot shows it down.
                    r.not_before = None;
                    r.trouble = Some(format!(
                        "stopping VM {vm_id} before its removal (its drain would fail)"
                    ));
                }
                Some((text, true)) => {
                    r.stop = StopStage::Impossible;
                    r.trouble = Some(format!(
                        "its drain would fail and this provider may not stop it ({text}): stop \
                         the VM (stopVirtualMachine id={vm_id}) and the provider removes it as \
                         a down VM"
                    ));
                }
                Some((text, false)) => {
                    r.stop = StopStage::Wanted;
                    r.stop_not_before = Some(now + retry_delay(1));
                    r.trouble = Some(format!("stopping VM {vm_id} failed, retrying: {text}"));
                }
            }
        }
    }

    /// The queued work as the next request, when nothing is in flight and the cluster is at
    /// rest (a cluster still Scaling has a job this provider is about to find): removals
    /// first, then increases (see [`Queue`]). A request the rules refuse is not lost
    /// silently: queued removals are reported as dropped, queued increases become failed
    /// instances (their RPC answered OK long ago); then the other kind gets its turn.
    fn next_from_queue(&mut self, alert: &AlertScaling, now: Instant) -> Vec<Effect> {
        if self.phase != Phase::Idle {
            return Vec::new();
        }
        let Some(snap) = self.snap.clone() else {
            return Vec::new();
        };
        if snap.snap.state == ClusterState::Scaling {
            return Vec::new();
        }
        let mut effects = Vec::new();
        if self.queue.window_open {
            // Its removals go first, when the shell closes it.
            return effects;
        }
        if !self.queue.remove.is_empty() {
            // Owed removals never fail here: refused now, they wait and are tried again. While
            // none can go (backing off, waiting for a stop), queued increases do.
            let next = self
                .next_removal(Origin::Queue, alert, now)
                .unwrap_or_default();
            if next.iter().any(|e| matches!(e, Effect::Submit(_))) {
                return next;
            }
            effects.extend(next);
        }
        if self.queue.increase.is_empty() {
            return effects;
        }
        let placeholders = std::mem::take(&mut self.queue.increase);
        let from = snap.snap.size;
        let to = from.saturating_add(placeholders.len() as u32);
        let request = ScaleRequest::Resize { new_size: to };
        if let Err(r) = check_scale(&snap.snap, &request, alert) {
            self.record_failed(&refused_error(r.to_string()), Vec::new(), placeholders, now);
            return effects;
        }
        self.begin(
            OpKind::Increase {
                from,
                to,
                vms_before: snap.snap.workers().map(|v| v.id.clone()).collect(),
                placeholders,
            },
            Origin::Queue,
            now,
        );
        effects.push(Effect::Submit(request));
        effects
    }

    /// A VM's name as the operator knows it (its id when not listed).
    fn vm_label(&self, vm_id: &str) -> String {
        self.snap
            .as_ref()
            .and_then(|s| s.snap.vm(vm_id))
            .map_or_else(|| vm_id.to_string(), |v| v.name.clone())
    }

    /// Records the instances of a failed scale-up so the autoscaler sees them as failed
    /// creations (and deletes them, backing the group off).
    fn record_failed(
        &mut self,
        error: &InstanceError,
        vms: Vec<String>,
        placeholders: Vec<String>,
        now: Instant,
    ) {
        for vm in vms {
            let id = self.instance_id(&vm);
            self.failed.push(FailedInstance {
                id,
                vm_id: Some(vm),
                error: error.clone(),
                since: now,
            });
        }
        for p in placeholders {
            self.failed.push(FailedInstance {
                id: p,
                vm_id: None,
                error: error.clone(),
                since: now,
            });
        }
    }
}

impl JobEnd {
    /// The failure's code and text (a cancellation is a failure with code 0).
    pub fn failure(&self) -> Option<(i64, &str)> {
        match self {
            JobEnd::Succeeded => None,
            JobEnd::Failed { code, text } => Some((*code, text.as_str())),
            JobEnd::Cancelled => Some((0, "the job was cancelled")),
        }
    }
}

/// A job still running after the follow limit is polled this many times less often.
pub const OVERDUE_POLL_FACTOR: u32 = 30;

/// How long a follower waits before polling its job again: `poll`; after consecutive failed
/// polls, doubled per failure up to 32 times but never above 30 s; past `max_follow` of
/// following a job that still runs, `OVERDUE_POLL_FACTOR` times `poll`. The job stays the
/// cluster's operation past the limit: dropping it would let the target fall to CloudStack's
/// size until a Refresh adopted it again, and so on every limit.
pub fn poll_delay(
    poll: Duration,
    failed_polls: u32,
    following_for: Duration,
    max_follow: Duration,
) -> Duration {
    if failed_polls > 0 {
        return (poll * 2u32.saturating_pow(failed_polls.min(5))).min(Duration::from_secs(30));
    }
    if following_for > max_follow {
        return poll * OVERDUE_POLL_FACTOR;
    }
    poll
}

/// IncreaseSize may not take the target above the group's maximum.
fn check_max(target: u32, delta: u32, max: u32) -> Result<(), ScaleError> {
    if u64::from(target) + u64::from(delta) > u64::from(max) {
        return Err(ScaleError::OutOfRange { target, delta, max });
    }
    Ok(())
}

/// Whether an operation changed the cluster: a scale-up that created worker VMs (or moved
/// `size`), a removal that took VMs. A job CloudStack refused while validating it changed
/// nothing.
pub fn op_changed_cluster(kind: &OpKind, s: &IndexedSnapshot) -> bool {
    let snap = &s.snap;
    match kind {
        OpKind::Increase {
            from, vms_before, ..
        } => snap.size != *from || snap.workers().any(|v| !vms_before.contains(&v.id)),
        OpKind::Remove { from, vm_ids, .. } => {
            snap.size != *from
                || vm_ids
                    .iter()
                    .any(|id| snap.vm(id).is_none_or(|v| v.state.is_gone()))
        }
    }
}

/// What a node or instance id resolves to within a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hit {
    /// Index into the snapshot's VMs.
    Vm(usize),
    /// A placeholder of an in-flight or queued scale-up.
    Pending(String),
    /// An instance of a failed scale-up without a VM.
    FailedPlaceholder(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClusterInput, ClusterSnapshot, VmInput, VmState};

    const T0_SECS: u64 = 0;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    /// A cluster with one control VM and `workers` worker VMs (w1, w2, …), `size` = workers.
    fn snapshot(state: &str, workers: &[(&str, VmState)], now: Instant) -> Arc<IndexedSnapshot> {
        snapshot_sized(state, workers, workers.len() as u32, now)
    }

    fn snapshot_sized(
        state: &str,
        workers: &[(&str, VmState)],
        size: u32,
        now: Instant,
    ) -> Arc<IndexedSnapshot> {
        let mut vms = vec![VmInput {
            id: "c1".into(),
            name: "k-control-1a2b".into(),
            state: VmState::Running,
            is_external: false,
            is_etcd: false,
        }];
        for (id, st) in workers {
            vms.push(VmInput {
                id: (*id).into(),
                name: format!("k-node-{id}"),
                state: st.clone(),
                is_external: false,
                is_etcd: false,
            });
        }
        let snap = ClusterSnapshot::classify(ClusterInput {
            id: "cid".into(),
            name: "k".into(),
            state: ClusterState::parse(state),
            size,
            min_size: None,
            max_size: None,
            autoscaling_enabled: false,
            control_nodes: 1,
            etcd_nodes: 0,
            service_offering: None,
            worker_offering: None,
            zone_id: String::new(),
            zone_name: String::new(),
            externally_managed: false,
            vms,
        });
        Arc::new(IndexedSnapshot::new(snap, now))
    }

    fn running3(now: Instant) -> Arc<IndexedSnapshot> {
        snapshot(
            "Running",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
            ],
            now,
        )
    }

    const ALERT: AlertScaling = AlertScaling::Supported;
    const MAX: u32 = 10;
    /// The autoscaler's max-node-provision-time, as the deploy manifests set it.
    const PROVISION: Duration = Duration::from_secs(25 * 60);

    /// No node reported registered.
    fn no_reports() -> Registrations {
        Registrations::new(PROVISION)
    }

    fn timings() -> Timings {
        Timings {
            failed_ttl: Duration::from_secs(1800),
            lost_settle: Duration::from_secs(10),
        }
    }

    /// A machine with a Running 3-worker snapshot, driven by events into `phase`.
    fn machine_in(phase: &str, t0: Instant) -> ScaleMachine {
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        assert!(m.snapshot_installed(running3(t0), &ALERT, t0).is_empty());
        match phase {
            "idle" => {}
            "submitting" | "answer-lost" | "running" => {
                assert_eq!(m.admit_increase(2, MAX), Ok(Admission::NeedsFreshSnapshot));
                let started = m.start_increase(2, MAX, &ALERT, t0);
                assert_eq!(
                    started,
                    Ok(Started::Submit(ScaleRequest::Resize { new_size: 5 }))
                );
                match phase {
                    "answer-lost" => m.submission_lost(),
                    "running" => m.submission_answered("job-1".into(), t0),
                    _ => {}
                }
            }
            "adopted" => {
                assert_eq!(
                    m.snapshot_installed(
                        snapshot("Scaling", &[("w1", VmState::Running)], t0),
                        &ALERT,
                        t0
                    ),
                    vec![Effect::FindJob]
                );
                assert_eq!(
                    m.job_found("job-9".into(), t0),
                    vec![Effect::Follow("job-9".into())]
                );
                assert!(
                    m.snapshot_installed(running3(t0), &ALERT, t0)
                        .contains(&Effect::PollNow)
                );
            }
            other => panic!("no phase {other}"),
        }
        assert_eq!(m.phase().name(), phase);
        m
    }

    /// The events of the table, applied at `t`.
    #[derive(Debug, Clone, Copy)]
    enum Ev {
        Increase,
        Answered,
        Refused,
        Lost,
        Found,
        JobSucceeded,
        JobFailed,
        SnapRunning,
        SnapScaling,
        SnapRunningLate,
        Cleanup,
        Decrease,
        /// DeleteNodes for w1 (min 1).
        Remove,
        /// The shell closes the removal window.
        Close,
        /// The job list shows no job the phase waits for.
        NoJob,
    }

    /// Applies `ev` and returns a summary: the effects (as short names) or the error.
    fn apply(m: &mut ScaleMachine, ev: Ev, t0: Instant) -> String {
        let fx = |e: Vec<Effect>| {
            e.iter()
                .map(|e| match e {
                    Effect::Submit(ScaleRequest::Resize { new_size }) => {
                        format!("submit:{new_size}")
                    }
                    Effect::Submit(ScaleRequest::RemoveNodes { vm_ids }) => {
                        format!("remove:{}", vm_ids.join("+"))
                    }
                    Effect::Follow(j) => format!("follow:{j}"),
                    Effect::FindJob => "find".into(),
                    Effect::PollNow => "poll".into(),
                    Effect::RemovalRetried { vms, .. } => format!("retry:{}", vms.join("+")),
                    Effect::RemovalAbandoned { vms, .. } => {
                        format!("abandoned:{}", vms.join("+"))
                    }
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let job = m.phase().job().unwrap_or("job-1").to_string();
        match ev {
            Ev::Increase => match m.admit_increase(1, MAX) {
                Ok(Admission::Queued) => "queued".into(),
                Ok(Admission::NeedsFreshSnapshot) => match m.start_increase(1, MAX, &ALERT, t0) {
                    Ok(Started::Submit(ScaleRequest::Resize { new_size })) => {
                        format!("submit:{new_size}")
                    }
                    other => format!("{other:?}"),
                },
                Err(e) => format!("err:{}", err_name(&e)),
            },
            Ev::Answered => {
                m.submission_answered("job-1".into(), t0);
                String::new()
            }
            Ev::Refused => fx(m.submission_refused("no", &ALERT, t0)),
            Ev::Lost => {
                m.submission_lost();
                String::new()
            }
            Ev::Found => fx(m.job_found("job-7".into(), t0)),
            Ev::JobSucceeded => {
                match m.job_finished(&job, &JobEnd::Succeeded, true, false, &ALERT, t0) {
                    Some(s) => fx(s.effects),
                    None => "ignored".into(),
                }
            }
            Ev::JobFailed => {
                let end = JobEnd::Failed {
                    code: 530,
                    text: "boom".into(),
                };
                match m.job_finished(&job, &end, true, false, &ALERT, t0) {
                    Some(s) => fx(s.effects),
                    None => "ignored".into(),
                }
            }
            Ev::SnapRunning => fx(m.snapshot_installed(running3(t0), &ALERT, at(t0, 1))),
            Ev::SnapScaling => fx(m.snapshot_installed(
                snapshot(
                    "Scaling",
                    &[
                        ("w1", VmState::Running),
                        ("w2", VmState::Running),
                        ("w3", VmState::Running),
                    ],
                    t0,
                ),
                &ALERT,
                at(t0, 1),
            )),
            Ev::SnapRunningLate => fx(m.snapshot_installed(running3(t0), &ALERT, at(t0, 60))),
            Ev::Cleanup => {
                m.cleanup();
                String::new()
            }
            Ev::Decrease => match m.decrease_target(1) {
                Ok(d) => format!("cancelled:{}", d.cancelled),
                Err(e) => err_name(&e).into(),
            },
            Ev::Remove => {
                let node = NodeRef {
                    provider_id: "external-cloudstack://w1".into(),
                    ..NodeRef::default()
                };
                match m.accept_removal(&[node], 1, &ALERT, &no_reports(), t0) {
                    Ok(a) => format!("{a:?}").to_ascii_lowercase(),
                    Err(e) => format!("err:{}", err_name(&e)),
                }
            }
            Ev::Close => match m.close_window(&ALERT, t0) {
                Ok(e) => fx(e),
                Err(e) => format!("err:{}", err_name(&e)),
            },
            Ev::NoJob => fx(m.no_job_found(&ALERT, at(t0, 60))),
        }
    }

    fn err_name(e: &ScaleError) -> &'static str {
        match e {
            ScaleError::NoSnapshot => "no-snapshot",
            ScaleError::OutOfRange { .. } => "out-of-range",
            ScaleError::Refused(_) => "refused",
            ScaleError::PreviousAnswerLost => "answer-lost",
            ScaleError::UnknownNode { .. } => "unknown-node",
            ScaleError::DrainWouldFail { .. } => "drain-would-fail",
            ScaleError::CannotDecrease { .. } => "cannot-decrease",
            ScaleError::NotWorker { .. } => "not-worker",
            ScaleError::RegisteredElsewhere { .. } => "registered",
            ScaleError::RecentlyRegistered { .. } => "recently-registered",
            ScaleError::BeingCreated { .. } => "being-created",
            ScaleError::BelowMin { .. } => "below-min",
        }
    }

    /// Every phase against every event: (phase, event, what the event returns, phase after,
    /// target after). The machine starts with 3 Running workers; "submitting", "answer-lost"
    /// and "running" carry a scale-up 3 → 5.
    #[test]
    fn every_phase_against_every_event() {
        use Ev::*;
        #[rustfmt::skip]
        let table: &[(&str, Ev, &str, &str, u32)] = &[
            ("idle", Increase, "submit:4", "submitting", 4),
            ("idle", Answered, "", "idle", 3),
            ("idle", Refused, "", "idle", 3),
            ("idle", Lost, "", "idle", 3),
            ("idle", Found, "follow:job-7", "adopted", 3),
            ("idle", JobSucceeded, "ignored", "idle", 3),
            ("idle", JobFailed, "ignored", "idle", 3),
            ("idle", SnapRunning, "", "idle", 3),
            ("idle", SnapScaling, "find", "idle", 3),
            ("idle", SnapRunningLate, "", "idle", 3),
            ("idle", Cleanup, "", "idle", 3),
            ("idle", Decrease, "cannot-decrease", "idle", 3),
            ("idle", Remove, "openswindow", "idle", 2),
            ("idle", Close, "", "idle", 3),
            ("idle", NoJob, "", "idle", 3),

            ("submitting", Increase, "queued", "submitting", 6),
            ("submitting", Answered, "", "running", 5),
            ("submitting", Refused, "", "idle", 3),
            ("submitting", Lost, "", "answer-lost", 5),
            ("submitting", Found, "", "submitting", 5),
            ("submitting", JobSucceeded, "ignored", "submitting", 5),
            ("submitting", JobFailed, "ignored", "submitting", 5),
            ("submitting", SnapRunning, "", "submitting", 5),
            ("submitting", SnapScaling, "", "submitting", 5),
            ("submitting", SnapRunningLate, "", "submitting", 5),
            ("submitting", Cleanup, "", "submitting", 5),
            ("submitting", Decrease, "cannot-decrease", "submitting", 5),
            ("submitting", Remove, "behind", "submitting", 4),
            ("submitting", Close, "", "submitting", 5),
            ("submitting", NoJob, "", "submitting", 5),

            ("answer-lost", Increase, "queued", "answer-lost", 6),
            ("answer-lost", Answered, "", "answer-lost", 5),
            ("answer-lost", Refused, "", "answer-lost", 5),
            ("answer-lost", Lost, "", "answer-lost", 5),
            ("answer-lost", Found, "follow:job-7", "running", 5),
            ("answer-lost", JobSucceeded, "ignored", "answer-lost", 5),
            ("answer-lost", JobFailed, "ignored", "answer-lost", 5),
            // Too early to tell: the request may still reach CloudStack.
            ("answer-lost", SnapRunning, "", "answer-lost", 5),
            ("answer-lost", SnapScaling, "find", "answer-lost", 5),
            // Late enough: the job list tells whether it became a job (it may be queued, not
            // picked up yet).
            ("answer-lost", SnapRunningLate, "find", "answer-lost", 5),
            ("answer-lost", Cleanup, "", "answer-lost", 5),
            ("answer-lost", Decrease, "cannot-decrease", "answer-lost", 5),
            ("answer-lost", Remove, "behind", "answer-lost", 4),
            ("answer-lost", Close, "", "answer-lost", 5),
            ("answer-lost", NoJob, "", "idle", 3),

            ("running", Increase, "queued", "running", 6),
            ("running", Answered, "", "running", 5),
            ("running", Refused, "", "running", 5),
            ("running", Lost, "", "running", 5),
            ("running", Found, "", "running", 5),
            ("running", JobSucceeded, "", "idle", 3),
            // The snapshot shows no new VM: both requested nodes become failed instances.
            ("running", JobFailed, "", "idle", 5),
            ("running", SnapRunning, "poll", "running", 5),
            ("running", SnapScaling, "", "running", 5),
            ("running", SnapRunningLate, "poll", "running", 5),
            ("running", Cleanup, "", "idle", 3),
            ("running", Decrease, "cannot-decrease", "running", 5),
            ("running", Remove, "behind", "running", 4),
            ("running", Close, "", "running", 5),
            ("running", NoJob, "", "running", 5),

            ("adopted", Increase, "queued", "adopted", 4),
            ("adopted", Answered, "", "adopted", 3),
            ("adopted", Refused, "", "adopted", 3),
            ("adopted", Lost, "", "adopted", 3),
            ("adopted", Found, "", "adopted", 3),
            ("adopted", JobSucceeded, "", "idle", 3),
            ("adopted", JobFailed, "", "idle", 3),
            ("adopted", SnapRunning, "poll", "adopted", 3),
            ("adopted", SnapScaling, "", "adopted", 3),
            ("adopted", SnapRunningLate, "poll", "adopted", 3),
            ("adopted", Cleanup, "", "idle", 3),
            ("adopted", Decrease, "cannot-decrease", "adopted", 3),
            ("adopted", Remove, "behind", "adopted", 2),
            ("adopted", Close, "", "adopted", 3),
            ("adopted", NoJob, "", "adopted", 3),
        ];
        let t0 = Instant::now() + Duration::from_secs(T0_SECS);
        for (phase, ev, returns, after, target) in table {
            let mut m = machine_in(phase, t0);
            let got = apply(&mut m, *ev, t0);
            let case = format!("{phase} + {ev:?}");
            assert_eq!(got, *returns, "{case}: returned");
            assert_eq!(m.phase().name(), *after, "{case}: phase after");
            assert_eq!(m.target(), Some(*target), "{case}: target after");
        }
        let phases = ["idle", "submitting", "answer-lost", "running", "adopted"];
        assert_eq!(table.len(), phases.len() * 15, "every phase × every event");
    }

    /// Found by the soak test: increases queued behind a lost submission were stranded when
    /// the lost submission was forgotten, holding the target above CloudStack's size.
    #[test]
    fn increases_queued_behind_a_forgotten_lost_submission_are_sent() {
        let t0 = Instant::now();
        let mut m = machine_in("submitting", t0);
        assert_eq!(m.admit_increase(1, MAX), Ok(Admission::Queued));
        m.submission_lost();
        assert_eq!(m.target(), Some(6));
        // Still too early: nothing happens.
        assert!(
            m.snapshot_installed(running3(t0), &ALERT, at(t0, 5))
                .is_empty()
        );
        // Late enough: the job list is asked first (CloudStack may have queued the job
        // without picking it up yet); it shows none.
        let fx = m.snapshot_installed(running3(t0), &ALERT, at(t0, 11));
        assert_eq!(fx, vec![Effect::FindJob]);
        assert_eq!(m.phase().name(), "answer-lost");
        let fx = m.no_job_found(&ALERT, at(t0, 11));
        assert_eq!(
            fx,
            vec![Effect::Submit(ScaleRequest::Resize { new_size: 4 })]
        );
        assert_eq!(m.phase().name(), "submitting");
        assert_eq!(m.queue().increase.len(), 0);
        assert_eq!(m.target(), Some(4));
    }

    #[test]
    fn a_queued_request_cloudstack_refuses_becomes_failed_instances() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        assert_eq!(m.admit_increase(2, MAX), Ok(Admission::Queued));
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("our job");
        assert_eq!(
            settled.effects,
            vec![Effect::Submit(ScaleRequest::Resize { new_size: 5 })]
        );
        assert!(
            m.submission_refused("quota exceeded", &ALERT, t0)
                .is_empty()
        );
        assert_eq!(m.phase(), &Phase::Idle);
        let failed: Vec<_> = m.failed().iter().map(|f| f.error.code.as_str()).collect();
        assert_eq!(failed, ["scale-up-refused", "scale-up-refused"]);
        assert_eq!(
            m.target(),
            Some(5),
            "the failed instances count until deleted"
        );
        assert_eq!(m.decrease_target(2), Ok(Decreased { cancelled: 2 }));
        assert_eq!(m.target(), Some(3));
    }

    #[test]
    fn a_queued_request_the_rules_refuse_becomes_failed_instances_without_a_request() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        assert_eq!(m.admit_increase(1, MAX), Ok(Admission::Queued));
        // The job ended with the cluster Stopped: no size change is allowed.
        m.snapshot_installed(
            snapshot("Stopped", &[("w1", VmState::Stopped)], t0),
            &ALERT,
            t0,
        );
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("our job");
        assert!(settled.effects.is_empty());
        assert_eq!(m.failed().len(), 1);
        assert_eq!(m.failed()[0].error.code, "scale-up-refused");
    }

    #[test]
    fn a_failed_scale_up_reports_the_vms_it_left_and_the_ones_it_never_made() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        // One of the two requested VMs appeared, then the job failed; CloudStack updates the
        // cluster's size only when a scale-up succeeds.
        let after = snapshot_sized(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
                ("w4", VmState::Error),
            ],
            3,
            t0,
        );
        m.snapshot_installed(after, &ALERT, t0);
        let end = JobEnd::Failed {
            code: 533,
            text: "insufficient capacity".into(),
        };
        let s = m
            .job_finished("job-1", &end, true, false, &ALERT, t0)
            .expect("ours");
        assert!(s.changed);
        let failed: Vec<_> = m
            .failed()
            .iter()
            .map(|f| (f.vm_id.clone(), f.error.code.clone()))
            .collect();
        assert_eq!(failed.len(), 2);
        assert_eq!(failed[0], (Some("w4".into()), "out-of-resources".into()));
        assert_eq!(failed[1].0, None);
        // Three workers, the failed VM (counted once, as the instance it is listed as) and one
        // placeholder never created.
        assert_eq!(m.target(), Some(3 + 2));
    }

    #[test]
    fn a_refusal_seen_by_the_watching_rpc_leaves_nothing_behind() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        let end = JobEnd::Failed {
            code: 530,
            text: "Kubernetes cluster k is in Alert state and can not be scaled".into(),
        };
        m.snapshot_installed(
            snapshot(
                "Alert",
                &[
                    ("w1", VmState::Running),
                    ("w2", VmState::Running),
                    ("w3", VmState::Stopped),
                ],
                t0,
            ),
            &ALERT,
            t0,
        );
        let s = m
            .job_finished("job-1", &end, true, true, &ALERT, t0)
            .expect("ours");
        assert!(!s.changed);
        assert!(s.alert_refusal);
        assert!(m.failed().is_empty());
        assert_eq!(m.target(), Some(3));
        // Seen by the follower instead (no caller to tell), the same refusal leaves two
        // failed instances so the autoscaler hears of it.
        let mut m = machine_in("running", t0);
        let s = m
            .job_finished("job-1", &end, true, false, &ALERT, t0)
            .expect("ours");
        assert!(!s.changed);
        assert_eq!(m.failed().len(), 2);
    }

    fn node(id: &str) -> NodeRef {
        NodeRef {
            provider_id: format!("external-cloudstack://{id}"),
            ..NodeRef::default()
        }
    }

    /// The fake node the autoscaler builds for an instance without a node.
    fn fake(id: &str, reason: &str) -> NodeRef {
        let instance = format!("external-cloudstack://{id}");
        NodeRef {
            provider_id: instance.clone(),
            name: instance,
            annotations: HashMap::from([(FAKE_NODE_REASON_ANNOTATION.into(), reason.into())]),
        }
    }

    #[test]
    fn a_vm_reported_registered_is_not_deleted_as_unregistered_within_the_window() {
        let t0 = Instant::now();
        let mut m = machine_in("idle", t0);
        let mut reports = no_reports();
        // Another autoscaler showed w1's node, with the default providerID, 10 minutes in.
        let seen = at(t0, 600);
        reports.record("w1", "k-node-w1", "external-cloudstack://w1", seen);

        let refused = m.accept_removal(
            &[fake("w1", "unregistered")],
            1,
            &ALERT,
            &reports,
            seen + PROVISION - Duration::from_secs(1),
        );
        let Err(e @ ScaleError::RecentlyRegistered { .. }) = refused else {
            panic!("refused as registered: {refused:?}");
        };
        let text = e.to_string();
        assert!(
            text.contains("external-cloudstack://w1") && text.contains("k-node-w1"),
            "{text}"
        );
        assert!(
            text.contains("1499s ago") && text.contains("(1500s)"),
            "{text}"
        );
        assert!(m.queue().remove.is_empty(), "nothing queued");
        assert_eq!(m.target(), Some(3));

        // Not protected: another VM, a failed creation, a real node the autoscaler sees.
        let now = seen + Duration::from_secs(60);
        assert_eq!(
            m.plan_removal(&[fake("w2", "unregistered")], 1, &ALERT, &reports, now)
                .map(|p| p.vms),
            Ok(vec!["w2".to_string()])
        );
        assert_eq!(
            m.plan_removal(&[fake("w1", "create-error")], 1, &ALERT, &reports, now)
                .map(|p| p.vms),
            Ok(vec!["w1".to_string()])
        );
        assert_eq!(
            m.plan_removal(&[node("w1")], 1, &ALERT, &reports, now)
                .map(|p| p.vms),
            Ok(vec!["w1".to_string()])
        );

        // Once the node has not been seen for the whole window, the deletion is the
        // autoscaler's to make.
        assert_eq!(
            m.accept_removal(
                &[fake("w1", "unregistered")],
                1,
                &ALERT,
                &reports,
                seen + PROVISION
            ),
            Ok(Accepted::OpensWindow)
        );
    }

    fn running(n: u32, t: Instant) -> Arc<IndexedSnapshot> {
        let ids: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
        let vms: Vec<(&str, VmState)> =
            ids.iter().map(|i| (i.as_str(), VmState::Running)).collect();
        snapshot("Running", &vms, t)
    }

    fn remove_of(ids: &[&str]) -> Effect {
        Effect::Submit(ScaleRequest::RemoveNodes {
            vm_ids: ids.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// "Cannot scale in Alert" is concluded only when the provider's own rules, after the
    /// job, still allow the request.
    #[test]
    fn an_alert_refusal_the_rules_explain_says_nothing_about_the_cloudstack_version() {
        let t0 = Instant::now();
        let end = JobEnd::Failed {
            code: 530,
            text: "Kubernetes cluster k is in Alert state and can not be scaled".into(),
        };
        let alert_with = |w3: VmState| {
            snapshot(
                "Alert",
                &[
                    ("w1", VmState::Running),
                    ("w2", VmState::Running),
                    ("w3", w3),
                ],
                t0,
            )
        };
        let cases = [
            // A worker down: every rule allows the scale-up, yet CloudStack refused.
            (alert_with(VmState::Stopped), true, true),
            // HA restarted the worker before the job validated: rule 7 explains the refusal.
            (alert_with(VmState::Running), true, false),
            // No snapshot after the job: nothing is concluded.
            (alert_with(VmState::Stopped), false, false),
        ];
        for (snap, fetched, want) in cases {
            let mut m = machine_in("running", t0);
            m.snapshot_installed(snap, &ALERT, t0);
            let s = m
                .job_finished("job-1", &end, fetched, true, &ALERT, t0)
                .expect("ours");
            assert_eq!(s.alert_refusal, want, "fetched {fetched}");
        }
    }

    #[test]
    fn a_removal_drops_the_target_and_remembers_the_vms_once_accepted() {
        let t0 = Instant::now();
        let mut m = machine_in("idle", t0);
        let w2 = NodeRef {
            provider_id: "external-cloudstack://w2".into(),
            name: "k-node-w2".into(),
            annotations: HashMap::new(),
        };
        assert_eq!(
            m.accept_removal(std::slice::from_ref(&w2), 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::OpensWindow)
        );
        assert_eq!(m.target(), Some(2), "the target drops once accepted");
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w2"])]));
        assert_eq!(m.target(), Some(2));
        // Refused: nothing remembered, the target is back.
        assert!(m.submission_refused("no", &ALERT, t0).is_empty());
        assert_eq!(m.target(), Some(3));
        assert!(m.recently_removed.is_empty());
        // Accepted: remembered under id and name; once gone, naming it again is a no-op.
        m.accept_removal(std::slice::from_ref(&w2), 1, &ALERT, &no_reports(), t0)
            .expect("accepted");
        m.close_window(&ALERT, t0).expect("sent");
        m.submission_answered("job-2".into(), t0);
        m.snapshot_installed(
            snapshot(
                "Scaling",
                &[("w1", VmState::Running), ("w3", VmState::Running)],
                t0,
            ),
            &ALERT,
            t0,
        );
        assert_eq!(
            m.accept_removal(std::slice::from_ref(&w2), 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::Done)
        );
        // A removal while the first runs waits behind it, but not below the minimum.
        assert_eq!(
            m.accept_removal(&[node("w3")], 2, &ALERT, &no_reports(), t0)
                .map_err(|e| err_name(&e)),
            Err("below-min")
        );
        assert_eq!(
            m.accept_removal(&[node("w3")], 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::Behind)
        );
        assert_eq!(
            m.accept_removal(&[node("w1")], 0, &ALERT, &no_reports(), t0),
            Err(ScaleError::Refused(Refusal::RemovesAllWorkers {
                cluster: "k".into(),
                workers: 2
            })),
            "the last worker stays, counting the removal in flight"
        );
    }

    /// The real autoscaler's scale-down: one DeleteNodes per node, at once
    /// (`core/scaledown/actuation/actuator.go` `deleteNodesAsync`).
    #[test]
    fn concurrent_per_node_removals_go_one_drain_at_a_time() {
        let t0 = Instant::now();
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        m.snapshot_installed(running(6, t0), &ALERT, t0);
        let got: Vec<_> = ["w1", "w2", "w3", "w2"]
            .iter()
            .map(|id| m.accept_removal(&[node(id)], 1, &ALERT, &no_reports(), t0))
            .collect();
        assert_eq!(
            got,
            [
                Ok(Accepted::OpensWindow),
                Ok(Accepted::JoinsWindow),
                Ok(Accepted::JoinsWindow),
                Ok(Accepted::Done),
            ],
            "a node named twice is queued once"
        );
        assert_eq!(m.target(), Some(3));
        // A snapshot meanwhile does not send the window early.
        assert!(m.snapshot_installed(running(6, t0), &ALERT, t0).is_empty());
        // One VM that needs a drain per request (a failed drain must find nothing removed
        // yet): w1 now, w2 and w3 after it, one job each.
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w1"])]));
        m.submission_answered("job-1".into(), t0);
        m.window_answered(true);
        // More arrive while the job runs: accepted at once, sent together when it ends; a
        // node of the job in flight is not sent again.
        assert_eq!(
            m.accept_removal(&[node("w4")], 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::Behind)
        );
        assert_eq!(
            m.accept_removal(&[node("w5")], 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::Behind)
        );
        assert_eq!(
            m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::Done)
        );
        assert_eq!(m.target(), Some(1));
        assert_eq!(
            m.accept_removal(&[node("w6")], 1, &ALERT, &no_reports(), t0)
                .map_err(|e| err_name(&e)),
            Err("below-min"),
            "the minimum holds against everything queued"
        );
        let after = snapshot(
            "Running",
            &[
                ("w4", VmState::Running),
                ("w5", VmState::Running),
                ("w6", VmState::Running),
            ],
            t0,
        );
        m.snapshot_installed(after, &ALERT, t0);
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        // w2 and w3 vanished with the job (listed no more): done. w4 next, then w5.
        assert_eq!(settled.effects, vec![remove_of(&["w4"])]);
        assert_eq!(m.target(), Some(1));
        m.submission_answered("job-2".into(), t0);
        let after = snapshot(
            "Running",
            &[("w5", VmState::Running), ("w6", VmState::Running)],
            t0,
        );
        m.snapshot_installed(after, &ALERT, t0);
        let settled = m
            .job_finished("job-2", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        assert_eq!(settled.effects, vec![remove_of(&["w5"])]);
    }

    #[test]
    fn a_queued_node_that_disappears_is_left_out_and_one_that_comes_back_is_sent() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        m.accept_removal(&[node("w2")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        // w1 vanished (destroyed elsewhere), w2 missing from one listing and back.
        m.snapshot_installed(
            snapshot(
                "Scaling",
                &[("w3", VmState::Running), ("w4", VmState::Running)],
                t0,
            ),
            &ALERT,
            t0,
        );
        let back = snapshot(
            "Running",
            &[
                ("w1", VmState::Expunging),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
                ("w4", VmState::Running),
                ("w5", VmState::Running),
            ],
            t0,
        );
        m.snapshot_installed(back, &ALERT, t0);
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        assert_eq!(settled.effects, vec![remove_of(&["w2"])]);
        // Every queued node gone: nothing is sent.
        let mut m = machine_in("running", t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        m.snapshot_installed(
            snapshot(
                "Running",
                &[("w2", VmState::Running), ("w3", VmState::Running)],
                t0,
            ),
            &ALERT,
            t0,
        );
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        assert!(settled.effects.is_empty());
        assert!(m.queue().remove.is_empty());
    }

    #[test]
    fn removals_go_before_increases_and_neither_is_lost() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        assert_eq!(m.admit_increase(2, MAX), Ok(Admission::Queued));
        assert_eq!(m.target(), Some(5 - 1 + 2));
        m.snapshot_installed(running(5, t0), &ALERT, t0);
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        assert_eq!(settled.effects, vec![remove_of(&["w1"])]);
        assert_eq!(m.target(), Some(6));
        m.submission_answered("job-2".into(), t0);
        let four: Vec<String> = (2..=5).map(|i| format!("w{i}")).collect();
        let vms: Vec<(&str, VmState)> = four
            .iter()
            .map(|i| (i.as_str(), VmState::Running))
            .collect();
        m.snapshot_installed(snapshot("Running", &vms, t0), &ALERT, t0);
        let settled = m
            .job_finished("job-2", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        // Sent on top of the four left: CloudStack's size never passed 6 on the way.
        assert_eq!(
            settled.effects,
            vec![Effect::Submit(ScaleRequest::Resize { new_size: 6 })]
        );
        assert_eq!(m.target(), Some(6));
        // An increase arriving while a window collects removals waits for them.
        let mut m = machine_in("idle", t0);
        assert_eq!(
            m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::OpensWindow)
        );
        assert_eq!(m.admit_increase(1, MAX), Ok(Admission::Queued));
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w1"])]));
    }

    #[test]
    fn a_merged_request_the_rules_refuse_is_refused_at_rest_and_owed_behind_a_job() {
        let t0 = Instant::now();
        // At rest the rules are checked at once: a call they refuse changes nothing.
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        let alert_no_down_worker = snapshot(
            "Alert",
            &[("w1", VmState::Running), ("w2", VmState::Running)],
            t0,
        );
        m.snapshot_installed(alert_no_down_worker, &ALERT, t0);
        assert!(matches!(
            m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0),
            Err(ScaleError::Refused(Refusal::AlertWithoutDownWorker { .. }))
        ));
        assert_eq!(m.target(), Some(2));
        // Queued behind a job, they are checked when their turn comes.
        let mut m = machine_in("running", t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        m.snapshot_installed(
            snapshot(
                "Alert",
                &[
                    ("w1", VmState::Running),
                    ("w2", VmState::Running),
                    ("w3", VmState::Running),
                ],
                t0,
            ),
            &ALERT,
            t0,
        );
        let settled = m
            .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
            .expect("ours");
        // Owed (its caller was answered OK): it waits, out of the target, and is tried again.
        assert!(matches!(
            &settled.effects[..],
            [Effect::RemovalRetried { vms, .. }] if vms == &["k-node-w1".to_string()]
        ));
        assert_eq!(m.queue().remove.len(), 1);
        assert_eq!(m.target(), Some(2));
        let shown = m.instances(&[]);
        let w1 = shown.iter().find(|i| i.id.ends_with("w1")).expect("listed");
        assert_eq!(w1.state, crate::status::InstanceState::Deleting);
        assert_eq!(
            w1.error.as_ref().map(|e| e.code.as_str()),
            Some("removal-retrying")
        );
        // In a window, the refusal is the window's error.
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        m.snapshot_installed(running3(t0), &ALERT, t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        m.snapshot_installed(
            snapshot(
                "Alert",
                &[
                    ("w1", VmState::Running),
                    ("w2", VmState::Running),
                    ("w3", VmState::Running),
                ],
                t0,
            ),
            &ALERT,
            t0,
        );
        assert!(matches!(
            m.close_window(&ALERT, t0),
            Err(ScaleError::Refused(_))
        ));
        assert_eq!(m.target(), Some(3));
    }

    #[test]
    fn a_failed_removal_stays_owed_and_is_sent_again_after_a_pause_then_abandoned() {
        let t0 = Instant::now();
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        m.snapshot_installed(running(4, t0), &ALERT, t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued");
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w1"])]));
        m.submission_answered("job-1".into(), t0);
        m.window_answered(true);
        assert_eq!(m.target(), Some(3));
        let end = JobEnd::Failed {
            code: 530,
            text: "failed to remove Kubernetes node".into(),
        };
        m.set_can_stop_vms(false);
        let mut t = t0;
        for attempt in 1..=MAX_REMOVAL_ATTEMPTS {
            m.snapshot_installed(running(4, t), &ALERT, t);
            let settled = m
                .job_finished(
                    m.phase().job().unwrap_or("none").to_string().as_str(),
                    &end,
                    true,
                    false,
                    &ALERT,
                    t,
                )
                .expect("ours");
            // Still out of the target: the autoscaler counts w1 as gone.
            assert_eq!(m.target(), Some(3), "attempt {attempt}");
            let names: Vec<&str> = settled
                .effects
                .iter()
                .map(|e| match e {
                    Effect::RemovalRetried { .. } => "retried",
                    Effect::RemovalAbandoned { .. } => "abandoned",
                    Effect::Submit(_) => "submit",
                    _ => "other",
                })
                .collect();
            if attempt < MAX_REMOVAL_ATTEMPTS {
                // w1 backs off: nothing is sent before it is due.
                assert_eq!(names, ["retried"], "attempt {attempt}");
                let wait = retry_delay(attempt);
                let early = t + wait - Duration::from_secs(1);
                assert!(
                    m.snapshot_installed(running(4, early), &ALERT, early)
                        .is_empty()
                );
                t += wait;
                let fx = m.snapshot_installed(running(4, t), &ALERT, t);
                let sent: Vec<&Effect> = fx
                    .iter()
                    .filter(|e| matches!(e, Effect::Submit(_)))
                    .collect();
                assert_eq!(sent.len(), 1, "attempt {attempt}: {fx:?}");
                m.submission_answered(format!("job-{}", attempt + 1), t);
            } else {
                assert_eq!(names, ["abandoned"]);
            }
        }
        let w1 = m
            .instances(&[])
            .into_iter()
            .find(|i| i.id.ends_with("w1"))
            .expect("listed");
        assert_eq!(
            w1.error.as_ref().map(|e| e.code.as_str()),
            Some("removal-abandoned")
        );
        assert_eq!(m.target(), Some(3));
        // Abandoned: sent again only once the VM is down (no drain then).
        t += Duration::from_secs(3600);
        let fx = m.snapshot_installed(running(4, t), &ALERT, t);
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::Submit(ScaleRequest::RemoveNodes { vm_ids }) if vm_ids.contains(&"w1".to_string()))),
            "{fx:?}"
        );
    }

    #[test]
    fn a_running_vm_without_a_node_is_stopped_first_or_refused() {
        let t0 = Instant::now();
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        m.snapshot_installed(running(3, t0), &ALERT, t0);
        // The key may not stop VMs: refused before any promise, saying what to do.
        m.set_can_stop_vms(false);
        let refused = m.accept_removal(&[fake("w3", "create-error")], 1, &ALERT, &no_reports(), t0);
        let Err(e) = refused else {
            panic!("accepted: {refused:?}")
        };
        assert_eq!(err_name(&e), "drain-would-fail");
        assert!(e.to_string().contains("stopVirtualMachine id=w3"), "{e}");
        assert_eq!(m.target(), Some(3));
        // With Alert scaling refused by this CloudStack, stopping would not help either.
        m.set_can_stop_vms(true);
        let unsupported = AlertScaling::Unsupported {
            cloudstack_error: "in Alert state and can not be scaled".into(),
        };
        assert!(matches!(
            m.accept_removal(
                &[fake("w3", "create-error")],
                1,
                &unsupported,
                &no_reports(),
                t0
            ),
            Err(ScaleError::DrainWouldFail { .. })
        ));
        // Otherwise: accepted, stopped, then removed as a down VM.
        assert_eq!(
            m.accept_removal(&[fake("w3", "create-error")], 1, &ALERT, &no_reports(), t0),
            Ok(Accepted::OpensWindow)
        );
        assert_eq!(m.take_stops(t0), ["w3"]);
        assert!(m.take_stops(t0).is_empty(), "a stop is sent once");
        // Nothing to send while it runs.
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![]));
        m.window_answered(true);
        m.stop_answered("w3", None, t0);
        assert_eq!(m.target(), Some(2));
        let stopped = snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Stopped),
            ],
            t0,
        );
        assert_eq!(
            m.snapshot_installed(stopped, &ALERT, t0),
            vec![remove_of(&["w3"])]
        );
        // A key without stopVirtualMachine: the removal waits for an operator.
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        m.snapshot_installed(running(3, t0), &ALERT, t0);
        m.accept_removal(&[fake("w3", "unregistered")], 1, &ALERT, &no_reports(), t0)
            .expect("accepted");
        assert_eq!(m.take_stops(t0), ["w3"]);
        m.stop_answered("w3", Some(("432 not available", true)), t0);
        let shown = m.instances(&[]);
        let w3 = shown.iter().find(|i| i.id.ends_with("w3")).expect("listed");
        assert_eq!(
            w3.error.as_ref().map(|e| e.code.as_str()),
            Some("removal-stopping-vm")
        );
        assert!(
            m.accept_removal(&[fake("w2", "unregistered")], 1, &ALERT, &no_reports(), t0)
                .is_err(),
            "learned: the next one is refused up front"
        );
    }

    #[test]
    fn guarded_unregistered_nodes_do_not_keep_the_others() {
        let t0 = Instant::now();
        let mut m = ScaleMachine::new(Some("cid".into()), timings());
        m.snapshot_installed(
            snapshot(
                "Alert",
                &[
                    ("w1", VmState::Stopped),
                    ("w2", VmState::Stopped),
                    ("w3", VmState::Running),
                ],
                t0,
            ),
            &ALERT,
            t0,
        );
        let mut reports = no_reports();
        reports.record("w1", "node-w1", "external-cloudstack://w1", t0);
        let a = m
            .accept_removals(
                &[fake("w1", "unregistered"), fake("w2", "unregistered")],
                1,
                &ALERT,
                &reports,
                t0,
            )
            .expect("w2 accepted");
        assert_eq!(a.accepted, Accepted::OpensWindow);
        assert!(
            matches!(&a.refused[..], [ScaleError::RecentlyRegistered { vm, .. }] if vm == "k-node-w1")
        );
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w2"])]));
        // Alone, the guarded one is refused and nothing changes.
        assert!(matches!(
            m.accept_removals(&[fake("w1", "unregistered")], 1, &ALERT, &reports, t0),
            Err(ScaleError::RecentlyRegistered { .. })
        ));
    }

    #[test]
    fn cleanup_drops_removals_not_sent() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .expect("queued behind the job");
        assert_eq!(m.target(), Some(4));
        m.cleanup();
        assert!(m.queue().remove.is_empty());
        assert_eq!(
            m.target(),
            Some(3),
            "w1 is back; the job's placeholders are gone with it"
        );
    }

    #[test]
    fn decrease_cancels_all_it_is_asked_or_refuses_and_changes_nothing() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        assert_eq!(m.admit_increase(2, MAX), Ok(Admission::Queued));
        assert_eq!(m.target(), Some(7));
        assert!(
            matches!(
                m.decrease_target(5),
                Err(ScaleError::CannotDecrease {
                    asked: 5,
                    cancellable: 2,
                    target: 7
                })
            ),
            "the in-flight job's VMs are not cancelled"
        );
        assert_eq!(m.target(), Some(7), "a refusal changes nothing");
        assert_eq!(m.decrease_target(2), Ok(Decreased { cancelled: 2 }));
        assert_eq!(m.target(), Some(5));
        assert_eq!(m.phase().name(), "running");
    }

    #[test]
    fn removal_bounds_and_roles_are_checked_before_anything_changes() {
        let t0 = Instant::now();
        let m = machine_in("idle", t0);
        let node = |id: &str| NodeRef {
            provider_id: format!("external-cloudstack://{id}"),
            ..NodeRef::default()
        };
        let cases: &[(&[&str], u32, Result<usize, &str>)] = &[
            (&["w1"], 1, Ok(1)),
            (&["w1", "w1"], 1, Ok(1)),
            (&["w1", "w2"], 2, Err("below-min")),
            (&["c1"], 1, Err("not-worker")),
            (&["zz"], 1, Err("unknown-node")),
            (&["w1", "c1"], 1, Err("not-worker")),
        ];
        for (ids, min, want) in cases {
            let nodes: Vec<NodeRef> = ids.iter().map(|i| node(i)).collect();
            let got = m
                .plan_removal(&nodes, *min, &ALERT, &no_reports(), t0)
                .map(|p| p.vms.len())
                .map_err(|e| err_name(&e));
            assert_eq!(got, *want, "{ids:?} min {min}");
        }
        assert_eq!(m.phase(), &Phase::Idle);
    }

    #[test]
    fn increase_is_bounded_by_the_maximum_counting_queued_work() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        assert_eq!(
            m.admit_increase(6, MAX),
            Err(ScaleError::OutOfRange {
                target: 5,
                delta: 6,
                max: 10
            })
        );
        assert_eq!(m.admit_increase(5, MAX), Ok(Admission::Queued));
        assert!(matches!(
            m.admit_increase(1, MAX),
            Err(ScaleError::OutOfRange { .. })
        ));
    }

    #[test]
    fn failed_instances_expire_or_go_with_their_vm() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        let end = JobEnd::Failed {
            code: 530,
            text: "x".into(),
        };
        m.job_finished("job-1", &end, true, false, &ALERT, t0)
            .expect("ours");
        assert_eq!(m.failed().len(), 2);
        m.snapshot_installed(running3(t0), &ALERT, at(t0, 1799));
        assert_eq!(m.failed().len(), 2);
        m.snapshot_installed(running3(t0), &ALERT, at(t0, 1800));
        assert!(m.failed().is_empty());
        assert_eq!(m.target(), Some(3));
    }

    #[test]
    fn increases_queued_behind_a_job_cleanup_forgot_go_out_with_the_next_snapshot() {
        let t0 = Instant::now();
        let mut m = machine_in("running", t0);
        assert_eq!(m.admit_increase(1, MAX), Ok(Admission::Queued));
        m.cleanup();
        assert_eq!(m.phase(), &Phase::Idle);
        // The job ended while nobody followed it: the next snapshot shows the cluster at rest.
        let fx = m.snapshot_installed(
            snapshot_sized(
                "Running",
                &[
                    ("w1", VmState::Running),
                    ("w2", VmState::Running),
                    ("w3", VmState::Running),
                    ("w4", VmState::Running),
                    ("w5", VmState::Running),
                ],
                5,
                t0,
            ),
            &ALERT,
            t0,
        );
        assert_eq!(
            fx,
            vec![Effect::Submit(ScaleRequest::Resize { new_size: 6 })]
        );
        assert_eq!(m.target(), Some(6));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// One event as CloudStack or the autoscaler may produce it, in any order.
        #[derive(Debug, Clone)]
        enum Step {
            Increase(u32),
            /// DeleteNodes for worker `w{n}` (down ones and failed ones included).
            Remove(u32),
            /// The shell closes the removal window.
            CloseWindow,
            Decrease(u32),
            Answered,
            Refused,
            Lost,
            Found,
            NoJobFound,
            JobEnds {
                failed: bool,
                watched: bool,
            },
            /// A snapshot `secs` later showing the cluster in a state with `workers` VMs, the
            /// `down`th of them Stopped and the `gone`th Expunging (0: none).
            Snapshot {
                scaling: bool,
                workers: u32,
                down: u32,
                gone: u32,
                secs: u64,
            },
            Cleanup,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                (1u32..4).prop_map(Step::Increase),
                (1u32..7).prop_map(Step::Remove),
                Just(Step::CloseWindow),
                (1u32..3).prop_map(Step::Decrease),
                Just(Step::Answered),
                Just(Step::Refused),
                Just(Step::Lost),
                Just(Step::Found),
                Just(Step::NoJobFound),
                (any::<bool>(), any::<bool>())
                    .prop_map(|(failed, watched)| Step::JobEnds { failed, watched }),
                (any::<bool>(), 1u32..7, 0u32..4, 0u32..4, 0u64..30).prop_map(
                    |(scaling, workers, down, gone, secs)| Step::Snapshot {
                        scaling,
                        workers,
                        down,
                        gone,
                        secs,
                    }
                ),
                Just(Step::Cleanup),
            ]
        }

        fn workers_snapshot(
            scaling: bool,
            n: u32,
            down: u32,
            gone: u32,
            t: Instant,
        ) -> Arc<IndexedSnapshot> {
            let ids: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
            let vms: Vec<(&str, VmState)> = ids
                .iter()
                .zip(1..)
                .map(|(i, k)| {
                    let state = if k == gone {
                        VmState::Expunging
                    } else if k == down {
                        VmState::Stopped
                    } else {
                        VmState::Running
                    };
                    (i.as_str(), state)
                })
                .collect();
            let state = if scaling {
                "Scaling"
            } else if down > 0 && down <= n {
                "Alert"
            } else {
                "Running"
            };
            snapshot(state, &vms, t)
        }

        /// The invariant of docs/decrease-target-size.md: the target counts exactly the
        /// instances NodeGroupNodes lists that are not Deleting (so the core's
        /// `fixNodeGroupSize` never asks to cancel what cannot be cancelled).
        fn listed_not_deleting(m: &ScaleMachine) -> u32 {
            m.instances(&m.pending_placeholders())
                .iter()
                .filter(|i| i.state != crate::status::InstanceState::Deleting)
                .count() as u32
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            /// Whatever happens, in whatever order: a request is sent only from Idle and
            /// never while another is in flight; a refused request changes nothing; once a
            /// snapshot shows the cluster at rest with nothing in flight, no queued work is
            /// left behind; the target is never below what is queued and failed, and always
            /// equals the listed instances that are not Deleting; no VM is queued twice or
            /// queued while its removal runs.
            #[test]
            fn the_machine_never_sends_two_requests_or_strands_work(
                steps in proptest::collection::vec(step(), 1..40)
            ) {
                let t0 = Instant::now();
                let mut now = t0;
                let mut m = ScaleMachine::new(Some("cid".into()), timings());
                m.snapshot_installed(running3(t0), &ALERT, t0);
                for s in steps {
                    let before = m.clone();
                    let was_idle = m.phase() == &Phase::Idle;
                    let mut effects = Vec::new();
                    match s {
                        Step::Increase(d) => match m.admit_increase(d, MAX) {
                            Ok(Admission::NeedsFreshSnapshot) => {
                                match m.start_increase(d, MAX, &ALERT, now) {
                                    Ok(Started::Submit(r)) => effects.push(Effect::Submit(r)),
                                    Ok(_) => {}
                                    Err(_) => prop_assert_eq!(m.phase(), before.phase()),
                                }
                            }
                            Ok(Admission::Queued) => prop_assert!(!was_idle || !before.queue().remove.is_empty()),
                            Err(_) => {
                                prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing");
                            }
                        },
                        Step::Remove(n) => {
                            let node = NodeRef { provider_id: format!("external-cloudstack://w{n}"), ..NodeRef::default() };
                            match m.accept_removal(&[node], 1, &ALERT, &no_reports(), now) {
                                Ok(Accepted::Done) => prop_assert!(m.target() <= before.target()),
                                Ok(_) => prop_assert_eq!(m.target(), before.target().map(|t| t - 1), "the target drops at once"),
                                Err(_) => {
                                    prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing");
                                    prop_assert_eq!(m.queue(), before.queue());
                                }
                            }
                            prop_assert!(m.target().unwrap_or(0) >= 1 || before.target() == Some(0), "never the last worker");
                        }
                        Step::CloseWindow => match m.close_window(&ALERT, now) {
                            Ok(fx) => {
                                effects = fx;
                                m.window_answered(true);
                            }
                            Err(_) => prop_assert!(m.queue().remove.iter().all(|r| !r.in_window)),
                        },
                        Step::Decrease(d) => {
                            match m.decrease_target(d) {
                                Ok(got) => {
                                    prop_assert_eq!(got.cancelled, d);
                                    prop_assert_eq!(m.target(), before.target().map(|t| t - d), "after an OK the target dropped by the delta");
                                }
                                Err(_) => prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing"),
                            }
                        }
                        Step::Answered => m.submission_answered(format!("job-{}", now.duration_since(t0).as_secs()), now),
                        Step::Refused => effects = m.submission_refused("no", &ALERT, now),
                        Step::Lost => m.submission_lost(),
                        Step::Found => effects = m.job_found("job-x".into(), now),
                        Step::NoJobFound => effects = m.no_job_found(&ALERT, now),
                        Step::JobEnds { failed, watched } => {
                            let end = if failed {
                                JobEnd::Failed { code: 530, text: "boom".into() }
                            } else {
                                JobEnd::Succeeded
                            };
                            if let Some(job) = m.phase().job().map(str::to_string)
                                && let Some(settled) = m.job_finished(&job, &end, true, watched, &ALERT, now)
                            {
                                effects = settled.effects;
                            }
                        }
                        Step::Snapshot { scaling, workers, down, gone, secs } => {
                            now += Duration::from_secs(secs);
                            effects = m.snapshot_installed(workers_snapshot(scaling, workers, down, gone, now), &ALERT, now);
                            // (An open window is the shell's to close; its work goes then.)
                            if !scaling && m.phase() == &Phase::Idle && !m.queue().window_open {
                                prop_assert!(m.queue().increase.is_empty(), "queued work stranded: {:?}", m);
                                // Owed removals wait only for a reason: backing off, their VM to be
                                // stopped, or abandoned (until the VM is down).
                                let snap = m.snapshot().cloned();
                                let down = |id: &str| snap.as_ref().and_then(|s| s.snap.vm(id)).is_some_and(|v| v.state.is_down());
                                for r in &m.queue().remove {
                                    let waits = r.not_before.is_some_and(|t| t > now)
                                        || (!down(&r.vm_id) && (r.stop != StopStage::NotNeeded || r.abandoned));
                                    prop_assert!(waits, "queued removal stranded: {:?}", m);
                                }
                            }
                        }
                        Step::Cleanup => m.cleanup(),
                    }
                    let submits = effects.iter().filter(|e| matches!(e, Effect::Submit(_))).count();
                    prop_assert!(submits <= 1);
                    if submits == 1 {
                        prop_assert!(
                            !matches!(before.phase(), Phase::Submitting { .. } | Phase::AnswerLost { .. } | Phase::Running { .. } | Phase::Adopted { .. })
                                || matches!(s, Step::Refused | Step::JobEnds { .. } | Step::Snapshot { .. } | Step::NoJobFound),
                            "a request sent while another was in flight: {:?} then {:?}", before.phase(), s
                        );
                        prop_assert_eq!(m.phase().name(), "submitting");
                    }
                    let failed_placeholders = m.failed().iter().filter(|f| f.vm_id.is_none()).count();
                    let floor = (m.queue().increase.len() + failed_placeholders) as u32;
                    prop_assert!(m.target().unwrap_or(0) >= floor);
                    prop_assert_eq!(m.target(), Some(listed_not_deleting(&m)), "target = listed instances not Deleting, after {:?}", s);
                    let mut sent_twice = std::collections::HashSet::new();
                    for r in &m.queue().remove {
                        prop_assert!(sent_twice.insert(r.vm_id.clone()), "a VM queued twice");
                        let in_flight = matches!(m.phase().op().map(|o| &o.kind), Some(OpKind::Remove { vm_ids, .. }) if vm_ids.contains(&r.vm_id));
                        prop_assert!(!in_flight, "a VM queued while its removal is in flight");
                    }
                }
            }
        }
    }

    #[test]
    fn poll_delays() {
        let poll = Duration::from_secs(2);
        let hour = Duration::from_secs(3600);
        let cases = [
            (0, 0, poll),
            (1, 0, Duration::from_secs(4)),
            (3, 0, Duration::from_secs(16)),
            (4, 0, Duration::from_secs(30)),
            (9, 0, Duration::from_secs(30)),
            (0, 7201, Duration::from_secs(60)),
            (0, 7200, poll),
        ];
        for (failed, secs, want) in cases {
            let got = poll_delay(poll, failed, Duration::from_secs(secs), 2 * hour);
            assert_eq!(got, want, "{failed} failed polls after {secs}s");
        }
    }
}
