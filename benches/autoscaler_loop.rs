//! A whole cluster-autoscaler loop (the mock autoscaler's `run_once`: Refresh, NodeGroups,
//! NodeGroupForNode per node, NodeGroupTargetSize, NodeGroupNodes, readiness lookups) against
//! clusters of 10, 1,000 and 10,000 workers.
//!
//! The provider is the release binary in its own process, with `--refresh-min-interval 0s` so
//! that every loop's Refresh really reads CloudStack; the simulator and the mock autoscaler run
//! in this process. Per loop: wall time, gRPC calls and their summed round trips (as the client
//! sees them), time spent inside the provider's handlers (from its own
//! `cks_provider_grpc_request_duration_seconds` histogram on `/metrics`), the part of it spent
//! waiting for CloudStack's answer (`cks_provider_cloudstack_request_duration_seconds`: request
//! sent → whole answer read, parsing excluded), the provider's own time (the difference; the
//! goal is judged on it), CloudStack calls (the
//! simulator's request log) and the provider's resident memory (`/proc/<pid>/status`).
//!
//! `cargo bench --bench autoscaler_loop [-- --write] [-- --quick]`

mod support;

use cks_lab::autoscaler::{
    AutoscalerConfig, KubeNode, MockAutoscaler, NodeSource, StaticNodeSource,
};
use cks_sim::{self as sim, ClusterSpec, Scenario, SimConfig, SimSettings};
use cks_testkit::process::{ProviderArgs, ProviderProcess, histogram_sum_count};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{BenchArgs, Table, fmt_dur, fmt_mib, report};

const METHODS: [&str; 5] = [
    "Refresh",
    "NodeGroups",
    "NodeGroupForNode",
    "NodeGroupTargetSize",
    "NodeGroupNodes",
];
const HISTOGRAM: &str = "cks_provider_grpc_request_duration_seconds";
const CS_HISTOGRAM: &str = "cks_provider_cloudstack_request_duration_seconds";

/// Seconds spent waiting for CloudStack's answers, every command, from a `/metrics` page.
fn cloudstack_seconds(page: &str) -> f64 {
    [
        "listKubernetesClusters",
        "listServiceOfferings",
        "listAsyncJobs",
    ]
    .iter()
    .map(|c| histogram_sum_count(page, CS_HISTOGRAM, &format!("command=\"{c}\"")).0)
    .sum()
}

/// Handler seconds and calls per method, from a `/metrics` page.
fn handler_seconds(page: &str) -> BTreeMap<&'static str, (f64, u64)> {
    METHODS
        .iter()
        .map(|m| {
            let labels = format!("method=\"{m}\",code=\"Ok\"");
            (*m, histogram_sum_count(page, HISTOGRAM, &labels))
        })
        .collect()
}

struct Row {
    workers: u64,
    loops: usize,
    wall: Duration,
    calls: f64,
    round_trip: Duration,
    handler_all: f64,
    handler_refresh: f64,
    /// Of the handlers' time, waiting for CloudStack to answer.
    cloudstack_wait: f64,
    /// Mean time inside one NodeGroupForNode handler.
    for_node_mean: Duration,
    cs_calls: BTreeMap<String, usize>,
    rss_warm: u64,
    rss_end: u64,
    rss_peak: u64,
}

async fn measure(workers: u64, loops: usize) -> Row {
    let mut cfg = SimConfig::for_tests("bench-key", "bench-secret");
    cfg.settings = SimSettings {
        max_cluster_size: workers + 100,
        ..SimSettings::default()
    };
    cfg.scenario = Scenario::with_cluster(ClusterSpec::new("loop", 1, workers));
    let sim = sim::spawn(cfg).await.expect("simulator");
    let cluster = sim.cluster_ids()[0].clone();
    let mut args = ProviderArgs::new(
        &sim.api_url,
        &sim.api_key,
        &sim.secret_key,
        vec![format!("1:{}:{cluster}", workers.clamp(10, 10_000))],
    )
    .flag("--refresh-min-interval", "0s");
    args.metrics = true;
    let p = ProviderProcess::spawn(support::provider_bin(), &support::work_dir("loop"), args).await;
    p.wait_serving(Duration::from_secs(120)).await;

    let nodes: Vec<KubeNode> = sim
        .nodes()
        .into_iter()
        .map(|n| {
            let mut k = KubeNode::new(n.name, n.providerid);
            k.ready = n.ready;
            k.labels = n.labels;
            k
        })
        .collect();
    let source: Arc<dyn NodeSource> = Arc::new(StaticNodeSource::new(nodes));
    let mut ca = MockAutoscaler::new(p.client(), source, AutoscalerConfig::default());
    // Warm-up: connections, the offering lookup, allocator high-water marks.
    let first = ca.run_once().await;
    assert!(first.aborted.is_none(), "warm-up loop failed: {first}");
    let rss_warm = p.rss_kib().unwrap_or(0);

    sim.reset_requests();
    let page = p.metrics().await;
    let before = handler_seconds(&page);
    let cs_before = cloudstack_seconds(&page);
    let mut wall = Duration::ZERO;
    let mut calls = 0usize;
    let mut round_trip = Duration::ZERO;
    for _ in 0..loops {
        let s = ca.run_once().await;
        assert!(s.aborted.is_none(), "loop failed: {s}");
        // UNIMPLEMENTED to NodeGroupGetOptions without overrides is an answer the autoscaler
        // takes for "use your own flags", not a failure.
        assert!(
            s.calls.iter().all(|c| c.is_ok() || c.is_not_implemented()),
            "a call failed in: {s}"
        );
        wall += s.duration;
        calls += s.calls.len();
        round_trip += s.calls.iter().map(|c| c.latency).sum::<Duration>();
    }
    let page = p.metrics().await;
    let after = handler_seconds(&page);
    let cs_after = cloudstack_seconds(&page);
    let mut cs_calls: BTreeMap<String, usize> = BTreeMap::new();
    for r in sim.requests() {
        *cs_calls.entry(r.command).or_default() += 1;
    }
    let delta = |m: &str| after.get(m).map_or(0.0, |v| v.0) - before.get(m).map_or(0.0, |v| v.0);
    let for_node_calls = after.get("NodeGroupForNode").map_or(0, |v| v.1)
        - before.get("NodeGroupForNode").map_or(0, |v| v.1);
    let row = Row {
        workers,
        loops,
        wall: wall / loops as u32,
        calls: calls as f64 / loops as f64,
        round_trip: round_trip / loops as u32,
        handler_all: METHODS.iter().map(|m| delta(m)).sum::<f64>() / loops as f64,
        handler_refresh: delta("Refresh") / loops as f64,
        cloudstack_wait: (cs_after - cs_before) / loops as f64,
        for_node_mean: Duration::from_secs_f64(
            delta("NodeGroupForNode") / for_node_calls.max(1) as f64,
        ),
        cs_calls,
        rss_warm,
        rss_end: p.rss_kib().unwrap_or(0),
        rss_peak: p.peak_rss_kib().unwrap_or(0),
    };
    drop(p);
    sim.shutdown().await;
    row
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let plan: &[(u64, usize)] = if args.quick {
        &[(10, 5), (1_000, 2)]
    } else {
        &[(10, 10), (1_000, 5), (10_000, 3)]
    };
    let machine = support::machine();
    let started = Instant::now();
    let mut rows = Vec::new();
    for &(workers, loops) in plan {
        let r = measure(workers, loops).await;
        eprintln!(
            "{workers} workers: {} per loop, {:.0} calls, CloudStack {:?}, RSS {} → {} (peak {})",
            fmt_dur(r.wall),
            r.calls,
            r.cs_calls,
            fmt_mib(r.rss_warm),
            fmt_mib(r.rss_end),
            fmt_mib(r.rss_peak)
        );
        rows.push(r);
    }

    let mut t = Table::new(&[
        "workers",
        "loops",
        "wall / loop",
        "gRPC calls / loop",
        "round trips / loop",
        "in handlers / loop",
        "of which Refresh",
        "of which waiting for CloudStack",
        "provider's own time / loop",
        "one NodeGroupForNode handler",
        "handlers ÷ round trips",
        "own time ÷ round trips",
        "reads only ÷ their round trips",
        "CloudStack calls / loop",
        "RSS after warm-up",
        "RSS after loops",
        "peak RSS",
    ]);
    let mut notes = Vec::new();
    for r in &rows {
        let rt = r.round_trip.as_secs_f64();
        let share = r.handler_all / rt.max(1e-9);
        let own = (r.handler_all - r.cloudstack_wait).max(0.0);
        let own_share = own / rt.max(1e-9);
        // The hot reads alone: the Refresh round trip is CloudStack time, not RPC overhead.
        let reads_handler = r.handler_all - r.handler_refresh;
        let reads_rt = rt - r.handler_refresh;
        let reads_share = reads_handler / reads_rt.max(1e-9);
        let cs: Vec<String> = r
            .cs_calls
            .iter()
            .map(|(k, v)| format!("{k} {:.1}", *v as f64 / r.loops as f64))
            .collect();
        t.row(vec![
            r.workers.to_string(),
            r.loops.to_string(),
            fmt_dur(r.wall),
            format!("{:.0}", r.calls),
            fmt_dur(r.round_trip),
            fmt_dur(Duration::from_secs_f64(r.handler_all)),
            fmt_dur(Duration::from_secs_f64(r.handler_refresh)),
            fmt_dur(Duration::from_secs_f64(r.cloudstack_wait)),
            fmt_dur(Duration::from_secs_f64(own)),
            fmt_dur(r.for_node_mean),
            format!("{:.1}%", share * 100.0),
            format!("{:.1}%", own_share * 100.0),
            format!("{:.1}%", reads_share * 100.0),
            cs.join(", "),
            fmt_mib(r.rss_warm),
            fmt_mib(r.rss_end),
            fmt_mib(r.rss_peak),
        ]);
        if r.workers == 10_000 {
            notes.push(format!(
                "10,000 workers: the provider's own time (handlers minus waiting for CloudStack's answer) is {:.1}% of the loop's gRPC round trips: goal < 5% **{}** (handlers including that wait: {:.1}%; the hot reads alone: {:.1}%); peak RSS {}: goal < 64 MiB **{}**.",
                own_share * 100.0,
                if own_share < 0.05 { "met" } else { "not met" },
                share * 100.0,
                reads_share * 100.0,
                fmt_mib(r.rss_peak),
                if r.rss_peak < 64 * 1024 { "met" } else { "not met" },
            ));
        }
    }
    let body = format!(
        "Measured on {machine}; {} in all.\n\n{}\n{}\n",
        fmt_dur(started.elapsed()),
        t.markdown(),
        notes.join("\n")
    );
    report(args, "autoscaler_loop", &body);
}
