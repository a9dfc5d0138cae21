//! The registry of configured groups: each group's state behind its lock, the cached answers
//! derived from it, and the lookup of a group by node-group id as one caller may see it. It
//! owns the one way to change a group's state ([`Group::lock`]), so a change always drops the
//! cached views and tells the state file, and the one way to find a group by id
//! ([`Scoped::group`]), so another client's group is not found anywhere.

use super::cluster_loop::WindowOutcome;
use super::refresh::RefreshSlot;
use super::store::Store;
use super::{Caller, Error, Provider, Result, error};
use crate::config::{ClusterRef, NodeGroupSpec};
use cks_cloudstack::types::ServiceOffering;
use cks_domain::instances::InstanceView;
use cks_domain::machine::ScaleMachine;
use cks_domain::registry::Registrations;
use cks_domain::rules::AlertScaling;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The state of one group: the scale machine (snapshot, phase, queue, failed instances,
/// learned nodes) plus what only the shell needs.
#[derive(Debug)]
pub(crate) struct GroupState {
    /// Every decision about the group's scale operations is the machine's.
    pub scale: ScaleMachine,
    pub last_error: Option<String>,
    /// `last_error` is CloudStack refusing the key.
    pub key_refused: bool,
    pub worker_offering: Option<ServiceOffering>,
    /// Labels of a real node of this group, copied into the template node.
    pub sample_labels: Option<std::collections::BTreeMap<String, String>>,
    /// Answers derived from the fields above; see [`Views`].
    pub views: Views,
    /// The outcome of the open removal window, for DeleteNodes calls joining it.
    pub removal_window: Option<tokio::sync::watch::Receiver<WindowOutcome>>,
    /// What the machine asked for on taking over a recorded ledger (the recorded job to
    /// follow), carried out once the provider runs ([`Provider::resume_followers`]).
    pub restored: Vec<cks_domain::machine::Effect>,
}

/// Read answers derived from a group's state (instances, placeholders, the debug line),
/// computed on first use and dropped by every [`Group::lock`], the only way to change the
/// state. The autoscaler asks NodeGroupForNode several times per node per loop; without this
/// each answer would walk every worker VM, and a loop would cost O(workers²).
#[derive(Debug, Default)]
pub(crate) struct Views {
    /// The debug line and the Alert-scaling knowledge it was built with (provider-wide, so
    /// not part of the group's state: a change of it is noticed on use).
    pub debug: OnceLock<(AlertScaling, String)>,
    pub instances: OnceLock<Arc<Vec<InstanceView>>>,
    /// Placeholder ids of requested VMs CloudStack does not list yet.
    pub pending: OnceLock<Vec<String>>,
}

pub(crate) struct Group {
    pub spec: NodeGroupSpec,
    /// The only client this group is served to (`--nodes …@CLIENT`); `None`: every client.
    pub client: Option<String>,
    /// The group's VMs whose nodes were reported registered, and when. Apart from `state`
    /// so that recording a sighting (every NodeGroupForNode) leaves the cached views alone;
    /// taken after `state` when both are held, never the other way round.
    pub registered: Mutex<Registrations>,
    /// Has the group's loop (`cluster_loop`) poll its job now: a snapshot shows it may be over.
    pub poke: Arc<tokio::sync::Notify>,
    /// Wakes the group's loop to look at what the machine waits for now.
    pub wake: Arc<tokio::sync::Notify>,
    /// The group's refresh round in flight and when it was last asked for (`refresh`).
    pub refresh: Mutex<RefreshSlot>,
    /// Never held across an `.await`: every transition is one critical section.
    pub state: Mutex<GroupState>,
    /// Told of every change of `state`, so the promises it holds are recorded.
    pub(super) store: Arc<Store>,
    /// The inbox of the group's loop (`cluster_loop`), started on first use.
    pub(super) inbox: OnceLock<tokio::sync::mpsc::UnboundedSender<super::cluster_loop::Work>>,
}

/// Read-only access to a group's state: derived answers may be cached through it, nothing
/// else can change.
pub(crate) struct ReadGuard<'a>(MutexGuard<'a, GroupState>);

impl std::ops::Deref for ReadGuard<'_> {
    type Target = GroupState;
    fn deref(&self) -> &GroupState {
        &self.0
    }
}

impl Group {
    /// The state, to change it: drops every cached view, so nothing derived from the old state
    /// can be served after the change.
    pub fn lock(&self) -> MutexGuard<'_, GroupState> {
        let mut st = self.guard();
        st.views = Views::default();
        // Asked while the lock is held: the writer reads the state through this lock, so it
        // sees the change this caller is about to make, or looks again.
        self.store.touch();
        st
    }

    /// The state, to read it (cached views stay valid).
    pub(crate) fn read(&self) -> ReadGuard<'_> {
        ReadGuard(self.guard())
    }

    fn guard(&self) -> MutexGuard<'_, GroupState> {
        // A panic while holding the lock would poison it; the state itself stays consistent
        // (every change is made in one critical section), so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The provider as one caller sees it ([`Provider::seen_by`]): the RPCs' operations, limited to
/// the caller's groups. Any other group is not found, as one that does not exist, and nothing
/// is done to it.
#[derive(Clone, Copy)]
pub struct Scoped<'a> {
    pub(crate) p: &'a Provider,
    /// `None`: every group (the provider's own methods).
    pub(crate) caller: Option<&'a Caller>,
    /// The caller holds a `--deny-client` name: it sees no group (decided once per call, in
    /// [`Provider::seen_by`]).
    pub(crate) denied: bool,
}

impl<'a> Scoped<'a> {
    /// Whether group `gi` is the caller's (a denied caller has none).
    pub(crate) fn sees(&self, gi: usize) -> bool {
        !self.denied
            && self
                .caller
                .is_none_or(|c| c.may_see(self.p.inner.groups[gi].client.as_deref()))
    }

    /// The caller's groups, by index.
    pub(crate) fn visible(&self) -> Vec<usize> {
        (0..self.p.inner.groups.len())
            .filter(|gi| self.sees(*gi))
            .collect()
    }

    pub(crate) fn sees_any(&self) -> bool {
        (0..self.p.inner.groups.len()).any(|gi| self.sees(gi))
    }

    /// The caller's group with this node-group id (= resolved cluster id). Another caller's
    /// group is [`Error::UnknownGroup`], listing only the caller's own.
    pub(crate) fn group(&self, id: &str) -> Result<(usize, &'a Group)> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("node group id is empty".into()));
        }
        let p = self.p;
        for (i, g) in p.inner.groups.iter().enumerate() {
            if self.sees(i) && g.read().scale.cluster_id.as_deref() == Some(id) {
                return Ok((i, g));
            }
        }
        let configured = self
            .visible()
            .into_iter()
            .map(|gi| p.configured_name(gi))
            .collect::<Vec<_>>();
        Err(Error::UnknownGroup {
            id: error::echo(id),
            configured: if configured.is_empty() {
                "none for this client".to_string()
            } else {
                configured.join(", ")
            },
        })
    }

    /// Whether the caller has a node group with this id.
    pub fn has_group(&self, id: &str) -> Result<()> {
        self.group(id).map(|_| ())
    }
}

impl Provider {
    /// The group with this node-group id (= resolved cluster id).
    pub(crate) fn group(&self, id: &str) -> Result<(usize, &Group)> {
        self.all_groups().group(id)
    }

    /// A group's id for messages, or what `--nodes` named it by before it is resolved.
    fn configured_name(&self, gi: usize) -> String {
        let g = &self.inner.groups[gi];
        match (&g.spec.cluster, g.read().scale.cluster_id.clone()) {
            (_, Some(id)) => id,
            (ClusterRef::Name(n), None) => format!("{n} (name, not resolved yet)"),
            (ClusterRef::Id(id), None) => id.clone(),
        }
    }

    pub(crate) fn group_label(&self, gi: usize) -> String {
        let g = &self.inner.groups[gi];
        g.read().label(&g.spec)
    }
}
