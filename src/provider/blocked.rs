//! A cluster CloudStack has stranded (`cks_domain::stranded`), as the operator sees it: the
//! reading of `cks_provider_cluster_blocked`, one ERROR line per cluster when it becomes
//! stranded (and one line when it recovers), not one per refresh; and the VMs of a failed
//! scale-up whose nodes an autoscaler reported, which are nodes, not failed creations.

use super::Cluster;
use super::{Provider, now};
use cks_domain::machine::{ScaleMachine, StrandNews};
use cks_domain::stranded::Stranded;

impl Provider {
    /// Whether CloudStack has stranded the group's cluster, by its latest snapshot: the rule
    /// (Alert rule 5, VMs and nodes that differ; Alert rule 7, no worker down), the VMs
    /// involved and the operator's fix. `None` for a cluster that is not, and for an unknown
    /// group.
    pub fn cluster_blocked(&self, group_id: &str) -> Option<Stranded> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().scale.stranded()
    }

    /// The group's name for a log line, from its machine (its lock is held).
    fn group_label_of(&self, scale: &ScaleMachine) -> String {
        scale
            .snapshot()
            .map(|s| s.snap.name.clone())
            .or_else(|| scale.cluster_id.clone())
            .unwrap_or_default()
    }
}

impl Cluster {
    /// What the machine said of CloudStack stranding the cluster, for the operator: an ERROR
    /// naming the rule, the VMs and the fix, or that it no longer is.
    pub(crate) fn stranding(&self, news: StrandNews) {
        let label = self.label();
        match news {
            StrandNews::Stranded(s) => {
                tracing::error!(
                    group = %label,
                    rule = s.rule.as_str(),
                    vms = %s.vm_names().join(","),
                    "CloudStack has stranded the cluster: it refuses every scale request until an operator repairs it: {s}"
                );
            }
            StrandNews::Recovered(rule) => {
                tracing::info!(
                    group = %label,
                    rule = rule.as_str(),
                    "the cluster is no longer stranded: CloudStack accepts scale requests again"
                );
            }
        }
    }

    /// The VMs the machine reports as failed creations whose nodes an autoscaler of the group
    /// reported registered (`registry`) are nodes: the machine is told
    /// (`ScaleMachine::node_registered`). Called with the group's state locked; takes the
    /// registrations after it, the documented order.
    pub(crate) fn forget_registered_failures(&self, scale: &mut ScaleMachine) {
        let failed: Vec<String> = scale
            .failed()
            .iter()
            .filter_map(|f| f.vm_id.clone())
            .collect();
        if failed.is_empty() {
            return;
        }
        let at = now();
        let registered: Vec<String> = {
            let reg = self
                .group()
                .registered
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            failed
                .into_iter()
                .filter(|vm| reg.recent(vm, at).is_some())
                .collect()
        };
        for vm in registered {
            if scale.node_registered(&vm) {
                tracing::info!(group = %self.p.group_label_of(scale), vm = %vm,
                    "a VM the failed scale-up left has a registered node: it is a node of the group, not a failed creation");
            }
        }
    }
}
