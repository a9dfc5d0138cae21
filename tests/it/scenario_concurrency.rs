//! End-to-end scenario 8: several autoscaler loops at once against one provider (as when two
//! cluster-autoscaler replicas both think they lead, or during a rollout). CloudStack never
//! runs two scale jobs for the cluster at once, and the provider's state stays consistent
//! with CloudStack's.

use cks_lab::autoscaler::{MockAutoscaler, Rpc};
use cks_proto::instance_status::InstanceState;
use cks_testkit::stack::*;
use cks_testkit::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;

/// Runs `ca` in its own task, loop after loop, until `stop` is set; `loops` counts them.
fn spawn_loops(
    mut ca: MockAutoscaler,
    stop: Arc<AtomicBool>,
    loops: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<MockAutoscaler> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            ca.run_once().await;
            loops.fetch_add(1, Ordering::Relaxed);
            // The autoscaler's loop cadence (--scan-interval), not a wait for anything.
            tokio::time::sleep(ca.config().loop_interval).await;
        }
        ca
    })
}

/// Three autoscalers with conflicting workloads (8, 6 and 2 nodes needed) loop concurrently
/// for at least 4 s against one provider: scale-ups and removals race. Throughout, CloudStack runs at
/// most one scale job for the cluster; afterwards the provider's target and instances match
/// CloudStack's cluster exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_autoscalers_never_run_two_jobs_and_leave_a_consistent_state() {
    let mut config = sim_config();
    config.settings.job_duration = Duration::from_millis(250);
    let stack = Arc::new(Stack::start(config, "demo", |_| {}).await);
    let control_ids: BTreeSet<String> = stack.controls().into_iter().map(|c| c.0).collect();

    // Sample CloudStack's running scale jobs for the cluster every millisecond or so.
    let stop = Arc::new(AtomicBool::new(false));
    let max_jobs = Arc::new(AtomicUsize::new(0));
    let samples_with_job = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stack, stop, max_jobs, busy) = (
            stack.clone(),
            stop.clone(),
            max_jobs.clone(),
            samples_with_job.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = stack.sim.running_jobs(&stack.cluster_id);
                max_jobs.fetch_max(n, Ordering::Relaxed);
                if n > 0 {
                    busy.fetch_add(1, Ordering::Relaxed);
                }
                // Sampling period of the job counter, not a wait for anything.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };

    let mut tasks = Vec::new();
    let mut counters = Vec::new();
    for needed in [8, 6, 2] {
        let mut ca = stack.autoscaler(autoscaler_config(600, 20, WAIT)).await;
        ca.set_needed_nodes(needed);
        let loops = Arc::new(AtomicUsize::new(0));
        counters.push(loops.clone());
        tasks.push(spawn_loops(ca, stop.clone(), loops));
    }
    // Race for 4 s, and longer on a slow machine: until every autoscaler has run 10 loops and
    // CloudStack has received both scale-ups and removals.
    let started = Instant::now();
    wait_until(
        "a 4 s race of scale-ups and removals, 10 loops each",
        async || {
            assert!(
                stack.sim.running_jobs(&stack.cluster_id) <= 1,
                "two scale jobs at once"
            );
            let reqs = stack.scale_requests();
            let raced = reqs.iter().any(|r| r.contains_key("size"))
                && reqs.iter().any(|r| r.contains_key("nodeids"));
            let looped = counters.iter().all(|c| c.load(Ordering::Relaxed) >= 10);
            started.elapsed() >= Duration::from_secs(4) && raced && looped
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut mocks = Vec::new();
    for t in tasks {
        mocks.push(t.await.expect("autoscaler task"));
    }
    sampler.await.expect("sampler");
    // Jobs queued by the provider may still run: keep checking until everything settles.
    wait_until("CloudStack and the provider to settle", async || {
        assert!(stack.sim.running_jobs(&stack.cluster_id) <= 1);
        stack.sim.running_jobs(&stack.cluster_id) == 0 && stack.cluster_state() == "Running"
    })
    .await;
    stack.wait_provider_settled().await;

    for (i, ca) in mocks.iter().enumerate() {
        show(&format!("autoscaler {i}"), ca);
    }
    assert_eq!(
        max_jobs.load(Ordering::Relaxed),
        1,
        "at most one job at a time, and jobs did run"
    );
    assert!(samples_with_job.load(Ordering::Relaxed) > 0);

    // The race really happened: scale-ups and removals were both accepted.
    let accepted = |rpc| {
        mocks
            .iter()
            .map(|ca| ok_calls(ca, rpc).len())
            .sum::<usize>()
    };
    assert!(accepted(Rpc::NodeGroupIncreaseSize) > 0);
    assert!(accepted(Rpc::NodeGroupDeleteNodes) > 0);
    // Refusals are the provider serialising the callers, never a crash or a timeout.
    for ca in &mocks {
        assert!(ca.loops_run() >= 10, "{} loops only", ca.loops_run());
        for c in ca.errors() {
            let code = c.error().expect("error").code;
            // A group whose nodes are all going away has no node to copy: the autoscaler asks
            // for a template, and this provider (no extras) answers Unimplemented, which the
            // autoscaler takes as "use a NotReady node" (MixedTemplateNodeInfoProvider).
            if c.rpc() == Rpc::NodeGroupTemplateNodeInfo && code == Code::Unimplemented {
                continue;
            }
            assert!(
                matches!(
                    code,
                    Code::FailedPrecondition | Code::Unavailable | Code::OutOfRange
                ),
                "{c}"
            );
        }
        for l in ca.timeline().loops() {
            if let Some(t) = l.target(&stack.cluster_id) {
                assert!((1..=10).contains(&t), "{l}");
            }
        }
    }

    // Every request CloudStack got was well-formed: size only or nodeids only, never a
    // control VM, never a VM twice.
    let mut removed = BTreeSet::new();
    for r in stack.scale_requests() {
        match scale_keys(&r).as_slice() {
            [a, b] if a == "id" && b == "size" => {
                let size: u32 = r["size"].parse().expect("size");
                assert!((1..=10).contains(&size), "{r:?}");
            }
            [a, b] if a == "id" && b == "nodeids" => {
                for id in r["nodeids"].split(',') {
                    assert!(!control_ids.contains(id), "{r:?}");
                    assert!(removed.insert(id.to_string()), "{id} removed twice");
                }
            }
            other => panic!("unexpected parameters {other:?}: {r:?}"),
        }
    }

    // Final state: the provider's view is CloudStack's cluster.
    let size = stack.cluster_size();
    let workers: BTreeSet<String> = stack
        .workers()
        .into_iter()
        .map(|(id, _, _)| format!("external-cloudstack://{id}"))
        .collect();
    assert_eq!(
        workers.len() as i64,
        size,
        "CloudStack: one worker VM per size unit"
    );
    let (target, instances) = stack.provider_view().await;
    assert_eq!(i64::from(target), size);
    let ids: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids, workers);
    for i in &instances {
        assert_eq!(state_of(i), InstanceState::InstanceRunning, "{i:?}");
        assert!(error_info(i).is_none(), "{i:?}");
    }
    let stack = Arc::try_unwrap(stack).unwrap_or_else(|_| panic!("stack still shared"));
    stack.shutdown().await;
}

/// Scenario 8, the race behind the test above made deterministic: one caller's removal job
/// runs and CloudStack has already destroyed the first of its VMs when a second caller (with
/// an older node list) asks to delete that node. The provider answers as for any node it has
/// removed: done, nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_node_whose_removal_job_still_runs_is_a_no_op() {
    use cks_proto as pb;
    let mut config = sim_config();
    // Two VMs removed one after the other, one second each.
    config.settings.job_duration = Duration::from_secs(2);
    let stack = Stack::start(config, "demo", |_| {}).await;
    let mut client =
        pb::cloud_provider_client::CloudProviderClient::connect(format!("http://{}", stack.addr))
            .await
            .expect("connect");
    let delete = |nodes: Vec<(String, String)>| pb::NodeGroupDeleteNodesRequest {
        id: stack.cluster_id.clone(),
        nodes: nodes
            .into_iter()
            .map(|(id, name)| pb::ExternalGrpcNode {
                provider_id: format!("external-cloudstack://{id}"),
                name: name.to_lowercase(),
                ..Default::default()
            })
            .collect(),
    };
    let workers: Vec<(String, String)> = stack
        .workers()
        .into_iter()
        .map(|(id, name, _)| (id, name))
        .collect();
    // Down VMs, so both go in one request (CloudStack drains no down VM; a request carries
    // at most one VM that needs a drain).
    for (id, _) in &workers[..2] {
        assert!(stack.sim.stop_vm(id));
    }
    client
        .refresh(pb::RefreshRequest {})
        .await
        .expect("refresh");
    client
        .node_group_delete_nodes(delete(workers[..2].to_vec()))
        .await
        .expect("first caller's removal");
    let gone = || -> Vec<(String, String)> {
        let left: Vec<String> = stack.workers().into_iter().map(|w| w.0).collect();
        workers[..2]
            .iter()
            .filter(|(id, _)| !left.contains(id))
            .cloned()
            .collect()
    };
    wait_until("a VM destroyed while the job runs", async || {
        !gone().is_empty() || stack.sim.running_jobs(&stack.cluster_id) == 0
    })
    .await;
    let gone = gone();
    assert_eq!(
        (gone.len(), stack.sim.running_jobs(&stack.cluster_id)),
        (1, 1),
        "one VM gone, the job still running, for this test to mean anything"
    );
    client
        .refresh(pb::RefreshRequest {})
        .await
        .expect("refresh");
    let again = client.node_group_delete_nodes(delete(gone)).await;
    assert!(again.is_ok(), "second caller: {again:?}");
    stack.wait_settled().await;
    stack.wait_provider_settled().await;
    assert_eq!(
        stack.scale_requests().len(),
        1,
        "{:?}",
        stack.scale_requests()
    );
    assert_eq!(stack.cluster_size(), 1);
    stack.shutdown().await;
}
