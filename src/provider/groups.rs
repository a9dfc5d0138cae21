//! The registry of configured groups: each group's state behind its lock, the view of it the
//! reads answer from, and the lookup of a group by node-group id as one caller may see it. It
//! owns the one way to change a group's state ([`Group::lock`]), so a change always publishes
//! a new view and tells the state file, and the one way to find a group by id
//! ([`Scoped::group`]), so another client's group is not found anywhere.
//!
//! Reads never take a group's state lock: they answer from the group's published view
//! ([`Group::read`]), an immutable value replaced, before the lock is released, by every
//! writer that changed the state. A read waits for no writer, and a read that follows a write
//! sees it.

use super::refresh::RefreshSlot;
use super::store::Store;
use super::{Caller, Error, Provider, Result, error};
use crate::config::{ClusterRef, NodeGroupSpec};
use cks_cloudstack::types::ServiceOffering;
use cks_domain::instances::InstanceView;
use cks_domain::machine::{CallId, Heard, ScaleMachine};
use cks_domain::registry::Registrations;
use cks_domain::rules::AlertScaling;
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};

/// The state of one group: the scale machine (snapshot, phase, queue, failed instances,
/// learned nodes) plus what only the shell needs.
#[derive(Debug)]
pub(crate) struct GroupState {
    /// Every decision about the group's scale operations is the machine's. Shared with the
    /// published view and copied on its first change after each publication. What is large in
    /// it is shared by the copy: the snapshot is an `Arc`, and the providerIDs learned from
    /// nodes are kept in shards behind `Arc`s, so a change costs about 0.1 µs whatever the
    /// number of workers or learned nodes, and a learn copies only the table of shards and the
    /// one it changes (6 µs at 10,000 learned, where the whole maps cost 1.4 ms:
    /// docs/benchmarks.md, "Learning the nodes' providerIDs").
    pub scale: CowArc<ScaleMachine>,
    /// What the shell knows of the group besides the machine, published with it.
    pub known: Known,
    /// Why the last removal window failed, for its callers the machine tells so
    /// ([`cks_domain::machine::Heard::WindowFailed`]).
    pub window_failure: Option<Arc<Error>>,
    /// What the machine asked for on taking over a recorded ledger (the recorded job to
    /// follow), carried out once the provider runs ([`Provider::resume_followers`]).
    pub restored: Vec<cks_domain::machine::Effect>,
}

/// A value shared between the live state and the views published from it: publishing costs a
/// pointer copy, and the value is copied (`Arc::make_mut`) only when it is changed while a
/// view still holds it, so a change of anything else copies nothing.
#[derive(Debug)]
pub(crate) struct CowArc<T>(Arc<T>);

impl<T> CowArc<T> {
    pub(crate) fn new(value: T) -> Self {
        CowArc(Arc::new(value))
    }
}

impl<T> Deref for CowArc<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for CowArc<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

/// A group's state as it was when its lock was last released by a writer that changed it:
/// what every read answers from, without the lock. Immutable; [`Group::lock`]'s guard
/// replaces it.
#[derive(Debug)]
pub(crate) struct GroupView {
    pub scale: Arc<ScaleMachine>,
    pub known: Known,
    /// Answers derived from the fields above; see [`Views`].
    pub(super) views: Views,
}

/// What the shell knows of a group besides its machine: the last fetch's error and the
/// template node's sources. Kept in the state and copied into each view it publishes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Known {
    pub last_error: Option<String>,
    /// `last_error` is CloudStack refusing the key.
    pub key_refused: bool,
    pub worker_offering: Option<ServiceOffering>,
    /// Labels of a real node of this group, copied into the template node (shared with the
    /// published view: set once, never copied on a publication).
    pub sample_labels: Option<Arc<BTreeMap<String, String>>>,
}

/// Read answers derived from a published view (instances, placeholders, the target, the debug
/// line), computed on first use from the view's own machine, never from the live state. The
/// autoscaler asks NodeGroupForNode several times per node per loop; without this each answer
/// would walk every worker VM, and a loop would cost O(workers²). A publication that left the
/// machine as it was keeps them.
#[derive(Debug, Default, Clone)]
pub(crate) struct Views {
    /// The debug line and the Alert-scaling knowledge it was built with (provider-wide, so
    /// not part of the group's state: a change of it is noticed on use).
    pub debug: OnceLock<(AlertScaling, String)>,
    pub instances: OnceLock<Arc<Vec<InstanceView>>>,
    /// Placeholder ids of requested VMs CloudStack does not list yet.
    pub pending: OnceLock<Vec<String>>,
    /// The target size (`None`: no snapshot yet).
    pub target: OnceLock<Option<u32>>,
}

impl GroupState {
    /// The view of this state, as it is now; `before`'s derived answers are kept when they
    /// still hold (the same machine, and the same last error for the debug line).
    fn view(&self, before: &GroupView) -> GroupView {
        let views = if Arc::ptr_eq(&self.scale.0, &before.scale) {
            Views {
                debug: if self.known.last_error == before.known.last_error {
                    before.views.debug.clone()
                } else {
                    OnceLock::new()
                },
                instances: before.views.instances.clone(),
                pending: before.views.pending.clone(),
                target: before.views.target.clone(),
            }
        } else {
            Views::default()
        };
        GroupView {
            views,
            ..self.first_view()
        }
    }

    /// The view of this state with nothing derived yet.
    fn first_view(&self) -> GroupView {
        GroupView {
            scale: self.scale.0.clone(),
            known: self.known.clone(),
            views: Views::default(),
        }
    }
}

pub(crate) struct Group {
    pub spec: NodeGroupSpec,
    /// The only client this group is served to (`--nodes …@CLIENT`); `None`: every client.
    pub client: Option<String>,
    /// The group's VMs whose nodes were reported registered, and when. Apart from `state`
    /// so that recording a sighting (every NodeGroupForNode) neither waits for a writer of the
    /// state nor publishes a view; taken after `state` when both are held, never the other way
    /// round.
    pub registered: Mutex<Registrations>,
    /// Has the group's loop (`cluster_loop`) poll its job now: a snapshot shows it may be over.
    pub poke: Arc<tokio::sync::Notify>,
    /// Wakes the group's loop to look at what the machine waits for now.
    pub wake: Arc<tokio::sync::Notify>,
    /// The group's refresh round in flight and when it was last asked for (`refresh`).
    pub refresh: Mutex<RefreshSlot>,
    /// Never held across an `.await`: every transition is one critical section. Only writers
    /// take it ([`Group::lock`]).
    state: Mutex<GroupState>,
    /// The view of `state` as its last writer left it ([`Group::read`]). A `RwLock` held only
    /// to copy or replace the `Arc`: readers never wait for a writer of `state`, and a
    /// publication waits only for those copies.
    published: RwLock<Arc<GroupView>>,
    /// Told of every change of `state`, so the promises it holds are recorded.
    store: Arc<Store>,
    /// The inbox of the group's loop (`cluster_loop`), started on first use.
    pub(super) inbox: OnceLock<super::cluster_loop::Inbox>,
    /// The callers told OK, by the number the machine knows them by, until the machine
    /// releases their reply ([`cks_domain::machine::Step::replies`]; `true`: recorded).
    pub(super) replies:
        Mutex<std::collections::HashMap<CallId, tokio::sync::oneshot::Sender<Heard>>>,
    /// The number of the last ledger of this group the store wrote
    /// ([`ScaleMachine::ledger_rev`]), for the group's loop to tell the machine.
    pub(super) recorded: tokio::sync::watch::Sender<u64>,
}

/// A group's state locked to change it ([`Group::lock`]). Its drop publishes what the holder
/// changed before the lock is released, so no read that starts after a write returned sees
/// the state before it.
pub(crate) struct StateGuard<'a> {
    // Declared first, so dropped first: the lock is released before `retired` is freed.
    state: MutexGuard<'a, GroupState>,
    group: &'a Group,
    /// The state was borrowed mutably: it may have changed, and a new view is published.
    changed: bool,
    /// The view the publication replaced, freed (when no read holds it) after the lock is
    /// released: a large instance list is not freed inside the critical section.
    retired: Option<Arc<GroupView>>,
}

impl Deref for StateGuard<'_> {
    type Target = GroupState;
    fn deref(&self) -> &GroupState {
        &self.state
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut GroupState {
        self.changed = true;
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if self.changed {
            self.retired = Some(self.group.publish(&self.state));
        }
        // Told after the publication, while the lock is still held: the store's writer reads
        // the published views, and one that sees this request sees this change.
        self.group.store.touch();
    }
}

impl Group {
    pub(crate) fn new(
        spec: NodeGroupSpec,
        client: Option<String>,
        registered: Registrations,
        state: GroupState,
        store: Arc<Store>,
    ) -> Self {
        let first = Arc::new(state.first_view());
        Group {
            spec,
            client,
            registered: Mutex::new(registered),
            poke: Arc::new(tokio::sync::Notify::new()),
            wake: Arc::new(tokio::sync::Notify::new()),
            refresh: Mutex::new(RefreshSlot::default()),
            state: Mutex::new(state),
            published: RwLock::new(first),
            store,
            inbox: OnceLock::new(),
            replies: Mutex::default(),
            recorded: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The state, to change it. Its guard publishes a new view when it drops, so nothing
    /// derived from the old state is served after the change.
    pub fn lock(&self) -> StateGuard<'_> {
        StateGuard {
            // A panic while holding the lock would poison it; the state itself stays
            // consistent (every change is made in one critical section), so keep serving.
            state: self.state.lock().unwrap_or_else(PoisonError::into_inner),
            group: self,
            changed: false,
            retired: None,
        }
    }

    /// The state as its last writer left it, without its lock: what every read answers from.
    pub(crate) fn read(&self) -> Arc<GroupView> {
        self.look(Arc::clone)
    }

    /// `f` of the published view, looked at in place: a read that passes over most groups
    /// (finding a group by id or by node) copies only the view it answers from. `f` is short;
    /// a publication waits for it.
    pub(crate) fn look<T>(&self, f: impl FnOnce(&Arc<GroupView>) -> T) -> T {
        f(&self
            .published
            .read()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether the group's cluster id is `id`.
    fn has_id(&self, id: &str) -> bool {
        self.look(|v| v.scale.cluster_id.as_deref() == Some(id))
    }

    /// Replaces the published view with `st`'s; returns the one replaced. Called with the
    /// state locked, so publications come in the order of the changes.
    fn publish(&self, st: &GroupState) -> Arc<GroupView> {
        let next = Arc::new(st.view(&self.read()));
        std::mem::replace(
            &mut *self
                .published
                .write()
                .unwrap_or_else(PoisonError::into_inner),
            next,
        )
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
            if self.sees(i) && g.has_id(id) {
                return Ok((i, g));
            }
        }
        let configured = self
            .visible()
            .into_iter()
            .map(|gi| p.inner.groups[gi].configured_name())
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

impl Group {
    /// A group's id for messages, or what `--nodes` named it by before it is resolved.
    fn configured_name(&self) -> String {
        match (&self.spec.cluster, self.read().scale.cluster_id.clone()) {
            (_, Some(id)) => id,
            (ClusterRef::Name(n), None) => format!("{n} (name, not resolved yet)"),
            (ClusterRef::Id(id), None) => id.clone(),
        }
    }

    /// How logs and errors name the group.
    pub(crate) fn label(&self) -> String {
        self.read().label(&self.spec)
    }
}
