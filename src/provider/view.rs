//! Read-side answers, from each group's published view (`Group::read`: no lock of the
//! group's state, no CloudStack call): node groups, node → group, target size, instances and
//! their status, the debug line. The derivations are the domain's (`cks_domain::instances`);
//! this module caches them in the view they were derived from (see `Views`). Each answer is
//! limited to the caller's groups ([`Scoped`]).

use super::Cluster;
use super::alert::Alert;
use super::cluster_loop::{Change, Lesson, Work};
use super::{Error, Group, GroupView, Result, Scoped, before, now};
use crate::config::{ClusterRef, NodeGroupSpec};
use cks_cloudstack::types::ServiceOffering;
use cks_domain::cluster::ClusterSnapshot;
use cks_domain::instances::{InstanceView, min_max};
use cks_domain::machine::{Event, Hit};
use cks_domain::nodeid::FAKE_NODE_REASON_ANNOTATION;
use cks_domain::rules::AlertScaling;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A node group as the autoscaler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroupView {
    pub id: String,
    pub min: u32,
    pub max: u32,
    pub debug: String,
}

impl GroupView {
    /// The group's name for messages: the cluster's name, else what `--nodes` named it by.
    pub(crate) fn label(&self, spec: &NodeGroupSpec) -> String {
        if let Some(s) = self.scale.snapshot() {
            return s.snap.name.clone();
        }
        match (&spec.cluster, &self.scale.cluster_id) {
            (ClusterRef::Name(n), _) => n.clone(),
            (_, Some(id)) => id.clone(),
            (ClusterRef::Id(id), None) => id.clone(),
        }
    }

    /// The group's min and max: the cluster's own when CKS autoscaling is on, else `spec`'s.
    pub(crate) fn bounds(&self, spec: &NodeGroupSpec) -> (u32, u32) {
        min_max(self.scale.snapshot().map(|s| &s.snap), (spec.min, spec.max))
    }

    /// Placeholder ids of requested VMs CloudStack does not list yet (cached).
    fn pending(&self) -> &[String] {
        self.views
            .pending
            .get_or_init(|| self.scale.pending_placeholders())
    }

    /// Every instance of the group (cached).
    pub(crate) fn instances(&self) -> Arc<Vec<InstanceView>> {
        self.views
            .instances
            .get_or_init(|| Arc::new(self.scale.instances(self.pending())))
            .clone()
    }

    /// The target size, or `None` before the first snapshot (cached).
    fn target(&self) -> Option<u32> {
        *self.views.target.get_or_init(|| self.scale.target())
    }

    /// What a node or instance id resolves to (with the cached placeholders).
    fn resolve(&self, provider_id: &str, name: &str) -> Option<Hit> {
        self.scale.resolve_with(provider_id, name, self.pending())
    }

    /// The debug line (cached per state change and Alert-scaling knowledge).
    fn debug(&self, label: &str, alert: &AlertScaling) -> String {
        let build = || {
            self.scale.debug_line(
                label,
                alert,
                self.pending().len(),
                self.known.last_error.as_deref(),
            )
        };
        let (built_with, line) = self.views.debug.get_or_init(|| (alert.clone(), build()));
        if built_with == alert {
            line.clone()
        } else {
            build()
        }
    }
}

/// Group `g` as NodeGroups shows it, from its view `v`.
fn view_of(shared: &Alert, g: &Group, v: &GroupView) -> Option<NodeGroupView> {
    let alert = shared.scaling();
    let id = v.scale.cluster_id.clone()?;
    let (min, max) = v.bounds(&g.spec);
    let mut debug = v.debug(&v.label(&g.spec), &alert);
    // The learned verdict's age changes with every call: added outside the cached line.
    let verdict = shared.view();
    if let (Some(reason), Some(age), Some(recheck)) =
        (&verdict.reason, verdict.age, verdict.recheck_in)
    {
        debug.push_str(&format!(
            "; Alert scaling: unsupported by this CloudStack since {}s ago (asked again in {}s): {}",
            age.as_secs(),
            recheck.as_secs(),
            reason.replace('\n', " ")
        ));
    }
    Some(NodeGroupView {
        id,
        min,
        max,
        debug,
    })
}

impl Cluster {
    /// Teaches the group what a node report showed; in the group's loop.
    pub(crate) fn learn_here(&self, lesson: Lesson) {
        let Lesson {
            vm_id,
            node_name,
            provider_id,
            labels,
            joined,
        } = lesson;
        let mut st = self.group().lock();
        let step = st.scale.handle(
            Event::NodeReported {
                vm_id: &vm_id,
                node: &node_name,
                provider_id: provider_id.as_deref(),
                joined,
            },
            now(),
        );
        // Another report may have brought labels since this one was read.
        if labels.is_some() && st.known.sample_labels.is_none() {
            st.known.sample_labels = labels;
        }
        drop(st);
        // Its news (a node's own providerID, a failed creation's node registered) is said as
        // the loop's work, as every effect is.
        if !step.effects.is_empty() {
            self.sending(Work::Effects(step.effects));
        }
    }

    fn view(&self) -> Option<NodeGroupView> {
        let g = self.group();
        view_of(&self.p.inner.alert, g, &g.read())
    }
}

impl Scoped<'_> {
    /// Waits, until `deadline` at the latest, for every group of the caller to have a first
    /// snapshot or a first failed fetch. Right after the provider starts, NodeGroupForNode
    /// must not answer "" for a node of a served group: autoscalers 1.28 and 1.29
    /// dereference a nil group when a deletion in flight gets "" (`delete_in_batch.go`, guarded
    /// from 1.30). Once every group was tried, nothing waits.
    pub async fn first_snapshots(&self, deadline: tokio::time::Instant) {
        let tried = self.visible().into_iter().all(|gi| {
            let v = self.p.inner.groups[gi].read();
            v.scale.snapshot().is_some() || v.known.last_error.is_some()
        });
        if !tried {
            // Nothing fetched yet (no Refresh came first): fetch the caller's groups now, as a
            // Refresh would, within the deadline; a round already running is waited for, not
            // repeated. Each fetch ends in a snapshot or a recorded error.
            let _ = self.refresh_within(Some(deadline)).await;
        }
    }

    /// NodeGroups: the caller's groups whose cluster id is known.
    pub fn node_groups(&self) -> Vec<NodeGroupView> {
        self.visible()
            .into_iter()
            .filter_map(|gi| self.p.cluster(gi).view())
            .collect()
    }

    /// NodeGroupForNode: the caller's group of the worker VM this node is, or `None` (id "")
    /// for control, etcd and external nodes, nodes of no configured cluster and nodes of
    /// another client's groups. Real nodes teach the provider which providerID each VM's node
    /// carries (the caller's groups only: what another client reports never changes what a
    /// group's own autoscaler is told) and are recorded as registered, whoever reports them
    /// (see `cks_domain::registry`). Real nodes of any configured cluster's VMs, control VMs
    /// included, also tell where the caller runs (`caller`, `cks_domain::binding`).
    ///
    /// Answered from the published view, without waiting, unless the report teaches the group
    /// something (a providerID, the first labels, a failed creation's node): then the group's
    /// loop is taught (`Cluster::learn_here`) and the answer waits for it, until `deadline`
    /// at the latest, so that the reads after it (NodeGroupNodes) see what it taught.
    pub async fn node_group_for_node(
        &self,
        provider_id: &str,
        name: &str,
        labels: &HashMap<String, String>,
        annotations: &HashMap<String, String>,
        deadline: tokio::time::Instant,
    ) -> Option<NodeGroupView> {
        let fake = annotations.contains_key(FAKE_NODE_REASON_ANNOTATION);
        for (gi, g) in self.p.inner.groups.iter().enumerate() {
            // The hit indexes the view's snapshot: the answer comes from the same view.
            let Some((mut v, hit)) =
                g.look(|v| v.resolve(provider_id, name).map(|hit| (v.clone(), hit)))
            else {
                continue;
            };
            let mine = self.sees(gi);
            if let Hit::Vm(i) = hit {
                let Some(vm) = v.scale.snapshot().map(|s| &s.snap.vms[i]) else {
                    continue;
                };
                let vm_id = vm.id.clone();
                // A real node tells where the caller runs, a control VM's too (`caller`); a
                // fake one (name = providerID = instance id) was built from our own answer.
                let real = !fake && name != provider_id;
                if !v.scale.is_worker(i) {
                    self.sighted(gi, &vm_id, real);
                    return None;
                }
                // Only the caller's own groups learn from its reports: another client's report
                // of a VM must not veto that cluster's own autoscaler (a registered VM is not
                // deleted as "unregistered"). The admin address's reports teach nothing: it
                // only reads.
                let teach = mine && !fake && !name.is_empty() && !self.read_only();
                let learn = teach && v.scale.would_learn(&vm_id, provider_id, name);
                let sample = teach && !labels.is_empty() && v.known.sample_labels.is_none();
                // A VM a failed scale-up left whose node registered is a node, not a failed
                // creation (`ScaleMachine::node_registered`).
                let joined = teach && v.scale.is_failed_vm(&vm_id) && !vm.state.is_down();
                self.sighted(gi, &vm_id, real);
                if teach {
                    g.registered
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .record(&vm_id, name, provider_id, now());
                }
                if learn || sample || joined {
                    // Rare (a node with a non-default providerID, the first labelled node, the
                    // node of a failed creation): the only case where a read changes state,
                    // and the only one that waits, for the group's loop, which makes every
                    // change of the machine.
                    let lesson = Lesson {
                        vm_id,
                        node_name: name.to_string(),
                        provider_id: learn.then(|| provider_id.to_string()),
                        labels: sample.then(|| {
                            Arc::new(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                        }),
                        joined,
                    };
                    let taught = self.p.cluster(gi).change(Change::Learn(lesson));
                    // The loop makes it beside whatever it has under way. Should the deadline
                    // come first, the answer is the same group: a lesson changes how the
                    // group's instances are named and counted, never which group a node is.
                    let _ = tokio::time::timeout_at(before(deadline), taught).await;
                    // The answer is the view this change published.
                    v = g.read();
                }
            }
            if !mine {
                // Another client's node; a group of the caller's may still name the same
                // cluster.
                continue;
            }
            return view_of(&self.p.inner.alert, g, &v);
        }
        None
    }

    /// NodeGroupTargetSize. Fails only for an unknown group (or another client's) or one
    /// never fetched.
    pub fn target_size(&self, id: &str) -> Result<u32> {
        let (_, g) = self.group(id)?;
        let v = g.read();
        v.target().ok_or_else(|| Error::NoSnapshot {
            group: v.label(&g.spec),
            last_error: v.known.last_error.clone(),
            key_refused: v.known.key_refused,
        })
    }

    /// NodeGroupNodes (shared: built once per state change).
    pub fn nodes(&self, id: &str) -> Result<Arc<Vec<InstanceView>>> {
        let (_, g) = self.group(id)?;
        Ok(g.read().instances())
    }
}

/// The per-group reads of an operator's tools (metrics, the template node, tests): a caller's
/// view finds only its own groups.
impl Scoped<'_> {
    /// The worker offering last read for a group.
    pub fn worker_offering(&self, group_id: &str) -> Option<ServiceOffering> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().known.worker_offering.clone()
    }

    /// The latest snapshot of a group.
    pub fn snapshot(&self, group_id: &str) -> Option<ClusterSnapshot> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().scale.snapshot().map(|s| s.snap.clone())
    }

    /// How old a group's snapshot is.
    pub fn snapshot_age(&self, group_id: &str) -> Option<Duration> {
        let (gi, _) = self.group(group_id).ok()?;
        self.p.cluster(gi).snapshot_age_of()
    }

    /// Labels of a real worker node of the group seen through NodeGroupForNode.
    pub fn sample_labels(
        &self,
        group_id: &str,
    ) -> Option<std::collections::BTreeMap<String, String>> {
        let (_, g) = self.group(group_id).ok()?;
        g.read().known.sample_labels.as_deref().cloned()
    }
}
