//! Nodes a failed drain may have left cordoned. CloudStack drains a worker before it
//! removes it (`kubectl drain`, which cordons first) and does not uncordon it when the drain
//! fails; its scale-up then waits for a Ready count a cordoned node never joins, times out
//! and keeps its VMs (`KubernetesClusterScaleWorker`). The provider suspects the nodes it had
//! CloudStack drain until it learns otherwise: from CloudStack's status scanner
//! (`events`), or, where the shell can read the cluster's Nodes, from the Node itself.

use super::{Phase, ScaleMachine};
use std::time::Instant;

impl ScaleMachine {
    /// Running VMs whose nodes a failed drain may have left cordoned: VMs this provider asked
    /// CloudStack to remove (so to drain) whose removal failed on their drain or whose outcome
    /// was not seen, still listed and not down. CloudStack's scale-up waits for every node to
    /// be counted Ready and a cordoned node is not (`KubernetesClusterScaleWorker`, the ready
    /// count of `kubectl get nodes`): a scale-up sent now would time out and leave its VMs,
    /// stranding the cluster, whether the cluster is listed Alert or Running (a removal job's
    /// success lists it Running whatever its cordons). Empty once CloudStack's status scanner
    /// moved the cluster from Alert to Running (it counts every node Ready then), a
    /// scale-up of this provider succeeded, or the node was read counted Ready
    /// ([`ScaleMachine::nodes_counted_ready`]).
    pub(crate) fn cordon_suspects(&self) -> Vec<String> {
        let Some(snap) = &self.snap else {
            return Vec::new();
        };
        let mut out: Vec<String> = self
            .drain_sent
            .iter()
            .filter_map(|id| snap.snap.vm(id))
            .filter(|vm| !vm.state.is_down() && !vm.state.is_gone())
            .map(|vm| vm.name.clone())
            .collect();
        out.sort();
        out
    }
}

impl ScaleMachine {
    /// Suspects whose Node the shell may read to lift the suspicion: (VM id, node name). Only
    /// with no job in flight: a removal running may still drain the node.
    pub fn cordons_to_check(&self) -> Vec<(String, String)> {
        let (Some(snap), Phase::Idle) = (&self.snap, &self.phase) else {
            return Vec::new();
        };
        let mut out: Vec<(String, String)> = self
            .drain_sent
            .iter()
            .filter_map(|id| snap.snap.vm(id))
            .filter(|vm| !vm.state.is_down() && !vm.state.is_gone())
            .map(|vm| (vm.id.clone(), vm.name.to_ascii_lowercase()))
            .collect();
        out.sort();
        out
    }

    /// The Nodes of `vm_ids`, read after `asked`, are counted Ready by CloudStack (Ready, not
    /// cordoned): no longer suspected. Ignored when a job began or ended since `asked` (a
    /// removal may have drained the node after it was read) or one is in flight.
    pub(crate) fn nodes_counted_ready(&mut self, vm_ids: &[String], asked: Instant) {
        if !matches!(self.phase, Phase::Idle) || self.drain_fresh_after.is_some_and(|t| asked <= t)
        {
            return;
        }
        for v in vm_ids {
            self.drain_sent.remove(v);
        }
    }
}
