//! The durable record of every group's promises: the ledger of each machine
//! (`cks_domain::machine::Ledger`: owed removals, queued increases, the job in flight) and
//! what was learned of the key, as one JSON text, in a file (`--state-file`, replaced
//! atomically) or in a ConfigMap of the provider's namespace (`--state-configmap`, written
//! with optimistic concurrency). Where the bytes go is [`backend`]'s; what they say, when they
//! are written and who waits for them is this module's.
//!
//! Every change of a group's state (`Group::lock`) asks for a write; one writer task writes
//! when the recorded content changed, so many changes at once cost one write. A DeleteNodes
//! or IncreaseSize answers OK only after the write that holds its promise is done
//! ([`Provider::record`]): a promise is recorded before it is made. A write that fails is
//! logged, counted (`cks_provider_state_write_failures_total`) and tried again, from 250 ms
//! doubling to 5 s, until one succeeds; callers waiting for it wait on. At start the record is
//! read back ([`Provider::load_state`]) and each group's machine takes over its ledger before
//! its first snapshot. At shutdown the last write is tried for [`FINAL_WRITE_BOUND`].
//!
//! With neither flag nothing is written, and promises end with the process (said once at
//! start, and at shutdown with the number lost).

mod backend;

use super::Inner;
use super::{Provider, now};
use backend::{Backend, ReadError};
use cks_domain::machine::{Event, Ledger, OwedRemoval};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// The file's format version; a file of another version is refused, never half-read.
const VERSION: u32 = 1;

pub use cks_domain::timing::FINAL_WRITE_BOUND;
use cks_domain::timing::store_retry;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    /// `false` once CloudStack refused `stopVirtualMachine` to this key (432).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    can_stop_vms: Option<bool>,
    /// By the group's cluster as `--nodes` names it (`id=…` or `name=…`).
    #[serde(default)]
    groups: BTreeMap<String, GroupRecord>,
    /// With leader election: the leader that wrote it (its identity and the Lease's
    /// transitions when it took over). A new leader's first write differs from every write of
    /// the one before, so the ConfigMap's version changes and a late write of the old leader
    /// is a conflict, never an overwrite (`backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    writer: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    job: Option<String>,
    #[serde(default)]
    queued_increase: u32,
    #[serde(default)]
    removals: Vec<RemovalRecord>,
    /// VMs whose nodes a failed drain may have left cordoned (scale-ups wait in Alert).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    drained: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemovalRecord {
    vm_id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trouble: Option<String>,
    /// Milliseconds after the write before it may be sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait_ms: Option<u64>,
    #[serde(default)]
    stop_first: bool,
    #[serde(default)]
    stop_impossible: bool,
    #[serde(default)]
    abandoned: bool,
}

impl From<OwedRemoval> for RemovalRecord {
    fn from(o: OwedRemoval) -> Self {
        RemovalRecord {
            vm_id: o.vm_id,
            name: o.name,
            attempts: o.attempts,
            trouble: o.trouble,
            wait_ms: o
                .wait
                .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            stop_first: o.stop_first,
            stop_impossible: o.stop_impossible,
            abandoned: o.abandoned,
        }
    }
}

impl From<RemovalRecord> for OwedRemoval {
    fn from(r: RemovalRecord) -> Self {
        OwedRemoval {
            vm_id: r.vm_id,
            name: r.name,
            attempts: r.attempts,
            trouble: r.trouble,
            wait: r.wait_ms.map(Duration::from_millis),
            stop_first: r.stop_first,
            stop_impossible: r.stop_impossible,
            abandoned: r.abandoned,
        }
    }
}

/// The writer's side: which change was asked for last, which is written.
pub(crate) struct Store {
    /// Where the record goes; `None`: nowhere.
    backend: Option<Backend>,
    requested: AtomicU64,
    written: watch::Sender<u64>,
    wake: Notify,
    /// The content last written, so an unchanged ledger is not written again.
    last: Mutex<Option<String>>,
    /// Shutting down: the last write is done, and what the process drops on its way out
    /// (its own cleanup) is not written over it.
    closed: std::sync::atomic::AtomicBool,
    /// Why the last write failed, until one succeeds: new promises are refused meanwhile.
    failing: Mutex<Option<String>>,
    /// One write at a time (the writer's, a check before sending, the last at shutdown): a
    /// ConfigMap written twice at once would conflict with itself.
    writing: tokio::sync::Mutex<()>,
    /// [`StateFile::writer`].
    writer: Mutex<Option<String>>,
    /// The next pass writes even an unchanged record: a check, before a request is sent on a
    /// caller's behalf, that its promise can be recorded ([`Store::writable`]).
    force: std::sync::atomic::AtomicBool,
    /// Failed writes so far: who waits for a write hears of a failure at once.
    failures: watch::Sender<u64>,
}

impl Store {
    /// The store the settings name: `--state-configmap`, `--state-file`, or none.
    pub(crate) fn new(file: Option<PathBuf>, configmap: Option<crate::kube::ConfigMapRef>) -> Self {
        Store {
            backend: backend::backend(file, configmap),
            requested: AtomicU64::new(0),
            written: watch::channel(0).0,
            wake: Notify::new(),
            last: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
            failing: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
            writer: Mutex::new(None),
            force: std::sync::atomic::AtomicBool::new(false),
            failures: watch::channel(0).0,
        }
    }

    /// Where the record goes, as logs and errors name it (empty without a store).
    fn describe(&self) -> String {
        self.backend
            .as_ref()
            .map(|b| b.describe())
            .unwrap_or_default()
    }

    /// Whether promises are recorded (a store is configured).
    pub(crate) fn durable(&self) -> bool {
        self.backend.is_some()
    }

    /// A group's state is about to change: the writer looks again.
    pub(crate) fn touch(&self) {
        if self.backend.is_some() {
            self.requested.fetch_add(1, Ordering::AcqRel);
            self.wake.notify_one();
        }
    }
}

/// Errors reading the recorded state at start.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading the {path}: {detail}")]
    Read { path: String, detail: String },
    #[error(
        "the {path} is not a state this provider can read ({detail}); move it away to start without the promises it holds (removals it records are then not carried out)"
    )]
    Invalid { path: String, detail: String },
    /// The provider's identity may not do what the ConfigMap's store needs.
    #[error("{0}")]
    Refused(String),
}

impl Store {
    /// Reads and parses the recorded state; `None` when there is no store or nothing is
    /// recorded yet (said in the log when `say` is set: a start's read, not a standby's look).
    async fn read(&self, say: bool) -> Result<Option<StateFile>, StateError> {
        let Some(store) = &self.backend else {
            if say {
                tracing::info!(
                    "no --state-file or --state-configmap: removals and increases answered OK and not done yet end with this process"
                );
            }
            return Ok(None);
        };
        let shown = self.describe();
        let text = match store.read().await {
            Ok(Some(t)) => t,
            Ok(None) => {
                if say {
                    tracing::info!(store = %shown, "nothing recorded yet: starting with no promises to take over");
                }
                return Ok(None);
            }
            Err(ReadError::Unreadable(detail)) => {
                return Err(StateError::Read {
                    path: shown,
                    detail,
                });
            }
            Err(ReadError::Refused(text)) => return Err(StateError::Refused(text)),
        };
        let file: StateFile = serde_json::from_str(&text).map_err(|e| StateError::Invalid {
            path: shown.clone(),
            detail: e.to_string(),
        })?;
        if file.version != VERSION {
            return Err(StateError::Invalid {
                path: shown,
                detail: format!("version {}, expected {VERSION}", file.version),
            });
        }
        Ok(Some(file))
    }

    /// One write of what `content` gives (the text, and what the caller learns once it is
    /// recorded), read once this write's turn has come, so it is the newest. `force`: written
    /// even when unchanged (a check that the store can be written now). Unchanged content is
    /// recorded already.
    pub(crate) async fn write<R>(
        &self,
        force: bool,
        content: impl FnOnce() -> (String, R),
    ) -> Pass<R> {
        let Some(backend) = &self.backend else {
            return Pass::Closed;
        };
        let _one_at_a_time = self.writing.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Pass::Closed;
        }
        let asked = self.requested.load(Ordering::Acquire);
        let (text, learned) = content();
        let unchanged = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            == Some(text.as_str());
        // After a failure, the next pass writes whatever it holds: only a write that
        // succeeds lifts the refusal of new promises.
        let failing = self
            .failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if force || failing || !unchanged {
            if let Err(e) = backend.write(&text).await {
                *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                self.failures.send_modify(|f| *f += 1);
                crate::metrics::record_state_write_failure();
                tracing::error!(store = %backend.describe(), error = %e,
                    "recording the promises failed: what is promised from now on is answered OK only once a write succeeds; trying again");
                return Pass::Failed;
            }
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
            *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        raise(&self.written, asked);
        Pass::Recorded(learned)
    }

    /// Refuses a new promise while the store cannot be written (its last write failed): an
    /// OK must be recorded before it is given, and a request accepted now could only be
    /// answered at the caller's deadline, with an error, while the work went on.
    pub(crate) fn check(&self) -> Result<(), super::Error> {
        let (Some(backend), Some(error)) = (
            &self.backend,
            self.failing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        ) else {
            return Ok(());
        };
        Err(super::Error::StoreUnavailable {
            store: backend.describe(),
            error,
        })
    }

    /// The error a caller hears when its promise was not recorded before it had to be
    /// answered, and what it asked was taken back: the store's last failure, if it has one.
    pub(crate) fn unrecorded(&self) -> super::Error {
        match self.check() {
            Err(e) => e,
            Ok(()) => super::Error::StoreUnavailable {
                store: self.describe(),
                error: "not written before the caller had to be answered".into(),
            },
        }
    }

    /// Writes the record now, unchanged or not, by `until`: the check, just before a
    /// request is sent to CloudStack on a caller's behalf, that its promise can be recorded.
    /// An error names the store: the request is then not sent, and the caller hears it
    /// before anything is promised. The standing writer writes it (a write cut off half way
    /// could leave the ConfigMap's version unknown to the next one), so nothing is spawned.
    pub(crate) async fn writable(&self, until: tokio::time::Instant) -> Result<(), super::Error> {
        if self.backend.is_none() {
            return Ok(());
        }
        let mut failures = self.failures.subscribe();
        failures.borrow_and_update();
        let mut written = self.written.subscribe();
        self.force.store(true, Ordering::Release);
        let asked = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.wake.notify_one();
        let outcome = tokio::time::timeout_at(until, async {
            tokio::select! {
                _ = written.wait_for(|w| *w >= asked) => {}
                _ = failures.changed() => {}
            }
        })
        .await;
        match outcome {
            // Written, or failed: the failure is named (the writer tries again, with its
            // backoff, until a write succeeds).
            Ok(()) => self.check(),
            Err(_) => Err(super::Error::StoreUnavailable {
                store: self.describe(),
                error: "not written in time".into(),
            }),
        }
    }
}

/// Raises a count its watchers wait on to `to`, unless it is there already: a write that
/// finishes after a later one never lowers it.
fn raise(count: &watch::Sender<u64>, to: u64) {
    count.send_if_modified(|c| {
        let newer = to > *c;
        if newer {
            *c = to;
        }
        newer
    });
}

/// What a write of the store came to.
pub(crate) enum Pass<R> {
    /// Written (or unchanged): what the content's caller learns once it is recorded.
    Recorded(R),
    /// Nothing to write: no store, or closed after the last write.
    Closed,
    /// The write failed (logged and counted).
    Failed,
}

impl Provider {
    /// A standby's look at the ledger (leader election): read and parsed as a take-over would,
    /// applied to nothing. Returns how many promises it holds (owed removals and queued
    /// increases, of every cluster recorded); an error is one a take-over would end on.
    pub async fn check_state(&self) -> Result<usize, StateError> {
        Ok(self.inner.store.read(false).await?.map_or(0, |file| {
            file.groups
                .values()
                .map(|g| g.removals.len() + g.queued_increase as usize)
                .sum()
        }))
    }

    /// Reads the recorded state, if there is a store, and gives each group's machine its
    /// ledger. Returns how many promises were taken over. Call before the first refresh.
    pub async fn load_state(&self) -> Result<usize, StateError> {
        let Some(file) = self.inner.store.read(true).await? else {
            return Ok(0);
        };
        let mut taken = 0;
        let mut groups = file.groups;
        for (gi, g) in self.inner.groups.iter().enumerate() {
            let Some(record) = groups.remove(&g.spec.cluster.to_string()) else {
                continue;
            };
            let ledger = Ledger {
                removals: record.removals.into_iter().map(Into::into).collect(),
                queued_increase: record.queued_increase,
                job: record.job,
                drained: record.drained,
            };
            taken += ledger.removals.len() + ledger.queued_increase as usize;
            let label = self.inner.groups[gi].label();
            if !ledger.is_empty() {
                tracing::info!(group = %label, removals = ledger.removals.len(), queued_increase = ledger.queued_increase, job = ?ledger.job,
                    "taking over the promises an earlier process recorded");
            }
            let mut st = g.lock();
            if st.scale.cluster_id.is_none() {
                st.scale.cluster_id = record.cluster_id;
            }
            // Carried out once the provider runs (`resume_followers`).
            let restored = st.scale.handle(Event::Restored(ledger), now());
            st.restored.extend(restored.effects);
        }
        for (cluster, record) in groups {
            if !record.removals.is_empty() {
                tracing::error!(cluster = %cluster, vms = %record.removals.iter().map(|r| r.vm_id.as_str()).collect::<Vec<_>>().join(","),
                    "the state file records removals of a cluster no --nodes entry serves any more: they are not carried out");
            }
        }
        // Recorded for the key, which serves every group: told to each machine here, with the
        // ledger, before any group's loop runs (once loops run, each is told in its own,
        // `Provider::tell_may_stop_vms`).
        if file.can_stop_vms == Some(false) {
            for g in &self.inner.groups {
                let _ = g.lock().scale.handle(Event::MayStopVms(false), now());
            }
        }
        Ok(taken)
    }

    /// A new leader takes over (leader election): reads the ledger as [`Provider::load_state`]
    /// does, then writes it at once as `writer`, so that the store's version changes and any
    /// later write of the previous leader conflicts. An error: the ledger could not be read
    /// or claimed, and nothing may be served.
    pub async fn take_over_state(&self, writer: String) -> Result<usize, StateError> {
        *self
            .inner
            .store
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(writer);
        let taken = self.load_state().await?;
        if self.inner.store.durable() && !write_state_as(&self.inner, true).await {
            return Err(StateError::Read {
                path: self.inner.store.describe(),
                detail: "the first write as the new leader failed (see the log above)".into(),
            });
        }
        Ok(taken)
    }

    /// Carries out what the machines asked for on taking over their ledgers (after
    /// [`Provider::load_state`]): the jobs recorded as running are followed.
    pub fn resume_followers(&self) {
        for gi in 0..self.inner.groups.len() {
            let restored = std::mem::take(&mut self.inner.groups[gi].lock().restored);
            if restored.is_empty() {
                continue;
            }
            self.cluster(gi)
                .sending(super::cluster_loop::Work::Effects(restored));
        }
    }

    /// The writer: writes the record whenever a group's state changed and its recorded
    /// content with it, and tries a failed write again until it succeeds. Runs for the life
    /// of the process; nothing to do without a store.
    pub fn spawn_state_writer(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.inner.store.backend.as_ref()?;
        let p = self.clone();
        Some(tokio::spawn(async move {
            loop {
                p.inner.store.wake.notified().await;
                let mut failures = 0;
                while !write_state(&p.inner).await {
                    failures += 1;
                    tokio::time::sleep(store_retry(failures)).await;
                }
            }
        }))
    }

    /// At shutdown: the last write (tried again for at most [`FINAL_WRITE_BOUND`]), and what
    /// the next start takes over (or what is lost).
    pub async fn finish_state(&self) {
        let owed: usize = self
            .inner
            .groups
            .iter()
            .map(|g| g.read().scale.ledger(now()).removals.len())
            .sum();
        match &self.inner.store.backend {
            Some(backend) => {
                let give_up = tokio::time::Instant::now() + FINAL_WRITE_BOUND;
                let mut failures = 1;
                let mut written = write_state(&self.inner).await;
                while !written && tokio::time::Instant::now() + store_retry(failures) < give_up {
                    tokio::time::sleep(store_retry(failures)).await;
                    failures += 1;
                    written = write_state(&self.inner).await;
                }
                self.inner.store.closed.store(true, Ordering::Release);
                if !written {
                    tracing::error!(store = %backend.describe(), owed, bound = ?FINAL_WRITE_BOUND,
                        "shutting down without the last write: the next start takes over what the last successful write recorded");
                } else if owed > 0 {
                    tracing::info!(store = %backend.describe(), owed,
                        "shutting down with removals owed; they are recorded and the next start carries them out");
                }
            }
            None if owed > 0 => {
                tracing::error!(
                    owed,
                    "shutting down with removals answered OK and not done: without --state-file or --state-configmap they are lost (the autoscaler keeps those nodes cordoned until it restarts)"
                );
            }
            None => {}
        }
    }
}

/// The state file's content now, and the number of each group's ledger in it (read from
/// the same view as the ledger: a write of this text records every promise so numbered).
fn state_text(inner: &Inner) -> (String, Vec<u64>) {
    let t = now();
    let mut can_stop_vms = None;
    let mut groups = BTreeMap::new();
    let mut revs = Vec::with_capacity(inner.groups.len());
    for g in &inner.groups {
        let st = g.read();
        revs.push(st.scale.ledger_rev());
        if !st.scale.can_stop_vms() {
            can_stop_vms = Some(false);
        }
        let ledger = st.scale.ledger(t);
        if ledger.is_empty() {
            continue;
        }
        groups.insert(
            g.spec.cluster.to_string(),
            GroupRecord {
                cluster_id: st.scale.cluster_id.clone(),
                job: ledger.job,
                queued_increase: ledger.queued_increase,
                removals: ledger.removals.into_iter().map(Into::into).collect(),
                drained: ledger.drained,
            },
        );
    }
    let file = StateFile {
        version: VERSION,
        can_stop_vms,
        groups,
        writer: inner
            .store
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
    };
    (
        serde_json::to_string_pretty(&file).unwrap_or_default(),
        revs,
    )
}

/// Each group's ledger numbered `revs` is written: its loop tells the machine, which
/// releases the OKs that waited for it.
fn report_recorded(inner: &Inner, revs: &[u64]) {
    for (g, &rev) in inner.groups.iter().zip(revs) {
        raise(&g.recorded, rev);
    }
}

/// One pass of the writer: what every group owes now, written if it changed (or a check
/// asked for a write), `false` when the write failed (logged and counted): the changes it
/// held are not recorded.
async fn write_state(inner: &Inner) -> bool {
    let force = inner.store.force.swap(false, Ordering::AcqRel);
    write_state_as(inner, force).await
}

/// [`write_state`]; `force`: written even when unchanged. Once written, each
/// group's loop hears the number of the ledger written.
async fn write_state_as(inner: &Inner, force: bool) -> bool {
    match inner.store.write(force, || state_text(inner)).await {
        Pass::Recorded(revs) => {
            report_recorded(inner, &revs);
            true
        }
        Pass::Closed => true,
        Pass::Failed => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClusterRef, NodeGroupSpec};
    use crate::provider::Settings;
    use cks_cloudstack::{Client, ClientConfig};
    use std::path::Path;

    fn provider_with(file: &Path) -> Provider {
        let mut settings = Settings::with_groups(vec![NodeGroupSpec {
            min: 1,
            max: 5,
            cluster: ClusterRef::Id("c1".into()),
        }]);
        settings.state_file = Some(file.to_path_buf());
        let client =
            Client::new(ClientConfig::new("http://127.0.0.1:9/client/api", "k", "s")).unwrap();
        Provider::new(client, settings)
    }

    #[tokio::test]
    async fn a_state_file_it_cannot_read_is_refused_naming_it_and_a_missing_one_is_a_first_start() {
        let dir = std::env::temp_dir().join(format!("cks-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.json");
        assert_eq!(provider_with(&missing).load_state().await.unwrap(), 0);
        for (name, text, says) in [
            (
                "garbage.json",
                "{not json",
                "not a state this provider can read",
            ),
            ("future.json", r#"{"version": 9}"#, "version 9"),
            ("unknown.json", r#"{"version": 1, "extra": 1}"#, "extra"),
        ] {
            let file = dir.join(name);
            std::fs::write(&file, text).unwrap();
            let e = provider_with(&file)
                .load_state()
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(name) && e.contains(says), "{e}");
            assert!(e.contains("move it away"), "{e}");
        }
        // Written and read back: the promises come back to the group of the same --nodes.
        let file = dir.join("round-trip.json");
        let text = r#"{"version": 1, "can_stop_vms": false, "groups": {"id=c1": {"cluster_id": "c1", "removals": [{"vm_id": "vm-1", "name": "n1", "attempts": 2, "wait_ms": 1000}]}}}"#;
        std::fs::write(&file, text).unwrap();
        let p = provider_with(&file);
        assert_eq!(p.load_state().await.unwrap(), 1);
        let st = p.inner.groups[0].read();
        let ledger = st.scale.ledger(now());
        assert_eq!(ledger.removals[0].vm_id, "vm-1");
        assert_eq!(ledger.removals[0].attempts, 2);
        assert!(!st.scale.can_stop_vms());
        drop(st);
        backend::write_atomic(&file, &state_text(&p.inner).0).unwrap();
        let again = provider_with(&file);
        assert_eq!(again.load_state().await.unwrap(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
