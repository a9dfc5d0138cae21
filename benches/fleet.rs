//! The central provider under a fleet: one `cks-autoscaler-provider serve` process (the release
//! binary, its own process, `/metrics` served as the chart serves it and never scraped during
//! the run) for 500 CKS clusters of 200 workers each, and 500 autoscalers, each with its own
//! mutual-TLS client certificate and its cluster's group bound to it (`--nodes
//! 1:250:CLUSTER@fleet-N`). The simulator (CloudStack, `max.cluster.size` 260) and the 500
//! autoscalers run in this process.
//!
//! Each autoscaler runs a loop every 10 s, its loops spread over the interval as independent
//! autoscalers' are: Refresh, NodeGroups, NodeGroupForNode for [`LOOKUPS`] of its nodes (a
//! different slice each loop, so every node is reported), NodeGroupTargetSize,
//! NodeGroupNodes, all under the autoscaler's 5 s deadline, and a gRPC health check on the same
//! connection: the baseline its latencies are compared with, under the same load.
//!
//! Measured: the start-up (process start to SERVING, i.e. every group has a snapshot, and the
//! CloudStack calls it took), the provider's resident memory over the run (`/proc/<pid>/status`,
//! every few seconds), each RPC's latency against the health check after the warm-up, the
//! CloudStack calls per minute by command (the simulator's request log), the Refresh answers
//! that were errors, and the series on `/metrics` at start and end (a label set per caller or
//! per request would show there). The report says so, in bold, when memory is not flat within
//! 10 % after the warm-up (or its trend would take it past 10 % within an hour), passes 256 MiB
//! (the chart's limit), and when a Refresh failed.
//!
//! Full run: 10 minutes after start-up. `--quick`: 100 clusters of 50 workers for 1 minute.
//! For experiments, `FLEET_MINUTES` changes the run's length, `FLEET_LOOKUPS` the
//! NodeGroupForNode calls per loop, and `FLEET_SCRAPE_SECS` scrapes `/metrics` that often
//! during the run, as a Prometheus would (not in the documented numbers). `FLEET_MAX_RPS`
//! runs the provider with `--cloudstack-max-rps` (CloudStack's `api.throttling` default is 25
//! calls a second per account): the throttled fleet, documented in a section of its own
//! (`fleet-throttled`), where a Refresh must be answered from the snapshots the provider keeps
//! at the limit's pace, not wait for a round the limit cannot give it.
//!
//! `cargo bench --bench fleet [-- --write] [-- --quick]`

mod support;

use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, ClusterSpec, RecordedRequest, Scenario, SimConfig, SimSettings};
use cks_testkit::certs::Ca;
use cks_testkit::process::{ProviderArgs, ProviderProcess, TestTls};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use support::{BenchArgs, Latency, Table, fmt_dur, fmt_mib, report};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The autoscaler's loop interval (`--scan-interval`, 10 s by default).
const LOOP: Duration = Duration::from_secs(10);
/// The autoscaler's gRPC deadline (`grpc_timeout` in its cloud-config, 5 s by default).
const DEADLINE: Duration = Duration::from_secs(5);
/// NodeGroupForNode calls per loop and autoscaler. The real autoscaler asks once per node and
/// Refresh (200 here); 20 keeps the load generator, the simulator and the provider, which share
/// the machine, from measuring mostly each other's CPU, while every node is still reported
/// every 10 loops.
const LOOKUPS: usize = 20;
/// The chart's memory limit.
const LIMIT_KIB: u64 = 256 * 1024;
/// RSS growth after the warm-up that still counts as flat.
const FLAT: f64 = 0.10;

/// The fleet and how long it runs.
#[derive(Debug, Clone, Copy)]
struct Shape {
    clusters: usize,
    workers: u64,
    /// After start-up (SERVING).
    run: Duration,
    /// Latencies are measured after it; memory growth is judged from its end.
    warmup: Duration,
    /// How often the provider's RSS is read.
    sample: Duration,
    lookups: usize,
    /// Scrape `/metrics` this often during the run (experiments only).
    scrape: Option<Duration>,
    /// `--cloudstack-max-rps` for the provider.
    max_rps: Option<f64>,
}

impl Shape {
    fn new(args: BenchArgs) -> Shape {
        let mut s = if args.quick {
            Shape {
                clusters: 100,
                workers: 50,
                run: Duration::from_secs(60),
                warmup: Duration::from_secs(20),
                sample: Duration::from_secs(2),
                lookups: LOOKUPS,
                scrape: None,
                max_rps: None,
            }
        } else {
            Shape {
                clusters: 500,
                workers: 200,
                run: Duration::from_secs(600),
                warmup: Duration::from_secs(120),
                sample: Duration::from_secs(5),
                lookups: LOOKUPS,
                scrape: None,
                max_rps: None,
            }
        };
        let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok());
        if let Some(m) = env("FLEET_MINUTES").filter(|m| *m > 0.0) {
            s.run = Duration::from_secs_f64(m * 60.0);
            s.warmup = s.warmup.min(s.run / 3);
        }
        if let Some(n) = env("FLEET_LOOKUPS") {
            s.lookups = n as usize;
        }
        s.max_rps = env("FLEET_MAX_RPS").filter(|r| *r > 0.0);
        s.scrape = env("FLEET_SCRAPE_SECS")
            .filter(|s| *s > 0.0)
            .map(Duration::from_secs_f64);
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Refresh,
    NodeGroups,
    NodeGroupForNode,
    NodeGroupTargetSize,
    NodeGroupNodes,
    Health,
}

const KINDS: [Kind; 6] = [
    Kind::Refresh,
    Kind::NodeGroups,
    Kind::NodeGroupForNode,
    Kind::NodeGroupTargetSize,
    Kind::NodeGroupNodes,
    Kind::Health,
];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Refresh => "Refresh",
            Kind::NodeGroups => "NodeGroups",
            Kind::NodeGroupForNode => "NodeGroupForNode",
            Kind::NodeGroupTargetSize => "NodeGroupTargetSize",
            Kind::NodeGroupNodes => "NodeGroupNodes",
            Kind::Health => "Health/Check",
        }
    }
}

/// What one autoscaler saw.
#[derive(Debug, Default)]
struct Seen {
    /// Latencies in µs by [`KINDS`] index, after the warm-up.
    lat: [Vec<u32>; 6],
    /// Calls by kind, the whole run.
    calls: [u64; 6],
    /// Failed calls by kind, the whole run.
    errors: [u64; 6],
    /// Answers that were OK but wrong (another group, a missing node).
    wrong: u64,
    /// The first few failures, for the report.
    first_errors: Vec<String>,
    loops: u64,
    /// Loops that took longer than the interval.
    overran: u64,
}

impl Seen {
    fn merge(&mut self, o: Seen) {
        for i in 0..KINDS.len() {
            self.lat[i].extend_from_slice(&o.lat[i]);
            self.calls[i] += o.calls[i];
            self.errors[i] += o.errors[i];
        }
        self.wrong += o.wrong;
        self.loops += o.loops;
        self.overran += o.overran;
        for e in o.first_errors {
            if self.first_errors.len() < 5 {
                self.first_errors.push(e);
            }
        }
    }

    fn note(&mut self, kind: Kind, since_warm: bool, started: Instant, ok: Result<(), String>) {
        let i = kind as usize;
        self.calls[i] += 1;
        match ok {
            Ok(()) => {
                if since_warm {
                    let us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
                    self.lat[i].push(us);
                }
            }
            Err(e) => {
                self.errors[i] += 1;
                if self.first_errors.len() < 5 {
                    self.first_errors.push(format!("{}: {e}", kind.label()));
                }
            }
        }
    }
}

/// One autoscaler: its connection (its own client certificate), its group and its nodes.
struct Autoscaler {
    cp: CloudProviderClient<Channel>,
    health: HealthClient<Channel>,
    group: String,
    nodes: Vec<pb::ExternalGrpcNode>,
}

fn timed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(DEADLINE);
    r
}

impl Autoscaler {
    /// One loop; `n` is the loop's number (which slice of nodes it reports).
    async fn run_once(&mut self, n: usize, lookups: usize, since_warm: bool, seen: &mut Seen) {
        let t = Instant::now();
        let r = self.cp.refresh(timed(pb::RefreshRequest {})).await;
        seen.note(
            Kind::Refresh,
            since_warm,
            t,
            r.map(drop).map_err(|e| e.to_string()),
        );

        let t = Instant::now();
        let r = self.cp.node_groups(timed(pb::NodeGroupsRequest {})).await;
        let r = r.map_err(|e| e.to_string()).map(|a| {
            let ids: Vec<String> = a
                .into_inner()
                .node_groups
                .into_iter()
                .map(|g| g.id)
                .collect();
            if ids != [self.group.clone()] {
                seen.wrong += 1;
            }
        });
        seen.note(Kind::NodeGroups, since_warm, t, r);

        for k in 0..lookups.min(self.nodes.len()) {
            let node = self.nodes[(n * lookups + k) % self.nodes.len()].clone();
            let t = Instant::now();
            let r = self
                .cp
                .node_group_for_node(timed(pb::NodeGroupForNodeRequest { node: Some(node) }))
                .await;
            let r = r.map_err(|e| e.to_string()).map(|a| {
                if a.into_inner().node_group.map(|g| g.id).as_ref() != Some(&self.group) {
                    seen.wrong += 1;
                }
            });
            seen.note(Kind::NodeGroupForNode, since_warm, t, r);
        }

        let t = Instant::now();
        let r = self
            .cp
            .node_group_target_size(timed(pb::NodeGroupTargetSizeRequest {
                id: self.group.clone(),
            }))
            .await;
        seen.note(
            Kind::NodeGroupTargetSize,
            since_warm,
            t,
            r.map(drop).map_err(|e| e.to_string()),
        );

        let t = Instant::now();
        let r = self
            .cp
            .node_group_nodes(timed(pb::NodeGroupNodesRequest {
                id: self.group.clone(),
            }))
            .await;
        let r = r.map_err(|e| e.to_string()).map(|a| {
            if a.into_inner().instances.len() != self.nodes.len() {
                seen.wrong += 1;
            }
        });
        seen.note(Kind::NodeGroupNodes, since_warm, t, r);

        let t = Instant::now();
        let r = self
            .health
            .check(timed(HealthCheckRequest {
                service: String::new(),
            }))
            .await;
        seen.note(
            Kind::Health,
            since_warm,
            t,
            r.map(drop).map_err(|e| e.to_string()),
        );
    }

    /// Loops every [`LOOP`] from `first` until `end`.
    async fn run(
        mut self,
        first: tokio::time::Instant,
        warm: tokio::time::Instant,
        end: tokio::time::Instant,
        lookups: usize,
    ) -> Seen {
        let mut seen = Seen::default();
        let mut next = first;
        let mut n = 0;
        while next < end {
            tokio::time::sleep_until(next).await;
            let started = tokio::time::Instant::now();
            self.run_once(n, lookups, started >= warm, &mut seen).await;
            seen.loops += 1;
            n += 1;
            // As the autoscaler: the next loop a scan interval after this one started, at once
            // when this one took longer.
            let now = tokio::time::Instant::now();
            if now > started + LOOP {
                seen.overran += 1;
            }
            next = (started + LOOP).max(now);
        }
        seen
    }
}

/// The client name bound to autoscaler `i`'s group.
fn client_name(i: usize) -> String {
    format!("fleet-{i}")
}

/// A channel to the provider presenting `leaf` as its client certificate.
fn channel(addr: std::net::SocketAddr, ca: &str, cert: &str, key: &str) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
        .identity(Identity::from_pem(cert, key));
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .connect_timeout(DEADLINE)
        .tcp_nodelay(true)
        .tls_config(tls)
        .expect("client TLS")
        .connect_lazy()
}

/// Provider CPU seconds (user + system) so far, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are space-separated.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(ticks as f64 / 100.0)
}

/// Series (sample lines) on a Prometheus page.
fn series(page: &str) -> usize {
    page.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

/// Calls per command among `reqs` between two simulator times.
fn count(reqs: &[RecordedRequest], from_ms: u64, to_ms: u64) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in reqs.iter().filter(|r| r.atms >= from_ms && r.atms < to_ms) {
        *out.entry(r.command.clone()).or_default() += 1;
    }
    out
}

fn describe(calls: &BTreeMap<String, usize>) -> String {
    if calls.is_empty() {
        return "none".into();
    }
    calls
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// RSS (KiB) at `at` after SERVING: the last sample at or before it.
fn rss_at(samples: &[(Duration, u64)], at: Duration) -> Option<u64> {
    samples
        .iter()
        .take_while(|(t, _)| *t <= at + Duration::from_millis(500))
        .last()
        .map(|(_, r)| *r)
}

/// Least-squares slope of RSS over time, in MiB per minute, of the samples from `from` on.
fn slope_mib_per_min(samples: &[(Duration, u64)], from: Duration) -> f64 {
    let pts: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(t, _)| *t >= from)
        .map(|(t, r)| (t.as_secs_f64() / 60.0, *r as f64 / 1024.0))
        .collect();
    let n = pts.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// `10 s`, `2 min`, `1.5 min`.
fn fmt_at(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.0} s")
    } else if (s / 60.0).fract() == 0.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let shape = Shape::new(args);
    let machine = support::machine();
    let bench_started = Instant::now();

    // The fleet, as CloudStack lists it.
    let mut cfg = SimConfig::for_tests("bench-key", "bench-secret");
    cfg.settings = SimSettings {
        max_cluster_size: 260,
        ..SimSettings::default()
    };
    cfg.scenario = Scenario {
        clusters: (0..shape.clusters)
            .map(|i| ClusterSpec::new(&format!("fleet-{i}"), 1, shape.workers))
            .collect(),
        ..Scenario::empty()
    };
    let sim = sim::spawn(cfg).await.expect("simulator");
    let ids = sim.cluster_ids();
    let mut workers: HashMap<String, Vec<pb::ExternalGrpcNode>> = HashMap::new();
    for n in sim.nodes().into_iter().filter(|n| n.role == "worker") {
        workers
            .entry(n.clusterid)
            .or_default()
            .push(pb::ExternalGrpcNode {
                provider_id: n.providerid,
                name: n.name,
                labels: HashMap::new(),
                annotations: HashMap::new(),
            });
    }
    eprintln!(
        "simulator: {} clusters, {} VMs, built in {}",
        ids.len(),
        ids.len() as u64 * (shape.workers + 1),
        fmt_dur(bench_started.elapsed())
    );

    // One CA; the server's certificate and one client certificate per autoscaler.
    let ca = Ca::new("fleet CA");
    let server = ca.server();
    let leaves: Vec<_> = (0..ids.len())
        .map(|i| {
            let name = client_name(i);
            ca.client(&name, &[&name])
        })
        .collect();
    let nodes_flags: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("1:250:{id}@{}", client_name(i)))
        .collect();
    let mut pargs = ProviderArgs::new(&sim.api_url, &sim.api_key, &sim.secret_key, nodes_flags);
    pargs.metrics = true;
    if let Some(rps) = shape.max_rps {
        pargs.flags = vec!["--cloudstack-max-rps".into(), rps.to_string()];
    }
    pargs.tls = Some(TestTls {
        ca: ca.pem.clone(),
        server_cert: server.cert,
        server_key: server.key,
        client_cert: leaves[0].cert.clone(),
        client_key: leaves[0].key.clone(),
    });

    // Start-up: process start to SERVING (every group has a snapshot).
    let spawn_ms = sim.now_ms();
    let spawned = Instant::now();
    let p =
        ProviderProcess::spawn(support::provider_bin(), &support::work_dir("fleet"), pargs).await;
    p.wait_serving(Duration::from_secs(300)).await;
    let startup = spawned.elapsed();
    let serving_ms = sim.now_ms();
    let rss_serving = p.rss_kib().unwrap_or(0);
    let series_start = series(&p.metrics().await);
    let cpu_start = cpu_seconds(p.pid()).unwrap_or(0.0);
    eprintln!(
        "SERVING after {} at {}; {} series on /metrics",
        fmt_dur(startup),
        fmt_mib(rss_serving),
        series_start
    );

    // The autoscalers, their first loops spread over one interval.
    let t0 = tokio::time::Instant::now();
    let warm = t0 + shape.warmup;
    let end = t0 + shape.run;
    let n = ids.len();
    let mut tasks = Vec::with_capacity(n);
    for (i, id) in ids.iter().enumerate() {
        let ch = channel(p.addr, &ca.pem, &leaves[i].cert, &leaves[i].key);
        let a = Autoscaler {
            cp: CloudProviderClient::new(ch.clone()),
            health: HealthClient::new(ch),
            group: id.clone(),
            nodes: workers.remove(id).unwrap_or_default(),
        };
        let first = t0 + LOOP * u32::try_from(i).unwrap_or(0) / u32::try_from(n).unwrap_or(1);
        tasks.push(tokio::spawn(a.run(first, warm, end, shape.lookups)));
    }

    // Memory every `sample`, and /metrics scrapes when asked for.
    let mut samples: Vec<(Duration, u64)> = vec![(Duration::ZERO, rss_serving)];
    let mut next_scrape = shape.scrape.map(|s| t0 + s);
    let mut tick = tokio::time::interval_at(t0 + shape.sample, shape.sample);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_print = Duration::ZERO;
    while tokio::time::Instant::now() < end {
        tick.tick().await;
        let at = t0.elapsed();
        if let Some(kib) = p.rss_kib() {
            samples.push((at, kib));
            if at >= last_print + Duration::from_secs(30) || shape.sample >= Duration::from_secs(30)
            {
                last_print = at;
                eprintln!("{:>6} RSS {}", fmt_at(at), fmt_mib(kib));
            }
        }
        if let (Some(due), Some(every)) = (next_scrape, shape.scrape)
            && tokio::time::Instant::now() >= due
        {
            drop(p.metrics().await);
            next_scrape = Some(due + every);
        }
    }
    let rss_end = p.rss_kib().unwrap_or(0);
    let rss_peak = p.peak_rss_kib().unwrap_or(0);
    samples.push((t0.elapsed(), rss_end));
    let cpu_run = cpu_seconds(p.pid()).unwrap_or(0.0) - cpu_start;
    let run_ms = sim.now_ms();
    let wall = t0.elapsed();
    let mut seen = Seen::default();
    for t in tasks {
        seen.merge(t.await.expect("autoscaler task"));
    }
    let series_end = series(&p.metrics().await);
    let warm_ms = serving_ms + u64::try_from(shape.warmup.as_millis()).unwrap_or(0);
    let reqs = sim.requests();
    let at_start = count(&reqs, spawn_ms, serving_ms);
    let steady = count(&reqs, warm_ms, run_ms);
    let in_run = count(&reqs, serving_ms, run_ms);
    let steady_min = (run_ms.saturating_sub(warm_ms)) as f64 / 60_000.0;

    // Start-up.
    let mut t_start = Table::new(&[
        "clusters × workers",
        "VMs",
        "to all snapshots (process start → SERVING)",
        "RSS at SERVING",
        "CloudStack calls during start-up",
    ]);
    t_start.row(vec![
        format!("{} × {}", n, shape.workers),
        (n as u64 * (shape.workers + 1)).to_string(),
        fmt_dur(startup),
        fmt_mib(rss_serving),
        describe(&at_start),
    ]);

    // Memory.
    let checkpoints = [shape.run / 10, shape.warmup, shape.run / 2, shape.run];
    let mut header: Vec<String> = vec!["at SERVING".into()];
    let mut row: Vec<String> = vec![fmt_mib(rss_serving)];
    let mut cps: Vec<Duration> = checkpoints.to_vec();
    cps.sort();
    cps.dedup();
    for c in &cps {
        let tag = if *c == shape.warmup {
            format!("{} (warm-up end)", fmt_at(*c))
        } else {
            fmt_at(*c)
        };
        header.push(tag);
        row.push(rss_at(&samples, *c).map_or("–".into(), fmt_mib));
    }
    let rss_warm = rss_at(&samples, shape.warmup).unwrap_or(rss_serving);
    let growth = rss_end as f64 / rss_warm.max(1) as f64 - 1.0;
    let slope = slope_mib_per_min(&samples, shape.warmup);
    header.extend([
        "peak".into(),
        "growth after warm-up".into(),
        "trend after warm-up".into(),
    ]);
    row.extend([
        fmt_mib(rss_peak),
        format!("{:+.1}%", growth * 100.0),
        format!("{slope:+.2} MiB/min"),
    ]);
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t_mem = Table::new(&header_refs);
    t_mem.row(row);

    // Latency against the health check.
    let health = Latency::of(
        &mut seen.lat[Kind::Health as usize]
            .iter()
            .map(|us| Duration::from_micros(u64::from(*us)))
            .collect::<Vec<_>>(),
    );
    let mut t_lat = Table::new(&[
        "RPC",
        "calls",
        "errors",
        "p50",
        "p99",
        "max",
        "p50 ÷ health p50",
        "p99 ÷ health p99",
    ]);
    for kind in KINDS {
        let i = kind as usize;
        let mut lat: Vec<Duration> = seen.lat[i]
            .iter()
            .map(|us| Duration::from_micros(u64::from(*us)))
            .collect();
        let l = Latency::of(&mut lat);
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        t_lat.row(vec![
            kind.label().to_string(),
            seen.calls[i].to_string(),
            seen.errors[i].to_string(),
            fmt_dur(l.p50),
            fmt_dur(l.p99),
            fmt_dur(l.max),
            format!("{:.2}", ratio(l.p50, health.p50)),
            format!("{:.2}", ratio(l.p99, health.p99)),
        ]);
    }

    // CloudStack.
    let mut t_cs = Table::new(&[
        "command",
        "calls / minute after warm-up",
        "calls in the run",
    ]);
    for (cmd, total) in &in_run {
        let per_min = steady.get(cmd).copied().unwrap_or(0) as f64 / steady_min.max(1e-9);
        t_cs.row(vec![
            cmd.clone(),
            format!("{per_min:.1}"),
            total.to_string(),
        ]);
    }

    // Verdicts.
    let mut verdicts = Vec::new();
    let flat = growth.abs() <= FLAT;
    // A leak too slow to pass 10 % within the run still shows in the trend: one that would pass
    // it within an hour of steady load is reported too.
    let hour_growth = slope * 60.0 / (rss_warm as f64 / 1024.0).max(1e-9);
    let rising = hour_growth > FLAT;
    verdicts.push(match (flat, rising) {
        (true, false) => format!(
            "Memory: flat after the warm-up ({} → {}, {:+.1}%, within {:.0}%; trend {slope:+.2} MiB/min).",
            fmt_mib(rss_warm),
            fmt_mib(rss_end),
            growth * 100.0,
            FLAT * 100.0
        ),
        (true, true) => format!(
            "Memory: within {:.0}% over the run ({} → {}, {:+.1}%) but **still rising**: {slope:+.2} MiB/min, {:+.0}% an hour at this load.",
            FLAT * 100.0,
            fmt_mib(rss_warm),
            fmt_mib(rss_end),
            growth * 100.0,
            hour_growth * 100.0
        ),
        (false, _) => format!(
            "Memory: **not flat** after the warm-up: {} → {} ({:+.1}%, more than {:.0}%; trend {slope:+.2} MiB/min).",
            fmt_mib(rss_warm),
            fmt_mib(rss_end),
            growth * 100.0,
            FLAT * 100.0
        ),
    });
    if rss_peak > LIMIT_KIB {
        verdicts.push(format!(
            "Memory: **peak RSS {} is over the chart's limit of 256 MiB**.",
            fmt_mib(rss_peak)
        ));
    } else {
        verdicts.push(format!(
            "Memory: peak RSS {} is under the chart's limit of 256 MiB.",
            fmt_mib(rss_peak)
        ));
    }
    let refreshes = seen.calls[Kind::Refresh as usize];
    let refresh_errors = seen.errors[Kind::Refresh as usize];
    verdicts.push(if refresh_errors == 0 {
        format!("Refresh: all {refreshes} answers OK.")
    } else {
        format!("Refresh: **{refresh_errors} of {refreshes} answers were errors**.")
    });
    let other_errors: u64 = seen.errors.iter().sum::<u64>() - refresh_errors;
    if other_errors > 0 || seen.wrong > 0 {
        verdicts.push(format!(
            "Other RPCs: **{other_errors} errors, {} wrong answers**.",
            seen.wrong
        ));
    }
    if !seen.first_errors.is_empty() {
        verdicts.push(format!(
            "First errors: {}.",
            seen.first_errors
                .iter()
                .map(|e| format!("`{}`", e.replace('`', "'")))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    verdicts.push(format!(
        "Loops: {} ({} took longer than the {} interval). Provider CPU: {:.0}% of one core over the run. Series on `/metrics`: {series_start} at SERVING, {series_end} at the end.",
        seen.loops,
        seen.overran,
        fmt_dur(LOOP),
        cpu_run / wall.as_secs_f64().max(1e-9) * 100.0,
    ));

    let scrape_note = match shape.scrape {
        Some(s) => format!(" `/metrics` scraped every {}.", fmt_dur(s)),
        None => " `/metrics` not scraped during the run.".into(),
    };
    let scrape_note = match shape.max_rps {
        Some(rps) => format!(" `--cloudstack-max-rps {rps}`.{scrape_note}"),
        None => scrape_note,
    };
    let body = format!(
        "Measured on {machine}; {n} clusters × {} workers, {n} autoscalers (a client certificate each), a loop every {} per autoscaler (Refresh, NodeGroups, NodeGroupForNode × {}, NodeGroupTargetSize, NodeGroupNodes, health check), {} after SERVING, warm-up {};{scrape_note} {} in all.\n\n\
         Start-up:\n\n{}\n\
         Provider RSS (`VmRSS`) after SERVING:\n\n{}\n\
         RPC latency after the warm-up, every autoscaler's calls together, against the health check on the same connections:\n\n{}\n\
         CloudStack calls (the simulator's request log):\n\n{}\n\
         {}\n",
        shape.workers,
        fmt_dur(LOOP),
        shape.lookups,
        fmt_at(shape.run),
        fmt_at(shape.warmup),
        fmt_dur(bench_started.elapsed()),
        t_start.markdown(),
        t_mem.markdown(),
        t_lat.markdown(),
        t_cs.markdown(),
        verdicts
            .iter()
            .map(|v| format!("- {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let section = if shape.max_rps.is_some() {
        "fleet-throttled"
    } else {
        "fleet"
    };
    report(args, section, &body);
    drop(p);
    sim.shutdown().await;
}
