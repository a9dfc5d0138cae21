//! Scale-down as the real cluster-autoscaler sends it: N concurrent NodeGroupDeleteNodes calls
//! of one node each (`core/scaledown/actuation/actuator.go` `deleteNodesAsync`), N = 1, 5, 20,
//! on a cluster of N+2 workers (min 1); also with a second batch of N arriving while the first
//! batch's job runs. Measured: how many `scaleKubernetesCluster` jobs CloudStack gets and how
//! long until every named VM is gone.
//!
//! Compared in the same run with the behaviour before removals were queued and merged: a
//! DeleteNodes arriving while a removal job ran was refused (FAILED_PRECONDITION), so removals
//! went one job at a time. That is modelled by [`one_at_a_time`], a client that removes one node
//! (`scaleKubernetesCluster nodeids=<one>` through `cloudstack::Client`, as the old provider sent
//! a per-node call at rest), waits until its job ends (polling `queryAsyncJobResult` every 2 s,
//! the provider's default `--job-poll-interval`, with which the old provider saw a job end) and
//! only then sends the next. It is the old design's best case: the real autoscaler had the
//! refused calls fail and waited `--scale-down-delay-after-failure` (3 min) before trying
//! those nodes again.
//!
//! Two job models: the simulator's default (a removal job takes 3 s whatever the number of
//! nodes) and one where CloudStack spends time on every node (1 s for the job plus 1.5 s per
//! node: `removal_per_node`), since CloudStack drains and destroys the nodes of one job one
//! after another.
//!
//! A third model, jobs of 2 s plus 3 s per node, runs N Running nodes in one batch only: the
//! provider sends each in a request of its own (one drain per request), so the measure is how
//! close N removals come to N such jobs back to back (the cost of the collection window, of
//! seeing each job end and of sending the next request).
//!
//! The provider is the release binary in its own process with default settings
//! (`--removal-window 500ms`, `--scale-watch 1500ms`, `--job-poll-interval 2s`); the simulator
//! runs in the bench process. Every case runs on a cluster of its own, all cases of a job model
//! at once (the work is waiting, not CPU).
//!
//! `cargo bench --bench scale_down [-- --write] [-- --quick]`

mod support;

use cks_cloudstack::{Client, ClientConfig, CsError};
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, ClusterSpec, Scenario, SimConfig, SimHandle, SimSettings};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::{BenchArgs, Latency, Table, fmt_dur, report};
use tonic::transport::Channel;

/// The autoscaler's default `grpc_timeout`.
const DEADLINE: Duration = Duration::from_secs(5);
/// How often the one-at-a-time client looks at its job (the provider's default
/// `--job-poll-interval`).
const POLL: Duration = Duration::from_secs(2);
/// When the second batch is sent, after the first: its job runs by then.
const SECOND_BATCH_AFTER: Duration = Duration::from_secs(1);
/// How often the bench looks at the simulator for the VMs being gone.
const WATCH: Duration = Duration::from_millis(20);

/// How long a removal job takes in the simulator.
#[derive(Debug, Clone, Copy)]
struct JobModel {
    job: Duration,
    per_node: Duration,
}

impl JobModel {
    fn describe(&self) -> String {
        if self.per_node.is_zero() {
            format!("{} per job", fmt_secs(self.job))
        } else {
            format!(
                "{} + {} per node",
                fmt_secs(self.job),
                fmt_secs(self.per_node)
            )
        }
    }
}

fn fmt_secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// The design before removals were queued: one node, one job, wait for it, then the next.
async fn one_at_a_time(cs: &Client, cluster: &str, vm: &str) -> Result<(), CsError> {
    let job = cs
        .scale_cluster_remove_nodes(cluster, &[vm.to_string()])
        .await?;
    support::wait_for_job(cs, &job, POLL).await
}

/// One measurement: `n` nodes per batch, `batches` batches.
#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    batches: usize,
}

#[derive(Debug, Default)]
struct Outcome {
    jobs: usize,
    /// From the first call until every named VM is gone from the cluster.
    gone_after: Duration,
    /// DeleteNodes answers (merged design only).
    rpc: Vec<Duration>,
    rpc_ok: usize,
    failures: Vec<String>,
}

fn cluster_name(design: &str, c: Case) -> String {
    format!("{design}-n{}-b{}", c.n, c.batches)
}

/// Workers to remove: the first `n * batches` of the cluster, as (vm id, node name).
fn victims(sim: &SimHandle, cluster: &str, c: Case) -> Vec<(String, String)> {
    sim.vms(cluster)
        .into_iter()
        .filter(|(_, name, _)| name.contains("-node-"))
        .take(c.n * c.batches)
        .map(|(id, name, _)| (id, name.to_ascii_lowercase()))
        .collect()
}

/// The time (since `t0`) at which none of `ids` is left in the cluster.
async fn gone(sim: &SimHandle, cluster: &str, ids: &BTreeSet<String>, t0: Instant) -> Duration {
    loop {
        let left = sim
            .vms(cluster)
            .into_iter()
            .filter(|(id, _, _)| ids.contains(id))
            .count();
        if left == 0 {
            return t0.elapsed();
        }
        tokio::time::sleep(WATCH).await;
    }
}

fn jobs_of(sim: &SimHandle, cluster: &str) -> usize {
    sim.requests()
        .into_iter()
        .filter(|r| {
            r.command == "scaleKubernetesCluster"
                && r.params.get("id").map(String::as_str) == Some(cluster)
        })
        .count()
}

async fn delete_one(
    mut c: CloudProviderClient<Channel>,
    cluster: String,
    vm: (String, String),
) -> (Duration, Result<(), String>) {
    let mut req = tonic::Request::new(pb::NodeGroupDeleteNodesRequest {
        nodes: vec![pb::ExternalGrpcNode {
            provider_id: format!("external-cloudstack://{}", vm.0),
            name: vm.1,
            ..Default::default()
        }],
        id: cluster,
    });
    req.set_timeout(DEADLINE);
    let t = Instant::now();
    let r = c.node_group_delete_nodes(req).await;
    (
        t.elapsed(),
        r.map(|_| ()).map_err(|e| format!("{:?}", e.code())),
    )
}

/// The provider: every node its own concurrent DeleteNodes; the second batch while the first
/// batch's job runs.
async fn merged(
    sim: &SimHandle,
    client: &CloudProviderClient<Channel>,
    cluster: &str,
    c: Case,
) -> Outcome {
    let vms = victims(sim, cluster, c);
    let ids: BTreeSet<String> = vms.iter().map(|v| v.0.clone()).collect();
    let t0 = Instant::now();
    let send = async {
        let mut answers = Vec::new();
        let mut failures = Vec::new();
        for (b, batch) in vms.chunks(c.n).enumerate() {
            if b > 0 {
                tokio::time::sleep_until((t0 + SECOND_BATCH_AFTER * b as u32).into()).await;
                if sim.running_jobs(cluster) != 1 {
                    failures.push(format!("batch {} sent with no job running", b + 1));
                }
            }
            let tasks: Vec<_> = batch
                .iter()
                .map(|vm| tokio::spawn(delete_one(client.clone(), cluster.to_string(), vm.clone())))
                .collect();
            // Each batch's calls are sent together; the next batch does not wait for them.
            answers.push(tasks);
        }
        let mut out = Vec::new();
        for tasks in answers {
            for t in tasks {
                out.push(t.await.expect("task"));
            }
        }
        (out, failures)
    };
    let ((answers, mut failures), gone_after) = tokio::join!(send, gone(sim, cluster, &ids, t0));
    let rpc_ok = answers.iter().filter(|(_, r)| r.is_ok()).count();
    failures.extend(answers.iter().filter_map(|(_, r)| r.clone().err()));
    Outcome {
        jobs: jobs_of(sim, cluster),
        gone_after,
        rpc: answers.iter().map(|(d, _)| *d).collect(),
        rpc_ok,
        failures,
    }
}

/// The design before: one job at a time, the second batch queued behind the first.
async fn sequential(sim: &SimHandle, cs: &Client, cluster: &str, c: Case) -> Outcome {
    let vms = victims(sim, cluster, c);
    let ids: BTreeSet<String> = vms.iter().map(|v| v.0.clone()).collect();
    let t0 = Instant::now();
    let send = async {
        let mut failures = Vec::new();
        for (i, vm) in vms.iter().enumerate() {
            let batch_at = t0 + SECOND_BATCH_AFTER * (i / c.n) as u32;
            tokio::time::sleep_until(batch_at.into()).await;
            if let Err(e) = one_at_a_time(cs, cluster, &vm.0).await {
                failures.push(e.to_string());
            }
        }
        failures
    };
    let (failures, gone_after) = tokio::join!(send, gone(sim, cluster, &ids, t0));
    Outcome {
        jobs: jobs_of(sim, cluster),
        gone_after,
        rpc: Vec::new(),
        rpc_ok: 0,
        failures,
    }
}

struct Row {
    model: JobModel,
    case: Case,
    merged: Outcome,
    sequential: Outcome,
}

async fn run_model(model: JobModel, cases: &[Case]) -> Vec<Row> {
    let mut clusters = Vec::new();
    for &c in cases {
        for design in ["merged", "sequential"] {
            let mut spec =
                ClusterSpec::new(&cluster_name(design, c), 1, (c.n * c.batches + 2) as u64);
            spec.min_size = Some(1);
            spec.max_size = Some(45);
            spec.autoscaling = true;
            clusters.push(spec);
        }
    }
    let mut cfg = SimConfig::for_tests("bench-key", "bench-secret");
    cfg.settings = SimSettings {
        job_duration: model.job,
        removal_per_node: model.per_node,
        ..SimSettings::default()
    };
    cfg.scenario = Scenario {
        clusters,
        ..Scenario::empty()
    };
    let sim = sim::spawn(cfg).await.expect("simulator");
    let id = |design: &str, c: Case| {
        sim.cluster_id(&cluster_name(design, c))
            .expect("cluster in the scenario")
    };
    let groups: Vec<String> = cases
        .iter()
        .map(|&c| format!("1:45:{}", id("merged", c)))
        .collect();
    let args = ProviderArgs::new(&sim.api_url, &sim.api_key, &sim.secret_key, groups)
        .bound_to("bench", cks_testkit::certs::bound_tls("bench"));
    let p = ProviderProcess::spawn(
        support::provider_bin(),
        &support::work_dir("scale-down"),
        args,
    )
    .await;
    p.wait_serving(Duration::from_secs(30)).await;
    let client = p.client();
    let cs = Client::new(
        ClientConfig::new(&sim.api_url, &sim.api_key, &sim.secret_key)
            .with_timeout(Duration::from_secs(10)),
    )
    .expect("client");

    let runs = cases.iter().map(|&c| {
        let (sim, client, cs) = (&sim, &client, &cs);
        let (m, s) = (id("merged", c), id("sequential", c));
        async move {
            let (merged, sequential) =
                tokio::join!(merged(sim, client, &m, c), sequential(sim, cs, &s, c));
            Row {
                model,
                case: c,
                merged,
                sequential,
            }
        }
    });
    let rows = futures_join_all(runs).await;
    drop(p);
    sim.shutdown().await;
    rows
}

/// Runs futures concurrently and returns their outputs in order.
async fn futures_join_all<F: std::future::Future>(
    futs: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    let mut outs: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if outs[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => outs[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

fn outcome_note(o: &Outcome) -> String {
    if o.failures.is_empty() {
        "—".into()
    } else {
        o.failures.join("; ")
    }
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let machine = support::machine();
    let started = Instant::now();
    let ns: &[usize] = if args.quick { &[1, 3] } else { &[1, 5, 20] };
    let models: Vec<JobModel> = if args.quick {
        vec![JobModel {
            job: Duration::from_secs(1),
            per_node: Duration::ZERO,
        }]
    } else {
        vec![
            JobModel {
                job: Duration::from_secs(3),
                per_node: Duration::ZERO,
            },
            JobModel {
                job: Duration::from_secs(1),
                per_node: Duration::from_millis(1500),
            },
        ]
    };
    let cases: Vec<Case> = [1, 2]
        .into_iter()
        .flat_map(|batches| ns.iter().map(move |&n| Case { n, batches }))
        .collect();
    let mut rows = Vec::new();
    for m in models {
        rows.extend(run_model(m, &cases).await);
    }
    // Removals at CloudStack's own pace: Running nodes (one job each, one drain per request)
    // against jobs of 2 s + 3 s per node; the ideal is N such jobs back to back.
    let pace = JobModel {
        job: Duration::from_secs(2),
        per_node: Duration::from_secs(3),
    };
    if !args.quick {
        let single: Vec<Case> = ns.iter().map(|&n| Case { n, batches: 1 }).collect();
        rows.extend(run_model(pace, &single).await);
    }

    let mut t = Table::new(&[
        "removal job",
        "calls",
        "design",
        "CloudStack jobs",
        "all VMs gone after",
        "DeleteNodes answers (OK / calls)",
        "DeleteNodes latency (p50 / max)",
        "failures",
    ]);
    let mut summary = Vec::new();
    for r in &rows {
        let calls = if r.case.batches == 1 {
            format!("{} at once", r.case.n)
        } else {
            format!(
                "{} at once, {} more {} s later",
                r.case.n,
                r.case.n,
                SECOND_BATCH_AFTER.as_secs()
            )
        };
        let mut rpc = r.merged.rpc.clone();
        let l = Latency::of(&mut rpc);
        t.row(vec![
            r.model.describe(),
            calls.clone(),
            "this provider".into(),
            r.merged.jobs.to_string(),
            fmt_dur(r.merged.gone_after),
            format!("{} / {}", r.merged.rpc_ok, r.case.n * r.case.batches),
            format!("{} / {}", fmt_dur(l.p50), fmt_dur(l.max)),
            outcome_note(&r.merged),
        ]);
        t.row(vec![
            r.model.describe(),
            calls,
            "one job at a time (before)".into(),
            r.sequential.jobs.to_string(),
            fmt_dur(r.sequential.gone_after),
            "—".into(),
            "—".into(),
            outcome_note(&r.sequential),
        ]);
        if r.model.job == pace.job && r.model.per_node == pace.per_node {
            let ideal = (pace.job + pace.per_node) * r.case.n as u32;
            summary.push(format!(
                "{} Running node(s) at CloudStack's pace ({}): gone after {:.2} × {} back-to-back jobs",
                r.case.n,
                r.model.describe(),
                r.merged.gone_after.as_secs_f64() / ideal.as_secs_f64(),
                r.case.n
            ));
        } else if r.case.batches == 1 && r.case.n == *ns.last().unwrap_or(&1) {
            summary.push(format!(
                "{} nodes, {}: {} job(s) and {} instead of {} jobs and {}",
                r.case.n,
                r.model.describe(),
                r.merged.jobs,
                fmt_dur(r.merged.gone_after),
                r.sequential.jobs,
                fmt_dur(r.sequential.gone_after)
            ));
        }
    }
    let body = format!(
        "Measured on {machine}; {} in all.\n\n{}\n{}.\n",
        fmt_dur(started.elapsed()),
        t.markdown(),
        summary.join("; "),
    );
    report(args, "scale_down", &body);
}
