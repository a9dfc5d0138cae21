//! A cluster CloudStack has stranded (`cks_domain::stranded`), as the operator sees it: the
//! reading of `cks_provider_cluster_blocked`, and one ERROR line per cluster when it becomes
//! stranded (and one line when it recovers), not one per refresh (`Effect::Stranding`).

use super::Cluster;
use super::Scoped;
use cks_domain::machine::StrandNews;
use cks_domain::stranded::Stranded;

impl Scoped<'_> {
    /// Whether CloudStack has stranded the group's cluster, by its latest snapshot: the rule
    /// (Alert rule 5, VMs and nodes that differ; Alert rule 7, no worker down), the VMs
    /// involved and the operator's fix. `None` for a cluster that is not, and for an unknown
    /// group.
    pub fn cluster_blocked(&self, group_id: &str) -> Option<Stranded> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().scale.stranded()
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
}
