//! What the mock autoscaler decided: every [`Decision`] of a loop with its reason (scale-up
//! and its backoff, unregistered and failed instances, size fixes, scale-down), with the nodes
//! scale-down removes and why. The decisions are those of the upstream functions the engine
//! follows (`core/static_autoscaler.go`, `clusterstate/clusterstate.go`,
//! `core/scaleup/orchestrator/`, `core/scaledown/`).

use std::fmt;
use std::time::Duration;

use super::secs;

/// Why scale-down removes a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleDownReason {
    /// Ready but not needed for longer than the unneeded time.
    Unneeded,
    /// NotReady for longer than the unready time.
    Unready,
}

/// A node removed by scale-down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedNode {
    /// Node name.
    pub name: String,
    /// Node providerID.
    pub provider_id: String,
    /// Why.
    pub reason: ScaleDownReason,
}

/// A decision of the loop, with its reason.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Scale a group up.
    ScaleUp {
        /// Node group id.
        group: String,
        /// Nodes requested.
        delta: i32,
        /// Pending nodes' worth of pods.
        pending: u32,
        /// Nodes already on the way.
        upcoming: u32,
    },
    /// Pending pods, but no scale-up.
    NoScaleUp {
        /// Why.
        reason: String,
    },
    /// A pending pod does not fit a group's node template, so it cannot make that group scale.
    PodDoesNotFit {
        /// Pod name.
        pod: String,
        /// Node group id.
        group: String,
        /// Every check it fails against the template (resources, selector, taints).
        reason: String,
    },
    /// A scale-up finished: every requested node is there.
    ScaleUpCompleted {
        /// Node group id.
        group: String,
    },
    /// A scale-up did not finish within the provision time; its capacity is given back.
    ScaleUpTimedOut {
        /// Node group id.
        group: String,
        /// Nodes requested and still missing.
        increase: i32,
    },
    /// A group is backed off after a failure.
    BackOff {
        /// Node group id.
        group: String,
        /// Error class (1 OutOfResources, 99 Other).
        error_class: i32,
        /// Error code (`cloudProviderError`, `timeout`, or the instance's code).
        error_code: String,
        /// Error message.
        message: String,
        /// For how long.
        duration: Duration,
    },
    /// Delete instances that never registered, with fake nodes.
    DeleteUnregistered {
        /// Node group id (from NodeGroupForNode on the fake node).
        group: String,
        /// Instance ids.
        instances: Vec<String>,
    },
    /// An unregistered instance past the provision time is kept.
    KeepUnregistered {
        /// Instance id.
        instance: String,
        /// Why.
        reason: String,
    },
    /// Delete instances whose creation failed, with fake nodes.
    DeleteCreateErrors {
        /// Node group id.
        group: String,
        /// Instance ids.
        instances: Vec<String>,
    },
    /// Give back target size no instance stands for.
    FixNodeGroupSize {
        /// Node group id.
        group: String,
        /// Registered nodes.
        registered: i32,
        /// Target size.
        target: i32,
        /// Negative delta sent.
        delta: i32,
    },
    /// Instances whose creation failed were seen while their group was not scaling up
    /// (`IsNodeGroupScalingUp`): no backoff, nothing taken off a scale-up request.
    FailedCreationsNotCounted {
        /// Node group id.
        group: String,
        /// Their error code.
        error_code: String,
        /// How many were seen failed for the first time.
        instances: u32,
    },
    /// A node became a scale-down candidate; its timer starts.
    NodeUnneeded {
        /// Node name.
        node: String,
        /// Why.
        reason: ScaleDownReason,
    },
    /// Remove nodes.
    ScaleDown {
        /// Node group id.
        group: String,
        /// The nodes.
        nodes: Vec<RemovedNode>,
    },
    /// A scale-down deletion failed: the node is untainted and stays (the next loop may
    /// pick it again; with per-group delays its group waits the delay after failure).
    ScaleDownFailed {
        /// Node group id.
        group: String,
        /// Node name.
        node: String,
        /// What failed (NodeGroupGetOptions or NodeGroupDeleteNodes, with the error).
        error: String,
    },
    /// A node due for removal is kept.
    ScaleDownBlocked {
        /// Node name.
        node: String,
        /// Why.
        reason: String,
    },
    /// No scale-down yet after a scale-up or a failed deletion.
    ScaleDownCooldown {
        /// Time left.
        remaining: Duration,
    },
    /// Too many unready nodes: the loop stops before any scaling.
    ClusterUnhealthy {
        /// Unready nodes.
        unready: usize,
        /// All nodes.
        total: usize,
    },
    /// The rest of the loop is skipped.
    SkipRestOfLoop {
        /// Why.
        reason: String,
    },
    /// A new autoscaler process, in its first loop (`cleanUpIfRequired`), removed the
    /// ToBeDeleted taint from these nodes, left by an earlier process: they are schedulable
    /// and no longer counted Deleted. Only nodes NodeGroupForNode placed in a group are
    /// cleaned.
    ToBeDeletedTaintsCleaned {
        /// Node names.
        nodes: Vec<String>,
    },
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::ScaleUp {
                group,
                delta,
                pending,
                upcoming,
            } => write!(
                f,
                "scale up {group} by {delta} ({pending} pending, {upcoming} upcoming)"
            ),
            Decision::NoScaleUp { reason } => write!(f, "no scale-up: {reason}"),
            Decision::PodDoesNotFit { pod, group, reason } => {
                write!(
                    f,
                    "pod {pod} does not fit the template of {group}: {reason}"
                )
            }
            Decision::ScaleUpCompleted { group } => write!(f, "scale-up of {group} complete"),
            Decision::ScaleUpTimedOut { group, increase } => {
                write!(f, "scale-up of {group} by {increase} timed out")
            }
            Decision::BackOff {
                group,
                error_class,
                error_code,
                message,
                duration,
            } => write!(
                f,
                "back off {group} for {} (class {error_class}, {error_code}: {message})",
                secs(*duration)
            ),
            Decision::DeleteUnregistered { group, instances } => {
                write!(f, "delete unregistered {group} [{}]", instances.join(", "))
            }
            Decision::KeepUnregistered { instance, reason } => {
                write!(f, "keep unregistered {instance}: {reason}")
            }
            Decision::DeleteCreateErrors { group, instances } => {
                write!(
                    f,
                    "delete failed instances {group} [{}]",
                    instances.join(", ")
                )
            }
            Decision::FixNodeGroupSize {
                group,
                registered,
                target,
                delta,
            } => write!(
                f,
                "fix size of {group}: {registered} registered, target {target}, delta {delta}"
            ),
            Decision::FailedCreationsNotCounted {
                group,
                error_code,
                instances,
            } => write!(
                f,
                "{instances} failed creation(s) in {group} ({error_code}) while it is not scaling up: no backoff"
            ),
            Decision::NodeUnneeded { node, reason } => write!(f, "{node} is {reason:?}"),
            Decision::ScaleDown { group, nodes } => {
                let list: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("{} ({:?})", n.name, n.reason))
                    .collect();
                write!(f, "scale down {group} [{}]", list.join(", "))
            }
            Decision::ScaleDownFailed { group, node, error } => {
                write!(f, "deleting {node} from {group} failed: {error}")
            }
            Decision::ScaleDownBlocked { node, reason } => write!(f, "keep {node}: {reason}"),
            Decision::ScaleDownCooldown { remaining } => {
                write!(f, "scale-down cooling down ({} left)", secs(*remaining))
            }
            Decision::ClusterUnhealthy { unready, total } => {
                write!(f, "cluster unhealthy: {unready} of {total} nodes unready")
            }
            Decision::SkipRestOfLoop { reason } => write!(f, "rest of loop skipped: {reason}"),
            Decision::ToBeDeletedTaintsCleaned { nodes } => {
                write!(f, "clean ToBeDeleted taints from [{}]", nodes.join(", "))
            }
        }
    }
}
