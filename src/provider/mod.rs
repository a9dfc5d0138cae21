//! The shell around the domain core: one `Group` per configured CKS cluster holding its
//! [`ScaleMachine`], the locks, the CloudStack calls, each group's loop (`cluster_loop`) and
//! the cache of read answers. Nothing here decides: every rule about a scale operation's life is in
//! `cks_domain::machine`, which job is a cluster's in `cks_domain::jobs`, whether a snapshot
//! may still be answered from in `cks_domain::freshness`; this module feeds them events (with
//! the time, on tokio's clock so tests can pause and advance it) and carries out the effects
//! they return. What it does itself is translation: a CloudStack answer into the event it is
//! (accepted, throttled, lost, refused), a clock reading into an age.
//!
//! Reads (NodeGroups, NodeGroupForNode, NodeGroupNodes, NodeGroupTargetSize) are answered from
//! memory. Only Refresh, the scale RPCs, the keeper's rounds and the groups' loops call CloudStack.
//!
//! Callers: the gRPC layer calls through [`Provider::seen_by`], which shows each autoscaler
//! only the groups bound to it (`--nodes …@CLIENT`, `caller`); a caller never sees or
//! changes another client's group. The provider's own methods of the same names see every
//! group, for the operator's tools (metrics, demo, tests).
//!
//! Locking: each group has a `std::sync::Mutex` over its state, never held across an `.await`,
//! taken by writers only (`Group::lock`), all in the group's loop (`cluster_loop`) but for a
//! restart's ledger, taken over before any loop runs (`store`); every transition of the
//! machine is one critical section, and a submission starts only from the `Idle` phase, so at
//! most one CloudStack scale job per cluster is started at a time without any lock held while
//! CloudStack answers.
//! Reads never take it: each writer that changed the state publishes an immutable view of it
//! before it releases the lock, and reads answer from the view last published
//! (`Group::read`), so a read waits for no writer and sees every write that returned.
//!
//! This file keeps the provider's life cycle (building it, readiness) and the operator's reads;
//! each other concern has a file of its own (`groups`, `snapshot`, `effects`, `shutdown`,
//! `settings`, `refresh`, `follow`, `ops`, `view`, …), saying what it owns.

mod alert;
mod blocked;
mod caller;
mod cluster_loop;
mod effects;
mod error;
mod follow;
mod groups;
mod health;
mod keeper;
mod ops;
mod refresh;
mod settings;
mod shutdown;
mod snapshot;
mod store;
mod view;

#[cfg(test)]
mod tests;

pub use caller::{Caller, SIGHTING_WINDOW};
pub use cks_domain::instances::InstanceView;
pub use cks_domain::machine::NodeRef;
pub use cks_domain::verdict::AlertVerdictView;
pub use cluster_loop::Call;
pub use error::{Error, Reason, Result, bad_project_hint, not_listed_hint};
pub use groups::Scoped;
pub use health::Health;
pub use settings::{AlertScalingMode, ExternalNodeScaleUp, Settings};
pub use store::StateError;
pub use view::NodeGroupView;

pub(crate) use groups::{CowArc, Group, GroupState, GroupView, Known};

use crate::config::ClusterRef;
use cks_cloudstack::Client;
use cks_domain::machine::{Event, ScaleMachine, Timings};
use cks_domain::registry::Registrations;
use cks_domain::rules::AlertScaling;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub(crate) struct Inner {
    pub cs: Client,
    pub settings: Settings,
    pub groups: Vec<Group>,
    /// The Alert-scaling verdict (`alert`).
    pub alert: alert::Alert,
    /// One permit per refresh round asking CloudStack (`refresh`); FIFO, so clusters are
    /// served in the order they asked.
    pub round_permits: tokio::sync::Semaphore,
    /// Worker offerings read, shared by every group (`refresh`).
    pub offerings: tokio::sync::Mutex<refresh::OfferingCache>,
    /// The durable record of the groups' promises (`store`).
    pub store: Arc<store::Store>,
    /// Callers already logged as matching no group.
    pub unmatched: caller::Unmatched,
    /// The clusters the key lists, for the message of a cluster it does not list (`snapshot`).
    pub seen: crate::suggest::SeenCache,
    /// Where each bound caller runs, as its node reports show (`caller`).
    pub whereabouts: caller::Whereabouts,
    pub ready: watch::Sender<bool>,
    /// The number of the next caller told OK (`ops`, `ScaleMachine::reply_ok`).
    pub calls: std::sync::atomic::AtomicU64,
    /// The optional commands the key may call, each learned once from CloudStack's 432.
    pub optional: OptionalCommands,
    /// The Nodes of the one group's cluster (`Settings::node_marks`, `snapshot`).
    pub nodes: Option<crate::kube::KubeClient>,
    /// Wakes the keeper (`keeper`) when a round ends, to plan the group's next one.
    pub keeper_wake: Arc<tokio::sync::Notify>,
    /// The keeper runs: groups are refreshed without an RPC asking, and a round that never
    /// comes is the provider stuck in itself (`Health::stalled`).
    pub keeping: AtomicBool,
    /// This process's seed for the jitter of failed rounds' backoff.
    pub jitter_seed: u64,
}

/// Readiness for gRPC health: true once every group has a first snapshot.
pub(crate) fn update_ready(inner: &Inner) {
    let all = inner
        .groups
        .iter()
        .all(|g| g.read().scale.snapshot().is_some());
    inner.ready.send_if_modified(|r| {
        let changed = *r != all;
        *r = all;
        changed
    });
}

/// When a caller with `deadline` must be answered (`timing::answer_by`), on tokio's clock.
pub(crate) fn before(deadline: tokio::time::Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(cks_domain::timing::answer_by(deadline.into_std(), now()))
}

/// Now, on tokio's clock (which tests can pause and advance), as the `std` instant the domain
/// core takes.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// What the provider does without `listAsyncJobs` (said once when CloudStack refuses it, and by
/// `check`).
pub(crate) const WITHOUT_LIST_ASYNC_JOBS: &str = "scale jobs this provider did not start are followed through the cluster's state, and a request whose answer was lost is settled by the cluster's state alone";
/// What the provider does without `listServiceOfferings`.
pub(crate) const WITHOUT_LIST_SERVICE_OFFERINGS: &str = "the template node is built from a worker VM's CPUs and memory (listVirtualMachines), without the offering's root disk size, GPUs or details";
/// What the provider does without `listCapabilities`.
pub(crate) const WITHOUT_LIST_CAPABILITIES: &str = "a learned Alert-scaling verdict is re-checked after --alert-recheck only, not at once on a CloudStack upgrade";
/// What the provider does without `stopVirtualMachine`.
pub(crate) const WITHOUT_STOP_VIRTUAL_MACHINE: &str = "a node whose drain would fail (never registered, or its drain failed) is not stopped by the provider; such removals are refused before any promise, or wait for an operator to stop the VM";

/// The commands beyond the four every key CKS gives may call (`listKubernetesClusters`,
/// `scaleKubernetesCluster`, `queryAsyncJobResult`, `listVirtualMachines`): each is tried until
/// CloudStack answers 432 (not available to the account), then never again; the provider says
/// once, in one line, what it does without it.
#[derive(Debug)]
pub(crate) struct OptionalCommands {
    /// `listAsyncJobs`: adopting running jobs by id, settling lost answers by the job list.
    pub jobs: AtomicBool,
    /// `listServiceOfferings`: the template node's full offering (else a worker VM's sizes).
    pub offerings: AtomicBool,
    /// `listCapabilities`: re-checking the Alert-scaling verdict on a CloudStack upgrade.
    pub capabilities: AtomicBool,
    /// Whether `stopVirtualMachine` is allowed is known (asked once, before the first promise
    /// that needs a stop: `refresh::learn_stop_permission`); until then no machine promises a
    /// stop.
    pub stop_known: AtomicBool,
    /// A question about `stopVirtualMachine` is in flight.
    pub stop_asking: AtomicBool,
}

impl Default for OptionalCommands {
    fn default() -> Self {
        OptionalCommands {
            jobs: AtomicBool::new(true),
            offerings: AtomicBool::new(true),
            capabilities: AtomicBool::new(true),
            stop_known: AtomicBool::new(false),
            stop_asking: AtomicBool::new(false),
        }
    }
}

/// The provider. Cheap to clone.
#[derive(Clone)]
pub struct Provider {
    pub(crate) inner: Arc<Inner>,
}

impl Provider {
    /// Builds the provider; nothing is fetched yet (see [`Provider::refresh`]).
    pub fn new(cs: Client, settings: Settings) -> Self {
        let alert = match settings.alert_scaling {
            AlertScalingMode::Auto => AlertScaling::Unknown,
            AlertScalingMode::On => AlertScaling::Supported,
            AlertScalingMode::Off => AlertScaling::Unsupported {
                cloudstack_error: "configured with --alert-scaling=off".to_string(),
            },
        };
        let timings = Timings {
            failed_ttl: settings.failed_instance_ttl,
            lost_settle: cks_domain::timing::lost_settle(
                cs.request_timeout(),
                settings.job_poll_interval,
            ),
        };
        let store = Arc::new(store::Store::new(
            settings.state_file.clone(),
            settings.state_configmap.clone(),
        ));
        let groups = settings
            .groups
            .iter()
            .enumerate()
            .map(|(gi, spec)| {
                let cluster_id = match &spec.cluster {
                    ClusterRef::Id(id) => Some(id.clone()),
                    ClusterRef::Name(_) => None,
                };
                Group::new(
                    spec.clone(),
                    settings.clients.get(gi).cloned().flatten(),
                    Registrations::new(settings.max_node_provision_time),
                    GroupState {
                        // No stop is promised before the key is known to allow it.
                        scale: CowArc::new({
                            let mut m = ScaleMachine::new(cluster_id, timings);
                            let _ = m.handle(Event::MayStopVms(false), now());
                            // Known from the start, so that queued increases a restart takes
                            // over are never sent past it.
                            m.set_max_size(spec.max);
                            // With a store, an OK waits for the record of its promise.
                            m.set_durable(store.durable());
                            m.set_external_scale_up_allowed(
                                settings.external_node_scale_up == ExternalNodeScaleUp::Allow,
                            );
                            m
                        }),
                        known: Known::default(),
                        window_failure: None,
                        restored: Vec::new(),
                    },
                    store.clone(),
                )
            })
            .collect();
        let alert = alert::Alert::new(alert, settings.alert_recheck);
        let (ready, _) = watch::channel(false);
        let round_permits = tokio::sync::Semaphore::new(settings.refresh_concurrency.max(1));
        let nodes = settings.node_marks.as_ref().and_then(|c| {
            crate::kube::KubeClient::new(c)
                .inspect_err(|e| tracing::error!(error = %e, "the cluster's Nodes cannot be read: owed removals are carried out without asking whether the autoscaler still marks them"))
                .ok()
        });
        Provider {
            inner: Arc::new(Inner {
                cs,
                settings,
                groups,
                alert,
                round_permits,
                offerings: tokio::sync::Mutex::new(refresh::OfferingCache::default()),
                store,
                unmatched: caller::Unmatched::default(),
                seen: crate::suggest::SeenCache::default(),
                whereabouts: caller::Whereabouts::default(),
                ready,
                calls: std::sync::atomic::AtomicU64::new(0),
                optional: OptionalCommands::default(),
                nodes,
                keeper_wake: Arc::new(tokio::sync::Notify::new()),
                keeping: AtomicBool::new(false),
                // Random without a clock or a dependency: std's hasher keys are drawn from the
                // operating system once per process.
                jitter_seed: std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    0u8,
                ),
            }),
        }
    }

    /// The settings this provider runs with.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Every group, as the provider itself sees them: the explicit all-groups view of the
    /// metrics, the demo and tests. The gRPC service never takes it: each RPC goes through its
    /// caller's view ([`Provider::seen_by`]).
    pub fn all_groups(&self) -> Scoped<'_> {
        Scoped {
            p: self,
            caller: None,
            denied: false,
        }
    }
}

impl Cluster {
    /// The age of a group's snapshot on tokio's clock.
    fn snapshot_age_of(&self) -> Option<Duration> {
        let st = self.group().read();
        st.scale
            .snapshot()
            .map(|s| now().saturating_duration_since(s.fetched_at))
    }
}

/// One configured cluster's share of the provider: what its loop carries out. The provider
/// and the group's index, so nothing of a cluster's work takes a group index apart from it.
#[derive(Clone)]
pub(crate) struct Cluster {
    pub(crate) p: Provider,
    pub(crate) gi: usize,
}

impl Provider {
    /// Cluster `gi`'s share of the provider.
    pub(crate) fn cluster(&self, gi: usize) -> Cluster {
        Cluster {
            p: self.clone(),
            gi,
        }
    }
}

impl Cluster {
    /// The group this is.
    pub(crate) fn group(&self) -> &groups::Group {
        &self.p.inner.groups[self.gi]
    }

    /// How logs and errors name the group.
    pub(crate) fn label(&self) -> String {
        self.group().label()
    }
}
