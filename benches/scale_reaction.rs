//! Scale reaction: how long after NodeGroupIncreaseSize arrives `scaleKubernetesCluster`
//! reaches CloudStack, and how long the RPC itself takes, while the CloudStack job runs for
//! minutes. Compared in the same run with a blocking design (the in-tree CloudStack
//! provider's behaviour: send the scale request, then poll `queryAsyncJobResult` until the job
//! ends before answering), written here as a small function over `cloudstack::Client`.
//!
//! The provider is the release binary in its own process, once with default settings and once
//! with `--scale-watch 0s` (no watching the new job for an immediate refusal). Reaction time is
//! the simulator's arrival stamp of the request (`atms`) minus the simulator clock read just
//! before the RPC is sent, so it is exact to the millisecond.
//!
//! `cargo bench --bench scale_reaction [-- --write] [-- --quick]`

mod support;

use cks_cloudstack::{Client, ClientConfig, CsError};
use cks_proto as pb;
use cks_sim::SimHandle;
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use std::time::{Duration, Instant};
use support::{BenchArgs, Latency, Table, fmt_dur, report};

/// The autoscaler's default `grpc_timeout`.
const DEADLINE: Duration = Duration::from_secs(5);
/// A scale-up as CKS runs it: VMs deployed, kubeadm join, nodes Ready.
const LONG_JOB: Duration = Duration::from_secs(600);
/// Short enough for the blocking design to finish within the bench.
const SHORT_JOB: Duration = Duration::from_secs(3);
/// How often the blocking design polls (the in-tree provider polls every 10 s; 2 s, the
/// provider's own follower interval, is kinder to it).
const BLOCKING_POLL: Duration = Duration::from_secs(2);

/// The in-tree design: answer only when the job has ended.
async fn blocking_increase(cs: &Client, cluster: &str, size: u32) -> Result<(), CsError> {
    let job = cs.scale_cluster_size(cluster, size).await?;
    support::wait_for_job(cs, &job, BLOCKING_POLL).await
}

/// Arrival time (simulator ms) of the first scale request for `cluster` at or after `since`.
fn arrival(sim: &SimHandle, cluster: &str, since: u64) -> Option<u64> {
    sim.requests()
        .into_iter()
        .find(|r| {
            r.command == "scaleKubernetesCluster"
                && r.atms >= since
                && r.params.get("id").map(String::as_str) == Some(cluster)
        })
        .map(|r| r.atms)
}

struct Sample {
    reaction_ms: u64,
    rpc: Duration,
    outcome: String,
}

async fn provider(sim: &SimHandle, clusters: &[String], flags: &[(&str, &str)]) -> ProviderProcess {
    let mut args = ProviderArgs::new(
        &sim.api_url,
        &sim.api_key,
        &sim.secret_key,
        clusters.iter().map(|c| format!("1:20:{c}")).collect(),
    )
    .bound_to("bench", cks_testkit::certs::bound_tls("bench"));
    for (k, v) in flags {
        args = args.flag(k, v);
    }
    let p = ProviderProcess::spawn(
        support::provider_bin(),
        &support::work_dir("reaction"),
        args,
    )
    .await;
    p.wait_serving(Duration::from_secs(30)).await;
    p
}

async fn ours(sim: &SimHandle, p: &ProviderProcess, clusters: &[String]) -> Vec<Sample> {
    let mut c = p.client();
    let mut out = Vec::new();
    for id in clusters {
        // The autoscaler refreshes at the start of its loop; the scale-up comes later in it.
        c.refresh(pb::RefreshRequest {}).await.expect("Refresh");
        let mut req = tonic::Request::new(pb::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: id.clone(),
        });
        req.set_timeout(DEADLINE);
        let sent_ms = sim.now_ms();
        let t0 = Instant::now();
        let r = c.node_group_increase_size(req).await;
        let rpc = t0.elapsed();
        let at = arrival(sim, id, sent_ms).expect("the scale request reached CloudStack");
        out.push(Sample {
            reaction_ms: at - sent_ms,
            rpc,
            outcome: match r {
                Ok(_) => "OK".into(),
                Err(e) => format!("{:?}", e.code()),
            },
        });
    }
    out
}

async fn blocking(
    sim: &SimHandle,
    cs: &Client,
    clusters: &[String],
    deadline: Option<Duration>,
) -> Vec<Sample> {
    let mut out = Vec::new();
    for id in clusters {
        let sent_ms = sim.now_ms();
        let t0 = Instant::now();
        let call = blocking_increase(cs, id, 4);
        let outcome = match deadline {
            Some(d) => match tokio::time::timeout(d, call).await {
                Ok(Ok(())) => "OK".to_string(),
                Ok(Err(e)) => format!("error: {e}"),
                Err(_) => "DeadlineExceeded".to_string(),
            },
            None => match call.await {
                Ok(()) => "OK".to_string(),
                Err(e) => format!("error: {e}"),
            },
        };
        let rpc = t0.elapsed();
        let at = arrival(sim, id, sent_ms).expect("the scale request reached CloudStack");
        out.push(Sample {
            reaction_ms: at - sent_ms,
            rpc,
            outcome,
        });
    }
    out
}

fn row(t: &mut Table, design: &str, job: &str, samples: &[Sample]) {
    let mut reaction: Vec<Duration> = samples
        .iter()
        .map(|s| Duration::from_millis(s.reaction_ms))
        .collect();
    let mut rpc: Vec<Duration> = samples.iter().map(|s| s.rpc).collect();
    let r = Latency::of(&mut reaction);
    let l = Latency::of(&mut rpc);
    let mut outcomes: Vec<String> = samples.iter().map(|s| s.outcome.clone()).collect();
    outcomes.sort();
    outcomes.dedup();
    t.row(vec![
        design.to_string(),
        job.to_string(),
        samples.len().to_string(),
        format!("{} ms / {} ms", r.p50.as_millis(), r.max.as_millis()),
        format!("{} / {}", fmt_dur(l.p50), fmt_dur(l.max)),
        outcomes.join(", "),
    ]);
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let n = if args.quick { 3 } else { 6 };
    let nb = if args.quick { 1 } else { 3 };
    let machine = support::machine();
    let started = Instant::now();

    let total = 2 * n + 2 * nb;
    let sim = support::autoscaled_clusters(total, LONG_JOB).await;
    let ids = sim.cluster_ids();
    let (defaults_ids, rest) = ids.split_at(n);
    let (nowatch_ids, rest) = rest.split_at(n);
    let (short_ids, long_ids) = rest.split_at(nb);

    let with_defaults = provider(&sim, defaults_ids, &[]).await;
    let no_watch = provider(&sim, nowatch_ids, &[("--scale-watch", "0s")]).await;
    let s_defaults = ours(&sim, &with_defaults, defaults_ids).await;
    let s_nowatch = ours(&sim, &no_watch, nowatch_ids).await;

    let cs = Client::new(
        ClientConfig::new(&sim.api_url, &sim.api_key, &sim.secret_key)
            .with_timeout(Duration::from_secs(10)),
    )
    .expect("client");
    // The blocking design with a job it can wait for, then with a real-length job under the
    // autoscaler's deadline.
    sim.configure(|s| s.job_duration = SHORT_JOB);
    let s_block_short = blocking(&sim, &cs, short_ids, None).await;
    sim.configure(|s| s.job_duration = LONG_JOB);
    let s_block_long = blocking(&sim, &cs, long_ids, Some(DEADLINE)).await;

    let mut t = Table::new(&[
        "design",
        "CloudStack job",
        "samples",
        "request reaches CloudStack (p50 / max)",
        "RPC latency (p50 / max)",
        "RPC outcome",
    ]);
    row(
        &mut t,
        "this provider, defaults (scale watch 1.5 s)",
        "10 min",
        &s_defaults,
    );
    row(
        &mut t,
        "this provider, --scale-watch 0s",
        "10 min",
        &s_nowatch,
    );
    row(
        &mut t,
        "blocking (waits for the job, polls every 2 s)",
        "3 s",
        &s_block_short,
    );
    row(
        &mut t,
        "blocking, under the autoscaler's 5 s deadline",
        "10 min",
        &s_block_long,
    );
    let rpc_p50 = |s: &[Sample]| {
        let mut v: Vec<Duration> = s.iter().map(|x| x.rpc).collect();
        Latency::of(&mut v).p50
    };
    let body = format!(
        "Measured on {machine}; {} in all.\n\n{}\nWith a 10-minute job this provider answers in {} (defaults) or {} (no scale watch); the blocking design needs the job's whole length ({} for a 3-second job) and, with a real job, cannot answer within the autoscaler's 5 s deadline at all.\n",
        fmt_dur(started.elapsed()),
        t.markdown(),
        fmt_dur(rpc_p50(&s_defaults)),
        fmt_dur(rpc_p50(&s_nowatch)),
        fmt_dur(rpc_p50(&s_block_short)),
    );
    report(args, "scale_reaction", &body);
    drop(with_defaults);
    drop(no_watch);
    sim.shutdown().await;
}
