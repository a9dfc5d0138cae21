//! apache/cloudstack#12633 (open; reported on 4.22, and 4.21's scale worker takes the same
//! path): a scale-up of a cluster with an external node fails. `scaleUpKubernetesClusterSize`
//! creates and starts the new VMs, then rewrites the SSH firewall range and port forwards of
//! the cluster's network over its VMs, external nodes included; on an isolated (or VPC)
//! network that fails, the job ends "unable to update network rules", the cluster goes to
//! Alert, the new VMs stay and the size is not raised: a stranded cluster an operator must
//! clean up. On a shared network CloudStack touches no rules
//! (`scaleKubernetesClusterNetworkRules`: `isDirectAccess`). The listing does not say which
//! network kind a cluster runs on, so a scale-up of a cluster that lists an external node is
//! refused before any promise unless the operator says its network needs no rules
//! (`--external-node-scale-up=allow`); a failure seen then is remembered.

use super::error::ScaleError;
use super::{OpKind, ScaleMachine};
use crate::cluster::{ClusterSnapshot, NodeRole};
use crate::rules::Refusal;

/// What the operator said of scale-ups of a cluster with external nodes, and what was seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum ExternalScaleUp {
    /// Refused while the cluster lists an external node (the default).
    #[default]
    Refuse,
    /// Sent; the cluster's network needs no rules (or CloudStack has the fix).
    Allow,
    /// Sent, and CloudStack failed one on its network rules with this text: refused again
    /// until the cluster lists no external node.
    Failed(String),
}

/// Whether a failed job's text is the scale worker failing on the cluster's network rules.
fn is_network_rules_failure(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("unable to update network rules")
}

fn external_nodes(s: &ClusterSnapshot) -> Vec<String> {
    s.vms
        .iter()
        .filter(|v| v.role == NodeRole::External)
        .map(|v| v.name.clone())
        .collect()
}

impl ScaleMachine {
    /// What the operator chose (`--external-node-scale-up`): `true` sends scale-ups of a
    /// cluster with external nodes.
    pub fn set_external_scale_up_allowed(&mut self, allowed: bool) {
        self.external_scale_up = if allowed {
            ExternalScaleUp::Allow
        } else {
            ExternalScaleUp::Refuse
        };
    }

    /// A size job of this provider failed: remember it when it is #12633's failure.
    pub(super) fn learn_external_scale_up_failed(&mut self, kind: Option<&OpKind>, text: &str) {
        let has_external = self
            .snap
            .as_ref()
            .is_some_and(|s| !external_nodes(&s.snap).is_empty());
        if matches!(kind, Some(OpKind::Increase { .. }))
            && has_external
            && is_network_rules_failure(text)
        {
            self.external_scale_up = ExternalScaleUp::Failed(text.to_string());
        }
    }

    /// A listing without external nodes ends what a failure taught.
    pub(super) fn recheck_external_scale_up(&mut self, s: &ClusterSnapshot) {
        if matches!(self.external_scale_up, ExternalScaleUp::Failed(_))
            && external_nodes(s).is_empty()
        {
            self.external_scale_up = ExternalScaleUp::Allow;
        }
    }

    /// Refuses a scale-up CloudStack would fail on its network rules, before any promise.
    pub(super) fn refuse_external_scale_up(&self) -> Result<(), ScaleError> {
        let Some(snap) = &self.snap else {
            return Ok(());
        };
        let external = external_nodes(&snap.snap);
        if external.is_empty() {
            return Ok(());
        }
        let cloudstack_error = match &self.external_scale_up {
            ExternalScaleUp::Allow => return Ok(()),
            ExternalScaleUp::Refuse => None,
            ExternalScaleUp::Failed(text) => Some(text.clone()),
        };
        Err(ScaleError::Refused(Refusal::ExternalNodeScaleUp {
            cluster: snap.snap.name.clone(),
            external,
            cloudstack_error,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::events::JobEnd;
    use super::super::increase::{Admission, Started};
    use super::super::{IndexedSnapshot, Timings};
    use super::*;
    use crate::cluster::VmState;
    use crate::cluster::fixtures::ClusterBuilder;
    use crate::rules::{AlertScaling, ScaleRequest};
    use std::sync::Arc;
    use std::time::Instant;

    const ALERT: AlertScaling = AlertScaling::Supported;

    fn snap(externals: usize, t: Instant) -> Arc<IndexedSnapshot> {
        let mut b = ClusterBuilder::healthy("k", 1, 2);
        for _ in 0..externals {
            b = b.external(VmState::Running);
        }
        Arc::new(IndexedSnapshot::new(b.build(), t))
    }

    fn machine(externals: usize, allowed: bool, t: Instant) -> ScaleMachine {
        let mut m = ScaleMachine::new(Some("k-id".into()), Timings::default());
        m.set_external_scale_up_allowed(allowed);
        m.snapshot_installed(snap(externals, t), &ALERT, t);
        m
    }

    fn refusal(r: Result<Admission, ScaleError>) -> Option<Refusal> {
        match r {
            Err(ScaleError::Refused(r @ Refusal::ExternalNodeScaleUp { .. })) => Some(r),
            _ => None,
        }
    }

    #[test]
    fn a_scale_up_of_a_cluster_with_external_nodes_is_refused_unless_allowed() {
        let t = Instant::now();
        let mut m = machine(1, false, t);
        let r = refusal(m.admit_increase(1, 10, &ALERT)).expect("refused");
        assert_eq!(r.rule(), "external_node_scale_up");
        let text = r.to_string();
        assert!(text.contains("ext-1") && text.contains("#12633"), "{text}");
        assert!(matches!(
            m.start_increase(1, 10, &ALERT, t),
            Err(ScaleError::Refused(Refusal::ExternalNodeScaleUp { .. }))
        ));
        // Without external nodes, or allowed: sent.
        let mut m = machine(0, false, t);
        assert_eq!(
            m.admit_increase(1, 10, &ALERT),
            Ok(Admission::NeedsFreshSnapshot)
        );
        let mut m = machine(2, true, t);
        assert_eq!(
            m.admit_increase(1, 10, &ALERT),
            Ok(Admission::NeedsFreshSnapshot)
        );
        // The size sent counts the external nodes (CloudStack's size does).
        assert_eq!(
            m.start_increase(1, 10, &ALERT, t),
            Ok(Started::Submit(ScaleRequest::Resize { new_size: 5 }))
        );
    }

    #[test]
    fn a_failure_on_the_network_rules_is_remembered_until_no_external_node_is_listed() {
        let t = Instant::now();
        let mut m = machine(1, true, t);
        m.admit_increase(1, 10, &ALERT).expect("allowed");
        m.start_increase(1, 10, &ALERT, t).expect("sent");
        m.submission_answered("job-1".into(), t);
        let text = "Scaling failed for Kubernetes cluster : k, unable to update network rules";
        let end = JobEnd::Failed {
            code: 530,
            text: text.into(),
        };
        m.job_finished("job-1", &end, true, true, &ALERT, t)
            .expect("our job");
        let r = refusal(m.admit_increase(1, 10, &ALERT)).expect("refused after the failure");
        assert!(r.to_string().contains(text), "{r}");
        // The same listing again: still refused; none with external nodes: allowed again.
        m.snapshot_installed(snap(1, t), &ALERT, t);
        assert!(refusal(m.admit_increase(1, 10, &ALERT)).is_some());
        m.snapshot_installed(snap(0, t), &ALERT, t);
        assert_eq!(
            m.admit_increase(1, 10, &ALERT),
            Ok(Admission::NeedsFreshSnapshot)
        );
        // Another failure teaches nothing of the kind.
        let mut m = machine(1, true, t);
        m.admit_increase(1, 10, &ALERT).expect("allowed");
        m.start_increase(1, 10, &ALERT, t).expect("sent");
        m.submission_answered("job-1".into(), t);
        let end = JobEnd::Failed {
            code: 530,
            text: "insufficient capacity".into(),
        };
        m.job_finished("job-1", &end, true, true, &ALERT, t);
        assert_eq!(
            m.admit_increase(1, 10, &ALERT),
            Ok(Admission::NeedsFreshSnapshot)
        );
    }
}
