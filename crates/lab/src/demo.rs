//! `cks-demo`: the simulator, the provider and the mock autoscaler in one process, playing three
//! scenarios live on loopback with shrunk timings: a scale-up in a Running cluster, a stopped
//! worker (Alert: scale-up by size, removal of the down worker by nodeids), and a scale-up that
//! fails for lack of capacity (CloudStack fails the job before any VM exists: the autoscaler
//! hears the refusal and backs off).

use crate::autoscaler::{AutoscalerConfig, LoopSummary, MockAutoscaler, Rpc, SimNodeSource};
use anyhow::Context;
use cks_autoscaler_provider::config::{ClusterRef, NodeGroupSpec};
use cks_autoscaler_provider::provider::{Provider, Settings};
use cks_autoscaler_provider::server::{ServeOptions, serve};
use cks_cloudstack::{Client, ClientConfig};
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{self as sim, JobFailure, SimConfig, SimHandle, SimSettings};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The simulator, the provider and the mock autoscaler in one process, playing three scenarios
/// live on loopback with shrunk timings (under a minute).
#[derive(Debug, clap::Parser)]
#[command(name = "cks-demo", version)]
pub struct DemoArgs {
    /// Print every loop, not only the loops where something changed.
    #[arg(long)]
    pub verbose: bool,
    /// Give up on a scenario after this many seconds.
    #[arg(long, default_value_t = 40)]
    pub scenario_timeout_secs: u64,
}

struct Demo {
    sim: SimHandle,
    mock: MockAutoscaler,
    cluster_id: String,
    verbose: bool,
    last_line: String,
    started: Instant,
    timeout: Duration,
}

impl Demo {
    fn cluster(&self) -> (String, u64, usize) {
        let c = self.sim.cluster_json(&self.cluster_id);
        let state = c["state"].as_str().unwrap_or("?").to_string();
        let size = c["size"].as_u64().unwrap_or(0);
        let down = self
            .sim
            .vms(&self.cluster_id)
            .iter()
            .filter(|(_, n, s)| {
                n.contains("-node-")
                    && matches!(
                        s,
                        sim::VmState::Stopped | sim::VmState::Error | sim::VmState::Shutdown
                    )
            })
            .count();
        (state, size, down)
    }

    fn print_loop(&mut self, s: &LoopSummary) {
        let (state, size, down) = self.cluster();
        let target = s.groups.first().map(|g| g.target).unwrap_or(-1);
        let mutations: Vec<String> = s
            .calls
            .iter()
            .filter(|c| c.rpc().is_mutation())
            .map(|c| {
                let outcome = match c.error() {
                    None => "ok".to_string(),
                    Some(e) => format!("{:?}: {}", e.code, e.message),
                };
                format!("{} {}", c.rpc().name(), outcome)
            })
            .collect();
        let key = format!(
            "{target}/{}/{}/{state}/{size}/{down}/{}",
            s.ready,
            s.not_ready,
            mutations.join(";")
        );
        if !self.verbose && key == self.last_line && mutations.is_empty() {
            return;
        }
        self.last_line = key;
        let errored = s.groups.first().map(|g| g.instances.errored).unwrap_or(0);
        let mut line = format!(
            "  [{:>5.1}s] loop {:>3}: target {target}, nodes {} Ready/{} NotReady, cluster {state} size {size}{}{}",
            self.started.elapsed().as_secs_f64(),
            s.loop_no,
            s.ready,
            s.not_ready,
            if down > 0 {
                format!(", {down} worker VM(s) down")
            } else {
                String::new()
            },
            if errored > 0 {
                format!(", {errored} instance(s) with an error")
            } else {
                String::new()
            },
        );
        if let Some(a) = &s.aborted {
            line.push_str(&format!(" — loop aborted: {a}"));
        }
        println!("{line}");
        for m in mutations {
            println!("           {m}");
        }
        for d in &s.decisions {
            println!("           decision: {d}");
        }
    }

    async fn run_until(
        &mut self,
        what: &str,
        mut done: impl FnMut(&Demo) -> bool,
    ) -> anyhow::Result<()> {
        let give_up = Instant::now() + self.timeout;
        loop {
            let s = self.mock.run_once().await;
            self.print_loop(&s);
            if done(self) {
                return Ok(());
            }
            if Instant::now() > give_up {
                anyhow::bail!("demo scenario did not reach: {what}");
            }
            tokio::time::sleep(self.mock.config().loop_interval).await;
        }
    }

    fn ready_workers(&self) -> usize {
        self.mock.last_loop().map(|l| l.ready).unwrap_or(0)
    }

    fn scale_requests(&self) -> Vec<BTreeMap<String, String>> {
        self.sim
            .requests()
            .into_iter()
            .filter(|r| r.command == "scaleKubernetesCluster")
            .map(|r| r.params)
            .collect()
    }
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let settings = SimSettings {
        job_duration: Duration::from_millis(1500),
        kubelet_delay: Duration::from_millis(600),
        scanner_interval: Duration::from_millis(400),
        vm_op_duration: Duration::from_millis(200),
        ready_poll: Duration::from_millis(100),
        ..SimSettings::default()
    };
    let sim = sim::spawn(SimConfig {
        settings,
        ..SimConfig::default()
    })
    .await?;
    let cluster_id = sim.cluster_id("demo").context("the demo cluster")?;
    let client = Client::new(
        ClientConfig::new(&sim.api_url, &sim.api_key, &sim.secret_key)
            .with_timeout(Duration::from_secs(3)),
    )?;
    let mut ps = Settings::with_groups(vec![NodeGroupSpec {
        min: 1,
        max: 10,
        cluster: ClusterRef::Id(cluster_id.clone()),
    }]);
    ps.job_poll_interval = Duration::from_millis(200);
    ps.refresh_min_interval = Duration::ZERO;
    ps.scale_watch = Duration::from_millis(200);
    let provider = Provider::new(client, ps);
    provider
        .refresh()
        .await
        .map_err(|e| anyhow::anyhow!("first refresh: {e}"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        provider.clone(),
        ServeOptions::default(),
        async {
            let _ = stop_rx.await;
        },
    ));
    let grpc = CloudProviderClient::connect(format!("http://{addr}")).await?;
    let nodes = Arc::new(SimNodeSource::new(&sim.api_url)?.for_cluster(cluster_id.clone()));
    // Autoscaler timers divided by 100: 10 s unready time, 9 s provision time, 3 s backoff.
    let mut config = AutoscalerConfig::time_scaled(100);
    config.loop_interval = Duration::from_millis(250);
    let mock = MockAutoscaler::new(grpc, nodes, config);
    println!("cks-autoscaler-provider demo");
    println!(
        "  CloudStack simulator {}  (CKS cluster \"demo\": 1 control, 3 workers, min 1, max 10)",
        sim.api_url
    );
    println!(
        "  provider gRPC {addr}; mock cluster-autoscaler with 5 s call deadline, timers / 100\n"
    );
    let mut demo = Demo {
        sim,
        mock,
        cluster_id: cluster_id.clone(),
        verbose: args.verbose,
        last_line: String::new(),
        started,
        timeout: Duration::from_secs(args.scenario_timeout_secs),
    };

    // The kubelets of the running workers register first.
    let boot = Instant::now();
    while demo
        .sim
        .nodes()
        .iter()
        .filter(|n| n.role == "worker" && n.ready)
        .count()
        < 3
    {
        if boot.elapsed() > demo.timeout {
            anyhow::bail!("the demo cluster's nodes never became Ready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    demo.mock.set_needed_nodes(3);
    demo.run_until("3 Ready nodes", |d| d.ready_workers() == 3)
        .await?;
    println!("== 1. Running cluster, pending pods need 2 more nodes");
    demo.mock.set_needed_nodes(5);
    demo.run_until("5 Ready nodes", |d| {
        d.ready_workers() == 5 && d.cluster().0 == "Running"
    })
    .await?;
    println!(
        "   -> one scaleKubernetesCluster size=5; the RPC returned at once, the job ran in the background\n"
    );

    println!("== 2. A worker VM is stopped: the cluster goes to Alert");
    let (vm_id, vm_name, _) = demo
        .sim
        .vms(&cluster_id)
        .into_iter()
        .find(|(_, n, _)| n.contains("-node-"))
        .context("a worker")?;
    demo.sim.stop_vm(&vm_id);
    println!("   stopVirtualMachine {vm_name}");
    println!(
        "   its node turns NotReady; its pods wait for a replacement, the status scanner moves the cluster to Alert"
    );
    demo.run_until("Alert", |d| d.cluster().0 == "Alert")
        .await?;
    println!(
        "   pending pods need one more node while the cluster is in Alert (a size change is permitted)"
    );
    demo.mock.set_needed_nodes(6);
    demo.run_until("the down worker removed and the cluster Running", |d| {
        let (state, _, down) = d.cluster();
        down == 0 && state == "Running" && d.ready_workers() >= 5
    })
    .await?;
    println!(
        "   -> Alert permitted a size change, then the autoscaler removed the NotReady node by nodeids\n"
    );

    println!("== 3. A scale-up fails: CloudStack has no capacity left");
    demo.sim.configure(|s| s.job_failure = JobFailure::Capacity);
    let size_before = demo.cluster().1;
    let calls_before = demo.mock.timeline().all_calls().count();
    demo.mock.set_needed_nodes(8);
    demo.run_until("the group backed off, its target unchanged", |d| {
        let l = d.mock.last_loop();
        let backed_off = l
            .and_then(|l| l.groups.first())
            .is_some_and(|g| g.backed_off);
        let target = l
            .and_then(|l| l.groups.first())
            .map(|g| g.target)
            .unwrap_or(-1);
        backed_off && target == size_before as i32
    })
    .await?;
    demo.sim.configure(|s| s.job_failure = JobFailure::None);
    // CloudStack fails this job in its checks, before it creates a VM. IncreaseSize answers
    // once the job is past them, so the autoscaler normally hears the failure as the answer; a
    // job that fails only after that answer leaves failed instances for the autoscaler instead.
    let section: Vec<_> = demo
        .mock
        .timeline()
        .all_calls()
        .skip(calls_before)
        .collect();
    let refused = section
        .iter()
        .any(|c| c.rpc() == Rpc::NodeGroupIncreaseSize && c.error().is_some());
    let failed_deleted = section
        .iter()
        .any(|c| c.rpc() == Rpc::NodeGroupDeleteNodes && c.is_ok());
    if refused {
        println!(
            "   -> CloudStack failed the job before creating any VM: IncreaseSize answered \
             FailedPrecondition with its error,\n      the autoscaler backed the group off; the \
             target stayed at {size_before}, no instance to delete\n"
        );
    } else if failed_deleted {
        println!(
            "   -> the job failed after IncreaseSize answered: its instances were reported failed \
             (OutOfResources),\n      deleted by the autoscaler, group backed off\n"
        );
    } else {
        println!("   -> the group backed off, its target back at {size_before}\n");
    }

    let timeline = demo.mock.timeline();
    let calls: Vec<_> = timeline.all_calls().collect();
    let errors = timeline.errors();
    let slowest = calls.iter().map(|c| c.latency).max().unwrap_or_default();
    let mut by_rpc = Vec::new();
    for rpc in Rpc::ALL {
        let n = calls.iter().filter(|c| c.rpc() == rpc).count();
        if n > 0 {
            by_rpc.push(format!("{}×{n}", rpc.name()));
        }
    }
    let scale = demo.scale_requests();
    println!("== Summary ({:.1}s)", started.elapsed().as_secs_f64());
    println!("  autoscaler loops: {}", demo.mock.loops_run());
    println!(
        "  gRPC calls: {} ({}), slowest {:?}",
        calls.len(),
        by_rpc.join(", "),
        slowest
    );
    println!("  refusals/errors the autoscaler saw: {}", errors.len());
    for e in errors.iter().take(5) {
        if let Some(err) = e.error() {
            println!("    {} {:?}: {}", e.rpc().name(), err.code, err.message);
        }
    }
    println!(
        "  scaleKubernetesCluster requests CloudStack received: {}",
        scale.len()
    );
    for r in &scale {
        let what: Vec<String> = r
            .iter()
            .filter(|(k, _)| *k != "id" && *k != "response")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("    {}", what.join(" "));
    }
    let (state, size, down) = demo.cluster();
    println!("  final cluster: {state}, size {size}, {down} worker(s) down");
    // The autoscaler exits as on SIGTERM (Cleanup, background work stopped).
    demo.mock.exit().await;
    let _ = stop_tx.send(());
    let _ = server.await;
    provider.cleanup().await;
    demo.sim.shutdown().await;
    Ok(())
}
