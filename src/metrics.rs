//! Prometheus metrics and the plain-HTTP operations endpoints (`/metrics`, `/healthz`,
//! `/readyz`) served on `--metrics-listen`, apart from the gRPC port.
//!
//! Counters and histograms are recorded through the `metrics` facade where things happen
//! (RPCs in `grpc.rs`, CloudStack calls, scale jobs and refusals); per-group gauges are read
//! from a [`MetricsSource`] at scrape time so they can never drift from what the autoscaler is
//! told, and the process metrics (`process_*`) are read from `/proc` at scrape time by
//! `metrics-process`. Every family is described once, at [`install`], so each has a `# HELP`
//! line.
//!
//! A leaf: it knows no provider, gRPC or configuration type. Whoever serves the endpoint
//! supplies the [`MetricsSource`]; callers pass labels as plain strings.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use cks_domain::machine::JobKind;
use cks_domain::stranded::StrandRule;
use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// CloudStack's Kubernetes cluster states (`KubernetesCluster.State`, as
/// `listKubernetesClusters` spells them). `cks_provider_cluster_state` has a series for each,
/// 0 or 1, so an alert on one state sees it end.
pub const CLUSTER_STATES: [&str; 12] = [
    "Created",
    "Starting",
    "Running",
    "Stopping",
    "Stopped",
    "Scaling",
    "Upgrading",
    "Alert",
    "Recovering",
    "Destroying",
    "Destroyed",
    "Error",
];

/// States outside [`CLUSTER_STATES`] a cluster was seen in (a newer CloudStack): they get a
/// series too, set back to 0 once the cluster leaves them.
static OTHER_STATES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The `state` labels of `cks_provider_node_group_workers`, each worker counted under one.
pub const WORKER_STATES: [&str; 4] = ["running", "creating", "deleting", "down"];

/// The `outcome` labels of finished jobs (the `kind` labels are [`JobKind::ALL`]'s). Each
/// group's series start at 0, so `increase()` sees a group's first failure.
const JOB_OUTCOMES: [&str; 2] = ["succeeded", "failed"];

/// The process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, …), read at scrape time.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// How often histogram samples are folded into their buckets when nobody scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Calls `upkeep` every `every` on a thread of its own until it returns `false`. A std
/// thread, not a task: the recorder is installed before (and outside) any runtime, and its
/// upkeep must go on whichever runtime serves.
fn keep_up(
    every: Duration,
    upkeep: impl Fn() -> bool + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                if !upkeep() {
                    break;
                }
            }
        })
}

/// Installs the process-wide Prometheus recorder once, describes every metric family and sets
/// `cks_provider_build_info`; later calls return the same handle.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ])
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // build_recorder() starts no upkeep: without it every histogram sample stays in
            // memory until a scrape folds it in, so a provider nobody scrapes grows for ever.
            let upkept = handle.clone();
            if let Err(e) = keep_up(UPKEEP_INTERVAL, move || {
                upkept.run_upkeep();
                true
            }) {
                tracing::warn!(error = %e, "could not start the metrics upkeep thread: histogram samples are folded in only when /metrics is scraped");
            }
            // Fails only when another recorder is installed (tests); the handle still renders.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            metrics::gauge!("cks_provider_build_info", "version" => env!("CARGO_PKG_VERSION"))
                .set(1.0);
            // From 0, so that increase() sees the first removal retried or abandoned (a series
            // born at 1 shows no increase).
            metrics::counter!("cks_provider_removals_retried_total").increment(0);
            metrics::counter!("cks_provider_removals_abandoned_total").increment(0);
            metrics::counter!("cks_provider_removals_withdrawn_total").increment(0);
            metrics::counter!("cks_provider_state_write_failures_total").increment(0);
            metrics::counter!("cks_provider_unrecorded_oks_total").increment(0);
            metrics::counter!("cks_provider_unrecorded_promises_withdrawn_total").increment(0);
            // The command every refresh sends, refused for its key from the first call on: from
            // 0, so that an alert on increase() of `outcome="unauthorized"` sees that first call.
            metrics::counter!("cks_provider_cloudstack_requests_total", "command" => "listKubernetesClusters", "outcome" => "unauthorized")
                .increment(0);
            handle
        })
        .clone()
}

/// The `# HELP` text of every family this crate exports.
fn describe() {
    describe_counter!(
        "cks_provider_grpc_requests_total",
        "externalgrpc calls the autoscaler made, by method and gRPC status code."
    );
    describe_histogram!(
        "cks_provider_grpc_request_duration_seconds",
        "Time the provider took to answer an externalgrpc call, by method and status code."
    );
    describe_counter!(
        "cks_provider_cloudstack_requests_total",
        "CloudStack API calls, by command and outcome (ok, unreachable, api_error, \
         unauthorized, not_permitted, throttled: one per try CloudStack's rate limit refused, \
         http_error, malformed, config)."
    );
    describe_histogram!(
        "cks_provider_cloudstack_request_duration_seconds",
        "Time CloudStack took to answer an API call (request sent to whole answer read), by \
         command."
    );
    describe_counter!(
        "cks_provider_scale_jobs_started_total",
        "Scale jobs this provider follows from their start, by node group and kind: scale_up \
         and remove_nodes (scaleKubernetesCluster accepted by CloudStack), adopted (a running \
         job started elsewhere, found through listAsyncJobs)."
    );
    describe_counter!(
        "cks_provider_scale_jobs_finished_total",
        "Scale jobs that ended, by node group, kind and outcome (succeeded, failed; a \
         cancelled job counts as failed)."
    );
    describe_counter!(
        "cks_provider_scale_requests_refused_total",
        "Scale requests refused before anything was sent to CloudStack, by node group and the \
         CloudStack scaling rule that refuses them."
    );
    describe_counter!(
        "cks_provider_removals_retried_total",
        "Accepted node removals that did not happen yet (their job failed with these nodes \
         left, or CloudStack's rules refuse them now): still owed, sent again after a pause."
    );
    describe_counter!(
        "cks_provider_removals_abandoned_total",
        "Accepted node removals given up after repeated failed jobs: the autoscaler counts \
         the nodes as gone, the VMs need an operator."
    );
    describe_counter!(
        "cks_provider_removals_withdrawn_total",
        "Accepted node removals dropped because the node no longer carries the autoscaler's \
         ToBeDeletedByClusterAutoscaler mark (the autoscaler restarted, or gave the node up); \
         only with --confirm-node-marks."
    );
    describe_gauge!(
        "cks_provider_leader",
        "1 while this replica holds the leader-election Lease and renews it in time \
         (--leader-elect): only the leader submits to CloudStack, records and promises. A \
         fleet of replicas sums to 1; 0 for a minute means nobody scales."
    );
    describe_counter!(
        "cks_provider_tls_handshakes_refused_total",
        "TLS handshakes the gRPC listener refused, by reason: a client certificate missing, \
         from an unknown CA, signed by another key of a CA's name, expired or not valid yet, \
         the client refusing the provider's certificate, plain text on the TLS port, no \
         protocol in common, closed or timed out. Each client's mistake is also logged, at \
         most once a minute per peer address and reason."
    );
    describe_counter!(
        "cks_provider_leader_transitions_total",
        "Times this replica started or stopped leading (--leader-elect)."
    );
    describe_gauge!(
        "cks_provider_standby_ledger_readable",
        "1 while this standby last read and parsed the recorded promises (the ledger in \
         --state-configmap) without error, so it could take over; 0 while it cannot (it is \
         then not Ready). Read every lease duration (--leader-elect)."
    );
    describe_counter!(
        "cks_provider_state_write_failures_total",
        "Failed writes of the store (--state-configmap or --state-file), conflicts with \
         another writer of the ConfigMap included: each is tried again, and the OK of the \
         promises it holds waits for a write that succeeds."
    );
    describe_counter!(
        "cks_provider_unrecorded_oks_total",
        "OKs to IncreaseSize or DeleteNodes answered at the caller's deadline before the \
         store had recorded the promise (the store failed between the check before the \
         request and the write after it): a restart before the promise is kept forgets it."
    );
    describe_counter!(
        "cks_provider_unrecorded_promises_withdrawn_total",
        "IncreaseSize or DeleteNodes calls whose promise the store had not recorded by the \
         caller's deadline while what they asked was only queued (nothing sent, no stop \
         begun, no other caller's promise holding it): taken back, and the caller heard \
         UNAVAILABLE."
    );
    describe_gauge!(
        "cks_provider_node_group_target_size",
        "Target size the autoscaler is told, by node group."
    );
    describe_gauge!(
        "cks_provider_node_group_min_size",
        "Minimum size of the node group."
    );
    describe_gauge!(
        "cks_provider_node_group_max_size",
        "Maximum size of the node group."
    );
    describe_gauge!(
        "cks_provider_node_group_workers",
        "Workers of the node group, each counted once by state: deleting (being removed or \
         gone), down (its VM Stopped, Shutdown or Error), else running or creating as the \
         autoscaler is told."
    );
    describe_gauge!(
        "cks_provider_cluster_state",
        "The CKS cluster's CloudStack state: 1 for the current state, 0 for the others."
    );
    describe_gauge!(
        "cks_provider_cluster_blocked",
        "1 while CloudStack has stranded the CKS cluster by this rule, where it refuses every \
         scale request until an operator repairs it: alert_rule_5_vm_count_mismatch (its VMs \
         and nodes differ, e.g. VMs a failed scale-up left), alert_rule_7_no_down_worker (in \
         Alert with no worker down); 0 for the other rules."
    );
    describe_gauge!(
        "cks_provider_node_group_last_refresh_timestamp_seconds",
        "Unix time of the node group's latest CloudStack snapshot."
    );
    describe_gauge!(
        "cks_provider_node_group_snapshot_stale",
        "1 while the node group's CloudStack snapshot is older than the staleness bound and \
         the provider cannot refresh it (its last attempt failed, or an autoscaler asked and no \
         newer snapshot came); the autoscaler's Refresh for it answers UNAVAILABLE naming \
         CloudStack. 0 otherwise."
    );
    describe_gauge!(
        "cks_provider_node_group_refresh_failures",
        "Refresh rounds of the node group that failed in a row (0 once one succeeds): \
         CloudStack does not answer the provider's reads, or refuses them. The provider tries \
         again on its own with backoff; nothing else is needed once CloudStack answers."
    );
    describe_gauge!(
        "cks_provider_stalled",
        "1 while /healthz answers 503: a refresh round has asked CloudStack for longer than its \
         requests can take, or a due round never started: the provider is stuck in itself and \
         the kubelet restarts it. 0 otherwise."
    );
    describe_gauge!(
        "cks_provider_alert_scaling",
        "Whether this CloudStack scales clusters in Alert: 1 for the current verdict (unknown, \
         supported, unsupported), 0 for the others."
    );
    describe_gauge!(
        "cks_provider_alert_scaling_verdict_age_seconds",
        "Seconds since CloudStack's refusal taught the unsupported verdict (0 when no refusal \
         did)."
    );
    describe_gauge!(
        "cks_provider_client_cluster_mismatch",
        "1 while the autoscaler of client (the name its --nodes binding gives) is judged to \
         run in seen_cluster, not in bound_cluster, the cluster it is bound to: the nodes it \
         reports through NodeGroupForNode are VMs of seen_cluster and none of its own (another \
         cluster's autoscaler holding its client certificate). Its scale requests are refused \
         meanwhile. 0 once that ends (it reported a node of its own cluster, or none of the \
         other's for 10 minutes)."
    );
    describe_gauge!(
        "cks_provider_build_info",
        "Always 1; the version label is the provider's version."
    );
    describe_gauge!(
        "cks_provider_ready",
        "1 while /readyz answers 200 (the replica can serve its role: a leader, or a single \
         replica, that has taken over the recorded promises; a standby that can read them), \
         else 0: the pod is out of its Service's endpoints. CloudStack being unreachable does \
         not make a replica unready."
    );
    process_collector().describe();
}

/// Records one gRPC call. `code` is the gRPC status code's name as tonic spells it (`Ok`,
/// `FailedPrecondition`, …), the label value dashboards already use.
pub fn record_rpc(method: &'static str, started: Instant, code: &str) {
    metrics::counter!("cks_provider_grpc_requests_total", "method" => method, "code" => code.to_string())
        .increment(1);
    metrics::histogram!("cks_provider_grpc_request_duration_seconds", "method" => method, "code" => code.to_string())
        .record(started.elapsed().as_secs_f64());
}

/// Records a scale job this provider now follows from its start: `kind` is `scale_up`,
/// `remove_nodes` (a request CloudStack accepted) or `adopted` (a job started elsewhere).
pub fn record_job_started(node_group: &str, kind: JobKind) {
    metrics::counter!("cks_provider_scale_jobs_started_total", "node_group" => node_group.to_string(), "kind" => kind.as_str())
        .increment(1);
}

/// Records a finished scale job: `outcome` is `succeeded` or `failed`.
pub fn record_job(node_group: &str, kind: JobKind, outcome: &'static str) {
    metrics::counter!("cks_provider_scale_jobs_finished_total", "node_group" => node_group.to_string(), "kind" => kind.as_str(), "outcome" => outcome)
        .increment(1);
}

/// Records a scale request refused by one of CloudStack's scaling rules before anything was
/// sent (`rule`: the rule's stable name, e.g. `alert_rule_7_no_down_worker`).
pub fn record_refusal(node_group: &str, rule: &'static str) {
    metrics::counter!("cks_provider_scale_requests_refused_total", "node_group" => node_group.to_string(), "rule" => rule)
        .increment(1);
}

/// Records accepted node removals that did not happen yet and are sent again.
pub fn record_removals_retried(count: usize) {
    metrics::counter!("cks_provider_removals_retried_total").increment(count as u64);
}

/// Records accepted node removals given up after repeated failures.
pub fn record_removals_abandoned(count: usize) {
    metrics::counter!("cks_provider_removals_abandoned_total").increment(count as u64);
}

/// Records a TLS handshake the gRPC listener refused, by reason (`crate::tls::Refusal`).
pub fn record_tls_handshake_refused(reason: &'static str) {
    metrics::counter!("cks_provider_tls_handshakes_refused_total", "reason" => reason).increment(1);
}

/// Records accepted node removals the autoscaler withdrew (their node lost its mark).
pub fn record_removals_withdrawn(count: usize) {
    metrics::counter!("cks_provider_removals_withdrawn_total").increment(count as u64);
}

/// A replica with leader election starts as a standby: the gauge at 0 and the transitions
/// counter from 0 (so that `increase()` sees its first transition).
pub fn record_standby_start() {
    metrics::gauge!("cks_provider_leader").set(0.0);
    metrics::counter!("cks_provider_leader_transitions_total").increment(0);
}

/// Records whether a standby's last read of the ledger succeeded (`--leader-elect`).
pub fn record_standby_ledger(readable: bool) {
    metrics::gauge!("cks_provider_standby_ledger_readable").set(if readable { 1.0 } else { 0.0 });
}

/// Records this replica starting or stopping to lead (`--leader-elect`).
pub fn record_leader(leading: bool) {
    metrics::gauge!("cks_provider_leader").set(if leading { 1.0 } else { 0.0 });
    metrics::counter!("cks_provider_leader_transitions_total").increment(1);
}

/// Records a failed write of the store (`--state-configmap` or `--state-file`).
pub fn record_state_write_failure() {
    metrics::counter!("cks_provider_state_write_failures_total").increment(1);
}

/// Records an OK answered before the store recorded its promise.
pub fn record_unrecorded_ok() {
    metrics::counter!("cks_provider_unrecorded_oks_total").increment(1);
}

/// Records a promise taken back because the store had not recorded it by its caller's
/// deadline.
pub fn record_withdrawn_unrecorded() {
    metrics::counter!("cks_provider_unrecorded_promises_withdrawn_total").increment(1);
}

/// What the autoscaler is told about an instance (`InstanceStatus.InstanceState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    Running,
    Creating,
    Deleting,
}

/// One worker (an instance `NodeGroupNodes` lists) as the gauges see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worker {
    pub told: Told,
    /// Its VM is down (Stopped, Shutdown, Error) and the autoscaler is told so.
    pub down: bool,
}

impl Worker {
    /// The one `state` label the worker is counted under: `deleting` whatever its VM's state
    /// (it is on its way out), else `down` when its VM is down, else what the autoscaler is
    /// told.
    pub fn state(self) -> &'static str {
        match (self.told, self.down) {
            (Told::Deleting, _) => "deleting",
            (_, true) => "down",
            (Told::Running, false) => "running",
            (Told::Creating, false) => "creating",
        }
    }
}

/// One node group's state as the gauges show it, read at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupGauges {
    pub id: String,
    /// `None` when the group has no target yet (no snapshot): the gauge keeps its last value.
    pub target_size: Option<u32>,
    pub min_size: u32,
    pub max_size: u32,
    /// Every worker, once.
    pub workers: Vec<Worker>,
    /// CloudStack's name for the cluster's state, when a snapshot exists.
    pub cluster_state: Option<String>,
    /// The rule by which CloudStack has stranded the cluster (`StrandRule::as_str`), if it
    /// has.
    pub blocked: Option<&'static str>,
    /// Age of the group's snapshot, when one exists.
    pub since_refresh: Option<Duration>,
    /// The snapshot is older than the staleness bound and the provider cannot refresh it (the
    /// last attempt failed, or a Refresh asked and none came): the group keeps `/readyz` at
    /// 503.
    pub stale: bool,
    /// Refresh rounds that failed in a row.
    pub refresh_failures: u32,
}

/// A client judged to run in another cluster than the one it is bound to, as the gauge
/// `cks_provider_client_cluster_mismatch` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMismatch {
    /// The name its groups are bound to (`--nodes …@CLIENT`).
    pub client: String,
    /// The clusters it is bound to.
    pub bound_cluster: String,
    /// The cluster its nodes are VMs of.
    pub seen_cluster: String,
    /// Judged now (1); `false` for a judgment that ended (0).
    pub active: bool,
}

/// What the operations endpoints read from the running service.
pub trait MetricsSource: Send + Sync + 'static {
    /// `/readyz` answers 200: the replica can take the autoscaler's calls in its role. Not a
    /// word about CloudStack: a Service sends traffic only to ready endpoints, and an
    /// autoscaler that cannot reach the provider cannot hear why nothing scales.
    fn ready(&self) -> bool;
    /// Why the process is stuck in itself, when it is: `/healthz` answers 503 with it.
    fn stalled(&self) -> Option<String> {
        None
    }
    /// Every node group's gauge values, now.
    fn group_gauges(&self) -> Vec<GroupGauges>;
    /// Whether this CloudStack scales clusters in Alert: `unknown`, `supported` or
    /// `unsupported`, and how long ago CloudStack's refusal taught it (when it did).
    fn alert_verdict(&self) -> Option<(&'static str, Option<Duration>)> {
        None
    }
    /// Every client ever judged to run in another cluster than its own, and whether it is now.
    fn client_mismatches(&self) -> Vec<ClientMismatch> {
        Vec::new()
    }
}

/// Sets `cks_provider_client_cluster_mismatch`: 1 for a judgment in force, 0 for one that
/// ended (its series stays, so an alert on it sees it end).
fn set_client_mismatches(mismatches: &[ClientMismatch]) {
    for m in mismatches {
        metrics::gauge!(
            "cks_provider_client_cluster_mismatch",
            "client" => m.client.clone(),
            "bound_cluster" => m.bound_cluster.clone(),
            "seen_cluster" => m.seen_cluster.clone()
        )
        .set(if m.active { 1.0 } else { 0.0 });
    }
}

/// The Alert-scaling verdict: the current one 1, the others 0 (so an alert on
/// `verdict="unsupported"` clears when it is re-checked), and its age.
fn set_alert_verdict(verdict: Option<(&'static str, Option<Duration>)>) {
    let Some((current, age)) = verdict else {
        return;
    };
    for v in ["unknown", "supported", "unsupported"] {
        metrics::gauge!("cks_provider_alert_scaling", "verdict" => v).set(if v == current {
            1.0
        } else {
            0.0
        });
    }
    metrics::gauge!("cks_provider_alert_scaling_verdict_age_seconds")
        .set(age.map_or(0.0, |a| a.as_secs_f64()));
}

/// Sets the cluster-state gauge of a group: `current` 1, every other state 0.
fn set_cluster_state(group: &str, current: &str) {
    let others: Vec<String> = {
        let mut seen = OTHER_STATES.lock().unwrap_or_else(|e| e.into_inner());
        if !CLUSTER_STATES.contains(&current) {
            seen.insert(current.to_string());
        }
        seen.iter().cloned().collect()
    };
    let states = CLUSTER_STATES.iter().map(|s| s.to_string()).chain(others);
    for state in states {
        let value = if state == current { 1.0 } else { 0.0 };
        metrics::gauge!("cks_provider_cluster_state", "node_group" => group.to_string(), "state" => state)
            .set(value);
    }
}

/// Sets the per-group gauges; `wall` is the scrape's wall-clock time (the refresh timestamps
/// are `wall` less each snapshot's age).
fn set_group_gauges(groups: &[GroupGauges], wall: SystemTime) {
    for g in groups {
        let id = g.id.clone();
        if let Some(t) = g.target_size {
            metrics::gauge!("cks_provider_node_group_target_size", "node_group" => id.clone())
                .set(f64::from(t));
        }
        metrics::gauge!("cks_provider_node_group_min_size", "node_group" => id.clone())
            .set(f64::from(g.min_size));
        metrics::gauge!("cks_provider_node_group_max_size", "node_group" => id.clone())
            .set(f64::from(g.max_size));
        for state in WORKER_STATES {
            let n = g.workers.iter().filter(|w| w.state() == state).count();
            metrics::gauge!("cks_provider_node_group_workers", "node_group" => id.clone(), "state" => state)
                .set(n as f64);
        }
        for kind in JobKind::ALL.map(JobKind::as_str) {
            metrics::counter!("cks_provider_scale_jobs_started_total", "node_group" => id.clone(), "kind" => kind)
                .increment(0);
            for outcome in JOB_OUTCOMES {
                metrics::counter!("cks_provider_scale_jobs_finished_total", "node_group" => id.clone(), "kind" => kind, "outcome" => outcome)
                    .increment(0);
            }
        }
        if let Some(state) = &g.cluster_state {
            set_cluster_state(&id, state);
        }
        for rule in StrandRule::ALL.map(StrandRule::as_str) {
            let value = if g.blocked == Some(rule) { 1.0 } else { 0.0 };
            metrics::gauge!("cks_provider_cluster_blocked", "node_group" => id.clone(), "rule" => rule)
                .set(value);
        }
        metrics::gauge!("cks_provider_node_group_snapshot_stale", "node_group" => id.clone())
            .set(if g.stale { 1.0 } else { 0.0 });
        metrics::gauge!("cks_provider_node_group_refresh_failures", "node_group" => id.clone())
            .set(f64::from(g.refresh_failures));
        if let Some(age) = g.since_refresh {
            let at = wall
                .checked_sub(age)
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
            if let Some(at) = at {
                metrics::gauge!("cks_provider_node_group_last_refresh_timestamp_seconds", "node_group" => id.clone())
                    .set(at.as_secs_f64());
            }
        }
    }
}

#[derive(Clone)]
struct HttpState {
    handle: PrometheusHandle,
    source: Arc<dyn MetricsSource>,
}

/// Sets `cks_provider_ready`: what `/readyz` answers, for alerts (a scrape reaches an unready
/// pod, whose `up` stays 1).
fn set_ready(ready: bool) {
    metrics::gauge!("cks_provider_ready").set(if ready { 1.0 } else { 0.0 });
}

async fn metrics_page(State(s): State<HttpState>) -> String {
    set_ready(s.source.ready());
    set_stalled(s.source.stalled().is_some());
    set_group_gauges(&s.source.group_gauges(), SystemTime::now());
    set_alert_verdict(s.source.alert_verdict());
    set_client_mismatches(&s.source.client_mismatches());
    process_collector().collect();
    s.handle.render()
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    if s.source.ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready to serve: a standby that cannot read the recorded promises (it could not take over), or a leader that has not taken them over yet\n",
        )
    }
}

/// Sets `cks_provider_stalled`: what `/healthz` answers.
fn set_stalled(stalled: bool) {
    metrics::gauge!("cks_provider_stalled").set(if stalled { 1.0 } else { 0.0 });
}

/// Liveness: 503 naming what is stuck when the provider is stuck in itself, so the kubelet
/// restarts it; CloudStack not answering is not that (the rounds go on, failing).
async fn healthz(State(s): State<HttpState>) -> (StatusCode, String) {
    match s.source.stalled() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(why) => {
            tracing::error!(stuck = %why, "the provider is stuck: /healthz fails so that the kubelet restarts it");
            (StatusCode::SERVICE_UNAVAILABLE, format!("stuck: {why}\n"))
        }
    }
}

/// Serves `/metrics`, `/healthz` (not stuck in itself) and `/readyz` (can serve its role) until
/// `shutdown` completes.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    source: Arc<dyn MetricsSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = HttpState {
        handle: install(),
        source,
    };
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process-wide gauges (ready, stalled) that more than one test sets and reads back:
    /// tests of one binary run in parallel on the one recorder, so each holds this while it
    /// sets and reads them.
    static PROCESS_GAUGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[test]
    fn histogram_upkeep_runs_without_a_scrape() {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = keep_up(Duration::from_millis(1), move || tx.send(()).is_ok())
            .expect("spawning the upkeep thread");
        for round in 0..3 {
            rx.recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("upkeep round {round} never ran: {e}"));
        }
        drop(rx);
        thread.join().expect("the upkeep thread stops once told to");
    }

    struct Fixed {
        ready: bool,
        stalled: Option<&'static str>,
    }

    fn worker(told: Told, down: bool) -> Worker {
        Worker { told, down }
    }

    impl MetricsSource for Fixed {
        fn ready(&self) -> bool {
            self.ready
        }

        fn stalled(&self) -> Option<String> {
            self.stalled.map(str::to_string)
        }

        fn group_gauges(&self) -> Vec<GroupGauges> {
            vec![GroupGauges {
                id: "metrics-test-group".into(),
                target_size: Some(3),
                min_size: 1,
                max_size: 5,
                workers: vec![
                    worker(Told::Running, false),
                    worker(Told::Running, true),
                    worker(Told::Creating, false),
                ],
                cluster_state: Some("Running".into()),
                blocked: None,
                since_refresh: Some(Duration::from_secs(2)),
                stale: !self.ready,
                refresh_failures: u32::from(!self.ready),
            }]
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("http://{addr}{path}"))
            .await
            .expect("endpoint answers");
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    }

    /// The value of one series (name and labels exactly as rendered) on a page.
    fn value(page: &str, series: &str) -> Option<f64> {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test]
    async fn endpoints_answer_from_the_source_with_the_published_names() {
        let _gauges = PROCESS_GAUGES.lock().await;
        install();
        record_rpc("MetricsTestRpc", Instant::now(), "FailedPrecondition");
        // Liveness fails only when the provider is stuck in itself, and says why; stuck or not
        // says nothing of readiness.
        let stuck = "group c1: its refresh round has been asking CloudStack for 300s";
        for (ready, readyz, stalled) in [
            (true, 200, None),
            (false, 503, None),
            (true, 200, Some(stuck)),
        ] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let source = Arc::new(Fixed { ready, stalled });
            let server = tokio::spawn(serve_http(listener, source, async {
                let _ = stopped.await;
            }));
            match stalled {
                None => assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into())),
                Some(why) => {
                    let (code, body) = get(addr, "/healthz").await;
                    assert_eq!(code, 503);
                    assert!(body.contains(why), "{body}");
                }
            }
            assert_eq!(get(addr, "/readyz").await.0, readyz, "ready: {ready}");
            let before = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs_f64();
            let (status, page) = get(addr, "/metrics").await;
            assert_eq!(status, 200);
            let unauthorized = r#"cks_provider_cloudstack_requests_total{command="listKubernetesClusters",outcome="unauthorized"} "#;
            assert!(
                page.lines().any(|l| l.starts_with(unauthorized)),
                "the unauthorized series exists from the start:\n{page}"
            );
            let ready_line = format!("cks_provider_ready {}", u8::from(ready));
            let stalled_line = format!("cks_provider_stalled {}", u8::from(stalled.is_some()));
            let stale_line = format!(
                r#"cks_provider_node_group_snapshot_stale{{node_group="metrics-test-group"}} {}"#,
                u8::from(!ready)
            );
            for line in [ready_line, stale_line, stalled_line] {
                assert!(
                    page.lines().any(|l| l == line),
                    "{line} missing in:\n{page}"
                );
            }
            for line in [
                r#"cks_provider_grpc_requests_total{method="MetricsTestRpc",code="FailedPrecondition"} 1"#,
                r#"cks_provider_node_group_target_size{node_group="metrics-test-group"} 3"#,
                r#"cks_provider_node_group_min_size{node_group="metrics-test-group"} 1"#,
                r#"cks_provider_node_group_max_size{node_group="metrics-test-group"} 5"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="running"} 1"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="creating"} 1"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="deleting"} 0"#,
                r#"cks_provider_node_group_workers{node_group="metrics-test-group",state="down"} 1"#,
                r#"cks_provider_cluster_state{node_group="metrics-test-group",state="Running"} 1"#,
                r#"cks_provider_cluster_state{node_group="metrics-test-group",state="Alert"} 0"#,
                r#"cks_provider_scale_jobs_started_total{node_group="metrics-test-group",kind="remove_nodes"} 0"#,
                r#"cks_provider_scale_jobs_finished_total{node_group="metrics-test-group",kind="scale_up",outcome="failed"} 0"#,
                concat!(
                    r#"cks_provider_build_info{version=""#,
                    env!("CARGO_PKG_VERSION"),
                    r#""} 1"#
                ),
            ] {
                assert!(
                    page.lines().any(|l| l == line),
                    "{line} missing in:\n{page}"
                );
            }
            // The snapshot is 2 s old at the scrape: its time is the scrape's less 2 s.
            let refreshed = value(
                &page,
                r#"cks_provider_node_group_last_refresh_timestamp_seconds{node_group="metrics-test-group"}"#,
            )
            .expect("refresh timestamp");
            assert!(
                refreshed >= before - 2.5 && refreshed <= before + 5.0,
                "{refreshed} vs scrape at {before}"
            );
            assert!(!page.contains("seconds_since_refresh"), "{page}");
            let _ = stop.send(());
            server.await.expect("joins").expect("serves until stopped");
        }
    }

    #[test]
    fn every_family_has_a_help_line() {
        let _gauges = PROCESS_GAUGES.blocking_lock();
        let handle = install();
        record_rpc("HelpTestRpc", Instant::now(), "Ok");
        cks_cloudstack::record_request_metrics("helpTestCommand", Duration::from_millis(3), "ok");
        record_job_started("help-test-group", JobKind::ScaleUp);
        record_job("help-test-group", JobKind::ScaleUp, "failed");
        record_refusal("help-test-group", "alert_rule_7_no_down_worker");
        record_removals_retried(1);
        record_removals_abandoned(1);
        set_alert_verdict(Some(("unknown", None)));
        set_ready(true);
        set_stalled(false);
        set_group_gauges(
            &[GroupGauges {
                id: "help-test-group".into(),
                target_size: Some(1),
                min_size: 1,
                max_size: 2,
                workers: vec![worker(Told::Running, false)],
                cluster_state: Some("Running".into()),
                blocked: Some("alert_rule_5_vm_count_mismatch"),
                since_refresh: Some(Duration::from_secs(1)),
                stale: false,
                refresh_failures: 0,
            }],
            SystemTime::now(),
        );
        process_collector().collect();
        let page = handle.render();
        let typed: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        for family in [
            "cks_provider_grpc_requests_total",
            "cks_provider_grpc_request_duration_seconds",
            "cks_provider_cloudstack_requests_total",
            "cks_provider_cloudstack_request_duration_seconds",
            "cks_provider_scale_jobs_started_total",
            "cks_provider_scale_jobs_finished_total",
            "cks_provider_scale_requests_refused_total",
            "cks_provider_removals_retried_total",
            "cks_provider_removals_abandoned_total",
            "cks_provider_node_group_target_size",
            "cks_provider_node_group_min_size",
            "cks_provider_node_group_max_size",
            "cks_provider_node_group_workers",
            "cks_provider_cluster_state",
            "cks_provider_cluster_blocked",
            "cks_provider_node_group_last_refresh_timestamp_seconds",
            "cks_provider_alert_scaling",
            "cks_provider_alert_scaling_verdict_age_seconds",
            "cks_provider_build_info",
            "cks_provider_ready",
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(typed.contains(&family), "{family} not exported:\n{page}");
        }
        // Every family on the page, recorded here or by any other test of this process.
        for family in typed {
            let help = format!("# HELP {family} ");
            let line = page
                .lines()
                .find(|l| l.starts_with(&help))
                .unwrap_or_else(|| panic!("{family} has no HELP line:\n{page}"));
            assert!(line.len() > help.len() + 10, "{line}");
        }
        assert_eq!(
            value(
                &page,
                r#"cks_provider_scale_requests_refused_total{node_group="help-test-group",rule="alert_rule_7_no_down_worker"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn the_blocked_gauge_is_1_for_the_current_rule_and_0_for_the_others() {
        let handle = install();
        let series = |rule: &str| {
            format!(
                r#"cks_provider_cluster_blocked{{node_group="blocked-test-group",rule="{rule}"}}"#
            )
        };
        for current in [
            Some("alert_rule_5_vm_count_mismatch"),
            Some("alert_rule_7_no_down_worker"),
            None,
        ] {
            let gauges = GroupGauges {
                id: "blocked-test-group".into(),
                blocked: current,
                ..GroupGauges::default()
            };
            set_group_gauges(&[gauges], SystemTime::now());
            let page = handle.render();
            for rule in StrandRule::ALL.map(StrandRule::as_str) {
                let want = if current == Some(rule) { 1.0 } else { 0.0 };
                assert_eq!(
                    value(&page, &series(rule)),
                    Some(want),
                    "{current:?}: {rule}"
                );
            }
        }
    }

    #[test]
    fn the_cluster_state_gauge_follows_the_current_state_back() {
        let handle = install();
        let gauges = |state: &str| GroupGauges {
            id: "state-test-group".into(),
            cluster_state: Some(state.into()),
            ..GroupGauges::default()
        };
        let series = |state: &str| {
            format!(
                r#"cks_provider_cluster_state{{node_group="state-test-group",state="{state}"}}"#
            )
        };
        // Alert, then a state this provider does not know (it has a series from then on),
        // then Running again.
        for (current, unknown_seen) in [
            ("Running", false),
            ("Alert", false),
            ("Maintenance", true),
            ("Running", true),
        ] {
            set_group_gauges(&[gauges(current)], SystemTime::now());
            let page = handle.render();
            let unknown = unknown_seen.then_some("Maintenance");
            for state in CLUSTER_STATES.iter().copied().chain(unknown) {
                let expected = if state == current { 1.0 } else { 0.0 };
                assert_eq!(
                    value(&page, &series(state)),
                    Some(expected),
                    "state {state} while the cluster is {current}:\n{page}"
                );
            }
        }
    }

    #[test]
    fn each_worker_is_counted_once_under_one_state() {
        assert_eq!(worker(Told::Running, false).state(), "running");
        assert_eq!(worker(Told::Creating, false).state(), "creating");
        assert_eq!(worker(Told::Deleting, false).state(), "deleting");
        assert_eq!(worker(Told::Running, true).state(), "down");
        assert_eq!(worker(Told::Creating, true).state(), "down");
        assert_eq!(worker(Told::Deleting, true).state(), "deleting");

        let handle = install();
        let workers = vec![
            worker(Told::Running, false),
            worker(Told::Running, false),
            worker(Told::Running, true),
            worker(Told::Creating, true),
            worker(Told::Creating, false),
            worker(Told::Deleting, true),
        ];
        set_group_gauges(
            &[GroupGauges {
                id: "workers-test-group".into(),
                workers: workers.clone(),
                ..GroupGauges::default()
            }],
            SystemTime::now(),
        );
        let page = handle.render();
        let count = |state: &str| {
            value(
                &page,
                &format!(r#"cks_provider_node_group_workers{{node_group="workers-test-group",state="{state}"}}"#),
            )
            .unwrap_or_else(|| panic!("no {state} series:\n{page}"))
        };
        assert_eq!(
            WORKER_STATES.map(count),
            [2.0, 1.0, 1.0, 2.0],
            "running, creating, deleting, down"
        );
        let total: f64 = WORKER_STATES.iter().map(|s| count(s)).sum();
        assert_eq!(total, workers.len() as f64, "every worker once");
    }

    #[test]
    fn the_refresh_timestamp_is_the_scrape_time_less_the_snapshot_age() {
        let handle = install();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        set_group_gauges(
            &[GroupGauges {
                id: "refresh-test-group".into(),
                since_refresh: Some(Duration::from_millis(2500)),
                ..GroupGauges::default()
            }],
            wall,
        );
        assert_eq!(
            value(
                &handle.render(),
                r#"cks_provider_node_group_last_refresh_timestamp_seconds{node_group="refresh-test-group"}"#
            ),
            Some(1_699_999_997.5)
        );
    }
}
