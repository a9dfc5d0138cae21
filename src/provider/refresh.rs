//! Refresh: how the provider keeps each group's CloudStack snapshot fresh when autoscalers ask,
//! and whether it can (readiness).
//!
//! One **round** per group at a time: a round is one `listKubernetesClusters` call for the
//! group's cluster, the effects the machine asks for on seeing it, the worker offering when it
//! is not known yet, and the provider-wide CloudStack version check when it is due. A Refresh
//! joins the group's round in flight, or starts one when the snapshot is older than
//! `--refresh-min-interval`; it never waits for anything but rounds of its own groups, and no
//! round waits for another group's. Each group's loop (`cluster_loop`) runs its rounds, beside
//! its other work and without a task per round (a caller that gives up cannot interrupt one
//! half-way), each under one of `refresh_concurrency` permits of a FIFO
//! semaphore: CloudStack is asked at most that many clusters at once, and clusters are served
//! in the order they asked, so none starves another.
//!
//! Nothing here loops on a lock: a caller takes the group's slot (a `std` mutex, never held
//! across an `.await`), reads or starts the round, and waits on the round's end signal, which
//! a drop guard sends even when the round ends abnormally.
//!
//! Freshness: a group is **stale** when its snapshot is older than the staleness bound while
//! the provider could not refresh it: the last attempt failed, or an autoscaler asked for a
//! newer one and none came. A group nobody asks about is not stale however old its snapshot
//! is (its autoscaler may be stopped). The CloudProvider service's gRPC health is NOT_SERVING
//! while any group is stale or has no snapshot yet; `/readyz` and the server's own health
//! (`""`) never are for CloudStack's sake: they say whether this replica can serve its role
//! (ARCHITECTURE.md, "Readiness, liveness and the keeper").

use super::Cluster;
use super::{Error, Inner, Provider, Result, Scoped, before, now};
use cks_cloudstack::CsError;
use cks_cloudstack::types::ServiceOffering;
use cks_domain::keeper::{GroupClock, Policy, RefreshStep, RoundState, jitter};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A group's refresh round in flight, the last time an autoscaler asked for the group, and
/// how its last rounds went (what `cks_domain::keeper` decides on).
#[derive(Debug, Default)]
pub(crate) struct RefreshSlot {
    round: Option<Round>,
    /// The end signal of the round asked for, until the group's loop starts it
    /// ([`Cluster::take_round`]).
    start: Option<watch::Sender<bool>>,
    /// When a Refresh last asked for this group (on tokio's clock).
    demanded: Option<Instant>,
    /// Rounds that failed in a row.
    failures: u32,
    /// When the last round ended.
    last_end: Option<Instant>,
    /// The backoff's jitter draw for the current run of failures.
    jitter: f64,
}

#[derive(Debug)]
struct Round {
    /// Becomes true when the round ended; closed (sender dropped) when its task died.
    done: watch::Receiver<bool>,
    /// When the round was given a permit and asked CloudStack; `None` while it waits for one.
    asking_since: Option<Instant>,
}

/// Worker offerings by id, shared by every group (a central provider serves many clusters of
/// one offering: it is read once, not once per cluster), and offerings whose read failed, not
/// asked again before [`OFFERING_RETRY`].
#[derive(Debug, Default)]
pub(crate) struct OfferingCache {
    known: HashMap<String, ServiceOffering>,
    failed: HashMap<String, Instant>,
}

use cks_domain::timing::OFFERING_RETRY;

/// A VM id no VM has: asking to stop it tells whether the key may stop VMs, and stops nothing.
const NO_SUCH_VM: &str = "00000000-0000-4000-8000-000000000000";

/// Ends a round: clears the group's slot and signals the round's waiters, also when the task
/// running the round panics or is dropped (else every later Refresh would join a round that
/// never ends).
struct RoundEnd<'a> {
    slot: &'a Mutex<RefreshSlot>,
    done: watch::Sender<bool>,
    keeper: &'a tokio::sync::Notify,
}

impl Drop for RoundEnd<'_> {
    fn drop(&mut self) {
        lock(self.slot).round = None;
        self.done.send_replace(true);
        // The keeper plans the group's next round from how this one ended.
        self.keeper.notify_one();
    }
}

fn lock(slot: &Mutex<RefreshSlot>) -> MutexGuard<'_, RefreshSlot> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// A group's slot and snapshot time as `cks_domain::keeper` takes them.
fn slot_clock(s: &RefreshSlot, fetched: Option<Instant>) -> GroupClock {
    GroupClock {
        fetched,
        demanded: s.demanded,
        failures: s.failures,
        last_end: s.last_end,
        round: s.round.as_ref().map(|r| match r.asking_since {
            Some(since) => RoundState::Asking { since },
            None => RoundState::Queued,
        }),
        jitter: s.jitter,
    }
}

/// A snapshot came for group `gi` (from a round, a job's end, a scale RPC): CloudStack
/// answers, so the group's run of failed rounds is over.
pub(crate) fn snapshot_arrived(slot: &Mutex<RefreshSlot>) {
    lock(slot).failures = 0;
}

impl Scoped<'_> {
    /// Refresh of the caller's groups (every group for the provider's own, [`Provider::refresh`]):
    /// for each group, what `cks_domain::keeper` says (answer from the snapshot, join the
    /// round in flight, start one), waits for the rounds it must until the deadline, and
    /// answers from the snapshots.
    pub async fn refresh_within(&self, deadline: Option<tokio::time::Instant>) -> Result<()> {
        let groups = self.visible();
        let asked = now();
        let policy = refresh_policy(&self.p.inner);
        // The end signals of the rounds to wait for; a round started without waiting goes on
        // in the background, and a group answered from its snapshot starts none.
        let rounds: Vec<watch::Receiver<bool>> = groups
            .iter()
            .filter_map(|&gi| {
                let c = self.p.cluster(gi);
                match c.refresh_step(&policy, asked) {
                    RefreshStep::Answer => None,
                    RefreshStep::Join => Some(c.start_round()),
                    RefreshStep::Start { wait } => {
                        let done = c.start_round();
                        wait.then_some(done)
                    }
                }
            })
            .collect();
        // Every round runs already; waiting for them one after the other takes as long as
        // the slowest.
        let all_ended = async {
            for mut done in rounds {
                // An error means the round's task died: its drop guard cleared the slot, and
                // the snapshots say what there is.
                let _ = done.wait_for(|d| *d).await;
            }
        };
        let timed_out = match deadline {
            None => {
                all_ended.await;
                false
            }
            Some(d) => tokio::time::timeout_at(before(d), all_ended).await.is_err(),
        };
        self.judge_snapshots(&groups, timed_out)
    }

    /// The Refresh answer from the snapshots as they are once the caller's rounds ended, or
    /// when they did not end in time (`timed_out`): OK when every group has a snapshot within
    /// the staleness bound, else `Stale` naming the groups and why.
    fn judge_snapshots(&self, groups: &[usize], timed_out: bool) -> Result<()> {
        let stale = self.p.inner.settings.staleness_bound;
        let ages: Vec<Option<Duration>> = groups
            .iter()
            .map(|&gi| self.p.cluster(gi).snapshot_age_of())
            .collect();
        let mut failures = Vec::new();
        let mut key_refused = false;
        for i in cks_domain::freshness::stale_for_refresh(&ages, stale) {
            let gi = groups[i];
            let (last_error, refused) = {
                let st = self.p.inner.groups[gi].read();
                (st.known.last_error.clone(), st.known.key_refused)
            };
            key_refused |= refused;
            let mut why = match ages[i] {
                None => "no snapshot yet".to_string(),
                Some(a) => format!("the last snapshot is {:.1}s old", a.as_secs_f64()),
            };
            if timed_out {
                why.push_str(&self.p.cluster(gi).round_in_flight());
            } else {
                why.push_str(&self.p.cluster(gi).retry_note());
            }
            if let Some(e) = last_error {
                why.push_str(&format!("; last error: {e}"));
            }
            failures.push(format!("{}: {why}", self.p.inner.groups[gi].label()));
        }
        if failures.is_empty() {
            if timed_out {
                tracing::debug!(
                    "Refresh answered from snapshots within the staleness bound: CloudStack is slower than the request's deadline"
                );
            }
            Ok(())
        } else {
            Err(Error::Stale {
                bound: stale,
                failures,
                key_refused,
            })
        }
    }
}

/// How the provider paces its refresh rounds (`cks_domain::keeper`).
pub(crate) fn refresh_policy(inner: &Inner) -> Policy {
    let s = &inner.settings;
    Policy::new(
        s.refresh_min_interval,
        s.staleness_bound,
        inner.groups.len(),
        inner.cs.max_rps(),
        inner.cs.request_timeout(),
    )
}

impl Provider {
    /// Refresh of every group with no deadline (the first refresh, `demo`): waits for the
    /// rounds to end.
    pub async fn refresh(&self) -> Result<()> {
        self.all_groups().refresh_within(None).await
    }

    /// Asks CloudStack once whether the key may call `stopVirtualMachine`, without stopping
    /// anything: a VM id that names no VM is refused for its parameter (431) when the command
    /// is allowed, and for the command (432) when it is not; CloudStack checks the command
    /// first (`ApiServer.verifyRequest` runs the role's access check before the dispatcher
    /// reads the parameters). Until the answer, no machine promises a stop: a fake node of a
    /// Running VM is refused rather than promised blind. Other answers (unreachable, 5xx)
    /// leave it unknown, asked again next round.
    pub(crate) async fn learn_stop_permission(&self) {
        let optional = &self.inner.optional;
        if optional.stop_known.load(Ordering::Acquire)
            || optional.stop_asking.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let answer = self.inner.cs.stop_virtual_machine(NO_SUCH_VM, false).await;
        let allowed = match &answer {
            Err(e) if e.is_not_permitted() => Some(false),
            Err(e) if e.is_parameter_refused() => Some(true),
            // Nothing is named by that id: an accepted job would be CloudStack's own failure
            // to check it; the command is allowed either way.
            Ok(_) => Some(true),
            Err(_) => None,
        };
        if let Some(allowed) = allowed {
            self.tell_may_stop_vms(allowed).await;
            optional.stop_known.store(true, Ordering::Release);
            if !allowed {
                tracing::warn!(
                    cloudstack = self.inner.cs.api_url(),
                    "this CloudStack key may not call stopVirtualMachine (optional): {}",
                    super::WITHOUT_STOP_VIRTUAL_MACHINE
                );
            }
        }
        optional.stop_asking.store(false, Ordering::Release);
    }
}

impl Scoped<'_> {
    /// Whether the group with this node-group id is stale ([`Health::healthy`](super::Health::healthy)).
    pub fn snapshot_stale(&self, group_id: &str) -> bool {
        self.group(group_id)
            .is_ok_and(|(gi, _)| self.p.cluster(gi).stale_group())
    }

    /// Refresh rounds of the group with this node-group id that failed in a row.
    pub fn refresh_failures(&self, group_id: &str) -> u32 {
        self.group(group_id)
            .map_or(0, |(gi, _)| lock(&self.p.inner.groups[gi].refresh).failures)
    }
}

impl Cluster {
    /// What the keeper knows of the group: its snapshot's time and its refresh slot.
    pub(crate) fn group_clock(&self) -> GroupClock {
        let fetched = self.fetched_at();
        let s = lock(&self.group().refresh);
        slot_clock(&s, fetched)
    }

    /// When the group's snapshot was taken (none yet: `None`).
    fn fetched_at(&self) -> Option<Instant> {
        self.group().read().scale.snapshot().map(|s| s.fetched_at)
    }

    /// What a Refresh asked at `asked` does for the group (`cks_domain::keeper`), the demand
    /// noted.
    fn refresh_step(&self, policy: &Policy, asked: Instant) -> RefreshStep {
        let fetched = self.fetched_at();
        let mut s = lock(&self.group().refresh);
        s.demanded = Some(asked);
        policy.on_refresh(&slot_clock(&s, fetched), asked)
    }

    /// Starts a round of the group unless one is in flight; the end signal of the round.
    pub(crate) fn start_round(&self) -> watch::Receiver<bool> {
        let slot = &self.group().refresh;
        let mut s = lock(slot);
        if let Some(r) = &s.round {
            return r.done.clone();
        }
        let (tx, rx) = watch::channel(false);
        s.round = Some(Round {
            done: rx.clone(),
            asking_since: None,
        });
        s.start = Some(tx);
        drop(s);
        // The group's loop runs it: no task per round.
        self.wake_loop();
        rx
    }

    /// The round asked for the group and not started yet, for its loop to run. Its end is
    /// signalled when it ends, and also when it is dropped half way (the loop ended with the
    /// provider), so no Refresh waits for a round that will never end.
    pub(crate) fn take_round(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let done = lock(&self.group().refresh).start.take()?;
        Some(self.clone().run_round(done))
    }

    /// One round of the group, under a permit: the cluster, what the machine asks for on
    /// seeing it, the worker offering, the CloudStack version check when due. `done` is
    /// signalled when it ends, however it ends.
    async fn run_round(self, done: watch::Sender<bool>) {
        let _end = RoundEnd {
            slot: &self.group().refresh,
            done,
            keeper: &self.p.inner.keeper_wake,
        };
        // The semaphore is never closed: an error cannot happen, and would only mean going on
        // without a permit.
        let _permit = self.p.inner.round_permits.acquire().await.ok();
        if let Some(r) = lock(&self.group().refresh).round.as_mut() {
            r.asking_since = Some(now());
        }
        self.p.learn_stop_permission().await;
        // Read before the fetch: a snapshot it installs ends the run of failures at once
        // (`snapshot_arrived`), and what follows needs to know there was one.
        let failed_before = lock(&self.group().refresh).failures;
        let fetched = self.fetch_and_act().await;
        let failures = {
            let mut s = lock(&self.group().refresh);
            s.last_end = Some(now());
            if fetched.is_err() {
                s.failures = s.failures.saturating_add(1);
                s.jitter = jitter(self.p.inner.jitter_seed, self.gi, s.failures);
            }
            s.failures
        };
        let name = self.label();
        match fetched {
            Err(e) => {
                tracing::warn!(group = %name, error = %e, failures,
                    "refresh from CloudStack failed; the provider tries again on its own");
                let mut st = self.group().lock();
                st.known.last_error = Some(e.to_string());
                st.known.key_refused = e.is_key_refused();
            }
            Ok(_) if failed_before > 0 => {
                tracing::info!(group = %name, failed_rounds = failed_before,
                    "CloudStack answers again: the snapshot is fresh, followed jobs are polled now");
                // A loop backing off after failed polls looks at its job now, not at the
                // end of its backoff.
                self.poll_now();
            }
            Ok(_) => {}
        }
        self.refresh_offering().await;
        self.p
            .inner
            .alert
            .check_version(&self.p.inner.cs, &self.p.inner.optional.capabilities)
            .await;
    }

    /// When a failing group is asked again, for a Refresh answered without a round.
    fn retry_note(&self) -> String {
        let clock = self.group_clock();
        if clock.failures == 0 || clock.round.is_some() {
            return String::new();
        }
        match refresh_policy(&self.p.inner).due(&clock, now()) {
            Some(at) => format!(
                "; {} refresh rounds failed in a row, the next in {:.1}s (the provider retries on its own, with backoff)",
                clock.failures,
                at.saturating_duration_since(now()).as_secs_f64()
            ),
            None => String::new(),
        }
    }

    /// What the group's round is doing, for a Refresh that stopped waiting for it.
    fn round_in_flight(&self) -> String {
        let s = lock(&self.group().refresh);
        match s.round.as_ref().map(|r| r.asking_since) {
            Some(Some(since)) => format!(
                "; CloudStack has not answered the refresh within the request's deadline (asked {:.1}s ago; the refresh goes on in the background)",
                now().saturating_duration_since(since).as_secs_f64()
            ),
            Some(None) => format!(
                "; the refresh waited past the request's deadline for a turn to ask CloudStack (at most {} clusters are asked at once; it goes on in the background)",
                self.p.inner.settings.refresh_concurrency
            ),
            None => String::new(),
        }
    }

    /// The group's snapshot is older than the staleness bound and the provider cannot make a
    /// newer one: the last attempt failed, or an autoscaler asked since the snapshot was taken
    /// and no newer one came.
    pub(crate) fn stale_group(&self) -> bool {
        let g = self.group();
        let (fetched, failing) = {
            let st = g.read();
            (
                st.scale.snapshot().map(|s| s.fetched_at),
                st.known.last_error.is_some(),
            )
        };
        let age = fetched.map(|f| now().saturating_duration_since(f));
        let asked_since = fetched.is_some_and(|f| lock(&g.refresh).demanded.is_some_and(|d| d > f));
        cks_domain::freshness::stale_for_health(
            age,
            self.p.inner.settings.staleness_bound,
            failing,
            asked_since,
        )
    }

    /// Sets the group's worker offering when it is not known or changed: from the cache
    /// shared by every group, else read once (`listServiceOfferings`, or a worker VM's sizes
    /// where the key may not list offerings) and cached.
    async fn refresh_offering(&self) {
        let wanted = {
            let st = self.group().read();
            let Some(s) = st.scale.snapshot() else {
                return;
            };
            let Some(o) = s.snap.effective_worker_offering() else {
                return;
            };
            if st
                .known
                .worker_offering
                .as_ref()
                .is_some_and(|w| w.id == o.id)
            {
                return;
            }
            o.id.clone()
        };
        // One read per offering at a time: the rounds of many clusters of one offering wait
        // for the first one's read and take it from the cache.
        let mut cache = self.p.inner.offerings.lock().await;
        if let Some(o) = cache.known.get(&wanted) {
            self.group().lock().known.worker_offering = Some(o.clone());
            return;
        }
        if cache
            .failed
            .get(&wanted)
            .is_some_and(|at| now().saturating_duration_since(*at) < OFFERING_RETRY)
        {
            return;
        }
        match self.read_offering(&wanted).await {
            Ok(Some(o)) => {
                cache.failed.remove(&wanted);
                cache.known.insert(wanted, o.clone());
                self.group().lock().known.worker_offering = Some(o);
            }
            Ok(None) => {
                tracing::warn!(offering = %wanted, "worker service offering not listed");
                cache.failed.insert(wanted, now());
            }
            Err(e) => {
                tracing::warn!(offering = %wanted, error = %e, "reading the worker service offering failed");
                cache.failed.insert(wanted, now());
            }
        }
    }

    /// Offering `wanted` as `listServiceOfferings` lists it, or, once the key is known not to
    /// allow that command, as a worker VM of the group shows it.
    async fn read_offering(
        &self,
        wanted: &str,
    ) -> std::result::Result<Option<ServiceOffering>, CsError> {
        if self.p.inner.optional.offerings.load(Ordering::Relaxed) {
            match self.p.inner.cs.get_service_offering(wanted).await {
                Err(e) if e.is_not_permitted() => {
                    self.p
                        .inner
                        .optional
                        .offerings
                        .store(false, Ordering::Relaxed);
                    tracing::warn!(error = %e, cloudstack = self.p.inner.cs.api_url(), "this CloudStack key may not call listServiceOfferings (optional): {}", super::WITHOUT_LIST_SERVICE_OFFERINGS);
                }
                other => return other,
            }
        }
        self.offering_from_vm(wanted).await
    }

    /// The worker offering `wanted` as a worker VM of the group shows it (`listVirtualMachines`,
    /// which the key CKS gives a project cluster may call): CPUs and memory.
    async fn offering_from_vm(
        &self,
        wanted: &str,
    ) -> std::result::Result<Option<ServiceOffering>, CsError> {
        let workers: Vec<String> = {
            let st = self.group().read();
            let Some(s) = st.scale.snapshot() else {
                return Ok(None);
            };
            s.snap.workers().map(|vm| vm.id.clone()).take(3).collect()
        };
        if workers.is_empty() {
            return Ok(None);
        }
        let vms = self.p.inner.cs.list_virtual_machines(&workers).await?;
        Ok(vms
            .iter()
            .filter_map(|vm| vm.offering())
            .find(|o| o.id == wanted))
    }
}
