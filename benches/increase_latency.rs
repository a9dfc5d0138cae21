//! IncreaseSize latency when CloudStack validates the scale request inside its job: the
//! provider answers once the job is past validation (the job failed, or the cluster shows
//! Scaling), bounded by `--scale-watch` (1.5 s). The simulator's `pickup_delay` is the time
//! from the jobid coming back to a worker validating the job and moving the cluster to
//! Scaling. Goal: with CloudStack validating within 100 ms, p50 ≤ 0.5 s.
//!
//! Every call must find its cluster at rest (a call while a job runs is only queued, and
//! answers at once). So each call goes to a cluster of its own: the simulator holds one
//! cluster per call, the provider serves them all as node groups, and the scale-up job runs
//! for 10 minutes, longer than the bench. Before each call the bench sends a Refresh, as the
//! autoscaler's loop does before it scales up.
//!
//! The provider is the release binary in its own process with default settings, one process
//! per pick-up delay measured; the simulator runs in the bench process.
//!
//! `cargo bench --bench increase_latency [-- --write] [-- --quick]`

mod support;

use cks_proto as pb;
use cks_sim::{ClusterState, SimHandle};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use std::time::{Duration, Instant};
use support::{BenchArgs, Latency, Table, fmt_dur, report};

/// The autoscaler's default `grpc_timeout`.
const DEADLINE: Duration = Duration::from_secs(5);
/// A scale-up as CKS runs it; none ends during the bench.
const LONG_JOB: Duration = Duration::from_secs(600);
/// The goal's pick-up delay and bound.
const GOAL_PICKUP: Duration = Duration::from_millis(100);
const GOAL_P50: Duration = Duration::from_millis(500);

struct Sample {
    rpc: Duration,
    ok: bool,
    /// The cluster showed Scaling when the answer came: the job was past validation.
    past_validation: bool,
}

async fn measure(sim: &SimHandle, clusters: &[String], pickup: Duration) -> Vec<Sample> {
    sim.configure(|s| s.pickup_delay = pickup);
    let groups = clusters.iter().map(|c| format!("1:20:{c}")).collect();
    let p = ProviderProcess::spawn(
        support::provider_bin(),
        &support::work_dir("increase-latency"),
        ProviderArgs::new(&sim.api_url, &sim.api_key, &sim.secret_key, groups)
            .bound_to("bench", cks_testkit::certs::bound_tls("bench")),
    )
    .await;
    p.wait_serving(Duration::from_secs(30)).await;
    let mut c = p.client();
    let mut out = Vec::new();
    for id in clusters {
        c.refresh(pb::RefreshRequest {}).await.expect("Refresh");
        let mut req = tonic::Request::new(pb::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: id.clone(),
        });
        req.set_timeout(DEADLINE);
        let t0 = Instant::now();
        let r = c.node_group_increase_size(req).await;
        let rpc = t0.elapsed();
        out.push(Sample {
            rpc,
            ok: r.is_ok(),
            past_validation: sim.cluster_state(id) == Some(ClusterState::Scaling),
        });
    }
    drop(p);
    out
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let calls = if args.quick { 5 } else { 30 };
    let pickups: Vec<Duration> = [0, 100, 1000, 2000]
        .into_iter()
        .map(Duration::from_millis)
        .collect();
    let machine = support::machine();
    let started = Instant::now();

    let sim = support::autoscaled_clusters(calls * pickups.len(), LONG_JOB).await;
    let ids = sim.cluster_ids();

    let mut t = Table::new(&[
        "CloudStack picks the job up after",
        "calls",
        "IncreaseSize p50",
        "p99",
        "max",
        "answered OK",
        "cluster Scaling at the answer",
    ]);
    let mut goal = None;
    for (k, &pickup) in pickups.iter().enumerate() {
        let mine = &ids[k * calls..(k + 1) * calls];
        let samples = measure(&sim, mine, pickup).await;
        let mut rpc: Vec<Duration> = samples.iter().map(|s| s.rpc).collect();
        let l = Latency::of(&mut rpc);
        if pickup == GOAL_PICKUP {
            goal = Some(l.p50);
        }
        let label = if pickup.is_zero() {
            "0 (validated inside the API call)".to_string()
        } else {
            format!("{} ms", pickup.as_millis())
        };
        t.row(vec![
            label,
            samples.len().to_string(),
            fmt_dur(l.p50),
            fmt_dur(l.p99),
            fmt_dur(l.max),
            format!(
                "{} / {}",
                samples.iter().filter(|s| s.ok).count(),
                samples.len()
            ),
            format!(
                "{} / {}",
                samples.iter().filter(|s| s.past_validation).count(),
                samples.len()
            ),
        ]);
    }
    let verdict = match goal {
        Some(p50) if p50 <= GOAL_P50 => format!("p50 {}: goal (≤ 0.5 s) **met**", fmt_dur(p50)),
        Some(p50) => format!("p50 {}: goal (≤ 0.5 s) **not met**", fmt_dur(p50)),
        None => "the 100 ms row was not measured".to_string(),
    };
    let body = format!(
        "Measured on {machine}; {} in all; a 10-minute scale-up job, `--scale-watch 1500ms`.\n\n{}\nWith CloudStack validating within 100 ms: {verdict}.\n",
        fmt_dur(started.elapsed()),
        t.markdown(),
    );
    report(args, "increase_latency", &body);
    sim.shutdown().await;
}
