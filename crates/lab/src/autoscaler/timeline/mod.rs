//! The record of what the mock autoscaler saw, asked and got: every RPC with its answer and
//! latency, what each loop observed, and every decision with its reason. Tests assert on it;
//! the demo prints it.
//!
//! This file owns the [`Timeline`] itself: its entries ([`Event`], [`EventKind`]) and the
//! queries tests ask of it (calls, errors, observations, [`Timeline::phantom_upcoming_nodes`],
//! [`Timeline::longest_size_fix_streak`], ...). The records live beside it: `rpc.rs` (what it
//! asked and got), `observation.rs` (what it saw), `decision.rs` (what it decided), and
//! `summary.rs` the per-loop report ([`LoopSummary`]). It follows no upstream file (the real
//! autoscaler keeps no such record); the upstream names in it are those of the
//! `cluster-autoscaler/` code the engine follows.

mod decision;
mod observation;
mod rpc;
mod summary;

use std::fmt;
use std::time::Duration;

use super::pods::NodeTemplate;

pub use decision::{Decision, RemovedNode, ScaleDownReason};
pub(crate) use observation::has_error;
pub use observation::{GroupObservation, InstanceCounts, Observation, UpcomingNodes};
pub use rpc::{Call, Reply, Request, Rpc, RpcError};
pub use summary::LoopSummary;

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// A loop began.
    LoopStarted,
    /// An RPC of the loop.
    Call(Call),
    /// An RPC sent by a background task (scale-down deletions, the NodeGroupNodes cache
    /// refresh), recorded when a loop collects it; its `loop_no` is the loop it was sent
    /// during or after.
    BackgroundCall(Call),
    /// Something observed.
    Observed(Observation),
    /// Something decided.
    Decided(Decision),
    /// The loop stopped early.
    LoopAborted {
        /// Why.
        reason: String,
    },
    /// The loop ended.
    LoopFinished {
        /// How long it took.
        duration: Duration,
    },
    /// The autoscaler process was restarted
    /// ([`MockAutoscaler::restart`](super::MockAutoscaler::restart)): the old one exited
    /// (Cleanup with the status configmap), the new one starts with empty caches and state;
    /// its `loop_no` is the last loop of the old process.
    Restarted,
}

/// One entry of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Loop number (1-based).
    pub loop_no: u64,
    /// Time since the autoscaler was created.
    pub at: Duration,
    /// What happened.
    pub kind: EventKind,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:>9}] loop {:>3}  ", secs(self.at), self.loop_no)?;
        match &self.kind {
            EventKind::LoopStarted => f.write_str("start"),
            EventKind::Call(call) => write!(f, "call {call}"),
            EventKind::BackgroundCall(call) => write!(f, "call {call} [background]"),
            EventKind::Observed(o) => match o {
                Observation::Nodes {
                    ready,
                    not_ready,
                    unmanaged,
                } => write!(
                    f,
                    "saw nodes {ready} Ready/{not_ready} NotReady, {unmanaged} unmanaged"
                ),
                Observation::Group(g) => write!(
                    f,
                    "saw group {} target {} ({}..{}), instances {}, nodes {} ready {} unready {} starting {} deleting, {} unregistered ({} long){}{}",
                    g.id,
                    g.target,
                    g.min_size,
                    g.max_size,
                    g.instances,
                    g.ready,
                    g.unready,
                    g.not_started,
                    g.being_deleted,
                    g.unregistered + g.long_unregistered,
                    g.long_unregistered,
                    if g.backed_off { ", backed off" } else { "" },
                    if g.scale_up_in_progress {
                        ", scaling up"
                    } else {
                        ""
                    },
                ),
                Observation::Demand { needed, pending } => {
                    write!(f, "demand {needed} nodes, {pending} pending")
                }
                Observation::NodeTemplate { group, template } => match template {
                    Ok(t) => write!(f, "template of {group} {t}"),
                    Err(why) => write!(f, "no template for {group}: {why}"),
                },
                Observation::PodsScheduled { node, pods } => {
                    write!(f, "scheduled on {node}: {}", pods.join(", "))
                }
                Observation::PendingPods { pods } => {
                    let list: Vec<String> = pods.iter().map(ToString::to_string).collect();
                    write!(f, "{} pending pod(s): {}", pods.len(), list.join(", "))
                }
                Observation::GpuUnready { nodes } => {
                    write!(f, "GPU not ready yet on {}", nodes.join(", "))
                }
                Observation::Upcoming(u) => write!(f, "saw {u}"),
            },
            EventKind::Decided(d) => write!(f, "decide {d}"),
            EventKind::LoopAborted { reason } => write!(f, "ABORTED: {reason}"),
            EventKind::LoopFinished { duration } => write!(f, "end ({})", ms(*duration)),
            EventKind::Restarted => f.write_str("RESTARTED: a new autoscaler process"),
        }
    }
}

/// Everything the mock autoscaler recorded.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub(crate) events: Vec<Event>,
    pub(crate) loops: Vec<LoopSummary>,
}

impl Timeline {
    /// Every event, in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// One summary per finished loop.
    pub fn loops(&self) -> &[LoopSummary] {
        &self.loops
    }

    /// Every call, in the order recorded (a background call when a loop collected it).
    pub fn all_calls(&self) -> impl Iterator<Item = &Call> {
        self.events.iter().filter_map(|e| match &e.kind {
            EventKind::Call(c) | EventKind::BackgroundCall(c) => Some(c),
            _ => None,
        })
    }

    /// Every call of `rpc`, in order.
    pub fn calls(&self, rpc: Rpc) -> Vec<&Call> {
        self.all_calls().filter(|c| c.rpc() == rpc).collect()
    }

    /// Every call of loop `loop_no`.
    pub fn calls_in_loop(&self, loop_no: u64) -> Vec<&Call> {
        self.all_calls().filter(|c| c.loop_no == loop_no).collect()
    }

    /// Every failed call, but for the answers the client takes as "not implemented"
    /// ([`Call::is_not_implemented`]).
    pub fn errors(&self) -> Vec<&Call> {
        self.all_calls()
            .filter(|c| !c.is_ok() && !c.is_not_implemented())
            .collect()
    }

    /// Every decision with its loop number.
    pub fn decisions(&self) -> Vec<(u64, &Decision)> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Decided(d) => Some((e.loop_no, d)),
                _ => None,
            })
            .collect()
    }

    /// Every observation with its loop number.
    pub fn observations(&self) -> Vec<(u64, &Observation)> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Observed(o) => Some((e.loop_no, o)),
                _ => None,
            })
            .collect()
    }

    /// The last target size `group` reported through a successful NodeGroupTargetSize.
    pub fn last_target(&self, group: &str) -> Option<i32> {
        self.all_calls()
            .filter_map(|c| match (&c.request, &c.outcome) {
                (Request::NodeGroupTargetSize { id }, Ok(Reply::TargetSize(t))) if id == group => {
                    Some(*t)
                }
                _ => None,
            })
            .last()
    }

    /// The node templates (or why none) `group` had, with the loop number.
    pub fn templates(&self, group: &str) -> Vec<(u64, &Result<NodeTemplate, String>)> {
        self.events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Observed(Observation::NodeTemplate { group: g, template })
                    if g == group =>
                {
                    Some((e.loop_no, template))
                }
                _ => None,
            })
            .collect()
    }

    /// What `GetUpcomingNodes` found for `group`, per loop that got that far.
    pub fn upcoming_nodes(&self, group: &str) -> Vec<(u64, &UpcomingNodes)> {
        self.observations()
            .into_iter()
            .filter_map(|(n, o)| match o {
                Observation::Upcoming(u) if u.group == group => Some((n, u)),
                _ => None,
            })
            .collect()
    }

    /// Every group's upcoming nodes with a phantom ([`UpcomingNodes::phantom`]): more
    /// upcoming nodes than the group's scale-up request accounts for, with the loop number.
    pub fn phantom_upcoming_nodes(&self) -> Vec<(u64, &UpcomingNodes)> {
        self.observations()
            .into_iter()
            .filter_map(|(n, o)| match o {
                Observation::Upcoming(u) if u.phantom() > 0 => Some((n, u)),
                _ => None,
            })
            .collect()
    }

    /// The loops in which `fixNodeGroupSize` acted ([`LoopSummary::fixed_node_group_size`]).
    pub fn size_fix_loops(&self) -> Vec<u64> {
        self.loops
            .iter()
            .filter(|l| l.fixed_node_group_size())
            .map(|l| l.loop_no)
            .collect()
    }

    /// The longest run of consecutive loops in which `fixNodeGroupSize` acted: above 1, a
    /// NodeGroupDecreaseTargetSize that left the target where it was (the incorrect size
    /// keeps its first observation, so it is due again at once), each such loop skipping
    /// scale-up and scale-down.
    pub fn longest_size_fix_streak(&self) -> usize {
        let mut longest = 0;
        let mut run = 0;
        for l in &self.loops {
            if l.fixed_node_group_size() {
                run += 1;
                longest = longest.max(run);
            } else {
                run = 0;
            }
        }
        longest
    }

    /// The loop numbers after which the autoscaler process was restarted.
    pub fn restarts(&self) -> Vec<u64> {
        self.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Restarted))
            .map(|e| e.loop_no)
            .collect()
    }

    /// Loops that stopped early, with the reason.
    pub fn aborted_loops(&self) -> Vec<(u64, &str)> {
        self.loops
            .iter()
            .filter_map(|l| l.aborted.as_deref().map(|r| (l.loop_no, r)))
            .collect()
    }
}

impl fmt::Display for Timeline {
    /// The whole timeline, one event per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}
