//! The invariants of the scaling decision, stated a second time from the CKS scaling rules rather
//! than from the implementation, and a checker that runs the real classification and
//! `check_scale` against them.
//!
//! Shared by the cargo-fuzz target `scale_decision` and the property tests in
//! `crates/domain/tests/properties.rs` (included there by path), so both hold the code to the
//! same statement. Every broken invariant panics with the inputs that broke it.
//!
//! Cluster VM ids must be unique (CloudStack ids are UUIDs); callers generate them so.

use cks_domain::cluster::{ClusterInput, ClusterSnapshot, ClusterState, NodeRole, is_control_name};
use cks_domain::rules::{AlertScaling, Refusal, ScaleRequest, blocked_reason, check_scale};

/// Every rule name a refusal may carry.
pub const RULES: [&str; 14] = [
    "down_worker_not_removable",
    "state_not_scalable",
    "stopped_cluster_size",
    "alert_unsupported",
    "no_change",
    "size_below_one",
    "removes_all_workers",
    "size_behind_workers",
    "not_workers",
    "unknown_vm",
    "alert_rule_4_first_control_not_running",
    "alert_rule_6_control_plane_down",
    "alert_rule_5_vm_count_mismatch",
    "alert_rule_7_no_down_worker",
];

/// CloudStack's cluster state names.
pub const CLUSTER_STATES: [&str; 12] = [
    "Created",
    "Starting",
    "Running",
    "Stopping",
    "Stopped",
    "Scaling",
    "Upgrading",
    "Alert",
    "Recovering",
    "Destroyed",
    "Destroying",
    "Error",
];

/// CloudStack's VM state names.
pub const VM_STATES: [&str; 11] = [
    "Starting",
    "Running",
    "Stopping",
    "Stopped",
    "Destroyed",
    "Expunging",
    "Migrating",
    "Error",
    "Unknown",
    "Shutdown",
    "Restoring",
];

/// VM names that sit on the edge of the control pattern `<anything>-control-<hex>`.
pub const TRICKY_NAMES: [&str; 24] = [
    "x-control-zz",
    "-control-",
    "-control-0",
    "control-1a",
    "k8s-control",
    "k8s-control-",
    "k8s-controller-1a",
    "k8s-xcontrol-1a",
    "k8s-CONTROL-1a2b",
    "k8s-control-1A2B",
    "k8s-control-12g",
    "k8s-control-1a-node",
    "k8s-control-1a 2b",
    "k8s-contröl-1a",
    "ö-control-1a",
    "k8s-ＣＯＮＴＲＯＬ-1",
    "k8s-control-١٢",
    "İ-control-1",
    "k8s-\u{0}control-1",
    "k8s-node-control-ff",
    "k8s-etcd-1-18c0b1",
    "k8s-node-18c0c1",
    "",
    "-",
];

/// CKS control VM naming: `<anything>-control-<lower-case hex digits>`, "control" in any ASCII
/// case. Written over bytes, independently of the crate's string-based matcher.
pub fn control_named(name: &str) -> bool {
    let bytes = name.as_bytes();
    let hex = bytes
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(*b))
        .count();
    if hex == 0 {
        return false;
    }
    let head = &bytes[..bytes.len() - hex];
    let Some(head) = head.strip_suffix(b"-") else {
        return false;
    };
    head.len() >= 8 && head[head.len() - 8..].eq_ignore_ascii_case(b"-control")
}

/// The role each VM of `input` must get: the external flag wins, then the etcd flag; an
/// unflagged VM is control when its name says so or when it is among the first
/// `control_nodes` unflagged VMs; every other VM is a worker.
pub fn expected_roles(input: &ClusterInput) -> Vec<NodeRole> {
    let mut unflagged = 0u64;
    input
        .vms
        .iter()
        .map(|vm| {
            if vm.is_external {
                NodeRole::External
            } else if vm.is_etcd {
                NodeRole::Etcd
            } else {
                unflagged += 1;
                if control_named(&vm.name) || unflagged <= u64::from(input.control_nodes) {
                    NodeRole::Control
                } else {
                    NodeRole::Worker
                }
            }
        })
        .collect()
}

/// Whether CloudStack accepts `request` on the cluster `input` describes, from the CKS scaling
/// rules (Alert included) and the provider's own stricter limits (never remove every worker,
/// never ask for fewer than one).
pub fn expected_accept(input: &ClusterInput, request: &ScaleRequest, alert: &AlertScaling) -> bool {
    if input.externally_managed {
        // CloudStack scales no externally managed cluster.
        return false;
    }
    let roles = expected_roles(input);
    let role_of = |id: &str| input.vms.iter().position(|v| v.id == id).map(|i| roles[i]);
    let request_ok = match request {
        ScaleRequest::Resize { new_size } => *new_size >= 1,
        ScaleRequest::RemoveNodes { vm_ids } => {
            let mut distinct: Vec<&str> = vm_ids.iter().map(String::as_str).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let workers = roles.iter().filter(|r| **r == NodeRole::Worker).count();
            let limit = workers.min(input.size as usize);
            !distinct.is_empty()
                && distinct
                    .iter()
                    .all(|id| role_of(id) == Some(NodeRole::Worker))
                && distinct.len() < limit
        }
    };
    if !request_ok {
        return false;
    }
    // Without Alert scaling CloudStack drains every node it removes, and a down node's drain
    // fails: a down worker's removal never succeeds, whatever the state.
    if let (AlertScaling::Unsupported { .. }, ScaleRequest::RemoveNodes { vm_ids }) =
        (alert, request)
        && input
            .vms
            .iter()
            .any(|v| vm_ids.contains(&v.id) && is_down(v.state.as_str()))
    {
        return false;
    }
    let changes_size = match request {
        ScaleRequest::Resize { new_size } => *new_size != input.size,
        ScaleRequest::RemoveNodes { .. } => true,
    };
    match &input.state {
        // Outside Alert a resize to the current size returns early, accepted.
        ClusterState::Created | ClusterState::Running => true,
        ClusterState::Stopped => matches!(request, ScaleRequest::RemoveNodes { .. }),
        ClusterState::Alert => {
            if matches!(alert, AlertScaling::Unsupported { .. }) {
                return false;
            }
            let first_control_running = input
                .vms
                .iter()
                .zip(&roles)
                .find(|(_, r)| **r == NodeRole::Control)
                .is_some_and(|(v, _)| v.state.as_str() == "Running");
            let down = |wanted: &[NodeRole]| {
                input
                    .vms
                    .iter()
                    .zip(&roles)
                    .any(|(v, r)| wanted.contains(r) && is_down(v.state.as_str()))
            };
            // External nodes are in `size` (KubernetesClusterAddWorker), so every VM counts.
            let vms = roles.len() as u64;
            let nodes = u64::from(input.control_nodes)
                + u64::from(input.etcd_nodes)
                + u64::from(input.size);
            first_control_running
                && !down(&[NodeRole::Control, NodeRole::Etcd])
                && vms == nodes
                && down(&[NodeRole::Worker])
                && changes_size
        }
        _ => false,
    }
}

/// A down VM in CKS's sense, by CloudStack's state name.
pub fn is_down(state: &str) -> bool {
    matches!(
        state,
        "Stopped" | "Shutdown" | "Error" | "Destroyed" | "Expunging"
    )
}

/// The `scaleKubernetesCluster` parameters a request carries besides the cluster `id`. The match
/// is exhaustive on purpose: a new kind of request (an offering or autoscaling change) does not
/// compile here until someone states what it sends.
pub fn request_parameters(request: &ScaleRequest) -> &'static [&'static str] {
    match request {
        ScaleRequest::Resize { .. } => &["size"],
        ScaleRequest::RemoveNodes { .. } => &["nodeids"],
    }
}

/// Classifies `input` and checks the classification against [`expected_roles`] and the
/// documented warning rule. Returns the snapshot.
pub fn check_classification(input: &ClusterInput) -> ClusterSnapshot {
    let snapshot = ClusterSnapshot::classify(input.clone());
    let roles = expected_roles(input);
    assert_eq!(snapshot.vms.len(), input.vms.len(), "VMs kept: {input:?}");
    for ((vm, given), role) in snapshot.vms.iter().zip(&input.vms).zip(&roles) {
        assert_eq!(
            (&vm.id, &vm.name, &vm.state),
            (&given.id, &given.name, &given.state),
            "VM kept in order: {input:?}"
        );
        assert_eq!(
            vm.role, *role,
            "role of VM {:?} (external {}, etcd {}) in {input:?}",
            vm.name, given.is_external, given.is_etcd
        );
        assert_eq!(
            is_control_name(&vm.name),
            control_named(&vm.name),
            "control name pattern on {:?}",
            vm.name
        );
    }
    let name_matches = input
        .vms
        .iter()
        .filter(|v| !v.is_external && !v.is_etcd && control_named(&v.name))
        .count();
    assert_eq!(
        snapshot.classification_warning.is_some(),
        name_matches != input.control_nodes as usize,
        "warning when {name_matches} control name(s) and controlnodes={}: {input:?}",
        input.control_nodes
    );
    if let Some(warning) = &snapshot.classification_warning {
        assert!(
            warning.contains(&format!("{:?}", input.name))
                && warning.contains(&format!("controlnodes={}", input.control_nodes)),
            "warning names the cluster and the count: {warning}"
        );
    }
    assert_eq!(
        (
            &snapshot.id,
            &snapshot.name,
            &snapshot.state,
            snapshot.size,
            snapshot.control_nodes,
            snapshot.etcd_nodes,
        ),
        (
            &input.id,
            &input.name,
            &input.state,
            input.size,
            input.control_nodes,
            input.etcd_nodes,
        ),
        "cluster fields kept"
    );
    snapshot
}

/// Runs the classification and `check_scale` on one case and panics on any broken invariant:
///
/// - an accepted request is for a cluster in Created, Running, Stopped or Alert;
/// - an accepted Resize asks for at least one worker and a different size, never on Stopped;
/// - an accepted RemoveNodes names only VMs of the cluster that are neither external nor etcd,
///   nor control by name nor by position, and leaves at least one worker;
/// - in Alert, acceptance means: Alert scaling not known unsupported, first control VM Running,
///   no control or etcd VM down, VM count equal to control + etcd + size, a worker down, and a
///   real change;
/// - acceptance is exactly [`expected_accept`] (the decision refuses nothing the rules allow);
/// - a refusal names the cluster and has a known rule; naming an unknown VM is `unknown_vm`,
///   naming a non-worker is `not_workers` and size 0 is `size_below_one`, in every state;
/// - `blocked_reason` is the refusal a one-worker increase gets;
/// - a request carries only `size` or only `nodeids`.
///
/// Returns the decision so callers can measure how often each outcome occurs.
pub fn check_decision(
    input: &ClusterInput,
    request: &ScaleRequest,
    alert: &AlertScaling,
) -> Result<(), Refusal> {
    let snapshot = check_classification(input);
    let decision = check_scale(&snapshot, request, alert);
    let ctx = || format!("{input:?}\n{request:?}\n{alert:?}\n-> {decision:?}");
    let roles = expected_roles(input);

    for p in request_parameters(request) {
        assert!(["size", "nodeids"].contains(p), "a request sends {p}");
    }

    match &decision {
        Ok(()) => {
            assert!(
                matches!(
                    input.state,
                    ClusterState::Created
                        | ClusterState::Running
                        | ClusterState::Stopped
                        | ClusterState::Alert
                ),
                "accepted in a state that scales nothing: {}",
                ctx()
            );
            match request {
                ScaleRequest::Resize { new_size } => {
                    assert!(*new_size >= 1, "accepted size 0: {}", ctx());
                    assert_ne!(input.state, ClusterState::Stopped, "{}", ctx());
                    if input.state == ClusterState::Alert {
                        assert_ne!(*new_size, input.size, "accepted no change: {}", ctx());
                    }
                }
                ScaleRequest::RemoveNodes { vm_ids } => {
                    assert!(!vm_ids.is_empty(), "accepted an empty removal: {}", ctx());
                    let mut unflagged = 0u64;
                    let mut first_unflagged = std::collections::HashSet::new();
                    for vm in &input.vms {
                        if !vm.is_external && !vm.is_etcd {
                            unflagged += 1;
                            if unflagged <= u64::from(input.control_nodes) {
                                first_unflagged.insert(vm.id.as_str());
                            }
                        }
                    }
                    for id in vm_ids {
                        let named: Vec<_> = input.vms.iter().filter(|v| &v.id == id).collect();
                        assert!(!named.is_empty(), "accepted unknown VM {id}: {}", ctx());
                        for vm in named {
                            assert!(
                                !vm.is_external
                                    && !vm.is_etcd
                                    && !control_named(&vm.name)
                                    && !first_unflagged.contains(vm.id.as_str()),
                                "accepted removing non-worker {vm:?}: {}",
                                ctx()
                            );
                        }
                    }
                    let mut distinct = vm_ids.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    let workers = roles.iter().filter(|r| **r == NodeRole::Worker).count();
                    assert!(
                        distinct.len() < workers && distinct.len() < input.size as usize,
                        "accepted removing every worker: {}",
                        ctx()
                    );
                }
            }
            if input.state == ClusterState::Alert {
                assert!(
                    !matches!(alert, AlertScaling::Unsupported { .. }),
                    "accepted Alert on a CloudStack without Alert scaling: {}",
                    ctx()
                );
                let first_control = snapshot.vms.iter().find(|v| v.role == NodeRole::Control);
                assert!(
                    first_control.is_some_and(|v| v.state.as_str() == "Running"),
                    "accepted in Alert with the first control VM not Running: {}",
                    ctx()
                );
                assert!(
                    !snapshot.vms.iter().any(|v| {
                        matches!(v.role, NodeRole::Control | NodeRole::Etcd)
                            && is_down(v.state.as_str())
                    }),
                    "accepted in Alert with the control plane down: {}",
                    ctx()
                );
                assert!(
                    snapshot.workers().any(|v| is_down(v.state.as_str())),
                    "accepted in Alert with no worker down: {}",
                    ctx()
                );
            }
        }
        Err(refusal) => {
            let message = refusal.to_string();
            assert!(
                message.starts_with(&format!("cluster {:?}", input.name)),
                "refusal names the cluster: {message}"
            );
            assert!(
                RULES.contains(&refusal.rule()),
                "unknown rule {}",
                refusal.rule()
            );
        }
    }

    assert_eq!(
        decision.is_ok(),
        expected_accept(input, request, alert),
        "decision differs from the CKS rules: {}",
        ctx()
    );

    // Request-level refusals come first, in every cluster state.
    match request {
        ScaleRequest::Resize { new_size: 0 } => {
            assert_eq!(
                decision.as_ref().err().map(Refusal::rule),
                Some("size_below_one"),
                "{}",
                ctx()
            );
        }
        ScaleRequest::Resize { .. } => {}
        ScaleRequest::RemoveNodes { vm_ids } => {
            let role_of =
                |id: &String| input.vms.iter().position(|v| &v.id == id).map(|i| roles[i]);
            let expected_rule = if vm_ids.iter().any(|id| role_of(id).is_none()) {
                Some("unknown_vm")
            } else if vm_ids
                .iter()
                .any(|id| role_of(id) != Some(NodeRole::Worker))
            {
                Some("not_workers")
            } else {
                None
            };
            if let Some(rule) = expected_rule {
                assert_eq!(
                    decision.as_ref().err().map(Refusal::rule),
                    Some(rule),
                    "{}",
                    ctx()
                );
            }
        }
    }

    if let Some(bigger) = snapshot.size.checked_add(1) {
        let grow = check_scale(&snapshot, &ScaleRequest::Resize { new_size: bigger }, alert);
        assert_eq!(
            blocked_reason(&snapshot, alert),
            grow.err(),
            "blocked_reason is the refusal of a one-worker increase: {input:?} {alert:?}"
        );
    }

    decision
}
