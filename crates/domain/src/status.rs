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
    /// An accepted removal that has not happened yet for a reason an operator may need to
    /// know (a failed job retried, a VM waiting to be stopped, an abandoned removal).
    RemovalTroubled(InstanceError),
    /// Left behind by a scale-up job that failed; `error` comes from [`scale_up_failure`].
    CreateFailed(InstanceError),
    /// A failed creation the autoscaler gave up on (DecreaseTargetSize wrote it off): out of
    /// the target, its VM left for an operator (`crate::stranded`); `error` says so.
    WrittenOff(InstanceError),
}

/// The status of a worker VM:
/// - BeingRemoved, or Destroyed/Expunging → Deleting, no error; RemovalTroubled → Deleting
///   with its error (code "removal-retrying", "removal-stopping-vm" or "removal-abandoned");
/// - CreateFailed → Creating with the error (the autoscaler deletes it and backs off);
/// - WrittenOff → Deleting with its error (code "creation-written-off"): out of the target,
///   neither expected to register nor deleted again by the autoscaler;
/// - BeingCreated and not down → Creating, no error; BeingCreated and down (Error, Stopped…) →
///   Creating with an error of class Other, code `vm-<state lower-case>`;
/// - a down VM (Stopped, Shutdown, Error) otherwise → Running, no error. Upstream ignores the
///   error of a Running instance, except that it stops expecting the instance to register
///   (`expectedToRegister`, clusterstate.go): a down VM whose node never registered (or was
///   deleted) would then be neither registered nor unregistered, counted as an upcoming node
///   for ever and never removed. Without an error it is unregistered and, once past
///   `--max-node-provision-time`, deleted with its fake node; a down VM whose node is
///   registered is a NotReady node either way. The operator sees down VMs in the gauges
///   ([`reported_down`]);
/// - Starting and Idle → Creating (a VM that is booting is not yet a node);
/// - everything else (Running, Migrating, Unknown, Stopping, Restoring, unknown states) →
///   Running, no error.
pub fn vm_status(vm: &Vm, activity: &VmActivity) -> (InstanceState, Option<InstanceError>) {
    match activity {
        VmActivity::BeingRemoved => (InstanceState::Deleting, None),
        VmActivity::RemovalTroubled(error) => (InstanceState::Deleting, Some(error.clone())),
        _ if vm.state.is_gone() => (InstanceState::Deleting, None),
        VmActivity::WrittenOff(error) => (InstanceState::Deleting, Some(error.clone())),
        VmActivity::CreateFailed(error) => (InstanceState::Creating, Some(error.clone())),
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
        VmActivity::Idle if vm.state.is_down() => (InstanceState::Running, None),
        VmActivity::Idle if vm.state == VmState::Starting => (InstanceState::Creating, None),
        VmActivity::Idle => (InstanceState::Running, None),
    }
}

/// Whether the VM counts as down: an idle or new worker whose VM is Stopped, Shutdown or
/// Error. What the operator's gauges count as down; [`vm_status`] names the state in an error
/// only for a new worker (a failed creation the autoscaler removes).
pub fn reported_down(vm: &Vm, activity: &VmActivity) -> bool {
    matches!(activity, VmActivity::Idle | VmActivity::BeingCreated)
        && !vm.state.is_gone()
        && vm.state.is_down()
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
                "scale-up job {job_id} failed (CloudStack error {error_code}): {error_text}{}",
                cluster_max_size_note(error_text)
            ),
            class: ErrorClass::Other,
        }
    }
}

/// CloudStack's refusal of a size past `cloud.kubernetes.cluster.max.size`, the limit it names:
/// "Maximum cluster size can not exceed N. Please contact your administrator", where N is the
/// setting's value for the cluster's account and counts the control nodes with the workers
/// (`KubernetesClusterManagerImpl.validateKubernetesClusterScaleParameters`; the scale job's
/// failure text recorded from a CloudStack 4.21.0.0, `running_15_scale_err_size_over_max`).
pub fn cluster_max_size_refusal(text: &str) -> Option<u32> {
    const REFUSAL: &str = "maximum cluster size can not exceed ";
    let lower = text.to_ascii_lowercase();
    let at = lower.find(REFUSAL)? + REFUSAL.len();
    let digits: String = lower[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// What an operator reads after CloudStack's text when it refused a size past
/// `cloud.kubernetes.cluster.max.size` ([`cluster_max_size_refusal`]): empty for any other text.
pub fn cluster_max_size_note(text: &str) -> String {
    cluster_max_size_refusal(text).map_or_else(String::new, |limit| {
        format!(
            ". CloudStack's cloud.kubernetes.cluster.max.size is {limit} for the cluster's account \
             and counts the control nodes with the workers: no size past {limit} minus the \
             control nodes is accepted. Lower the node group's MAX (--nodes MIN:MAX:CLUSTER) to \
             fit, or have a CloudStack administrator raise cloud.kubernetes.cluster.max.size for \
             the cluster's account"
        )
    })
}

/// The error of the VMs a size job that ended successfully did not ask for (CloudStack lists
/// `listed`, not `asked`): a scale-up that failed, though CloudStack called it a success.
pub fn size_not_reached(job_id: &str, asked: u32, listed: u32) -> InstanceError {
    InstanceError {
        code: "scale-up-failed".to_string(),
        message: format!(
            "scale-up job {job_id} ended successfully but CloudStack lists size {listed}, not \
             {asked}: the VMs were never asked for"
        ),
        class: ErrorClass::Other,
    }
}

/// The status of a placeholder: a VM requested by a scale-up that CloudStack has not shown yet
/// (Creating, no error) or that a failed job will never create (Creating with `failure`).
pub fn placeholder_status(
    failure: Option<&InstanceError>,
) -> (InstanceState, Option<InstanceError>) {
    (InstanceState::Creating, failure.cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeRole;

    fn worker(state: VmState) -> Vm {
        Vm {
            id: "5a1e7c9e-vm".to_string(),
            name: "k8s-node-18c0c1".to_string(),
            state,
            role: NodeRole::Worker,
        }
    }

    type Expect = (InstanceState, Option<&'static str>);
    const RUN: Expect = (InstanceState::Running, None);
    const NEW: Expect = (InstanceState::Creating, None);
    const DEL: Expect = (InstanceState::Deleting, None);
    const FAIL: Expect = (InstanceState::Creating, Some("out-of-resources"));
    const OFF: Expect = (InstanceState::Deleting, Some("creation-written-off"));

    #[test]
    fn a_size_past_cloudstacks_cluster_limit_is_named_with_its_fix() {
        // CloudStack 4.21.0.0's text, `running_15_scale_err_size_over_max_job_final`.
        let text = "Maximum cluster size can not exceed 10. Please contact your administrator";
        assert_eq!(cluster_max_size_refusal(text), Some(10));
        assert_eq!(cluster_max_size_refusal("insufficient capacity"), None);
        assert_eq!(
            cluster_max_size_refusal("maximum cluster size can not exceed x"),
            None
        );
        let failure = scale_up_failure("job-9", 530, text);
        assert_eq!(failure.code, "scale-up-failed");
        assert!(
            failure.message.starts_with(
                "scale-up job job-9 failed (CloudStack error 530): Maximum cluster size can not exceed 10. Please contact your administrator. CloudStack's cloud.kubernetes.cluster.max.size is 10 for the cluster's account and counts the control nodes with the workers"
            ),
            "{}",
            failure.message
        );
        assert!(failure.message.contains("Lower the node group's MAX"));
        assert!(cluster_max_size_note("Insufficient capacity").is_empty());
    }

    #[test]
    fn every_vm_state_and_activity_maps_to_an_instance_status() {
        let failure = scale_up_failure("job-1", 533, "Insufficient capacity");
        let written_off = InstanceError {
            code: "creation-written-off".into(),
            message: "written off".into(),
            class: ErrorClass::Other,
        };
        let activities = [
            VmActivity::Idle,
            VmActivity::BeingCreated,
            VmActivity::BeingRemoved,
            VmActivity::CreateFailed(failure.clone()),
            VmActivity::WrittenOff(written_off),
        ];
        let new_down = |code| (InstanceState::Creating, Some(code));
        // Columns: Idle, BeingCreated, BeingRemoved, CreateFailed, WrittenOff.
        let table: Vec<(VmState, [Expect; 5])> = vec![
            (VmState::Starting, [NEW, NEW, DEL, FAIL, OFF]),
            (VmState::Running, [RUN, NEW, DEL, FAIL, OFF]),
            (VmState::Stopping, [RUN, NEW, DEL, FAIL, OFF]),
            (
                VmState::Stopped,
                [RUN, new_down("vm-stopped"), DEL, FAIL, OFF],
            ),
            // A gone VM is Deleting even when a failed scale-up left it: it is neither
            // counted in the target nor left for the autoscaler to delete.
            (VmState::Destroyed, [DEL, DEL, DEL, DEL, DEL]),
            (VmState::Expunging, [DEL, DEL, DEL, DEL, DEL]),
            (VmState::Migrating, [RUN, NEW, DEL, FAIL, OFF]),
            (VmState::Error, [RUN, new_down("vm-error"), DEL, FAIL, OFF]),
            (VmState::Unknown, [RUN, NEW, DEL, FAIL, OFF]),
            (
                VmState::Shutdown,
                [RUN, new_down("vm-shutdown"), DEL, FAIL, OFF],
            ),
            (VmState::Restoring, [RUN, NEW, DEL, FAIL, OFF]),
            (
                VmState::Other("Hibernated".into()),
                [RUN, NEW, DEL, FAIL, OFF],
            ),
        ];
        for (state, expected) in table {
            let vm = worker(state.clone());
            for (activity, (want_state, want_code)) in activities.iter().zip(expected) {
                let (got_state, got_error) = vm_status(&vm, activity);
                assert_eq!(got_state, want_state, "{state} / {activity:?}");
                assert_eq!(
                    got_error.as_ref().map(|e| e.code.as_str()),
                    want_code,
                    "{state} / {activity:?}"
                );
                if let VmActivity::CreateFailed(error) | VmActivity::WrittenOff(error) = activity
                    && got_error.is_some()
                {
                    assert_eq!(
                        got_error.as_ref(),
                        Some(error),
                        "the job's error is passed through"
                    );
                } else if let Some(error) = got_error {
                    assert_eq!(error.class, ErrorClass::Other, "{state} / {activity:?}");
                }
            }
        }
    }

    #[test]
    fn a_down_worker_is_running_without_error_so_upstream_expects_its_node() {
        // An error would make upstream's expectedToRegister false: a down VM without a node
        // would never be unregistered, so never removed.
        for state in [VmState::Stopped, VmState::Shutdown, VmState::Error] {
            let vm = worker(state.clone());
            assert_eq!(
                vm_status(&vm, &VmActivity::Idle),
                (InstanceState::Running, None),
                "{state}"
            );
            assert!(reported_down(&vm, &VmActivity::Idle), "{state}");
        }
    }

    #[test]
    fn a_new_worker_that_went_down_is_reported_while_creating() {
        let (state, error) = vm_status(&worker(VmState::Error), &VmActivity::BeingCreated);
        assert_eq!(state, InstanceState::Creating);
        let error = error.expect("error");
        assert_eq!(
            (error.code.as_str(), error.class),
            ("vm-error", ErrorClass::Other)
        );
        assert!(
            error.message.contains("k8s-node-18c0c1") && error.message.contains("is Error"),
            "{}",
            error.message
        );
    }

    #[test]
    fn scale_up_failures_out_of_resources_by_text() {
        let texts = [
            "Insufficient capacity to deploy",
            "Unable to deploy: INSUFFICIENT CAPACITY",
            "com.cloud.exception.InsufficientServerCapacityException: Unable to create a deployment for VM",
            "Unable to create a deployment for VM[User|k8s-node-1]",
            "Maximum number of resources of type 'user_vm' for account name=a has been exceeded.",
            "resource limit exceeded for cpu",
            "com.cloud.exception.ResourceAllocationException: instance",
        ];
        for text in texts {
            let error = scale_up_failure("job-42", 530, text);
            assert_eq!(error.class, ErrorClass::OutOfResources, "{text}");
            assert_eq!(error.code, "out-of-resources", "{text}");
            assert!(
                error.message.contains("job-42") && error.message.contains(text),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn scale_up_failures_out_of_resources_by_code() {
        for code in [533, 535] {
            let error = scale_up_failure("job-7", code, "something went wrong");
            assert_eq!(
                (error.code.as_str(), error.class),
                ("out-of-resources", ErrorClass::OutOfResources)
            );
            assert!(
                error.message.contains(&code.to_string()),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn other_scale_up_failures_are_class_other() {
        for (code, text) in [
            (
                530,
                "Scaling unsuccessful for Kubernetes cluster : k8s as it does not have desired number of nodes in ready state",
            ),
            (530, "capacity is fine"),
            (534, "resource unavailable"),
            (0, ""),
        ] {
            let error = scale_up_failure("job-9", code, text);
            assert_eq!(
                (error.code.as_str(), error.class),
                ("scale-up-failed", ErrorClass::Other),
                "{text}"
            );
            assert!(
                error.message.contains("job-9") && error.message.contains(text),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn placeholders_are_creating_with_the_failure_if_any() {
        assert_eq!(placeholder_status(None), (InstanceState::Creating, None));
        let failure = scale_up_failure("job-1", 535, "limit");
        assert_eq!(
            placeholder_status(Some(&failure)),
            (InstanceState::Creating, Some(failure.clone()))
        );
    }

    #[test]
    fn error_classes_have_the_protocol_values() {
        assert_eq!(ErrorClass::OutOfResources as i32, 1);
        assert_eq!(ErrorClass::Other as i32, 99);
    }
}
