//! How a worker VM, and what the provider is doing with it, maps onto the autoscaler's
//! instance status (`NodeGroupNodes`).

use super::cluster::{Vm, VmState};

/// `InstanceStatus.InstanceState` of the externalgrpc protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceState {
    Running,
    Creating,
    Deleting,
}

/// `InstanceErrorInfo.instanceErrorClass` values the autoscaler core knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    OutOfResources = 1,
    Other = 99,
}

/// An instance error as the autoscaler sees it. `code` is low-cardinality (it becomes a metric
/// label on the autoscaler's side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceError {
    pub code: String,
    pub message: String,
    pub class: ErrorClass,
}

/// What the provider knows it is doing with a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmActivity {
    /// Nothing in flight for this VM.
    Idle,
    /// Created by a scale-up job this provider is following.
    BeingCreated,
    /// Named in a removal (or expected to go in a size decrease) this provider is following.
    BeingRemoved,
    /// Left behind by a scale-up job that failed; `error` comes from [`scale_up_failure`].
    CreateFailed(InstanceError),
}

/// The status of a worker VM:
/// - CreateFailed → Creating with the error (the autoscaler deletes it and backs off);
/// - BeingRemoved, or Destroyed/Expunging → Deleting, no error;
/// - BeingCreated and not down → Creating, no error; BeingCreated and down (Error, Stopped…) →
///   Creating with an error of class Other, code "vm-<state lower-case>";
/// - a down VM (Stopped, Shutdown, Error) otherwise → Running with an error: code
///   "vm-<state lower-case>" (e.g. "vm-stopped"), class Other, message saying the VM is down,
///   its node cannot be Ready, it still counts in the cluster size, and that the autoscaler
///   removes it through NodeGroupDeleteNodes (scaleKubernetesCluster nodeids=<vm id>) or an
///   operator starts it again;
/// - Starting and Idle → Creating (a VM that is booting is not yet a node);
/// - everything else (Running, Migrating, Unknown, Stopping, Restoring, unknown states) →
///   Running, no error.
pub fn vm_status(vm: &Vm, activity: &VmActivity) -> (InstanceState, Option<InstanceError>) {
    todo!("domain helper")
}

/// The error for an instance of a failed scale-up job: class OutOfResources when CloudStack's
/// error says capacity or a resource limit ran out (`jobresultcode`/`errorcode` 533 or 535, or
/// `errortext` mentioning insufficient capacity, or a resource limit / `ResourceAllocationException`),
/// code "out-of-resources"; otherwise class Other, code "scale-up-failed". The message names
/// the job and carries CloudStack's text.
pub fn scale_up_failure(job_id: &str, error_code: i64, error_text: &str) -> InstanceError {
    todo!("domain helper")
}

/// The status of a placeholder: a VM requested by a scale-up that CloudStack has not shown yet
/// (Creating, no error) or that a failed job will never create (Creating with `failure`).
pub fn placeholder_status(
    failure: Option<&InstanceError>,
) -> (InstanceState, Option<InstanceError>) {
    (InstanceState::Creating, failure.cloned())
}

#[allow(dead_code)]
fn _uses(_: VmState) {}
