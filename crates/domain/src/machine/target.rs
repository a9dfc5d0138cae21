//! The target size the autoscaler is told: every instance it can see that is not Deleting
//! (worker VMs not being removed, and a placeholder for each request CloudStack has not shown
//! yet), nothing else; and DecreaseTargetSize, which cancels only such placeholders, or writes
//! off failed creations that will never become nodes.

use super::error::ScaleError;
use super::{OpKind, ScaleMachine};
use std::collections::HashSet;

/// What DecreaseTargetSize did: cancelled `cancelled` requested nodes (all it was asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decreased {
    pub cancelled: u32,
}

impl ScaleMachine {
    /// The target size: every instance NodeGroupNodes lists that is not Deleting — worker VMs
    /// not gone and not being removed (queued or in a removal job), down ones included —
    /// plus the requests CloudStack has not shown yet, each listed as a placeholder
    /// (the in-flight increase's VMs not listed yet, queued increases, failed scale-up
    /// placeholders).
    ///
    /// This is the invariant that keeps the real core's `fixNodeGroupSize` from asking, loop
    /// after loop, to cancel capacity that exists (docs/decrease-target-size.md): the target
    /// never counts anything the autoscaler cannot see as an instance. External nodes (in
    /// CloudStack's `size`, not workers of the group) and VMs a job has not listed yet (an
    /// adopted job's size) are not counted either.
    pub fn target(&self) -> Option<u32> {
        let s = self.snap.as_ref()?;
        let removing = self.removing();
        let workers = s
            .snap
            .workers()
            .filter(|v| !v.state.is_gone() && !removing.contains(v.id.as_str()))
            .count();
        let placeholders =
            self.pending_count() + self.failed.iter().filter(|f| f.vm_id.is_none()).count();
        Some(u32::try_from(workers + placeholders).unwrap_or(u32::MAX))
    }

    /// VMs out of the target while CloudStack lists them: named by the removal in flight,
    /// queued for the next one, or written off (failed creations the autoscaler gave up on:
    /// a DeleteNodes naming one again has nothing left to do).
    pub(crate) fn removing(&self) -> HashSet<&str> {
        let mut out: HashSet<&str> = self.queue.remove.iter().map(|r| r.vm_id.as_str()).collect();
        if let Some(OpKind::Remove { vm_ids, .. }) = self.phase.op().map(|o| &o.kind) {
            out.extend(vm_ids.iter().map(String::as_str));
        }
        out.extend(self.written_off.iter().map(String::as_str));
        out
    }

    /// Placeholder ids of requested VMs CloudStack does not list yet.
    pub fn pending_placeholders(&self) -> Vec<String> {
        let mut out: Vec<String> = self.in_flight_placeholders().to_vec();
        out.extend(self.queue.increase.iter().cloned());
        out
    }

    fn pending_count(&self) -> usize {
        self.in_flight_placeholders().len() + self.queue.increase.len()
    }

    /// The in-flight increase's placeholders for VMs not listed yet.
    fn in_flight_placeholders(&self) -> &[String] {
        if let Some(s) = &self.snap
            && let Some(OpKind::Increase {
                from,
                to,
                vms_before,
                placeholders,
            }) = self.phase.op().map(|o| &o.kind)
        {
            let requested = to.saturating_sub(*from) as usize;
            let appeared = s
                .snap
                .workers()
                .filter(|v| !vms_before.contains(&v.id))
                .count();
            let missing = requested.saturating_sub(appeared).min(placeholders.len());
            return &placeholders[placeholders.len() - missing..];
        }
        &[]
    }

    /// DecreaseTargetSize: cancels `by` requested nodes that do not exist and will not be
    /// created (queued increases, then failed scale-up placeholders), then writes off failed
    /// creations (VMs a failed scale-up left, [`ScaleMachine::writable_failures`]), or, when
    /// there are fewer than `by` in all, refuses and changes nothing. After an OK the target
    /// has dropped by `by`.
    ///
    /// Existing nodes and a running job are never cancelled (cloud_provider.go:
    /// DecreaseTargetSize "doesn't permit to delete any existing node"). An OK that changed
    /// nothing would make the core's `fixNodeGroupSize` act again every loop, skipping the rest
    /// of each loop, silently; upstream's providers answer an error (docs/decrease-target-size.md).
    ///
    /// Why failed creations may be written off: upstream 1.33's `deleteCreatedNodesWithErrors`
    /// (core/static_autoscaler.go) deletes them every loop, and only logs a failure; when
    /// CloudStack refuses (it stranded the cluster, Alert rule 5) they stay, never register
    /// (clusterstate.go `expectedToRegister` is false for an instance with an error), and after
    /// max-node-provision-time `fixNodeGroupSize` asks to lower the target by them. An error
    /// there returns from RunOnce before scale-up and scale-down, every loop, until the
    /// autoscaler's health check fails and it is restarted, for ever. Written off, the VM is
    /// out of the target and listed Deleting with the operator's error: no promise is broken
    /// (the VM was never a node, no removal of it was promised) and the loop goes on.
    pub fn decrease_target(&mut self, by: u32) -> Result<Decreased, ScaleError> {
        let placeholders = self.failed.iter().filter(|f| f.vm_id.is_none()).count();
        let writable = self.writable_failures();
        let cancellable = u32::try_from(self.queue.increase.len() + placeholders + writable.len())
            .unwrap_or(u32::MAX);
        if by > cancellable {
            return Err(ScaleError::CannotDecrease {
                asked: by,
                cancellable,
                target: self.target().unwrap_or(0),
            });
        }
        let mut cancelled = 0;
        while cancelled < by && self.queue.increase.pop().is_some() {
            cancelled += 1;
        }
        while cancelled < by {
            let Some(pos) = self.failed.iter().rposition(|f| f.vm_id.is_none()) else {
                break;
            };
            self.failed.remove(pos);
            cancelled += 1;
        }
        for vm in writable {
            if cancelled >= by {
                break;
            }
            self.write_off(&vm);
            cancelled += 1;
        }
        Ok(Decreased { cancelled })
    }
}
