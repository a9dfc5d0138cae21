//! Read-side answers, computed from a group's state under its lock with no CloudStack call:
//! node groups, node → group, target size, instances and their status, the debug line.

use super::{GroupState, LearnedNode, OpKind, Provider};
use crate::config::{ClusterRef, NodeGroupSpec};
use crate::domain::cluster::{NodeRole, VmState};
use crate::domain::nodeid::{
    FAKE_NODE_REASON_ANNOTATION, default_provider_id, vm_id_from_provider_id,
};
use crate::domain::rules::{AlertScaling, blocked_reason};
use crate::domain::status::{
    InstanceError, InstanceState, VmActivity, placeholder_status, vm_status,
};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::Status;

/// A node group as the autoscaler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroupView {
    pub id: String,
    pub min: u32,
    pub max: u32,
    pub debug: String,
}

/// How many down workers the debug line names before "and N more".
const DEBUG_DOWN_NAMED: usize = 10;

/// One instance of a node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    pub id: String,
    pub state: InstanceState,
    pub error: Option<InstanceError>,
}

/// What a node or instance id resolves to within a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hit {
    /// Index into the snapshot's VMs.
    Vm(usize),
    /// A placeholder of an in-flight or queued scale-up.
    Pending(String),
    /// An instance of a failed scale-up without a VM.
    FailedPlaceholder(String),
}

impl GroupState {
    /// min and max: the cluster's own when CKS autoscaling is enabled on it, else `--nodes`.
    pub(crate) fn min_max(&self, spec: &NodeGroupSpec) -> (u32, u32) {
        if let Some(s) = &self.snap {
            let c = &s.snap;
            if c.autoscaling_enabled
                && let (Some(min), Some(max)) = (c.min_size, c.max_size)
                && max > 0
                && min <= max
            {
                return (min, max);
            }
        }
        (spec.min, spec.max)
    }

    /// CloudStack's size plus what this provider requested and CloudStack has not finished,
    /// plus instances of failed scale-ups the autoscaler has not deleted yet.
    pub(crate) fn target(&self) -> Option<u32> {
        let s = self.snap.as_ref()?;
        let size = s.snap.size;
        let mut t = i64::from(size);
        if let Some(op) = &self.op {
            match &op.kind {
                OpKind::Increase { to, .. } => t = i64::from(size.max(*to)),
                OpKind::Remove { from, vm_ids } => {
                    let after = i64::from(*from) - vm_ids.len() as i64;
                    t = t.min(after);
                }
                OpKind::Adopted => {
                    let live = s.snap.workers().filter(|v| !v.state.is_gone()).count() as i64;
                    t = t.max(live);
                }
            }
        }
        t += i64::from(self.queued_increase);
        t += self.failed.len() as i64;
        Some(u32::try_from(t.max(0)).unwrap_or(0))
    }

    /// The instance id reported for a VM: the providerID its node really carries when the
    /// autoscaler showed us one, else CloudStack's CCM default.
    pub(crate) fn instance_id(&self, vm_id: &str) -> String {
        match self.learned.get(vm_id) {
            Some(l) if !l.provider_id.is_empty() => l.provider_id.clone(),
            _ => default_provider_id(vm_id),
        }
    }

    /// The group's name for messages: the cluster's name, else what `--nodes` named it by.
    pub(crate) fn label(&self, spec: &NodeGroupSpec) -> String {
        if let Some(s) = &self.snap {
            return s.snap.name.clone();
        }
        match (&spec.cluster, &self.cluster_id) {
            (ClusterRef::Name(n), _) => n.clone(),
            (_, Some(id)) => id.clone(),
            (ClusterRef::Id(id), None) => id.clone(),
        }
    }

    /// Placeholder ids of requested VMs CloudStack does not list yet (cached; see `Views`).
    fn pending_placeholders(&self) -> &[String] {
        self.views.pending.get_or_init(|| {
            let mut out = Vec::new();
            if let Some(s) = &self.snap
                && let Some(op) = &self.op
                && let OpKind::Increase {
                    from,
                    to,
                    vms_before,
                    placeholders,
                } = &op.kind
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
            out.extend(self.queued_placeholders.iter().cloned());
            out
        })
    }

    fn activity(&self, vm_id: &str) -> VmActivity {
        if let Some(f) = self
            .failed
            .iter()
            .find(|f| f.vm_id.as_deref() == Some(vm_id))
        {
            return VmActivity::CreateFailed(f.error.clone());
        }
        if let Some(op) = &self.op {
            match &op.kind {
                OpKind::Remove { vm_ids, .. } if vm_ids.iter().any(|v| v == vm_id) => {
                    return VmActivity::BeingRemoved;
                }
                OpKind::Increase { vms_before, .. } if !vms_before.contains(vm_id) => {
                    return VmActivity::BeingCreated;
                }
                _ => {}
            }
        }
        VmActivity::Idle
    }

    /// Every instance of the group: one per worker VM, plus placeholders (cached; see `Views`).
    pub(crate) fn instances(&self) -> Arc<Vec<InstanceView>> {
        self.views
            .instances
            .get_or_init(|| Arc::new(self.build_instances()))
            .clone()
    }

    fn build_instances(&self) -> Vec<InstanceView> {
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
        for id in self.pending_placeholders() {
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
    pub(crate) fn resolve(&self, provider_id: &str, name: &str) -> Option<Hit> {
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
            if self.pending_placeholders().iter().any(|p| p == provider_id) {
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

    /// Whether [`GroupState::learn`] would change anything (checked under a read lock, so
    /// that the common case, a node carrying the default providerID, keeps cached views).
    fn would_learn(&self, vm_id: &str, provider_id: &str, node_name: &str) -> bool {
        if provider_id == default_provider_id(vm_id) {
            return self.learned.contains_key(vm_id);
        }
        self.learned
            .get(vm_id)
            .is_none_or(|l| l.provider_id != provider_id || l.node_name != node_name)
    }

    /// Records the node the autoscaler showed for a VM when it differs from the default.
    fn learn(&mut self, vm_id: &str, provider_id: &str, node_name: &str) {
        let default = default_provider_id(vm_id);
        if provider_id == default {
            if let Some(old) = self.learned.remove(vm_id) {
                self.learned_by_provider_id.remove(&old.provider_id);
            }
            return;
        }
        let new = LearnedNode {
            provider_id: provider_id.to_string(),
            node_name: node_name.to_string(),
        };
        if self.learned.get(vm_id) == Some(&new) {
            return;
        }
        tracing::warn!(
            vm = vm_id,
            node = node_name,
            provider_id,
            expected = %default,
            "node carries a providerID other than CloudStack's CCM default; reporting the instance under the node's own id"
        );
        if let Some(old) = self.learned.insert(vm_id.to_string(), new) {
            self.learned_by_provider_id.remove(&old.provider_id);
        }
        if !provider_id.is_empty() {
            self.learned_by_provider_id
                .insert(provider_id.to_string(), vm_id.to_string());
        }
    }

    /// The debug line, built once per state change (see `Views`).
    pub(crate) fn debug(&self, label: &str, alert: &AlertScaling) -> String {
        let (built_with, line) = self
            .views
            .debug
            .get_or_init(|| (alert.clone(), self.debug_line(label, alert)));
        if built_with == alert {
            line.clone()
        } else {
            self.debug_line(label, alert)
        }
    }

    /// One line for an operator: name, state, size, target, workers by state, the job in
    /// flight and why the group cannot scale, if it cannot.
    pub(crate) fn debug_line(&self, label: &str, alert: &AlertScaling) -> String {
        let Some(s) = &self.snap else {
            return match &self.last_error {
                Some(e) => format!("{label}: no CloudStack snapshot yet ({e})"),
                None => format!("{label}: no CloudStack snapshot yet"),
            };
        };
        let c = &s.snap;
        let (mut running, mut creating, mut deleting) = (0, 0, 0);
        let mut down = Vec::new();
        for inst_vm in c.workers() {
            if inst_vm.state.is_down() && !inst_vm.state.is_gone() {
                down.push(format!("{} {}", inst_vm.name, inst_vm.state));
            }
            match vm_status(inst_vm, &self.activity(&inst_vm.id)).0 {
                InstanceState::Running => running += 1,
                InstanceState::Creating => creating += 1,
                InstanceState::Deleting => deleting += 1,
            }
        }
        creating += self.pending_placeholders().len();
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
        if let Some(op) = &self.op {
            let job = op.job_id.as_deref().unwrap_or("answer lost, checking");
            match &op.kind {
                OpKind::Increase { from, to, .. } => {
                    line.push_str(&format!("; scale-up {from}->{to} (job {job})"));
                }
                OpKind::Remove { vm_ids, .. } => {
                    line.push_str(&format!("; removing {} VM(s) (job {job})", vm_ids.len()));
                }
                OpKind::Adopted => line.push_str(&format!("; scale job {job} started elsewhere")),
            }
        }
        if self.queued_increase > 0 {
            line.push_str(&format!("; {} more queued", self.queued_increase));
        }
        if !self.failed.is_empty() {
            line.push_str(&format!(
                "; {} failed instance(s) to delete",
                self.failed.len()
            ));
        }
        if self.op.is_none()
            && let Some(r) = blocked_reason(c, alert)
        {
            line.push_str(&format!("; cannot scale: {r}"));
        }
        if let Some(w) = &c.classification_warning {
            line.push_str(&format!("; WARNING: {w}"));
        }
        if let Some(e) = &self.last_error {
            line.push_str(&format!("; last refresh failed: {e}"));
        }
        line.replace('\n', " ")
    }
}

impl Provider {
    fn view(&self, gi: usize) -> Option<NodeGroupView> {
        let g = &self.inner.groups[gi];
        let alert = self.alert_scaling();
        let st = g.read();
        let id = st.cluster_id.clone()?;
        let (min, max) = st.min_max(&g.spec);
        Some(NodeGroupView {
            id,
            min,
            max,
            debug: st.debug(&st.label(&g.spec), &alert),
        })
    }

    /// NodeGroups: every configured group whose cluster id is known.
    pub fn node_groups(&self) -> Vec<NodeGroupView> {
        (0..self.inner.groups.len())
            .filter_map(|gi| self.view(gi))
            .collect()
    }

    /// NodeGroupForNode: the group of the worker VM this node is, or `None` (id "") for
    /// control, etcd and external nodes and nodes of no configured cluster. Real nodes teach
    /// the provider which providerID each VM's node carries.
    pub fn node_group_for_node(
        &self,
        provider_id: &str,
        name: &str,
        labels: &HashMap<String, String>,
        annotations: &HashMap<String, String>,
    ) -> Option<NodeGroupView> {
        let fake = annotations.contains_key(FAKE_NODE_REASON_ANNOTATION);
        for (gi, g) in self.inner.groups.iter().enumerate() {
            let st = g.read();
            let Some(hit) = st.resolve(provider_id, name) else {
                continue;
            };
            if let Hit::Vm(i) = hit {
                let Some(s) = st.snap.clone() else { continue };
                let vm = &s.snap.vms[i];
                if vm.role != NodeRole::Worker {
                    return None;
                }
                let teach = !fake && !name.is_empty();
                let learn = teach && st.would_learn(&vm.id, provider_id, name);
                let sample = teach && !labels.is_empty() && st.sample_labels.is_none();
                drop(st);
                if learn || sample {
                    // Rare (a node with a non-default providerID, the first labelled node):
                    // the only case where a read changes state.
                    let mut st = g.lock();
                    if learn {
                        st.learn(&vm.id, provider_id, name);
                    }
                    if sample && st.sample_labels.is_none() {
                        st.sample_labels =
                            Some(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
                    }
                }
            } else {
                drop(st);
            }
            return self.view(gi);
        }
        None
    }

    /// NodeGroupTargetSize. Fails only for an unknown group or one never fetched.
    pub fn target_size(&self, id: &str) -> Result<u32, Status> {
        let (_, g) = self.group(id)?;
        let st = g.read();
        st.target().ok_or_else(|| {
            Status::unavailable(format!(
                "node group {}: no CloudStack snapshot yet{}",
                st.label(&g.spec),
                st.last_error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ))
        })
    }

    /// NodeGroupNodes (shared: built once per state change).
    pub fn nodes(&self, id: &str) -> Result<Arc<Vec<InstanceView>>, Status> {
        let (_, g) = self.group(id)?;
        Ok(g.read().instances())
    }

    /// Down worker VMs of a group (name, state), for the probe and metrics.
    pub fn down_workers(&self, id: &str) -> Vec<(String, VmState)> {
        let Ok((_, g)) = self.group(id) else {
            return Vec::new();
        };
        let st = g.read();
        st.snap
            .as_ref()
            .map(|s| {
                s.snap
                    .workers()
                    .filter(|v| v.state.is_down() && !v.state.is_gone())
                    .map(|v| (v.name.clone(), v.state.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}
