//! What the autoscaler is told about a group beyond the target size, derived from its
//! [`ScaleMachine`]: the instances and their status, the group's bounds and the operator's
//! debug line. Pure functions of the state; the provider caches their answers per state
//! change.

use super::cluster::{ClusterSnapshot, NodeRole, Vm};
use super::machine::{OpKind, Phase, ScaleMachine};
use super::removal::StopStage;
use super::rules::{AlertScaling, blocked_reason};
use super::status::{
    ErrorClass, InstanceError, InstanceState, VmActivity, placeholder_status, reported_down,
    vm_status,
};
use super::stranded::written_off_error;
use std::collections::HashSet;

/// How many down workers the debug line names before "and N more".
const DEBUG_DOWN_NAMED: usize = 10;

/// One instance of a node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    pub id: String,
    pub state: InstanceState,
    pub error: Option<InstanceError>,
    /// The autoscaler is told the VM is down ([`crate::status::reported_down`]).
    pub vm_down: bool,
}

/// min and max: the cluster's own when CKS autoscaling is enabled on it, else the configured
/// ones (`--nodes`, counted in workers of the group).
///
/// CloudStack's `minsize`/`maxsize` bound its `size`, which counts external nodes too
/// (`KubernetesClusterAddWorker.updateKubernetesCluster`); the group is the CKS-provisioned
/// workers, so its bounds are CloudStack's less the external nodes: the group never offers a
/// size CloudStack would refuse.
pub fn min_max(snap: Option<&ClusterSnapshot>, configured: (u32, u32)) -> (u32, u32) {
    if let Some(c) = snap
        && c.autoscaling_enabled
        && let (Some(min), Some(max)) = (c.min_size, c.max_size)
        && max > 0
        && min <= max
    {
        let external = c
            .vms
            .iter()
            .filter(|v| v.role == NodeRole::External)
            .count();
        let external = u32::try_from(external).unwrap_or(u32::MAX);
        return (min.saturating_sub(external), max.saturating_sub(external));
    }
    configured
}

impl ScaleMachine {
    fn activity(&self, vm: &Vm, removing: &HashSet<&str>) -> VmActivity {
        let vm_id = vm.id.as_str();
        if self.written_off.contains(vm_id) {
            return VmActivity::WrittenOff(written_off_error(vm));
        }
        if removing.contains(vm_id) {
            return match self.queue.remove.iter().find(|r| r.vm_id == vm_id) {
                Some(r) => match &r.trouble {
                    Some(t) => VmActivity::RemovalTroubled(InstanceError {
                        code: if r.abandoned {
                            "removal-abandoned"
                        } else if r.stop != StopStage::NotNeeded {
                            "removal-stopping-vm"
                        } else {
                            "removal-retrying"
                        }
                        .into(),
                        message: t.clone(),
                        class: ErrorClass::Other,
                    }),
                    None => VmActivity::BeingRemoved,
                },
                None => VmActivity::BeingRemoved,
            };
        }
        if let Some(f) = self
            .failed
            .iter()
            .find(|f| f.vm_id.as_deref() == Some(vm_id))
        {
            return VmActivity::CreateFailed(f.error.clone());
        }
        match self.phase.op().map(|o| &o.kind) {
            Some(OpKind::Increase { vms_before, .. }) if !vms_before.contains(vm_id) => {
                VmActivity::BeingCreated
            }
            _ => VmActivity::Idle,
        }
    }

    /// Every instance of the group: one per worker VM, then pending placeholders, then
    /// placeholders of failed scale-ups.
    pub fn instances(&self, pending: &[String]) -> Vec<InstanceView> {
        let Some(s) = &self.snap else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(s.snap.vms.len() + self.failed.len());
        let removing = self.removing();
        for vm in s.snap.workers() {
            let activity = self.activity(vm, &removing);
            let (state, error) = vm_status(vm, &activity);
            out.push(InstanceView {
                id: self.instance_id(&vm.id),
                state,
                error,
                vm_down: reported_down(vm, &activity),
            });
        }
        for id in pending {
            let (state, error) = placeholder_status(None);
            out.push(InstanceView {
                id: id.clone(),
                state,
                error,
                vm_down: false,
            });
        }
        for f in self.failed.iter().filter(|f| f.vm_id.is_none()) {
            let (state, error) = placeholder_status(Some(&f.error));
            out.push(InstanceView {
                id: f.id.clone(),
                state,
                error,
                vm_down: false,
            });
        }
        out
    }

    /// Whether the VM at `index` of the snapshot is a worker.
    pub fn is_worker(&self, index: usize) -> bool {
        self.snap
            .as_ref()
            .and_then(|s| s.snap.vms.get(index))
            .is_some_and(|v| v.role == NodeRole::Worker)
    }

    /// One line for an operator: name, state, size, target, workers by state, the operation
    /// in flight and why the group cannot scale, if it cannot.
    pub fn debug_line(
        &self,
        label: &str,
        alert: &AlertScaling,
        pending: usize,
        last_error: Option<&str>,
    ) -> String {
        let Some(s) = &self.snap else {
            return match last_error {
                Some(e) => format!("{label}: no CloudStack snapshot yet ({e})"),
                None => format!("{label}: no CloudStack snapshot yet"),
            };
        };
        let c = &s.snap;
        let (mut running, mut creating, mut deleting) = (0, 0, 0);
        let mut down = Vec::new();
        let removing = self.removing();
        for vm in c.workers() {
            if vm.state.is_down() && !vm.state.is_gone() {
                down.push(format!("{} {}", vm.name, vm.state));
            }
            match vm_status(vm, &self.activity(vm, &removing)).0 {
                InstanceState::Running => running += 1,
                InstanceState::Creating => creating += 1,
                InstanceState::Deleting => deleting += 1,
            }
        }
        creating += pending;
        let mut line = format!(
            "{} ({}) state={} size={} target={} workers: {} running, {} creating, {} deleting, {} down",
            c.name,
            c.id,
            c.state,
            c.size,
            self.target().unwrap_or(c.size),
            running,
            creating,
            deleting,
            down.len()
        );
        if !down.is_empty() {
            // Named up to a few: the line is sent with every NodeGroupForNode answer.
            let named = down.len().min(DEBUG_DOWN_NAMED);
            line.push_str(&format!(" [{}", down[..named].join(", ")));
            if down.len() > named {
                line.push_str(&format!(", and {} more", down.len() - named));
            }
            line.push(']');
        }
        if let Some(d) = self.phase.describe() {
            line.push_str(&format!("; {d}"));
        }
        if !self.queue.increase.is_empty() {
            line.push_str(&format!("; {} more queued", self.queue.increase.len()));
        }
        if !self.queue.remove.is_empty() {
            line.push_str(&format!("; {} removal(s) queued", self.queue.remove.len()));
        }
        if !self.failed.is_empty() {
            line.push_str(&format!(
                "; {} failed instance(s) to delete",
                self.failed.len()
            ));
        }
        let written_off = self.written_off();
        if !written_off.is_empty() {
            line.push_str(&format!(
                "; {} failed creation(s) written off, left for an operator",
                written_off.len()
            ));
        }
        if self.phase == Phase::Idle
            && let Some(r) = blocked_reason(c, alert)
        {
            line.push_str(&format!("; cannot scale: {r}"));
        }
        if let Some(w) = &c.classification_warning {
            line.push_str(&format!("; WARNING: {w}"));
        }
        if let Some(e) = last_error {
            line.push_str(&format!("; last refresh failed: {e}"));
        }
        line.replace('\n', " ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::VmState;
    use crate::cluster::fixtures::ClusterBuilder;

    #[test]
    fn cloudstack_bounds_leave_out_external_nodes() {
        let mut c = ClusterBuilder::healthy("k", 1, 3)
            .external(VmState::Running)
            .external(VmState::Stopped)
            .build();
        assert_eq!(c.size, 5);
        assert_eq!(
            min_max(Some(&c), (1, 9)),
            (1, 9),
            "autoscaling off: --nodes"
        );
        c.autoscaling_enabled = true;
        c.min_size = Some(3);
        c.max_size = Some(10);
        assert_eq!(min_max(Some(&c), (1, 9)), (1, 8));
        c.min_size = Some(1);
        assert_eq!(min_max(Some(&c), (1, 9)), (0, 8), "never below zero");
    }
}
