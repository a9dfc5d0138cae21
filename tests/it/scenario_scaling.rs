//! End-to-end scenarios 1, 2 and 5: mock autoscaler → provider → simulated CloudStack, for
//! the ordinary paths: a scale-up that outlasts the call deadline, a stopped worker in Alert,
//! and the scale-down of empty nodes.

use cks_lab::autoscaler::{Decision, Reply, Request, Rpc, fake_reason};
use cks_proto::instance_status::InstanceState;
use cks_sim::{ClusterSpec, Scenario, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// Scenario 1. A Running cluster of 3 workers, demand for 2 more nodes, a CloudStack job that
/// takes 2 s and an autoscaler whose calls have a 1 s deadline.
#[tokio::test(start_paused = true)]
async fn scale_up_is_answered_inside_the_deadline_while_the_job_outlasts_it() {
    let stack = Stack::demo(|c| c.settings.job_duration = Duration::from_secs(2)).await;
    let deadline = Duration::from_secs(1);
    // Timers / 100: the provision time (9 s) comfortably covers the 2 s job.
    let mut ca = stack.autoscaler(autoscaler_config(100, 50, deadline)).await;

    let first = ca.run_once().await;
    assert_eq!(first.target(&stack.cluster_id), Some(3), "{first}");
    assert_eq!(first.ready, 3, "{first}");
    assert_eq!(
        first.unmanaged, 1,
        "the control node is no group's: {first}"
    );

    ca.set_demand(2);
    let up = ca.run_once().await;
    let increases: Vec<_> = up
        .calls
        .iter()
        .filter(|c| c.rpc() == Rpc::NodeGroupIncreaseSize)
        .collect();
    assert_eq!(increases.len(), 1, "{up}");
    assert!(increases[0].is_ok(), "{}", increases[0]);
    assert_eq!(
        increases[0].request,
        Request::NodeGroupIncreaseSize {
            id: stack.cluster_id.clone(),
            delta: 2
        }
    );
    // The autoscaler recalculates right after the scale-up: the target already shows the new
    // size while CloudStack still reports the old one and its job runs.
    assert_eq!(ca.last_target(&stack.cluster_id), Some(5), "{up}");
    assert_eq!(stack.cluster_size(), 3, "the job is still running");
    assert_eq!(stack.sim.running_jobs(&stack.cluster_id), 1);

    loop_until(&mut ca, "the 2 new nodes to be Ready", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 5)
    })
    .await;
    stack.wait_settled().await;
    loop_until(&mut ca, "the scale-up to complete", |ca| {
        ca.timeline()
            .decisions()
            .iter()
            .any(|(_, d)| matches!(d, Decision::ScaleUpCompleted { .. }))
    })
    .await;

    // Settled: more loops change nothing.
    let before = ca.loops_run();
    for l in ca.run_loops(10).await {
        assert!(l.aborted.is_none(), "{l}");
        assert_eq!(l.target(&stack.cluster_id), Some(5), "{l}");
        assert_eq!((l.ready, l.not_ready), (5, 0), "{l}");
        for rpc in [
            Rpc::NodeGroupIncreaseSize,
            Rpc::NodeGroupDeleteNodes,
            Rpc::NodeGroupDecreaseTargetSize,
        ] {
            assert_eq!(l.count(rpc), 0, "loop after settling: {l}");
        }
    }
    assert_eq!(ca.loops_run(), before + 10);

    show("scenario 1", &ca);
    assert!(ca.errors().is_empty(), "failed calls:\n{}", ca.timeline());
    assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "one scale request: {reqs:?}");
    assert_eq!(scale_keys(&reqs[0]), ["id", "size"], "size only");
    assert_eq!(reqs[0]["size"], "5");
    assert_eq!(stack.cluster_size(), 5);
    assert_eq!(stack.cluster_state(), "Running");
    // Every RPC, IncreaseSize included, well inside the 1 s deadline though the job took 2 s.
    assert_latencies_below(&ca, deadline * 3 / 4);
    let reads_slowest = ca
        .timeline()
        .all_calls()
        .filter(|c| !c.rpc().is_mutation())
        .map(|c| c.latency)
        .max()
        .unwrap_or_default();
    assert!(
        reads_slowest < deadline / 2,
        "a read took {reads_slowest:?}\n{}",
        ca.timeline()
    );
    stack.shutdown().await;
}

/// Scenario 2. A worker VM is stopped: Alert, the down worker's node NotReady, a
/// scale-up still accepted (size only), the NotReady node removed by nodeids after the unready
/// time, and the cluster back to Running.
#[tokio::test(start_paused = true)]
async fn a_stopped_worker_in_alert_is_reported_replaced_and_removed_by_nodeids() {
    let stack = Stack::demo(|c| c.settings.job_duration = Duration::from_millis(300)).await;
    // Timers / 600: unready time 2 s, provision time 1.5 s, scale-down delay after add 1 s.
    let mut ca = stack.autoscaler(autoscaler_config(600, 30, WAIT)).await;
    let first = ca.run_once().await;
    assert_eq!((first.ready, first.not_ready), (3, 0), "{first}");

    let (wid, _, _) = stack.workers()[1].clone();
    assert!(stack.sim.stop_vm(&wid));
    stack.wait_state("Alert").await;

    let provider_id = format!("external-cloudstack://{wid}");
    loop_until(&mut ca, "the down worker listed, its node NotReady", |ca| {
        last_instances(ca).iter().any(|i| i.id == provider_id)
            && ca.last_loop().is_some_and(|l| l.not_ready == 1)
    })
    .await;
    let down = last_instances(&ca)
        .into_iter()
        .find(|i| i.id == provider_id)
        .expect("down worker listed");
    // Running with no error: upstream's expectedToRegister (clusterstate.go) ignores a
    // Running instance's error except to stop expecting its node, which would strand a down VM
    // whose node never registered (scenario_scale_from_zero). Its node is registered, NotReady.
    assert_eq!(
        state_of(&down),
        InstanceState::InstanceRunning,
        "a down worker still exists: Running, not Creating"
    );
    assert!(error_info(&down).is_none(), "{down:?}");
    assert_eq!(
        ca.last_target(&stack.cluster_id),
        Some(3),
        "it counts in the size"
    );

    // One node's worth of pending pods.
    ca.set_demand(1);
    loop_until(&mut ca, "a scale-up in Alert", |ca| {
        ca.calls(Rpc::NodeGroupIncreaseSize)
            .iter()
            .any(|c| c.is_ok())
    })
    .await;
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(scale_keys(&reqs[0]), ["id", "size"], "size only in Alert");
    assert_eq!(reqs[0]["size"], "4");

    loop_until(
        &mut ca,
        "the down worker removed and the cluster Running again",
        |ca| {
            stack.sim.scan_now();
            ca.last_loop()
                .is_some_and(|l| l.ready == 3 && l.not_ready == 0)
                && stack.cluster_state() == "Running"
                && stack.cluster_size() == 3
                && stack.sim.running_jobs(&stack.cluster_id) == 0
        },
    )
    .await;

    show("scenario 2", &ca);
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 2, "one scale-up, one removal: {reqs:?}");
    assert_eq!(scale_keys(&reqs[1]), ["id", "nodeids"], "nodeids only");
    assert_eq!(reqs[1]["nodeids"], wid, "the down worker, and only it");
    assert!(
        !stack.workers().iter().any(|(id, _, _)| *id == wid),
        "the stopped VM is gone"
    );
    assert!(
        stack
            .workers()
            .iter()
            .all(|(_, _, s)| *s == VmState::Running)
    );

    // The autoscaler removed it as a real, NotReady node.
    let removal = ok_calls(&ca, Rpc::NodeGroupDeleteNodes);
    assert_eq!(removal.len(), 1, "{}", ca.timeline());
    let nodes = deleted_nodes(&removal[0]);
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].provider_id, provider_id);
    assert!(fake_reason(&nodes[0]).is_none());
    assert!(ca.timeline().decisions().iter().any(|(_, d)| matches!(
        d,
        Decision::ScaleDown { nodes, .. } if nodes.iter().any(|n| n.provider_id == provider_id
            && n.reason == cks_lab::autoscaler::ScaleDownReason::Unready)
    )));
    // The only failures allowed: a removal tried while the scale-up job still ran, refused
    // by the provider (one scale operation per cluster at a time).
    for e in ca.errors() {
        assert_eq!(e.rpc(), Rpc::NodeGroupDeleteNodes, "{e}");
        let err = e.error().expect("error");
        assert_eq!(err.code, tonic::Code::FailedPrecondition, "{e}");
        assert!(err.message.contains("scale job is running"), "{e}");
    }
    assert_eq!(ca.last_target(&stack.cluster_id), Some(3));
    stack.shutdown().await;
}

/// Scenario 5. Five empty workers, a workload needing one node, min size 2 and two control
/// nodes: the autoscaler removes three workers by nodeids, keeps the minimum, and never
/// touches a control node.
#[tokio::test(start_paused = true)]
async fn empty_nodes_are_removed_by_nodeids_down_to_the_min_and_control_nodes_are_kept() {
    let mut spec = ClusterSpec::new("shrink", 2, 5);
    spec.offering = Some("cks-medium".into());
    spec.autoscaling = true;
    spec.min_size = Some(2);
    spec.max_size = Some(10);
    let mut config = sim_config();
    config.scenario = Scenario::with_cluster(spec);
    config.settings.job_duration = Duration::from_millis(200);
    let stack = Stack::start(config, "shrink", |_| {}).await;
    let controls_before = stack.controls();
    assert_eq!(controls_before.len(), 2);

    let mut ca = stack.autoscaler(autoscaler_config(600, 30, WAIT)).await;
    ca.set_needed_nodes(1);
    loop_until(&mut ca, "scale-down to the min size", |ca| {
        stack.cluster_size() == 2
            && stack.sim.running_jobs(&stack.cluster_id) == 0
            && ca.last_loop().is_some_and(|l| l.ready == 2)
    })
    .await;
    // Keep looping: nothing more is removed below the minimum.
    let removals_so_far = stack.scale_requests().len();
    loop_for(&mut ca, Duration::from_millis(1500), 20).await;
    assert_eq!(stack.scale_requests().len(), removals_so_far);

    show("scenario 5", &ca);
    let control_ids: BTreeSet<String> = controls_before.iter().map(|c| c.0.clone()).collect();
    let mut removed = BTreeSet::new();
    for r in stack.scale_requests() {
        assert_eq!(scale_keys(&r), ["id", "nodeids"], "nodeids only: {r:?}");
        for id in r["nodeids"].split(',') {
            assert!(!control_ids.contains(id), "a control VM was named: {r:?}");
            assert!(removed.insert(id.to_string()), "{id} named twice");
        }
    }
    assert_eq!(
        removed.len(),
        3,
        "5 workers down to the min of 2: {removed:?}"
    );
    assert_eq!(stack.cluster_size(), 2);
    assert_eq!(stack.workers().len(), 2);
    assert_eq!(stack.controls(), controls_before, "control VMs untouched");

    // The autoscaler saw the control nodes as no group's and never asked to delete them.
    let control_lookups: Vec<_> = ca
        .calls(Rpc::NodeGroupForNode)
        .into_iter()
        .filter(|c| matches!(&c.request, Request::NodeGroupForNode { node } if node.name.contains("-control-")))
        .collect();
    assert!(!control_lookups.is_empty());
    for c in control_lookups {
        assert!(
            matches!(&c.outcome, Ok(Reply::NodeGroup(g)) if g.id.is_empty()),
            "{c}"
        );
    }
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert!(!deletes.is_empty());
    for c in &deletes {
        assert!(c.is_ok(), "{c}");
        for n in deleted_nodes(c) {
            assert!(!n.name.contains("-control-"), "{c}");
            assert!(
                fake_reason(&n).is_none(),
                "empty nodes are removed as real nodes: {c}"
            );
        }
    }
    assert!(
        ca.timeline().decisions().iter().any(|(_, d)| matches!(
            d,
            Decision::ScaleDownBlocked { reason, .. } if reason.contains("min size 2")
        )),
        "the min size held back the last unneeded node\n{}",
        ca.timeline()
    );
    assert_eq!(ca.last_target(&stack.cluster_id), Some(2));
    assert!(ca.errors().is_empty(), "{}", ca.timeline());
    stack.shutdown().await;
}
