//! The shell around the domain core: one `Group` per configured CKS cluster holding its
//! [`ScaleMachine`], the locks, the CloudStack calls, the spawned job followers and the cache
//! of read answers. Nothing here decides: every rule about a scale operation's life is in
//! `cks_domain::machine`; this module feeds it events (with the time, on tokio's clock so
//! tests can pause and advance it) and carries out the effects it returns.
//!
//! Reads (NodeGroups, NodeGroupForNode, NodeGroupNodes, NodeGroupTargetSize) are answered from
//! memory. Only Refresh, the scale RPCs and the job followers call CloudStack.
//!
//! Callers: the gRPC layer calls through [`Provider::seen_by`], which shows each autoscaler
//! only the groups bound to it (`--nodes …@CLIENT`, `caller`); a caller never sees or
//! changes another client's group. The provider's own methods of the same names see every
//! group, for the operator's tools (metrics, demo, tests).
//!
//! Locking: each group has a `std::sync::Mutex` over its state, never held across an `.await`;
//! every transition of the machine is one critical section, and a submission starts only from
//! the `Idle` phase, so at most one CloudStack scale job per cluster is started at a time
//! without any lock held while CloudStack answers.

mod alert;
mod blocked;
mod caller;
mod error;
mod follow;
mod ops;
mod refresh;
mod store;
mod view;

#[cfg(test)]
mod tests;

pub use caller::Caller;
pub use cks_domain::instances::InstanceView;
pub use cks_domain::machine::NodeRef;
pub use cks_domain::verdict::AlertVerdictView;
pub use error::{Error, Result};
pub use store::StateError;
pub use view::NodeGroupView;

use crate::config::{BoundNodeGroup, ClusterRef, NodeGroupSpec};
use cks_cloudstack::types::{KubernetesCluster, ServiceOffering};
use cks_cloudstack::{Client, CsError};
use cks_domain::cluster::{
    ClusterInput, ClusterSnapshot, ClusterState, IndexedSnapshot, OfferingRef, VmInput, VmState,
};
use cks_domain::machine::{Effect, Phase, ScaleMachine, Timings};
use cks_domain::registry::Registrations;
use cks_domain::rules::AlertScaling;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Whether the CloudStack behind the provider scales clusters in Alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AlertScalingMode {
    /// Assume it does until CloudStack refuses a request because the cluster is in Alert; from
    /// then on refuse such requests locally with CloudStack's text.
    Auto,
    /// This CloudStack has the Alert-scaling change.
    On,
    /// This CloudStack refuses every scale request in Alert.
    Off,
}

/// Provider behaviour settings (the `serve` flags).
#[derive(Debug, Clone)]
pub struct Settings {
    pub groups: Vec<NodeGroupSpec>,
    /// The client each group of `groups` is served to (`--nodes …@CLIENT`), by position; a
    /// group without an entry, or with `None`, is served to every client.
    pub clients: Vec<Option<String>>,
    /// The autoscaler's max-node-provision-time: for that long after an autoscaler reported
    /// a VM's node (NodeGroupForNode), the VM is not deleted through a fake "unregistered"
    /// node.
    pub max_node_provision_time: Duration,
    /// How often a followed job is polled with `queryAsyncJobResult`.
    pub job_poll_interval: Duration,
    /// A Refresh within this time of the last successful fetch reuses it (several autoscaler
    /// loops, or a Refresh right after a job finished, cost no extra CloudStack call).
    pub refresh_min_interval: Duration,
    /// How old a snapshot may be and still be served when CloudStack cannot be reached.
    pub staleness_bound: Duration,
    /// How many refresh rounds (one cluster each) may ask CloudStack at once; the others
    /// wait their turn in the order they came.
    pub refresh_concurrency: usize,
    /// How long a scale RPC watches the job it submitted for an immediate refusal
    /// (CloudStack validates inside the job). Capped by the request's own deadline.
    pub scale_watch: Duration,
    /// The deadline assumed when a request carries no `grpc-timeout` (the autoscaler's
    /// default is 5 s).
    pub default_rpc_deadline: Duration,
    pub alert_scaling: AlertScalingMode,
    /// How long instances of a failed scale-up are reported (so the autoscaler deletes them
    /// and backs off) before they are forgotten.
    pub failed_instance_ttl: Duration,
    /// How long a job is polled every `job_poll_interval` (CloudStack's own scale timeout is
    /// one hour by default); a job still running after it is polled rarely, and stays the
    /// group's operation. Also how far back `listAsyncJobs` is searched for a running job.
    pub job_max_follow: Duration,
    /// How long a verdict "this CloudStack does not scale in Alert", learned from one of its
    /// refusals, stands before CloudStack is asked again (a changed `cloudstackversion` drops
    /// it at once).
    pub alert_recheck: Duration,
    /// How long DeleteNodes calls arriving at rest are collected into one `nodeids` request
    /// (the autoscaler sends one call per node, in parallel). Capped by the first call's
    /// deadline.
    pub removal_window: Duration,
    /// GPULabel answer.
    pub gpu_label: String,
    /// GetAvailableGPUTypes answer.
    pub gpu_types: Vec<String>,
    /// Client names shut out (`--deny-client`): a caller holding one sees no group.
    pub denied_clients: Vec<String>,
    /// Where every group's promises are recorded (`--state-file`); `None`: nowhere, they end
    /// with the process.
    pub state_file: Option<std::path::PathBuf>,
    /// The ConfigMap every group's promises are recorded in instead (`--state-configmap`).
    pub state_configmap: Option<crate::kube::ConfigMapRef>,
}

impl Settings {
    /// Groups bound to their clients (`--nodes MIN:MAX:CLUSTER[@CLIENT]`), defaults for
    /// everything else.
    pub fn with_bound_groups(groups: Vec<BoundNodeGroup>) -> Self {
        let (groups, clients) = groups.into_iter().map(|b| (b.group, b.client)).unzip();
        Settings {
            clients,
            ..Settings::with_groups(groups)
        }
    }

    /// Defaults for everything but the groups, which are served to every client.
    pub fn with_groups(groups: Vec<NodeGroupSpec>) -> Self {
        Settings {
            groups,
            clients: Vec::new(),
            // What the deploy manifests give the autoscaler (docs/operations.md §1).
            max_node_provision_time: Duration::from_secs(25 * 60),
            job_poll_interval: Duration::from_secs(2),
            refresh_min_interval: Duration::from_secs(5),
            staleness_bound: Duration::from_secs(120),
            refresh_concurrency: 16,
            scale_watch: Duration::from_millis(1500),
            default_rpc_deadline: Duration::from_secs(5),
            alert_scaling: AlertScalingMode::Auto,
            failed_instance_ttl: Duration::from_secs(30 * 60),
            job_max_follow: Duration::from_secs(2 * 3600),
            removal_window: Duration::from_millis(500),
            alert_recheck: Duration::from_secs(10 * 60),
            gpu_label: String::new(),
            gpu_types: Vec::new(),
            denied_clients: Vec::new(),
            state_file: None,
            state_configmap: None,
        }
    }
}

/// The state of one group: the scale machine (snapshot, phase, queue, failed instances,
/// learned nodes) plus what only the shell needs.
#[derive(Debug)]
pub(crate) struct GroupState {
    /// Every decision about the group's scale operations is the machine's.
    pub scale: ScaleMachine,
    pub last_error: Option<String>,
    pub worker_offering: Option<ServiceOffering>,
    /// Labels of a real node of this group, copied into the template node.
    pub sample_labels: Option<std::collections::BTreeMap<String, String>>,
    /// Answers derived from the fields above; see [`Views`].
    pub views: Views,
    /// The outcome of the open removal window, for DeleteNodes calls joining it.
    pub removal_window: Option<tokio::sync::watch::Receiver<ops::WindowOutcome>>,
}

/// Read answers derived from a group's state (instances, placeholders, the debug line),
/// computed on first use and dropped by every [`Group::lock`], the only way to change the
/// state. The autoscaler asks NodeGroupForNode several times per node per loop; without this
/// each answer would walk every worker VM, and a loop would cost O(workers²).
#[derive(Debug, Default)]
pub(crate) struct Views {
    /// The debug line and the Alert-scaling knowledge it was built with (provider-wide, so
    /// not part of the group's state: a change of it is noticed on use).
    pub debug: OnceLock<(AlertScaling, String)>,
    pub instances: OnceLock<Arc<Vec<InstanceView>>>,
    /// Placeholder ids of requested VMs CloudStack does not list yet.
    pub pending: OnceLock<Vec<String>>,
}

pub(crate) struct Group {
    pub spec: NodeGroupSpec,
    /// The only client this group is served to (`--nodes …@CLIENT`); `None`: every client.
    pub client: Option<String>,
    /// The group's VMs whose nodes were reported registered, and when. Apart from `state`
    /// so that recording a sighting (every NodeGroupForNode) leaves the cached views alone;
    /// taken after `state` when both are held, never the other way round.
    pub registered: Mutex<Registrations>,
    /// Wakes the job follower early (a snapshot shows the job may be over).
    pub poke: tokio::sync::Notify,
    /// The group's refresh round in flight and when it was last asked for (`refresh`).
    pub refresh: Mutex<refresh::RefreshSlot>,
    /// A task follows the cluster's state (a job it cannot name, a lost answer): at most one.
    pub state_follower: std::sync::atomic::AtomicBool,
    /// Never held across an `.await`: every transition is one critical section.
    pub state: Mutex<GroupState>,
    /// Told of every change of `state`, so the promises it holds are recorded.
    store: Arc<store::Store>,
}

/// Read-only access to a group's state: derived answers may be cached through it, nothing
/// else can change.
pub(crate) struct ReadGuard<'a>(MutexGuard<'a, GroupState>);

impl std::ops::Deref for ReadGuard<'_> {
    type Target = GroupState;
    fn deref(&self) -> &GroupState {
        &self.0
    }
}

impl Group {
    /// The state, to change it: drops every cached view, so nothing derived from the old state
    /// can be served after the change.
    pub fn lock(&self) -> MutexGuard<'_, GroupState> {
        let mut st = self.guard();
        st.views = Views::default();
        // Asked while the lock is held: the writer reads the state through this lock, so it
        // sees the change this caller is about to make, or looks again.
        self.store.touch();
        st
    }

    /// The state, to read it (cached views stay valid).
    pub(crate) fn read(&self) -> ReadGuard<'_> {
        ReadGuard(self.guard())
    }

    fn guard(&self) -> MutexGuard<'_, GroupState> {
        // A panic while holding the lock would poison it; the state itself stays consistent
        // (every change is made in one critical section), so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) struct Inner {
    pub cs: Client,
    pub settings: Settings,
    pub groups: Vec<Group>,
    pub alert: Mutex<cks_domain::verdict::AlertVerdict>,
    /// One permit per refresh round asking CloudStack (`refresh`); FIFO, so clusters are
    /// served in the order they asked.
    pub round_permits: tokio::sync::Semaphore,
    /// Worker offerings read, shared by every group (`refresh`).
    pub offerings: tokio::sync::Mutex<refresh::OfferingCache>,
    /// A `listCapabilities` check is in flight: concurrent rounds do not ask again.
    pub version_check: AtomicBool,
    /// The durable record of the groups' promises (`store`).
    pub store: Arc<store::Store>,
    /// Callers already logged as matching no group.
    pub unmatched: caller::Unmatched,
    pub shutdown: watch::Sender<bool>,
    pub ready: watch::Sender<bool>,
    /// The optional commands the key may call, each learned once from CloudStack's 432.
    pub optional: OptionalCommands,
}

/// Time kept back from the caller's deadline for the answer to travel back.
const DEADLINE_MARGIN: Duration = Duration::from_millis(300);

/// `deadline` less the margin the answer needs to travel back (never in the past).
pub(crate) fn before(deadline: tokio::time::Instant) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    deadline
        .checked_sub(DEADLINE_MARGIN)
        .unwrap_or(now)
        .max(now)
}

/// Now, on tokio's clock (which tests can pause and advance), as the `std` instant the domain
/// core takes.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The commands beyond the four every key CKS gives may call (`listKubernetesClusters`,
/// `scaleKubernetesCluster`, `queryAsyncJobResult`, `listVirtualMachines`): each is tried until
/// CloudStack answers 432 (not available to the account), then never again; the provider says
/// once, in one line, what it does without it.
#[derive(Debug)]
pub(crate) struct OptionalCommands {
    /// `listAsyncJobs`: adopting running jobs by id, settling lost answers by the job list.
    pub jobs: AtomicBool,
    /// `listServiceOfferings`: the template node's full offering (else a worker VM's sizes).
    pub offerings: AtomicBool,
    /// `listCapabilities`: re-checking the Alert-scaling verdict on a CloudStack upgrade.
    pub capabilities: AtomicBool,
    /// Whether `stopVirtualMachine` is allowed is known (asked once, before the first promise
    /// that needs a stop: `refresh::learn_stop_permission`); until then no machine promises a
    /// stop.
    pub stop_known: AtomicBool,
    /// A question about `stopVirtualMachine` is in flight.
    pub stop_asking: AtomicBool,
}

impl Default for OptionalCommands {
    fn default() -> Self {
        OptionalCommands {
            jobs: AtomicBool::new(true),
            offerings: AtomicBool::new(true),
            capabilities: AtomicBool::new(true),
            stop_known: AtomicBool::new(false),
            stop_asking: AtomicBool::new(false),
        }
    }
}

/// A group's cluster as just fetched, and the effects the machine asked for on seeing it.
#[must_use = "the machine's effects must be run"]
pub(crate) struct Fetched {
    pub snapshot: Arc<IndexedSnapshot>,
    pub effects: Vec<Effect>,
}

/// The provider. Cheap to clone.
#[derive(Clone)]
pub struct Provider {
    pub(crate) inner: Arc<Inner>,
}

/// The provider as one caller sees it ([`Provider::seen_by`]): the RPCs' operations, limited to
/// the caller's groups. Any other group is not found, as one that does not exist, and nothing
/// is done to it.
#[derive(Clone, Copy)]
pub struct Scoped<'a> {
    pub(crate) p: &'a Provider,
    /// `None`: every group (the provider's own methods).
    pub(crate) caller: Option<&'a Caller>,
    /// The caller holds a `--deny-client` name: it sees no group (decided once per call, in
    /// [`Provider::seen_by`]).
    pub(crate) denied: bool,
}

impl<'a> Scoped<'a> {
    /// Whether group `gi` is the caller's (a denied caller has none).
    pub(crate) fn sees(&self, gi: usize) -> bool {
        !self.denied
            && self
                .caller
                .is_none_or(|c| c.may_see(self.p.inner.groups[gi].client.as_deref()))
    }

    /// The caller's groups, by index.
    pub(crate) fn visible(&self) -> Vec<usize> {
        (0..self.p.inner.groups.len())
            .filter(|gi| self.sees(*gi))
            .collect()
    }

    pub(crate) fn sees_any(&self) -> bool {
        (0..self.p.inner.groups.len()).any(|gi| self.sees(gi))
    }

    /// The caller's group with this node-group id (= resolved cluster id). Another caller's
    /// group is [`Error::UnknownGroup`], listing only the caller's own.
    pub(crate) fn group(&self, id: &str) -> Result<(usize, &'a Group)> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("node group id is empty".into()));
        }
        let p = self.p;
        for (i, g) in p.inner.groups.iter().enumerate() {
            if self.sees(i) && g.read().scale.cluster_id.as_deref() == Some(id) {
                return Ok((i, g));
            }
        }
        let configured = self
            .visible()
            .into_iter()
            .map(|gi| p.configured_name(gi))
            .collect::<Vec<_>>();
        Err(Error::UnknownGroup {
            id: error::echo(id),
            configured: if configured.is_empty() {
                "none for this client".to_string()
            } else {
                configured.join(", ")
            },
        })
    }

    /// Whether the caller has a node group with this id.
    pub fn has_group(&self, id: &str) -> Result<()> {
        self.group(id).map(|_| ())
    }

    /// Stops following the caller's groups' jobs (they keep running in CloudStack; a later
    /// Refresh adopts them again). Other groups are left alone.
    pub fn cleanup(&self) {
        for gi in self.visible() {
            let g = &self.p.inner.groups[gi];
            g.lock().scale.cleanup();
            // Its follower wakes, finds the job no longer the group's and ends.
            g.poke.notify_one();
        }
    }

    /// Refresh of the caller's groups, as [`Provider::refresh_within`] does it for all.
    pub async fn refresh_within(&self, deadline: Option<tokio::time::Instant>) -> Result<()> {
        self.p.refresh_groups(self.visible(), deadline).await
    }
}

/// Converts CloudStack's cluster object into the domain's input.
pub(crate) fn cluster_input(c: KubernetesCluster) -> ClusterInput {
    let offering = |id: Option<String>, name: Option<String>| {
        id.map(|id| OfferingRef {
            id,
            name: name.unwrap_or_default(),
        })
    };
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    ClusterInput {
        state: ClusterState::parse(&c.state),
        id: c.id,
        name: c.name,
        size: clamp(c.size),
        min_size: c.minsize.map(clamp),
        max_size: c.maxsize.map(clamp),
        autoscaling_enabled: c.autoscalingenabled,
        control_nodes: clamp(c.controlnodes),
        etcd_nodes: c.etcdnodes.map(clamp).unwrap_or(0),
        service_offering: offering(c.serviceofferingid, c.serviceofferingname),
        worker_offering: offering(c.workerofferingid, c.workerofferingname),
        zone_id: c.zoneid.unwrap_or_default(),
        zone_name: c.zonename.unwrap_or_default(),
        externally_managed: c
            .clustertype
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case("ExternalManaged")),
        vms: c
            .virtualmachines
            .into_iter()
            .map(|v| VmInput {
                state: VmState::parse(&v.state),
                id: v.id,
                name: v.name,
                is_external: v.isexternalnode,
                is_etcd: v.isetcdnode,
            })
            .collect(),
    }
}

impl Provider {
    /// Builds the provider; nothing is fetched yet (see [`Provider::refresh`]).
    pub fn new(cs: Client, settings: Settings) -> Self {
        let alert = match settings.alert_scaling {
            AlertScalingMode::Auto => AlertScaling::Unknown,
            AlertScalingMode::On => AlertScaling::Supported,
            AlertScalingMode::Off => AlertScaling::Unsupported {
                cloudstack_error: "configured with --alert-scaling=off".to_string(),
            },
        };
        let timings = Timings {
            failed_ttl: settings.failed_instance_ttl,
            // A request given up on may still be on its way to CloudStack (or queued there):
            // only once it is older than the longest a request may take, plus a moment for the
            // job to start, does a cluster not Scaling mean it never came.
            lost_settle: cs.request_timeout()
                + settings.job_poll_interval.max(Duration::from_secs(1)),
        };
        let store = Arc::new(store::Store::new(
            settings.state_file.clone(),
            settings.state_configmap.clone(),
        ));
        let groups = settings
            .groups
            .iter()
            .enumerate()
            .map(|(gi, spec)| {
                let cluster_id = match &spec.cluster {
                    ClusterRef::Id(id) => Some(id.clone()),
                    ClusterRef::Name(_) => None,
                };
                Group {
                    spec: spec.clone(),
                    client: settings.clients.get(gi).cloned().flatten(),
                    registered: Mutex::new(Registrations::new(settings.max_node_provision_time)),
                    state: Mutex::new(GroupState {
                        // No stop is promised before the key is known to allow it.
                        scale: {
                            let mut m = ScaleMachine::new(cluster_id, timings);
                            m.set_can_stop_vms(false);
                            m
                        },
                        last_error: None,
                        worker_offering: None,
                        sample_labels: None,
                        views: Views::default(),
                        removal_window: None,
                    }),
                    poke: tokio::sync::Notify::new(),
                    refresh: Mutex::new(refresh::RefreshSlot::default()),
                    state_follower: std::sync::atomic::AtomicBool::new(false),
                    store: store.clone(),
                }
            })
            .collect();
        let (shutdown, _) = watch::channel(false);
        let (ready, _) = watch::channel(false);
        let round_permits = tokio::sync::Semaphore::new(settings.refresh_concurrency.max(1));
        Provider {
            inner: Arc::new(Inner {
                cs,
                settings,
                groups,
                alert: Mutex::new(cks_domain::verdict::AlertVerdict::new(alert)),
                round_permits,
                offerings: tokio::sync::Mutex::new(refresh::OfferingCache::default()),
                version_check: AtomicBool::new(false),
                store,
                unmatched: caller::Unmatched::default(),
                shutdown,
                ready,
                optional: OptionalCommands::default(),
            }),
        }
    }

    /// The settings this provider runs with.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Becomes true once every group has a first snapshot (gRPC health SERVING).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    /// Every group, as the provider itself sees them: the explicit all-groups view of the
    /// metrics, the demo and tests. The gRPC service never takes it: each RPC goes through its
    /// caller's view ([`Provider::seen_by`]).
    pub fn all_groups(&self) -> Scoped<'_> {
        Scoped {
            p: self,
            caller: None,
            denied: false,
        }
    }

    /// The group with this node-group id (= resolved cluster id).
    pub(crate) fn group(&self, id: &str) -> Result<(usize, &Group)> {
        self.all_groups().group(id)
    }

    /// A group's id for messages, or what `--nodes` named it by before it is resolved.
    fn configured_name(&self, gi: usize) -> String {
        let g = &self.inner.groups[gi];
        match (&g.spec.cluster, g.read().scale.cluster_id.clone()) {
            (_, Some(id)) => id,
            (ClusterRef::Name(n), None) => format!("{n} (name, not resolved yet)"),
            (ClusterRef::Id(id), None) => id.clone(),
        }
    }

    /// Stops background work (job followers) of every group. Jobs keep running in CloudStack;
    /// a later Refresh adopts them again.
    pub fn cleanup(&self) {
        self.inner.shutdown.send_replace(true);
        for g in &self.inner.groups {
            g.lock().scale.cleanup();
        }
        self.inner.shutdown.send_replace(false);
    }

    /// Installs a freshly fetched cluster as the group's snapshot; returns it and the effects
    /// the machine asks for.
    fn install_snapshot(
        &self,
        gi: usize,
        cluster: KubernetesCluster,
    ) -> (Arc<IndexedSnapshot>, Vec<Effect>) {
        let g = &self.inner.groups[gi];
        let snap = ClusterSnapshot::classify(cluster_input(cluster));
        if let Some(w) = &snap.classification_warning {
            tracing::error!(cluster = %snap.name, "{w}");
        }
        let indexed = Arc::new(IndexedSnapshot::new(snap, now()));
        let alert = self.alert_scaling();
        let effects = {
            let mut st = g.lock();
            st.last_error = None;
            let newly_external = indexed.snap.externally_managed
                && st
                    .scale
                    .snapshot()
                    .is_none_or(|s| !s.snap.externally_managed);
            if newly_external {
                tracing::warn!(group = %indexed.snap.name,
                    "cluster {} is externally managed (clustertype ExternalManaged): CloudStack does not scale it; \
                     this provider lists its workers but refuses every scale request for it",
                    indexed.snap.name);
            }
            st.scale.snapshot_installed(indexed.clone(), &alert, now())
        };
        self.note_blocked(gi);
        self.update_ready();
        (indexed, effects)
    }

    /// Carries out what the machine asked for. `FindJob` is awaited (so a Refresh answers
    /// with the adopted job counted); requests are sent by tasks of their own.
    pub(crate) async fn run_effects(&self, gi: usize, effects: Vec<Effect>) {
        let mut effects = std::collections::VecDeque::from(effects);
        while let Some(effect) = effects.pop_front() {
            match effect {
                Effect::PollNow => self.inner.groups[gi].poke.notify_one(),
                Effect::Follow(job) => self.spawn_follower(gi, job),
                Effect::Submit(request) => {
                    let p = self.clone();
                    tokio::spawn(async move { p.submit_queued(gi, request).await });
                }
                Effect::FindJob => {
                    effects.extend(self.find_and_follow(gi).await);
                    self.spawn_state_follower(gi);
                }
                Effect::RemovalRetried {
                    vms,
                    reason,
                    retry_in,
                } => {
                    crate::metrics::record_removals_retried(vms.len());
                    tracing::warn!(group = %self.group_label(gi), vms = %vms.join(","), ?retry_in,
                        "accepted node removals did not happen yet; they stay out of the target size and are sent again: {reason}");
                }
                Effect::RemovalAbandoned { vms, reason } => {
                    crate::metrics::record_removals_abandoned(vms.len());
                    tracing::error!(group = %self.group_label(gi), vms = %vms.join(","),
                        "accepted node removals abandoned after repeated failures: the autoscaler counts these nodes as gone and they stay cordoned; remove the VMs by hand, or stop them and the provider removes them: {reason}");
                }
            }
        }
        self.send_stops(gi);
    }

    /// Stops the VMs of owed removals that cannot be drained (each in a task of its own), and
    /// follows each stop job to its end: then the cluster is read again, shows the VM down,
    /// and its removal goes out without a drain, with no need to wait for the autoscaler's
    /// next Refresh. A stop job that fails puts the stop back to be tried again later.
    pub(crate) fn send_stops(&self, gi: usize) {
        let vms = self.inner.groups[gi].lock().scale.take_stops(now());
        for vm in vms {
            let p = self.clone();
            tokio::spawn(async move { p.stop_vm(gi, vm).await });
        }
    }

    async fn stop_vm(&self, gi: usize, vm: String) {
        let label = self.group_label(gi);
        tracing::info!(group = %label, vm = %vm, "stopping the VM before its removal: a drain of it would fail");
        let answer = self.inner.cs.stop_virtual_machine(&vm, false).await;
        let failure = match &answer {
            Ok(_) => None,
            Err(e) => {
                let not_permitted = e.is_not_permitted();
                if not_permitted {
                    // One key for every group: each machine learns it now, so none asks
                    // again or promises a stop it cannot make.
                    for g in &self.inner.groups {
                        g.lock().scale.set_can_stop_vms(false);
                    }
                    tracing::warn!(group = %label, "this CloudStack key may not call stopVirtualMachine: VMs whose drain would fail are no longer stopped by the provider, and their removal is refused until an operator stops them: {e}");
                } else {
                    tracing::warn!(group = %label, vm = %vm, error = %e, "stopping the VM failed; retrying later");
                }
                Some((e.to_string(), not_permitted))
            }
        };
        self.inner.groups[gi].lock().scale.stop_answered(
            &vm,
            failure.as_ref().map(|(t, n)| (t.as_str(), *n)),
            now(),
        );
        let Ok(job) = answer else {
            return;
        };
        match self.follow_stop(&job).await {
            Some(text) => {
                tracing::warn!(group = %label, vm = %vm, job = %job, "the stop job failed; retrying later: {text}");
                let failed = format!("stopVirtualMachine job {job} failed: {text}");
                self.inner.groups[gi].lock().scale.stop_answered(
                    &vm,
                    Some((&failed, false)),
                    now(),
                );
            }
            None => {
                if let Err(e) = self.fetch_and_act(gi).await {
                    tracing::debug!(group = %label, error = %e, "reading the cluster after a stop failed; the next refresh sends the removal");
                }
            }
        }
    }

    /// Polls a `stopVirtualMachine` job until it ends (or `job_max_follow` passes, or the
    /// provider shuts down): its failure text, or `None` once it succeeded or is no longer
    /// followed (the next snapshot tells what became of the VM).
    async fn follow_stop(&self, job: &str) -> Option<String> {
        let until = tokio::time::Instant::now() + self.inner.settings.job_max_follow;
        let mut stop = self.inner.shutdown.subscribe();
        while tokio::time::Instant::now() < until {
            tokio::select! {
                _ = tokio::time::sleep(self.inner.settings.job_poll_interval) => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return None;
                    }
                }
            }
            match self.inner.cs.query_job(job).await.map(|j| j.outcome()) {
                Ok(cks_cloudstack::types::JobOutcome::Pending) | Err(_) => {}
                Ok(cks_cloudstack::types::JobOutcome::Succeeded(_)) => return None,
                Ok(cks_cloudstack::types::JobOutcome::Failed { errortext, .. }) => {
                    return Some(errortext);
                }
                Ok(cks_cloudstack::types::JobOutcome::Cancelled) => {
                    return Some("the job was cancelled".into());
                }
            }
        }
        None
    }

    fn update_ready(&self) {
        let all = self
            .inner
            .groups
            .iter()
            .all(|g| g.read().scale.snapshot().is_some());
        self.inner.ready.send_if_modified(|r| {
            let changed = *r != all;
            *r = all;
            changed
        });
    }

    /// Fetches one group's cluster (one `listKubernetesClusters` call) and installs it in the
    /// machine. Returns the snapshot and what the machine asks for on seeing it (a job to
    /// find, queued work to send, removals to retry): the caller runs those, where it is seen.
    pub(crate) async fn fetch_group(&self, gi: usize) -> Result<Fetched> {
        let g = &self.inner.groups[gi];
        let id = g.read().scale.cluster_id.clone();
        let cluster = match (id, &g.spec.cluster) {
            (Some(id), _) => match self.inner.cs.get_cluster(&id).await {
                Ok(Some(c)) => c,
                // Not visible to the key, or (431: CloudStack's lookup of the id parameter
                // found no such entity) deleted: not something a retry fixes.
                Ok(None) | Err(CsError::Api { errorcode: 431, .. }) => {
                    return Err(Error::ClusterNotFound { cluster: id });
                }
                Err(e) => return Err(e.into()),
            },
            (None, ClusterRef::Name(name)) => {
                let mut found = self.inner.cs.find_clusters_by_name(name).await?;
                found.retain(|c| c.name == *name);
                match found.len() {
                    1 => {
                        let cluster = found.remove(0);
                        if let Some(other) = self.serving_elsewhere(gi, &cluster.id) {
                            return Err(Error::DuplicateCluster {
                                name: name.clone(),
                                id: cluster.id,
                                other,
                            });
                        }
                        cluster
                    }
                    0 => {
                        return Err(Error::ClusterNotFound {
                            cluster: format!("named {name:?}"),
                        });
                    }
                    count => {
                        return Err(Error::AmbiguousName {
                            name: name.clone(),
                            count,
                        });
                    }
                }
            }
            (None, ClusterRef::Id(id)) => {
                return Err(Error::Internal(format!("cluster id {id} not resolved")));
            }
        };
        let (snapshot, effects) = self.install_snapshot(gi, cluster);
        Ok(Fetched { snapshot, effects })
    }

    /// [`Provider::fetch_group`], then what the machine asked for on seeing the snapshot.
    pub(crate) async fn fetch_and_act(&self, gi: usize) -> Result<Arc<IndexedSnapshot>> {
        let fetched = self.fetch_group(gi).await?;
        self.run_effects(gi, fetched.effects).await;
        Ok(fetched.snapshot)
    }

    /// The label of another group serving cluster `id` (resolved to it, or configured by it).
    fn serving_elsewhere(&self, gi: usize, id: &str) -> Option<String> {
        (0..self.inner.groups.len())
            .filter(|&o| o != gi)
            .find_map(|o| {
                let g = &self.inner.groups[o];
                let resolved = g.read().scale.cluster_id.clone();
                let configured = match &g.spec.cluster {
                    ClusterRef::Id(c) => Some(c.clone()),
                    ClusterRef::Name(_) => None,
                };
                [resolved, configured]
                    .into_iter()
                    .flatten()
                    .any(|c| c.eq_ignore_ascii_case(id))
                    .then(|| self.group_label(o))
            })
    }

    /// The age of a group's snapshot on tokio's clock.
    fn snapshot_age_of(&self, gi: usize) -> Option<Duration> {
        let st = self.inner.groups[gi].read();
        st.scale
            .snapshot()
            .map(|s| now().saturating_duration_since(s.fetched_at))
    }

    pub(crate) fn group_label(&self, gi: usize) -> String {
        let g = &self.inner.groups[gi];
        g.read().label(&g.spec)
    }

    /// The worker offering last read for a group.
    pub fn worker_offering(&self, group_id: &str) -> Option<ServiceOffering> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().worker_offering.clone()
    }

    /// The latest snapshot of a group.
    pub fn snapshot(&self, group_id: &str) -> Option<ClusterSnapshot> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().scale.snapshot().map(|s| s.snap.clone())
    }

    /// How old a group's snapshot is.
    pub fn snapshot_age(&self, group_id: &str) -> Option<Duration> {
        let (gi, _) = self.group(group_id).ok()?;
        self.snapshot_age_of(gi)
    }

    /// Labels of a real worker node of the group seen through NodeGroupForNode.
    pub fn sample_labels(
        &self,
        group_id: &str,
    ) -> Option<std::collections::BTreeMap<String, String>> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().sample_labels.clone()
    }

    /// Waits until no scale operation is in flight, or `grace` passes: on shutdown, running
    /// jobs are followed only as long as the grace period allows (CloudStack finishes them
    /// anyway; a restarted provider adopts them).
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        let until = tokio::time::Instant::now() + grace;
        loop {
            let busy = self
                .inner
                .groups
                .iter()
                .any(|g| g.read().scale.phase() != &Phase::Idle);
            if !busy {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                tracing::warn!(
                    "shutdown grace period over with a scale job still running; a restarted provider adopts it"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
