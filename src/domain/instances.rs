//! What the autoscaler is told about a group, derived from its [`ScaleMachine`]: the target
//! size, the instances and their status, what a node or instance id resolves to, the group's
//! bounds and the operator's debug line. Pure functions of the state; the provider caches
//! their answers per state change.

use super::cluster::{ClusterSnapshot, NodeRole};
use super::machine::{Hit, LearnedNode, OpKind, Phase, ScaleMachine};
use super::nodeid::{default_provider_id, vm_id_from_provider_id};
use super::rules::{AlertScaling, blocked_reason};
use super::status::{InstanceError, InstanceState, VmActivity, placeholder_status, vm_status};

/// How many down workers the debug line names before "and N more".
const DEBUG_DOWN_NAMED: usize = 10;

/// One instance of a node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    pub id: String,
    pub state: InstanceState,
    pub error: Option<InstanceError>,
}

/// min and max: the cluster's own when CKS autoscaling is enabled on it, else the configured
/// ones (`--nodes`).
pub fn min_max(snap: Option<&ClusterSnapshot>, configured: (u32, u32)) -> (u32, u32) {
    if let Some(c) = snap
        && c.autoscaling_enabled
        && let (Some(min), Some(max)) = (c.min_size, c.max_size)
        && max > 0
        && min <= max
    {
        return (min, max);
    }
    configured
}

impl ScaleMachine {
    /// CloudStack's size, moved by what this provider requested and CloudStack has not
    /// finished, plus queued increases and instances of failed scale-ups the autoscaler has
    /// not deleted yet.
    pub fn target(&self) -> Option<u32> {
        let s = self.snap.as_ref()?;
        let size = s.snap.size;
        let mut t = i64::from(size);
        match (&self.phase, self.phase.op().map(|o| &o.kind)) {
            (_, Some(OpKind::Increase { to, .. })) => t = i64::from(size.max(*to)),
            (_, Some(OpKind::Remove { from, vm_ids, .. })) => {
                t = t.min(i64::from(*from) - vm_ids.len() as i64);
            }
            (Phase::Adopted { .. }, None) => {
                let live = s.snap.workers().filter(|v| !v.state.is_gone()).count() as i64;
                t = t.max(live);
            }
            _ => {}
        }
        t += self.queue.increase.len() as i64;
        t += self.failed.len() as i64;
        Some(u32::try_from(t.max(0)).unwrap_or(0))
    }

    /// The instance id reported for a VM: the providerID its node really carries when the
    /// autoscaler showed us one, else CloudStack's CCM default.
    pub fn instance_id(&self, vm_id: &str) -> String {
        match self.learned.get(vm_id) {
            Some(l) if !l.provider_id.is_empty() => l.provider_id.clone(),
            _ => default_provider_id(vm_id),
        }
    }

    /// Placeholder ids of requested VMs CloudStack does not list yet.
    pub fn pending_placeholders(&self) -> Vec<String> {
        let mut out = Vec::new();
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
            out.extend(placeholders[placeholders.len() - missing..].iter().cloned());
        }
        out.extend(self.queue.increase.iter().cloned());
        out
    }

    fn activity(&self, vm_id: &str) -> VmActivity {
        if let Some(f) = self
            .failed
            .iter()
            .find(|f| f.vm_id.as_deref() == Some(vm_id))
        {
            return VmActivity::CreateFailed(f.error.clone());
        }
        match self.phase.op().map(|o| &o.kind) {
            Some(OpKind::Remove { vm_ids, .. }) if vm_ids.iter().any(|v| v == vm_id) => {
                VmActivity::BeingRemoved
            }
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
        for vm in s.snap.workers() {
            let (state, error) = vm_status(vm, &self.activity(&vm.id));
            out.push(InstanceView {
                id: self.instance_id(&vm.id),
                state,
                error,
            });
        }
        for id in pending {
            let (state, error) = placeholder_status(None);
            out.push(InstanceView {
                id: id.clone(),
                state,
                error,
            });
        }
        for f in self.failed.iter().filter(|f| f.vm_id.is_none()) {
            let (state, error) = placeholder_status(Some(&f.error));
            out.push(InstanceView {
                id: f.id.clone(),
                state,
                error,
            });
        }
        out
    }

    /// Resolves a providerID / node name to something of this group.
    pub fn resolve(&self, provider_id: &str, name: &str) -> Option<Hit> {
        self.resolve_with(provider_id, name, &self.pending_placeholders())
    }

    /// [`ScaleMachine::resolve`] with the pending placeholders given (cached by the caller).
    pub fn resolve_with(&self, provider_id: &str, name: &str, pending: &[String]) -> Option<Hit> {
        let s = self.snap.as_ref()?;
        if !provider_id.is_empty() {
            if let Some(vm_id) = self.learned_by_provider_id.get(provider_id)
                && let Some(&i) = s.by_id.get(vm_id)
            {
                return Some(Hit::Vm(i));
            }
            if self
                .failed
                .iter()
                .any(|f| f.vm_id.is_none() && f.id == provider_id)
            {
                return Some(Hit::FailedPlaceholder(provider_id.to_string()));
            }
            if pending.iter().any(|p| p == provider_id) {
                return Some(Hit::Pending(provider_id.to_string()));
            }
            if let Some(vm_id) = vm_id_from_provider_id(provider_id)
                && let Some(&i) = s.by_id.get(vm_id)
            {
                return Some(Hit::Vm(i));
            }
            // A providerID naming something else entirely is not ours, whatever the name.
            if provider_id.contains("://") {
                return None;
            }
        }
        if !name.is_empty() {
            if let Some(&i) = s.by_name.get(&name.to_ascii_lowercase()) {
                return Some(Hit::Vm(i));
            }
            if let Some(&i) = s.by_id.get(name) {
                return Some(Hit::Vm(i));
            }
        }
        None
    }

    /// Whether [`ScaleMachine::learn`] would change anything (so the common case, a node
    /// carrying the default providerID, changes no state).
    pub fn would_learn(&self, vm_id: &str, provider_id: &str, node_name: &str) -> bool {
        if provider_id == default_provider_id(vm_id) {
            return self.learned.contains_key(vm_id);
        }
        self.learned
            .get(vm_id)
            .is_none_or(|l| l.provider_id != provider_id || l.node_name != node_name)
    }

    /// Records the node the autoscaler showed for a VM when it differs from the default.
    /// Returns true when a non-default providerID was newly learned.
    pub fn learn(&mut self, vm_id: &str, provider_id: &str, node_name: &str) -> bool {
        if provider_id == default_provider_id(vm_id) {
            if let Some(old) = self.learned.remove(vm_id) {
                self.learned_by_provider_id.remove(&old.provider_id);
            }
            return false;
        }
        let new = LearnedNode {
            provider_id: provider_id.to_string(),
            node_name: node_name.to_string(),
        };
        if self.learned.get(vm_id) == Some(&new) {
            return false;
        }
        if let Some(old) = self.learned.insert(vm_id.to_string(), new) {
            self.learned_by_provider_id.remove(&old.provider_id);
        }
        if !provider_id.is_empty() {
            self.learned_by_provider_id
                .insert(provider_id.to_string(), vm_id.to_string());
        }
        true
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
        for vm in c.workers() {
            if vm.state.is_down() && !vm.state.is_gone() {
                down.push(format!("{} {}", vm.name, vm.state));
            }
            match vm_status(vm, &self.activity(&vm.id)).0 {
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
        if !self.failed.is_empty() {
            line.push_str(&format!(
                "; {} failed instance(s) to delete",
                self.failed.len()
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
