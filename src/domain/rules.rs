//! The rules CloudStack applies to `scaleKubernetesCluster`, as one pure decision function.
//!
//! The provider runs [`check_scale`] on its latest snapshot before it sends anything, so a
//! request CloudStack would refuse is refused here with a message naming the rule and the VMs
//! involved, and nothing reaches CloudStack. The simulator has its own, independent copy of
//! these rules (written from the same CloudStack facts) so tests catch the two disagreeing.

use super::cluster::{ClusterSnapshot, NodeRole};
use std::fmt;

/// What the provider asks CloudStack to do. Nothing else is ever sent: no offerings, no
/// autoscaling settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleRequest {
    /// `scaleKubernetesCluster id=… size=…` (the new worker count).
    Resize { new_size: u32 },
    /// `scaleKubernetesCluster id=… nodeids=…` (VM ids to remove).
    RemoveNodes { vm_ids: Vec<String> },
}

/// Whether the CloudStack behind the provider scales clusters in Alert (CloudStack PR 14604).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlertScaling {
    /// Not known yet: the Alert rules are applied as if it does; CloudStack's answer tells.
    Unknown,
    /// This CloudStack accepts size changes and down-worker removal in Alert.
    Supported,
    /// This CloudStack refuses every request in Alert; the text is CloudStack's own refusal
    /// (passed through to the autoscaler with an explanation).
    Unsupported { cloudstack_error: String },
}

/// A refusal, one variant per rule, carrying what the message names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The cluster is in a state in which CloudStack scales nothing (Scaling, Starting,
    /// Stopping, Upgrading, Recovering, Destroying, Destroyed, Error, unknown states).
    StateNotScalable { cluster: String, state: String },
    /// A size change on a Stopped cluster.
    StoppedClusterSize { cluster: String },
    /// Alert on a CloudStack without Alert scaling (AlertScaling::Unsupported).
    AlertUnsupported {
        cluster: String,
        cloudstack_error: String,
    },
    /// Rule 2: neither the size nor the nodes would change (size equal to the current size, or
    /// an empty node list).
    NoChange { cluster: String, size: u32 },
    /// A new size below 1 (CloudStack refuses size < 1).
    SizeBelowOne { cluster: String, new_size: u32 },
    /// Removing every worker (CloudStack: "Can not remove all nodes from a cluster").
    RemovesAllWorkers { cluster: String, workers: u32 },
    /// Rule 3: nodeids naming control, etcd or external nodes (refused in every state: scaling
    /// must never touch them), listed as (vm name, role).
    NotWorkers {
        cluster: String,
        vms: Vec<(String, NodeRole)>,
    },
    /// A node id that is not a VM of this cluster.
    UnknownVm { cluster: String, vm_id: String },
    /// Rule 4: the first control node's VM is not Running (name, state).
    FirstControlNotRunning {
        cluster: String,
        vm: String,
        state: String,
    },
    /// Rule 6: control or etcd VMs down, listed as (vm name, role, state).
    ControlPlaneDown {
        cluster: String,
        vms: Vec<(String, NodeRole, String)>,
    },
    /// Rule 5: the VM count (external nodes left out) differs from control + etcd + size.
    VmCountMismatch {
        cluster: String,
        vms: u32,
        nodes: u32,
    },
    /// Rule 7: Alert but no worker VM is down: scaling will not fix it.
    AlertWithoutDownWorker { cluster: String },
}

impl Refusal {
    /// A short stable name of the rule, for logs and metrics labels.
    pub fn rule(&self) -> &'static str {
        todo!("domain helper")
    }
}

impl fmt::Display for Refusal {
    /// One sentence an operator acts on: the cluster, the rule, the VMs involved and what to do,
    /// e.g. "cluster k8s: control VM k8s-control-1a2b is Stopped; CloudStack refuses scaling
    /// until the control plane is recovered (start the VM)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        todo!("domain helper")
    }
}

/// Decides whether CloudStack would accept `request` on a cluster in the state `snapshot`
/// shows. Checks, in this order (the first that applies wins):
/// 1. RemoveNodes: every id is a VM of the cluster (UnknownVm), every VM is a worker
///    (NotWorkers, in every cluster state), the list is not empty (NoChange) and does not remove
///    every worker (RemovesAllWorkers, counting all workers, down ones included);
///    Resize: new_size ≥ 1 (SizeBelowOne);
/// 2. by cluster state:
///    - Created, Running: accepted (Resize to the current size → NoChange);
///    - Stopped: Resize refused (StoppedClusterSize); RemoveNodes accepted;
///    - Alert: AlertScaling::Unsupported → AlertUnsupported; otherwise rules of cks-scaling.md in
///      this order: 4 FirstControlNotRunning, 6 ControlPlaneDown, 5 VmCountMismatch,
///      7 AlertWithoutDownWorker, 2 NoChange;
///    - every other state: StateNotScalable.
pub fn check_scale(
    snapshot: &ClusterSnapshot,
    request: &ScaleRequest,
    alert: &AlertScaling,
) -> Result<(), Refusal> {
    todo!("domain helper")
}

/// Why the group cannot scale right now, if it cannot, judged without a request: the cluster
/// state rules of [`check_scale`] (Alert rules 4, 6, 5, 7; non-scalable states; Alert on a
/// CloudStack without Alert scaling). `None` when a size change would be accepted.
/// Used in the node group's debug string and NodeGroupNodes error messages.
pub fn blocked_reason(snapshot: &ClusterSnapshot, alert: &AlertScaling) -> Option<Refusal> {
    todo!("domain helper")
}
