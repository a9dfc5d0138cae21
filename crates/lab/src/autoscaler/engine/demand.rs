//! The workload a scenario sets, turned each loop into what scale-up must find room for and
//! how many nodes scale-down must keep, with the scheduler's part: pending pods placed on the
//! nodes that became Ready after them. A stand-in for the pods upstream lists and simulates
//! (`core/static_autoscaler.go` `RunOnce`, the unschedulable pods), no upstream file of its own.

use std::collections::HashSet;

use super::{Demand, MockAutoscaler, PodDemand, Snapshot, to_u32};
use crate::autoscaler::nodes::KubeNode;
use crate::autoscaler::pods::{PodSpec, Resources, place};
use crate::autoscaler::timeline::{EventKind, Observation};

/// What scale-up has to find room for this loop.
#[derive(Debug)]
pub(super) enum Pending {
    /// Nodes' worth of pods (any template holds one).
    Nodes(u32),
    /// These pods, each checked against the templates.
    Pods(Vec<PodSpec>),
}

impl MockAutoscaler {
    /// Turns a pending demand into a total, and reports (needed, what scale-up must find room
    /// for). Pending pods are first scheduled on the nodes that came after them.
    pub(super) fn resolve_demand(&mut self, snap: &Snapshot) -> (Option<u32>, Pending) {
        let ready = to_u32(snap.ready_managed);
        let needed = match &mut self.state.demand {
            Demand::Unset => return (None, Pending::Nodes(0)),
            Demand::Pending(p) => {
                let total = ready.saturating_add(*p);
                self.state.demand = Demand::Total(total);
                total
            }
            Demand::Total(t) => *t,
            Demand::Pods(d) => {
                let scheduled = schedule_on_new_nodes(d, snap);
                let pending = d.pending.clone();
                for (node, pods) in scheduled {
                    self.rec
                        .record(EventKind::Observed(Observation::PodsScheduled {
                            node,
                            pods,
                        }));
                }
                self.rec
                    .record(EventKind::Observed(Observation::PendingPods {
                        pods: pending.clone(),
                    }));
                return (None, Pending::Pods(pending));
            }
        };
        let pending = needed.saturating_sub(ready);
        self.rec
            .record(EventKind::Observed(Observation::Demand { needed, pending }));
        (Some(needed), Pending::Nodes(pending))
    }
}

/// The scheduler's part of a pod demand: the first time, every managed Ready node is full;
/// after that, each managed Ready node not seen then takes the pending pods that fit its room
/// left (its allocatable at first), labels and taints, in name order. Returns the pods placed
/// per node.
fn schedule_on_new_nodes(d: &mut PodDemand, snap: &Snapshot) -> Vec<(String, Vec<String>)> {
    let mut ready: Vec<&KubeNode> = snap
        .groups
        .iter()
        .flat_map(|v| v.ready.iter().map(|i| &snap.nodes[*i]))
        .collect();
    ready.sort_by(|a, b| a.name.cmp(&b.name));
    let full = d
        .full
        .get_or_insert_with(|| ready.iter().map(|n| n.cache_key()).collect());
    let mut out = Vec::new();
    for node in ready {
        let key = node.cache_key();
        if full.contains(&key) {
            continue;
        }
        let room = d
            .free
            .entry(key)
            .or_insert_with(|| node.allocatable.unwrap_or(Resources::UNBOUNDED));
        let mut placed = Vec::new();
        d.pending.retain(|pod| {
            let fits = place(pod, std::slice::from_mut(room), &node.labels, &node.taints);
            if fits {
                placed.push(pod.name.clone());
            }
            !fits
        });
        if !placed.is_empty() {
            out.push((node.name.clone(), placed));
        }
    }
    let present: HashSet<String> = snap.nodes.iter().map(KubeNode::cache_key).collect();
    d.free.retain(|k, _| present.contains(k));
    out
}
