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
//!
//! # Files
//! This file holds the vocabulary (phases, operations, effects) and the machine's state; the
//! rest is split by what moves it:
//! - `events`: what CloudStack says moves the phase: a new snapshot, the answer to a submission,
//!   a job found or not, a job's end (and what it leaves behind), Cleanup.
//! - `increase`: IncreaseSize, admitted on the cached state and started on a fresh snapshot.
//! - `delete`: DeleteNodes: the named nodes resolved and guarded, then accepted into the queue.
//! - `queue`: the work accepted but not sent: the collection window, the next request when the
//!   phase returns to `Idle`, and the retries and stops of removals still owed.
//! - `target`: the target size, and DecreaseTargetSize.
//! - `nodes`: what a node or instance id names in the group; node↔VM pairings learned.
//! - `sharded`: the map those pairings are kept in, so that a change of the machine, which a
//!   published view shares, does not copy all of them.
//! - `replies`: when a caller told OK hears it: once the ledger holding its promise is written.
//! - `retry`: how an owed removal is retried (failed jobs, refusals, requests not sent, stops).
//! - `search`: what the job list said about the job a group waits for.
//! - `error`: why the machine refuses a request.
//! - `tests`: the phase × event table (`every_phase_against_every_event`) and the rest.

mod agenda;
mod cordon;
mod delete;
mod error;
mod events;
mod external;
mod handle;
mod increase;
mod ledger;
mod nodes;
mod offerings;
mod pace;
mod queue;
mod replies;
mod retry;
mod search;
mod sharded;
mod stranded;
mod target;
mod withdraw;

pub use agenda::{Agenda, Due, JobPoll, Next};
pub use delete::{Acceptance, Accepted, NodeRef};
pub use error::{Ask, ScaleError};
pub use events::{JobEnd, WatchedAnswer};
use external::ExternalScaleUp;
pub use handle::{Answer, Event, Sent, Step};
pub use increase::{Admission, Started};
pub use ledger::{Ledger, OwedRemoval};
pub use nodes::Hit;
pub(crate) use nodes::LearnedNode;
pub use pace::Watched;
#[cfg(test)]
use queue::WINDOW_QUIET;
pub(crate) use queue::{Queue, QueuedRemoval};
use replies::Replies;
pub use replies::{CallId, Heard, Hold, Reply};
pub use retry::StopAnswer;
pub use search::SearchNews;
use sharded::ShardedMap;
pub use stranded::StrandNews;
pub use target::Decreased;

use super::cluster::IndexedSnapshot;
use super::rules::ScaleRequest;
use super::status::InstanceError;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// What a scale job did, as the job counters label it: a scale-up, a removal of nodes, or a
/// job this provider did not start (adopted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    ScaleUp,
    RemoveNodes,
    Adopted,
}

impl JobKind {
    pub const ALL: [JobKind; 3] = [JobKind::ScaleUp, JobKind::RemoveNodes, JobKind::Adopted];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::ScaleUp => "scale_up",
            JobKind::RemoveNodes => "remove_nodes",
            JobKind::Adopted => "adopted",
        }
    }

    /// The kind of the job an operation (`None`: adopted) runs as.
    pub fn of(op: Option<&OpKind>) -> JobKind {
        match op {
            Some(OpKind::Increase { .. }) => JobKind::ScaleUp,
            Some(OpKind::Remove { .. }) => JobKind::RemoveNodes,
            None => JobKind::Adopted,
        }
    }
}

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
    ///
    /// [`MAX_REMOVAL_ATTEMPTS`]: retry::MAX_REMOVAL_ATTEMPTS
    RemovalAbandoned { vms: Vec<String>, reason: String },
    /// Accepted removals of down VMs that this CloudStack (without Alert scaling) can never
    /// carry out: it would drain them, the drain fails and the cluster goes to Alert. Still
    /// owed and out of the target; sent once the VM runs again (or the verdict changes), gone
    /// with the VM if an operator removes it in CloudStack. Said once per removal, loudly,
    /// instead of retrying it for half an hour.
    RemovalBlocked { vms: Vec<String>, reason: String },
    /// A size job ended successfully but CloudStack lists a smaller size than it asked for
    /// (see `ScaleMachine::job_finished`): the VMs not listed are failed creations now. Tell
    /// the operator: CloudStack said it scaled and did not.
    SizeNotReached {
        job: String,
        asked: u32,
        listed: u32,
    },
    /// CloudStack refused `stopVirtualMachine` to the key (432): one key serves every group,
    /// so no group's machine may promise a stop any more (`set_can_stop_vms(false)` on each),
    /// and the operator is told once what the provider does without it.
    KeyMayNotStop { reason: String },
    /// The followed job ended (news for the operator and the job metrics). `alert_refusal`:
    /// its failure shows this CloudStack does not scale a cluster in Alert, which holds for
    /// every group.
    JobEnded {
        job: String,
        kind: JobKind,
        end: JobEnd,
        alert_refusal: bool,
    },
    /// What a job search changed (news for the operator and the job metrics).
    Searched(SearchNews),
    /// The listing shows the cluster stranded by CloudStack (or by another rule than before),
    /// or no longer stranded: said once per change. Tell the operator (an ERROR when stranded:
    /// every scale request is refused until an operator repairs it).
    Stranding(StrandNews),
    /// The listing shows the cluster externally managed (clustertype ExternalManaged), which it
    /// did not before: CloudStack does not scale it, so every scale request is refused. Tell
    /// the operator.
    ExternallyManaged,
    /// The node of a VM a failed scale-up left registered: it is a node of the group, no
    /// longer a failed creation. Tell the operator.
    NodeOfFailedVm { vm: String, node: String },
    /// A node carries a providerID other than CloudStack's CCM default: its instance is
    /// reported under the node's own id from now on. Tell the operator.
    OwnProviderId {
        vm: String,
        node: String,
        provider_id: String,
    },
    /// A caller heard OK before the ledger holding its promise was written (its deadline
    /// came first; `replies`): a restart before the promise is kept would forget it. Say so
    /// loudly.
    AnsweredUnrecorded,
    /// A caller's deadline came before the ledger holding its promise was written, and
    /// nothing of what it asked had started: taken back (these removals, this many queued
    /// nodes of an increase), and the caller hears that nothing was accepted (`replies`).
    /// Tell the operator.
    PromiseWithdrawn {
        vms: Vec<String>,
        placeholders: usize,
    },
    /// A DeleteNodes caller's deadline neared before its window's request was answered: its
    /// removals are owed from now on, whatever becomes of the request (`replies`). Tell the
    /// operator.
    PromisedAtDeadline { vms: Vec<String> },
    /// Accepted removals withdrawn: their nodes lost the autoscaler's deletion mark (it
    /// restarted, or gave them up), so their VMs count in the target again. Tell the operator.
    RemovalsWithdrawn { vms: Vec<String> },
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
    /// VM id → the node learned for it. Sharded: the shell copies the machine on each change
    /// after a publication, and one learn per node of a large cluster must not copy them all.
    pub(crate) learned: ShardedMap<LearnedNode>,
    /// Learned providerID → VM id, for fake nodes carrying an id we reported.
    pub(crate) learned_by_provider_id: ShardedMap<String>,
    /// VMs this provider removed (id and lower-cased name → when).
    pub(crate) recently_removed: HashMap<String, Instant>,
    /// Failed creations written off by DecreaseTargetSize: VMs a failed scale-up left that the
    /// autoscaler gave up on (`stranded`).
    pub(crate) written_off: HashSet<String>,
    /// The stranding last noted ([`ScaleMachine::note_stranded`]).
    pub(crate) stranded_noted: Option<crate::stranded::StrandRule>,
    next_placeholder: u64,
    timings: Timings,
    /// Whether this provider may stop a VM (`stopVirtualMachine`) before removing it, as the
    /// shell last learned it (a key without the command is answered 432).
    can_stop_vms: bool,
    /// The group's maximum as the last IncreaseSize gave it: queued increases are not sent
    /// while CloudStack's size, which still counts VMs of owed removals, would pass it.
    pub(crate) max_size: Option<u32>,
    /// Running VMs this provider asked CloudStack to remove since CloudStack's status scanner
    /// last reconciled the cluster to Running (`cordon_suspects`): a removal that failed or
    /// whose answer was lost may have left the node cordoned by CloudStack's drain.
    pub(crate) drain_sent: HashSet<String>,
    /// When a removal this provider sent last began, or a job was last seen to end: the
    /// listings that clear `drain_sent` (Alert, then Running) must both be asked for after
    /// this. One asked earlier may show the cluster before the removal's job was picked up
    /// and failed on its drain, or the Running a job's success sets whatever the cordons.
    pub(crate) drain_fresh_after: Option<Instant>,
    /// A size job failed on CloudStack's offering map (apache/cloudstack#11994): size
    /// requests are refused until the cluster's listed offerings change.
    pub(crate) size_broken: Option<offerings::SizeScalingBroken>,
    /// Scale-ups of a cluster listing an external node (apache/cloudstack#12633).
    pub(crate) external_scale_up: ExternalScaleUp,
    /// How long this cluster's jobs take, for when to poll them (`pace`).
    pub(crate) pace: pace::JobPace,
    /// The OKs waiting for the record of their promise (`replies`).
    replies: Replies,
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
            learned: ShardedMap::default(),
            learned_by_provider_id: ShardedMap::default(),
            recently_removed: HashMap::new(),
            written_off: HashSet::new(),
            stranded_noted: None,
            next_placeholder: 0,
            timings,
            can_stop_vms: true,
            max_size: None,
            drain_sent: HashSet::new(),
            drain_fresh_after: None,
            size_broken: None,
            external_scale_up: ExternalScaleUp::Refuse,
            pace: pace::JobPace::default(),
            replies: Replies::default(),
        }
    }

    /// The group's maximum (`--nodes`): no scale request is sent past it.
    pub fn set_max_size(&mut self, max: u32) {
        self.max_size = Some(max);
    }

    /// What the shell knows of the key: whether `stopVirtualMachine` may be called.
    pub(crate) fn set_can_stop_vms(&mut self, yes: bool) {
        self.can_stop_vms = yes;
    }

    /// Whether this machine may promise a stop (`stopVirtualMachine`), as last learned.
    pub fn can_stop_vms(&self) -> bool {
        self.can_stop_vms
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Whether the phase waits on something no job id can tell: a lost answer (settled by a
    /// snapshot) or a job adopted without its id (a scale job names no cluster, so its end is
    /// the cluster leaving Scaling). Then the cluster itself is read every poll interval, so
    /// its end is seen, and queued work sent, without waiting for an autoscaler's Refresh.
    pub(crate) fn follows_state(&self) -> bool {
        matches!(
            self.phase,
            Phase::AnswerLost { .. } | Phase::Adopted { job: None, .. }
        )
    }

    #[cfg(test)]
    pub(crate) fn queue(&self) -> &Queue {
        &self.queue
    }

    pub fn failed(&self) -> &[FailedInstance] {
        &self.failed
    }

    pub fn snapshot(&self) -> Option<&Arc<IndexedSnapshot>> {
        self.snap.as_ref()
    }

    fn begin(&mut self, kind: OpKind, origin: Origin, now: Instant) {
        if let (OpKind::Remove { vm_ids, .. }, Some(snap)) = (&kind, &self.snap) {
            // CloudStack drains these (a down VM is not drained).
            self.drain_sent.extend(
                vm_ids
                    .iter()
                    .filter(|v| snap.snap.vm(v).is_some_and(|vm| !vm.state.is_down()))
                    .cloned(),
            );
            self.drain_fresh_after = Some(now);
        }
        self.phase = Phase::Submitting {
            op: Op { kind, origin },
            since: now,
        };
    }
}

#[cfg(test)]
mod tests;
