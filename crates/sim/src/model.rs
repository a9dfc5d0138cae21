//! The simulated CloudStack's state: zone, offerings, Kubernetes clusters with their VMs, async
//! jobs, and the emulated kubelet view of each VM. Plain data plus the synchronous state changes
//! (status scanner, kubelet registration); callers hold the one lock around [`World`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::accounts::{Account, Caller, ClusterOwner, Owner, ProjectEntry};
use super::config::SimSettings;
use super::ids::IdGen;

/// `KubernetesCluster.State`, serialized by its enum name as CloudStack does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterState {
    Created,
    Starting,
    Running,
    Stopping,
    Stopped,
    Scaling,
    Upgrading,
    Alert,
    Recovering,
    Destroyed,
    Destroying,
    Error,
}

impl ClusterState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "Created",
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Stopping => "Stopping",
            Self::Stopped => "Stopped",
            Self::Scaling => "Scaling",
            Self::Upgrading => "Upgrading",
            Self::Alert => "Alert",
            Self::Recovering => "Recovering",
            Self::Destroyed => "Destroyed",
            Self::Destroying => "Destroying",
            Self::Error => "Error",
        }
    }
}

impl fmt::Display for ClusterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `VirtualMachine.State`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmState {
    Starting,
    Running,
    Stopping,
    Stopped,
    Destroyed,
    Expunging,
    Migrating,
    Error,
    Unknown,
    Shutdown,
    Restoring,
}

impl VmState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Stopping => "Stopping",
            Self::Stopped => "Stopped",
            Self::Destroyed => "Destroyed",
            Self::Expunging => "Expunging",
            Self::Migrating => "Migrating",
            Self::Error => "Error",
            Self::Unknown => "Unknown",
            Self::Shutdown => "Shutdown",
            Self::Restoring => "Restoring",
        }
    }

    /// CKS's "down": Stopped, Shutdown, Error, Destroyed or Expunging. Migrating, Unknown and the
    /// rest may still be running.
    pub fn is_down(self) -> bool {
        matches!(
            self,
            Self::Stopped | Self::Shutdown | Self::Error | Self::Destroyed | Self::Expunging
        )
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for VmState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const ALL: [VmState; 11] = [
            VmState::Starting,
            VmState::Running,
            VmState::Stopping,
            VmState::Stopped,
            VmState::Destroyed,
            VmState::Expunging,
            VmState::Migrating,
            VmState::Error,
            VmState::Unknown,
            VmState::Shutdown,
            VmState::Restoring,
        ];
        ALL.into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown VM state {s:?}"))
    }
}

/// The kind of guest network a cluster runs on. CKS creates an isolated network for a cluster
/// given none; an operator may give it a shared (or routed) one. CloudStack rewrites the SSH
/// firewall and port-forwarding rules of an isolated or VPC network on every scale
/// (`KubernetesClusterScaleWorker.scaleKubernetesClusterNetworkRules`: nothing to do when
/// `manager.isDirectAccess(network)`), which is where a scale-up of a cluster with an external
/// node fails (apache/cloudstack#12633).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkKind {
    #[default]
    Isolated,
    Shared,
}

/// What a VM is to its cluster. CloudStack keeps this in its VM map and does not serialize the
/// control flag; only `isetcdnode`/`isexternalnode` reach the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmRole {
    Control,
    Etcd,
    Worker,
    External,
}

impl VmRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Control => "control",
            Self::Etcd => "etcd",
            Self::Worker => "worker",
            Self::External => "external",
        }
    }

    /// Etcd nodes are VMs but not Kubernetes nodes.
    pub fn is_kubernetes_node(self) -> bool {
        self != Self::Etcd
    }
}

#[derive(Debug, Clone)]
pub struct Zone {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone)]
pub struct Offering {
    pub id: String,
    pub name: String,
    pub cpu: u64,
    /// MHz per core.
    pub speed: u64,
    /// MB.
    pub memory: u64,
    /// A custom (dynamic) offering, which CKS refuses.
    pub customized: bool,
    pub created: String,
}

#[derive(Debug, Clone)]
pub struct Vm {
    pub id: String,
    pub name: String,
    pub role: VmRole,
    pub state: VmState,
    pub offering_id: String,
    pub created: String,
    pub ip: String,
    pub nic_id: String,
    pub mac: String,
    /// Sim time (ms) when the VM last reached Running.
    pub running_since_ms: Option<u64>,
    /// Sim time (ms) when its Kubernetes node registered; kept while the VM is down (the node
    /// stays, NotReady) and gone with the VM.
    pub node_registered_ms: Option<u64>,
    /// The kubelet does not register a node (a node that never joined, or whose object was
    /// deleted): set by `SimHandle::remove_node`, and when a removal deletes the node.
    pub kubelet_gone: bool,
    /// The node is NotReady although the VM runs (`SimHandle::set_node_ready(id, false)`).
    pub node_not_ready: bool,
    /// The node is cordoned (`spec.unschedulable`): `kubectl drain` cordons it first and leaves
    /// it cordoned when the drain fails.
    pub cordoned: bool,
}

impl Vm {
    /// The Kubernetes node name: the VM hostname lower-cased.
    pub fn node_name(&self) -> String {
        self.name.to_ascii_lowercase()
    }
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub id: String,
    pub name: String,
    pub description: String,
    pub state: ClusterState,
    pub zone_id: String,
    /// Cluster-level (default) offering.
    pub offering_id: String,
    pub control_offering_id: Option<String>,
    pub worker_offering_id: Option<String>,
    pub etcd_offering_id: Option<String>,
    pub control_count: u64,
    pub etcd_count: u64,
    /// Worker count, external nodes included (CloudStack's `node_count`).
    pub size: u64,
    pub min_size: Option<u64>,
    pub max_size: Option<u64>,
    pub autoscaling: bool,
    /// `clustertype` ExternalManaged (CloudStack scales no such cluster).
    pub externally_managed: bool,
    pub network: NetworkKind,
    /// Recorded totals, updated the way CloudStack updates them (see `jobs`).
    pub cores: u64,
    pub memory: u64,
    pub version_id: String,
    pub version_name: String,
    pub template_id: String,
    pub network_id: String,
    pub network_name: String,
    pub ip: String,
    pub ip_id: String,
    pub created: String,
    /// Host-name prefix of its VMs (CKS: the lower-cased name, at most 43 characters).
    pub prefix: String,
    /// In VM-map order, which is creation order.
    pub vms: Vec<Vm>,
    /// Its account or project (see `accounts`).
    pub owner: ClusterOwner,
    pub next_ip: u32,
    pub next_etcd_index: u32,
}

impl Cluster {
    /// Control + etcd + size: the VM count CloudStack expects.
    pub fn total_nodes(&self) -> u64 {
        self.control_count + self.etcd_count + self.size
    }

    pub fn vm(&self, id: &str) -> Option<&Vm> {
        self.vms.iter().find(|v| v.id == id)
    }

    pub fn vm_mut(&mut self, id: &str) -> Option<&mut Vm> {
        self.vms.iter_mut().find(|v| v.id == id)
    }

    /// The first control node, the one CloudStack reaches over SSH.
    pub fn first_control(&self) -> Option<&Vm> {
        self.vms.iter().find(|v| v.role == VmRole::Control)
    }

    /// The offering a node type runs with: its own, else the cluster's.
    pub fn offering_for(&self, role: VmRole) -> &str {
        let own = match role {
            VmRole::Control => self.control_offering_id.as_deref(),
            VmRole::Worker | VmRole::External => self.worker_offering_id.as_deref(),
            VmRole::Etcd => self.etcd_offering_id.as_deref(),
        };
        own.unwrap_or(&self.offering_id)
    }

    /// The offering the first existing VM of `role` runs with (what CloudStack compares a new
    /// offering against), else the type's configured offering.
    pub fn existing_offering_for(&self, role: VmRole) -> &str {
        self.vms
            .iter()
            .find(|v| v.role == role)
            .map(|v| v.offering_id.as_str())
            .unwrap_or_else(|| self.offering_for(role))
    }
}

/// `jobstatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    InProgress = 0,
    Succeeded = 1,
    Failed = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    ScaleCluster,
    StartVm,
    StopVm,
}

impl JobKind {
    /// The `cmd` field: the Java class of the command.
    pub fn class(self) -> &'static str {
        match self {
            Self::ScaleCluster => {
                "org.apache.cloudstack.api.command.user.kubernetes.cluster.ScaleKubernetesClusterCmd"
            }
            Self::StartVm => "org.apache.cloudstack.api.command.user.vm.StartVMCmd",
            Self::StopVm => "org.apache.cloudstack.api.command.user.vm.StopVMCmd",
        }
    }

    /// The `jobinstancetype` CloudStack records for the job, if any. A scale job has none:
    /// `ScaleKubernetesClusterCmd` does not override `BaseCmd.getApiResourceId()` (null), so
    /// `ApiServer` queues it without an instance (apache/cloudstack issue #11166's job dump
    /// lacks both fields). VM jobs (`StartVMCmd`, `StopVMCmd`) name their VM.
    pub fn instance_type(self) -> Option<&'static str> {
        match self {
            Self::ScaleCluster => None,
            Self::StartVm | Self::StopVm => Some("VirtualMachine"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub kind: JobKind,
    pub instance_id: String,
    /// Who submitted it: the job's `account`, `accountid` and `userid`, the account whose
    /// `listAsyncJobs` lists it, and whose right a scale job checks.
    pub submitter: Caller,
    pub created: String,
    pub completed: Option<String>,
    pub status: JobStatus,
    pub result_code: u32,
    /// `jobresult` once finished.
    pub result: Option<JobResult>,
}

/// A finished job's `jobresult`. A cluster result is kept as a snapshot and serialized when
/// asked for: turning a 5,000-VM cluster into a JSON tree at completion would stall the lock.
#[derive(Debug, Clone)]
pub enum JobResult {
    Json(serde_json::Value),
    /// `{"kubernetescluster": {...}}` of the cluster as it was when the job finished.
    Cluster(Box<Cluster>),
}

/// A request as received (secrets removed), for `simRequests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    pub command: String,
    pub params: BTreeMap<String, String>,
    /// Sim time of arrival, in milliseconds since start.
    pub atms: u64,
    /// The fault injected into this request (`error`, `drop`, `malformed`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

/// A Kubernetes node as the emulated kubelet and cloud-controller-manager present it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimNode {
    /// VM hostname lower-cased.
    pub name: String,
    /// `external-cloudstack://<vm-uuid>`.
    pub providerid: String,
    pub vmid: String,
    pub clusterid: String,
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`): a drain cordons the node first and a failed drain
    /// leaves it so. `kubectl get nodes` then shows `Ready,SchedulingDisabled`.
    #[serde(default)]
    pub unschedulable: bool,
    /// `control`, `worker` or `external`.
    pub role: String,
    pub labels: BTreeMap<String, String>,
    /// Sim time of registration, in milliseconds since start.
    pub registeredms: u64,
    /// `status.allocatable` as Kubernetes quantities (`cpu`, `memory`, `pods`), as a kubelet
    /// with its default settings reports it on a VM of the node's offering. Empty when the
    /// offering is unknown.
    #[serde(default)]
    pub allocatable: BTreeMap<String, String>,
}

/// The kubelet's default `--max-pods`.
const KUBELET_MAX_PODS: u64 = 110;
/// The kubelet's default hard eviction threshold `memory.available<100Mi`, which allocatable
/// leaves out (no system or kube reservation by default).
const KUBELET_EVICTION_MEMORY_MIB: u64 = 100;

/// What a default kubelet reports as allocatable on a VM of `offering`: every core, the memory
/// less the hard eviction threshold, 110 pods. (A real guest kernel keeps a little memory too;
/// the offering's figure stands in for the VM's.)
fn kubelet_allocatable(offering: &Offering) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cpu".to_string(), offering.cpu.to_string()),
        (
            "memory".to_string(),
            format!(
                "{}Mi",
                offering.memory.saturating_sub(KUBELET_EVICTION_MEMORY_MIB)
            ),
        ),
        ("pods".to_string(), KUBELET_MAX_PODS.to_string()),
    ])
}

/// All simulated state. One `Mutex<World>` guards it; no lock is held across an `.await`.
#[derive(Debug)]
pub struct World {
    pub settings: SimSettings,
    pub zones: Vec<Zone>,
    pub hypervisor: String,
    pub offerings: Vec<Offering>,
    pub clusters: Vec<Cluster>,
    pub jobs: HashMap<String, Job>,
    pub job_order: Vec<String>,
    /// Expunged VMs: CloudStack still resolves their ids (lists just come back empty).
    pub removed_vms: HashSet<String>,
    pub owner: Owner,
    /// The scenario's other accounts, each with its own keys (see `accounts`).
    pub accounts: Vec<Account>,
    /// The scenario's projects.
    pub projects: Vec<ProjectEntry>,
    /// The VM jobs in progress, by VM id: CloudStack's `user_vm_view` joins a VM's pending
    /// job, and every VM answer shows it (`jobid`, `jobstatus`; see `render`).
    pub pending_vm_jobs: HashMap<String, String>,
    pub template_id: String,
    pub requests: Vec<RecordedRequest>,
    pub ids: IdGen,
    pub fault_rng: IdGen,
    /// VMs a scale-up job created and is still provisioning (waiting for their nodes).
    pub provisioning: HashSet<String>,
    /// Requests that worked against a running scale-up: stopping a VM it provisions. Not
    /// CloudStack behaviour (CloudStack carries such a stop out, and the scale-up then fails
    /// waiting for the node, `KubernetesClusterScaleWorker.scaleUpKubernetesClusterSize`); an
    /// observation for tests, read with `SimHandle::interference`.
    pub interference: Vec<String>,
}

impl World {
    /// Records a stop of a VM a running scale-up provisions (see `interference`).
    pub fn note_stop(&mut self, vm_id: &str) {
        if self.provisioning.contains(vm_id) {
            self.interference.push(format!(
                "stopVirtualMachine {vm_id} while the scale-up that created it ran"
            ));
        }
    }

    pub fn cluster(&self, id: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.id == id)
    }

    pub fn cluster_mut(&mut self, id: &str) -> Option<&mut Cluster> {
        self.clusters.iter_mut().find(|c| c.id == id)
    }

    pub fn offering(&self, id: &str) -> Option<&Offering> {
        self.offerings.iter().find(|o| o.id == id)
    }

    pub fn zone(&self, id: &str) -> Option<&Zone> {
        self.zones.iter().find(|z| z.id == id)
    }

    /// The VM with this id and the index of its cluster.
    pub fn find_vm(&self, id: &str) -> Option<(usize, &Vm)> {
        self.clusters
            .iter()
            .enumerate()
            .find_map(|(i, c)| c.vm(id).map(|v| (i, v)))
    }

    pub fn find_vm_mut(&mut self, id: &str) -> Option<&mut Vm> {
        self.clusters.iter_mut().find_map(|c| c.vm_mut(id))
    }

    /// Whether `id` names a VM CloudStack knows, expunged ones included.
    pub fn vm_known(&self, id: &str) -> bool {
        self.removed_vms.contains(id) || self.find_vm(id).is_some()
    }

    /// Kubelet emulation: registers the node of every VM that has been Running for the kubelet
    /// delay. Called before anything reads the node view.
    pub fn refresh_nodes(&mut self, now_ms: u64) {
        let delay = u64::try_from(self.settings.kubelet_delay.as_millis()).unwrap_or(u64::MAX);
        for vm in self.clusters.iter_mut().flat_map(|c| c.vms.iter_mut()) {
            if vm.node_registered_ms.is_none()
                && vm.role.is_kubernetes_node()
                && !vm.kubelet_gone
                && vm.state == VmState::Running
                && let Some(since) = vm.running_since_ms
            {
                let at = since.saturating_add(delay);
                if at <= now_ms {
                    vm.node_registered_ms = Some(at);
                }
            }
        }
    }

    /// A node is Ready while its VM runs and the kubelet has had its delay since the VM (re)started.
    /// A node that had joined before the simulator started (registered and running since 0) is
    /// Ready from the start: its kubelet delay passed before, not `kubelet_delay` after, start.
    pub fn node_ready(&self, vm: &Vm, now_ms: u64) -> bool {
        let delay = u64::try_from(self.settings.kubelet_delay.as_millis()).unwrap_or(u64::MAX);
        let joined_before_start =
            vm.node_registered_ms == Some(0) && vm.running_since_ms == Some(0);
        vm.node_registered_ms.is_some()
            && !vm.node_not_ready
            && vm.state == VmState::Running
            && vm
                .running_since_ms
                .is_some_and(|s| joined_before_start || s.saturating_add(delay) <= now_ms)
    }

    /// Whether CloudStack counts the node as Ready: its `kubectl get nodes` STATUS is exactly
    /// `Ready`. `KubernetesClusterUtil.getKubernetesClusterReadyNodesCount` counts with
    /// `awk '{if ($2 == "Ready") print $1}'`, so a cordoned node (`Ready,SchedulingDisabled`)
    /// is not counted, by the status scanner's `reconcileAlertCluster` nor by a scale-up's
    /// wait for Ready nodes (`validateKubernetesClusterReadyNodesCount`).
    pub fn node_counted_ready(&self, vm: &Vm, now_ms: u64) -> bool {
        !vm.cordoned && self.node_ready(vm, now_ms)
    }

    /// Registered nodes, optionally of one cluster. Call [`Self::refresh_nodes`] first.
    pub fn nodes(&self, cluster_id: Option<&str>, now_ms: u64) -> Vec<SimNode> {
        let mut out = Vec::new();
        for c in self
            .clusters
            .iter()
            .filter(|c| cluster_id.is_none_or(|id| c.id == id))
        {
            let zone = self
                .zone(&c.zone_id)
                .map(|z| z.name.clone())
                .unwrap_or_default();
            for vm in &c.vms {
                let Some(registered) = vm.node_registered_ms else {
                    continue;
                };
                let name = vm.node_name();
                let mut labels = BTreeMap::new();
                let offering = self.offering(&vm.offering_id);
                labels.insert("kubernetes.io/hostname".to_string(), name.clone());
                labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
                labels.insert("kubernetes.io/arch".to_string(), "amd64".to_string());
                if let Some(o) = offering {
                    labels.insert(
                        "node.kubernetes.io/instance-type".to_string(),
                        label_value(&o.name),
                    );
                }
                labels.insert(
                    "topology.kubernetes.io/zone".to_string(),
                    label_value(&zone),
                );
                labels.insert(
                    "topology.kubernetes.io/region".to_string(),
                    label_value(&zone),
                );
                if vm.role == VmRole::Control {
                    labels.insert(
                        "node-role.kubernetes.io/control-plane".to_string(),
                        String::new(),
                    );
                }
                out.push(SimNode {
                    providerid: format!("external-cloudstack://{}", vm.id),
                    vmid: vm.id.clone(),
                    clusterid: c.id.clone(),
                    ready: self.node_ready(vm, now_ms),
                    unschedulable: vm.cordoned,
                    role: vm.role.as_str().to_string(),
                    labels,
                    registeredms: registered,
                    allocatable: offering.map(kubelet_allocatable).unwrap_or_default(),
                    name,
                });
            }
        }
        out
    }

    /// One pass of CloudStack's status scanner (`KubernetesClusterManagerImpl
    /// .KubernetesClusterStatusScanner.reallyRun`). Returns the clusters whose state changed.
    ///
    /// `isClusterVMsInDesiredState(cluster, state)` holds when the VM map has at least
    /// control + etcd + size rows and every VM is in `state`:
    /// - Running: not in desired state (Running) -> Alert (FaultsDetected).
    /// - Stopped: not in desired state (Stopped) -> Alert.
    /// - Alert: in desired state Running -> `KubernetesClusterStartWorker.reconcileAlertCluster`,
    ///   which moves it to Running only if the map has exactly as many rows as nodes and the
    ///   Ready node count (cordoned nodes not counted, see [`Self::node_counted_ready`]) equals
    ///   the node count; in desired state Stopped -> Stopped.
    ///
    /// So a cluster with fewer VMs than nodes (a removal that failed half way) stays in Alert,
    /// as does one with a NotReady or cordoned node although every VM runs. Etcd VMs are left
    /// out of the Ready count: they are not Kubernetes nodes (CloudStack compares the count with
    /// `getTotalNodeCount()`; whether that makes a cluster with etcd nodes never reconcile is
    /// *unverified*).
    pub fn scan(&mut self, now_ms: u64) -> Vec<(String, ClusterState, ClusterState)> {
        self.refresh_nodes(now_ms);
        let mut changes = Vec::new();
        for i in 0..self.clusters.len() {
            let c = &self.clusters[i];
            let enough_rows = c.vms.len() as u64 >= c.total_nodes();
            let all_in = |s: VmState| enough_rows && c.vms.iter().all(|v| v.state == s);
            let next = match c.state {
                ClusterState::Running if !all_in(VmState::Running) => Some(ClusterState::Alert),
                ClusterState::Stopped if !all_in(VmState::Stopped) => Some(ClusterState::Alert),
                ClusterState::Alert if all_in(VmState::Running) => {
                    let rows_exact = c.vms.len() as u64 == c.total_nodes();
                    let nodes_ready = c
                        .vms
                        .iter()
                        .filter(|v| v.role.is_kubernetes_node())
                        .all(|v| self.node_counted_ready(v, now_ms));
                    (rows_exact && nodes_ready).then_some(ClusterState::Running)
                }
                ClusterState::Alert if all_in(VmState::Stopped) => Some(ClusterState::Stopped),
                _ => None,
            };
            if let Some(next) = next {
                let c = &mut self.clusters[i];
                changes.push((c.id.clone(), c.state, next));
                c.state = next;
            }
        }
        changes
    }

    /// Deletes VM `vm_id`'s node object; its kubelet does not register again (see
    /// `SimHandle::remove_node`). `false` if no such VM.
    pub fn remove_node(&mut self, vm_id: &str) -> bool {
        self.find_vm_mut(vm_id)
            .map(|vm| {
                vm.kubelet_gone = true;
                vm.node_registered_ms = None;
                vm.cordoned = false;
            })
            .is_some()
    }

    /// Forces VM `vm_id`'s node NotReady (`ready` false) or lifts that (see
    /// `SimHandle::set_node_ready`). `false` if no such VM.
    pub fn set_node_ready(&mut self, vm_id: &str, ready: bool) -> bool {
        self.find_vm_mut(vm_id)
            .map(|vm| vm.node_not_ready = !ready)
            .is_some()
    }

    /// `kubectl uncordon` of VM `vm_id`'s node. `false` if no such VM.
    pub fn uncordon_node(&mut self, vm_id: &str) -> bool {
        self.find_vm_mut(vm_id)
            .map(|vm| vm.cordoned = false)
            .is_some()
    }

    /// Starts a VM at once (test helper and end of a start job).
    pub fn set_vm_running(&mut self, vm_id: &str, now_ms: u64) -> bool {
        match self.find_vm_mut(vm_id) {
            Some(vm) => {
                if vm.state != VmState::Running {
                    vm.state = VmState::Running;
                    vm.running_since_ms = Some(now_ms);
                }
                true
            }
            None => false,
        }
    }

    /// Sets a VM's state at once; leaving Running keeps the node registered but NotReady.
    pub fn set_vm_state(&mut self, vm_id: &str, state: VmState, now_ms: u64) -> bool {
        if state == VmState::Running {
            return self.set_vm_running(vm_id, now_ms);
        }
        match self.find_vm_mut(vm_id) {
            Some(vm) => {
                vm.state = state;
                true
            }
            None => false,
        }
    }

    /// Adds a VM to cluster `ci` with a fresh id, name and address.
    pub fn new_vm(&mut self, ci: usize, role: VmRole, state: VmState, now_ms: u64) -> String {
        let id = self.ids.uuid();
        let nic_id = self.ids.uuid();
        let suffix = self.ids.name_suffix();
        let mac_tail = &suffix[suffix.len() - 6..];
        let c = &mut self.clusters[ci];
        let name = match role {
            VmRole::Control => format!("{}-control-{suffix}", c.prefix),
            VmRole::Worker => format!("{}-node-{suffix}", c.prefix),
            VmRole::Etcd => {
                c.next_etcd_index += 1;
                format!("{}-etcd-{}-{suffix}", c.prefix, c.next_etcd_index)
            }
            VmRole::External => format!("{}-external-{suffix}", c.prefix),
        };
        c.next_ip += 1;
        let ip = format!("10.1.{}.{}", c.next_ip / 250, c.next_ip % 250 + 2);
        let vm = Vm {
            offering_id: c.offering_for(role).to_string(),
            id: id.clone(),
            name,
            role,
            state,
            created: super::clock::now_stamp(),
            ip,
            nic_id,
            mac: format!(
                "02:00:{}:{}:{}",
                &mac_tail[0..2],
                &mac_tail[2..4],
                &mac_tail[4..6]
            ),
            running_since_ms: (state == VmState::Running).then_some(now_ms),
            node_registered_ms: None,
            kubelet_gone: false,
            node_not_ready: false,
            cordoned: false,
        };
        c.vms.push(vm);
        id
    }
}

/// A Kubernetes label value built from a name: characters outside `[A-Za-z0-9._-]` dropped,
/// non-alphanumerics trimmed from both ends, at most 63 characters (what the CCM does with
/// offering and zone names).
pub fn label_value(s: &str) -> String {
    let kept: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .collect();
    let trimmed = kept.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut out: String = trimmed.chars().take(63).collect();
    while out.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        out.pop();
    }
    out
}

/// CKS's VM host-name prefix for a cluster name: lower-cased; used as is if a valid DNS label,
/// else reduced to `[a-z0-9-]` and prefixed with `k8s-`; at most 43 characters.
pub fn name_prefix(cluster_name: &str, cluster_id: &str) -> String {
    let lower = cluster_name.to_ascii_lowercase();
    let is_label = !lower.is_empty()
        && lower.len() <= 63
        && lower
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !lower.starts_with('-')
        && !lower.ends_with('-');
    let prefix = if is_label {
        lower
    } else {
        let kept: String = lower
            .chars()
            .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        format!(
            "k8s-{}",
            if kept.is_empty() {
                cluster_id.to_string()
            } else {
                kept
            }
        )
    };
    prefix.chars().take(43).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_states_are_cks_down_states() {
        let down: Vec<_> = ["Stopped", "Shutdown", "Error", "Destroyed", "Expunging"]
            .iter()
            .map(|s| s.parse::<VmState>().unwrap())
            .collect();
        assert!(down.iter().all(|s| s.is_down()));
        for s in [
            "Running",
            "Starting",
            "Stopping",
            "Migrating",
            "Unknown",
            "Restoring",
        ] {
            assert!(!s.parse::<VmState>().unwrap().is_down(), "{s}");
        }
    }

    #[test]
    fn prefixes_and_labels() {
        assert_eq!(name_prefix("Demo", "x"), "demo");
        assert_eq!(name_prefix("my cluster!", "x"), "k8s-mycluster");
        assert_eq!(name_prefix("!!!", "abc"), "k8s-abc");
        assert_eq!(name_prefix(&"a".repeat(60), "x").len(), 43);
        assert_eq!(label_value("CKS Medium (2 vCPU)"), "CKSMedium2vCPU");
        assert_eq!(label_value("-zone_1-"), "zone_1");
    }
}
