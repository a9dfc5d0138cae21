//! Removals the autoscaler no longer wants. Upstream marks a node with its
//! `ToBeDeletedByClusterAutoscaler` taint before it calls DeleteNodes
//! (`core/scaledown/actuation/actuator.go`), removes the mark when a deletion fails, and a
//! restarted autoscaler removes every mark it finds (`StaticAutoscaler.cleanUpIfRequired`,
//! `utils/taints.CleanAllToBeDeleted`) without calling Cleanup first. A node that exists
//! without the mark is schedulable again and may be running new pods: its owed removal is
//! withdrawn rather than carried out. Where the shell can read the cluster's Nodes it asks
//! before each try (`removals_to_confirm`) and reports what it read (`removals_withdrawn`).

use super::ScaleMachine;
use crate::removal::StopStage;

impl ScaleMachine {
    /// Owed removals waiting in the queue whose node should still carry the autoscaler's
    /// mark: (VM id, node name). Removals whose VM this provider stopped or asked to stop are
    /// left out (withdrawn, they would leave a VM stopped that nobody starts), as are those
    /// still waiting for their caller's answer.
    pub fn removals_to_confirm(&self) -> Vec<(String, String)> {
        self.queue
            .remove
            .iter()
            .filter(|r| !r.in_window && matches!(r.stop, StopStage::NotNeeded | StopStage::Wanted))
            .map(|r| (r.vm_id.clone(), r.name.clone()))
            .collect()
    }

    /// The nodes of `vm_ids` exist without the autoscaler's mark: their removals, among
    /// [`ScaleMachine::removals_to_confirm`]'s, leave the queue, and their VMs count in the
    /// target again. Returns the VM ids withdrawn.
    pub(crate) fn removals_withdrawn(&mut self, vm_ids: &[String]) -> Vec<String> {
        let mut withdrawn = Vec::new();
        self.queue.remove.retain(|r| {
            let unwanted = vm_ids.contains(&r.vm_id)
                && !r.in_window
                && matches!(r.stop, StopStage::NotNeeded | StopStage::Wanted);
            if unwanted {
                withdrawn.push(r.vm_id.clone());
            }
            !unwanted
        });
        withdrawn
    }
}
