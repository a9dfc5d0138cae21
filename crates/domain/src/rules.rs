//! The rules CloudStack applies to `scaleKubernetesCluster`, as one pure decision function.
//!
//! The provider runs [`check_scale`] on its latest snapshot before it sends anything, so a
//! request CloudStack would refuse is refused here with a message naming the rule and the VMs
//! involved, and nothing reaches CloudStack. The simulator has its own, independent copy of
//! these rules (written from the same CloudStack facts) so tests catch the two disagreeing.

use super::cluster::{ClusterSnapshot, ClusterState, NodeRole, Vm, VmState};
use super::stranded::{StrandRule, Stranded};
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
    /// Rule 5: the VM count (external nodes included: they are in `size`) differs from
    /// control + etcd + size. Destroyed and Expunging VMs are counted: CloudStack still lists
    /// them (its VM-map rows), and its own check counts those rows. `left_behind`: with more
    /// VMs than nodes, the VMs a failed scale-up left (`name (state)`,
    /// [`ClusterSnapshot::left_behind`]).
    VmCountMismatch {
        cluster: String,
        vms: u32,
        nodes: u32,
        left_behind: Vec<String>,
    },
    /// Rule 7: Alert but no worker VM is down: scaling will not fix it. `not_running`: the
    /// VMs that are not Running (`name (state)`), what may keep it in Alert.
    AlertWithoutDownWorker {
        cluster: String,
        not_running: Vec<String>,
    },
    /// A removal that leaves worker VMs but names as many as the cluster's `size`, which lags
    /// behind the worker VMs CloudStack lists (VMs a failed scale-up left): CloudStack counts
    /// the request against `size` and refuses it as removing every node. Checked after the
    /// cluster state rules, which name the stranding first in Alert (rule 5).
    SizeBehindWorkers {
        cluster: String,
        removed: u32,
        workers: u32,
        size: u32,
    },
    /// `clustertype` ExternalManaged: CloudStack scales no such cluster (its job fails with
    /// "Scale kubernetes cluster is not supported for an externally managed cluster").
    ExternallyManaged { cluster: String },
    /// A removal naming down workers (`name (state)`) on a CloudStack without Alert scaling:
    /// it drains every node it removes, a down node's drain fails, and the failed job puts the
    /// cluster in Alert, where it refuses every request (`real-world.md`, "Removing nodes";
    /// `recorded/alert_09_scale_err_alert_nodeids_job_final`). It can never succeed until an
    /// operator starts the VM or removes it in CloudStack.
    DownWorkerNotRemovable {
        cluster: String,
        vms: Vec<String>,
        cloudstack_error: String,
    },
    /// A size job of this cluster failed on CloudStack's offering map for size-only requests
    /// (apache/cloudstack#11994, `machine::offerings`): every size request fails the same way
    /// until the cluster's node types run its own offering.
    SizeScalingBroken {
        cluster: String,
        cloudstack_error: String,
    },
    /// A scale-up of a cluster listing external nodes (their names), which CloudStack fails on
    /// an isolated or VPC network (apache/cloudstack#12633, `machine::external`); with
    /// CloudStack's text once it failed one.
    ExternalNodeScaleUp {
        cluster: String,
        external: Vec<String>,
        cloudstack_error: Option<String>,
    },
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
            Refusal::SizeBehindWorkers { .. } => "size_behind_workers",
            Refusal::ExternallyManaged { .. } => "externally_managed",
            Refusal::DownWorkerNotRemovable { .. } => "down_worker_not_removable",
            Refusal::SizeScalingBroken { .. } => "size_scaling_broken_offerings",
            Refusal::ExternalNodeScaleUp { .. } => "external_node_scale_up",
        }
    }
}

impl fmt::Display for Refusal {
    /// One sentence an operator acts on: the cluster, the rule, the VMs involved and what to do,
    /// e.g. `cluster "k8s": control VM k8s-control-1a2b is Stopped; CloudStack refuses scaling
    /// until the control plane is recovered (start the VM) (CKS Alert rule 6)`. Rules numbered in
    /// the CKS scaling rules end with their number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::StateNotScalable { cluster, state } => {
                let advice = match state.as_str() {
                    "Destroyed" | "Destroying" => {
                        "the cluster is being removed; take its node group out of the \
                         autoscaler's configuration"
                    }
                    "Error" => "its creation failed; an operator must recover or recreate it",
                    "Starting" | "Stopping" | "Scaling" | "Upgrading" | "Recovering" => {
                        "wait for the operation in progress to finish (an operator recovers \
                         the cluster if it stays in this state)"
                    }
                    _ => "an operator must bring the cluster back to Running",
                };
                write!(
                    f,
                    "cluster {cluster:?} is in state {state}, in which CloudStack scales nothing \
                     (\"is in {state} state and can not be scaled\"); {advice}"
                )
            }
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
            Refusal::DownWorkerNotRemovable {
                cluster,
                vms,
                cloudstack_error,
            } => write!(
                f,
                "cluster {cluster:?}: worker VM(s) {} are down, and this CloudStack (without the \
                 Alert-scaling change) drains every node it removes: the drain of a down node \
                 fails and the cluster goes to Alert, where every request is refused; \
                 CloudStack said: \"{cloudstack_error}\"; start the VM (the autoscaler then \
                 removes it if it is still unneeded) or remove it in CloudStack",
                vms.join(", ")
            ),
            Refusal::SizeScalingBroken {
                cluster,
                cloudstack_error,
            } => write!(
                f,
                "cluster {cluster:?}: CloudStack failed this cluster's last size change and would \
                 fail every one: CloudStack 4.21 and later give a request that names only a size \
                 the cluster's own offering for every node type, and a node type running another \
                 offering is then changed to it, which KVM refuses while its VMs run \
                 (apache/cloudstack#11994); CloudStack said: \"{cloudstack_error}\"; make every \
                 node type run the cluster's service offering (change the offerings with the \
                 cluster stopped) or upgrade CloudStack to a release with the fix; the provider \
                 tries again once the cluster's listed offerings change, or after a restart"
            ),
            Refusal::ExternalNodeScaleUp {
                cluster,
                external,
                cloudstack_error: None,
            } => write!(
                f,
                "cluster {cluster:?} has external node(s) {}: CloudStack fails a scale-up of such \
                 a cluster on an isolated or VPC network after creating the new VMs (\"unable \
                 to update network rules\", apache/cloudstack#12633, not fixed in any release), \
                 leaving them behind and the cluster in Alert; remove the external nodes from \
                 the CKS cluster, or, if its network is shared (CloudStack then writes no \
                 rules), start the provider with --external-node-scale-up=allow",
                external.join(", ")
            ),
            Refusal::ExternalNodeScaleUp {
                cluster,
                external,
                cloudstack_error: Some(text),
            } => write!(
                f,
                "cluster {cluster:?} has external node(s) {} and CloudStack failed its last \
                 scale-up on the network rules (apache/cloudstack#12633); CloudStack said: \
                 \"{text}\"; clean up the VMs that scale-up left (docs/operations.md, \
                 stranded clusters) and remove the external nodes from the CKS cluster; the \
                 provider sends scale-ups again once the cluster lists no external node, or \
                 after a restart",
                external.join(", ")
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
                left_behind,
            } => {
                write!(
                    f,
                    "cluster {cluster:?}: CloudStack lists {vms} VMs but the cluster has {nodes} \
                     nodes (control + etcd + size, external nodes counted in size); "
                )?;
                if vms > nodes {
                    let which = if left_behind.is_empty() {
                        "VMs".to_string()
                    } else {
                        left_behind.join(", ")
                    };
                    write!(
                        f,
                        "a failed scale-up left {which} behind (CloudStack keeps the VMs it \
                         created and writes the size only on success); CloudStack refuses every \
                         scale request while the two differ, and refuses to destroy a cluster's \
                         VM directly; a CloudStack administrator must remove the VMs left behind \
                         (drain and delete their nodes first) or, if they are Ready nodes to \
                         keep, correct the cluster's size to count them (operations guide §7.2) \
                         (CKS Alert rule 5)"
                    )
                } else {
                    write!(
                        f,
                        "a removal that failed part way destroyed VMs without lowering the size; \
                         CloudStack refuses every scale request while the two differ; a \
                         CloudStack administrator must correct the cluster's size to the VMs \
                         left (operations guide §7.2) (CKS Alert rule 5)"
                    )
                }
            }
            Refusal::SizeBehindWorkers {
                cluster,
                removed,
                workers,
                size,
            } => write!(
                f,
                "cluster {cluster:?}: the request removes {removed} of the {workers} worker VMs \
                 CloudStack lists, but the cluster's size is {size} and CloudStack refuses \
                 removing as many nodes as the size (\"Can not remove all nodes from a \
                 cluster\"); the VMs beyond the size were left by a failed scale-up and only an \
                 administrator can make the two agree (operations guide §7.2)"
            ),
            Refusal::ExternallyManaged { cluster } => write!(
                f,
                "cluster {cluster:?} is externally managed (clustertype ExternalManaged): \
                 CloudStack does not scale such clusters; scale it with the tool that manages it, \
                 or leave it out of --nodes"
            ),
            Refusal::AlertWithoutDownWorker {
                cluster,
                not_running,
            } => {
                let seen = if not_running.is_empty() {
                    "every VM runs, so a node is NotReady or cordoned".to_string()
                } else {
                    format!("not Running: {}", not_running.join(", "))
                };
                write!(
                    f,
                    "cluster {cluster:?} is in Alert but no worker VM is down ({seen}): it is in \
                     Alert for a reason scaling cannot fix, and CloudStack refuses every scale \
                     request; an operator must find it: uncordon a node a failed drain left \
                     cordoned (CloudStack counts only Ready nodes), bring back a VM on a \
                     disconnected host, or repeat a failed start or upgrade (operations guide \
                     §7.1) (CKS Alert rule 7)"
                )
            }
        }
    }
}

impl Stranded {
    /// The refusal every scale request of a stranded cluster gets: it names the rule, the VMs
    /// and the operator's fix.
    pub fn refusal(&self) -> Refusal {
        let labels = self.involved.iter().map(ToString::to_string).collect();
        match self.rule {
            StrandRule::VmCount => Refusal::VmCountMismatch {
                cluster: self.cluster.clone(),
                vms: self.vms,
                nodes: self.nodes,
                left_behind: labels,
            },
            StrandRule::NoDownWorker => Refusal::AlertWithoutDownWorker {
                cluster: self.cluster.clone(),
                not_running: labels,
            },
        }
    }
}

impl fmt::Display for Stranded {
    /// One sentence for an operator: what CloudStack did, the VMs, and the fix (the refusal's
    /// text).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.refusal())
    }
}

/// Decides whether CloudStack would accept `request` on a cluster in the state `snapshot`
/// shows. Checks, in this order (the first that applies wins):
/// 0. an externally managed cluster (ExternallyManaged), whatever the request;
/// 1. RemoveNodes: every id is a VM of the cluster (UnknownVm), every VM is a worker
///    (NotWorkers, in every cluster state), the list is not empty (NoChange) and does not remove
///    every worker (RemovesAllWorkers, counting all workers, down ones included). CloudStack's
///    own limit, `size`, applies too when it is smaller, but a request that leaves workers and
///    reaches only that limit is refused after the state rules (SizeBehindWorkers): `size`
///    lags behind the VMs when CloudStack stranded the cluster, and in Alert rule 5 says so;
///    with AlertScaling::Unsupported, no named worker is down (DownWorkerNotRemovable);
///    Resize: new_size ≥ 1 (SizeBelowOne);
/// 2. by cluster state:
///    - Created, Running: accepted (a Resize to the current size too: CloudStack returns early
///      and accepts it outside Alert);
///    - Stopped: Resize refused (StoppedClusterSize, even to the current size: the stopped
///      cluster is what the operator has to act on); RemoveNodes accepted;
///    - Alert: AlertScaling::Unsupported → AlertUnsupported; otherwise rules of cks-scaling.md in
///      this order (assumed, *unverified*): 4 FirstControlNotRunning, 6 ControlPlaneDown,
///      5 VmCountMismatch, 7 AlertWithoutDownWorker, 2 NoChange;
///    - every other state: StateNotScalable;
/// 3. a removal that reaches only the lagging `size` (SizeBehindWorkers).
pub fn check_scale(
    snapshot: &ClusterSnapshot,
    request: &ScaleRequest,
    alert: &AlertScaling,
) -> Result<(), Refusal> {
    let cluster = || snapshot.name.clone();
    if snapshot.externally_managed {
        return Err(Refusal::ExternallyManaged { cluster: cluster() });
    }
    let behind = match request {
        ScaleRequest::RemoveNodes { vm_ids } => {
            let behind = check_node_list(snapshot, vm_ids)?;
            check_down_removal(snapshot, vm_ids, alert)?;
            behind
        }
        ScaleRequest::Resize { new_size } if *new_size < 1 => {
            return Err(Refusal::SizeBelowOne {
                cluster: cluster(),
                new_size: *new_size,
            });
        }
        ScaleRequest::Resize { .. } => None,
    };
    check_state(snapshot, request, alert)?;
    behind.map_or(Ok(()), Err)
}

/// Without Alert scaling a down worker's removal fails on its drain whatever the cluster's
/// state (Running before the status scanner ran, or Alert): refused before the state rules, so
/// the refusal names the VM and what the operator must do.
pub fn check_down_removal(
    snapshot: &ClusterSnapshot,
    vm_ids: &[String],
    alert: &AlertScaling,
) -> Result<(), Refusal> {
    let AlertScaling::Unsupported { cloudstack_error } = alert else {
        return Ok(());
    };
    let mut down: Vec<String> = Vec::new();
    for vm in vm_ids.iter().filter_map(|id| snapshot.vm(id)) {
        let label = format!("{} ({})", vm.name, vm.state);
        if vm.state.is_down() && !down.contains(&label) {
            down.push(label);
        }
    }
    if down.is_empty() {
        return Ok(());
    }
    Err(Refusal::DownWorkerNotRemovable {
        cluster: snapshot.name.clone(),
        vms: down,
        cloudstack_error: cloudstack_error.clone(),
    })
}

/// Step 2 of [`check_scale`]: the rules of the cluster's state.
fn check_state(
    snapshot: &ClusterSnapshot,
    request: &ScaleRequest,
    alert: &AlertScaling,
) -> Result<(), Refusal> {
    let cluster = || snapshot.name.clone();
    let no_change = || match request {
        ScaleRequest::Resize { new_size } if *new_size == snapshot.size => Err(Refusal::NoChange {
            cluster: cluster(),
            size: snapshot.size,
        }),
        _ => Ok(()),
    };
    match &snapshot.state {
        ClusterState::Created | ClusterState::Running => Ok(()),
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
/// every worker. Duplicate ids count once. `Ok(Some(_))`: the list leaves workers but reaches
/// the cluster's lagging `size`, a refusal that comes after the state rules.
fn check_node_list(
    snapshot: &ClusterSnapshot,
    vm_ids: &[String],
) -> Result<Option<Refusal>, Refusal> {
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
    // Removing every worker VM is refused (a cluster with no worker left is never wanted), and
    // so is removing `size` or more nodes (CloudStack's own limit). When `size` lags behind the
    // VMs that limit is not the group's doing: the request is refused for it only after the
    // state rules had their say.
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let workers = snapshot.workers().count();
    if named.len() >= workers.min(snapshot.size as usize) {
        if named.len() >= workers || workers <= snapshot.size as usize {
            return Err(Refusal::RemovesAllWorkers {
                cluster: snapshot.name.clone(),
                workers: count(workers.min(snapshot.size as usize)),
            });
        }
        return Ok(Some(Refusal::SizeBehindWorkers {
            cluster: snapshot.name.clone(),
            removed: count(named.len()),
            workers: count(workers),
            size: snapshot.size,
        }));
    }
    Ok(None)
}

/// The Alert rules of the CKS scaling rules that do not depend on the request, checked in the
/// order 4, 6, 5, 7. *Unverified*: the Alert-scaling PR is in no CloudStack source this
/// project could read, so neither its check order nor its refusal texts are known; when
/// several rules apply, CloudStack may name another one first. Refusals are matched by rule,
/// never by wording.
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

    // Rule 5. Every VM of the cluster counts, external ones included: CloudStack adds
    // external nodes to `size` (`KubernetesClusterAddWorker.updateKubernetesCluster`), so the
    // nodes are control + etcd + size. Destroyed/Expunging VMs are still listed (VM-map rows),
    // so they count too.
    let (vms, nodes) = snapshot.vm_count();
    let label = |v: &&Vm| format!("{} ({})", v.name, v.state);
    if vms != nodes {
        return Err(Refusal::VmCountMismatch {
            cluster: cluster(),
            vms,
            nodes,
            left_behind: snapshot.left_behind(&[]).iter().map(label).collect(),
        });
    }

    // Rule 7.
    if !snapshot.workers().any(|v| v.state.is_down()) {
        return Err(Refusal::AlertWithoutDownWorker {
            cluster: cluster(),
            not_running: snapshot.not_running().iter().map(label).collect(),
        });
    }
    Ok(())
}

/// Why the group cannot scale right now, if it cannot, judged without a request: the cluster
/// state rules of [`check_scale`] (Alert rules 4, 6, 5, 7; non-scalable states; Alert on a
/// CloudStack without Alert scaling). `None` when a size change would be accepted.
/// Used in the node group's debug string and NodeGroupNodes error messages.
pub fn blocked_reason(snapshot: &ClusterSnapshot, alert: &AlertScaling) -> Option<Refusal> {
    if snapshot.externally_managed {
        return Some(Refusal::ExternallyManaged {
            cluster: snapshot.name.clone(),
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fixtures::ClusterBuilder;

    fn resize(new_size: u32) -> ScaleRequest {
        ScaleRequest::Resize { new_size }
    }

    fn remove(ids: &[&str]) -> ScaleRequest {
        ScaleRequest::RemoveNodes {
            vm_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn outcome(
        snap: &ClusterSnapshot,
        request: &ScaleRequest,
        alert: &AlertScaling,
    ) -> &'static str {
        match check_scale(snap, request, alert) {
            Ok(()) => "ok",
            Err(refusal) => refusal.rule(),
        }
    }

    fn unsupported() -> AlertScaling {
        AlertScaling::Unsupported {
            cloudstack_error: "Kubernetes cluster k8s is in Alert state and can not be scaled"
                .to_string(),
        }
    }

    /// One control, one etcd, three workers (the third Stopped), one external node: every Alert
    /// rule is satisfied, so only the state and the request decide.
    fn base() -> ClusterBuilder {
        ClusterBuilder::new("k8s")
            .control(VmState::Running)
            .etcd(VmState::Running)
            .worker(VmState::Running)
            .worker(VmState::Running)
            .worker(VmState::Stopped)
            .external(VmState::Running)
    }

    /// The request columns of the state table.
    fn requests() -> Vec<(&'static str, ScaleRequest)> {
        vec![
            // size 4: three workers and the external node.
            ("resize up", resize(5)),
            ("resize down", resize(2)),
            ("resize same", resize(4)),
            ("resize to 0", resize(0)),
            ("remove worker", remove(&["worker-1"])),
            ("remove control", remove(&["control-1"])),
            ("remove etcd", remove(&["etcd-1"])),
            ("remove external", remove(&["external-1"])),
            ("remove unknown", remove(&["no-such-vm"])),
            ("remove nothing", remove(&[])),
            (
                "remove all workers",
                remove(&["worker-1", "worker-2", "worker-3"]),
            ),
        ]
    }

    const NW: &str = "not_workers";
    const SNS: &str = "state_not_scalable";
    const SCS: &str = "stopped_cluster_size";
    const AU: &str = "alert_unsupported";

    #[test]
    fn every_cluster_state_against_every_request_kind() {
        // Outside Alert a resize to the current size is accepted (CloudStack returns early).
        let running = [
            "ok",
            "ok",
            "ok",
            "size_below_one",
            "ok",
            NW,
            NW,
            NW,
            "unknown_vm",
            "no_change",
            "removes_all_workers",
        ];
        let scalable = [
            "ok",
            "ok",
            "no_change",
            "size_below_one",
            "ok",
            NW,
            NW,
            NW,
            "unknown_vm",
            "no_change",
            "removes_all_workers",
        ];
        let stopped = [
            SCS,
            SCS,
            SCS,
            "size_below_one",
            "ok",
            NW,
            NW,
            NW,
            "unknown_vm",
            "no_change",
            "removes_all_workers",
        ];
        let blocked = [
            SNS,
            SNS,
            SNS,
            "size_below_one",
            SNS,
            NW,
            NW,
            NW,
            "unknown_vm",
            "no_change",
            "removes_all_workers",
        ];
        let alert_unsupported = [
            AU,
            AU,
            AU,
            "size_below_one",
            AU,
            NW,
            NW,
            NW,
            "unknown_vm",
            "no_change",
            "removes_all_workers",
        ];
        let table: Vec<(ClusterState, AlertScaling, [&str; 11])> = vec![
            (ClusterState::Created, AlertScaling::Supported, running),
            (ClusterState::Running, AlertScaling::Supported, running),
            // Alert-scaling support only matters in Alert.
            (ClusterState::Running, unsupported(), running),
            (ClusterState::Stopped, AlertScaling::Supported, stopped),
            (ClusterState::Stopped, unsupported(), stopped),
            (ClusterState::Alert, AlertScaling::Supported, scalable),
            (ClusterState::Alert, AlertScaling::Unknown, scalable),
            (ClusterState::Alert, unsupported(), alert_unsupported),
            (ClusterState::Scaling, AlertScaling::Supported, blocked),
            (ClusterState::Starting, AlertScaling::Supported, blocked),
            (ClusterState::Stopping, AlertScaling::Supported, blocked),
            (ClusterState::Upgrading, AlertScaling::Supported, blocked),
            (ClusterState::Recovering, AlertScaling::Supported, blocked),
            (ClusterState::Destroying, AlertScaling::Supported, blocked),
            (ClusterState::Destroyed, AlertScaling::Supported, blocked),
            (ClusterState::Error, AlertScaling::Supported, blocked),
            (
                ClusterState::Other("ScalingStoppedCluster".into()),
                AlertScaling::Supported,
                blocked,
            ),
        ];
        for (state, alert, expected) in table {
            let snap = base().state(state.clone()).build();
            for ((label, request), want) in requests().iter().zip(expected) {
                assert_eq!(
                    outcome(&snap, request, &alert),
                    want,
                    "{state} / {alert:?} / {label}"
                );
            }
        }
    }

    #[test]
    fn a_state_refusal_names_the_state() {
        let snap = base().state(ClusterState::Scaling).build();
        let refusal = check_scale(&snap, &resize(4), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::StateNotScalable {
                cluster: "k8s".into(),
                state: "Scaling".into()
            }
        );
        let msg = refusal.to_string();
        assert!(msg.starts_with("cluster \"k8s\""), "{msg}");
        assert!(msg.contains("is in state Scaling"), "{msg}");
        assert!(msg.contains("wait for the operation in progress"), "{msg}");
        for (state, advice) in [
            ("Destroyed", "take its node group out"),
            ("Error", "recover or recreate"),
            ("Importing", "back to Running"),
        ] {
            let msg = Refusal::StateNotScalable {
                cluster: "k8s".into(),
                state: state.into(),
            }
            .to_string();
            assert!(msg.contains(advice), "{state}: {msg}");
        }

        let odd = base()
            .state(ClusterState::Other("Importing".into()))
            .build();
        let refusal = check_scale(&odd, &resize(4), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::StateNotScalable {
                cluster: "k8s".into(),
                state: "Importing".into()
            }
        );
    }

    #[test]
    fn a_stopped_cluster_refuses_size_changes_but_removes_named_workers() {
        let snap = base().state(ClusterState::Stopped).build();
        let refusal = check_scale(&snap, &resize(5), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::StoppedClusterSize {
                cluster: "k8s".into()
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("Stopped") && msg.contains("start the cluster"),
            "{msg}"
        );
        assert_eq!(
            check_scale(&snap, &remove(&["worker-2"]), &AlertScaling::Supported),
            Ok(())
        );
    }

    #[test]
    fn an_externally_managed_cluster_is_never_scaled() {
        let mut snap = base().build();
        snap.externally_managed = true;
        for request in [resize(5), remove(&["worker-1"])] {
            assert_eq!(
                check_scale(&snap, &request, &AlertScaling::Supported),
                Err(Refusal::ExternallyManaged {
                    cluster: "k8s".into()
                })
            );
        }
        let reason = blocked_reason(&snap, &AlertScaling::Supported).expect("blocked");
        assert!(
            reason.to_string().contains("externally managed"),
            "{reason}"
        );
    }

    // ---- Alert rules, each accepted and refused ----

    #[test]
    fn alert_rule_2_refuses_a_request_that_changes_nothing() {
        let snap = base().alert().build();
        let refusal = check_scale(&snap, &resize(4), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::NoChange {
                cluster: "k8s".into(),
                size: 4
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("size is already 4") && msg.contains("(CKS Alert rule 2)"),
            "{msg}"
        );
        assert_eq!(
            check_scale(&snap, &remove(&[]), &AlertScaling::Supported),
            Err(Refusal::NoChange {
                cluster: "k8s".into(),
                size: 4
            })
        );
        // Accepted: any real change.
        assert_eq!(
            check_scale(&snap, &resize(5), &AlertScaling::Supported),
            Ok(())
        );
        assert_eq!(
            check_scale(&snap, &resize(1), &AlertScaling::Supported),
            Ok(())
        );
    }

    #[test]
    fn alert_rule_3_refuses_non_worker_node_ids_and_lists_them_with_roles() {
        let snap = base().alert().build();
        let refusal = check_scale(
            &snap,
            &remove(&["worker-1", "etcd-1", "external-1", "control-1"]),
            &AlertScaling::Supported,
        )
        .unwrap_err();
        assert_eq!(
            refusal,
            Refusal::NotWorkers {
                cluster: "k8s".into(),
                vms: vec![
                    ("k8s-etcd-1-18c0b1".into(), NodeRole::Etcd),
                    ("ext-1".into(), NodeRole::External),
                    ("k8s-control-18c0a1".into(), NodeRole::Control),
                ],
            }
        );
        let msg = refusal.to_string();
        for part in [
            "k8s-etcd-1-18c0b1 (etcd)",
            "ext-1 (external)",
            "k8s-control-18c0a1 (control)",
            "(CKS Alert rule 3)",
        ] {
            assert!(msg.contains(part), "{part} in {msg}");
        }
        assert!(
            !msg.contains("k8s-node-18c0c1"),
            "the worker is not a culprit: {msg}"
        );
        // Accepted: a running worker and the down worker.
        assert_eq!(
            check_scale(&snap, &remove(&["worker-1"]), &AlertScaling::Supported),
            Ok(())
        );
        assert_eq!(
            check_scale(&snap, &remove(&["worker-3"]), &AlertScaling::Supported),
            Ok(())
        );
        assert_eq!(
            check_scale(
                &snap,
                &remove(&["worker-3", "worker-1"]),
                &AlertScaling::Supported
            ),
            Ok(())
        );
    }

    /// Three control nodes (HA), one etcd node, three workers of which the last is Stopped.
    fn ha(control_states: [VmState; 3], etcd: VmState) -> ClusterBuilder {
        let [a, b, c] = control_states;
        ClusterBuilder::new("k8s")
            .control(a)
            .control(b)
            .control(c)
            .etcd(etcd)
            .worker(VmState::Running)
            .worker(VmState::Running)
            .worker(VmState::Stopped)
            .alert()
    }

    const UP: VmState = VmState::Running;

    #[test]
    fn alert_rule_4_refuses_while_the_first_control_vm_is_not_running() {
        for state in [
            VmState::Stopped,
            VmState::Migrating,
            VmState::Starting,
            VmState::Unknown,
        ] {
            let snap = ha([state.clone(), UP, UP], UP).build();
            let refusal = check_scale(&snap, &resize(4), &AlertScaling::Supported).unwrap_err();
            assert_eq!(
                refusal,
                Refusal::FirstControlNotRunning {
                    cluster: "k8s".into(),
                    vm: "k8s-control-18c0a1".into(),
                    state: state.to_string(),
                }
            );
            let msg = refusal.to_string();
            assert!(
                msg.contains(&format!("first control VM k8s-control-18c0a1 is {state}")),
                "{msg}"
            );
            assert!(
                msg.contains("start the VM") && msg.contains("(CKS Alert rule 4)"),
                "{msg}"
            );
        }
        // Accepted: the first control VM runs, the others are not down (host disconnected,
        // migrating).
        let snap = ha([UP, VmState::Unknown, VmState::Migrating], UP).build();
        assert_eq!(
            check_scale(&snap, &resize(4), &AlertScaling::Supported),
            Ok(())
        );
    }

    #[test]
    fn alert_rule_4_refuses_a_cluster_without_any_control_vm() {
        let snap = ClusterBuilder::new("k8s")
            .worker(VmState::Running)
            .worker(VmState::Stopped)
            .alert()
            .build();
        let refusal = check_scale(&snap, &resize(3), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::FirstControlNotRunning {
                cluster: "k8s".into(),
                vm: String::new(),
                state: "missing".into()
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("lists no control VM") && msg.contains("(CKS Alert rule 4)"),
            "{msg}"
        );
    }

    #[test]
    fn alert_rule_6_refuses_while_a_control_or_etcd_vm_is_down() {
        let snap = ha([UP, VmState::Stopped, UP], VmState::Error).build();
        let refusal =
            check_scale(&snap, &remove(&["worker-3"]), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::ControlPlaneDown {
                cluster: "k8s".into(),
                vms: vec![
                    (
                        "k8s-control-18c0a2".into(),
                        NodeRole::Control,
                        "Stopped".into()
                    ),
                    ("k8s-etcd-1-18c0b1".into(), NodeRole::Etcd, "Error".into()),
                ],
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("control VM k8s-control-18c0a2 is Stopped"),
            "{msg}"
        );
        assert!(msg.contains("etcd VM k8s-etcd-1-18c0b1 is Error"), "{msg}");
        assert!(
            msg.contains("(start the VMs)") && msg.contains("(CKS Alert rule 6)"),
            "{msg}"
        );

        for down in [VmState::Shutdown, VmState::Destroyed, VmState::Expunging] {
            let snap = ha([UP, UP, UP], down.clone()).build();
            assert_eq!(
                outcome(&snap, &resize(4), &AlertScaling::Supported),
                "alert_rule_6_control_plane_down",
                "etcd {down}"
            );
        }
        // Accepted: control and etcd VMs not down (an etcd VM on a disconnected host may still
        // run).
        let snap = ha([UP, UP, VmState::Migrating], VmState::Unknown).build();
        assert_eq!(
            check_scale(&snap, &resize(2), &AlertScaling::Supported),
            Ok(())
        );
    }

    #[test]
    fn the_brief_control_plane_message_reads_as_expected() {
        let refusal = Refusal::ControlPlaneDown {
            cluster: "k8s".into(),
            vms: vec![(
                "k8s-control-1a2b".into(),
                NodeRole::Control,
                "Stopped".into(),
            )],
        };
        assert_eq!(
            refusal.to_string(),
            "cluster \"k8s\": control VM k8s-control-1a2b is Stopped; CloudStack refuses scaling \
             until the control plane is recovered (start the VM) (CKS Alert rule 6)"
        );
    }

    #[test]
    fn alert_rule_5_refuses_while_vms_and_nodes_differ() {
        // A VM left behind by a failed scale-up.
        let snap = base().stray_worker(VmState::Running).alert().build();
        let refusal =
            check_scale(&snap, &remove(&["worker-3"]), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::VmCountMismatch {
                cluster: "k8s".into(),
                vms: 7,
                nodes: 6,
                left_behind: vec!["k8s-node-18c0c4 (Running)".into()],
            }
        );
        let msg = refusal.to_string();
        for part in [
            "lists 7 VMs",
            "has 6 nodes",
            "left k8s-node-18c0c4 (Running) behind",
            "administrator must remove the VMs left behind",
            "(CKS Alert rule 5)",
        ] {
            assert!(msg.contains(part), "{part} in {msg}");
        }
        // Fewer VMs than nodes.
        let snap = base().size(5).alert().build();
        let refusal = check_scale(&snap, &resize(6), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::VmCountMismatch {
                cluster: "k8s".into(),
                vms: 6,
                nodes: 7,
                left_behind: vec![],
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("a removal that failed part way")
                && msg.contains("correct the cluster's size"),
            "{msg}"
        );
        // A Destroyed VM is still listed, so it still counts.
        let snap = base().stray_worker(VmState::Destroyed).alert().build();
        assert_eq!(
            outcome(&snap, &resize(4), &AlertScaling::Supported),
            "alert_rule_5_vm_count_mismatch"
        );
        // Accepted: external nodes count both as VMs and in `size` (base has one), down or not.
        let snap = base().external(VmState::Stopped).alert().build();
        assert_eq!(
            check_scale(&snap, &resize(6), &AlertScaling::Supported),
            Ok(())
        );
    }

    /// A scale-up CloudStack failed part way left two VMs (one Running, one Error) on a
    /// cluster whose size stayed 1. Deleting them (the failed creations the autoscaler
    /// deletes) is refused for the VM count, naming them, never as "removes all workers …
    /// check the node group's minimum size".
    #[test]
    fn removing_what_a_failed_scale_up_left_names_the_stranding_not_the_minimum() {
        let b = || {
            ClusterBuilder::healthy("k8s", 1, 1)
                .stray_worker(UP)
                .stray_worker(VmState::Error)
        };
        let alert = b().alert().build();
        let supported = AlertScaling::Supported;
        for ids in [&["worker-2", "worker-3"][..], &["worker-3"], &["worker-2"]] {
            let refusal = check_scale(&alert, &remove(ids), &supported).unwrap_err();
            assert_eq!(refusal.rule(), "alert_rule_5_vm_count_mismatch", "{ids:?}");
            let msg = refusal.to_string();
            assert!(
                msg.contains("left k8s-node-18c0c3 (Error), k8s-node-18c0c2 (Running) behind"),
                "{msg}"
            );
            assert!(!msg.contains("minimum size"), "{msg}");
        }
        // Every worker: refused as such.
        assert_eq!(
            outcome(
                &alert,
                &remove(&["worker-1", "worker-2", "worker-3"]),
                &supported
            ),
            "removes_all_workers"
        );
        // On a CloudStack without Alert scaling the down worker's drain is the reason: its
        // removal can never succeed there, whatever the state.
        assert_eq!(
            outcome(&alert, &remove(&["worker-3"]), &unsupported()),
            "down_worker_not_removable"
        );
        // Outside Alert the size that lags behind the VMs is named.
        let running = b().build();
        let refusal = check_scale(&running, &remove(&["worker-3"]), &supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::SizeBehindWorkers {
                cluster: "k8s".into(),
                removed: 1,
                workers: 3,
                size: 1
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("removes 1 of the 3 worker VMs") && !msg.contains("minimum size"),
            "{msg}"
        );
        // A state that scales nothing comes first.
        assert_eq!(
            outcome(
                &b().state(ClusterState::Scaling).build(),
                &remove(&["worker-3"]),
                &supported
            ),
            "state_not_scalable"
        );
    }

    #[test]
    fn alert_rule_7_refuses_when_no_worker_vm_is_down() {
        let all_up = ClusterBuilder::healthy("k8s", 1, 2).alert().build();
        let refusal = check_scale(&all_up, &resize(3), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::AlertWithoutDownWorker {
                cluster: "k8s".into(),
                not_running: vec![],
            }
        );
        let msg = refusal.to_string();
        for part in [
            "no worker VM is down (every VM runs, so a node is NotReady or cordoned)",
            "failed start or upgrade",
            "disconnected",
            "uncordon",
            "(CKS Alert rule 7)",
        ] {
            assert!(msg.contains(part), "{part} in {msg}");
        }
        // Workers that are not down in CKS's sense, and a down external node, do not count.
        let not_down = ClusterBuilder::new("k8s")
            .control(UP)
            .worker(VmState::Migrating)
            .worker(VmState::Unknown)
            .worker(VmState::Stopping)
            .external(VmState::Stopped)
            .alert()
            .build();
        assert_eq!(
            outcome(&not_down, &resize(2), &AlertScaling::Supported),
            "alert_rule_7_no_down_worker"
        );
        let msg = check_scale(&not_down, &resize(2), &AlertScaling::Supported)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "not Running: k8s-node-18c0c1 (Migrating), k8s-node-18c0c2 (Unknown), \
                 k8s-node-18c0c3 (Stopping), ext-1 (Stopped)"
            ),
            "{msg}"
        );
        // Accepted: any down worker state.
        for down in [
            VmState::Stopped,
            VmState::Shutdown,
            VmState::Error,
            VmState::Destroyed,
            VmState::Expunging,
        ] {
            let snap = ClusterBuilder::new("k8s")
                .control(UP)
                .worker(UP)
                .worker(down.clone())
                .alert()
                .build();
            assert_eq!(
                check_scale(&snap, &resize(3), &AlertScaling::Supported),
                Ok(()),
                "{down}"
            );
            assert_eq!(
                check_scale(&snap, &remove(&["worker-2"]), &AlertScaling::Supported),
                Ok(()),
                "{down}"
            );
        }
    }

    #[test]
    fn alert_on_a_cloudstack_without_alert_scaling_passes_its_text_through() {
        let snap = base().alert().build();
        // Removing the down worker itself is refused as what it is (its drain fails there).
        assert!(matches!(
            check_scale(&snap, &remove(&["worker-3"]), &unsupported()),
            Err(Refusal::DownWorkerNotRemovable { .. })
        ));
        let refusal = check_scale(&snap, &resize(4), &unsupported()).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::AlertUnsupported {
                cluster: "k8s".into(),
                cloudstack_error: "Kubernetes cluster k8s is in Alert state and can not be scaled"
                    .into()
            }
        );
        let msg = refusal.to_string();
        for part in [
            "\"Kubernetes cluster k8s is in Alert state and can not be scaled\"",
            "does not scale clusters in Alert",
            "predates",
            "start the down VM",
            "upgrade",
        ] {
            assert!(msg.contains(part), "{part} in {msg}");
        }
    }

    #[test]
    fn unknown_alert_support_applies_the_alert_rules() {
        let good = base().alert().build();
        assert_eq!(
            check_scale(&good, &resize(5), &AlertScaling::Unknown),
            Ok(())
        );
        let all_up = ClusterBuilder::healthy("k8s", 1, 2).alert().build();
        assert_eq!(
            outcome(&all_up, &resize(4), &AlertScaling::Unknown),
            "alert_rule_7_no_down_worker"
        );
    }

    // ---- request checks ----

    #[test]
    fn size_below_one_names_the_size() {
        let snap = base().build();
        let refusal = check_scale(&snap, &resize(0), &AlertScaling::Supported).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::SizeBelowOne {
                cluster: "k8s".into(),
                new_size: 0
            }
        );
        assert!(
            refusal.to_string().contains("size 0 is below 1"),
            "{refusal}"
        );
    }

    #[test]
    fn removing_every_worker_is_refused_down_ones_included() {
        let snap = base().build();
        let refusal = check_scale(
            &snap,
            &remove(&["worker-3", "worker-2", "worker-1"]),
            &AlertScaling::Supported,
        )
        .unwrap_err();
        assert_eq!(
            refusal,
            Refusal::RemovesAllWorkers {
                cluster: "k8s".into(),
                workers: 3
            }
        );
        let msg = refusal.to_string();
        assert!(
            msg.contains("removes all 3 worker(s)") && msg.contains("Can not remove all nodes"),
            "{msg}"
        );
        // Duplicates count once: two distinct workers of three is fine.
        assert_eq!(
            check_scale(
                &snap,
                &remove(&["worker-1", "worker-1", "worker-2"]),
                &AlertScaling::Supported
            ),
            Ok(())
        );
    }

    #[test]
    fn removing_as_many_nodes_as_the_recorded_size_is_refused_like_cloudstack_does() {
        // size lags behind the worker VMs (a stray VM): CloudStack compares with size, and
        // the refusal says that the size, not the group, is the limit.
        let snap = ClusterBuilder::healthy("k8s", 1, 2)
            .stray_worker(UP)
            .build();
        assert_eq!(
            check_scale(
                &snap,
                &remove(&["worker-1", "worker-2"]),
                &AlertScaling::Supported
            ),
            Err(Refusal::SizeBehindWorkers {
                cluster: "k8s".into(),
                removed: 2,
                workers: 3,
                size: 2
            })
        );
        assert_eq!(
            check_scale(&snap, &remove(&["worker-3"]), &AlertScaling::Supported),
            Ok(())
        );
    }

    #[test]
    fn an_unknown_vm_is_named() {
        let snap = base().build();
        let refusal = check_scale(
            &snap,
            &remove(&["worker-1", "ghost"]),
            &AlertScaling::Supported,
        )
        .unwrap_err();
        assert_eq!(
            refusal,
            Refusal::UnknownVm {
                cluster: "k8s".into(),
                vm_id: "ghost".into()
            }
        );
        assert!(
            refusal
                .to_string()
                .contains("VM ghost is not a VM of this cluster"),
            "{refusal}"
        );
    }

    // ---- rule order ----

    #[test]
    fn request_checks_come_before_the_state() {
        let snap = base().state(ClusterState::Scaling).build();
        assert_eq!(
            outcome(
                &snap,
                &remove(&["control-1", "ghost"]),
                &AlertScaling::Supported
            ),
            "unknown_vm"
        );
        assert_eq!(
            outcome(&snap, &remove(&["control-1"]), &AlertScaling::Supported),
            "not_workers"
        );
        assert_eq!(
            outcome(&snap, &resize(0), &AlertScaling::Supported),
            "size_below_one"
        );
        let alert = base().alert().build();
        assert_eq!(
            outcome(&alert, &remove(&["etcd-1"]), &unsupported()),
            "not_workers"
        );
        assert_eq!(
            outcome(&alert, &resize(0), &unsupported()),
            "size_below_one"
        );
    }

    #[test]
    fn alert_rules_apply_in_the_order_4_6_5_7_2() {
        let alert = AlertScaling::Supported;
        // Everything wrong: first control Stopped, etcd Stopped, a stray VM, no worker down,
        // and a no-op size.
        let b = || {
            ClusterBuilder::new("k8s")
                .control(VmState::Stopped)
                .control(UP)
                .etcd(VmState::Stopped)
                .worker(UP)
                .stray_worker(UP)
                .size(1)
                .alert()
        };
        let all = b().build();
        assert_eq!(
            outcome(&all, &resize(1), &unsupported()),
            "alert_unsupported"
        );
        assert_eq!(
            outcome(&all, &resize(1), &alert),
            "alert_rule_4_first_control_not_running"
        );
        assert_eq!(
            check_scale(&all, &resize(1), &alert),
            Err(Refusal::FirstControlNotRunning {
                cluster: "k8s".into(),
                vm: "k8s-control-18c0a1".into(),
                state: "Stopped".into()
            })
        );

        // Rule 4 fixed: 6 next (the etcd VM only; the first control VM runs).
        let without_4 = ClusterBuilder::new("k8s")
            .control(UP)
            .control(UP)
            .etcd(VmState::Stopped)
            .worker(UP)
            .stray_worker(UP)
            .size(1)
            .alert()
            .build();
        assert_eq!(
            check_scale(&without_4, &resize(1), &alert),
            Err(Refusal::ControlPlaneDown {
                cluster: "k8s".into(),
                vms: vec![("k8s-etcd-1-18c0b1".into(), NodeRole::Etcd, "Stopped".into())]
            })
        );

        // Rule 6 fixed: 5 next.
        let without_6 = ClusterBuilder::new("k8s")
            .control(UP)
            .control(UP)
            .etcd(UP)
            .worker(UP)
            .stray_worker(UP)
            .size(1)
            .alert()
            .build();
        assert_eq!(
            outcome(&without_6, &resize(1), &alert),
            "alert_rule_5_vm_count_mismatch"
        );

        // Rule 5 fixed: 7 next.
        let without_5 = ClusterBuilder::new("k8s")
            .control(UP)
            .control(UP)
            .etcd(UP)
            .worker(UP)
            .alert()
            .build();
        assert_eq!(
            outcome(&without_5, &resize(1), &alert),
            "alert_rule_7_no_down_worker"
        );

        // Rule 7 fixed: 2 last.
        let without_7 = ClusterBuilder::new("k8s")
            .control(UP)
            .control(UP)
            .etcd(UP)
            .worker(VmState::Stopped)
            .alert()
            .build();
        assert_eq!(outcome(&without_7, &resize(1), &alert), "no_change");
        assert_eq!(outcome(&without_7, &resize(2), &alert), "ok");
    }

    // ---- blocked_reason ----

    #[test]
    fn blocked_reason_judges_the_cluster_without_a_request() {
        let alert = AlertScaling::Supported;
        assert_eq!(
            blocked_reason(&base().state(ClusterState::Created).build(), &alert),
            None
        );
        assert_eq!(blocked_reason(&base().build(), &alert), None);
        assert_eq!(blocked_reason(&base().alert().build(), &alert), None);
        assert_eq!(
            blocked_reason(&base().alert().build(), &AlertScaling::Unknown),
            None
        );
        // Running with no worker down is fine: rule 7 is an Alert rule.
        assert_eq!(
            blocked_reason(&ClusterBuilder::healthy("k8s", 1, 1).build(), &alert),
            None
        );
        assert_eq!(
            blocked_reason(&base().state(ClusterState::Stopped).build(), &alert),
            Some(Refusal::StoppedClusterSize {
                cluster: "k8s".into()
            })
        );
        assert_eq!(
            blocked_reason(&base().state(ClusterState::Upgrading).build(), &alert),
            Some(Refusal::StateNotScalable {
                cluster: "k8s".into(),
                state: "Upgrading".into()
            })
        );
        assert_eq!(
            blocked_reason(&base().alert().build(), &unsupported()).map(|r| r.rule()),
            Some("alert_unsupported")
        );
        let cases = [
            (
                ha([VmState::Stopped, UP, UP], UP),
                "alert_rule_4_first_control_not_running",
            ),
            (
                ha([UP, UP, VmState::Error], UP),
                "alert_rule_6_control_plane_down",
            ),
            (
                base().stray_worker(UP).alert(),
                "alert_rule_5_vm_count_mismatch",
            ),
            (
                ClusterBuilder::healthy("k8s", 1, 1).alert(),
                "alert_rule_7_no_down_worker",
            ),
        ];
        for (builder, rule) in cases {
            assert_eq!(
                blocked_reason(&builder.build(), &alert).map(|r| r.rule()),
                Some(rule)
            );
        }
    }

    // ---- messages ----

    fn every_refusal() -> Vec<Refusal> {
        let c = || "k8s".to_string();
        vec![
            Refusal::StateNotScalable {
                cluster: c(),
                state: "Scaling".into(),
            },
            Refusal::StoppedClusterSize { cluster: c() },
            Refusal::AlertUnsupported {
                cluster: c(),
                cloudstack_error: "no".into(),
            },
            Refusal::NoChange {
                cluster: c(),
                size: 2,
            },
            Refusal::SizeBelowOne {
                cluster: c(),
                new_size: 0,
            },
            Refusal::RemovesAllWorkers {
                cluster: c(),
                workers: 2,
            },
            Refusal::NotWorkers {
                cluster: c(),
                vms: vec![("k8s-control-1".into(), NodeRole::Control)],
            },
            Refusal::UnknownVm {
                cluster: c(),
                vm_id: "x".into(),
            },
            Refusal::FirstControlNotRunning {
                cluster: c(),
                vm: "k8s-control-1".into(),
                state: "Stopped".into(),
            },
            Refusal::ControlPlaneDown {
                cluster: c(),
                vms: vec![("k8s-control-1".into(), NodeRole::Control, "Stopped".into())],
            },
            Refusal::VmCountMismatch {
                cluster: c(),
                vms: 4,
                nodes: 3,
                left_behind: vec!["k8s-node-1 (Error)".into()],
            },
            Refusal::VmCountMismatch {
                cluster: c(),
                vms: 2,
                nodes: 3,
                left_behind: vec![],
            },
            Refusal::AlertWithoutDownWorker {
                cluster: c(),
                not_running: vec![],
            },
            Refusal::SizeBehindWorkers {
                cluster: c(),
                removed: 2,
                workers: 3,
                size: 1,
            },
        ]
    }

    #[test]
    fn every_refusal_names_the_cluster_and_has_a_distinct_rule_name() {
        let refusals = every_refusal();
        let mut rules: Vec<&str> = refusals.iter().map(Refusal::rule).collect();
        for r in &refusals {
            let msg = r.to_string();
            assert!(msg.starts_with("cluster \"k8s\""), "{msg}");
            assert!(
                !msg.contains('\n') && !msg.contains("  "),
                "one sentence: {msg:?}"
            );
            let rule = r.rule();
            assert!(
                rule.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{rule}"
            );
        }
        rules.sort_unstable();
        rules.dedup();
        // Rule 5 twice: more VMs than nodes, and fewer.
        assert_eq!(rules.len(), refusals.len() - 1);
    }

    // ---- properties over many small clusters ----

    /// Every cluster with 1–2 control VMs, 0–1 etcd VMs, 0–3 workers and 0–1 external VMs,
    /// each VM in one of a few states, `size` right or one off, in several cluster states.
    fn small_clusters() -> Vec<ClusterSnapshot> {
        let plane = [VmState::Running, VmState::Stopped];
        let worker = [VmState::Running, VmState::Stopped, VmState::Unknown];
        let states = [
            ClusterState::Created,
            ClusterState::Running,
            ClusterState::Stopped,
            ClusterState::Alert,
            ClusterState::Scaling,
        ];
        let mut out = Vec::new();
        for controls in 1..=2u32 {
            for etcd in 0..=1u32 {
                for workers in 0..=3u32 {
                    for external in 0..=1u32 {
                        let plane_vms = controls + etcd + external;
                        let combos = 2u32.pow(plane_vms) * 3u32.pow(workers);
                        for mut combo in 0..combos {
                            let mut b = ClusterBuilder::new("k8s");
                            let mut pick_plane = || {
                                let s = plane[(combo % 2) as usize].clone();
                                combo /= 2;
                                s
                            };
                            let (cs, es, xs): (Vec<_>, Vec<_>, Vec<_>) = (
                                (0..controls).map(|_| pick_plane()).collect(),
                                (0..etcd).map(|_| pick_plane()).collect(),
                                (0..external).map(|_| pick_plane()).collect(),
                            );
                            for s in cs {
                                b = b.control(s);
                            }
                            for s in es {
                                b = b.etcd(s);
                            }
                            for _ in 0..workers {
                                b = b.worker(worker[(combo % 3) as usize].clone());
                                combo /= 3;
                            }
                            for s in xs {
                                b = b.external(s);
                            }
                            let input = b.input();
                            for size in [workers, workers + 1] {
                                for state in &states {
                                    let mut i = input.clone();
                                    i.size = size;
                                    i.state = state.clone();
                                    out.push(ClusterSnapshot::classify(i));
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn properties_hold_for_every_small_cluster() {
        let clusters = small_clusters();
        assert!(clusters.len() > 10_000, "{}", clusters.len());
        let alerts = [AlertScaling::Supported, unsupported()];
        let mut accepted = 0usize;
        for snap in &clusters {
            let ids: Vec<&str> = snap.vms.iter().map(|v| v.id.as_str()).collect();
            let mut reqs: Vec<ScaleRequest> = (0..=snap.size + 1).map(resize).collect();
            reqs.push(remove(&[]));
            for (i, a) in ids.iter().enumerate() {
                reqs.push(remove(&[a]));
                for b in &ids[i + 1..] {
                    reqs.push(remove(&[a, b]));
                }
            }
            let workers: Vec<&str> = snap.workers().map(|v| v.id.as_str()).collect();
            reqs.push(remove(&workers));
            let worker_count = workers.len();
            let down = |roles: &[NodeRole]| {
                snap.vms
                    .iter()
                    .any(|v| roles.contains(&v.role) && v.state.is_down())
            };

            for alert in &alerts {
                for req in &reqs {
                    let result = check_scale(snap, req, alert);
                    let ctx = || format!("{snap:?} {req:?} {alert:?} -> {result:?}");
                    if result.is_err() {
                        continue;
                    }
                    accepted += 1;
                    assert!(
                        matches!(
                            snap.state,
                            ClusterState::Created
                                | ClusterState::Running
                                | ClusterState::Stopped
                                | ClusterState::Alert
                        ),
                        "{}",
                        ctx()
                    );
                    match req {
                        ScaleRequest::Resize { new_size } => {
                            assert!(*new_size >= 1, "{}", ctx());
                            if snap.state == ClusterState::Alert {
                                assert_ne!(*new_size, snap.size, "{}", ctx());
                            }
                            assert_ne!(snap.state, ClusterState::Stopped, "{}", ctx());
                        }
                        ScaleRequest::RemoveNodes { vm_ids } => {
                            assert!(!vm_ids.is_empty(), "{}", ctx());
                            assert!(
                                vm_ids.iter().all(|id| snap
                                    .vm(id)
                                    .is_some_and(|v| v.role == NodeRole::Worker)),
                                "{}",
                                ctx()
                            );
                            assert!(vm_ids.len() < worker_count, "{}", ctx());
                            assert!(vm_ids.len() < snap.size as usize, "{}", ctx());
                        }
                    }
                    if snap.state == ClusterState::Alert {
                        assert!(
                            !matches!(alert, AlertScaling::Unsupported { .. }),
                            "{}",
                            ctx()
                        );
                        assert!(down(&[NodeRole::Worker]), "{}", ctx());
                        assert!(!down(&[NodeRole::Control, NodeRole::Etcd]), "{}", ctx());
                        let first = snap.vms.iter().find(|v| v.role == NodeRole::Control);
                        assert!(
                            first.is_some_and(|v| v.state == VmState::Running),
                            "{}",
                            ctx()
                        );
                    }
                }
                // blocked_reason is exactly the refusal a size increase gets.
                let grow = check_scale(snap, &resize(snap.size + 1), alert);
                assert_eq!(
                    blocked_reason(snap, alert),
                    grow.err(),
                    "{snap:?} {alert:?}"
                );
            }
        }
        assert!(
            accepted > 10_000,
            "the generator must exercise acceptances too: {accepted}"
        );
    }
}
