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
    /// `clustertype` ExternalManaged: CloudStack does not scale it (its scale job fails with
    /// "Scale kubernetes cluster is not supported for an externally managed cluster").
    pub externally_managed: bool,
    /// In CloudStack's order (creation order).
    pub vms: Vec<VmInput>,
}

/// A snapshot with lookup indexes and the time it was fetched, shared read-only.
#[derive(Debug)]
pub struct IndexedSnapshot {
    pub snap: ClusterSnapshot,
    /// VM id → index into `snap.vms`.
    pub by_id: std::collections::HashMap<String, usize>,
    /// Lower-cased VM name → index into `snap.vms`.
    pub by_name: std::collections::HashMap<String, usize>,
    /// When the listing came in (the staleness bound reads it).
    pub fetched_at: std::time::Instant,
    /// When the listing was asked for: CloudStack's state is at least this recent (the
    /// cordon suspicion reads it: only a listing asked for after a job's end tells of it).
    pub asked_at: std::time::Instant,
}

impl IndexedSnapshot {
    pub fn new(snap: ClusterSnapshot, fetched_at: std::time::Instant) -> Self {
        let mut by_id = std::collections::HashMap::with_capacity(snap.vms.len());
        let mut by_name = std::collections::HashMap::with_capacity(snap.vms.len());
        for (i, vm) in snap.vms.iter().enumerate() {
            by_id.insert(vm.id.clone(), i);
            by_name.insert(vm.name.to_ascii_lowercase(), i);
        }
        IndexedSnapshot {
            snap,
            by_id,
            by_name,
            fetched_at,
            asked_at: fetched_at,
        }
    }

    /// The same snapshot, asked for at `asked_at` (before it came in).
    pub fn asked_at(mut self, asked_at: std::time::Instant) -> Self {
        self.asked_at = asked_at.min(self.fetched_at);
        self
    }
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
    /// `clustertype` ExternalManaged: not scaled by CloudStack.
    pub externally_managed: bool,
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
            externally_managed,
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
            externally_managed,
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

    /// CloudStack's counts for Alert rule 5: every VM it lists (external nodes included: they
    /// are in `size`; Destroyed and Expunging VMs included: their VM-map rows still count), and
    /// the nodes it expects (control + etcd + size).
    pub fn vm_count(&self) -> (u32, u32) {
        let vms = u32::try_from(self.vms.len()).unwrap_or(u32::MAX);
        let nodes = self
            .control_nodes
            .saturating_add(self.etcd_nodes)
            .saturating_add(self.size);
        (vms, nodes)
    }

    /// The worker VMs CloudStack lists beyond the nodes it counts, as many as the excess:
    /// first those of `known` (VMs a failed scale-up is known to have left), then the newest
    /// others (CloudStack lists a cluster's VMs in creation order). Empty when there is no
    /// excess.
    pub fn left_behind(&self, known: &[&str]) -> Vec<&Vm> {
        let (vms, nodes) = self.vm_count();
        let excess = vms.saturating_sub(nodes) as usize;
        if excess == 0 {
            return Vec::new();
        }
        let workers: Vec<&Vm> = self.workers().collect();
        let mut out: Vec<&Vm> = workers
            .iter()
            .copied()
            .filter(|v| known.contains(&v.id.as_str()))
            .take(excess)
            .collect();
        for v in workers.iter().rev() {
            if out.len() >= excess {
                break;
            }
            if !out.iter().any(|o| o.id == v.id) {
                out.push(v);
            }
        }
        out
    }

    /// The VMs that are not Running, control plane first: what may keep a cluster with no
    /// worker down in Alert (a VM on a disconnected host is `Unknown`).
    pub fn not_running(&self) -> Vec<&Vm> {
        let rank = |v: &Vm| match v.role {
            NodeRole::Control => 0,
            NodeRole::Etcd => 1,
            NodeRole::Worker => 2,
            NodeRole::External => 3,
        };
        let mut out: Vec<&Vm> = self
            .vms
            .iter()
            .filter(|v| v.state != VmState::Running)
            .collect();
        out.sort_by_key(|v| rank(v));
        out
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

/// Test fixtures shared by the domain tests: a builder that reads as a sentence and produces
/// CKS-like clusters (names follow CKS naming, counts follow the VMs added).
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// Builds a [`ClusterInput`] VM by VM. Each role helper adds a VM named as CKS names it and
    /// bumps the matching count (`controlnodes`, `etcdnodes`, `size`); ids are `<role>-<n>`
    /// (`control-1`, `worker-2`, …), numbered per role from 1.
    pub(crate) struct ClusterBuilder {
        input: ClusterInput,
        counters: [u32; 4],
    }

    impl ClusterBuilder {
        /// An empty Running cluster called `name` (its id is `<name>-id`).
        pub(crate) fn new(name: &str) -> Self {
            ClusterBuilder {
                input: ClusterInput {
                    id: format!("{name}-id"),
                    name: name.to_string(),
                    state: ClusterState::Running,
                    size: 0,
                    min_size: None,
                    max_size: None,
                    autoscaling_enabled: false,
                    control_nodes: 0,
                    etcd_nodes: 0,
                    service_offering: None,
                    worker_offering: None,
                    zone_id: "zone-1".to_string(),
                    zone_name: "zone1".to_string(),
                    externally_managed: false,
                    vms: Vec::new(),
                },
                counters: [0; 4],
            }
        }

        /// A cluster called `name` with `controls` control VMs and `workers` worker VMs, all
        /// Running.
        pub(crate) fn healthy(name: &str, controls: u32, workers: u32) -> Self {
            let mut b = ClusterBuilder::new(name);
            for _ in 0..controls {
                b = b.control(VmState::Running);
            }
            for _ in 0..workers {
                b = b.worker(VmState::Running);
            }
            b
        }

        fn next(&mut self, role: NodeRole) -> u32 {
            let slot = &mut self.counters[role as usize];
            *slot += 1;
            *slot
        }

        fn push(mut self, role: NodeRole, name: String, state: VmState) -> Self {
            let n = self.counters[role as usize];
            self.input.vms.push(VmInput {
                id: format!("{}-{n}", role.as_str()),
                name,
                state,
                is_external: role == NodeRole::External,
                is_etcd: role == NodeRole::Etcd,
            });
            self
        }

        /// Adds a control VM `<name>-control-18c0a<n>` and counts it in `controlnodes`.
        pub(crate) fn control(mut self, state: VmState) -> Self {
            let n = self.next(NodeRole::Control);
            self.input.control_nodes += 1;
            let name = format!("{}-control-18c0a{n:x}", self.input.name);
            self.push(NodeRole::Control, name, state)
        }

        /// Adds an etcd VM (flagged `isetcdnode`) and counts it in `etcdnodes`.
        pub(crate) fn etcd(mut self, state: VmState) -> Self {
            let n = self.next(NodeRole::Etcd);
            self.input.etcd_nodes += 1;
            let name = format!("{}-etcd-{n}-18c0b{n:x}", self.input.name);
            self.push(NodeRole::Etcd, name, state)
        }

        /// Adds a worker VM `<name>-node-18c0c<n>` and counts it in `size`.
        pub(crate) fn worker(mut self, state: VmState) -> Self {
            let n = self.next(NodeRole::Worker);
            self.input.size += 1;
            let name = format!("{}-node-18c0c{n:x}", self.input.name);
            self.push(NodeRole::Worker, name, state)
        }

        /// Adds a worker VM that `size` does not count (left behind by a failed scale-up).
        pub(crate) fn stray_worker(mut self, state: VmState) -> Self {
            let n = self.next(NodeRole::Worker);
            let name = format!("{}-node-18c0c{n:x}", self.input.name);
            self.push(NodeRole::Worker, name, state)
        }

        /// Adds an external VM (flagged `isexternalnode`) and counts it in `size`, as CloudStack
        /// does (`KubernetesClusterAddWorker.updateKubernetesCluster`).
        pub(crate) fn external(mut self, state: VmState) -> Self {
            let n = self.next(NodeRole::External);
            self.input.size += 1;
            let name = format!("ext-{n}");
            self.push(NodeRole::External, name, state)
        }

        /// Adds a VM exactly as given; no count changes.
        pub(crate) fn vm(
            mut self,
            id: &str,
            name: &str,
            state: VmState,
            external: bool,
            etcd: bool,
        ) -> Self {
            self.input.vms.push(VmInput {
                id: id.to_string(),
                name: name.to_string(),
                state,
                is_external: external,
                is_etcd: etcd,
            });
            self
        }

        pub(crate) fn state(mut self, state: ClusterState) -> Self {
            self.input.state = state;
            self
        }

        pub(crate) fn alert(self) -> Self {
            self.state(ClusterState::Alert)
        }

        pub(crate) fn size(mut self, size: u32) -> Self {
            self.input.size = size;
            self
        }

        pub(crate) fn control_nodes(mut self, n: u32) -> Self {
            self.input.control_nodes = n;
            self
        }

        pub(crate) fn etcd_nodes(mut self, n: u32) -> Self {
            self.input.etcd_nodes = n;
            self
        }

        pub(crate) fn offerings(mut self, cluster: Option<&str>, worker: Option<&str>) -> Self {
            let offering = |id: &str| OfferingRef {
                id: id.to_string(),
                name: format!("{id}-name"),
            };
            self.input.service_offering = cluster.map(offering);
            self.input.worker_offering = worker.map(offering);
            self
        }

        pub(crate) fn input(self) -> ClusterInput {
            self.input
        }

        pub(crate) fn build(self) -> ClusterSnapshot {
            ClusterSnapshot::classify(self.input)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::ClusterBuilder;
    use super::*;

    const CLUSTER_STATES: [(&str, ClusterState); 12] = [
        ("Created", ClusterState::Created),
        ("Starting", ClusterState::Starting),
        ("Running", ClusterState::Running),
        ("Stopping", ClusterState::Stopping),
        ("Stopped", ClusterState::Stopped),
        ("Scaling", ClusterState::Scaling),
        ("Upgrading", ClusterState::Upgrading),
        ("Alert", ClusterState::Alert),
        ("Recovering", ClusterState::Recovering),
        ("Destroyed", ClusterState::Destroyed),
        ("Destroying", ClusterState::Destroying),
        ("Error", ClusterState::Error),
    ];

    #[test]
    fn cluster_states_parse_from_and_print_as_cloudstack_names() {
        for (name, state) in CLUSTER_STATES {
            assert_eq!(ClusterState::parse(name), state, "{name}");
            assert_eq!(state.as_str(), name);
            assert_eq!(state.to_string(), name);
        }
    }

    #[test]
    fn unknown_and_miscased_cluster_states_are_kept_verbatim() {
        for name in ["ScalingStoppedCluster", "Importing", "running", ""] {
            let state = ClusterState::parse(name);
            assert_eq!(state, ClusterState::Other(name.to_string()));
            assert_eq!(state.as_str(), name);
        }
    }

    /// (CloudStack name, state, down, gone)
    fn vm_state_table() -> Vec<(&'static str, VmState, bool, bool)> {
        vec![
            ("Starting", VmState::Starting, false, false),
            ("Running", VmState::Running, false, false),
            ("Stopping", VmState::Stopping, false, false),
            ("Stopped", VmState::Stopped, true, false),
            ("Destroyed", VmState::Destroyed, true, true),
            ("Expunging", VmState::Expunging, true, true),
            ("Migrating", VmState::Migrating, false, false),
            ("Error", VmState::Error, true, false),
            ("Unknown", VmState::Unknown, false, false),
            ("Shutdown", VmState::Shutdown, true, false),
            ("Restoring", VmState::Restoring, false, false),
        ]
    }

    #[test]
    fn vm_states_parse_print_and_say_whether_down_or_gone() {
        for (name, state, down, gone) in vm_state_table() {
            assert_eq!(VmState::parse(name), state, "{name}");
            assert_eq!(state.as_str(), name);
            assert_eq!(state.to_string(), name);
            assert_eq!(state.is_down(), down, "{name} down");
            assert_eq!(state.is_gone(), gone, "{name} gone");
        }
    }

    #[test]
    fn an_unknown_vm_state_is_kept_and_not_down() {
        let state = VmState::parse("Hibernated");
        assert_eq!(state, VmState::Other("Hibernated".to_string()));
        assert_eq!(state.as_str(), "Hibernated");
        assert!(!state.is_down());
        assert!(!state.is_gone());
        assert_eq!(
            VmState::parse("stopped"),
            VmState::Other("stopped".to_string())
        );
    }

    #[test]
    fn control_name_pattern() {
        let cases = [
            ("cks-cluster-control-1803b55c32d", true),
            ("k8s-control-1", true),
            ("k8s-CONTROL-1a2b", true),
            ("K8S-Control-abcdef0123", true),
            ("-control-0", true),
            ("a-b-c-control-f", true),
            ("k8s-control-", false),
            ("k8s-control-1A2B", false),
            ("k8s-control-12g", false),
            ("k8s-control", false),
            ("control-1a", false),
            ("k8s-controller-1a", false),
            // "<anything>-control": "xcontrol" is not "-control".
            ("k8s-xcontrol-1a", false),
            ("k8s-control-1a-node", false),
            ("k8s-node-1a2b", false),
            ("k8s-control-1a2b-", false),
            ("k8s-control-1a 2b", false),
            ("k8s-contröl-1a", false),
            ("ö-control-1a", true),
            ("", false),
        ];
        for (name, expected) in cases {
            assert_eq!(is_control_name(name), expected, "{name:?}");
        }
    }

    fn roles(snap: &ClusterSnapshot) -> Vec<(&str, NodeRole)> {
        snap.vms.iter().map(|v| (v.name.as_str(), v.role)).collect()
    }

    #[test]
    fn cks_named_cluster_classifies_without_warning() {
        let snap = ClusterBuilder::new("k8s")
            .control(VmState::Running)
            .control(VmState::Running)
            .etcd(VmState::Running)
            .worker(VmState::Running)
            .worker(VmState::Stopped)
            .external(VmState::Running)
            .build();
        assert_eq!(
            snap.vms.iter().map(|v| v.role).collect::<Vec<_>>(),
            vec![
                NodeRole::Control,
                NodeRole::Control,
                NodeRole::Etcd,
                NodeRole::Worker,
                NodeRole::Worker,
                NodeRole::External
            ]
        );
        assert_eq!(snap.classification_warning, None);
        assert_eq!(
            snap.workers().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            vec!["worker-1", "worker-2"]
        );
        assert_eq!(snap.vms[4].state, VmState::Stopped);
    }

    #[test]
    fn count_fallback_takes_the_first_unflagged_vms_and_warns() {
        // Names that do not follow CKS naming: only controlnodes and creation order tell.
        let snap = ClusterBuilder::new("k8s")
            .vm("e1", "etcd-a", VmState::Running, false, true)
            .vm("x1", "outside", VmState::Running, true, false)
            .vm("m1", "master-a", VmState::Running, false, false)
            .vm("m2", "master-b", VmState::Running, false, false)
            .vm("w1", "worker-a", VmState::Running, false, false)
            .control_nodes(2)
            .etcd_nodes(1)
            .size(1)
            .build();
        assert_eq!(
            roles(&snap),
            vec![
                ("etcd-a", NodeRole::Etcd),
                ("outside", NodeRole::External),
                ("master-a", NodeRole::Control),
                ("master-b", NodeRole::Control),
                ("worker-a", NodeRole::Worker),
            ]
        );
        let warning = snap
            .classification_warning
            .expect("names and count disagree");
        assert!(warning.contains("\"k8s\""), "{warning}");
        assert!(warning.contains("0 VM(s) match"), "{warning}");
        assert!(warning.contains("controlnodes=2"), "{warning}");
        assert!(warning.contains("master-a, master-b"), "{warning}");
    }

    #[test]
    fn a_control_named_vm_beyond_the_count_is_still_control_and_warned_about() {
        // controlnodes says 1, but two VMs carry control names: neither may be taken for a
        // worker.
        let snap = ClusterBuilder::new("k8s")
            .vm("c1", "k8s-control-aa1", VmState::Running, false, false)
            .vm("w1", "k8s-node-bb1", VmState::Running, false, false)
            .vm("c2", "k8s-control-aa2", VmState::Running, false, false)
            .control_nodes(1)
            .size(1)
            .build();
        assert_eq!(
            roles(&snap),
            vec![
                ("k8s-control-aa1", NodeRole::Control),
                ("k8s-node-bb1", NodeRole::Worker),
                ("k8s-control-aa2", NodeRole::Control),
            ]
        );
        let warning = snap.classification_warning.expect("two names, count one");
        assert!(warning.contains("2 VM(s) match"), "{warning}");
        assert!(warning.contains("controlnodes=1"), "{warning}");
        assert!(
            warning.contains("k8s-control-aa1, k8s-control-aa2"),
            "{warning}"
        );
    }

    #[test]
    fn the_count_protects_a_control_vm_whose_name_does_not_match() {
        // One control VM renamed: the name pattern finds one, the count two; the first two
        // unflagged VMs are both control.
        let snap = ClusterBuilder::new("k8s")
            .vm("c1", "k8s-control-aa1", VmState::Running, false, false)
            .vm("c2", "renamed", VmState::Running, false, false)
            .vm("w1", "k8s-node-bb1", VmState::Running, false, false)
            .control_nodes(2)
            .size(1)
            .build();
        assert_eq!(snap.vm("c2").map(|v| v.role), Some(NodeRole::Control));
        assert_eq!(snap.vm("w1").map(|v| v.role), Some(NodeRole::Worker));
        let warning = snap.classification_warning.expect("one name, count two");
        assert!(warning.contains("1 VM(s) match"), "{warning}");
        assert!(warning.contains("(k8s-control-aa1)"), "{warning}");
        assert!(warning.contains("k8s-control-aa1, renamed"), "{warning}");
    }

    #[test]
    fn etcd_and_external_flags_win_over_control_names() {
        let snap = ClusterBuilder::new("k8s")
            .vm("e1", "k8s-control-e1", VmState::Running, false, true)
            .vm("x1", "k8s-control-f1", VmState::Running, true, false)
            .vm("xe", "k8s-control-f2", VmState::Running, true, true)
            .vm("c1", "k8s-control-a1", VmState::Running, false, false)
            .vm("w1", "k8s-node-b1", VmState::Running, false, false)
            .control_nodes(1)
            .etcd_nodes(1)
            .size(1)
            .build();
        assert_eq!(
            roles(&snap),
            vec![
                ("k8s-control-e1", NodeRole::Etcd),
                ("k8s-control-f1", NodeRole::External),
                ("k8s-control-f2", NodeRole::External),
                ("k8s-control-a1", NodeRole::Control),
                ("k8s-node-b1", NodeRole::Worker),
            ]
        );
        // Flagged VMs are not counted as name matches either.
        assert_eq!(snap.classification_warning, None);
    }

    #[test]
    fn zero_control_nodes_and_no_control_names_leaves_everything_worker_without_warning() {
        let snap = ClusterBuilder::new("k8s")
            .vm("w1", "a", VmState::Running, false, false)
            .vm("w2", "b", VmState::Running, false, false)
            .size(2)
            .build();
        assert!(snap.vms.iter().all(|v| v.role == NodeRole::Worker));
        assert_eq!(snap.classification_warning, None);
    }

    #[test]
    fn classify_keeps_cluster_fields_and_vm_order() {
        let input = ClusterBuilder::healthy("k8s", 1, 2)
            .offerings(Some("small"), Some("large"))
            .state(ClusterState::Alert)
            .input();
        let snap = ClusterSnapshot::classify(input.clone());
        assert_eq!(snap.id, input.id);
        assert_eq!(snap.name, "k8s");
        assert_eq!(snap.state, ClusterState::Alert);
        assert_eq!(snap.size, 2);
        assert_eq!(snap.control_nodes, 1);
        assert_eq!(snap.zone_id, "zone-1");
        assert_eq!(snap.zone_name, "zone1");
        assert_eq!(snap.service_offering, input.service_offering);
        assert_eq!(snap.worker_offering, input.worker_offering);
        let ids: Vec<&str> = snap.vms.iter().map(|v| v.id.as_str()).collect();
        let input_ids: Vec<&str> = input.vms.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, input_ids);
    }

    #[test]
    fn lookups_by_id_and_case_insensitive_name() {
        let snap = ClusterBuilder::healthy("K8s", 1, 1).build();
        assert_eq!(
            snap.vm("worker-1").map(|v| v.name.as_str()),
            Some("K8s-node-18c0c1")
        );
        assert_eq!(snap.vm("nope"), None);
        assert_eq!(
            snap.vm_by_name("k8s-node-18c0c1").map(|v| v.id.as_str()),
            Some("worker-1")
        );
        assert_eq!(snap.vm_by_name("k8s-node-18c0c2"), None);
    }

    #[test]
    fn new_workers_get_the_worker_offering_else_the_cluster_offering() {
        let both = ClusterBuilder::new("k8s")
            .offerings(Some("small"), Some("large"))
            .build();
        assert_eq!(
            both.effective_worker_offering().map(|o| o.id.as_str()),
            Some("large")
        );
        let cluster_only = ClusterBuilder::new("k8s")
            .offerings(Some("small"), None)
            .build();
        assert_eq!(
            cluster_only
                .effective_worker_offering()
                .map(|o| o.id.as_str()),
            Some("small")
        );
        let none = ClusterBuilder::new("k8s").build();
        assert_eq!(none.effective_worker_offering(), None);
    }
}
