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
    match activity {
        VmActivity::CreateFailed(error) => (InstanceState::Creating, Some(error.clone())),
        VmActivity::BeingRemoved => (InstanceState::Deleting, None),
        _ if vm.state.is_gone() => (InstanceState::Deleting, None),
        VmActivity::BeingCreated if vm.state.is_down() => (
            InstanceState::Creating,
            Some(InstanceError {
                code: down_code(&vm.state),
                message: format!(
                    "worker VM {} (id {}) was created by a scale-up but is {}: it cannot become a \
                     Ready node; the autoscaler gives up on it and removes it through \
                     NodeGroupDeleteNodes (scaleKubernetesCluster nodeids={}), or an operator \
                     starts it again",
                    vm.name, vm.id, vm.state, vm.id
                ),
                class: ErrorClass::Other,
            }),
        ),
        VmActivity::BeingCreated => (InstanceState::Creating, None),
        VmActivity::Idle if vm.state.is_down() => (
            InstanceState::Running,
            Some(InstanceError {
                code: down_code(&vm.state),
                message: format!(
                    "worker VM {} (id {}) is down ({}): its node cannot be Ready, yet it still \
                     counts in the cluster size; the autoscaler removes it through \
                     NodeGroupDeleteNodes (scaleKubernetesCluster nodeids={}), or an operator \
                     starts it again",
                    vm.name, vm.id, vm.state, vm.id
                ),
                class: ErrorClass::Other,
            }),
        ),
        VmActivity::Idle if vm.state == VmState::Starting => (InstanceState::Creating, None),
        VmActivity::Idle => (InstanceState::Running, None),
    }
}

/// The error code of a down VM: "vm-" and the state's name in lower case ("vm-stopped").
fn down_code(state: &VmState) -> String {
    format!("vm-{}", state.as_str().to_ascii_lowercase())
}

/// `errortext` fragments (matched case-insensitively) by which CloudStack says capacity or a
/// resource limit ran out. A failed scale job reports most errors under code 530, so the text
/// is what tells.
const OUT_OF_RESOURCES_TEXTS: [&str; 6] = [
    "insufficient capacity",
    "insufficientservercapacityexception",
    "unable to create a deployment",
    "resource limit",
    "resourceallocationexception",
    "maximum number of resources",
];

/// CloudStack error codes for capacity and resource-limit failures: 533
/// (INSUFFICIENT_CAPACITY_ERROR) and 535 (RESOURCE_ALLOCATION_ERROR).
const OUT_OF_RESOURCES_CODES: [i64; 2] = [533, 535];

/// The error for an instance of a failed scale-up job: class OutOfResources when CloudStack's
/// error says capacity or a resource limit ran out (`jobresultcode`/`errorcode` 533 or 535, or
/// `errortext` mentioning insufficient capacity, or a resource limit / `ResourceAllocationException`),
/// code "out-of-resources"; otherwise class Other, code "scale-up-failed". The message names
/// the job and carries CloudStack's text.
pub fn scale_up_failure(job_id: &str, error_code: i64, error_text: &str) -> InstanceError {
    let text = error_text.to_ascii_lowercase();
    let out_of_resources = OUT_OF_RESOURCES_CODES.contains(&error_code)
        || OUT_OF_RESOURCES_TEXTS.iter().any(|t| text.contains(t));
    if out_of_resources {
        InstanceError {
            code: "out-of-resources".to_string(),
            message: format!(
                "scale-up job {job_id} failed: CloudStack ran out of capacity or hit a resource \
                 limit (error {error_code}): {error_text}"
            ),
            class: ErrorClass::OutOfResources,
        }
    } else {
        InstanceError {
            code: "scale-up-failed".to_string(),
            message: format!(
                "scale-up job {job_id} failed (CloudStack error {error_code}): {error_text}"
            ),
            class: ErrorClass::Other,
        }
    }
}

/// The status of a placeholder: a VM requested by a scale-up that CloudStack has not shown yet
/// (Creating, no error) or that a failed job will never create (Creating with `failure`).
pub fn placeholder_status(
    failure: Option<&InstanceError>,
) -> (InstanceState, Option<InstanceError>) {
    (InstanceState::Creating, failure.cloned())
}
