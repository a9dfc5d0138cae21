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
        match s {
            "Created" => ClusterState::Created,
            "Starting" => ClusterState::Starting,
            "Running" => ClusterState::Running,
            "Stopping" => ClusterState::Stopping,
            "Stopped" => ClusterState::Stopped,
            "Scaling" => ClusterState::Scaling,
            "Upgrading" => ClusterState::Upgrading,
            "Alert" => ClusterState::Alert,
            "Recovering" => ClusterState::Recovering,
            "Destroyed" => ClusterState::Destroyed,
            "Destroying" => ClusterState::Destroying,
            "Error" => ClusterState::Error,
            other => ClusterState::Other(other.to_string()),
        }
    }

    /// The name CloudStack uses for this state.
    pub fn as_str(&self) -> &str {
        match self {
            ClusterState::Created => "Created",
            ClusterState::Starting => "Starting",
            ClusterState::Running => "Running",
            ClusterState::Stopping => "Stopping",
            ClusterState::Stopped => "Stopped",
            ClusterState::Scaling => "Scaling",
            ClusterState::Upgrading => "Upgrading",
            ClusterState::Alert => "Alert",
            ClusterState::Recovering => "Recovering",
            ClusterState::Destroyed => "Destroyed",
            ClusterState::Destroying => "Destroying",
            ClusterState::Error => "Error",
            ClusterState::Other(s) => s,
        }
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
    /// Parses CloudStack's VM state name (exact, case-sensitive as CloudStack sends it);
    /// unknown names become [`VmState::Other`].
    pub fn parse(s: &str) -> Self {
        match s {
            "Starting" => VmState::Starting,
            "Running" => VmState::Running,
            "Stopping" => VmState::Stopping,
            "Stopped" => VmState::Stopped,
            "Destroyed" => VmState::Destroyed,
            "Expunging" => VmState::Expunging,
            "Migrating" => VmState::Migrating,
            "Error" => VmState::Error,
            "Unknown" => VmState::Unknown,
            "Shutdown" => VmState::Shutdown,
            "Restoring" => VmState::Restoring,
            other => VmState::Other(other.to_string()),
        }
    }

    /// The name CloudStack uses for this state.
    pub fn as_str(&self) -> &str {
        match self {
            VmState::Starting => "Starting",
            VmState::Running => "Running",
            VmState::Stopping => "Stopping",
            VmState::Stopped => "Stopped",
            VmState::Destroyed => "Destroyed",
            VmState::Expunging => "Expunging",
            VmState::Migrating => "Migrating",
            VmState::Error => "Error",
            VmState::Unknown => "Unknown",
            VmState::Shutdown => "Shutdown",
            VmState::Restoring => "Restoring",
            VmState::Other(s) => s,
        }
    }

    /// A down VM in CKS's sense: Stopped, Shutdown, Error, Destroyed or Expunging.
    /// Migrating, Unknown (host disconnected) and every other state are not down.
    pub fn is_down(&self) -> bool {
        matches!(
            self,
            VmState::Stopped
                | VmState::Shutdown
                | VmState::Error
                | VmState::Destroyed
                | VmState::Expunging
        )
    }

    /// Destroyed or Expunging: the VM is on its way out of CloudStack.
    pub fn is_gone(&self) -> bool {
        matches!(self, VmState::Destroyed | VmState::Expunging)
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
    ///
    /// Only VMs that are neither external nor etcd are matched against the name pattern or
    /// counted (the flags win). Destroyed or Expunging VMs keep their place in the creation order:
    /// CloudStack still lists them as cluster VMs.
    pub fn classify(input: ClusterInput) -> ClusterSnapshot {
        let ClusterInput {
            id,
            name,
            state,
            size,
            min_size,
            max_size,
            autoscaling_enabled,
            control_nodes,
            etcd_nodes,
            service_offering,
            worker_offering,
            zone_id,
            zone_name,
            vms: inputs,
        } = input;

        let mut vms = Vec::with_capacity(inputs.len());
        let mut pattern_matches: Vec<String> = Vec::new();
        let mut by_position = 0u32;
        for vm in inputs {
            let role = if vm.is_external {
                NodeRole::External
            } else if vm.is_etcd {
                NodeRole::Etcd
            } else {
                let named = is_control_name(&vm.name);
                if named {
                    pattern_matches.push(vm.name.clone());
                }
                let among_first = by_position < control_nodes;
                by_position += 1;
                if named || among_first {
                    NodeRole::Control
                } else {
                    NodeRole::Worker
                }
            };
            vms.push(Vm {
                id: vm.id,
                name: vm.name,
                state: vm.state,
                role,
            });
        }

        let classification_warning = (pattern_matches.len() != control_nodes as usize).then(|| {
            let controls: Vec<&str> = vms
                .iter()
                .filter(|v| v.role == NodeRole::Control)
                .map(|v| v.name.as_str())
                .collect();
            format!(
                "cluster {name:?}: {} VM(s) match the control name pattern <prefix>-control-<hex> ({}) \
                 but CloudStack reports controlnodes={control_nodes}; every VM matching either signal \
                 (name pattern, or among the first {control_nodes} non-etcd non-external VMs) is treated \
                 as a control node and never removed: {}",
                pattern_matches.len(),
                list_or_none(&pattern_matches),
                list_or_none(&controls),
            )
        });

        ClusterSnapshot {
            id,
            name,
            state,
            size,
            min_size,
            max_size,
            autoscaling_enabled,
            control_nodes,
            etcd_nodes,
            service_offering,
            worker_offering,
            zone_id,
            zone_name,
            vms,
            classification_warning,
        }
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

/// Whether `name` follows CKS's control VM naming: `<anything>-control-<hex>` at the end of the
/// name, "control" in any case, the suffix one or more lower-case hex digits (CloudStack writes
/// `Long.toHexString`, which is lower-case).
pub fn is_control_name(name: &str) -> bool {
    let Some((head, hex)) = name.rsplit_once('-') else {
        return false;
    };
    if hex.is_empty()
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return false;
    }
    const CONTROL: &str = "-control";
    head.len() >= CONTROL.len()
        && head.is_char_boundary(head.len() - CONTROL.len())
        && head[head.len() - CONTROL.len()..].eq_ignore_ascii_case(CONTROL)
}

/// Comma-separated names, or "none" for an empty list (for messages).
fn list_or_none<S: AsRef<str>>(names: &[S]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(", ")
    }
}
