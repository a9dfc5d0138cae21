//! Issue 39, point 6: what the scale worker's source shows and the recordings cannot.
//! - apache/cloudstack#11994: a size-only request on a KVM cluster whose control node runs
//!   another offering than the cluster's fails in its job; the provider cannot see that in
//!   the listing, so it learns it from the first failure and refuses later size requests
//!   before any promise (FAILED_PRECONDITION naming the issue and the fix).
//! - A stored version of `KubernetesClusterScaleWorker.scaleCluster` ends a size job
//!   successfully with nothing changed: the provider checks the size listed after the job and
//!   reports the VMs it asked for as failed creations instead of waiting for them.

use cks_sim::SimConfig;
use cks_testkit::stack::*;
use cks_testkit::*;
use tonic::Code;

fn failed_creations(instances: &[cks_proto::Instance]) -> Vec<String> {
    instances
        .iter()
        .filter_map(|i| i.status.as_ref()?.error_info.as_ref())
        .map(|e| format!("{}: {}", e.error_code, e.error_message))
        .collect()
}

/// The failed creations the provider reports, refreshing until it reports some (a bounded
/// wait: 10 s of paused time).
async fn failed_creations_seen(stack: &mut Stack) -> Vec<String> {
    for _ in 0..200 {
        stack.refresh().await.expect("refresh");
        let f = failed_creations(&stack.instances().await);
        if !f.is_empty() {
            return f;
        }
        elapse(std::time::Duration::from_millis(50)).await;
    }
    panic!("no failed creation reported: {:?}", stack.instances().await);
}

#[tokio::test(start_paused = true)]
async fn a_size_request_failing_on_kvm_offerings_is_refused_before_any_promise_after_the_first() {
    let mut cfg: SimConfig = sim_config();
    cfg.settings.size_default_offering = true;
    cfg.scenario.hypervisor = "KVM".into();
    cfg.scenario.clusters[0].control_offering = Some("cks-large".into());
    let mut stack = Stack::refreshed(cfg, "demo", |_| {}).await;

    // The first one cannot be told apart: it is sent, and its job fails at once (the check
    // runs in the job); the caller, still waiting, hears CloudStack's text.
    let e = stack.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message()
            .contains("running VMs on hypervisor KVM is not supported"),
        "CloudStack's text: {}",
        e.message()
    );
    assert_eq!(stack.cluster_size(), 3, "nothing changed");

    // From then on: refused at once, nothing sent.
    let e = stack.increase(1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("apache/cloudstack#11994")
            && e.message().contains("cluster's service offering"),
        "{}",
        e.message()
    );
    assert_eq!(
        stack.scale_requests().len(),
        1,
        "{:?}",
        stack.scale_requests()
    );
    for r in stack.scale_requests() {
        assert_eq!(scale_keys(&r), ["id", "size"], "only id and size are sent");
    }
    stack.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_size_job_that_succeeds_without_changing_the_size_is_reported_as_failed_creations() {
    logs::capture();
    let mut cfg = sim_config();
    cfg.settings.size_job_returns_early = true;
    let mut stack = Stack::refreshed(cfg, "demo", |_| {}).await;
    stack.increase(2).await.expect("promised");
    let failed = failed_creations_seen(&mut stack).await;
    assert_eq!(failed.len(), 2, "{failed:?}");
    for f in &failed {
        assert!(f.contains("lists size 3, not 5"), "{f}");
    }
    assert_eq!(stack.cluster_size(), 3);
    assert_eq!(stack.cluster_state(), "Running");
    let said = logs::lines_mentioning("lists size 3, not 5");
    assert!(
        said.iter()
            .any(|l| l.contains("ERROR") && l.contains(&stack.cluster_id)
                || l.contains("ERROR") && l.contains("demo")),
        "{said:#?}"
    );
    // The job is over and nothing is left in flight: a later request goes out.
    stack.sim.configure(|s| s.size_job_returns_early = false);
    stack.sim.reset_requests();
    stack.increase(1).await.expect("accepted");
    wait_until("the size reached", || {
        let size = stack.cluster_size();
        async move { size == 4 }
    })
    .await;
    stack.shutdown().await;
}
