//! CloudStack load: API calls per hour the provider makes for one cluster, idle and during a
//! scale-up, at the default settings (Refresh reuses a snapshot younger than 5 s, a running job
//! is polled every 2 s, a scale RPC watches its new job for 1.5 s) with the autoscaler's
//! default 10 s loop.
//!
//! An hour is not waited for: every timer (the provider's flags, the mock autoscaler's loop and
//! timeouts, the simulator's job, kubelet and scanner times) is divided by the same factor, the
//! calls CloudStack receives over a measured window are counted from the simulator's request
//! log, and the count is scaled back to real time. What does not scale (the few milliseconds of
//! each RPC and CloudStack call) makes loops slightly longer than 1/60th of 10 s, so the rates
//! are, if anything, a little low.
//!
//! `cargo bench --bench cloudstack_load [-- --write] [-- --quick]`

mod support;

use cks_lab::autoscaler::{AutoscalerConfig, MockAutoscaler, Rpc, SimNodeSource};
use cks_sim::{self as sim, RecordedRequest, Scenario, SimConfig, SimSettings};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{BenchArgs, Table, fmt_dur, report};

/// Real time ÷ bench time.
const SCALE: u32 = 60;

fn scaled(d: Duration) -> Duration {
    d / SCALE
}

/// Calls per command in `reqs` between two simulator times.
fn count(reqs: &[RecordedRequest], from_ms: u64, to_ms: u64) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in reqs.iter().filter(|r| r.atms >= from_ms && r.atms < to_ms) {
        *out.entry(r.command.clone()).or_default() += 1;
    }
    out
}

fn per_hour(n: usize, window_ms: u64) -> f64 {
    // window_ms of bench time is window_ms × SCALE of real time.
    n as f64 * 3_600_000.0 / (window_ms as f64 * f64::from(SCALE))
}

fn describe(calls: &BTreeMap<String, usize>, window_ms: u64) -> (String, f64) {
    let total: usize = calls.values().sum();
    let parts: Vec<String> = calls
        .iter()
        .map(|(k, v)| format!("{k} {:.0}", per_hour(*v, window_ms)))
        .collect();
    (parts.join(", "), per_hour(total, window_ms))
}

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse();
    let idle_window = if args.quick {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(30)
    };
    let machine = support::machine();
    let started = Instant::now();

    // A CKS scale-up: VM deployment, kubeadm join, nodes Ready: about 4 minutes.
    let job = Duration::from_secs(240);
    let mut cfg = SimConfig::for_tests("bench-key", "bench-secret");
    cfg.settings = SimSettings {
        job_duration: scaled(job),
        kubelet_delay: scaled(Duration::from_secs(60)),
        scanner_interval: scaled(Duration::from_secs(30)),
        ready_poll: scaled(Duration::from_secs(15)),
        vm_op_duration: scaled(Duration::from_secs(60)),
        ..SimSettings::default()
    };
    cfg.scenario = Scenario::demo();
    let sim = sim::spawn(cfg).await.expect("simulator");
    let cluster = sim.cluster_ids()[0].clone();
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let args_p = ProviderArgs::new(
        &sim.api_url,
        &sim.api_key,
        &sim.secret_key,
        vec![format!("1:10:{cluster}")],
    )
    .flag(
        "--refresh-min-interval",
        &ms(scaled(Duration::from_secs(5))),
    )
    .flag("--job-poll-interval", &ms(scaled(Duration::from_secs(2))))
    .flag("--scale-watch", &ms(scaled(Duration::from_millis(1500))))
    .flag("--staleness-bound", &ms(scaled(Duration::from_secs(120))));
    let p =
        ProviderProcess::spawn(support::provider_bin(), &support::work_dir("load"), args_p).await;
    p.wait_serving(Duration::from_secs(30)).await;

    let nodes = SimNodeSource::new(&sim.api_url)
        .expect("node source")
        .for_cluster(cluster.clone());
    let mut ca = MockAutoscaler::new(
        p.client(),
        Arc::new(nodes),
        AutoscalerConfig::time_scaled(SCALE),
    );
    let interval = ca.config().loop_interval;

    // Idle: nothing pending; every loop Refreshes.
    ca.run_once().await;
    let idle_from = sim.now_ms();
    let until = Instant::now() + idle_window;
    let mut idle_loops = 0;
    while Instant::now() < until {
        tokio::time::sleep(interval).await;
        let s = ca.run_once().await;
        assert!(s.aborted.is_none(), "{s}");
        idle_loops += 1;
    }
    let idle_to = sim.now_ms();

    // Scale-up: two nodes' worth of pods appear; loops go on until the nodes are Ready and the
    // job has ended.
    ca.set_demand(2);
    let up_from = sim.now_ms();
    let up_loops = ca
        .run_until(Duration::from_secs(120), |ca| {
            ca.last_loop().is_some_and(|l| l.ready == 5)
        })
        .await
        .expect("scale-up finished");
    let sim_idle = {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let c = sim.cluster_json(&cluster);
            if sim.running_jobs(&cluster) == 0 && c["state"] == "Running" {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(interval).await;
        }
    };
    assert!(sim_idle, "the scale-up job never ended");
    let up_to = sim.now_ms();
    assert_eq!(
        ca.calls(Rpc::NodeGroupIncreaseSize).len(),
        1,
        "{}",
        ca.timeline()
    );

    let reqs = sim.requests();
    let idle = count(&reqs, idle_from, idle_to);
    let up = count(&reqs, up_from, up_to);
    let (idle_desc, idle_rate) = describe(&idle, idle_to - idle_from);
    let (up_desc, up_rate) = describe(&up, up_to - up_from);
    let up_total: usize = up.values().sum();
    let real = |bench_ms: u64| Duration::from_millis(bench_ms * u64::from(SCALE));

    let mut t = Table::new(&[
        "phase",
        "measured (bench time → real time)",
        "autoscaler loops",
        "CloudStack calls / hour",
        "by command (/ hour)",
        "calls in the phase",
    ]);
    t.row(vec![
        "idle".into(),
        format!(
            "{} → {}",
            fmt_dur(Duration::from_millis(idle_to - idle_from)),
            fmt_dur(real(idle_to - idle_from))
        ),
        idle_loops.to_string(),
        format!("{idle_rate:.0}"),
        idle_desc,
        idle.values().sum::<usize>().to_string(),
    ]);
    t.row(vec![
        "scale-up of 2 nodes (4-minute job)".into(),
        format!(
            "{} → {}",
            fmt_dur(Duration::from_millis(up_to - up_from)),
            fmt_dur(real(up_to - up_from))
        ),
        up_loops.to_string(),
        format!("{up_rate:.0}"),
        up_desc,
        up_total.to_string(),
    ]);
    let body = format!(
        "Measured on {machine}, timers divided by {SCALE}; {} in all.\n\n{}\nIdle, each 10 s loop's Refresh finds a snapshot older than 5 s and reads the cluster once: one `listKubernetesClusters` per loop, whatever the number of nodes. During a scale-up the job is also polled every 2 s (`queryAsyncJobResult`), and the scale request itself costs one `listKubernetesClusters` (fresh snapshot), the `scaleKubernetesCluster` and a few polls while the RPC watches the new job.\n",
        fmt_dur(started.elapsed()),
        t.markdown()
    );
    report(args, "cloudstack_load", &body);
    drop(p);
    sim.shutdown().await;
}
