//! The rules CloudStack applies to `scaleKubernetesCluster`, as one pure decision function.
//!
//! The provider runs [`check_scale`] on its latest snapshot before it sends anything, so a
//! request CloudStack would refuse is refused here with a message naming the rule and the VMs
//! involved, and nothing reaches CloudStack. The simulator has its own, independent copy of
//! these rules (written from the same CloudStack facts) so tests catch the two disagreeing.

use super::cluster::{ClusterSnapshot, ClusterState, NodeRole, Vm, VmState};
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
    /// `workers` is the count the request was measured against: the number of worker VMs, or
    /// the cluster's `size` when that is smaller (CloudStack compares with `size`).
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
    /// Destroyed and Expunging VMs are counted: CloudStack still lists them (its VM-map rows),
    /// and its own check counts those rows.
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
    ///
    /// Rules that CloudStack applies only in Alert carry their number from the CKS scaling rules
    /// ("alert_rule_6_control_plane_down"); the others apply in several states and do not.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::StateNotScalable { .. } => "state_not_scalable",
            Refusal::StoppedClusterSize { .. } => "stopped_cluster_size",
            Refusal::AlertUnsupported { .. } => "alert_unsupported",
            Refusal::NoChange { .. } => "no_change",
            Refusal::SizeBelowOne { .. } => "size_below_one",
            Refusal::RemovesAllWorkers { .. } => "removes_all_workers",
            Refusal::NotWorkers { .. } => "not_workers",
            Refusal::UnknownVm { .. } => "unknown_vm",
            Refusal::FirstControlNotRunning { .. } => "alert_rule_4_first_control_not_running",
            Refusal::ControlPlaneDown { .. } => "alert_rule_6_control_plane_down",
            Refusal::VmCountMismatch { .. } => "alert_rule_5_vm_count_mismatch",
            Refusal::AlertWithoutDownWorker { .. } => "alert_rule_7_no_down_worker",
        }
    }
}

impl fmt::Display for Refusal {
    /// One sentence an operator acts on: the cluster, the rule, the VMs involved and what to do,
    /// e.g. "cluster k8s: control VM k8s-control-1a2b is Stopped; CloudStack refuses scaling
    /// until the control plane is recovered (start the VM)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::StateNotScalable { cluster, state } => write!(
                f,
                "cluster {cluster:?} is in state {state}, in which CloudStack scales nothing \
                 (\"is in {state} state and can not be scaled\"); wait until it is Running \
                 again, or have an operator recover it if it stays {state}"
            ),
            Refusal::StoppedClusterSize { cluster } => write!(
                f,
                "cluster {cluster:?} is Stopped: CloudStack refuses a size change on a stopped \
                 cluster; start the cluster first (removing named worker nodes is still possible)"
            ),
            Refusal::AlertUnsupported {
                cluster,
                cloudstack_error,
            } => write!(
                f,
                "cluster {cluster:?} is in Alert and this CloudStack does not scale clusters in \
                 Alert (it predates the Alert-scaling change); CloudStack said: \"{cloudstack_error}\"; \
                 recover the cluster (start the down VM) or upgrade CloudStack"
            ),
            Refusal::NoChange { cluster, size } => write!(
                f,
                "cluster {cluster:?}: the request changes nothing (the size is already {size} and \
                 no node is named for removal); CloudStack refuses a request that changes neither \
                 the size nor the nodes in Alert, and there is nothing to do (CKS Alert rule 2)"
            ),
            Refusal::SizeBelowOne { cluster, new_size } => write!(
                f,
                "cluster {cluster:?}: size {new_size} is below 1; CloudStack refuses a cluster \
                 without workers; ask for at least 1 worker (check the node group's minimum size)"
            ),
            Refusal::RemovesAllWorkers { cluster, workers } => write!(
                f,
                "cluster {cluster:?}: the request removes all {workers} worker(s); CloudStack \
                 refuses it (\"Can not remove all nodes from a cluster\"); keep at least one \
                 worker (check the node group's minimum size)"
            ),
            Refusal::NotWorkers { cluster, vms } => {
                let list: Vec<String> = vms
                    .iter()
                    .map(|(name, role)| format!("{name} ({})", role.as_str()))
                    .collect();
                write!(
                    f,
                    "cluster {cluster:?}: the request names VMs that are not workers: {}; \
                     scaling must never remove control, etcd or external nodes, so nothing was \
                     sent; remove only worker nodes (CKS Alert rule 3)",
                    list.join(", ")
                )
            }
            Refusal::UnknownVm { cluster, vm_id } => write!(
                f,
                "cluster {cluster:?}: VM {vm_id} is not a VM of this cluster (CloudStack: \
                 \"Invalid node ids\"); the node may belong to another cluster or the VM is \
                 already gone; refresh and retry"
            ),
            Refusal::FirstControlNotRunning { cluster, vm, state } => {
                if vm.is_empty() {
                    write!(
                        f,
                        "cluster {cluster:?}: CloudStack lists no control VM, so the first \
                         control node cannot be reached; CloudStack refuses scaling until the \
                         control plane is recovered (CKS Alert rule 4)"
                    )
                } else {
                    write!(
                        f,
                        "cluster {cluster:?}: first control VM {vm} is {state}; CloudStack \
                         refuses scaling until the control plane is recovered (start the VM) \
                         (CKS Alert rule 4)"
                    )
                }
            }
            Refusal::ControlPlaneDown { cluster, vms } => {
                let list: Vec<String> = vms
                    .iter()
                    .map(|(name, role, state)| format!("{} VM {name} is {state}", role.as_str()))
                    .collect();
                write!(
                    f,
                    "cluster {cluster:?}: {}; CloudStack refuses scaling until the control plane \
                     is recovered (start the VM{}) (CKS Alert rule 6)",
                    list.join(", "),
                    if vms.len() > 1 { "s" } else { "" }
                )
            }
            Refusal::VmCountMismatch {
                cluster,
                vms,
                nodes,
            } => write!(
                f,
                "cluster {cluster:?}: CloudStack lists {vms} VMs (external nodes left out) but \
                 the cluster has {nodes} nodes (control + etcd + size); CloudStack refuses scaling \
                 while they differ; VMs left behind by a failed scale-up must be removed by an \
                 operator (CKS Alert rule 5)"
            ),
            Refusal::AlertWithoutDownWorker { cluster } => write!(
                f,
                "cluster {cluster:?} is in Alert but no worker VM is down: it is in Alert for a \
                 reason scaling cannot fix (a failed start or upgrade, a VM on a disconnected \
                 host); CloudStack refuses scaling, an operator must recover the cluster \
                 (CKS Alert rule 7)"
            ),
        }
    }
}

/// Decides whether CloudStack would accept `request` on a cluster in the state `snapshot`
/// shows. Checks, in this order (the first that applies wins):
/// 1. RemoveNodes: every id is a VM of the cluster (UnknownVm), every VM is a worker
///    (NotWorkers, in every cluster state), the list is not empty (NoChange) and does not remove
///    every worker (RemovesAllWorkers, counting all workers, down ones included; CloudStack's
///    own limit, `size`, applies too when it is smaller);
///    Resize: new_size ≥ 1 (SizeBelowOne);
/// 2. by cluster state:
///    - Created, Running: accepted (Resize to the current size → NoChange);
///    - Stopped: Resize refused (StoppedClusterSize, even to the current size: the stopped
///      cluster is what the operator has to act on); RemoveNodes accepted;
///    - Alert: AlertScaling::Unsupported → AlertUnsupported; otherwise rules of cks-scaling.md in
///      this order: 4 FirstControlNotRunning, 6 ControlPlaneDown, 5 VmCountMismatch,
///      7 AlertWithoutDownWorker, 2 NoChange;
///    - every other state: StateNotScalable.
pub fn check_scale(
    snapshot: &ClusterSnapshot,
    request: &ScaleRequest,
    alert: &AlertScaling,
) -> Result<(), Refusal> {
    let cluster = || snapshot.name.clone();
    match request {
        ScaleRequest::RemoveNodes { vm_ids } => check_node_list(snapshot, vm_ids)?,
        ScaleRequest::Resize { new_size } if *new_size < 1 => {
            return Err(Refusal::SizeBelowOne {
                cluster: cluster(),
                new_size: *new_size,
            });
        }
        ScaleRequest::Resize { .. } => {}
    }
    let no_change = || match request {
        ScaleRequest::Resize { new_size } if *new_size == snapshot.size => Err(Refusal::NoChange {
            cluster: cluster(),
            size: snapshot.size,
        }),
        _ => Ok(()),
    };
    match &snapshot.state {
        ClusterState::Created | ClusterState::Running => no_change(),
        ClusterState::Stopped => match request {
            ScaleRequest::Resize { .. } => Err(Refusal::StoppedClusterSize { cluster: cluster() }),
            ScaleRequest::RemoveNodes { .. } => Ok(()),
        },
        ClusterState::Alert => {
            alert_rules(snapshot, alert)?;
            no_change()
        }
        other => Err(Refusal::StateNotScalable {
            cluster: cluster(),
            state: other.as_str().to_string(),
        }),
    }
}

/// The request-independent checks on a node list: membership, worker-only, not empty, not
/// every worker. Duplicate ids count once.
fn check_node_list(snapshot: &ClusterSnapshot, vm_ids: &[String]) -> Result<(), Refusal> {
    let mut named = Vec::with_capacity(vm_ids.len());
    for id in vm_ids {
        let Some(vm) = snapshot.vm(id) else {
            return Err(Refusal::UnknownVm {
                cluster: snapshot.name.clone(),
                vm_id: id.clone(),
            });
        };
        if !named.iter().any(|v: &&Vm| v.id == vm.id) {
            named.push(vm);
        }
    }
    let not_workers: Vec<(String, NodeRole)> = named
        .iter()
        .filter(|v| v.role != NodeRole::Worker)
        .map(|v| (v.name.clone(), v.role))
        .collect();
    if !not_workers.is_empty() {
        return Err(Refusal::NotWorkers {
            cluster: snapshot.name.clone(),
            vms: not_workers,
        });
    }
    if named.is_empty() {
        return Err(Refusal::NoChange {
            cluster: snapshot.name.clone(),
            size: snapshot.size,
        });
    }
    // CloudStack refuses removing `size` or more nodes; removing every worker VM is refused too
    // even when `size` lags behind the VMs (a cluster with no worker left is never wanted).
    let workers = snapshot.workers().count().min(snapshot.size as usize);
    if named.len() >= workers {
        return Err(Refusal::RemovesAllWorkers {
            cluster: snapshot.name.clone(),
            workers: u32::try_from(workers).unwrap_or(u32::MAX),
        });
    }
    Ok(())
}

/// The Alert rules of the CKS scaling rules that do not depend on the request, in the order
/// CloudStack is documented to apply them: 4, 6, 5, 7.
fn alert_rules(snapshot: &ClusterSnapshot, alert: &AlertScaling) -> Result<(), Refusal> {
    let cluster = || snapshot.name.clone();
    if let AlertScaling::Unsupported { cloudstack_error } = alert {
        return Err(Refusal::AlertUnsupported {
            cluster: cluster(),
            cloudstack_error: cloudstack_error.clone(),
        });
    }

    // Rule 4. With no control VM at all, the vm name is left empty; the message says so.
    match snapshot.vms.iter().find(|v| v.role == NodeRole::Control) {
        Some(first) if first.state == VmState::Running => {}
        Some(first) => {
            return Err(Refusal::FirstControlNotRunning {
                cluster: cluster(),
                vm: first.name.clone(),
                state: first.state.as_str().to_string(),
            });
        }
        None => {
            return Err(Refusal::FirstControlNotRunning {
                cluster: cluster(),
                vm: String::new(),
                state: "missing".to_string(),
            });
        }
    }

    // Rule 6.
    let control_plane_down: Vec<(String, NodeRole, String)> = snapshot
        .vms
        .iter()
        .filter(|v| matches!(v.role, NodeRole::Control | NodeRole::Etcd) && v.state.is_down())
        .map(|v| (v.name.clone(), v.role, v.state.as_str().to_string()))
        .collect();
    if !control_plane_down.is_empty() {
        return Err(Refusal::ControlPlaneDown {
            cluster: cluster(),
            vms: control_plane_down,
        });
    }

    // Rule 5. Destroyed/Expunging VMs are still listed (VM-map rows), so they count.
    let vms = snapshot
        .vms
        .iter()
        .filter(|v| v.role != NodeRole::External)
        .count();
    let vms = u32::try_from(vms).unwrap_or(u32::MAX);
    let nodes = snapshot
        .control_nodes
        .saturating_add(snapshot.etcd_nodes)
        .saturating_add(snapshot.size);
    if vms != nodes {
        return Err(Refusal::VmCountMismatch {
            cluster: cluster(),
            vms,
            nodes,
        });
    }

    // Rule 7.
    if !snapshot.workers().any(|v| v.state.is_down()) {
        return Err(Refusal::AlertWithoutDownWorker { cluster: cluster() });
    }
    Ok(())
}

/// Why the group cannot scale right now, if it cannot, judged without a request: the cluster
/// state rules of [`check_scale`] (Alert rules 4, 6, 5, 7; non-scalable states; Alert on a
/// CloudStack without Alert scaling). `None` when a size change would be accepted.
/// Used in the node group's debug string and NodeGroupNodes error messages.
pub fn blocked_reason(snapshot: &ClusterSnapshot, alert: &AlertScaling) -> Option<Refusal> {
    match &snapshot.state {
        ClusterState::Created | ClusterState::Running => None,
        ClusterState::Stopped => Some(Refusal::StoppedClusterSize {
            cluster: snapshot.name.clone(),
        }),
        ClusterState::Alert => alert_rules(snapshot, alert).err(),
        other => Some(Refusal::StateNotScalable {
            cluster: snapshot.name.clone(),
            state: other.as_str().to_string(),
        }),
    }
}
