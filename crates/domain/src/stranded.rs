//! A cluster CloudStack has stranded: in Alert for a reason no scale request can mend, where
//! CloudStack refuses every request (the Alert rules of cks-scaling.md) and only an operator can
//! repair it. Two ways CloudStack gets there on its own:
//!
//! - **Rule 5, the VM count.** A scale-up that fails part way keeps the VMs it created (each is
//!   in the cluster's VM map before it starts) and writes `size` only on success
//!   (apache/cloudstack#12699, #12123): more VMs than nodes. A removal that fails part way has
//!   destroyed VMs and writes `size` only at the end: fewer. CloudStack refuses every request
//!   while the two differ, and keeps the cluster in Alert (`reconcileAlertCluster` wants them
//!   equal), so the autoscaler can neither delete the VMs left behind nor add any.
//! - **Rule 7, no worker down.** Alert with every worker up: a failed drain left its node
//!   cordoned (CloudStack counts only nodes whose status is exactly `Ready`), a VM on a
//!   disconnected host, a failed start or upgrade. Scaling cannot bring it back.
//!
//! [`stranded`] finds it from a snapshot alone; `ScaleMachine::stranded` adds what the machine
//! knows of the VMs a failed scale-up left. The typed result names the rule, the VMs and the
//! operator's fix; its text is the refusal the provider answers scale requests with
//! (`Stranded::refusal`, in `crate::rules`, which names the VMs the same way).

use super::cluster::{ClusterSnapshot, ClusterState, Vm, VmState};
use super::status::{ErrorClass, InstanceError};
use std::fmt;

/// The Alert rule that strands a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrandRule {
    /// CKS Alert rule 5: CloudStack lists more or fewer VMs than the cluster's nodes.
    VmCount,
    /// CKS Alert rule 7: Alert with no worker VM down.
    NoDownWorker,
}

impl StrandRule {
    /// Every rule, in the order [`stranded`] checks them.
    pub const ALL: [StrandRule; 2] = [StrandRule::VmCount, StrandRule::NoDownWorker];

    /// The rule's stable name, as [`Refusal::rule`] names the refusal it causes (a metric
    /// label).
    pub fn as_str(self) -> &'static str {
        match self {
            StrandRule::VmCount => "alert_rule_5_vm_count_mismatch",
            StrandRule::NoDownWorker => "alert_rule_7_no_down_worker",
        }
    }
}

impl fmt::Display for StrandRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A VM the operator has to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrandedVm {
    pub id: String,
    pub name: String,
    pub state: VmState,
}

impl StrandedVm {
    fn of(vm: &Vm) -> Self {
        StrandedVm {
            id: vm.id.clone(),
            name: vm.name.clone(),
            state: vm.state.clone(),
        }
    }
}

impl fmt::Display for StrandedVm {
    /// `name (state)`, as messages list VMs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.state)
    }
}

/// A cluster CloudStack has stranded: the rule, the counts and the VMs involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    pub cluster: String,
    pub rule: StrandRule,
    /// The VMs CloudStack counts for rule 5: every VM it lists (external ones, and Destroyed
    /// or Expunging ones still in its VM map, included).
    pub vms: u32,
    /// The cluster's nodes as CloudStack counts them: control + etcd + size.
    pub nodes: u32,
    /// Rule 5 with more VMs than nodes: the VMs left behind, as many as the excess (those the
    /// machine knows a failed scale-up left first, then the newest workers). Rule 7: the VMs
    /// that are not Running (what keeps the cluster in Alert, when a VM does). Otherwise empty.
    pub involved: Vec<StrandedVm>,
}

impl Stranded {
    /// The names of the VMs involved, for a log field.
    pub fn vm_names(&self) -> Vec<&str> {
        self.involved.iter().map(|v| v.name.as_str()).collect()
    }
}

/// Whether CloudStack has stranded the cluster, judged from its snapshot: in Alert with a VM
/// count that differs from its nodes (rule 5, checked first), or in Alert with no worker VM
/// down (rule 7). `known_left_behind`: VM ids the caller knows a failed scale-up left (named
/// first). `None` outside Alert (a count that differs while the cluster is Scaling is a job
/// at work), and for an externally managed cluster (never scaled through CKS).
///
/// Independent of whether this CloudStack scales in Alert: one that does not refuses every
/// request in Alert anyway, and the cluster needs the same repair.
pub fn stranded(snapshot: &ClusterSnapshot, known_left_behind: &[&str]) -> Option<Stranded> {
    if snapshot.state != ClusterState::Alert || snapshot.externally_managed {
        return None;
    }
    let (vms, nodes) = snapshot.vm_count();
    let (rule, involved): (StrandRule, Vec<&Vm>) = if vms != nodes {
        (StrandRule::VmCount, snapshot.left_behind(known_left_behind))
    } else if !snapshot.workers().any(|v| v.state.is_down()) {
        (StrandRule::NoDownWorker, snapshot.not_running())
    } else {
        return None;
    };
    Some(Stranded {
        cluster: snapshot.name.clone(),
        rule,
        vms,
        nodes,
        involved: involved.into_iter().map(StrandedVm::of).collect(),
    })
}

/// The error a written-off instance carries: what happened and what the operator does.
pub fn written_off_error(vm: &Vm) -> InstanceError {
    InstanceError {
        code: "creation-written-off".into(),
        message: format!(
            "worker VM {} (id {}, {}) was left by a failed scale-up and never became a node; \
             CloudStack refuses to remove it while the cluster's VMs and nodes differ, so the \
             autoscaler gave up on it (DecreaseTargetSize) and it is out of the target size; \
             an operator removes it (operations guide §7.2)",
            vm.name, vm.id, vm.state
        ),
        class: ErrorClass::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fixtures::ClusterBuilder;

    const UP: VmState = VmState::Running;

    /// The rule a cluster is stranded by and the VMs named, as `name (state)`.
    type Outcome = Option<(&'static str, Vec<String>)>;

    fn rule_and_vms(snap: &ClusterSnapshot, known: &[&str]) -> Outcome {
        stranded(snap, known).map(|s| {
            (
                s.rule.as_str(),
                s.involved.iter().map(ToString::to_string).collect(),
            )
        })
    }

    #[test]
    fn stranded_clusters_and_the_vms_they_name() {
        let name = |n: u32| format!("k8s-node-18c0c{n:x}");
        let cases: Vec<(&str, ClusterBuilder, Outcome)> = vec![
            ("healthy", ClusterBuilder::healthy("k8s", 1, 3), None),
            (
                "Alert with a worker down: the autoscaler removes it",
                ClusterBuilder::healthy("k8s", 1, 2)
                    .worker(VmState::Stopped)
                    .alert(),
                None,
            ),
            (
                "a failed scale-up left two VMs (size 1, three workers)",
                ClusterBuilder::healthy("k8s", 1, 1)
                    .stray_worker(UP)
                    .stray_worker(VmState::Error)
                    .alert(),
                Some((
                    "alert_rule_5_vm_count_mismatch",
                    vec![
                        format!("{} (Error)", name(3)),
                        format!("{} (Running)", name(2)),
                    ],
                )),
            ),
            (
                "a failed removal destroyed a VM without lowering the size",
                ClusterBuilder::healthy("k8s", 1, 2).size(3).alert(),
                Some(("alert_rule_5_vm_count_mismatch", vec![])),
            ),
            (
                "rule 5 before rule 7: VMs left behind, all running",
                ClusterBuilder::healthy("k8s", 1, 2)
                    .stray_worker(UP)
                    .alert(),
                Some((
                    "alert_rule_5_vm_count_mismatch",
                    vec![format!("{} (Running)", name(3))],
                )),
            ),
            (
                "Alert with every VM running (a cordoned node)",
                ClusterBuilder::healthy("k8s", 1, 2).alert(),
                Some(("alert_rule_7_no_down_worker", vec![])),
            ),
            (
                "Alert with a worker on a disconnected host",
                ClusterBuilder::healthy("k8s", 1, 1)
                    .worker(VmState::Unknown)
                    .alert(),
                Some((
                    "alert_rule_7_no_down_worker",
                    vec![format!("{} (Unknown)", name(2))],
                )),
            ),
            (
                "Alert with only an external node stopped: no worker down",
                ClusterBuilder::healthy("k8s", 1, 2)
                    .external(VmState::Stopped)
                    .alert(),
                Some((
                    "alert_rule_7_no_down_worker",
                    vec!["ext-1 (Stopped)".into()],
                )),
            ),
            (
                "the control plane down, no worker down: named first",
                ClusterBuilder::new("k8s")
                    .control(VmState::Stopped)
                    .worker(UP)
                    .worker(VmState::Migrating)
                    .alert(),
                Some((
                    "alert_rule_7_no_down_worker",
                    vec![
                        "k8s-control-18c0a1 (Stopped)".into(),
                        format!("{} (Migrating)", name(2)),
                    ],
                )),
            ),
            (
                "a count that differs while Scaling is a job at work",
                ClusterBuilder::healthy("k8s", 1, 1)
                    .stray_worker(VmState::Starting)
                    .state(ClusterState::Scaling),
                None,
            ),
            (
                "Running with every VM up",
                ClusterBuilder::healthy("k8s", 1, 1).stray_worker(UP),
                None,
            ),
        ];
        for (label, builder, want) in cases {
            let snap = builder.build();
            assert_eq!(rule_and_vms(&snap, &[]), want, "{label}");
        }
    }

    #[test]
    fn known_left_behind_vms_are_named_first() {
        // Three workers for size 1: two left behind. The machine knows worker-2 failed.
        let snap = ClusterBuilder::healthy("k8s", 1, 1)
            .stray_worker(UP)
            .stray_worker(UP)
            .alert()
            .build();
        let named = |known: &[&str]| -> Vec<String> {
            snap.left_behind(known)
                .iter()
                .map(|v| v.id.clone())
                .collect()
        };
        assert_eq!(named(&[]), ["worker-3", "worker-2"], "the newest");
        assert_eq!(named(&["worker-2"]), ["worker-2", "worker-3"]);
        assert_eq!(named(&["worker-1"]), ["worker-1", "worker-3"]);
        assert_eq!(
            named(&["worker-1", "worker-2", "worker-3"]),
            ["worker-1", "worker-2"],
            "no more than the excess"
        );
        assert_eq!(named(&["no-such-vm"]), ["worker-3", "worker-2"]);
        assert!(
            ClusterBuilder::healthy("k8s", 1, 2)
                .build()
                .left_behind(&[])
                .is_empty()
        );
    }

    #[test]
    fn the_message_names_the_rule_the_vms_and_the_fix() {
        let more = ClusterBuilder::healthy("k8s", 1, 1)
            .stray_worker(UP)
            .stray_worker(VmState::Error)
            .alert()
            .build();
        let s = stranded(&more, &["worker-3"]).expect("stranded");
        assert_eq!((s.vms, s.nodes), (4, 2));
        assert_eq!(s.vm_names(), ["k8s-node-18c0c3", "k8s-node-18c0c2"]);
        let text = s.to_string();
        for part in [
            "cluster \"k8s\"",
            "lists 4 VMs",
            "has 2 nodes",
            "k8s-node-18c0c3 (Error), k8s-node-18c0c2 (Running)",
            "failed scale-up",
            "administrator",
            "§7.2",
            "CKS Alert rule 5",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert!(!text.contains("minimum size"), "{text}");
        assert_eq!(s.refusal().rule(), s.rule.as_str());

        let fewer = ClusterBuilder::healthy("k8s", 1, 2).size(3).alert().build();
        let text = stranded(&fewer, &[]).expect("stranded").to_string();
        for part in [
            "lists 3 VMs",
            "has 4 nodes",
            "removal",
            "size",
            "CKS Alert rule 5",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }

        let cordoned = ClusterBuilder::healthy("k8s", 1, 2).alert().build();
        let s = stranded(&cordoned, &[]).expect("stranded");
        let text = s.to_string();
        for part in [
            "no worker VM is down",
            "cordoned",
            "uncordon",
            "CKS Alert rule 7",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert_eq!(s.refusal().rule(), "alert_rule_7_no_down_worker");

        for s in [&more, &fewer, &cordoned].map(|c| stranded(c, &[]).expect("stranded")) {
            let text = s.to_string();
            assert!(!text.contains('\n') && !text.contains("  "), "{text:?}");
        }
    }

    #[test]
    fn an_externally_managed_cluster_is_never_called_stranded() {
        let mut snap = ClusterBuilder::healthy("k8s", 1, 1)
            .stray_worker(UP)
            .alert()
            .build();
        assert!(stranded(&snap, &[]).is_some());
        snap.externally_managed = true;
        assert_eq!(stranded(&snap, &[]), None);
    }
}
