//! A group's cluster read from CloudStack and installed in its machine: the one
//! `listKubernetesClusters` read behind Refresh, the scale RPCs and the groups' loops, the
//! resolution of a cluster configured by name, and CloudStack's cluster object turned into
//! the domain's input. Kept in one place so every snapshot the machine sees went through the
//! same checks (a name resolving to one cluster no other group serves, a cluster gone).

use super::Cluster;
use super::{Error, Result, now};
use crate::config::ClusterRef;
use cks_cloudstack::types::KubernetesCluster;
use cks_domain::cluster::{
    ClusterInput, ClusterSnapshot, ClusterState, IndexedSnapshot, OfferingRef, VmInput, VmState,
};
use cks_domain::machine::{Effect, Event};
use std::sync::Arc;
use std::time::Instant;

/// A group's cluster as just fetched, and the effects the machine asked for on seeing it.
#[must_use = "the machine's effects must be run"]
pub(crate) struct Fetched {
    pub snapshot: Arc<IndexedSnapshot>,
    pub effects: Vec<Effect>,
}

/// Converts CloudStack's cluster object into the domain's input.
pub(crate) fn cluster_input(c: KubernetesCluster) -> ClusterInput {
    let offering = |id: Option<String>, name: Option<String>| {
        id.map(|id| OfferingRef {
            id,
            name: name.unwrap_or_default(),
        })
    };
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    ClusterInput {
        state: ClusterState::parse(&c.state),
        id: c.id,
        name: c.name,
        size: clamp(c.size),
        min_size: c.minsize.map(clamp),
        max_size: c.maxsize.map(clamp),
        autoscaling_enabled: c.autoscalingenabled,
        control_nodes: clamp(c.controlnodes),
        etcd_nodes: c.etcdnodes.map(clamp).unwrap_or(0),
        service_offering: offering(c.serviceofferingid, c.serviceofferingname),
        worker_offering: offering(c.workerofferingid, c.workerofferingname),
        zone_id: c.zoneid.unwrap_or_default(),
        zone_name: c.zonename.unwrap_or_default(),
        externally_managed: c
            .clustertype
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case("ExternalManaged")),
        vms: c
            .virtualmachines
            .into_iter()
            .map(|v| VmInput {
                state: VmState::parse(&v.state),
                id: v.id,
                name: v.name,
                is_external: v.isexternalnode,
                is_etcd: v.isetcdnode,
            })
            .collect(),
    }
}

impl Cluster {
    /// A cluster configured by id that the key does not list (not visible to it, or deleted):
    /// not something a retry fixes.
    async fn id_not_listed(&self, id: String) -> Error {
        let hint = self.not_listed(&ClusterRef::Id(id.clone())).await;
        Error::ClusterNotFound { cluster: id, hint }
    }

    /// What the key lists instead of a cluster it does not list, the closest first
    /// (`crate::suggest`; the listing is reused for a while, not asked on every retry).
    async fn not_listed(&self, wanted: &ClusterRef) -> String {
        let seen = self.p.inner.seen.get(&self.p.inner.cs, now()).await;
        crate::suggest::not_listed(
            wanted,
            seen.as_deref().map(Vec::as_slice),
            &super::not_listed_hint(self.p.inner.cs.project_id()),
        )
    }
}

impl Cluster {
    /// Fetches one group's cluster (one `listKubernetesClusters` call) and installs it in the
    /// machine. Returns the snapshot and what the machine asks for on seeing it (a job to
    /// find, queued work to send, removals to retry): the caller runs those, where it is seen.
    pub(crate) async fn fetch_group(&self) -> Result<Fetched> {
        let g = self.group();
        let id = g.read().scale.cluster_id.clone();
        // CloudStack's answer is at least as recent as the moment it was asked for.
        let asked = now();
        let cluster = match (id, &g.spec.cluster) {
            (Some(id), _) => match self.p.inner.cs.get_cluster(&id).await {
                Ok(Some(c)) => c,
                Err(e) if e.is_bad_project() => {
                    return Err(Error::ClusterNotFound {
                        cluster: id,
                        hint: super::bad_project_hint(self.p.inner.cs.project_id(), &e.to_string()),
                    });
                }
                // Not visible to the key, or (431: CloudStack's lookup of the id parameter
                // found no such entity) deleted: not something a retry fixes.
                Ok(None) => return Err(self.id_not_listed(id).await),
                Err(e) if e.names_no_entity() => return Err(self.id_not_listed(id).await),
                Err(e) => return Err(e.into()),
            },
            (None, ClusterRef::Name(name)) => {
                let mut found = match self.p.inner.cs.find_clusters_by_name(name).await {
                    Ok(found) => found,
                    Err(e) if e.is_bad_project() => {
                        return Err(Error::ClusterNotFound {
                            cluster: format!("named {name:?}"),
                            hint: super::bad_project_hint(
                                self.p.inner.cs.project_id(),
                                &e.to_string(),
                            ),
                        });
                    }
                    Err(e) => return Err(e.into()),
                };
                found.retain(|c| c.name == *name);
                match found.len() {
                    1 => {
                        let cluster = found.remove(0);
                        if let Some(other) = self.serving_elsewhere(&cluster.id) {
                            return Err(Error::DuplicateCluster {
                                name: name.clone(),
                                id: cluster.id,
                                other,
                            });
                        }
                        cluster
                    }
                    0 => {
                        return Err(Error::ClusterNotFound {
                            cluster: format!("named {name:?}"),
                            hint: self.not_listed(&g.spec.cluster).await,
                        });
                    }
                    count => {
                        return Err(Error::AmbiguousName {
                            name: name.clone(),
                            count,
                        });
                    }
                }
            }
            (None, ClusterRef::Id(id)) => {
                return Err(Error::Internal(format!("cluster id {id} not resolved")));
            }
        };
        // Before the snapshot sends owed removals again: those the autoscaler withdrew go;
        // and before it sends a queued scale-up: suspected cordons the Nodes disprove go.
        self.withdraw_unmarked().await;
        self.lift_disproved_cordons().await;
        let (snapshot, effects) = self.install_snapshot(cluster, asked);
        Ok(Fetched { snapshot, effects })
    }

    /// Where the cluster's Nodes can be read (`--confirm-node-marks`): owed removals whose
    /// Node exists without the autoscaler's `ToBeDeletedByClusterAutoscaler` mark are
    /// withdrawn (a restarted autoscaler removed the marks, and the node may run new pods).
    /// A Node that cannot be read keeps its removal: the promise stands.
    async fn withdraw_unmarked(&self) {
        let Some(nodes) = &self.p.inner.nodes else {
            return;
        };
        let g = self.group();
        let to_confirm = g.read().scale.removals_to_confirm();
        // An absent Node (a kubelet that never joined: the autoscaler removes such VMs
        // through fake nodes, which carry no mark) keeps its removal.
        let (unmarked, unread) =
            vms_whose_node(nodes, to_confirm, |n| n.is_some_and(|n| !n.marked)).await;
        for (node, e) in unread {
            tracing::warn!(group = %self.label(), node = %node, error = %e,
                "could not read the node the removal is owed for: the removal stands");
        }
        if unmarked.is_empty() {
            return;
        }
        self.tell(Event::MarksGone(&unmarked)).await;
    }

    /// Where the cluster's Nodes can be read: nodes suspected of a cordon a failed drain left
    /// (`ScaleMachine::cordon_suspects`) that CloudStack counts Ready now are suspected no
    /// more (an operator uncordoned them, or the drain had not cordoned them), so a scale-up
    /// is not held for them. A Node that cannot be read, or is absent, keeps the suspicion.
    async fn lift_disproved_cordons(&self) {
        let Some(nodes) = &self.p.inner.nodes else {
            return;
        };
        let g = self.group();
        let asked = now();
        let to_check = g.read().scale.cordons_to_check();
        let (ready, unread) =
            vms_whose_node(nodes, to_check, |n| n.is_some_and(|n| n.counted_ready)).await;
        for (node, e) in unread {
            tracing::debug!(group = %self.label(), node = %node, error = %e,
                "could not read a node suspected of a cordon: still suspected");
        }
        if ready.is_empty() {
            return;
        }
        tracing::info!(group = %self.label(), vms = ?ready,
            "nodes a failed drain may have cordoned are Ready and schedulable: scale-ups are no longer held for them");
        self.tell(Event::NodesReady {
            vm_ids: &ready,
            asked,
        })
        .await;
    }

    /// [`Cluster::fetch_group`], then what the machine asked for on seeing the snapshot.
    pub(crate) async fn fetch_and_act(&self) -> Result<Arc<IndexedSnapshot>> {
        let fetched = self.fetch_group().await?;
        self.run_effects(fetched.effects).await;
        Ok(fetched.snapshot)
    }

    /// Installs a freshly fetched cluster as the group's snapshot; returns it and the effects
    /// the machine asks for.
    fn install_snapshot(
        &self,
        cluster: KubernetesCluster,
        asked: Instant,
    ) -> (Arc<IndexedSnapshot>, Vec<Effect>) {
        let g = self.group();
        let snap = ClusterSnapshot::classify(cluster_input(cluster));
        if let Some(w) = &snap.classification_warning {
            tracing::error!(cluster = %snap.name, "{w}");
        }
        let indexed = Arc::new(IndexedSnapshot::new(snap, now()).asked_at(asked));
        let alert = self.p.inner.alert.scaling();
        let effects = {
            let mut st = g.lock();
            st.known.last_error = None;
            st.known.key_refused = false;
            st.scale
                .handle(
                    Event::Listed {
                        snap: indexed.clone(),
                        alert: &alert,
                    },
                    now(),
                )
                .effects
        };
        super::refresh::snapshot_arrived(&g.refresh);
        super::update_ready(&self.p.inner);
        (indexed, effects)
    }

    /// The label of another group serving cluster `id` (resolved to it, or configured by it).
    fn serving_elsewhere(&self, id: &str) -> Option<String> {
        (0..self.p.inner.groups.len())
            .filter(|&o| o != self.gi)
            .find_map(|o| {
                let g = &self.p.inner.groups[o];
                let resolved = g.read().scale.cluster_id.clone();
                let configured = match &g.spec.cluster {
                    ClusterRef::Id(c) => Some(c.clone()),
                    ClusterRef::Name(_) => None,
                };
                [resolved, configured]
                    .into_iter()
                    .flatten()
                    .any(|c| c.eq_ignore_ascii_case(id))
                    .then(|| self.p.inner.groups[o].label())
            })
    }
}

/// Of `(VM id, node name)` pairs, the VMs whose Node, read through the Kubernetes API,
/// satisfies `wanted` (`None`: no such Node); apart, the nodes that could not be read.
async fn vms_whose_node(
    nodes: &crate::kube::KubeClient,
    pairs: Vec<(String, String)>,
    wanted: impl Fn(Option<crate::kube::NodeFacts>) -> bool,
) -> (Vec<String>, Vec<(String, crate::kube::KubeError)>) {
    let (mut vms, mut unread) = (Vec::new(), Vec::new());
    for (vm, node) in pairs {
        match nodes.node(&node).await {
            Ok(facts) if wanted(facts) => vms.push(vm),
            Ok(_) => {}
            Err(e) => unread.push((node, e)),
        }
    }
    (vms, unread)
}
