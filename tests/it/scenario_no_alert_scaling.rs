//! Issue 39, differences 2 and 3, end to end against cks-sim as a 4.21.0.0 answers
//! (`alert_scaling` off: every request in Alert is refused "… in Alert state and can not be
//! scaled", and removing a Stopped worker fails in its drain, `recorded/alert_08`…`alert_09`,
//! `running_35`). The machine-level tests show the rules; these show what the autoscaler hears
//! and what reaches CloudStack.
//!
//! Each was checked against the wrong behaviour: with the domain's `DownWorkerNotRemovable`
//! refusal (`machine/queue.rs`) and `AlertUnsupported` refusal (`machine/increase.rs`) taken
//! out, the refusals below are OK answers and a `nodeids`/`size` request reaches the
//! simulator, and the held removal goes out again after its backoff.

use cks_autoscaler_provider::provider::AlertScalingMode;
use cks_sim::SimConfig;
use cks_testkit::stack::*;
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

/// A 4.21-like simulator (no Alert scaling) with scale jobs long enough to act during one.
fn without_alert_scaling(job: Duration) -> SimConfig {
    let mut c = sim_config();
    c.settings.alert_scaling = false;
    c.settings.job_duration = job;
    // The cluster stays listed Running with a VM down until a job fails (the status scanner
    // would otherwise move it to Alert within 20 ms).
    c.settings.scanner_interval = Duration::from_secs(24 * 3600);
    c
}

fn off(s: &mut cks_autoscaler_provider::provider::Settings) {
    s.alert_scaling = AlertScalingMode::Off;
}

/// Difference 2, `--alert-scaling off`: the removal of a Stopped worker is refused before any
/// promise, even while the cluster is still listed Running (the status scanner has not moved
/// it yet), and nothing is sent: neither the removal nor a stop.
#[tokio::test(start_paused = true)]
async fn with_alert_scaling_off_a_stopped_workers_removal_is_refused_before_any_promise() {
    let mut stack = Stack::refreshed(
        without_alert_scaling(Duration::from_millis(200)),
        "demo",
        off,
    )
    .await;
    let w = stack.workers()[0].clone();
    assert!(stack.sim.stop_vm(&w.0));
    stack.refresh().await.expect("refresh");
    assert_eq!(stack.cluster_state(), "Running", "before the scanner");
    let target = stack.target().await;
    stack.sim.reset_requests();

    let e = stack.delete(vec![worker_node(&w)]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains(&w.1),
        "the VM is named: {}",
        e.message()
    );
    assert!(
        e.message().contains("start the VM"),
        "the fix is named: {}",
        e.message()
    );
    assert!(stack.scale_requests().is_empty(), "no removal sent");
    assert!(
        stack
            .sim
            .requests()
            .iter()
            .all(|r| r.command != "stopVirtualMachine"),
        "no stop sent"
    );
    assert_eq!(stack.target().await, target, "nothing promised");

    // Once the operator starts the VM, the same removal is accepted and carried out.
    assert!(stack.sim.start_vm(&w.0));
    stack.refresh().await.expect("refresh");
    stack.delete(vec![worker_node(&w)]).await.expect("accepted");
    wait_until("the VM removed", || {
        let gone = !stack.workers().iter().any(|v| v.0 == w.0);
        async move { gone }
    })
    .await;
    stack.shutdown().await;
}

/// Difference 2, the verdict learned from CloudStack (`--alert-scaling auto`): the first
/// removal of a Stopped worker is promised (nothing is known yet), fails in its drain with a
/// text naming a Stopped VM, and teaches the provider that this CloudStack does not scale in
/// Alert. The owed removal is then held, said once at ERROR, not retried, not abandoned after
/// its 30 minutes of backoff; the next removal of a down worker and a scale-up of the
/// cluster, now in Alert, are refused at once (difference 3: never OK then a failed creation).
#[tokio::test(start_paused = true)]
async fn a_learned_verdict_holds_an_owed_removal_of_a_down_vm_and_refuses_what_would_fail() {
    logs::capture();
    let mut stack = Stack::refreshed(
        without_alert_scaling(Duration::from_millis(200)),
        "demo",
        |s| s.alert_recheck = Duration::from_secs(24 * 3600),
    )
    .await;
    let w = stack.workers()[0].clone();
    let w2 = stack.workers()[1].clone();
    assert!(stack.sim.stop_vm(&w.0));
    assert!(stack.sim.stop_vm(&w2.0));
    stack.refresh().await.expect("refresh");
    stack.sim.reset_requests();

    // Nothing known yet: the removal is promised and sent; CloudStack's drain fails.
    stack.delete(vec![worker_node(&w)]).await.expect("promised");
    wait_until("the drain failure seen", || {
        let state = stack.cluster_state();
        async move { state == "Alert" }
    })
    .await;
    stack.refresh().await.expect("refresh");
    wait_until("the held removal said", || async {
        logs::lines_mentioning(&w.0)
            .iter()
            .any(|l| l.contains("cannot be carried out by this CloudStack"))
    })
    .await;
    let sent = stack.scale_requests().len();
    assert_eq!(sent, 1, "{:?}", stack.scale_requests());

    // Difference 3: a scale-up of the Alert cluster is refused at once, not queued.
    let target = stack.target().await;
    let e = stack.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("does not scale clusters in Alert"),
        "{}",
        e.message()
    );
    // Difference 2: another down worker's removal is refused before any promise.
    let e = stack.delete(vec![worker_node(&w2)]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains(&w2.1), "{}", e.message());
    assert!(e.message().contains("start the VM"), "{}", e.message());

    // Half an hour of Refresh loops: the held removal is not sent again, not abandoned, and
    // said only once; the refused scale-up never shows up as a failed creation.
    for _ in 0..40 {
        elapse(Duration::from_secs(45)).await;
        stack.refresh().await.expect("refresh");
    }
    assert_eq!(stack.scale_requests().len(), sent, "held, not retried");
    let said: Vec<String> = logs::lines_mentioning(&w.0)
        .into_iter()
        .filter(|l| l.contains("cannot be carried out by this CloudStack"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:#?}");
    assert!(said[0].contains("ERROR"), "loudly: {}", said[0]);
    assert!(
        logs::lines_mentioning(&w.0)
            .iter()
            .all(|l| !l.contains("abandon")),
        "not abandoned"
    );
    assert_eq!(stack.target().await, target, "the promise holds");
    let instances = stack.instances().await;
    assert!(
        instances.iter().all(|i| i
            .status
            .as_ref()
            .and_then(|s| s.error_info.as_ref())
            .is_none_or(|e| !e.error_code.contains("creation"))),
        "no failed creation: {instances:?}"
    );
    stack.shutdown().await;
}
