//! What the mock autoscaler saw: the instances of a group by state, each group as one loop
//! observed it, the other observations of a loop (nodes, the workload, templates, pods), and
//! each group's upcoming nodes as `clusterstate/clusterstate.go` `GetUpcomingNodes` counts
//! them.

use std::fmt;

use crate::autoscaler::pods::{NodeTemplate, PodSpec};
use crate::pb;
use cks_proto::instance_status::InstanceState;

/// Instances of a node group by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstanceCounts {
    /// `instanceRunning`
    pub running: usize,
    /// `instanceCreating` without an error.
    pub creating: usize,
    /// `instanceDeleting`
    pub deleting: usize,
    /// No state (`unspecified`).
    pub unspecified: usize,
    /// Any state with an errorInfo (non-empty error code).
    pub errored: usize,
}

impl InstanceCounts {
    /// Counts `instances`.
    pub fn of(instances: &[pb::Instance]) -> Self {
        let mut c = Self::default();
        for i in instances {
            let state = i.status.as_ref().map_or(0, |s| s.instance_state);
            if has_error(i) {
                c.errored += 1;
            } else if state == InstanceState::InstanceRunning as i32 {
                c.running += 1;
            } else if state == InstanceState::InstanceCreating as i32 {
                c.creating += 1;
            } else if state == InstanceState::InstanceDeleting as i32 {
                c.deleting += 1;
            } else {
                c.unspecified += 1;
            }
        }
        c
    }

    pub(super) fn add(&mut self, o: &Self) {
        self.running += o.running;
        self.creating += o.creating;
        self.deleting += o.deleting;
        self.unspecified += o.unspecified;
        self.errored += o.errored;
    }
}

impl fmt::Display for InstanceCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} running", self.running)?;
        for (n, what) in [
            (self.creating, "creating"),
            (self.deleting, "deleting"),
            (self.errored, "failed"),
            (self.unspecified, "unknown"),
        ] {
            if n > 0 {
                write!(f, " {n} {what}")?;
            }
        }
        Ok(())
    }
}

/// The client's rule: an errorInfo counts only with a non-empty error code.
pub(crate) fn has_error(i: &pb::Instance) -> bool {
    i.status
        .as_ref()
        .and_then(|s| s.error_info.as_ref())
        .is_some_and(|e| !e.error_code.is_empty())
}

/// What one loop saw of one node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupObservation {
    /// Node group id.
    pub id: String,
    /// Min size from NodeGroups.
    pub min_size: i32,
    /// Max size from NodeGroups.
    pub max_size: i32,
    /// NodeGroupTargetSize answer.
    pub target: i32,
    /// NodeGroupNodes answer by state.
    pub instances: InstanceCounts,
    /// Registered Ready nodes (not being deleted).
    pub ready: usize,
    /// Registered NotReady nodes past their startup time.
    pub unready: usize,
    /// Registered NotReady nodes still starting.
    pub not_started: usize,
    /// Registered nodes the autoscaler has asked to delete.
    pub being_deleted: usize,
    /// Instances without a node, still within the provision time.
    pub unregistered: usize,
    /// Instances without a node for longer than the provision time.
    pub long_unregistered: usize,
    /// The group is backed off after a failed scale-up.
    pub backed_off: bool,
    /// A scale-up of this group is in progress (requested, not all nodes there yet).
    pub scale_up_in_progress: bool,
}

/// Something a loop observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// Kubernetes nodes: managed ones by readiness, plus those no group claims.
    Nodes {
        /// Managed, Ready.
        ready: usize,
        /// Managed, NotReady.
        not_ready: usize,
        /// Not managed by any group (control plane, id "").
        unmanaged: usize,
    },
    /// One node group.
    Group(GroupObservation),
    /// The workload the scenario set: nodes it needs and how many are pending.
    Demand {
        /// Nodes the workload needs in total.
        needed: u32,
        /// Nodes' worth of pods that have nowhere to run.
        pending: u32,
    },
    /// The node template of a group this loop, or why it has none (such a group is no
    /// scale-up candidate).
    NodeTemplate {
        /// Node group id.
        group: String,
        /// The template, or why there is none.
        template: Result<NodeTemplate, String>,
    },
    /// Pending pods the scenario set were scheduled on a node that came after them.
    PodsScheduled {
        /// Node name.
        node: String,
        /// Pod names.
        pods: Vec<String>,
    },
    /// Pods the scenario set that have nowhere to run yet.
    PendingPods {
        /// The pods.
        pods: Vec<PodSpec>,
    },
    /// Ready nodes carrying the provider's GPU label but no GPU allocatable, counted as
    /// NotReady (the real autoscaler's GPU processor takes their drivers as still installing).
    GpuUnready {
        /// Node names.
        nodes: Vec<String>,
    },
    /// What `GetUpcomingNodes` found for one node group, once per loop that gets that far
    /// (past `fixNodeGroupSize`), for every group.
    Upcoming(UpcomingNodes),
}

/// One node group's upcoming nodes in one loop (`clusterstate.go` `GetUpcomingNodes`):
/// `target − (ready + unready + long_unregistered)`. Nodes with the ToBeDeleted taint count as
/// Deleted, in none of the three: a target that still includes one (a provider that put a
/// removed VM back) makes a phantom upcoming node, on which pending pods "fit".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpcomingNodes {
    /// Node group id.
    pub group: String,
    /// NodeGroupTargetSize answer of the loop.
    pub target: i32,
    /// Registered Ready nodes (not Deleted).
    pub ready: usize,
    /// Registered NotReady nodes past their startup time (not Deleted).
    pub unready: usize,
    /// Instances without a node for longer than the provision time.
    pub long_unregistered: usize,
    /// Registered nodes counted Deleted (tainted ToBeDeleted), outside the subtraction.
    pub deleted: usize,
    /// The upcoming nodes upstream computes (never below 0).
    pub upcoming: i32,
    /// The increase of the group's scale-up request, if it has one.
    pub requested: Option<i32>,
    /// Whether they are injected into the snapshot as template copies, so pending pods fit
    /// on them: up to 1.35 always; from 1.36 only for a group with a scale-up request and no
    /// backoff; never for a group without a node template.
    pub counted: bool,
}

impl UpcomingNodes {
    /// Upcoming nodes no scale-up request of the autoscaler accounts for (e.g. a target the
    /// provider keeps above the nodes it still has).
    pub fn phantom(&self) -> i32 {
        (self.upcoming - self.requested.unwrap_or(0)).max(0)
    }
}

impl fmt::Display for UpcomingNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} upcoming in {} (target {} - {} ready - {} unready - {} long unregistered; {} deleted",
            self.upcoming,
            self.group,
            self.target,
            self.ready,
            self.unready,
            self.long_unregistered,
            self.deleted
        )?;
        if let Some(r) = self.requested {
            write!(f, "; scale-up request +{r}")?;
        }
        let phantom = self.phantom();
        if phantom > 0 {
            write!(f, "; {phantom} phantom")?;
        }
        f.write_str(if self.counted { ")" } else { "; not counted)" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_counts_follow_the_client_rules() {
        let with = |state: i32, code: &str| pb::Instance {
            id: "i".into(),
            status: Some(pb::InstanceStatus {
                instance_state: state,
                error_info: Some(pb::InstanceErrorInfo {
                    error_code: code.into(),
                    error_message: "m".into(),
                    instance_error_class: 99,
                }),
            }),
        };
        let counts = InstanceCounts::of(&[
            with(1, ""),
            with(2, ""),
            with(2, "QUOTA"),
            with(3, ""),
            pb::Instance {
                id: "n".into(),
                status: None,
            },
        ]);
        // An errorInfo with an empty code is no error.
        assert_eq!(
            counts,
            InstanceCounts {
                running: 1,
                creating: 1,
                deleting: 1,
                unspecified: 1,
                errored: 1
            }
        );
        assert_eq!(
            counts.to_string(),
            "1 running 1 creating 1 deleting 1 failed 1 unknown"
        );
    }
}
