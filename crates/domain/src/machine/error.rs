//! Why the machine refuses a request ([`ScaleError`]: the provider adds the group's name, the
//! gRPC layer picks the status code), and how CloudStack's failure texts are read: a refusal
//! because the cluster is in Alert, a removal that failed at a drain.

use crate::rules::Refusal;
use crate::status::{ErrorClass, InstanceError};
use std::fmt;

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
    /// IncreaseSize within the maximum by the target, but CloudStack's size is higher (it
    /// still counts VMs being removed, or another client scaled the cluster): the request it
    /// would take, size + delta, passes the maximum. Never sent.
    SizeAboveMax {
        size: u32,
        delta: u32,
        max: u32,
    },
    /// A scale-up while nodes a failed drain may have left cordoned keep the cluster in
    /// Alert: CloudStack's scale-up would wait for them, time out and leave its VMs.
    CordonSuspected {
        vms: Vec<String>,
    },
    /// One of CloudStack's scaling rules (Alert included) refuses it.
    Refused(Refusal),
    /// The answer to the previous request was lost; nothing is sent until it is settled.
    PreviousAnswerLost,
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
    /// A fake "unregistered" node for a VM whose node an autoscaler reported as registered
    /// `ago_secs` before, within the autoscaler's max-node-provision-time (`window_secs`).
    /// (Whole seconds keep the error small.)
    RecentlyRegistered {
        vm: String,
        instance: String,
        node: String,
        ago_secs: u64,
        window_secs: u64,
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
    /// A Running VM whose node never registered (a fake node): CloudStack drains every
    /// Running VM it removes, and that drain fails, leaving the cluster in Alert. The
    /// provider cannot stop the VM first (`why`).
    DrainWouldFail {
        vm: String,
        vm_id: String,
        node: String,
        why: &'static str,
    },
    /// DecreaseTargetSize asked for more than the requests that do not exist yet and the
    /// failed creations it may write off.
    CannotDecrease {
        asked: u32,
        cancellable: u32,
        target: u32,
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
            ScaleError::SizeAboveMax { size, delta, max } => write!(
                f,
                "CloudStack's size is {size} (it still counts VMs being removed, or another client scaled the cluster): a request for {} would exceed the maximum {max}; try again once the removals are done",
                u64::from(*size) + u64::from(*delta)
            ),
            ScaleError::CordonSuspected { vms } => write!(
                f,
                "CloudStack's drain of {} failed or was not seen to end: its node may be cordoned, and a scale-up waits for every node to be Ready, so it would time out and leave its VMs; the removal the provider owes ends this, or remove or stop the VM; an uncordoned node lifts it once the provider reads it Ready and schedulable (--confirm-node-marks), or once CloudStack's status scanner moves the cluster from Alert to Running (a cluster listed Running stays so: remove or stop the VM)",
                vms.join(", ")
            ),
            ScaleError::Refused(r) => write!(f, "{r}"),
            ScaleError::PreviousAnswerLost => write!(
                f,
                "CloudStack's answer to the previous scale request was lost; nothing more is sent \
                 until the next refresh shows whether it was accepted"
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
            ScaleError::RecentlyRegistered {
                vm,
                instance,
                node,
                ago_secs,
                window_secs,
            } => write!(
                f,
                "refusing to delete VM {vm} (instance {instance}) as unregistered: its node {node} \
                 was reported registered {ago_secs}s ago, within max-node-provision-time \
                 ({window_secs}s): the node is another autoscaler's, or left the cluster less \
                 than that long ago; nothing was deleted"
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
            ScaleError::DrainWouldFail {
                vm,
                vm_id,
                node,
                why,
            } => write!(
                f,
                "refusing to remove VM {vm} (node {node}): it is Running but its node never \
                 registered, and CloudStack drains every Running VM it removes; that drain fails \
                 and leaves the cluster in Alert. {why}. Stop the VM (stopVirtualMachine \
                 id={vm_id}); the provider then removes it as a down VM, without a drain; \
                 nothing was deleted"
            ),
            ScaleError::CannotDecrease {
                asked,
                cancellable,
                target,
            } => write!(
                f,
                "cannot decrease the target size {target} by {asked}: only {cancellable} \
                 requested node(s) can be cancelled (not created yet) or written off (VMs a \
                 failed scale-up left); the others are VMs (nodes, or being created), which \
                 DecreaseTargetSize never deletes; nothing was changed"
            ),
        }
    }
}

impl std::error::Error for ScaleError {}

/// What a refusal asks of its caller: the status code the caller hears follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Ask again later: nothing is known yet (no snapshot).
    Later,
    /// Ask for less: past the group's maximum.
    Less,
    /// Name something that exists: the node is no worker of the group.
    Existing,
    /// An operator must change something first: the request cannot be carried out as things
    /// are (a rule of CloudStack's, the minimum, a node that is not a worker, ...).
    Operator,
}

impl ScaleError {
    /// What this refusal asks of its caller.
    pub fn ask(&self) -> Ask {
        match self {
            ScaleError::NoSnapshot => Ask::Later,
            ScaleError::OutOfRange { .. } => Ask::Less,
            ScaleError::UnknownNode { .. } => Ask::Existing,
            ScaleError::Refused(_)
            | ScaleError::SizeAboveMax { .. }
            | ScaleError::CordonSuspected { .. }
            | ScaleError::PreviousAnswerLost
            | ScaleError::NotWorker { .. }
            | ScaleError::RegisteredElsewhere { .. }
            | ScaleError::RecentlyRegistered { .. }
            | ScaleError::BeingCreated { .. }
            | ScaleError::BelowMin { .. }
            | ScaleError::DrainWouldFail { .. }
            | ScaleError::CannotDecrease { .. } => Ask::Operator,
        }
    }
}

/// CloudStack's refusal of a request because the cluster is in Alert (a CloudStack without
/// the Alert-scaling change, cloudstack-api.md §4 rule 7).
pub(crate) fn is_alert_refusal(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("in alert state and can not be scaled")
}

/// CloudStack's failure of a removal at a node it could not drain or delete
/// (`KubernetesClusterScaleWorker.removeNodesFromCluster`: "failed to remove Kubernetes node"),
/// as opposed to a refusal while it validated the request.
pub(crate) fn is_drain_failure(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("failed to remove kubernetes node")
}

/// A drain failure naming a down VM (`"state":"Stopped"` in the VM CloudStack prints, as in
/// `recorded/running_35_scale_down_nodeids_query_final`): only a CloudStack without the
/// Alert-scaling change drains a down node, so this teaches the same verdict as an Alert
/// refusal.
pub(crate) fn is_down_vm_drain_failure(text: &str) -> bool {
    if !is_drain_failure(text) {
        return false;
    }
    let Some(vm) = text.split("running on VM").nth(1) else {
        return false;
    };
    let Some(rest) = vm.split("\"state\":\"").nth(1) else {
        return false;
    };
    let state = rest.split('"').next().unwrap_or_default();
    crate::cluster::VmState::parse(state).is_down()
}

/// The error of queued requests CloudStack (or a rule) refused when their turn came.
pub(crate) fn refused_error(text: String) -> InstanceError {
    InstanceError {
        code: "scale-up-refused".into(),
        message: text,
        class: ErrorClass::Other,
    }
}
