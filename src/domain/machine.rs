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
//! (instances and their status, the debug line) is derived in `crate::domain::instances`.
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
        /// Instances dropped locally once CloudStack accepts the removal.
        drops: LocalDrops,
    },
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
        job: String,
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
            Phase::Running { job, .. } | Phase::Adopted { job, .. } => Some(job),
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
            Phase::Adopted { job, .. } => {
                return Some(format!("scale job {job} started elsewhere"));
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

/// Work accepted while a request or job was in flight, sent when the phase returns to idle.
///
/// Increases are merged into one size request. (Removals queued the same way — several
/// DeleteNodes merged into one `nodeids` request — fit here as a second list.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queue {
    /// One placeholder instance id per queued node.
    pub increase: Vec<String>,
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
}

/// The second step of a scale request, once a fresh snapshot is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Send this request (the phase is `Submitting`).
    Submit(ScaleRequest),
    /// Merged into the request sent when the operation in flight ends.
    Queued,
    /// Nothing to send to CloudStack (every VM named is gone already); local drops applied.
    Done,
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
    /// Instances dropped locally.
    pub drops: LocalDrops,
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
    /// A scale operation is in flight and this request cannot wait behind it.
    Busy {
        running: String,
    },
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
    /// DecreaseTargetSize asks to cancel more than can be cancelled.
    DecreaseTooLarge {
        by: u32,
        queued: u32,
        failed_placeholders: u32,
        in_flight: Option<String>,
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
            ScaleError::Busy { running } => write!(
                f,
                "a scale job is running ({running}); CloudStack runs one scale operation per \
                 cluster at a time, retry when it ends"
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
            ScaleError::DecreaseTooLarge {
                by,
                queued,
                failed_placeholders,
                in_flight,
            } => {
                write!(
                    f,
                    "decreasing the target by {by} would delete existing or already requested VMs: \
                     only {} requested node(s) can be cancelled ({queued} queued, \
                     {failed_placeholders} from a failed scale-up)",
                    queued + failed_placeholders
                )?;
                if let Some(op) = in_flight {
                    write!(f, "; {op} cannot be cancelled")?;
                }
                Ok(())
            }
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

    /// CloudStack's size, moved by what this provider requested and CloudStack has not
    /// finished, plus queued increases and instances of failed scale-ups the autoscaler has
    /// not deleted yet.
    pub fn target(&self) -> Option<u32> {
        let s = self.snap.as_ref()?;
        let size = s.snap.size;
        let mut t = i64::from(size);
        match (&self.phase, self.phase.op().map(|o| &o.kind)) {
            (_, Some(OpKind::Increase { to, .. })) => t = i64::from(size.max(*to)),
            (_, Some(OpKind::Remove { from, vm_ids, .. })) => {
                t = t.min(i64::from(*from) - vm_ids.len() as i64);
            }
            (Phase::Adopted { .. }, None) => {
                let live = s.snap.workers().filter(|v| !v.state.is_gone()).count() as i64;
                t = t.max(live);
            }
            _ => {}
        }
        t += self.queue.increase.len() as i64;
        t += self.failed.len() as i64;
        Some(u32::try_from(t.max(0)).unwrap_or(0))
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
        let mut out = Vec::new();
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
            out.extend(placeholders[placeholders.len() - missing..].iter().cloned());
        }
        out.extend(self.queue.increase.iter().cloned());
        out
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
            let vm_alive = f
                .vm_id
                .as_ref()
                .is_none_or(|id| snap.by_id.contains_key(id));
            vm_alive && now.saturating_duration_since(f.since) < ttl
        });
        self.recently_removed
            .retain(|_, t| now.saturating_duration_since(*t) < REMOVED_MEMORY);
        self.snap = Some(snap);
        match &self.phase {
            Phase::Running { .. } | Phase::Adopted { .. } if !scaling => vec![Effect::PollNow],
            Phase::Idle if scaling => vec![Effect::FindJob],
            Phase::AnswerLost { .. } if scaling => vec![Effect::FindJob],
            Phase::AnswerLost { since, .. }
                if now.saturating_duration_since(*since) > self.timings.lost_settle =>
            {
                // A request given up on may still be on its way to CloudStack: only once it is
                // older than the longest a request may take does "not Scaling" mean it never
                // became a job.
                self.phase = Phase::Idle;
                self.next_from_queue(alert, now)
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
            Phase::Idle => Ok(Admission::NeedsFreshSnapshot),
            Phase::AnswerLost { .. } => Err(ScaleError::PreviousAnswerLost),
            Phase::Submitting { .. } | Phase::Running { .. } | Phase::Adopted { .. } => {
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
            Phase::Idle => {}
            Phase::AnswerLost { .. } => return Err(ScaleError::PreviousAnswerLost),
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

    /// DeleteNodes, first step on the cached state: resolves every node (all or nothing) and
    /// checks the group's minimum. An empty `vms` means nothing needs CloudStack.
    pub fn plan_removal(&self, nodes: &[NodeRef], min: u32) -> Result<DeletePlan, ScaleError> {
        let s = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
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
                if gone {
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
                        return Err(ScaleError::RegisteredElsewhere {
                            vm: vm.name.clone(),
                            node: l.node_name.clone(),
                            provider_id: l.provider_id.clone(),
                            instance: n.provider_id.clone(),
                        });
                    }
                    let removing = self.phase.op().is_some_and(|op| {
                        matches!(&op.kind, OpKind::Remove { vm_ids, .. } if vm_ids.contains(&vm.id))
                    });
                    if removing || vm.state.is_gone() || !seen.insert(vm.id.clone()) {
                        continue;
                    }
                    let failed_vm = self
                        .failed
                        .iter()
                        .any(|f| f.vm_id.as_deref() == Some(&vm.id));
                    if reason != Some("create-error") && !failed_vm {
                        counted += 1;
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
        if counted > 0 {
            let target = self.target().unwrap_or(s.snap.size);
            let removed = counted + (plan.drops.failed.len() + plan.drops.queued.len()) as u32;
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

    /// DeleteNodes for a plan with nothing to send: applies its local drops.
    pub fn apply_drops(&mut self, drops: &LocalDrops, vms: &[String]) {
        self.failed.retain(|f| {
            !drops.failed.contains(&f.id) && !f.vm_id.as_ref().is_some_and(|v| vms.contains(v))
        });
        self.queue.increase.retain(|p| !drops.queued.contains(p));
    }

    /// Whether a removal can be sent now (checked before fetching a fresh snapshot).
    pub fn check_idle_for_removal(&self) -> Result<(), ScaleError> {
        match self.phase.describe() {
            None => Ok(()),
            Some(running) => Err(ScaleError::Busy { running }),
        }
    }

    /// DeleteNodes, second step on a fresh snapshot: drops VMs that vanished meanwhile,
    /// checks CloudStack's rules and starts the submission.
    pub fn start_removal(
        &mut self,
        plan: DeletePlan,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Started, ScaleError> {
        let snap = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
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
            self.apply_drops(&plan.drops, &plan.vms);
            return Ok(Started::Done);
        }
        let request = ScaleRequest::RemoveNodes {
            vm_ids: vm_ids.clone(),
        };
        check_scale(&snap.snap, &request, alert).map_err(ScaleError::Refused)?;
        self.check_idle_for_removal()?;
        let names = vm_ids
            .iter()
            .filter_map(|v| snap.snap.vm(v).map(|vm| vm.name.to_ascii_lowercase()))
            .collect();
        self.begin(
            OpKind::Remove {
                from: snap.snap.size,
                vm_ids,
                names,
                drops: plan.drops,
            },
            Origin::Rpc,
            now,
        );
        Ok(Started::Submit(request))
    }

    /// DecreaseTargetSize: cancels only requested nodes that do not exist and will not be
    /// created (queued increases, then failed scale-up placeholders).
    pub fn decrease_target(&mut self, by: u32) -> Result<(), ScaleError> {
        let failed_placeholders = self.failed.iter().filter(|f| f.vm_id.is_none()).count() as u32;
        let queued = self.queue.increase.len() as u32;
        if by > queued + failed_placeholders {
            return Err(ScaleError::DecreaseTooLarge {
                by,
                queued,
                failed_placeholders,
                in_flight: self.phase.describe(),
            });
        }
        let mut left = by;
        while left > 0 && self.queue.increase.pop().is_some() {
            left -= 1;
        }
        while left > 0 {
            if let Some(pos) = self.failed.iter().rposition(|f| f.vm_id.is_none()) {
                self.failed.remove(pos);
            }
            left -= 1;
        }
        Ok(())
    }

    /// CloudStack accepted the submission as `job`. A removal's local drops apply now, and its
    /// VMs are remembered as removed: CloudStack destroys them one by one while the job runs,
    /// so a DeleteNodes naming one that already left the listing is a no-op, not NotFound (a
    /// VM still listed resolves as a VM first).
    pub fn submission_answered(&mut self, job: String, now: Instant) {
        let Some((op, since)) = self.take_submission() else {
            return;
        };
        if let OpKind::Remove {
            vm_ids,
            names,
            drops,
            ..
        } = &op.kind
        {
            for key in vm_ids.iter().chain(names) {
                self.recently_removed.insert(key.clone(), now);
            }
            let (drops, vm_ids) = (drops.clone(), vm_ids.clone());
            self.apply_drops(&drops, &vm_ids);
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
        if op.origin == Origin::Queue
            && let OpKind::Increase { placeholders, .. } = op.kind
        {
            self.record_failed(
                &refused_error(text.to_string()),
                Vec::new(),
                placeholders,
                now,
            );
        }
        self.next_from_queue(alert, now)
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
                    job: job.clone(),
                    since: now,
                };
                vec![Effect::Follow(job)]
            }
            other => {
                self.phase = other;
                Vec::new()
            }
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
            alert_refusal = is_alert_refusal(text)
                && snap
                    .as_ref()
                    .is_some_and(|s| s.snap.state == ClusterState::Alert);
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
        let effects = self.next_from_queue(alert, now);
        Some(Settled {
            kind,
            op,
            changed,
            alert_refusal,
            effects,
        })
    }

    /// Cleanup: followers stop, so the jobs they followed are forgotten; the next snapshot
    /// that shows the cluster Scaling adopts them again.
    pub fn cleanup(&mut self) {
        if matches!(self.phase, Phase::Running { .. } | Phase::Adopted { .. }) {
            self.phase = Phase::Idle;
        }
    }

    /// The queued increases as the next request, when nothing is in flight. A request the
    /// rules refuse becomes failed instances (its RPC answered OK long ago).
    fn next_from_queue(&mut self, alert: &AlertScaling, now: Instant) -> Vec<Effect> {
        if self.phase != Phase::Idle || self.queue.increase.is_empty() {
            return Vec::new();
        }
        let Some(snap) = self.snap.clone() else {
            return Vec::new();
        };
        let placeholders = std::mem::take(&mut self.queue.increase);
        let from = snap.snap.size;
        let to = from.saturating_add(placeholders.len() as u32);
        let request = ScaleRequest::Resize { new_size: to };
        if let Err(r) = check_scale(&snap.snap, &request, alert) {
            self.record_failed(&refused_error(r.to_string()), Vec::new(), placeholders, now);
            return Vec::new();
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
        vec![Effect::Submit(request)]
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
    use crate::domain::cluster::{ClusterInput, ClusterSnapshot, VmInput, VmState};

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
                Ok(()) => "ok".into(),
                Err(e) => format!("err:{}", err_name(&e)),
            },
        }
    }

    fn err_name(e: &ScaleError) -> &'static str {
        match e {
            ScaleError::NoSnapshot => "no-snapshot",
            ScaleError::OutOfRange { .. } => "out-of-range",
            ScaleError::Refused(_) => "refused",
            ScaleError::PreviousAnswerLost => "answer-lost",
            ScaleError::Busy { .. } => "busy",
            ScaleError::UnknownNode { .. } => "unknown-node",
            ScaleError::NotWorker { .. } => "not-worker",
            ScaleError::RegisteredElsewhere { .. } => "registered",
            ScaleError::BeingCreated { .. } => "being-created",
            ScaleError::BelowMin { .. } => "below-min",
            ScaleError::DecreaseTooLarge { .. } => "too-large",
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
            ("idle", Decrease, "err:too-large", "idle", 3),

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
            ("submitting", Decrease, "err:too-large", "submitting", 5),

            ("answer-lost", Increase, "err:answer-lost", "answer-lost", 5),
            ("answer-lost", Answered, "", "answer-lost", 5),
            ("answer-lost", Refused, "", "answer-lost", 5),
            ("answer-lost", Lost, "", "answer-lost", 5),
            ("answer-lost", Found, "follow:job-7", "running", 5),
            ("answer-lost", JobSucceeded, "ignored", "answer-lost", 5),
            ("answer-lost", JobFailed, "ignored", "answer-lost", 5),
            // Too early to tell: the request may still reach CloudStack.
            ("answer-lost", SnapRunning, "", "answer-lost", 5),
            ("answer-lost", SnapScaling, "find", "answer-lost", 5),
            ("answer-lost", SnapRunningLate, "", "idle", 3),
            ("answer-lost", Cleanup, "", "answer-lost", 5),
            ("answer-lost", Decrease, "err:too-large", "answer-lost", 5),

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
            ("running", Decrease, "err:too-large", "running", 5),

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
            ("adopted", Decrease, "err:too-large", "adopted", 3),
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
        assert_eq!(table.len(), phases.len() * 12, "every phase × every event");
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
        let fx = m.snapshot_installed(running3(t0), &ALERT, at(t0, 11));
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
        assert_eq!(m.decrease_target(2), Ok(()));
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
        // size 3 + the failed VM + one placeholder never created.
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

    #[test]
    fn a_removal_drops_the_target_and_remembers_the_vms_once_accepted() {
        let t0 = Instant::now();
        let mut m = machine_in("idle", t0);
        let node = NodeRef {
            provider_id: "external-cloudstack://w2".into(),
            name: "k-node-w2".into(),
            annotations: HashMap::new(),
        };
        let plan = m
            .plan_removal(std::slice::from_ref(&node), 1)
            .expect("plan");
        assert_eq!(plan.vms, ["w2"]);
        let started = m.start_removal(plan, &ALERT, t0).expect("start");
        assert_eq!(
            started,
            Started::Submit(ScaleRequest::RemoveNodes {
                vm_ids: vec!["w2".into()]
            })
        );
        assert_eq!(m.target(), Some(2));
        // Refused: nothing remembered, the target is back.
        assert!(m.submission_refused("no", &ALERT, t0).is_empty());
        assert_eq!(m.target(), Some(3));
        assert!(m.recently_removed.is_empty());
        // Accepted: remembered under id and name; once gone, naming it again is a no-op.
        let plan = m
            .plan_removal(std::slice::from_ref(&node), 1)
            .expect("plan");
        m.start_removal(plan, &ALERT, t0).expect("start");
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
        let again = m.plan_removal(&[node], 1).expect("a no-op");
        assert!(again.vms.is_empty());
        // A second removal while the first runs is refused (one job per cluster).
        let other = NodeRef {
            provider_id: "external-cloudstack://w3".into(),
            ..NodeRef::default()
        };
        assert!(matches!(
            m.check_idle_for_removal(),
            Err(ScaleError::Busy { .. })
        ));
        assert_eq!(
            m.plan_removal(&[other], 1).map(|p| p.vms),
            Ok(vec!["w3".into()])
        );
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
                .plan_removal(&nodes, *min)
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
            RemoveFirstWorker,
            Decrease(u32),
            Answered,
            Refused,
            Lost,
            Found,
            JobEnds {
                failed: bool,
                watched: bool,
            },
            /// A snapshot `secs` later showing the cluster in a state with `workers` VMs.
            Snapshot {
                scaling: bool,
                workers: u32,
                secs: u64,
            },
            Cleanup,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                (1u32..4).prop_map(Step::Increase),
                Just(Step::RemoveFirstWorker),
                (1u32..3).prop_map(Step::Decrease),
                Just(Step::Answered),
                Just(Step::Refused),
                Just(Step::Lost),
                Just(Step::Found),
                (any::<bool>(), any::<bool>())
                    .prop_map(|(failed, watched)| Step::JobEnds { failed, watched }),
                (any::<bool>(), 1u32..7, 0u64..30).prop_map(|(scaling, workers, secs)| {
                    Step::Snapshot {
                        scaling,
                        workers,
                        secs,
                    }
                }),
                Just(Step::Cleanup),
            ]
        }

        fn workers_snapshot(scaling: bool, n: u32, t: Instant) -> Arc<IndexedSnapshot> {
            let ids: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
            let vms: Vec<(&str, VmState)> =
                ids.iter().map(|i| (i.as_str(), VmState::Running)).collect();
            snapshot(if scaling { "Scaling" } else { "Running" }, &vms, t)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            /// Whatever happens, in whatever order: a request is sent only from Idle and
            /// never while another is in flight; a refused request changes nothing; once a
            /// snapshot shows the cluster at rest with nothing in flight, no queued work is
            /// left behind; the target is never below what is queued and failed.
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
                            Ok(Admission::Queued) => prop_assert!(!was_idle),
                            Err(_) => {
                                prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing");
                            }
                        },
                        Step::RemoveFirstWorker => {
                            let node = NodeRef { provider_id: "external-cloudstack://w1".into(), ..NodeRef::default() };
                            if let Ok(plan) = m.plan_removal(&[node], 1)
                                && !plan.vms.is_empty()
                                && m.check_idle_for_removal().is_ok()
                            {
                                match m.start_removal(plan, &ALERT, now) {
                                    Ok(Started::Submit(r)) => effects.push(Effect::Submit(r)),
                                    Ok(_) => {}
                                    Err(_) => prop_assert_eq!(m.target(), before.target()),
                                }
                            }
                        }
                        Step::Decrease(d) => {
                            if m.decrease_target(d).is_err() {
                                prop_assert_eq!(m.target(), before.target());
                            } else {
                                prop_assert_eq!(m.target(), before.target().map(|t| t - d));
                            }
                        }
                        Step::Answered => m.submission_answered(format!("job-{}", now.duration_since(t0).as_secs()), now),
                        Step::Refused => effects = m.submission_refused("no", &ALERT, now),
                        Step::Lost => m.submission_lost(),
                        Step::Found => effects = m.job_found("job-x".into(), now),
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
                        Step::Snapshot { scaling, workers, secs } => {
                            now += Duration::from_secs(secs);
                            effects = m.snapshot_installed(workers_snapshot(scaling, workers, now), &ALERT, now);
                            if !scaling && m.phase() == &Phase::Idle {
                                prop_assert!(m.queue().increase.is_empty(), "queued work stranded: {:?}", m);
                            }
                        }
                        Step::Cleanup => m.cleanup(),
                    }
                    let submits = effects.iter().filter(|e| matches!(e, Effect::Submit(_))).count();
                    prop_assert!(submits <= 1);
                    if submits == 1 {
                        prop_assert!(
                            !matches!(before.phase(), Phase::Submitting { .. } | Phase::AnswerLost { .. } | Phase::Running { .. } | Phase::Adopted { .. })
                                || matches!(s, Step::Refused | Step::JobEnds { .. } | Step::Snapshot { .. }),
                            "a request sent while another was in flight: {:?} then {:?}", before.phase(), s
                        );
                        prop_assert_eq!(m.phase().name(), "submitting");
                    }
                    let floor = (m.queue().increase.len() + m.failed().len()) as u32;
                    prop_assert!(m.target().unwrap_or(0) >= floor);
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
