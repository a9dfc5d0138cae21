//! apache/cloudstack#11994 (and #14122): on CloudStack 4.21 and later, a size-only scale
//! request is given the cluster's own offering for every node type
//! (`KubernetesClusterManagerImpl.createNodeTypeToServiceOfferingMap`), and the scale worker
//! "scales" each node type whose first VM runs another offering to it; on KVM, with VMs
//! running, that fails "scaling Kubernetes cluster with running VMs on hypervisor KVM is not
//! supported!" (`KubernetesClusterScaleWorker.validateKubernetesClusterScaleOfferingParameters`).
//! The listing does not show the offering each VM runs, so the provider cannot tell before the
//! first failure; after it, every size request of that cluster would fail the same way until
//! an operator changes its offerings, so it is refused before any promise.

use super::error::ScaleError;
use super::{OpKind, ScaleMachine};
use crate::cluster::ClusterSnapshot;
use crate::rules::Refusal;

/// What the failure was learned from: CloudStack's text and the cluster's offerings as listed
/// then (a change of either is the operator's fix, or a start of one: asked again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SizeScalingBroken {
    cloudstack_error: String,
    offerings: (Option<String>, Option<String>),
}

/// Whether a failed job's text is the scale worker's refusal to change a running KVM VM's
/// offering.
pub(crate) fn is_running_vm_offering_failure(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains("scaling kubernetes cluster with running vms on hypervisor")
}

fn listed_offerings(s: &ClusterSnapshot) -> (Option<String>, Option<String>) {
    (
        s.service_offering.as_ref().map(|o| o.id.clone()),
        s.worker_offering.as_ref().map(|o| o.id.clone()),
    )
}

impl ScaleMachine {
    /// A size job of this provider failed: remember it when its text is the offering failure.
    pub(super) fn learn_size_scaling_broken(&mut self, kind: Option<&OpKind>, text: &str) {
        if !matches!(kind, Some(OpKind::Increase { .. })) || !is_running_vm_offering_failure(text) {
            return;
        }
        let offerings = self
            .snap
            .as_ref()
            .map(|s| listed_offerings(&s.snap))
            .unwrap_or_default();
        self.size_broken = Some(SizeScalingBroken {
            cloudstack_error: text.to_string(),
            offerings,
        });
    }

    /// A listing whose offerings differ from those the failure was learned with: ask again.
    pub(super) fn recheck_size_scaling(&mut self, s: &ClusterSnapshot) {
        if self
            .size_broken
            .as_ref()
            .is_some_and(|b| b.offerings != listed_offerings(s))
        {
            self.size_broken = None;
        }
    }

    pub(super) fn refuse_broken_size_scaling(&self) -> Result<(), ScaleError> {
        match (&self.size_broken, &self.snap) {
            (Some(b), Some(s)) => Err(ScaleError::Refused(Refusal::SizeScalingBroken {
                cluster: s.snap.name.clone(),
                cloudstack_error: b.cloudstack_error.clone(),
            })),
            _ => Ok(()),
        }
    }
}
