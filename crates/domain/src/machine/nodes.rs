//! What a node or instance id names in the group ([`Hit`]: a VM, a pending placeholder, a
//! failed one), and the node↔VM pairings learned from NodeGroupForNode, so a node carrying
//! another providerID than CloudStack's default still resolves to its VM.

use super::ScaleMachine;
use crate::nodeid::{default_provider_id, vm_id_from_provider_id};

/// A node↔VM pairing learned from NodeGroupForNode: the node the autoscaler sees for a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedNode {
    pub provider_id: String,
    pub node_name: String,
}

impl ScaleMachine {
    /// The instance id reported for a VM: the providerID its node really carries when the
    /// autoscaler showed us one, else CloudStack's CCM default.
    pub(crate) fn instance_id(&self, vm_id: &str) -> String {
        match self.learned.get(vm_id) {
            Some(l) if !l.provider_id.is_empty() => l.provider_id.clone(),
            _ => default_provider_id(vm_id),
        }
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
    pub(crate) fn learn(&mut self, vm_id: &str, provider_id: &str, node_name: &str) -> bool {
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
}

/// What a node or instance id resolves to within a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hit {
    /// Index into the snapshot's VMs.
    Vm(usize),
    /// A placeholder of an in-flight or queued scale-up.
    Pending(String),
    /// An instance of a failed scale-up without a VM.
    FailedPlaceholder(String),
}
