//! End-to-end scenarios 3 and 7: clusters in Alert for reasons scaling cannot fix, and a
//! CloudStack without the Alert-scaling change. Every refusal names its rule, nothing useless
//! reaches CloudStack, and the autoscaler backs off instead of retrying every loop.

use cks_lab::autoscaler::{Decision, MockAutoscaler, Reply, Rpc};
use cks_sim::{ClusterSpec, ClusterState, NodesSpec, Scenario, SimConfig, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

/// Timers / 600: backoff 0.5 s doubling to 3 s, unready time 2 s, loops every 20 ms.
fn config() -> cks_lab::autoscaler::AutoscalerConfig {
    autoscaler_config(600, 20, WAIT)
}

/// The IncreaseSize calls of `ca` that the provider refused, checked to be refusals naming
/// `rule`, and spaced by at least the backoff the autoscaler announced after each.
fn assert_refused_with_backoff(ca: &MockAutoscaler, rule: &str) {
    let increases = ca.calls(Rpc::NodeGroupIncreaseSize);
    assert!(
        !increases.is_empty(),
        "no scale-up tried\n{}",
        ca.timeline()
    );
    for c in &increases {
        let e = c.error().unwrap_or_else(|| panic!("accepted: {c}"));
        assert_eq!(e.code, Code::FailedPrecondition, "{c}");
        assert!(e.message.contains(rule), "{rule:?} not named: {c}");
    }
    let backoffs: Vec<Duration> = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter_map(|(_, d)| match d {
            Decision::BackOff {
                duration,
                error_code,
                error_class,
                ..
            } => {
                assert_eq!(
                    (error_class, error_code.as_str()),
                    (&99, "cloudProviderError")
                );
                Some(*duration)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        backoffs.len(),
        increases.len(),
        "each refusal backs the group off\n{}",
        ca.timeline()
    );
    assert_eq!(assert_backoffs_respected(ca), backoffs);
    // The backoff grows: the loop is not retried at a constant pace.
    if backoffs.len() >= 3 {
        assert!(backoffs[2] > backoffs[0], "{backoffs:?}");
    }
}

/// Runs an autoscaler with pending demand against a cluster that cannot be scaled for
/// `rule`, for 3.5 s of loops, and checks what the autoscaler and CloudStack saw.
/// Each refusal must also name every string of `named` (the VM to act on).
async fn refused_without_calling_cloudstack(mut stack: Stack, rule: &str, named: &[String]) {
    // The provider's target: the listed worker VMs (a VM left behind by a failed scale-up
    // included: it is an instance the autoscaler sees).
    let workers = stack
        .workers()
        .iter()
        .filter(|(_, _, state)| !matches!(state, VmState::Destroyed | VmState::Expunging))
        .count() as i32;
    stack.refresh().await.expect("refresh");
    let target = stack.target().await;
    assert_eq!(target, workers);
    let size = stack.cluster_size();
    stack.sim.reset_requests();
    let mut ca = stack.autoscaler(config()).await;
    ca.set_demand(2);
    loop_for(&mut ca, Duration::from_millis(3500), 40).await;
    show(rule, &ca);

    assert!(
        stack.scale_requests().is_empty(),
        "nothing may reach CloudStack: {:?}",
        stack.scale_requests()
    );
    assert_refused_with_backoff(&ca, rule);
    for c in ca.calls(Rpc::NodeGroupIncreaseSize) {
        let message = &c.error().expect("refused").message;
        for n in named {
            assert!(message.contains(n.as_str()), "{n} not named: {message}");
        }
    }
    let tries = ca.calls(Rpc::NodeGroupIncreaseSize).len();
    assert!(
        (tries as u64) * 2 < ca.loops_run(),
        "{tries} scale-ups in {} loops: not backing off\n{}",
        ca.loops_run(),
        ca.timeline()
    );
    // The provider keeps answering; the group says why it cannot scale; nothing changed.
    for l in ca.timeline().loops() {
        assert!(l.aborted.is_none(), "{l}");
        assert_eq!(l.target(&stack.cluster_id), Some(target), "{l}");
    }
    let debug = ca
        .calls(Rpc::NodeGroups)
        .iter()
        .rev()
        .find_map(|c| match &c.outcome {
            Ok(Reply::NodeGroups(g)) => g.first().map(|g| g.debug.clone()),
            _ => None,
        })
        .unwrap_or_default();
    assert!(
        debug.contains("cannot scale") && debug.contains(rule),
        "{debug}"
    );
    stack.refresh().await.expect("refresh");
    assert_eq!(stack.target().await, target, "nothing changed");
    assert_eq!(stack.cluster_size(), size, "nothing changed in CloudStack");
    stack.shutdown().await;
}

fn with_alert_scaling(on: bool) -> SimConfig {
    let mut c = sim_config();
    c.settings.alert_scaling = on;
    c
}

async fn control_vm_down(alert_scaling: bool) {
    let stack = Stack::start(with_alert_scaling(alert_scaling), "demo", |_| {}).await;
    let (cid, cname, _) = stack.controls()[0].clone();
    assert!(stack.sim.stop_vm(&cid));
    stack.wait_state("Alert").await;
    refused_without_calling_cloudstack(stack, "CKS Alert rule 4", &[cname]).await;
}

/// Scenario 3: the first control VM is down (CKS Alert rule 4).
#[tokio::test(start_paused = true)]
async fn alert_with_the_control_vm_down_is_refused_locally_and_backed_off() {
    control_vm_down(true).await;
}

/// Scenario 3: an etcd VM is down (CKS Alert rule 6).
#[tokio::test(start_paused = true)]
async fn alert_with_an_etcd_vm_down_is_refused_locally_and_backed_off() {
    let mut spec = ClusterSpec::new("ha", 1, 3);
    spec.etcd = NodesSpec::Count(1);
    let mut config = sim_config();
    config.scenario = Scenario::with_cluster(spec);
    let stack = Stack::start(config, "ha", |_| {}).await;
    let etcd = stack.vms_named("etcd");
    assert_eq!(etcd.len(), 1);
    assert!(stack.sim.stop_vm(&etcd[0].0));
    stack.wait_state("Alert").await;
    let name = etcd[0].1.clone();
    refused_without_calling_cloudstack(stack, "CKS Alert rule 6", &[name]).await;
}

/// Scenario 3: Alert while every VM runs (a failed upgrade, a host that was away): no worker
/// is down, so scaling cannot help (CKS Alert rule 7).
#[tokio::test(start_paused = true)]
async fn alert_without_a_down_worker_is_refused_locally_and_backed_off() {
    let mut config = sim_config();
    // The status scanner would put a cluster whose VMs all run back to Running at once.
    config.settings.scanner_interval = Duration::from_secs(3600);
    let stack = Stack::start(config, "demo", |_| {}).await;
    assert!(
        stack
            .sim
            .set_cluster_state(&stack.cluster_id, ClusterState::Alert)
    );
    assert_eq!(stack.cluster_state(), "Alert");
    refused_without_calling_cloudstack(stack, "CKS Alert rule 7", &[]).await;
}

/// Scenario 3: CloudStack lists more VMs than the cluster has nodes (a VM left behind by a
/// failed scale-up): CKS Alert rule 5.
#[tokio::test(start_paused = true)]
async fn alert_with_more_vms_than_nodes_is_refused_locally_and_backed_off() {
    let mut spec = ClusterSpec::new("leftover", 1, 4);
    spec.size = Some(3);
    spec.state = Some(ClusterState::Alert);
    let mut config = sim_config();
    config.scenario = Scenario::with_cluster(spec);
    let stack = Stack::start(config, "leftover", |_| {}).await;
    assert_eq!((stack.workers().len(), stack.cluster_size()), (4, 3));
    stack.wait_state("Alert").await;
    // "lists 5 VMs ... has 4 nodes": the counts that differ.
    refused_without_calling_cloudstack(
        stack,
        "CKS Alert rule 5",
        &["5 VMs".to_string(), "4 nodes".to_string()],
    )
    .await;
}

/// Scenario 7 with scenario 3: on a CloudStack without the Alert change, a cluster whose
/// control VM is down is refused the same way, without calling CloudStack.
#[tokio::test(start_paused = true)]
async fn without_alert_scaling_a_control_vm_down_is_refused_the_same_way() {
    control_vm_down(false).await;
}

/// Scenario 7 with scenario 2: a worker VM is stopped on a CloudStack that refuses every scale
/// request in Alert. The first scale-up reaches CloudStack and is refused with its text; from
/// then on the provider refuses locally (scale-ups and the removal of the down worker), the
/// autoscaler backs off, and once the VM runs again scaling works.
#[tokio::test(start_paused = true)]
async fn without_alert_scaling_a_stopped_worker_gets_clear_refusals_and_no_retry_storm() {
    let stack = Stack::start(with_alert_scaling(false), "demo", |_| {}).await;
    let mut ca = stack.autoscaler(config()).await;
    // The autoscaler knows the node Ready before it goes down.
    assert_eq!(ca.run_once().await.ready, 3);
    let (wid, wname, _) = stack.workers()[0].clone();
    assert!(stack.sim.stop_vm(&wid));
    stack.wait_state("Alert").await;

    // The workload needs 4 nodes: 2 Ready, so 2 pending.
    ca.set_needed_nodes(4);
    // Long enough for the unready time (2 s) and several backoffs.
    loop_for(&mut ca, Duration::from_millis(4000), 60).await;
    show("scenario 7 (worker down)", &ca);

    let reqs = stack.scale_requests();
    assert_eq!(
        reqs.len(),
        1,
        "only the first request reaches CloudStack: {reqs:?}"
    );
    assert_eq!(scale_keys(&reqs[0]), ["id", "size"]);
    let increases = ca.calls(Rpc::NodeGroupIncreaseSize);
    let first = increases[0].error().expect("refused");
    assert_eq!(first.code, Code::FailedPrecondition);
    assert!(
        first.message.contains("Alert state and can not be scaled"),
        "CloudStack's own text: {}",
        first.message
    );
    assert_refused_with_backoff(&ca, "does not scale clusters in Alert");
    assert!(
        (increases.len() as u64) * 2 < ca.loops_run(),
        "{}",
        ca.timeline()
    );

    // The NotReady worker's removal is refused locally too, never reaching CloudStack. The
    // autoscaler retries it at its own pace: at default flags a failed NodeGroupDeleteNodes
    // untaints the node and the next loop tries again (`core/static_autoscaler.go` sets
    // lastScaleDownFailTime only when StartDeletion itself fails), so each retry must stay a
    // local answer.
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert!(
        !deletes.is_empty(),
        "the unready worker was not even tried\n{}",
        ca.timeline()
    );
    for c in &deletes {
        let e = c.error().unwrap_or_else(|| panic!("accepted: {c}"));
        assert_eq!(e.code, Code::FailedPrecondition, "{c}");
        assert!(
            e.message.contains("without the Alert-scaling change")
                && e.message.contains("start the VM"),
            "{c}"
        );
        assert!(
            deleted_nodes(c)
                .iter()
                .any(|n| n.name == wname.to_lowercase() || n.provider_id.ends_with(&wid)),
            "{c}"
        );
    }
    assert!(
        deletes.len() > 1,
        "retried, as the real autoscaler does\n{}",
        ca.timeline()
    );
    assert_eq!(
        stack.scale_requests().len(),
        1,
        "no retry reached CloudStack"
    );
    for l in ca.timeline().loops() {
        assert!(l.aborted.is_none(), "{l}");
        assert_eq!(l.target(&stack.cluster_id), Some(3), "{l}");
    }

    // The operator starts the VM: the cluster returns to Running and scaling works again.
    assert!(stack.sim.start_vm(&wid));
    stack.wait_state("Running").await;
    loop_until(&mut ca, "a scale-up once Running", |ca| {
        ca.calls(Rpc::NodeGroupIncreaseSize)
            .iter()
            .any(|c| c.is_ok())
    })
    .await;
    loop_until(&mut ca, "4 Ready nodes", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 4)
    })
    .await;
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[1]["size"], "4");
    stack.wait_settled().await;
    assert_eq!(stack.cluster_size(), 4);
    stack.shutdown().await;
}

/// A size past CloudStack's `cloud.kubernetes.cluster.max.size` (it counts the control nodes)
/// is refused inside the scale job ("Maximum cluster size can not exceed N. Please contact
/// your administrator", as a CloudStack 4.21.0.0 answers it): the autoscaler hears the limit
/// named, and what to change, and nothing changed.
#[tokio::test(start_paused = true)]
async fn a_size_past_cloudstacks_cluster_size_limit_names_the_limit_and_its_fix() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    // The demo: 1 control node and 3 workers; CKS's maxsize 10 is the group's.
    cfg.settings.max_cluster_size = 5;
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    let e = env.increase(2).await.expect_err("6 nodes > 5");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    let said = e.message();
    for part in [
        "Maximum cluster size can not exceed 5. Please contact your administrator",
        "cloud.kubernetes.cluster.max.size is 5 for the cluster's account and counts the control nodes with the workers",
        "Lower the node group's MAX (--nodes MIN:MAX:CLUSTER)",
    ] {
        assert!(said.contains(part), "{part}: {said}");
    }
    assert_eq!(
        env.sim.cluster_json(&env.cluster_id)["size"],
        3,
        "nothing ran"
    );
    env.shutdown().await;
}
