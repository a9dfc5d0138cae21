//! A bounded load test: many concurrent clients call every RPC of the provider (the real
//! binary, so its memory is its own) while the simulated CloudStack adds latency, answers some
//! requests with 5xx pages, drops some connections after running the command and truncates
//! some answers. Two clusters are scaled up and down at random the whole time.
//!
//! Asserted:
//! - the provider process never dies or panics;
//! - every answer carries an expected code for what was asked:
//!   - reads (NodeGroups, NodeGroupForNode, NodeGroupNodes, NodeGroupTargetSize, GPULabel,
//!     GetAvailableGPUTypes, Cleanup): OK;
//!   - Refresh: OK, or UNAVAILABLE when no snapshot is within the staleness bound;
//!   - NodeGroupTemplateNodeInfo: OK, UNAVAILABLE, FAILED_PRECONDITION;
//!   - NodeGroupGetOptions (no overrides configured): UNIMPLEMENTED;
//!   - NodeGroupIncreaseSize: OK, FAILED_PRECONDITION (a job or a lost answer in the way, a
//!     CloudStack refusal), OUT_OF_RANGE (beyond max), UNAVAILABLE (CloudStack failing);
//!   - NodeGroupDeleteNodes: OK, FAILED_PRECONDITION (job running, min size, instance being
//!     created), NOT_FOUND (the VM went away meanwhile), UNAVAILABLE;
//!   - NodeGroupDecreaseTargetSize: OK, FAILED_PRECONDITION;
//!   - invalid requests (delta 0, an unknown group): INVALID_ARGUMENT, NOT_FOUND;
//! - the provider's resident memory at the end is at most 1.5× what it was after warm-up
//!   (memory stays flat: about 1.1× over a run, since adoption checks read only recent jobs, a
//!   page at a time, and answers are parsed without copies; docs/benchmarks.md, findings 4 and 6);
//! - no cluster ever has two scale jobs at once (sampled every few milliseconds);
//! - once the faults stop and the jobs settle (and failed instances are deleted, as the
//!   autoscaler does), the provider's target size equals CloudStack's size for every cluster
//!   CloudStack did not strand (a failed scale-up leaving VMs its size does not count).
//!
//! The clients ask what the real autoscaler asks: unregistered instances are deleted only
//! after the provision time (the provider's `--max-node-provision-time` is the same).
//!
//! `SOAK_SECS` (default 40) sets the load duration, `SOAK_CLIENTS` (default 24) the number of
//! concurrent clients.

use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, ClusterSpec, Scenario, SimConfig, SimHandle};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use cks_testkit::wait_until_for;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(5);
/// The autoscaler's `--max-node-provision-time`, given to the provider too (they must agree).
const PROVISION: Duration = Duration::from_secs(5);

/// Runs its function if the test fails while this lives (to show what the test saw).
struct OnFailure<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnFailure<F> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            (self.0)()
        }
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    NodeGroups,
    ForNode,
    Nodes,
    TargetSize,
    Refresh,
    Increase,
    Delete,
    Decrease,
    Template,
    GetOptions,
    GpuLabel,
    GpuTypes,
    Cleanup,
    InvalidDelta,
    UnknownGroup,
}

impl Kind {
    /// The mix: reads dominate, as in an autoscaler loop; scale requests are frequent enough
    /// to keep jobs running most of the time.
    const MIX: [(Kind, u32); 15] = [
        (Kind::NodeGroups, 8),
        (Kind::ForNode, 30),
        (Kind::Nodes, 10),
        (Kind::TargetSize, 10),
        (Kind::Refresh, 8),
        (Kind::Increase, 6),
        (Kind::Delete, 6),
        (Kind::Decrease, 3),
        (Kind::Template, 2),
        (Kind::GetOptions, 2),
        (Kind::GpuLabel, 1),
        (Kind::GpuTypes, 1),
        (Kind::Cleanup, 1),
        (Kind::InvalidDelta, 1),
        (Kind::UnknownGroup, 1),
    ];

    fn allowed(self) -> &'static [Code] {
        use Code::*;
        match self {
            Kind::NodeGroups
            | Kind::ForNode
            | Kind::Nodes
            | Kind::TargetSize
            | Kind::GpuLabel
            | Kind::GpuTypes
            | Kind::Cleanup => &[Ok],
            Kind::Refresh => &[Ok, Unavailable],
            Kind::Template => &[Ok, Unavailable, FailedPrecondition],
            Kind::GetOptions => &[Unimplemented],
            Kind::Increase => &[Ok, FailedPrecondition, OutOfRange, Unavailable],
            Kind::Delete => &[Ok, FailedPrecondition, NotFound, Unavailable],
            Kind::Decrease => &[Ok, FailedPrecondition],
            Kind::InvalidDelta => &[InvalidArgument],
            Kind::UnknownGroup => &[NotFound],
        }
    }

    fn pick(rng: &mut StdRng) -> Kind {
        let total: u32 = Self::MIX.iter().map(|(_, w)| w).sum();
        let mut x = rng.random_range(0..total);
        for (k, w) in Self::MIX {
            if x < w {
                return k;
            }
            x -= w;
        }
        Kind::NodeGroups
    }
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(DEADLINE);
    r
}

fn grpc_node(provider_id: String, name: String, fake: Option<&str>) -> pb::ExternalGrpcNode {
    let mut annotations = HashMap::new();
    if let Some(reason) = fake {
        annotations.insert(
            "k8s.io/cluster-autoscaler/fake-node-reason".to_string(),
            reason.to_string(),
        );
    }
    pb::ExternalGrpcNode {
        provider_id,
        name,
        labels: HashMap::new(),
        annotations,
    }
}

/// One call of `kind`; returns its code.
async fn call(
    c: &mut CloudProviderClient<Channel>,
    sim: &SimHandle,
    clusters: &[String],
    kind: Kind,
    rng: &mut StdRng,
    unregistered_since: &mut HashMap<String, Instant>,
) -> Code {
    let group = clusters[rng.random_range(0..clusters.len())].clone();
    let code = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    match kind {
        Kind::NodeGroups => code(
            c.node_groups(req(pb::NodeGroupsRequest {}))
                .await
                .map(|_| ()),
        ),
        Kind::ForNode => {
            let nodes = sim.nodes();
            let node = if nodes.is_empty() || rng.random_bool(0.05) {
                grpc_node(
                    "external-cloudstack://00000000-0000-0000-0000-000000000000".into(),
                    "stranger".into(),
                    None,
                )
            } else {
                let n = &nodes[rng.random_range(0..nodes.len())];
                grpc_node(n.providerid.clone(), n.name.clone(), None)
            };
            code(
                c.node_group_for_node(req(pb::NodeGroupForNodeRequest { node: Some(node) }))
                    .await
                    .map(|_| ()),
            )
        }
        Kind::Nodes => code(
            c.node_group_nodes(req(pb::NodeGroupNodesRequest { id: group }))
                .await
                .map(|_| ()),
        ),
        Kind::TargetSize => code(
            c.node_group_target_size(req(pb::NodeGroupTargetSizeRequest { id: group }))
                .await
                .map(|_| ()),
        ),
        Kind::Refresh => code(c.refresh(req(pb::RefreshRequest {})).await.map(|_| ())),
        Kind::Increase => code(
            c.node_group_increase_size(req(pb::NodeGroupIncreaseSizeRequest {
                delta: rng.random_range(1..=2),
                id: group,
            }))
            .await
            .map(|_| ()),
        ),
        Kind::Delete => {
            let mut nodes = Vec::new();
            for _ in 0..rng.random_range(1..=2) {
                if rng.random_bool(0.7) {
                    // A worker VM as its Kubernetes node.
                    let workers: Vec<_> = sim
                        .vms(&group)
                        .into_iter()
                        .filter(|(_, n, _)| n.contains("-node-"))
                        .collect();
                    if let Some((id, name, _)) =
                        workers.get(rng.random_range(0..workers.len().max(1)))
                    {
                        nodes.push(grpc_node(
                            format!("external-cloudstack://{id}"),
                            name.to_lowercase(),
                            None,
                        ));
                    }
                } else {
                    // An instance as the autoscaler sees it, deleted through a fake node
                    // when it has no node (placeholders, failed creations).
                    let list = c
                        .node_group_nodes(req(pb::NodeGroupNodesRequest { id: group.clone() }))
                        .await
                        .map(|r| r.into_inner().instances)
                        .unwrap_or_default();
                    if let Some(i) = list.get(rng.random_range(0..list.len().max(1))) {
                        let failed = i.status.as_ref().is_some_and(|s| s.error_info.is_some());
                        let registered = sim.nodes().iter().any(|n| n.providerid == i.id);
                        if failed {
                            // `deleteCreatedNodesWithErrors` (core/static_autoscaler.go).
                            nodes.push(grpc_node(i.id.clone(), i.id.clone(), Some("create-error")));
                        } else if !registered {
                            // `removeOldUnregisteredNodes`: only once the instance has had no
                            // node for the provision time.
                            let since = *unregistered_since
                                .entry(i.id.clone())
                                .or_insert_with(Instant::now);
                            if since.elapsed() > PROVISION {
                                nodes.push(grpc_node(
                                    i.id.clone(),
                                    i.id.clone(),
                                    Some("unregistered"),
                                ));
                            }
                        }
                    }
                }
            }
            if nodes.is_empty() {
                return Code::Ok;
            }
            code(
                c.node_group_delete_nodes(req(pb::NodeGroupDeleteNodesRequest {
                    nodes,
                    id: group,
                }))
                .await
                .map(|_| ()),
            )
        }
        Kind::Decrease => code(
            c.node_group_decrease_target_size(req(pb::NodeGroupDecreaseTargetSizeRequest {
                delta: -1,
                id: group,
            }))
            .await
            .map(|_| ()),
        ),
        Kind::Template => code(
            c.node_group_template_node_info(req(pb::NodeGroupTemplateNodeInfoRequest {
                id: group,
            }))
            .await
            .map(|_| ()),
        ),
        Kind::GetOptions => code(
            c.node_group_get_options(req(pb::NodeGroupAutoscalingOptionsRequest {
                id: group,
                defaults: None,
            }))
            .await
            .map(|_| ()),
        ),
        Kind::GpuLabel => code(c.gpu_label(req(pb::GpuLabelRequest {})).await.map(|_| ())),
        Kind::GpuTypes => code(
            c.get_available_gpu_types(req(pb::GetAvailableGpuTypesRequest {}))
                .await
                .map(|_| ()),
        ),
        Kind::Cleanup => code(c.cleanup(req(pb::CleanupRequest {})).await.map(|_| ())),
        Kind::InvalidDelta => code(
            c.node_group_increase_size(req(pb::NodeGroupIncreaseSizeRequest {
                delta: 0,
                id: group,
            }))
            .await
            .map(|_| ()),
        ),
        Kind::UnknownGroup => code(
            c.node_group_target_size(req(pb::NodeGroupTargetSizeRequest {
                id: "no-such-group".into(),
            }))
            .await
            .map(|_| ()),
        ),
    }
}

fn cluster(name: &str, workers: u64) -> ClusterSpec {
    let mut c = ClusterSpec::new(name, 1, workers);
    c.min_size = Some(1);
    c.max_size = Some(12);
    c.autoscaling = true;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_against_a_faulty_cloudstack() {
    let secs = env_or("SOAK_SECS", 40);
    let clients = env_or("SOAK_CLIENTS", 24) as usize;
    let mut cfg = SimConfig::for_tests(cks_testkit::API_KEY, cks_testkit::SECRET_KEY);
    cfg.scenario = Scenario {
        clusters: vec![cluster("alpha", 4), cluster("beta", 3)],
        ..Scenario::empty()
    };
    cfg.settings.job_duration = Duration::from_millis(150);
    let sim = Arc::new(sim::spawn(cfg).await.expect("simulator"));
    let clusters = sim.cluster_ids();
    let args = ProviderArgs::new(
        &sim.api_url,
        &sim.api_key,
        &sim.secret_key,
        clusters.iter().map(|c| format!("1:12:{c}")).collect(),
    )
    .flag("--job-poll-interval", "50ms")
    .flag("--refresh-min-interval", "100ms")
    .flag("--scale-watch", "100ms")
    .flag("--staleness-bound", "30s")
    .flag("--cloudstack-timeout", "2s")
    .flag("--max-node-provision-time", "5s")
    // Several clusters: each group bound to its client over mutual TLS (one client here).
    .bound_to("soak", cks_testkit::certs::bound_tls("soak"));
    let bin = Path::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak");
    let mut provider = ProviderProcess::spawn(bin, &dir, args).await;
    provider.wait_serving(Duration::from_secs(60)).await;

    sim.configure(|s| {
        s.latency = Duration::from_millis(15);
        s.error_rate = 0.05;
        s.drop_rate = 0.03;
        s.malformed_rate = 0.02;
    });

    // At most one scale job per cluster, sampled all along.
    let stop = Arc::new(AtomicBool::new(false));
    let max_jobs = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (sim, clusters, stop, max_jobs) = (
            sim.clone(),
            clusters.clone(),
            stop.clone(),
            max_jobs.clone(),
        );
        tokio::spawn(async move {
            // A sampling period, not a wait.
            let mut every = tokio::time::interval(Duration::from_millis(3));
            while !stop.load(Ordering::Relaxed) {
                every.tick().await;
                for c in &clusters {
                    max_jobs.fetch_max(sim.running_jobs(c), Ordering::Relaxed);
                }
            }
        })
    };

    let counts: Arc<Mutex<BTreeMap<(Kind, String), u64>>> = Arc::default();
    let unexpected: Arc<Mutex<Vec<String>>> = Arc::default();
    let load_until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for k in 0..clients {
        let mut c = provider.client();
        let (sim, clusters, counts, unexpected) = (
            sim.clone(),
            clusters.clone(),
            counts.clone(),
            unexpected.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(0x50a4 + k as u64);
            let mut unregistered_since = HashMap::new();
            while Instant::now() < load_until {
                let kind = Kind::pick(&mut rng);
                let code = call(
                    &mut c,
                    &sim,
                    &clusters,
                    kind,
                    &mut rng,
                    &mut unregistered_since,
                )
                .await;
                *counts
                    .lock()
                    .unwrap()
                    .entry((kind, format!("{code:?}")))
                    .or_default() += 1;
                if !kind.allowed().contains(&code) {
                    unexpected
                        .lock()
                        .unwrap()
                        .push(format!("{kind:?} -> {code:?}"));
                }
            }
        }));
    }

    // Memory after warm-up, then at the end of the load. The load is a span of real time the
    // provider process has to go through (its clock is its own), so the warm-up is one: the
    // first reading is the baseline.
    let warm_up = Duration::from_secs((secs / 4).clamp(3, 15));
    tokio::time::sleep(warm_up).await;
    let rss_warm = provider.rss_kib().expect("VmRSS");
    let mut rss_max = rss_warm;
    let mut trace = vec![rss_warm];
    // Then a reading every 0.5 s (a sampling period) until the load ends.
    let mut every = tokio::time::interval(Duration::from_millis(500));
    every.tick().await;
    loop {
        every.tick().await;
        if Instant::now() >= load_until {
            break;
        }
        let now = provider.rss_kib().unwrap_or(0);
        trace.push(now);
        rss_max = rss_max.max(now);
    }
    eprintln!("provider RSS every 0.5 s after warm-up (KiB): {trace:?}");
    for t in tasks {
        t.await.expect("client task");
    }
    let rss_end = provider.rss_kib().expect("VmRSS");

    // Faults off; let the jobs (and what queued behind them) finish, deleting failed
    // creations as the autoscaler does, until every target equals CloudStack's size.
    sim.configure(|s| {
        s.latency = Duration::ZERO;
        s.error_rate = 0.0;
        s.drop_rate = 0.0;
        s.malformed_rate = 0.0;
    });
    let mut c = provider.client();
    // Settled: every target equals CloudStack's size with no job running, on every check for
    // at least 400 ms (and three checks) in a row.
    let mut stable = 0;
    let mut stable_since: Option<Instant> = None;
    let last = Mutex::new(String::new());
    let shown = OnFailure(|| {
        eprintln!(
            "never settled; last: {}\nprovider log:\n{}",
            last.lock().unwrap(),
            provider.log()
        )
    });
    let settled = async || {
        let _ = c.refresh(req(pb::RefreshRequest {})).await;
        let mut all_equal = true;
        let mut seen = String::new();
        for id in &clusters {
            let instances = c
                .node_group_nodes(req(pb::NodeGroupNodesRequest { id: id.clone() }))
                .await
                .map(|r| r.into_inner().instances)
                .unwrap_or_default();
            let failed: Vec<_> = instances
                .iter()
                .filter(|i| {
                    i.status.as_ref().is_some_and(|s| {
                        s.error_info.is_some()
                            && s.instance_state
                                == pb::instance_status::InstanceState::InstanceCreating as i32
                    })
                })
                .map(|i| grpc_node(i.id.clone(), i.id.clone(), Some("create-error")))
                .collect();
            if !failed.is_empty() {
                let _ = c
                    .node_group_delete_nodes(req(pb::NodeGroupDeleteNodesRequest {
                        nodes: failed,
                        id: id.clone(),
                    }))
                    .await;
            }
            let target = c
                .node_group_target_size(req(pb::NodeGroupTargetSizeRequest { id: id.clone() }))
                .await
                .map(|r| r.into_inner().target_size);
            let cs = sim.cluster_json(id);
            let idle = sim.running_jobs(id) == 0;
            let size = cs["size"].as_i64().unwrap_or(-1);
            // Stranded by CloudStack: a failed scale-up left VMs its size does not count (one
            // in Error, or Running ones after a timeout); only an operator removes them, and
            // CloudStack's VM-count rule refuses every request meanwhile. Counted apart.
            let workers = sim
                .vms(id)
                .into_iter()
                .filter(|(_, n, _)| n.contains("-node-"))
                .collect::<Vec<_>>();
            if idle
                && (workers.len() as i64 > size
                    || workers.iter().any(|(_, _, st)| *st == sim::VmState::Error))
            {
                seen.push_str(&format!("[{} stranded by CloudStack] ", cs["name"]));
                continue;
            }
            seen.push_str(&format!(
                "[{} target {target:?} size {size} state {} jobs {}] ",
                cs["name"],
                cs["state"],
                sim.running_jobs(id)
            ));
            // Removals the provider accepted and still owes (a job failed under the faults, or
            // CloudStack's rules refuse it until the cluster recovers; retried after a backoff
            // of up to 10 minutes) are out of the target and still in CloudStack's size: listed
            // Deleting.
            let owed = instances
                .iter()
                .filter(|i| {
                    i.status.as_ref().is_some_and(|s| {
                        s.instance_state
                            == pb::instance_status::InstanceState::InstanceDeleting as i32
                    })
                })
                .count() as i64;
            all_equal &= idle && target.as_ref().ok().map(|t| i64::from(*t) + owed) == Some(size);
        }
        *last.lock().unwrap() = seen;
        if !all_equal {
            (stable, stable_since) = (0, None);
            return false;
        }
        stable += 1;
        let since = *stable_since.get_or_insert_with(Instant::now);
        stable >= 3 && since.elapsed() >= Duration::from_millis(400)
    };
    wait_until_for(
        "every target to settle at CloudStack's size",
        Duration::from_secs(90),
        settled,
    )
    .await;
    drop(shown);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.await;

    let counts = counts.lock().unwrap().clone();
    let total: u64 = counts.values().sum();
    let mut summary = String::new();
    for ((kind, code), n) in &counts {
        summary.push_str(&format!("{kind:?} {code}: {n}\n"));
    }
    let scale_requests = sim
        .requests()
        .iter()
        .filter(|r| r.command == "scaleKubernetesCluster")
        .count();
    eprintln!(
        "{total} calls by {clients} clients in {secs} s; {scale_requests} scaleKubernetesCluster \
         requests; RSS after warm-up {rss_warm} KiB, max {rss_max} KiB, end {rss_end} KiB\n{summary}"
    );

    assert!(
        provider.exited().is_none(),
        "the provider died:\n{}",
        provider.log()
    );
    assert!(!provider.log().contains("panicked"), "{}", provider.log());
    let unexpected = unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "unexpected codes ({}): {:?}\n{summary}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(20)]
    );
    for kind in [Kind::Increase, Kind::Delete] {
        assert!(
            counts.get(&(kind, "Ok".to_string())).copied().unwrap_or(0) > 0,
            "no {kind:?} ever succeeded, so the load did not scale anything:\n{summary}"
        );
    }
    // A leak shows as a trend under the same load: the median of the last third of the
    // readings against the median of the first third. (Single readings swing by half with the
    // requests in flight at that moment, so comparing two of them fails by chance.)
    let factor = 1.5;
    let third = (trace.len() / 3).max(1);
    let median = |xs: &[u64]| {
        let mut v = xs.to_vec();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let early = median(&trace[..third]);
    let late = median(&trace[trace.len() - third..]);
    eprintln!(
        "provider RSS median: {early} KiB in the first third of the load, {late} KiB in the last ({:.2}×)",
        late as f64 / early.max(1) as f64
    );
    assert!(
        (late as f64) <= factor * early as f64,
        "memory grew: median {early} KiB in the first third of the load, {late} KiB in the last \
         (bound {factor}×); readings: {trace:?}"
    );
    assert_eq!(
        max_jobs.load(Ordering::Relaxed),
        1,
        "a cluster had two scale jobs at once (or none ran)"
    );
}
