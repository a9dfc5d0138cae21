//! Per-RPC latency and throughput over loopback, side by side with the cheapest RPC the same
//! server answers: the gRPC health check (`grpc.health.v1.Health/Check`).
//!
//! The provider runs as its own process (the release `cks-autoscaler-provider serve` binary)
//! against an in-process simulator with a cluster of 100 workers (and one of 3, for
//! NodeGroupNodes with a small answer); this process is the load
//! generator: N tokio tasks calling one RPC in a loop through generated tonic clients (one HTTP/2
//! connection per 64 callers). Every RPC is measured in rounds that alternate with the baseline
//! on the same server, so machine noise hits both; the ratios are the result.
//!
//! `cargo bench --bench rpc_latency [-- --write] [-- --quick]`

mod support;

use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, ClusterSpec, Scenario, SimConfig, SimHandle};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{BenchArgs, Latency, Table, fmt_dur, report};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Workers of the measured cluster; a second cluster of 3 workers shows NodeGroupNodes
/// without the payload of 100 instances.
const WORKERS: u64 = 100;
const SMALL: u64 = 3;
const LEVELS: [usize; 3] = [1, 64, 512];
const CALLERS_PER_CONNECTION: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Health,
    NodeGroupForNode,
    NodeGroupNodes,
    NodeGroupNodesSmall,
    NodeGroupTargetSize,
    RefreshCached,
    RefreshCloudStack,
}

impl Rpc {
    fn label(self) -> &'static str {
        match self {
            Rpc::Health => "Health/Check",
            Rpc::NodeGroupForNode => "NodeGroupForNode",
            Rpc::NodeGroupNodes => "NodeGroupNodes (100 instances)",
            Rpc::NodeGroupNodesSmall => "NodeGroupNodes (3 instances)",
            Rpc::NodeGroupTargetSize => "NodeGroupTargetSize",
            Rpc::RefreshCached => "Refresh (served from memory)",
            Rpc::RefreshCloudStack => "Refresh (calls listKubernetesClusters)",
        }
    }

    /// Hot reads: the ones with the 1.2× goal.
    fn hot(self) -> bool {
        !matches!(self, Rpc::RefreshCloudStack | Rpc::Health)
    }
}

/// What every caller needs to build a request.
struct Target {
    group: String,
    small_group: String,
    nodes: Vec<pb::ExternalGrpcNode>,
}

#[derive(Clone)]
struct Clients {
    cp: CloudProviderClient<Channel>,
    health: HealthClient<Channel>,
}

async fn call(c: &mut Clients, rpc: Rpc, t: &Target, i: usize) -> Result<(), tonic::Status> {
    match rpc {
        Rpc::Health => c
            .health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| ()),
        Rpc::NodeGroupForNode => {
            let node = t.nodes[i % t.nodes.len()].clone();
            let g =
                c.cp.node_group_for_node(pb::NodeGroupForNodeRequest { node: Some(node) })
                    .await?
                    .into_inner();
            // A wrong answer would make the comparison meaningless.
            assert_eq!(g.node_group.map(|g| g.id), Some(t.group.clone()));
            Ok(())
        }
        Rpc::NodeGroupNodes => {
            let n =
                c.cp.node_group_nodes(pb::NodeGroupNodesRequest {
                    id: t.group.clone(),
                })
                .await?
                .into_inner();
            assert_eq!(n.instances.len(), WORKERS as usize);
            Ok(())
        }
        Rpc::NodeGroupNodesSmall => {
            let n =
                c.cp.node_group_nodes(pb::NodeGroupNodesRequest {
                    id: t.small_group.clone(),
                })
                .await?
                .into_inner();
            assert_eq!(n.instances.len(), SMALL as usize);
            Ok(())
        }
        Rpc::NodeGroupTargetSize => {
            c.cp.node_group_target_size(pb::NodeGroupTargetSizeRequest {
                id: t.group.clone(),
            })
            .await
            .map(|_| ())
        }
        Rpc::RefreshCached | Rpc::RefreshCloudStack => {
            c.cp.refresh(pb::RefreshRequest {}).await.map(|_| ())
        }
    }
}

/// `callers` tasks calling `rpc` for `window`; returns the latencies and the wall time.
async fn run(
    conns: &[Clients],
    target: &Arc<Target>,
    rpc: Rpc,
    callers: usize,
    window: Duration,
) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let until = start + window;
    let mut tasks = Vec::with_capacity(callers);
    for k in 0..callers {
        let mut c = conns[k % conns.len()].clone();
        let t = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(4096);
            let mut i = k;
            while Instant::now() < until {
                let t0 = Instant::now();
                if let Err(e) = call(&mut c, rpc, &t, i).await {
                    panic!("{} failed: {e}", rpc.label());
                }
                lat.push(t0.elapsed());
                i += callers;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("caller task"));
    }
    (all, start.elapsed())
}

struct Measured {
    lat: Vec<Duration>,
    wall: Duration,
}

impl Measured {
    fn add(&mut self, (lat, wall): (Vec<Duration>, Duration)) {
        self.lat.extend(lat);
        self.wall += wall;
    }
    fn rate(&self) -> f64 {
        self.lat.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

async fn start_provider(sim: &SimHandle, clusters: &[&str], refresh_min: &str) -> ProviderProcess {
    let args = ProviderArgs::new(
        &sim.api_url,
        &sim.api_key,
        &sim.secret_key,
        clusters.iter().map(|c| format!("1:1000:{c}")).collect(),
    )
    .flag("--refresh-min-interval", refresh_min)
    .bound_to("bench", cks_testkit::certs::bound_tls("bench"));
    let p = ProviderProcess::spawn(support::provider_bin(), &support::work_dir("rpc"), args).await;
    p.wait_serving(Duration::from_secs(30)).await;
    p
}

fn connections(p: &ProviderProcess, callers: usize) -> Vec<Clients> {
    (0..callers.div_ceil(CALLERS_PER_CONNECTION))
        .map(|_| {
            let ch = p.channel();
            Clients {
                cp: CloudProviderClient::new(ch.clone()),
                health: HealthClient::new(ch),
            }
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let (rounds, window) = if args.quick {
        (2, Duration::from_millis(150))
    } else {
        (4, Duration::from_millis(300))
    };
    let machine = support::machine();
    let mut cfg = SimConfig::for_tests("bench-key", "bench-secret");
    cfg.settings.max_cluster_size = 2 * WORKERS + 10;
    cfg.scenario = Scenario {
        clusters: vec![
            ClusterSpec::new("bench", 1, WORKERS),
            ClusterSpec::new("small", 1, SMALL),
        ],
        ..Scenario::empty()
    };
    let sim = sim::spawn(cfg).await.expect("simulator");
    let cluster = sim.cluster_id("bench").expect("bench cluster");
    let small = sim.cluster_id("small").expect("small cluster");
    let nodes: Vec<pb::ExternalGrpcNode> = sim
        .nodes()
        .into_iter()
        .filter(|n| n.role == "worker" && n.clusterid == cluster)
        .map(|n| pb::ExternalGrpcNode {
            provider_id: n.providerid,
            name: n.name,
            labels: HashMap::new(),
            annotations: HashMap::new(),
        })
        .collect();
    let target = Arc::new(Target {
        group: cluster.clone(),
        small_group: small,
        nodes,
    });
    // One process answers Refresh from memory (the snapshot is an hour "fresh"), the other
    // fetches from the simulator on every Refresh.
    let cached = start_provider(&sim, &[&cluster, &target.small_group], "1h").await;
    let fetching = start_provider(&sim, &[&cluster], "0s").await;

    let rpcs = [
        Rpc::NodeGroupForNode,
        Rpc::NodeGroupNodes,
        Rpc::NodeGroupNodesSmall,
        Rpc::NodeGroupTargetSize,
        Rpc::RefreshCached,
        Rpc::RefreshCloudStack,
    ];
    let mut table = Table::new(&[
        "callers",
        "RPC",
        "p50",
        "p99",
        "calls/s",
        "health p50",
        "health p99",
        "health calls/s",
        "p50 ratio",
        "p99 ratio",
        "≤ 1.2×?",
    ]);
    let mut misses = Vec::new();
    let bench_started = Instant::now();
    for &callers in &LEVELS {
        for &rpc in &rpcs {
            let server = if rpc == Rpc::RefreshCloudStack {
                &fetching
            } else {
                &cached
            };
            let conns = connections(server, callers);
            // Warm-up: connections established, caches and allocators primed.
            run(&conns, &target, Rpc::Health, callers, window / 3).await;
            run(&conns, &target, rpc, callers, window / 3).await;
            let mut base = Measured {
                lat: Vec::new(),
                wall: Duration::ZERO,
            };
            let mut this = Measured {
                lat: Vec::new(),
                wall: Duration::ZERO,
            };
            for r in 0..rounds {
                // Alternate which goes first so neither always follows the other.
                if r % 2 == 0 {
                    base.add(run(&conns, &target, Rpc::Health, callers, window).await);
                    this.add(run(&conns, &target, rpc, callers, window).await);
                } else {
                    this.add(run(&conns, &target, rpc, callers, window).await);
                    base.add(run(&conns, &target, Rpc::Health, callers, window).await);
                }
            }
            let (b_rate, t_rate) = (base.rate(), this.rate());
            let b = Latency::of(&mut base.lat);
            let t = Latency::of(&mut this.lat);
            let r50 = t.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9);
            let r99 = t.p99.as_secs_f64() / b.p99.as_secs_f64().max(1e-9);
            let verdict = if !rpc.hot() {
                "(no goal)".to_string()
            } else if r50 <= 1.2 && r99 <= 1.2 {
                "yes".to_string()
            } else {
                misses.push(format!("{} at {callers}", rpc.label()));
                "**no**".to_string()
            };
            eprintln!(
                "{callers:>4} callers  {:<40} p50 {:>9} p99 {:>9} ({:>8.0}/s) | health p50 {:>9} p99 {:>9} ({:>8.0}/s)",
                rpc.label(),
                fmt_dur(t.p50),
                fmt_dur(t.p99),
                t_rate,
                fmt_dur(b.p50),
                fmt_dur(b.p99),
                b_rate
            );
            table.row(vec![
                callers.to_string(),
                rpc.label().to_string(),
                fmt_dur(t.p50),
                fmt_dur(t.p99),
                format!("{t_rate:.0}"),
                fmt_dur(b.p50),
                fmt_dur(b.p99),
                format!("{b_rate:.0}"),
                format!("{r50:.2}"),
                format!("{r99:.2}"),
                verdict,
            ]);
        }
    }
    let goal = if misses.is_empty() {
        "Goal (hot reads within 1.2× of the health check at p50 and p99): **met** at every level."
            .to_string()
    } else {
        format!(
            "Goal (hot reads within 1.2× of the health check at p50 and p99): **not met** for {}.",
            misses.join("; ")
        )
    };
    let body = format!(
        "Measured on {machine}; {rounds} alternating rounds of {} per RPC and level, {} in all.\n\n{}\n{goal}\n",
        fmt_dur(window),
        fmt_dur(bench_started.elapsed()),
        table.markdown()
    );
    report(args, "rpc_latency", &body);
    drop(cached);
    drop(fetching);
    sim.shutdown().await;
}
