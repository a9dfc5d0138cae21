//! What the machine does about a cluster CloudStack has stranded (`crate::stranded`): the
//! stranding named with the VMs the machine knows a failed scale-up left, and noticed once
//! for the operator's log; a VM of a failed scale-up whose node registered is a node, not a
//! failed creation; and the failed creations DecreaseTargetSize wrote off
//! ([`ScaleMachine::decrease_target`]), listed Deleting with what an operator has to do.

use super::ScaleMachine;
use crate::cluster::Vm;
use crate::stranded::{StrandRule, Stranded, stranded};

/// What changed about the cluster's stranding since it was last noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrandNews {
    /// Stranded now (or by another rule than before).
    Stranded(Stranded),
    /// No longer stranded; it was by this rule.
    Recovered(StrandRule),
}

impl ScaleMachine {
    /// Whether CloudStack has stranded the cluster, by its latest snapshot; the VMs this
    /// machine knows a failed scale-up left (failed creations, written off or not) are named
    /// first.
    pub fn stranded(&self) -> Option<Stranded> {
        let s = self.snap.as_ref()?;
        let known: Vec<&str> = self
            .failed
            .iter()
            .filter_map(|f| f.vm_id.as_deref())
            .chain(self.written_off.iter().map(String::as_str))
            .collect();
        stranded(&s.snap, &known)
    }

    /// Notes the stranding of the latest snapshot: news when the cluster became stranded (or
    /// by another rule) or recovered since the last note, `None` while nothing changed
    /// ([`super::Effect::Stranding`], once per change, not on every listing).
    pub(crate) fn note_stranded(&mut self) -> Option<StrandNews> {
        let now = self.stranded();
        let rule = now.as_ref().map(|s| s.rule);
        if rule == self.stranded_noted {
            return None;
        }
        let before = std::mem::replace(&mut self.stranded_noted, rule);
        match (now, before) {
            (Some(s), _) => Some(StrandNews::Stranded(s)),
            (None, Some(was)) => Some(StrandNews::Recovered(was)),
            (None, None) => None,
        }
    }

    /// Whether `vm_id` is reported as a failed creation, or was written off.
    pub fn is_failed_vm(&self, vm_id: &str) -> bool {
        self.written_off.contains(vm_id)
            || self
                .failed
                .iter()
                .any(|f| f.vm_id.as_deref() == Some(vm_id))
    }

    /// An autoscaler reported a real node for `vm_id` (NodeGroupForNode). A VM a failed
    /// scale-up left that is up and registered is a node like any other: no longer a failed
    /// creation (the autoscaler would delete it as one, pods and all) nor written off. A down
    /// VM stays what it was: its node is NotReady and cannot become Ready by itself. Returns
    /// whether anything changed.
    pub(crate) fn node_registered(&mut self, vm_id: &str) -> bool {
        if !self.is_failed_vm(vm_id) {
            return false;
        }
        let up = self
            .snap
            .as_ref()
            .and_then(|s| s.snap.vm(vm_id))
            .is_some_and(|v| !v.state.is_down());
        if !up {
            return false;
        }
        self.failed.retain(|f| f.vm_id.as_deref() != Some(vm_id));
        self.written_off.remove(vm_id);
        true
    }

    /// The failed creations whose node an autoscaler reported registered within the
    /// registrations' window: nodes of the group now ([`ScaleMachine::node_registered`]); the
    /// news of each.
    pub(crate) fn failed_vms_registered(
        &mut self,
        registered: &crate::registry::Registrations,
        now: std::time::Instant,
    ) -> Vec<super::Effect> {
        let joined: Vec<(String, String)> = self
            .failed
            .iter()
            .filter_map(|f| f.vm_id.as_deref())
            .filter_map(|vm| {
                registered
                    .recent(vm, now)
                    .map(|r| (vm.to_string(), r.node.clone()))
            })
            .collect();
        joined
            .into_iter()
            .filter(|(vm, _)| self.node_registered(vm))
            .map(|(vm, node)| super::Effect::NodeOfFailedVm { vm, node })
            .collect()
    }

    /// The written-off VMs CloudStack still lists, in listing order.
    pub(crate) fn written_off(&self) -> Vec<&Vm> {
        self.snap.as_ref().map_or_else(Vec::new, |s| {
            s.snap
                .workers()
                .filter(|v| self.written_off.contains(&v.id) && !v.state.is_gone())
                .collect()
        })
    }

    /// The failed creations DecreaseTargetSize may write off, in the order it does: VMs a
    /// failed scale-up left (listed, not gone, not being removed, not written off yet), down
    /// ones first, then the newest.
    pub(super) fn writable_failures(&self) -> Vec<String> {
        let Some(s) = &self.snap else {
            return Vec::new();
        };
        let removing = self.removing();
        let mut out: Vec<&Vm> = s
            .snap
            .workers()
            .filter(|v| {
                !v.state.is_gone()
                    && !removing.contains(v.id.as_str())
                    && self
                        .failed
                        .iter()
                        .any(|f| f.vm_id.as_deref() == Some(&v.id))
            })
            .collect();
        out.reverse();
        out.sort_by_key(|v| !v.state.is_down());
        out.into_iter().map(|v| v.id.clone()).collect()
    }

    /// Writes off the failed creation of `vm_id`: out of the target and of the failed
    /// instances, listed Deleting with
    /// [`crate::stranded::written_off_error`].
    pub(super) fn write_off(&mut self, vm_id: &str) {
        self.failed.retain(|f| f.vm_id.as_deref() != Some(vm_id));
        self.written_off.insert(vm_id.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::super::{JobEnd, Timings};
    use super::*;
    use crate::cluster::IndexedSnapshot;
    use crate::cluster::VmState;
    use crate::machine::{Admission, Decreased, ScaleError, Started};
    use crate::rules::{AlertScaling, ScaleRequest};
    use crate::status::InstanceState;
    use std::sync::Arc;
    use std::time::Instant;

    const ALERT: AlertScaling = AlertScaling::Supported;

    /// One control VM and the workers given, `size` as given (the machine's tests' builder).
    fn snap(state: &str, workers: &[(&str, VmState)], size: u32) -> Arc<IndexedSnapshot> {
        super::super::tests::snapshot_sized(state, workers, size, Instant::now())
    }

    /// The cluster: one worker, a scale-up to 3 that CloudStack failed part way (w2
    /// Running, w3 in Error), size still 1, the cluster in Alert.
    fn stranded_machine(t0: Instant) -> ScaleMachine {
        let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
        m.snapshot_installed(snap("Running", &[("w1", VmState::Running)], 1), &ALERT, t0);
        assert_eq!(
            m.admit_increase(2, 10, &AlertScaling::Supported),
            Ok(Admission::NeedsFreshSnapshot)
        );
        assert_eq!(
            m.start_increase(2, 10, &ALERT, t0),
            Ok(Started::Submit(ScaleRequest::Resize { new_size: 3 }))
        );
        m.submission_answered("job-1".into(), t0);
        let left = [
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Error),
        ];
        m.snapshot_installed(snap("Alert", &left, 1), &ALERT, t0);
        let end = JobEnd::Failed {
            code: 530,
            text: "unable to provision node VM in the cluster".into(),
        };
        m.job_finished("job-1", &end, true, false, &ALERT, t0)
            .expect("the followed job");
        m
    }

    fn instance_states(m: &ScaleMachine) -> Vec<(String, InstanceState, Option<String>)> {
        m.instances(&m.pending_placeholders())
            .into_iter()
            .map(|i| (i.id, i.state, i.error.map(|e| e.code)))
            .collect()
    }

    fn inst(
        id: &str,
        state: InstanceState,
        code: Option<&str>,
    ) -> (String, InstanceState, Option<String>) {
        (
            format!("external-cloudstack://{id}"),
            state,
            code.map(str::to_string),
        )
    }

    #[test]
    fn a_failed_vm_whose_node_registered_is_a_node_not_a_failed_creation() {
        let t0 = Instant::now();
        let mut m = stranded_machine(t0);
        use InstanceState::*;
        assert_eq!(
            instance_states(&m),
            [
                inst("w1", Running, None),
                inst("w2", Creating, Some("scale-up-failed")),
                inst("w3", Creating, Some("scale-up-failed")),
            ]
        );
        assert!(!m.node_registered("w1"), "not a failed VM: nothing to do");
        assert!(
            !m.node_registered("w3"),
            "in Error: it stays a failed creation"
        );
        assert!(m.node_registered("w2"));
        assert!(!m.node_registered("w2"), "once");
        assert_eq!(
            instance_states(&m),
            [
                inst("w1", Running, None),
                inst("w2", Running, None),
                inst("w3", Creating, Some("scale-up-failed")),
            ]
        );
        assert_eq!(m.target(), Some(3));
        assert!(m.is_failed_vm("w3") && !m.is_failed_vm("w2"));
    }

    /// Upstream 1.33's `fixNodeGroupSize` (core/static_autoscaler.go) asks to lower the target
    /// by the instances that never registered once max-node-provision-time passed, and aborts
    /// RunOnce on an error, every loop. The failed creations CloudStack will not let anyone
    /// delete are written off: the OK drops the target by the delta and nothing else changes.
    #[test]
    fn decrease_writes_off_failed_creations_that_will_never_be_nodes() {
        let t0 = Instant::now();
        let mut m = stranded_machine(t0);
        assert!(m.node_registered("w2"));
        // Registered: w1, w2. Target 3: w3 never registers.
        assert_eq!(m.decrease_target(1), Ok(Decreased { cancelled: 1 }));
        assert_eq!(m.target(), Some(2));
        use InstanceState::*;
        assert_eq!(
            instance_states(&m),
            [
                inst("w1", Running, None),
                inst("w2", Running, None),
                inst("w3", Deleting, Some("creation-written-off")),
            ]
        );
        let w3 = m
            .instances(&[])
            .into_iter()
            .find(|i| i.id.ends_with("w3"))
            .and_then(|i| i.error)
            .expect("an error");
        assert!(
            w3.message.contains("k-node-w3") && w3.message.contains("§7.2"),
            "{}",
            w3.message
        );
        assert_eq!(m.written_off().len(), 1);
        assert!(m.failed().is_empty(), "no failed creation left to delete");
        // Nothing more to write off: a refusal that changes nothing.
        assert!(matches!(
            m.decrease_target(1),
            Err(ScaleError::CannotDecrease { cancellable: 0, .. })
        ));
        assert_eq!(m.target(), Some(2));
        // Still named as left behind.
        let s = m.stranded().expect("stranded");
        assert_eq!(s.vm_names(), ["k-node-w3", "k-node-w2"]);
    }

    #[test]
    fn written_off_vms_go_down_first_then_the_newest_and_only_as_many_as_asked() {
        let t0 = Instant::now();
        let mut m = stranded_machine(t0);
        // Both failed; the autoscaler saw neither register: delta 2, the Error one first.
        assert_eq!(m.writable_failures(), ["w3", "w2"]);
        assert_eq!(m.decrease_target(1), Ok(Decreased { cancelled: 1 }));
        assert_eq!(m.target(), Some(2));
        assert!(m.is_failed_vm("w3") && m.is_failed_vm("w2"));
        assert_eq!(m.decrease_target(1), Ok(Decreased { cancelled: 1 }));
        assert_eq!(m.target(), Some(1));
        // A written-off VM whose node registers after all is a node again.
        assert!(m.node_registered("w2"));
        assert_eq!(m.target(), Some(2));
        // One in Error stays written off, reported or not.
        assert!(!m.node_registered("w3"));
        assert_eq!(m.written_off().len(), 1);
    }

    /// The autoscaler deletes the failed creations (`deleteCreatedNodesWithErrors`, fake nodes
    /// "create-error"): refused for the VM count, naming the VMs, never as "removes all
    /// workers … minimum size"; and a Running one alone is not stopped for nothing.
    #[test]
    fn deleting_the_failed_creations_of_a_stranded_cluster_names_the_vm_count() {
        use crate::machine::NodeRef;
        use crate::nodeid::FAKE_NODE_REASON_ANNOTATION;
        use crate::registry::Registrations;
        let t0 = Instant::now();
        let mut m = stranded_machine(t0);
        let fake = |id: &str| {
            let instance = format!("external-cloudstack://{id}");
            NodeRef {
                provider_id: instance.clone(),
                name: instance,
                annotations: [(
                    FAKE_NODE_REASON_ANNOTATION.to_string(),
                    "create-error".into(),
                )]
                .into(),
            }
        };
        let reports = Registrations::new(std::time::Duration::from_secs(1500));
        for nodes in [
            vec![fake("w2"), fake("w3")],
            vec![fake("w3")],
            vec![fake("w2")],
        ] {
            let refused = m.accept_removals(&nodes, 1, &ALERT, &reports, t0);
            let Err(ScaleError::Refused(r)) = &refused else {
                panic!("refused: {refused:?}");
            };
            assert_eq!(r.rule(), "alert_rule_5_vm_count_mismatch", "{nodes:?}");
            let msg = r.to_string();
            assert!(
                msg.contains("k-node-w3 (Error)") && msg.contains("k-node-w2 (Running)"),
                "{msg}"
            );
            assert!(!msg.contains("minimum size"), "{msg}");
            assert!(m.queue().remove.is_empty(), "nothing queued");
            assert!(m.take_stops(t0).is_empty(), "nothing stopped");
            assert_eq!(m.target(), Some(3), "nothing changed");
        }
    }

    #[test]
    fn the_stranding_is_said_once_per_change() {
        use super::super::{Effect, Event};
        let t0 = Instant::now();
        let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
        let listed = |m: &mut ScaleMachine, state: &str, vms: &[(&str, VmState)]| {
            m.handle(
                Event::Listed {
                    snap: snap(state, vms, 1),
                    alert: &ALERT,
                },
                t0,
            )
            .effects
            .into_iter()
            .filter_map(|e| match e {
                Effect::Stranding(news) => Some(news),
                _ => None,
            })
            .collect::<Vec<_>>()
        };
        assert_eq!(listed(&mut m, "Running", &[("w1", VmState::Running)]), []);
        let left = [("w1", VmState::Running), ("w2", VmState::Error)];
        let [StrandNews::Stranded(s)] = &listed(&mut m, "Alert", &left)[..] else {
            panic!("news");
        };
        assert_eq!(s.rule, StrandRule::VmCount);
        assert_eq!(s.vm_names(), ["k-node-w2"]);
        // The next listings of the same stranding are no news.
        assert_eq!(listed(&mut m, "Alert", &left), []);
        // Another rule is.
        assert!(matches!(
            &listed(&mut m, "Alert", &[("w1", VmState::Running)])[..],
            [StrandNews::Stranded(Stranded {
                rule: StrandRule::NoDownWorker,
                ..
            })]
        ));
        assert_eq!(
            listed(&mut m, "Running", &[("w1", VmState::Running)]),
            [StrandNews::Recovered(StrandRule::NoDownWorker)]
        );
        assert_eq!(listed(&mut m, "Running", &[("w1", VmState::Running)]), []);
    }
}
