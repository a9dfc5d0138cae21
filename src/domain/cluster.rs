//! A snapshot of one CKS cluster as CloudStack last reported it, with every VM classified.

use std::fmt;

/// `KubernetesCluster.State` as CloudStack reports it (`state` of `listKubernetesClusters`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// A state this provider does not know (newer CloudStack); kept verbatim.
    Other(String),
}

impl ClusterState {
    /// Parses CloudStack's state name (exact, case-sensitive as CloudStack sends it; unknown
    /// names become [`ClusterState::Other`]).
    pub fn parse(s: &str) -> Self {
        todo!("domain helper")
    }

    /// The name CloudStack uses for this state.
    pub fn as_str(&self) -> &str {
        todo!("domain helper")
    }
}

impl fmt::Display for ClusterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `VirtualMachine.State` as CloudStack reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// A state this provider does not know; kept verbatim. Not down.
    Other(String),
}

impl VmState {
    /// Parses CloudStack's VM state name; unknown names become [`VmState::Other`].
    pub fn parse(s: &str) -> Self {
        todo!("domain helper")
    }

    /// The name CloudStack uses for this state.
    pub fn as_str(&self) -> &str {
        todo!("domain helper")
    }

    /// A down VM in CKS's sense: Stopped, Shutdown, Error, Destroyed or Expunging.
    /// Migrating, Unknown (host disconnected) and every other state are not down.
    pub fn is_down(&self) -> bool {
        todo!("domain helper")
    }

    /// Destroyed or Expunging: the VM is on its way out of CloudStack.
    pub fn is_gone(&self) -> bool {
        todo!("domain helper")
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The role of a cluster VM. CloudStack exposes flags for external and etcd nodes only;
/// control nodes are recognised by name (`<prefix>-control-<hex>`) and by count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    Control,
    Etcd,
    Worker,
    External,
}

impl NodeRole {
    /// Lower-case name for messages ("control", "etcd", "worker", "external").
    pub fn as_str(&self) -> &'static str {
        match self {
            NodeRole::Control => "control",
            NodeRole::Etcd => "etcd",
            NodeRole::Worker => "worker",
            NodeRole::External => "external",
        }
    }
}

/// One VM as CloudStack lists it under `virtualmachines[]`, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmInput {
    pub id: String,
    pub name: String,
    pub state: VmState,
    pub is_external: bool,
    pub is_etcd: bool,
}

/// A service offering as far as the provider cares (templates, messages).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OfferingRef {
    pub id: String,
    pub name: String,
}

/// A cluster as CloudStack lists it, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInput {
    pub id: String,
    pub name: String,
    pub state: ClusterState,
    /// CloudStack's `size`: the worker count.
    pub size: u32,
    pub min_size: Option<u32>,
    pub max_size: Option<u32>,
    pub autoscaling_enabled: bool,
    pub control_nodes: u32,
    pub etcd_nodes: u32,
    /// The cluster-level (default) offering.
    pub service_offering: Option<OfferingRef>,
    /// The worker offering when one is set per node type.
    pub worker_offering: Option<OfferingRef>,
    pub zone_id: String,
    pub zone_name: String,
    /// In CloudStack's order (creation order).
    pub vms: Vec<VmInput>,
}

/// A classified VM of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vm {
    pub id: String,
    pub name: String,
    pub state: VmState,
    pub role: NodeRole,
}

/// A cluster with every VM classified. Immutable once built; the provider swaps whole
/// snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub id: String,
    pub name: String,
    pub state: ClusterState,
    pub size: u32,
    pub min_size: Option<u32>,
    pub max_size: Option<u32>,
    pub autoscaling_enabled: bool,
    pub control_nodes: u32,
    pub etcd_nodes: u32,
    pub service_offering: Option<OfferingRef>,
    pub worker_offering: Option<OfferingRef>,
    pub zone_id: String,
    pub zone_name: String,
    /// In CloudStack's order (creation order).
    pub vms: Vec<Vm>,
    /// Set when the name pattern and the `controlnodes` count disagree; the provider logs it
    /// loudly and shows it in the node group's debug string.
    pub classification_warning: Option<String>,
}

impl ClusterSnapshot {
    /// Classifies the VMs of `input`:
    /// 1. `isexternalnode` → External; else `isetcdnode` → Etcd;
    /// 2. Control when the name is `<anything>-control-<hex digits>` (CKS naming), **or** when the
    ///    VM is among the first `control_nodes` VMs (creation order) that are neither external nor
    ///    etcd. Both signals are used so that a control VM is never taken for a worker (removing a
    ///    control node is the worst mistake this provider could make);
    /// 3. everything else → Worker.
    ///
    /// When the number of VMs matching the control name pattern differs from `control_nodes`,
    /// `classification_warning` says so, naming the counts and the VMs.
    pub fn classify(input: ClusterInput) -> ClusterSnapshot {
        todo!("domain helper")
    }

    /// The worker VMs, in creation order.
    pub fn workers(&self) -> impl Iterator<Item = &Vm> {
        self.vms.iter().filter(|v| v.role == NodeRole::Worker)
    }

    /// The VM with this CloudStack id.
    pub fn vm(&self, id: &str) -> Option<&Vm> {
        self.vms.iter().find(|v| v.id == id)
    }

    /// The VM whose name equals `name` case-insensitively (Kubernetes node name = VM hostname,
    /// lower-cased).
    pub fn vm_by_name(&self, name: &str) -> Option<&Vm> {
        self.vms.iter().find(|v| v.name.eq_ignore_ascii_case(name))
    }

    /// The offering new workers get: the worker offering, else the cluster offering.
    pub fn effective_worker_offering(&self) -> Option<&OfferingRef> {
        self.worker_offering
            .as_ref()
            .or(self.service_offering.as_ref())
    }
}
