//! End-to-end scenarios 4 and 6 (and 7 with 4): scale-ups failing for capacity, CloudStack
//! going away and coming back, and the provider restarting in the middle of a job. The
//! simulator's recorded requests show that no scale request is lost or sent twice.

use cks_lab::autoscaler::{Decision, FAKE_NODE_CREATE_ERROR, Rpc, fake_reason};
use cks_proto::instance_status::InstanceState;
use cks_sim::JobFailure;
use cks_testkit::stack::*;
use cks_testkit::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tonic::Code;

/// Scenario 4, the failure known only after IncreaseSize returned: instances reported as
/// failed with OutOfResources, deleted by the autoscaler, which backs off; the target returns
/// to what exists; once capacity is back, the scale-up goes through.
async fn capacity_failure_after_the_call(alert_scaling: bool) {
    let mut config = sim_config();
    config.settings.alert_scaling = alert_scaling;
    config.settings.job_failure = JobFailure::Capacity;
    // The simulator fails a capacity-starved job as soon as it is created. A 1 ms watch makes
    // IncreaseSize return before the provider first polls the job (its first poll is 100 ms
    // in), so the failure reaches the autoscaler through NodeGroupNodes, as a job failing
    // minutes in does on a real CloudStack.
    let stack = Stack::start(config, "demo", |s| s.scale_watch = Duration::from_millis(1)).await;
    // Timers / 600: backoff 0.5 s doubling, loops every 20 ms.
    let mut ca = stack.autoscaler(autoscaler_config(600, 20, WAIT)).await;
    ca.set_demand(2);

    loop_until(&mut ca, "the failed instances deleted", |ca| {
        ok_calls(ca, Rpc::NodeGroupDeleteNodes).iter().any(|c| {
            deleted_nodes(c)
                .iter()
                .any(|n| fake_reason(n) == Some(FAKE_NODE_CREATE_ERROR))
        })
    })
    .await;
    loop_until(&mut ca, "the target back to what exists", |ca| {
        ca.last_loop().is_some_and(|l| {
            l.target(&stack.cluster_id) == Some(3)
                && l.groups
                    .first()
                    .is_some_and(|g| g.instances.running == 3 && g.instances.errored == 0)
        })
    })
    .await;

    let first = &ca.calls(Rpc::NodeGroupIncreaseSize)[0];
    assert!(first.is_ok(), "accepted, the job fails later: {first}");
    assert_eq!(stack.cluster_size(), 3);
    assert_eq!(
        stack.cluster_state(),
        "Running",
        "a capacity failure leaves the cluster as it was"
    );

    // Capacity comes back: after its backoff the autoscaler scales up and the nodes arrive.
    // (On a slow machine a second scale-up may have been sent, and failed, before this.)
    stack.sim.configure(|s| s.job_failure = JobFailure::None);
    loop_until(&mut ca, "5 Ready nodes", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 5)
    })
    .await;
    stack.wait_settled().await;
    show("scenario 4", &ca);

    // Every accepted IncreaseSize but the last failed in CloudStack.
    let accepted = ok_calls(&ca, Rpc::NodeGroupIncreaseSize).len();
    let failed_ups = accepted - 1;
    assert!(failed_ups >= 1, "{}", ca.timeline());
    // The failed instances as the autoscaler saw them: Creating, OutOfResources.
    let mut failed_ids = BTreeSet::new();
    for (_, i) in all_instances_seen(&ca) {
        let Some(e) = error_info(&i) else { continue };
        assert_eq!(state_of(&i), InstanceState::InstanceCreating, "{i:?}");
        assert_eq!(e.instance_error_class, 1, "OutOfResources: {e:?}");
        assert_eq!(e.error_code, "out-of-resources");
        assert!(e.error_message.contains("insufficient capacity"), "{e:?}");
        failed_ids.insert(i.id.clone());
    }
    // Each failed scale-up showed its 2 requested instances as failed.
    assert_eq!(failed_ids.len(), 2 * failed_ups, "{failed_ids:?}");
    // The autoscaler backed off once per failure, with the instances' class, respected it,
    // and deleted exactly the failed instances with create-error fake nodes.
    let backoffs: Vec<_> = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter_map(|(_, d)| match d {
            Decision::BackOff {
                error_class,
                error_code,
                ..
            } => Some((*error_class, error_code.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(backoffs.len(), failed_ups, "{backoffs:?}");
    assert!(
        backoffs
            .iter()
            .all(|b| *b == (1, "out-of-resources".to_string())),
        "{backoffs:?}"
    );
    assert_backoffs_respected(&ca);
    let mut deleted = BTreeSet::new();
    for c in ca.calls(Rpc::NodeGroupDeleteNodes) {
        assert!(c.is_ok(), "{c}");
        for n in deleted_nodes(c) {
            assert_eq!(fake_reason(&n), Some(FAKE_NODE_CREATE_ERROR), "{c}");
            deleted.insert(n.provider_id.clone());
        }
    }
    assert_eq!(deleted, failed_ids);
    // One CloudStack request per accepted IncreaseSize, each size only; nothing for the
    // deletions (the failed instances never existed).
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), accepted, "{reqs:?}");
    for r in &reqs {
        assert_eq!(scale_keys(r), ["id", "size"]);
        assert_eq!(r["size"], "5");
    }
    assert_eq!(stack.cluster_size(), 5);
    let (target, instances) = stack.provider_view().await;
    assert_eq!(target, 5);
    assert!(
        instances.iter().all(|i| error_info(i).is_none()),
        "{instances:?}"
    );
    stack.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_capacity_failure_after_the_call_is_reported_deleted_and_backed_off() {
    capacity_failure_after_the_call(true).await;
}

/// Scenario 7 with scenario 4: the same on a CloudStack without the Alert change (the cluster
/// stays Running, so nothing differs).
#[tokio::test(start_paused = true)]
async fn without_alert_scaling_a_capacity_failure_is_handled_the_same_way() {
    capacity_failure_after_the_call(false).await;
}

/// Scenario 4, the failure seen while IncreaseSize still watches the new job: the call fails
/// with CloudStack's text, the autoscaler backs off, no failed instance is ever listed and the
/// target never moves.
#[tokio::test(start_paused = true)]
async fn a_capacity_failure_inside_the_watch_fails_increase_size_and_backs_off() {
    let mut config = sim_config();
    config.settings.job_failure = JobFailure::Capacity;
    // The default 1.5 s watch: the provider polls the job 100 ms in and finds it failed.
    let stack = Stack::start(config, "demo", |s| {
        s.scale_watch = Duration::from_millis(1500)
    })
    .await;
    let deadline = Duration::from_secs(5);
    let mut ca = stack.autoscaler(autoscaler_config(600, 20, deadline)).await;
    ca.set_demand(2);
    loop_for(&mut ca, Duration::from_millis(3000), 40).await;

    let increases = ca.calls(Rpc::NodeGroupIncreaseSize);
    assert!(!increases.is_empty());
    for c in &increases {
        let e = c.error().unwrap_or_else(|| panic!("accepted: {c}"));
        assert_eq!(e.code, Code::FailedPrecondition, "{c}");
        assert!(e.message.contains("insufficient capacity"), "{c}");
        assert!(c.latency < deadline / 2, "{c}");
    }
    let backoffs = assert_backoffs_respected(&ca);
    assert_eq!(backoffs.len(), increases.len(), "{}", ca.timeline());
    assert!(
        (increases.len() as u64) * 2 < ca.loops_run(),
        "{} scale-ups in {} loops",
        increases.len(),
        ca.loops_run()
    );
    // Each refused call reached CloudStack once; none was repeated behind the autoscaler's back.
    assert_eq!(stack.scale_requests().len(), increases.len());
    for (_, i) in all_instances_seen(&ca) {
        assert!(
            error_info(&i).is_none(),
            "no failed instance to clean up: {i:?}"
        );
    }
    for l in ca.timeline().loops() {
        assert_eq!(l.target(&stack.cluster_id), Some(3), "{l}");
    }
    assert_eq!(ca.calls(Rpc::NodeGroupDeleteNodes).len(), 0);
    assert_eq!(stack.cluster_size(), 3);
    show("scenario 4 (inside the watch)", &ca);
    stack.shutdown().await;
}

/// Scenario 6: CloudStack answers only 5xx pages while a scale job runs, long enough for the
/// provider's snapshot to go stale, then comes back. Nothing is sent twice or lost; the
/// target is right afterwards.
#[tokio::test(start_paused = true)]
async fn cloudstack_going_away_mid_job_loses_and_repeats_nothing() {
    let mut config = sim_config();
    config.settings.job_duration = Duration::from_millis(1000);
    let stack = Stack::start(config, "demo", |s| {
        s.staleness_bound = Duration::from_millis(300)
    })
    .await;
    // Timers / 100: the provision time (9 s) outlasts the outage and the job.
    let mut ca = stack.autoscaler(autoscaler_config(100, 30, WAIT)).await;
    ca.set_demand(2);
    let up = ca.run_once().await;
    assert_eq!(up.count(Rpc::NodeGroupIncreaseSize), 1, "{up}");
    assert!(ca.errors().is_empty(), "{}", ca.timeline());
    assert_eq!(stack.sim.running_jobs(&stack.cluster_id), 1);

    stack.sim.configure(|s| s.error_rate = 1.0);
    let outage_from = ca.loops_run() + 1;
    // Outage longer than the job and the staleness bound.
    loop_for(&mut ca, Duration::from_millis(1500), 10).await;
    let outage_to = ca.loops_run();
    stack.sim.configure(|s| s.error_rate = 0.0);
    assert_eq!(
        stack.sim.running_jobs(&stack.cluster_id),
        0,
        "the job ended during the outage"
    );

    loop_until(&mut ca, "5 Ready nodes after the outage", |ca| {
        ca.last_loop()
            .is_some_and(|l| l.ready == 5 && l.aborted.is_none())
    })
    .await;
    stack.wait_settled().await;
    ca.run_loops(5).await;
    show("scenario 6 (outage)", &ca);

    // During the outage the provider said so, and the autoscaler decided nothing.
    let outage: Vec<_> =
        ca.timeline().loops()[(outage_from - 1) as usize..outage_to as usize].to_vec();
    assert!(
        outage.iter().any(|l| l
            .aborted
            .as_deref()
            .is_some_and(|r| r.contains("Refresh failed") && r.contains("Unavailable"))),
        "{}",
        ca.timeline()
    );
    for l in &outage {
        for rpc in [
            Rpc::NodeGroupIncreaseSize,
            Rpc::NodeGroupDeleteNodes,
            Rpc::NodeGroupDecreaseTargetSize,
        ] {
            assert_eq!(l.count(rpc), 0, "{l}");
        }
    }
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "one scale request, not repeated: {reqs:?}");
    assert_eq!(reqs[0]["size"], "5");
    assert_eq!(ca.calls(Rpc::NodeGroupIncreaseSize).len(), 1);
    assert_eq!(stack.cluster_size(), 5);
    let last = ca.last_loop().expect("a loop");
    assert_eq!(last.target(&stack.cluster_id), Some(5), "{last}");
    // The job's follower polled with growing pauses during the outage; it catches up.
    stack.wait_provider_settled().await;
    let (target, instances) = stack.provider_view().await;
    assert_eq!(target, 5);
    assert_eq!(instances.len(), 5);
    assert!(
        instances
            .iter()
            .all(|i| state_of(i) == InstanceState::InstanceRunning && error_info(i).is_none()),
        "{instances:#?}\n{}",
        ca.timeline()
    );
    stack.shutdown().await;
}

/// Scenario 6: the connection drops after CloudStack ran the scale request, so the provider
/// never learns it was accepted. IncreaseSize fails, the autoscaler backs off; the provider
/// finds the running job on its next refresh, shows it in the target and follows it. With the
/// autoscaler's backoff longer than the job (5 min against a CKS scale-up of a few minutes in
/// production; here 3 s against 1 s), nothing is sent twice.
#[tokio::test(start_paused = true)]
async fn a_scale_request_whose_answer_is_lost_is_adopted_not_repeated() {
    let mut config = sim_config();
    config.settings.job_duration = Duration::from_millis(1000);
    let stack = Stack::start(config, "demo", |_| {}).await;
    let mut ca = stack.autoscaler(autoscaler_config(100, 30, WAIT)).await;
    assert_eq!(ca.run_once().await.ready, 3);

    stack.sim.configure(|s| s.drop_rate = 1.0);
    ca.set_demand(2);
    let lost = ca.run_once().await;
    stack.sim.configure(|s| s.drop_rate = 0.0);
    let inc = ca.calls(Rpc::NodeGroupIncreaseSize);
    assert_eq!(inc.len(), 1, "{lost}");
    assert_eq!(
        inc[0].error().map(|e| e.code),
        Some(Code::Unavailable),
        "{}",
        inc[0]
    );
    assert_eq!(stack.scale_requests().len(), 1, "CloudStack ran it");

    loop_until(&mut ca, "the adopted job's target", |ca| {
        ca.last_loop()
            .is_some_and(|l| l.target(&stack.cluster_id) == Some(5))
    })
    .await;
    loop_until(&mut ca, "5 Ready nodes", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 5)
    })
    .await;
    stack.wait_settled().await;
    // Past the backoff: the pods found room, nothing more is asked.
    loop_for(&mut ca, Duration::from_millis(3500), 10).await;
    show("scenario 6 (lost answer)", &ca);
    assert_eq!(
        ca.calls(Rpc::NodeGroupIncreaseSize).len(),
        1,
        "{}",
        ca.timeline()
    );
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(stack.cluster_size(), 5);
    let (target, instances) = stack.provider_view().await;
    assert_eq!((target, instances.len()), (5, 5));
    stack.shutdown().await;
}

/// Scenario 6: the provider restarts while its scale job runs; the autoscaler keeps running
/// and reconnects to the new process at the same address. The new provider adopts the job:
/// the target stays at the requested size, nothing is sent again.
#[tokio::test(start_paused = true)]
async fn a_provider_restart_mid_job_at_the_same_address_loses_and_repeats_nothing() {
    let mut config = sim_config();
    // Long enough for a restart on a loaded machine; the test waits for its end.
    config.settings.job_duration = Duration::from_secs(4);
    let mut stack = Stack::start(config, "demo", |_| {}).await;
    let mut ca = stack.autoscaler(autoscaler_config(100, 30, WAIT)).await;
    ca.set_demand(2);
    let up = ca.run_once().await;
    assert_eq!(up.count(Rpc::NodeGroupIncreaseSize), 1, "{up}");
    assert_eq!(ca.last_target(&stack.cluster_id), Some(5));

    let port = stack.addr.port();
    stack.stop_provider().await;
    // A loop while the provider is down fails and decides nothing.
    let down = ca.run_once().await;
    assert!(down.aborted.is_some(), "{down}");
    stack
        .start_new_provider(fast_settings(&stack.cluster_id, 1, 10), port)
        .await;
    assert_eq!(stack.addr.port(), port);
    stack.assert_adopts_running_job(5).await;

    let after = ca.run_once().await;
    assert!(after.aborted.is_none(), "{after}");
    assert_eq!(after.target(&stack.cluster_id), Some(5), "{after}");
    loop_until(&mut ca, "5 Ready nodes", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 5)
    })
    .await;
    stack.wait_settled().await;
    ca.run_loops(5).await;
    show("scenario 6 (restart, same address)", &ca);
    assert_eq!(
        ca.calls(Rpc::NodeGroupIncreaseSize).len(),
        1,
        "{}",
        ca.timeline()
    );
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(stack.cluster_size(), 5);
    for l in ca
        .timeline()
        .loops()
        .iter()
        .filter(|l| l.aborted.is_none())
        .skip(1)
    {
        assert_eq!(l.target(&stack.cluster_id), Some(5), "{l}");
    }
    let (target, instances) = stack.provider_view().await;
    assert_eq!((target, instances.len()), (5, 5));
    stack.shutdown().await;
}

/// Scenario 6: the provider restarts while its scale job runs and comes back on another port
/// with a fresh autoscaler (no memory of the scale-up, no new demand). The job is adopted, the
/// target is the requested size all along, nothing is sent again, and the new autoscaler sees
/// the new nodes register without deleting or resizing anything.
#[tokio::test(start_paused = true)]
async fn a_provider_restart_mid_job_on_a_new_port_adopts_the_job() {
    let mut config = sim_config();
    // Long enough for a restart on a loaded machine; the test waits for its end.
    config.settings.job_duration = Duration::from_secs(4);
    let mut stack = Stack::start(config, "demo", |_| {}).await;
    let mut ca = stack.autoscaler(autoscaler_config(100, 30, WAIT)).await;
    ca.set_demand(2);
    let up = ca.run_once().await;
    assert_eq!(up.count(Rpc::NodeGroupIncreaseSize), 1, "{up}");

    let old_port = stack.addr.port();
    stack.stop_provider().await;
    stack
        .start_new_provider(fast_settings(&stack.cluster_id, 1, 10), 0)
        .await;
    assert_ne!(stack.addr.port(), old_port);
    stack.assert_adopts_running_job(5).await;
    let mut ca2 = stack.autoscaler(autoscaler_config(100, 30, WAIT)).await;
    let first = ca2.run_once().await;
    assert_eq!(first.target(&stack.cluster_id), Some(5), "{first}");

    loop_until(&mut ca2, "5 Ready nodes", |ca| {
        ca.last_loop().is_some_and(|l| l.ready == 5)
    })
    .await;
    stack.wait_settled().await;
    ca2.run_loops(5).await;
    show("scenario 6 (restart, new port)", &ca2);
    for l in ca2.timeline().loops() {
        assert_eq!(l.target(&stack.cluster_id), Some(5), "{l}");
    }
    for rpc in [
        Rpc::NodeGroupIncreaseSize,
        Rpc::NodeGroupDeleteNodes,
        Rpc::NodeGroupDecreaseTargetSize,
    ] {
        assert!(ca2.calls(rpc).is_empty(), "{}", ca2.timeline());
    }
    assert!(ca2.errors().is_empty(), "{}", ca2.timeline());
    let reqs = stack.scale_requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(stack.cluster_size(), 5);
    let (target, instances) = stack.provider_view().await;
    assert_eq!((target, instances.len()), (5, 5));
    stack.shutdown().await;
}
