//! What CloudStack can finish when it removes worker VMs, and how an accepted removal is
//! carried through CloudStack's failures: the rules the scale machine
//! (`crate::machine`) applies to its owed removals.
//!
//! CloudStack removes the VMs of a `nodeids` request one at a time, in reverse order of the
//! cluster's VM map (the order `listKubernetesClusters` lists them), drains each Running VM
//! over SSH, destroys it, and lowers `size` only at the end
//! (`KubernetesClusterScaleWorker.scaleDownKubernetesClusterSize` and
//! `removeNodesFromCluster`). A failure ends the job with the VMs already removed gone and
//! `size` unchanged: the cluster has fewer VMs than nodes, and CloudStack refuses every later
//! request (the Alert VM-count rule). So a request may hold at most one VM that needs a drain,
//! and only down VMs that CloudStack reaches after it (listed before it): if its drain fails,
//! nothing was removed yet.
//!
//! How an accepted removal is retried after CloudStack's failures is the machine's
//! (`crate::machine`'s `retry` module).

use super::cluster::ClusterSnapshot;

/// Where a removal of a VM whose node cannot be drained stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStage {
    /// No stop needed (a down VM, or a Running VM with a node to drain).
    NotNeeded,
    /// The VM runs but its drain cannot work: the shell stops it (`stopVirtualMachine`), then
    /// it is removed as a down VM, which CloudStack does not drain.
    Wanted,
    /// `stopVirtualMachine` was sent; the removal waits for the VM to show down.
    Sent,
    /// The VM cannot be stopped by this provider (the key lacks the command): the removal
    /// waits for an operator to stop it.
    Impossible,
}

/// One VM the next request may carry, as [`pick_batch`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub vm_id: &'a str,
    /// Its VM is down (not drained by CloudStack).
    pub down: bool,
}

/// The VMs of the next `nodeids` request, from the candidates in arrival order: the first
/// that needs a drain and the down VMs CloudStack reaches after it (listed before it in the
/// snapshot, since it works in reverse listing order); with none that needs a drain, every
/// down VM. Returned in listing order. Candidates not listed are left out.
pub fn pick_batch(snap: &ClusterSnapshot, candidates: &[Candidate<'_>]) -> Vec<String> {
    let position = |id: &str| snap.vms.iter().position(|v| v.id == id);
    let drained = candidates
        .iter()
        .find(|c| !c.down && position(c.vm_id).is_some());
    let limit = drained.and_then(|c| position(c.vm_id));
    let mut batch: Vec<(usize, String)> = candidates
        .iter()
        .filter(|c| c.down)
        .filter_map(|c| position(c.vm_id).map(|p| (p, c.vm_id.to_string())))
        .filter(|(p, _)| limit.is_none_or(|l| *p < l))
        .collect();
    if let (Some(c), Some(l)) = (drained, limit) {
        batch.push((l, c.vm_id.to_string()));
    }
    batch.sort();
    batch.dedup();
    batch.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClusterInput, ClusterState, VmInput, VmState};

    fn snap(vms: &[&str]) -> ClusterSnapshot {
        ClusterSnapshot::classify(ClusterInput {
            id: "cid".into(),
            name: "k".into(),
            state: ClusterState::Running,
            size: vms.len() as u32,
            min_size: None,
            max_size: None,
            autoscaling_enabled: false,
            control_nodes: 1,
            etcd_nodes: 0,
            service_offering: None,
            worker_offering: None,
            zone_id: String::new(),
            zone_name: String::new(),
            externally_managed: false,
            vms: std::iter::once("c1")
                .chain(vms.iter().copied())
                .map(|id| VmInput {
                    id: id.into(),
                    name: if id == "c1" {
                        "k-control-1".into()
                    } else {
                        format!("k-node-{id}")
                    },
                    state: VmState::Running,
                    is_external: false,
                    is_etcd: false,
                })
                .collect(),
        })
    }

    /// Candidates as (id, down) in arrival order → the request, in listing order. The VMs
    /// are listed w1..w5.
    #[test]
    fn one_drain_per_request_and_only_down_vms_reached_after_it() {
        let s = snap(&["w1", "w2", "w3", "w4", "w5"]);
        type Case<'a> = (&'a [(&'a str, bool)], &'a [&'a str]);
        let table: &[Case] = &[
            // Every Running VM needs a drain: one at a time, in arrival order.
            (&[("w2", false), ("w1", false), ("w3", false)], &["w2"]),
            // Down VMs listed before the drained one go with it (CloudStack reaches them
            // after the drain succeeded) ...
            (
                &[("w4", false), ("w1", true), ("w3", true)],
                &["w1", "w3", "w4"],
            ),
            // ... those listed after it would be removed before the drain: they wait.
            (&[("w2", false), ("w1", true), ("w5", true)], &["w1", "w2"]),
            // Only down VMs: all together, none is drained.
            (
                &[("w5", true), ("w1", true), ("w3", true)],
                &["w1", "w3", "w5"],
            ),
            // A VM no longer listed is left out.
            (&[("w9", false), ("w2", false)], &["w2"]),
            (&[], &[]),
        ];
        for (candidates, want) in table {
            let c: Vec<Candidate> = candidates
                .iter()
                .map(|(id, down)| Candidate {
                    vm_id: id,
                    down: *down,
                })
                .collect();
            assert_eq!(pick_batch(&s, &c), *want, "candidates {candidates:?}");
        }
    }
}
