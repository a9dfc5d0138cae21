//! End to end: a scale-up CloudStack fails part way (issue 28, point 9). One new VM runs and its
//! node registers, the other ends in Error; CloudStack keeps both, leaves the size as it was and
//! the cluster in Alert, and refuses every later request while its VMs and nodes differ (Alert
//! rule 5). The provider names the stranded cluster (the gauge `cks_provider_cluster_blocked`,
//! one ERROR line, refusals naming the rule and the VMs), never reports the VM whose node
//! registered as a failed creation, and answers so that the mock autoscaler's loop (upstream
//! 1.33's RunOnce) is never aborted: `deleteCreatedNodesWithErrors` is refused (only logged
//! upstream), and `fixNodeGroupSize`'s DecreaseTargetSize writes off the failed creation that
//! will never be a node.

use cks_autoscaler_provider::app::ProviderMetrics;
use cks_lab::autoscaler::{FAKE_NODE_CREATE_ERROR, Rpc, fake_reason};
use cks_proto::instance_status::InstanceState;
use cks_sim::{JobFailure, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

/// The value of one series (name and labels exactly as rendered) on a metrics page.
fn series(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `/metrics` of the provider, served by the production gauge source.
async fn scrape(stack: &Stack) -> String {
    scrape_metrics(Arc::new(ProviderMetrics(stack.provider.clone()))).await
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_cloudstack_fails_part_way_is_named_and_never_stops_the_autoscaler() {
    logs::capture();
    let mut config = sim_config();
    config.settings.job_failure = JobFailure::Partial;
    // VM names of their own, so the log lines looked for are this test's.
    config.seed = 28;
    let stack = Stack::start(config, "demo", |_| {}).await;
    let before: BTreeSet<String> = stack.workers().into_iter().map(|w| w.0).collect();
    // Timers / 600: max-node-provision-time 1.5 s, backoff 0.5 s; loops every 20 ms.
    let mut ca = stack.autoscaler(autoscaler_config(600, 20, WAIT)).await;
    assert_eq!(ca.run_once().await.ready, 3);
    ca.set_demand(2);

    // CloudStack fails the scale-up part way: the cluster keeps both new VMs, its size stays 3.
    loop_until(&mut ca, "the scale-up to fail part way", |_| {
        stack.cluster_state() == "Alert" && stack.sim.running_jobs(&stack.cluster_id) == 0
    })
    .await;
    let failed_from = ca.loops_run();
    let new: Vec<(String, String, VmState)> = stack
        .workers()
        .into_iter()
        .filter(|w| !before.contains(&w.0))
        .collect();
    assert_eq!(new.len(), 2, "{new:?}");
    let running = new
        .iter()
        .find(|w| w.2 == VmState::Running)
        .cloned()
        .expect("one new VM runs");
    let broken = new
        .iter()
        .find(|w| w.2 == VmState::Error)
        .cloned()
        .expect("one new VM in Error");
    let instance = |id: &str| format!("external-cloudstack://{id}");
    assert_eq!((stack.workers().len(), stack.cluster_size()), (5, 3));

    // The autoscaler deletes the failed creations, is refused, and after its provision time
    // gives up on the one that never registers: the provider writes it off.
    loop_until(&mut ca, "the failed creation written off", |ca| {
        last_instances(ca).iter().any(|i| {
            i.id == instance(&broken.0)
                && error_info(i).is_some_and(|e| e.error_code == "creation-written-off")
        })
    })
    .await;
    let written_off_at = ca.loops_run();
    // And the loop goes on: well past the provision time and several backoffs.
    loop_for(&mut ca, Duration::from_secs(4), 100).await;
    show("stranded by a scale-up failed part way", &ca);

    // The loop was never aborted, and it kept deciding after the write-off.
    for l in ca.timeline().loops() {
        assert!(l.aborted.is_none(), "{l}\n{}", ca.timeline());
    }
    assert!(ca.loops_run() >= written_off_at + 100);

    // fixNodeGroupSize's DecreaseTargetSize was answered OK (it writes off), never refused.
    let decreases = ca.calls(Rpc::NodeGroupDecreaseTargetSize);
    assert!(!decreases.is_empty(), "{}", ca.timeline());
    for c in &decreases {
        assert!(c.is_ok(), "{c}");
    }
    let first_write_off = decreases[0].loop_no;

    // The failed creations were deleted with fake nodes and refused, for the real reason: the
    // VM count, naming the VMs left behind; never the group's minimum. Once written off, an
    // instance is Deleting: a deletion of it from the autoscaler's cached list has nothing left
    // to do (OK).
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert!(!deletes.is_empty(), "{}", ca.timeline());
    let mut refused = 0;
    for c in &deletes {
        for n in deleted_nodes(c) {
            assert_eq!(fake_reason(&n), Some(FAKE_NODE_CREATE_ERROR), "{c}");
        }
        if c.is_ok() {
            assert!(c.loop_no >= first_write_off, "{c}");
            for n in deleted_nodes(c) {
                assert_eq!(n.provider_id, instance(&broken.0), "{c}");
            }
            continue;
        }
        refused += 1;
        let e = c.error().unwrap_or_else(|| panic!("accepted: {c}"));
        assert_eq!(e.code, Code::FailedPrecondition, "{c}");
        for part in ["CKS Alert rule 5", broken.1.as_str(), "failed scale-up"] {
            assert!(e.message.contains(part), "{part:?} not named: {c}");
        }
        assert!(!e.message.contains("minimum size"), "{c}");
    }
    assert!(refused > 0, "{}", ca.timeline());
    // Once its node registered, the Running VM is no failed creation: the deletions after
    // the first ones name only the VM in Error.
    let last = deletes.last().expect("a deletion");
    let named: Vec<String> = deleted_nodes(last)
        .iter()
        .map(|n| n.provider_id.clone())
        .collect();
    assert_eq!(named, [instance(&broken.0)], "{last}");

    // Scale-ups tried after the failure are refused for the same rule, and backed off.
    for c in ca
        .calls(Rpc::NodeGroupIncreaseSize)
        .into_iter()
        .filter(|c| c.loop_no > failed_from)
    {
        let e = c.error().unwrap_or_else(|| panic!("accepted: {c}"));
        assert!(e.message.contains("CKS Alert rule 5"), "{c}");
    }
    assert_backoffs_respected(&ca);

    // What the autoscaler is told now: the VM whose node is Ready is a Running instance with
    // no error, the one in Error is written off (Deleting, out of the target).
    let instances = last_instances(&ca);
    let of = |id: &str| {
        instances
            .iter()
            .find(|i| i.id == instance(id))
            .unwrap_or_else(|| panic!("{id} listed: {instances:?}"))
    };
    assert_eq!(state_of(of(&running.0)), InstanceState::InstanceRunning);
    assert!(error_info(of(&running.0)).is_none(), "{:?}", of(&running.0));
    assert_eq!(state_of(of(&broken.0)), InstanceState::InstanceDeleting);
    let message = &error_info(of(&broken.0)).expect("an error").error_message;
    assert!(
        message.contains(&broken.1) && message.contains("§7.2"),
        "{message}"
    );
    let last_loop = ca.last_loop().expect("a loop");
    assert_eq!(last_loop.target(&stack.cluster_id), Some(4), "{last_loop}");
    // Never a failed creation once its node is Ready (the autoscaler sees 4 Ready nodes).
    let loops = ca.timeline().loops();
    let ready_from = loops
        .iter()
        .find(|l| l.ready == 4)
        .map(|l| l.loop_no)
        .expect("the new node Ready");
    for (l, i) in all_instances_seen(&ca) {
        if l >= ready_from && i.id == instance(&running.0) {
            assert!(error_info(&i).is_none(), "loop {l}: {i:?}");
        }
    }

    // Nothing more reached CloudStack, and nothing was stopped: the VM with a Ready node runs.
    assert_eq!(
        stack.scale_requests().len(),
        1,
        "{:?}",
        stack.scale_requests()
    );
    assert!(
        !stack
            .sim
            .requests()
            .iter()
            // The provider's question at start (may its key stop VMs?) names no VM.
            .any(|r| r.command == "stopVirtualMachine"
                && r.params.get("id").map(String::as_str)
                    != Some("00000000-0000-4000-8000-000000000000")),
        "a VM was stopped"
    );
    assert!(
        stack
            .workers()
            .iter()
            .any(|w| w.0 == running.0 && w.2 == VmState::Running)
    );

    // The operator is told: the gauge, one ERROR line naming the VMs and the fix.
    let blocked = stack
        .provider
        .all_groups()
        .cluster_blocked(&stack.cluster_id)
        .expect("stranded");
    assert_eq!(blocked.rule.as_str(), "alert_rule_5_vm_count_mismatch");
    let page = scrape(&stack).await;
    let gauge = |rule: &str| {
        series(
            &page,
            &format!(
                r#"cks_provider_cluster_blocked{{node_group="{}",rule="{rule}"}}"#,
                stack.cluster_id
            ),
        )
    };
    assert_eq!(gauge("alert_rule_5_vm_count_mismatch"), Some(1.0), "{page}");
    assert_eq!(gauge("alert_rule_7_no_down_worker"), Some(0.0), "{page}");
    let said: Vec<String> = logs::lines_mentioning("CloudStack has stranded the cluster")
        .into_iter()
        .filter(|l| l.contains(&broken.1))
        .collect();
    assert_eq!(said.len(), 1, "one line, not one per refresh: {said:#?}");
    for part in [
        "ERROR",
        "alert_rule_5_vm_count_mismatch",
        running.1.as_str(),
        "§7.2",
    ] {
        assert!(said[0].contains(part), "{part:?} not in {}", said[0]);
    }
    stack.shutdown().await;
}
