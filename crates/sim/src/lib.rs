//! A CloudStack API simulator that behaves like CKS (Alert rules included): the fixture every
//! test, benchmark and demo of this crate talks to. It is kept apart from the provider and shares
//! no decision logic with it, so that tests can catch the two disagreeing.
//!
//! # What it serves
//! `POST|GET /client/api` with `response=json`, signed like CloudStack requests (HMAC-SHA1 over
//! the sorted, lower-cased, URL-encoded query): `listKubernetesClusters`, `scaleKubernetesCluster`, `queryAsyncJobResult`,
//! `listAsyncJobs`, `listVirtualMachines`, `startVirtualMachine`, `stopVirtualMachine`,
//! `listServiceOfferings`, `listZones`, `listCapabilities`, `getApiLimit`, each for the account
//! its key belongs to (the key's own, or one of the scenario's: `accounts`). Errors use
//! CloudStack's envelope (`{"<cmd>response":{"uuidList":[],"errorcode":..,"cserrorcode":..,
//! "errortext":..}}`, HTTP status = errorcode): 401 for authentication and unknown commands,
//! 431 for malformed parameters, 432 for a command the key's role or project does not allow,
//! 429 for an account over its API limit (`throttle`, off unless `throttling` is set), 531 for
//! another account's VM or job. Scale refusals are failed jobs (`jobstatus` 2,
//! `jobresultcode` 530), as on CloudStack.
//!
//! Simulator-only commands, unsigned and never subject to faults: `simListNodes[&clusterid=]`
//! (the emulated kubelet's nodes), `simConfigure` (timings and faults, see
//! [`SimSettings::apply`]), `simRequests[&cmd=]`, `simResetRequests`, `simSetVmState&id=&state=`,
//! `simSetNode&id=[&ready=][&remove=true][&uncordon=true]`.
//!
//! # Modules
//! - `model`: clusters, VMs, jobs, the kubelet view, the status scanner pass.
//! - `rules`: scale validation (CloudStack's checks and the seven Alert rules).
//! - `jobs`: the async job tasks (scale up/down, VM start/stop).
//! - `api`: parameter checking and the commands; `render`: CloudStack's JSON shapes; `reply`:
//!   an answer and CloudStack's error envelope.
//! - `accounts`: accounts, projects and owners; `access`: who may see and change what.
//! - `http`: the axum server, faults, request recording; `signing`: signature checks;
//!   `throttle`: CloudStack's API rate limit (`api.throttling.*`).
//! - [`scenario`]: scenario files and the demo cluster; [`config`]: settings.
//!
//! # Use from Rust
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use cks_sim::{self as sim, SimConfig};
//! let sim = sim::spawn(SimConfig::for_tests("key", "secret")).await?;
//! let cluster = sim.cluster_ids()[0].clone();
//! println!("{} serves {}", sim.api_url, cluster);
//! sim.shutdown().await;
//! # Ok(()) }
//! ```

mod access;
mod accounts;
mod api;
mod clock;
pub mod config;
mod control;
mod http;
mod ids;
mod jobs;
mod model;
mod render;
mod reply;
mod rules;
pub mod scenario;
mod signing;
mod throttle;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub use config::{JobFailure, KeyRole, Project, SimSettings};
pub use model::{ClusterState, NetworkKind, RecordedRequest, SimNode, VmState};
pub use scenario::{AccountSpec, ClusterSpec, NodesSpec, OfferingSpec, ProjectSpec, Scenario};

/// Everything a simulator run starts from. The listen address is not part of it: [`spawn`]
/// binds `127.0.0.1:0`, [`serve`] takes a bound listener.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The API key requests must carry. Empty: a random one is generated.
    pub api_key: String,
    /// The secret key requests are signed with. Empty: a random one is generated.
    pub secret_key: String,
    /// Seed of every generated id (zone, offerings, clusters, VMs, jobs) and of fault decisions.
    pub seed: u64,
    /// Timings and faults at start.
    pub settings: SimSettings,
    /// Zone, offerings and clusters at start.
    pub scenario: Scenario,
    /// What `listCapabilities` reports as `cloudstackversion`.
    pub cloudstack_version: String,
}

impl Default for SimConfig {
    /// The demo cluster, generated keys, seed 1, default (second-scale) timings.
    fn default() -> Self {
        Self {
            api_key: String::new(),
            secret_key: String::new(),
            seed: 1,
            settings: SimSettings::default(),
            scenario: Scenario::demo(),
            cloudstack_version: "4.22.0.0".into(),
        }
    }
}

impl SimConfig {
    /// Fixed keys and millisecond timings: the usual start of a test.
    pub fn for_tests(api_key: &str, secret_key: &str) -> Self {
        Self {
            api_key: api_key.into(),
            secret_key: secret_key.into(),
            settings: SimSettings::fast(),
            ..Self::default()
        }
    }
}

use api::Spawn;
use clock::Clock;
use ids::IdGen;
use model::World;

/// State shared by the HTTP handlers, the job tasks and the scanner.
pub(crate) struct Shared {
    /// Everything simulated. A std mutex: it is never held across an `.await`, and each
    /// critical section is short (one command, one job step, one scanner pass).
    world: Mutex<World>,
    clock: Clock,
    /// The user's API key and secret key. A lock of their own: CloudStack replaces them when
    /// the user's keys are generated again ([`SimHandle::rotate_keys`]), and only that writes.
    keys: Mutex<(String, String)>,
    /// What `listCapabilities` reports (an upgrade changes it: [`SimHandle::set_cloudstack_version`]).
    version: Mutex<String>,
    /// Wakes the scanner when its interval changes.
    settings_changed: Notify,
    /// `true` once the simulator shuts down; job tasks and the scanner stop at their next sleep.
    shutdown: watch::Sender<bool>,
    /// Job tasks still running, so that shutdown can wait for them.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The API rate limit's counters (`api.throttling.*`). Apart from the world: a request is
    /// counted before its command runs, and the counters outlive nothing the world holds.
    throttle: Mutex<throttle::Limiter>,
}

impl Shared {
    /// The API key and secret key requests must be signed with now.
    pub(crate) fn keys(&self) -> (String, String) {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The version `listCapabilities` reports now.
    pub(crate) fn version(&self) -> String {
        self.version
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn throttle(&self) -> MutexGuard<'_, throttle::Limiter> {
        self.throttle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        // A panic in another holder leaves plain data behind; keep serving it.
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn_job(self: &Arc<Self>, spawn: Spawn) {
        let sh = self.clone();
        let handle = match spawn {
            Spawn::Scale {
                job_id,
                cluster_id,
                plan,
                settings,
            } => tokio::spawn(jobs::run_scale(sh, job_id, cluster_id, *plan, *settings)),
            Spawn::VmOp {
                job_id,
                vm_id,
                start,
                duration,
            } => tokio::spawn(jobs::run_vm_op(sh, job_id, vm_id, start, duration)),
            Spawn::Pickup {
                job_id,
                request,
                delay,
            } => tokio::spawn(jobs::run_pickup(sh, job_id, *request, delay)),
        };
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }
}

/// The keys a config will use: its own, or fresh random keys where it has none. Keys are not
/// derived from the seed: a simulator reachable from elsewhere should not have guessable keys.
pub fn resolve_keys(config: &SimConfig) -> (String, String) {
    let mut ids = IdGen::new(rand::random());
    let api_key = if config.api_key.is_empty() {
        ids.key()
    } else {
        config.api_key.clone()
    };
    let secret_key = if config.secret_key.is_empty() {
        ids.key()
    } else {
        config.secret_key.clone()
    };
    (api_key, secret_key)
}

/// Gives every account of the config's scenario that has no keys fresh random ones (as
/// [`resolve_keys`] does for the simulator's own key), so that a caller can print them.
pub fn resolve_account_keys(config: &mut SimConfig) {
    let mut ids = IdGen::new(rand::random());
    for a in &mut config.scenario.accounts {
        if a.api_key.is_none() {
            a.api_key = Some(ids.key());
        }
        if a.secret_key.is_none() {
            a.secret_key = Some(ids.key());
        }
    }
}

/// Builds the shared state from a config: world from the scenario, keys generated when empty.
fn build(config: SimConfig) -> anyhow::Result<Arc<Shared>> {
    let (api_key, secret_key) = resolve_keys(&config);
    let ids = IdGen::new(config.seed);
    let fault_rng = IdGen::new(config.seed ^ 0x5eed_fa17);
    let world = config
        .scenario
        .build(config.settings, ids, fault_rng)
        .context("building the simulated CloudStack")?;
    let (shutdown, _) = watch::channel(false);
    Ok(Arc::new(Shared {
        world: Mutex::new(world),
        clock: Clock::new(),
        keys: Mutex::new((api_key, secret_key)),
        version: Mutex::new(config.cloudstack_version),
        settings_changed: Notify::new(),
        shutdown,
        tasks: Mutex::new(Vec::new()),
        throttle: Mutex::new(throttle::Limiter::default()),
    }))
}

/// The status scanner: every `scanner_interval`, Running -> Alert when a VM is down or missing,
/// Alert -> Running when every VM runs and every node is Ready.
async fn scanner(sh: Arc<Shared>) {
    let mut stop = sh.shutdown.subscribe();
    loop {
        let interval = sh.lock().settings.scanner_interval;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = sh.settings_changed.notified() => continue,
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let changes = sh.lock().scan(sh.clock.now_ms());
        for (id, from, to) in changes {
            tracing::info!(cluster = %id, %from, %to, "status scanner changed cluster state");
        }
    }
}

/// Serves the simulator on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: SimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let sh = build(config)?;
    run(sh, listener, shutdown).await
}

async fn run(
    sh: Arc<Shared>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let scanner_task = tokio::spawn(scanner(sh.clone()));
    let app = http::router(sh.clone()).into_make_service_with_connect_info::<http::ConnKill>();
    let stop = sh.shutdown.clone();
    let result = axum::serve(http::KillableListener(listener), app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop.send(true);
        })
        .await;
    let _ = sh.shutdown.send(true);
    let _ = scanner_task.await;
    let tasks: Vec<_> = std::mem::take(&mut *sh.tasks.lock().unwrap_or_else(|e| e.into_inner()));
    for t in tasks {
        let _ = t.await;
    }
    result.context("simulator HTTP server failed")
}

/// A running simulator (started by [`spawn`]) and direct access to its state for tests.
pub struct SimHandle {
    /// Where it listens (127.0.0.1 and an ephemeral port).
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT/client/api`.
    pub api_url: String,
    /// The keys at start ([`SimHandle::rotate_keys`] replaces them; [`SimHandle::keys`] tells
    /// the ones in force).
    pub api_key: String,
    pub secret_key: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Starts a simulator on `127.0.0.1:0`.
pub async fn spawn(config: SimConfig) -> anyhow::Result<SimHandle> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding 127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let shared = build(config)?;
    let (api_key, secret_key) = shared.keys();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(shared.clone(), listener, async move {
        let _ = stopped.await;
    }));
    Ok(SimHandle {
        addr,
        api_url: format!("http://{addr}/client/api"),
        api_key,
        secret_key,
        shared,
        stop: Some(stop),
        server: Some(server),
    })
}

impl SimHandle {
    /// Ids of all clusters, in creation order.
    pub fn cluster_ids(&self) -> Vec<String> {
        self.shared
            .lock()
            .clusters
            .iter()
            .map(|c| c.id.clone())
            .collect()
    }

    /// The id of the cluster named `name`.
    pub fn cluster_id(&self, name: &str) -> Option<String> {
        self.shared
            .lock()
            .clusters
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.id.clone())
    }

    /// What `listKubernetesClusters` shows for cluster `id` (`null` if there is none).
    pub fn cluster_json(&self, id: &str) -> serde_json::Value {
        let mut w = self.shared.lock();
        w.refresh_nodes(self.shared.clock.now_ms());
        match (w.cluster(id), w.zones.first()) {
            (Some(c), Some(z)) => {
                serde_json::to_value(render::cluster(&w, c, z)).unwrap_or_default()
            }
            _ => serde_json::Value::Null,
        }
    }

    /// The state of cluster `id`.
    pub fn cluster_state(&self, id: &str) -> Option<ClusterState> {
        self.shared.lock().cluster(id).map(|c| c.state)
    }

    /// Sets a cluster's state at once (tests: e.g. put a cluster in Alert without waiting for
    /// the scanner).
    pub fn set_cluster_state(&self, id: &str, state: ClusterState) -> bool {
        match self.shared.lock().cluster_mut(id) {
            Some(c) => {
                c.state = state;
                true
            }
            None => false,
        }
    }

    /// VM ids of a cluster with their names and states, in creation order.
    pub fn vms(&self, cluster_id: &str) -> Vec<(String, String, VmState)> {
        self.shared
            .lock()
            .cluster(cluster_id)
            .map(|c| {
                c.vms
                    .iter()
                    .map(|v| (v.id.clone(), v.name.clone(), v.state))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stops a VM at once (its node stays registered, NotReady). `false` if no such VM.
    pub fn stop_vm(&self, vm_id: &str) -> bool {
        self.set_vm_state(vm_id, VmState::Stopped)
    }

    /// Starts a VM at once; its node is Ready again after the kubelet delay.
    pub fn start_vm(&self, vm_id: &str) -> bool {
        self.set_vm_state(vm_id, VmState::Running)
    }

    /// Sets a VM's state at once.
    pub fn set_vm_state(&self, vm_id: &str, state: VmState) -> bool {
        let now = self.shared.clock.now_ms();
        self.shared.lock().set_vm_state(vm_id, state, now)
    }

    /// Makes VM `vm_id`'s Kubernetes node absent while the VM keeps its state: the node object
    /// is deleted and the kubelet does not register again (a node that never joined, e.g. a
    /// scale-up whose kubelet failed). Draining such a Running VM fails (NotFound), and a
    /// scale-up waiting for it times out. `false` if no such VM.
    pub fn remove_node(&self, vm_id: &str) -> bool {
        self.shared.lock().remove_node(vm_id)
    }

    /// `false`: VM `vm_id`'s node turns NotReady although the VM keeps running (kubelet down,
    /// network cut); draining it fails and the status scanner keeps the cluster in Alert.
    /// `true`: the node is Ready again (given its VM runs and the kubelet delay has passed).
    /// `false` if no such VM.
    pub fn set_node_ready(&self, vm_id: &str, ready: bool) -> bool {
        self.shared.lock().set_node_ready(vm_id, ready)
    }

    /// `kubectl uncordon`: VM `vm_id`'s node is schedulable again (a failed drain leaves it
    /// cordoned, and CloudStack does not count a cordoned node as Ready). `false` if no such VM.
    pub fn uncordon_node(&self, vm_id: &str) -> bool {
        self.shared.lock().uncordon_node(vm_id)
    }

    /// Submits `scaleKubernetesCluster` for `cluster_id` with `params` (e.g. `[("size", "4")]`)
    /// as another client of the same account would (CKS's own autoscaler, an operator, another
    /// cluster's provider): the job is the account's, so `listAsyncJobs` lists it, but the
    /// request is not recorded in [`Self::requests`] and is never faulted. Returns the job id,
    /// or CloudStack's error text when the call itself is refused (431).
    pub fn scale_as_other_client(
        &self,
        cluster_id: &str,
        params: &[(&str, &str)],
    ) -> Result<String, String> {
        let mut pairs = vec![
            ("id".to_string(), cluster_id.to_string()),
            ("response".to_string(), "json".to_string()),
        ];
        pairs.extend(params.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let p = api::Params::from_pairs(pairs);
        let (reply, spawn) = {
            let mut w = self.shared.lock();
            let caller = w.key_caller();
            api::dispatch(
                &mut w,
                "scaleKubernetesCluster",
                &p,
                self.shared.clock.now_ms(),
                &self.shared.version(),
                &caller,
            )
        };
        if let Some(spawn) = spawn {
            self.shared.spawn_job(spawn);
        }
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
        let inner = &body["scalekubernetesclusterresponse"];
        match inner["jobid"].as_str() {
            Some(job) if reply.status == 200 => Ok(job.to_string()),
            _ => Err(inner["errortext"].as_str().unwrap_or("refused").to_string()),
        }
    }

    /// The registered Kubernetes nodes (what `simListNodes` returns).
    pub fn nodes(&self) -> Vec<SimNode> {
        let now = self.shared.clock.now_ms();
        let mut w = self.shared.lock();
        w.refresh_nodes(now);
        w.nodes(None, now)
    }

    /// Every failed job, in creation order: (its id, its instance id, its error text).
    pub fn failed_jobs(&self) -> Vec<(String, String, String)> {
        let w = self.shared.lock();
        w.job_order
            .iter()
            .filter_map(|id| w.jobs.get(id))
            .filter(|j| j.status == model::JobStatus::Failed)
            .map(|j| {
                let text = match &j.result {
                    Some(model::JobResult::Json(v)) => {
                        v["errortext"].as_str().unwrap_or_default().to_string()
                    }
                    _ => String::new(),
                };
                (j.id.clone(), j.instance_id.clone(), text)
            })
            .collect()
    }

    /// Requests that worked against a running scale-up (a VM it provisions stopped), in order.
    pub fn interference(&self) -> Vec<String> {
        self.shared.lock().interference.clone()
    }

    /// Every CloudStack request received so far (what `simRequests` returns).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The CloudStack commands answered 429 by the API rate limit (`throttling`), in order.
    pub fn throttled(&self) -> Vec<String> {
        self.shared.throttle().throttled()
    }

    /// Forgets the recorded requests.
    pub fn reset_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// The current settings.
    pub fn settings(&self) -> SimSettings {
        self.shared.lock().settings.clone()
    }

    /// Changes timings and faults (like `simConfigure`).
    pub fn configure(&self, f: impl FnOnce(&mut SimSettings)) {
        f(&mut self.shared.lock().settings);
        self.shared.settings_changed.notify_waiters();
    }

    /// Scale jobs of this cluster still in progress.
    pub fn running_jobs(&self, cluster_id: &str) -> usize {
        api::running_jobs(&self.shared.lock(), cluster_id)
    }

    /// Adds `count` succeeded scale jobs of cluster `cluster_id`, created `age` ago and ordered
    /// before every other job: the job history an account builds up. `queryAsyncJobResult`
    /// answers for them; `listAsyncJobs` never lists them (a real 4.21 marks an ended job
    /// removed: `recorded/running_30_listAsyncJobs_after`).
    pub fn add_past_jobs(&self, cluster_id: &str, count: usize, age: std::time::Duration) {
        let created = u64::try_from(clock::unix_now())
            .unwrap_or(0)
            .saturating_sub(age.as_secs());
        jobs::add_past_jobs(&mut self.shared.lock(), cluster_id, count, created, false);
    }

    /// Adds `count` scale jobs of cluster `cluster_id` created `age` ago that never end here:
    /// other clients' jobs still running, which `listAsyncJobs` lists
    /// (`recorded/running_26_listAsyncJobs_while_scaling`).
    pub fn add_running_jobs(&self, cluster_id: &str, count: usize, age: std::time::Duration) {
        let created = u64::try_from(clock::unix_now())
            .unwrap_or(0)
            .saturating_sub(age.as_secs());
        jobs::add_past_jobs(&mut self.shared.lock(), cluster_id, count, created, true);
    }

    /// Upgrades the simulated CloudStack: `listCapabilities` reports `version` from now on.
    pub fn set_cloudstack_version(&self, version: &str) {
        *self
            .shared
            .version
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = version.to_string();
    }

    /// The user's keys are generated again, as CloudStack's "Generate keys" (`registerUserKeys`)
    /// does: from now on only `api_key` and `secret_key` are accepted, and a request signed
    /// with the previous pair is refused as CloudStack refuses it (HTTP 401, errorcode 401,
    /// "unable to verify user credentials and/or request signature").
    pub fn rotate_keys(&self, api_key: &str, secret_key: &str) {
        *self
            .shared
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (api_key.to_string(), secret_key.to_string());
    }

    /// The API key and secret key accepted now.
    pub fn keys(&self) -> (String, String) {
        self.shared.keys()
    }

    /// The API key and secret key of the scenario's account `name` (`Scenario::accounts`;
    /// generated when the scenario gives none), or `None` for no such account.
    pub fn account_keys(&self, name: &str) -> Option<(String, String)> {
        self.shared
            .lock()
            .accounts
            .iter()
            .find(|a| a.name == name)
            .map(|a| (a.api_key.clone(), a.secret_key.clone()))
    }

    /// Gives the scenario's account `name` another role (an operator editing the account's
    /// role); `false` for no such account.
    pub fn set_account_role(&self, name: &str, role: KeyRole) -> bool {
        match self
            .shared
            .lock()
            .accounts
            .iter_mut()
            .find(|a| a.name == name)
        {
            Some(a) => {
                a.role = role;
                true
            }
            None => false,
        }
    }

    /// The ids of the scenario's project `name`, or of the account `name` (the key's own is
    /// [`scenario::KEY_ACCOUNT`]): what answers show as `projectid` / `accountid`.
    pub fn owner_id(&self, name: &str) -> Option<String> {
        let w = self.shared.lock();
        if name == scenario::KEY_ACCOUNT {
            return Some(w.owner.account_id.clone());
        }
        w.projects
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.id.clone())
            .or_else(|| {
                w.accounts
                    .iter()
                    .find(|a| a.name == name)
                    .map(|a| a.id.clone())
            })
    }

    /// Runs one status-scanner pass now, whatever the interval.
    pub fn scan_now(&self) {
        let now = self.shared.clock.now_ms();
        self.shared.lock().scan(now);
    }

    /// Milliseconds since the simulator started (the time base of `atms` and `registeredms`).
    pub fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    /// Stops serving, ends the job tasks and the scanner, and waits for them.
    pub async fn shutdown(mut self) {
        self.stop_now();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    fn stop_now(&mut self) {
        let _ = self.shared.shutdown.send(true);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}
