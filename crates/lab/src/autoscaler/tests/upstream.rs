//! The points where the mock follows the real cluster-autoscaler closely because a provider
//! depends on them: per-node concurrent scale-down deletions and what a failure does, the
//! NodeGroupNodes cache, the create-error backoff, the size fix and the scale-up timeout,
//! NodeGroupGetOptions, GPULabel and Cleanup. Each test drives the scripted provider of
//! `tests.rs` on paused time.

use super::*;

/// Options as the provider answers them: each duration given in both of its fields
/// (google.protobuf.Duration 8-10 and meta.v1.Duration 3-5), each one not given in neither.
pub(super) fn group_options(
    unneeded: Option<Duration>,
    unready: Option<Duration>,
    provision: Option<Duration>,
) -> pb::NodeGroupAutoscalingOptions {
    let d = |d: Duration| prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap(),
        nanos: i32::try_from(d.subsec_nanos()).unwrap(),
    };
    let meta = |d: Duration| k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
        duration: Some(i64::try_from(d.as_nanos()).unwrap()),
    };
    pb::NodeGroupAutoscalingOptions {
        scale_down_unneeded_duration: unneeded.map(d),
        scale_down_unready_duration: unready.map(d),
        max_node_provision_duration: provision.map(d),
        scale_down_unneeded_time: unneeded.map(meta),
        scale_down_unready_time: unready.map(meta),
        max_node_provision_time: provision.map(meta),
        ..Default::default()
    }
}

/// The flags of [`config`] as options, in the fields of every release.
pub(super) fn flag_options() -> pb::NodeGroupAutoscalingOptions {
    let c = config();
    group_options(
        Some(c.scale_down_unneeded_time),
        Some(c.scale_down_unready_time),
        Some(c.max_node_provision_time),
    )
}

/// [`group_options`] as a provider that knows only the 1.35 shape answers them (fields 8-10).
fn new_fields_only(options: pb::NodeGroupAutoscalingOptions) -> pb::NodeGroupAutoscalingOptions {
    pb::NodeGroupAutoscalingOptions {
        scale_down_unneeded_time: None,
        scale_down_unready_time: None,
        max_node_provision_time: None,
        ..options
    }
}

/// Server-side (start, end) of every call of `rpc`, in arrival order.
fn spans(fake: &FakeProvider, rpc: &str) -> Vec<(Instant, Instant)> {
    fake.edit(|s| {
        s.log
            .iter()
            .filter(|c| c.rpc == rpc)
            .map(|c| (c.started, c.ended))
            .collect()
    })
}

fn overlap(a: (Instant, Instant), b: (Instant, Instant)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn sent_names(call: &Call) -> Vec<String> {
    match &call.request {
        Request::NodeGroupDeleteNodes { nodes, .. } => {
            nodes.iter().map(|n| n.name.clone()).collect()
        }
        _ => Vec::new(),
    }
}

fn background_calls(ca: &MockAutoscaler, rpc: Rpc) -> Vec<&Call> {
    ca.timeline()
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::BackgroundCall(c) if c.rpc() == rpc => Some(c),
            _ => None,
        })
        .collect()
}

fn workers(n: usize) -> (Vec<pb::Instance>, Vec<KubeNode>) {
    let names: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
    (
        names.iter().map(|n| running(&pid(n))).collect(),
        names.iter().map(|n| worker(n)).collect(),
    )
}

/// `actuator.go` `deleteNodesAsync` + `delete_in_batch.go` with the batcher interval at 0:
/// one NodeGroupDeleteNodes per node, each from its own task, all at once, each after the
/// group's NodeGroupGetOptions (`scheduleDeletion`); the loop that starts them does not wait.
#[tokio::test(start_paused = true)]
async fn scale_down_sends_one_delete_nodes_call_per_node_concurrently() {
    let (instances, list) = workers(4);
    let fake = FakeProvider::with_group(1, 5, 4, instances);
    fake.edit(|s| {
        s.delays
            .insert("NodeGroupDeleteNodes", Duration::from_millis(400));
    });
    let nodes = StaticNodeSource::new(
        list.into_iter()
            .map(|n| n.with_annotation("note", "kept"))
            .collect(),
    );
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(1);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    let starter = ca.last_loop().unwrap().clone();
    assert_eq!(ca.deletions_in_progress(), 3, "{starter}");
    assert!(
        starter.duration < Duration::from_millis(400),
        "the loop waited for the deletions: {starter}"
    );
    assert!(starter.decisions.iter().any(
        |d| matches!(d, Decision::ScaleDown { group, nodes } if group == G && nodes.len() == 3)
    ));

    ca.settle_deletions().await;
    assert_eq!(ca.deletions_in_progress(), 0);
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert_eq!(deletes.len(), 3, "{}", ca.timeline());
    let mut names: Vec<String> = deletes.iter().flat_map(|c| sent_names(c)).collect();
    names.sort();
    assert_eq!(names, ["w2", "w3", "w4"]);
    for c in &deletes {
        assert!(c.is_ok(), "{c}");
        assert_eq!(sent_names(c).len(), 1, "one node per call: {c}");
        assert_eq!(c.loop_no, starter.loop_no);
        assert!(c.at >= starter.at + ca.config().node_delete_delay_after_taint);
        let Request::NodeGroupDeleteNodes { nodes, .. } = &c.request else {
            unreachable!()
        };
        assert_eq!(nodes[0].provider_id, pid(&nodes[0].name));
        assert_eq!(
            nodes[0].annotations.get("note").map(String::as_str),
            Some("kept")
        );
        assert_eq!(
            nodes[0].labels.get("role").map(String::as_str),
            Some("worker")
        );
    }
    let s = spans(&fake, "NodeGroupDeleteNodes");
    assert!(
        s.iter()
            .all(|a| s.iter().filter(|b| overlap(*a, **b)).count() == 3),
        "the three calls did not all run at once: {s:?}"
    );
    // Each deletion asked for the group's options first, in the background.
    assert_eq!(background_calls(&ca, Rpc::NodeGroupGetOptions).len(), 3);
    assert_eq!(fake.target(), 1);
}

/// `delete_in_batch.go` `AddNodes` with `--node-deletion-batcher-interval` set: the nodes of a
/// group that arrive within the interval go in one call.
#[tokio::test(start_paused = true)]
async fn with_a_batcher_interval_the_nodes_of_a_group_go_in_one_call() {
    let (instances, list) = workers(4);
    let fake = FakeProvider::with_group(1, 5, 4, instances);
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.node_deletion_batcher_interval = Duration::from_millis(100);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(1);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    let starter = ca.last_loop().unwrap().at;
    ca.settle_deletions().await;
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert_eq!(deletes.len(), 1, "{}", ca.timeline());
    assert_eq!(sent_names(deletes[0]).len(), 3);
    assert!(deletes[0].at >= starter + Duration::from_millis(100));
    assert_eq!(fake.target(), 1);
}

/// A failed NodeGroupDeleteNodes untaints the node (`CleanUpAndRecordFailedScaleDownEvent`).
/// With the default global delays nothing holds scale-down back (`lastScaleDownFailTime` is
/// set only when the loop's own `StartDeletion` fails): the node is still unneeded since
/// before, so the next loop deletes it again.
#[tokio::test(start_paused = true)]
async fn a_failed_deletion_untaints_the_node_and_the_next_loop_tries_again() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    fake.edit(|s| s.delete_error = Some(Status::failed_precondition("a scale job is running")));
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    // Would hold scale-down back with per-group delays; the default does not use it.
    cfg.scale_down_delay_after_failure = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(2);
    ca.run_until(WAIT, |ca| ca.calls(Rpc::NodeGroupDeleteNodes).len() >= 3)
        .await
        .unwrap();

    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    for c in &deletes {
        let e = c.error().unwrap_or_else(|| panic!("accepted: {c}"));
        assert_eq!(e.code, tonic::Code::FailedPrecondition);
        assert_eq!(
            sent_names(c),
            sent_names(deletes[0]),
            "the same node each time"
        );
    }
    // One try per loop, the loop right after the failure.
    for pair in deletes.windows(2) {
        assert_eq!(pair[1].loop_no, pair[0].loop_no + 1, "{}", ca.timeline());
    }
    let failures = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter(|(_, d)| {
            matches!(d, Decision::ScaleDownFailed { error, .. } if error.contains("a scale job is running"))
        })
        .count();
    assert!(failures >= 2, "{}", ca.timeline());
    // Untainted when the failure was collected: not counted as being deleted.
    let collector = ca.timeline().loops()[usize::try_from(deletes[1].loop_no).unwrap() - 1].clone();
    assert_eq!(collector.groups[0].being_deleted, 0, "{collector}");
    // Its unneeded time was never restarted.
    let unneeded = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter(|(_, d)| matches!(d, Decision::NodeUnneeded { .. }))
        .count();
    assert_eq!(unneeded, 1, "{}", ca.timeline());
    assert_eq!(fake.target(), 3);
    assert_eq!(fake.edit(|s| s.deleted_refused.len()), deletes.len());
}

/// With `--scale-down-delay-type-local` a failed NodeGroupDeleteNodes keeps the group's nodes
/// out of scale-down for the delay after failure (`ScaleDownCandidatesDelayProcessor`).
#[tokio::test(start_paused = true)]
async fn with_local_delays_a_failed_deletion_holds_the_group_back_for_the_delay_after_failure() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    fake.edit(|s| s.delete_error = Some(Status::failed_precondition("a scale job is running")));
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.scale_down_delay_type_local = true;
    cfg.scale_down_delay_after_failure = Duration::from_millis(500);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(2);
    ca.run_until(WAIT, |ca| ca.calls(Rpc::NodeGroupDeleteNodes).len() >= 2)
        .await
        .unwrap();
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    let failed_at = deletes[0].at + deletes[0].latency;
    assert!(
        deletes[1].at >= failed_at + Duration::from_millis(500),
        "retried {:?} after the failure\n{}",
        deletes[1].at - failed_at,
        ca.timeline()
    );
    assert!(ca.loops_run() > deletes[1].loop_no - deletes[0].loop_no);
}

/// `budgets.go` `CropNodes`: nodes to drain are deleted within `--max-drain-parallelism` (1):
/// one at a time, the next once the previous deletion ended.
#[tokio::test(start_paused = true)]
async fn drained_nodes_are_deleted_one_at_a_time() {
    let (instances, list) = workers(4);
    let fake = FakeProvider::with_group(1, 5, 4, instances);
    let nodes = StaticNodeSource::new(list.into_iter().map(|n| n.with_movable_pods(3)).collect());
    let mut cfg = config();
    cfg.drain_time = Duration::from_millis(100);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(1);
    ca.run_until(WAIT, |ca| ca.calls(Rpc::NodeGroupDeleteNodes).len() >= 3)
        .await
        .unwrap();
    ca.settle_deletions().await;
    assert_eq!(ca.calls(Rpc::NodeGroupDeleteNodes).len(), 3);
    let mut s = spans(&fake, "NodeGroupDeleteNodes");
    s.sort();
    for pair in s.windows(2) {
        assert!(!overlap(pair[0], pair[1]), "{s:?}");
    }
    assert!(ca.timeline().decisions().iter().any(|(_, d)| matches!(
        d,
        Decision::ScaleDownBlocked { reason, .. } if reason.contains("--max-drain-parallelism")
    )));
    assert_eq!(fake.target(), 1);
}

/// `CropNodes` counts deletions in progress against `--max-scale-down-parallelism`.
#[tokio::test(start_paused = true)]
async fn deletions_in_progress_count_against_the_parallelism() {
    let (instances, list) = workers(5);
    let fake = FakeProvider::with_group(1, 5, 5, instances);
    fake.edit(|s| {
        s.delays
            .insert("NodeGroupDeleteNodes", Duration::from_millis(300));
    });
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.max_scale_down_parallelism = 2;
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(0);
    ca.run_until(WAIT, |ca| ca.calls(Rpc::NodeGroupDeleteNodes).len() >= 4)
        .await
        .unwrap();
    ca.settle_deletions().await;
    assert_eq!(ca.calls(Rpc::NodeGroupDeleteNodes).len(), 4, "min 1 of 5");
    let s = spans(&fake, "NodeGroupDeleteNodes");
    for a in &s {
        assert!(s.iter().filter(|b| overlap(*a, **b)).count() <= 2, "{s:?}");
    }
    assert!(ca.timeline().decisions().iter().any(|(_, d)| matches!(
        d,
        Decision::ScaleDownBlocked { reason, .. } if reason.contains("--max-scale-down-parallelism")
    )));
    assert_eq!(fake.target(), 1);
}

/// `unneeded/nodes.go` `verifyMinSize`: target minus deletions in progress must stay above
/// the min, so a loop while two deletions run picks nothing more.
#[tokio::test(start_paused = true)]
async fn the_min_size_counts_deletions_in_progress() {
    let (instances, list) = workers(5);
    let fake = FakeProvider::with_group(3, 5, 5, instances);
    fake.edit(|s| {
        s.delays
            .insert("NodeGroupDeleteNodes", Duration::from_millis(500));
    });
    let nodes = StaticNodeSource::new(list);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(0);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    assert_eq!(ca.deletions_in_progress(), 2);
    // The provider has not lowered the target yet: only the deletions in progress stop this.
    let next = ca.run_once().await;
    assert_eq!(next.target(G), Some(5));
    assert!(next.decisions.iter().any(|d| matches!(
        d,
        Decision::ScaleDownBlocked { reason, .. } if reason.contains("min size 3") && reason.contains("2 being deleted")
    )), "{next}");
    ca.settle_deletions().await;
    ca.run_loops(5).await;
    assert_eq!(ca.calls(Rpc::NodeGroupDeleteNodes).len(), 2);
    assert_eq!(fake.target(), 3);
}

/// `actuation.IsNodeBeingDeleted`: a node tainted for deletion is skipped only for
/// `MaxCloudProviderNodeDeletionTime`; still there after it, it is unneeded again and deleted
/// again, so a provider sees a second NodeGroupDeleteNodes for a removal it accepted.
#[tokio::test(start_paused = true)]
async fn a_node_still_there_after_the_max_deletion_time_is_deleted_again() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    // Accepted, but the VM stays (a removal job still running).
    fake.edit(|s| s.delete_removes_instances = false);
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.max_cloud_provider_node_deletion_time = Duration::from_millis(500);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(2);
    ca.run_until(WAIT, |ca| ca.calls(Rpc::NodeGroupDeleteNodes).len() >= 2)
        .await
        .unwrap();
    let deletes = ca.calls(Rpc::NodeGroupDeleteNodes);
    assert!(deletes.iter().all(|c| c.is_ok()));
    assert_eq!(sent_names(deletes[0]), sent_names(deletes[1]));
    // Not before the taint expired and the node was unneeded for the unneeded time again.
    assert!(
        deletes[1].at - deletes[0].at
            >= Duration::from_millis(500) - ca.config().node_delete_delay_after_taint,
        "{}",
        ca.timeline()
    );
}

/// `node_instances_cache.go`: NodeGroupNodes is answered from a cache the first loop fills and
/// a background task refreshes every 2 minutes (here 300 ms); changes show only then.
#[tokio::test(start_paused = true)]
async fn node_group_nodes_is_cached_and_refreshed_in_the_background() {
    let (instances, list) = workers(2);
    let fake = FakeProvider::with_group(1, 5, 2, instances);
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.instances_cache_refresh_interval = Duration::from_millis(300);
    let mut ca = start(&fake, &nodes, cfg).await;
    let first = ca.run_once().await;
    fake.edit(|s| s.instances.get_mut(G).unwrap().push(running("vm-new")));
    let t0 = first.at;
    let mut seen_at = None;
    while ca.timeline().loops().last().unwrap().at < t0 + Duration::from_millis(700) {
        tokio::time::sleep(ca.config().loop_interval).await;
        let l = ca.run_once().await;
        if seen_at.is_none() && l.groups[0].instances.running == 3 {
            seen_at = Some(l.at);
        }
    }
    let seen_at = seen_at.expect("the new instance was never seen");
    assert!(
        seen_at >= t0 + Duration::from_millis(300),
        "{}",
        ca.timeline()
    );
    // The loops listed once (the first fill); the refresher twice, in the background.
    let in_loops =
        ca.calls(Rpc::NodeGroupNodes).len() - background_calls(&ca, Rpc::NodeGroupNodes).len();
    assert_eq!(in_loops, 1, "{}", ca.timeline());
    assert_eq!(background_calls(&ca, Rpc::NodeGroupNodes).len(), 2);
    assert_eq!(fake.log_count("NodeGroupNodes"), 3);
    assert!(
        ca.timeline()
            .to_string()
            .contains("call NodeGroupNodes(workers) -> 3 running"),
        "{}",
        ca.timeline()
    );
}

/// `getCloudProviderNodeInstances`: a group scaling up (`IsNodeGroupScalingUp`) is listed
/// every loop; once its nodes are there, the cache answers again.
#[tokio::test(start_paused = true)]
async fn a_group_scaling_up_is_listed_every_loop_until_its_nodes_are_there() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.max_node_provision_time = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(2);
    let up = ca.run_once().await;
    assert_eq!(up.count(Rpc::NodeGroupIncreaseSize), 1, "{up}");
    for l in ca.run_loops(3).await {
        assert_eq!(l.count(Rpc::NodeGroupNodes), 1, "{l}");
        assert!(l.groups[0].scale_up_in_progress);
    }
    for n in ["w2", "w3"] {
        fake.edit(|s| s.instances.get_mut(G).unwrap().push(running(&pid(n))));
        nodes.add(worker(n));
    }
    let done = ca.run_once().await;
    assert!(
        done.decisions
            .contains(&Decision::ScaleUpCompleted { group: G.into() }),
        "{done}"
    );
    for l in ca.run_loops(3).await {
        assert_eq!(l.count(Rpc::NodeGroupNodes), 0, "{l}");
    }
}

/// Deleting failed or unregistered instances drops the group's cached listing
/// (`InvalidateNodeInstancesCacheEntry` in `deleteCreatedNodesWithErrors` and
/// `removeOldUnregisteredNodes`); a scale-down deletion does not.
#[tokio::test(start_paused = true)]
async fn only_deleting_failed_or_unregistered_instances_drops_the_cached_listing() {
    let fake = FakeProvider::with_group(
        1,
        5,
        3,
        vec![
            running(&pid("w1")),
            running(&pid("w2")),
            failed("vm-a", 1, "OutOfResources"),
        ],
    );
    let nodes = StaticNodeSource::new(vec![worker("w1"), worker("w2")]);
    let mut ca = start(&fake, &nodes, config()).await;
    let first = ca.run_once().await;
    assert_eq!(first.count(Rpc::NodeGroupDeleteNodes), 1, "{first}");
    let next = ca.run_once().await;
    assert_eq!(next.count(Rpc::NodeGroupNodes), 1, "listed again: {next}");
    assert_eq!(next.groups[0].instances.errored, 0);
    assert_eq!(ca.run_once().await.count(Rpc::NodeGroupNodes), 0);

    ca.set_needed_nodes(1);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    ca.settle_deletions().await;
    assert_eq!(ca.calls(Rpc::NodeGroupDeleteNodes).len(), 2);
    for l in ca.run_loops(3).await {
        assert_eq!(l.count(Rpc::NodeGroupNodes), 0, "{l}");
        // The removed node's instance is still listed from the cache.
        assert_eq!(l.groups[0].instances.running, 2, "{l}");
    }
}

/// `GetCloudProviderNodeInstances`: a missing entry is fetched (concurrently, the error only
/// logged) and fetched again when read, whose error aborts the loop.
#[tokio::test(start_paused = true)]
async fn a_failed_listing_of_a_missing_entry_aborts_the_loop() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.max_node_provision_time = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(1);
    ca.run_once().await;
    fake.edit(|s| s.nodes_error = Some(Status::unavailable("CloudStack slow")));
    let l = ca.run_once().await;
    let reason = l.aborted.as_deref().expect("aborted");
    assert!(
        reason.contains("NodeGroupNodes(workers) failed") && reason.contains("CloudStack slow"),
        "{reason}"
    );
    assert_eq!(l.count(Rpc::NodeGroupNodes), 2, "{l}");
    assert_eq!(l.count(Rpc::NodeGroupGetOptions), 0, "{l}");
}

/// `CloudProviderNodeInstancesCache.Refresh` stores what it got, an empty list when
/// NodeGroupNodes failed: the group shows no instance until the next listing.
#[tokio::test(start_paused = true)]
async fn a_failed_background_refresh_leaves_an_empty_listing() {
    let (instances, list) = workers(2);
    let fake = FakeProvider::with_group(1, 5, 2, instances);
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.instances_cache_refresh_interval = Duration::from_millis(200);
    let mut ca = start(&fake, &nodes, cfg).await;
    assert_eq!(ca.run_once().await.groups[0].instances.running, 2);
    fake.edit(|s| s.nodes_error = Some(Status::unavailable("CloudStack slow")));
    ca.run_until(WAIT, |ca| {
        ca.last_loop()
            .is_some_and(|l| l.groups.first().is_some_and(|g| g.instances.running == 0))
    })
    .await
    .unwrap();
    // The refresh ran during that loop; its call is recorded when collected.
    ca.settle_deletions().await;
    assert!(ca.timeline().aborted_loops().is_empty());
    assert!(
        background_calls(&ca, Rpc::NodeGroupNodes)
            .iter()
            .any(|c| !c.is_ok())
    );
    assert_eq!(
        ca.last_loop().unwrap().ready,
        2,
        "the nodes are still there"
    );
}

/// `handleInstanceCreationErrorsForNodeGroup`: failed creations back the group off and shrink
/// the scale-up request only while the group `IsNodeGroupScalingUp`; the same failures outside
/// a scale-up back nothing off.
#[tokio::test(start_paused = true)]
async fn create_errors_back_off_only_while_the_group_is_scaling_up() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.max_node_provision_time = Duration::from_secs(60);
    cfg.initial_backoff = Duration::from_secs(60);
    // The failure outside a scale-up shows with the periodic listing.
    cfg.instances_cache_refresh_interval = Duration::from_millis(200);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(2);
    assert_eq!(ca.run_once().await.count(Rpc::NodeGroupIncreaseSize), 1);
    assert_eq!(fake.target(), 3);

    // The scale-up's two instances fail.
    fake.edit(|s| {
        let list = s.instances.get_mut(G).unwrap();
        list.push(failed("vm-a", 1, "OutOfResources"));
        list.push(failed("vm-b", 1, "OutOfResources"));
    });
    let failed_loop = ca.run_once().await;
    let backoffs: Vec<&Decision> = failed_loop
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::BackOff { .. }))
        .collect();
    assert_eq!(backoffs.len(), 1, "{failed_loop}");
    assert!(matches!(
        backoffs[0],
        Decision::BackOff { error_class: 1, error_code, .. } if error_code == "OutOfResources"
    ));
    // The request lost its two nodes: no scale-up in progress any more.
    let after = ca.run_once().await;
    assert!(!after.groups[0].scale_up_in_progress, "{after}");
    assert!(ca.backoff_remaining(G).is_some());

    // Later, an instance fails outside any scale-up: deleted, not counted.
    fake.edit(|s| {
        s.instances
            .get_mut(G)
            .unwrap()
            .push(failed("vm-c", 99, "VmError"))
    });
    ca.run_until(WAIT, |ca| {
        ca.timeline().decisions().iter().any(|(_, d)| {
            matches!(d, Decision::FailedCreationsNotCounted { error_code, .. } if error_code == "VmError")
        })
    })
    .await
    .unwrap();
    let all_backoffs = ca
        .timeline()
        .decisions()
        .into_iter()
        .filter(|(_, d)| matches!(d, Decision::BackOff { .. }))
        .count();
    assert_eq!(all_backoffs, 1, "{}", ca.timeline());
    assert!(
        ca.calls(Rpc::NodeGroupDeleteNodes)
            .iter()
            .any(|c| sent_names(c) == ["vm-c"])
    );
}

/// `fixNodeGroupSize`: an error from NodeGroupDecreaseTargetSize aborts the loop, every loop
/// the size stays wrong; so does an error from NodeGroupGetOptions asked for the group's max
/// provision time.
#[tokio::test(start_paused = true)]
async fn fix_node_group_size_errors_abort_every_loop() {
    let fake = FakeProvider::with_group(1, 3, 3, vec![running(&pid("w1"))]);
    fake.edit(|s| s.decrease_error = Some(Status::failed_precondition("nothing to cancel")));
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_demand(2);
    ca.run_until(WAIT, |ca| ca.timeline().aborted_loops().len() >= 3)
        .await
        .unwrap();
    let aborted = ca.timeline().aborted_loops();
    for pair in aborted.windows(2) {
        assert_eq!(pair[1].0, pair[0].0 + 1, "every loop");
    }
    assert!(
        aborted
            .iter()
            .all(|(_, r)| r.contains("fixing the size of workers failed")
                && r.contains("nothing to cancel")),
        "{aborted:?}"
    );
    assert!(ca.calls(Rpc::NodeGroupIncreaseSize).is_empty());
    assert!(
        ca.calls(Rpc::NodeGroupDecreaseTargetSize)
            .iter()
            .all(|c| matches!(
                c.request,
                Request::NodeGroupDecreaseTargetSize { delta: -2, .. }
            ))
    );

    fake.edit(|s| s.options = Some(Err(Status::internal("options store down"))));
    let l = ca.run_once().await;
    let reason = l.aborted.as_deref().expect("aborted");
    assert!(
        reason.contains("no max node provision time for workers")
            && reason.contains("options store down"),
        "{reason}"
    );
    assert_eq!(l.count(Rpc::NodeGroupDecreaseTargetSize), 0);
}

/// `updateScaleRequests` up to 1.35: a scale-up not fulfilled within the max provision time
/// backs the group off (`timeout`) and asks for its template, but nothing gives the capacity
/// back; `fixNodeGroupSize` lowers the target later, once the size has been wrong for the
/// provision time.
#[tokio::test(start_paused = true)]
async fn before_1_36_a_timed_out_scale_up_backs_off_without_reverting() {
    let fake = FakeProvider::with_group(1, 5, 1, vec![running(&pid("w1"))]);
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut cfg = config();
    cfg.release = 35;
    cfg.initial_backoff = Duration::from_secs(60);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_demand(2);
    let first = ca.run_once().await;
    assert_eq!(first.count(Rpc::NodeGroupIncreaseSize), 1);
    assert_eq!(first.count(Rpc::GetAvailableGpuTypes), 1, "{first}");
    ca.run_until(WAIT, |ca| {
        ca.timeline()
            .decisions()
            .iter()
            .any(|(_, d)| matches!(d, Decision::ScaleUpTimedOut { .. }))
    })
    .await
    .unwrap();
    let timed_out = ca.last_loop().unwrap().clone();
    assert!(timed_out.decisions.iter().any(
        |d| matches!(d, Decision::BackOff { error_code, error_class: 99, .. } if error_code == "timeout")
    ));
    // The request's group object has no template cached (it came from a Ready node).
    assert_eq!(
        timed_out.count(Rpc::NodeGroupTemplateNodeInfo),
        1,
        "{timed_out}"
    );
    // GetAvailableGPUTypes was answered once: cached.
    assert_eq!(timed_out.count(Rpc::GetAvailableGpuTypes), 0);

    // Only `fixNodeGroupSize` gives the capacity back (in the same loop or a later one).
    ca.run_until(WAIT, |_| fake.target() == 1).await.unwrap();
    for l in ca.timeline().loops() {
        let fixes = l
            .decisions
            .iter()
            .filter(|d| matches!(d, Decision::FixNodeGroupSize { delta: -2, .. }))
            .count();
        assert_eq!(l.count(Rpc::NodeGroupDecreaseTargetSize), fixes, "{l}");
    }
    assert_eq!(ca.calls(Rpc::NodeGroupDecreaseTargetSize).len(), 1);
}

/// `node_group_config_processor.go`: the options a provider answers replace the flags per
/// group (an unset duration being 0); Unimplemented keeps the flags.
#[tokio::test(start_paused = true)]
async fn answered_options_set_the_group_timers() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    // Unneeded time 100 ms against the flag's 300 ms.
    fake.edit(|s| {
        s.options = Some(Ok(Some(group_options(
            Some(Duration::from_millis(100)),
            None,
            Some(Duration::from_secs(60)),
        ))))
    });
    let nodes = StaticNodeSource::new(list.clone());
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(2);
    let first = ca.run_once().await;
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    let started = ca.last_loop().unwrap().at - first.at;
    assert!(
        started >= Duration::from_millis(100) && started < Duration::from_millis(300),
        "{started:?}"
    );

    // Without options the flag applies.
    let fake = FakeProvider::with_group(1, 5, 3, workers(3).0);
    let nodes = StaticNodeSource::new(list);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(2);
    let first = ca.run_once().await;
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    assert!(ca.last_loop().unwrap().at - first.at >= Duration::from_millis(300));
}

/// From 1.35 `updateReadinessStats` takes each node's max startup time from its group's
/// options; the protocol has no field for it, so answered options make it 0 (upstream
/// #10245) and a new NotReady node is unready at once. Before 1.35 it is a constant.
#[tokio::test(start_paused = true)]
async fn from_1_35_answered_options_make_a_new_not_ready_node_unready_at_once() {
    // GetOptions per loop: readiness twice per autoscaled node from 1.35, eligibility twice
    // per scale-down candidate (w2 is one once it is unready), one more per unneeded node.
    for (release, options, not_started, get_options) in [
        (36, true, 0, 4 + 4 + 1),
        (36, false, 1, 4 + 2),
        (33, true, 1, 2),
    ] {
        let fake =
            FakeProvider::with_group(1, 5, 2, vec![running(&pid("w1")), running(&pid("w2"))]);
        if options {
            // Every duration 0, in the fields of every release.
            let zero = Some(Duration::ZERO);
            fake.edit(|s| s.options = Some(Ok(Some(group_options(zero, zero, zero)))));
        }
        let nodes = StaticNodeSource::new(vec![worker("w1"), worker("w2").not_ready()]);
        let mut cfg = config();
        cfg.release = release;
        let mut ca = start(&fake, &nodes, cfg).await;
        let l = ca.run_once().await;
        let g = &l.groups[0];
        assert_eq!(
            (g.not_started, g.unready),
            (not_started, 1 - not_started),
            "release 1.{release}, options {options}: {l}"
        );
        assert_eq!(l.count(Rpc::NodeGroupGetOptions), get_options, "{l}");
    }
}

/// A NodeGroupGetOptions error when a node's deletion starts (`scheduleDeletion`) aborts that
/// deletion: untainted, no NodeGroupDeleteNodes.
#[tokio::test(start_paused = true)]
async fn an_options_error_aborts_a_node_deletion() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    fake.edit(|s| s.options = Some(Ok(None)));
    let nodes = StaticNodeSource::new(list);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.set_needed_nodes(2);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    fake.edit(|s| s.options = Some(Err(Status::internal("options store down"))));
    ca.settle_deletions().await;
    assert!(ca.calls(Rpc::NodeGroupDeleteNodes).is_empty());
    assert!(ca.timeline().decisions().iter().any(|(_, d)| matches!(
        d,
        Decision::ScaleDownFailed { error, .. } if error.contains("NodeGroupGetOptions failed")
    )));
    // And eligibility needs the options too: no scale-down while they fail.
    let l = ca.run_once().await;
    assert_eq!(l.groups[0].being_deleted, 0, "{l}");
    assert_eq!(ca.deletions_in_progress(), 0);
}

/// `GpuCustomResourcesProcessor` and the client's GPULabel cache: asked for every Ready node
/// until an answer comes (errors are not cached), then never again; a Ready node carrying
/// the label without GPU allocatable counts as NotReady.
#[tokio::test(start_paused = true)]
async fn gpu_label_is_asked_per_ready_node_until_answered() {
    let (instances, _) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    fake.edit(|s| s.gpu_label = None);
    let nodes = StaticNodeSource::new(vec![
        worker("w1"),
        worker("w2").with_label("gpu-type", "t4").with_gpus(1),
        worker("w3").with_label("gpu-type", "t4"),
    ]);
    let mut ca = start(&fake, &nodes, config()).await;
    for l in ca.run_loops(2).await {
        assert_eq!(l.count(Rpc::GpuLabel), 3, "{l}");
        assert_eq!(l.ready, 3);
    }
    assert_eq!(ca.errors().len(), 6, "Unimplemented GPULabel is an error");

    fake.edit(|s| s.gpu_label = Some("gpu-type".into()));
    let l = ca.run_once().await;
    assert_eq!(l.count(Rpc::GpuLabel), 1, "{l}");
    assert_eq!((l.ready, l.not_ready), (2, 1), "{l}");
    assert!(ca.timeline().observations().iter().any(|(_, o)| matches!(
        o,
        Observation::GpuUnready { nodes } if nodes == &["w3".to_string()]
    )));
    assert_eq!(ca.run_once().await.count(Rpc::GpuLabel), 0);
}

/// `ExitCleanUp`: Cleanup only at exit, only with `--write-status-configmap` (the default);
/// the background work stops.
#[tokio::test(start_paused = true)]
async fn cleanup_is_called_at_exit_only_with_the_status_configmap() {
    let (instances, list) = workers(2);
    let fake = FakeProvider::with_group(1, 5, 2, instances);
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.instances_cache_refresh_interval = Duration::from_millis(100);
    let mut ca = start(&fake, &nodes, cfg.clone()).await;
    ca.run_loops(5).await;
    assert!(ca.calls(Rpc::Cleanup).is_empty());
    ca.exit().await;
    assert_eq!(ca.calls(Rpc::Cleanup).len(), 1);
    assert!(ca.calls(Rpc::Cleanup)[0].is_ok());
    assert_eq!(fake.log_count("Cleanup"), 1);
    // No refresh after the exit.
    let listed = fake.log_count("NodeGroupNodes");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fake.log_count("NodeGroupNodes"), listed);

    cfg.write_status_configmap = false;
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.run_loops(2).await;
    ca.exit().await;
    assert!(ca.calls(Rpc::Cleanup).is_empty());
    assert_eq!(fake.log_count("Cleanup"), 1);
}

/// The wire switch: a mock of release 1.x sends NodeGroupGetOptions' `defaults` in the fields
/// that release's `NodeGroup.GetOptions` fills (`externalgrpc_node_group.go` at its tag), as
/// the provider receives them.
#[tokio::test(start_paused = true)]
async fn each_release_sends_the_option_fields_its_client_has() {
    // (release, wire override, fields 3 4 5 set, fields 8 9 10 set)
    for (release, wire, meta, google) in [
        (28, None, [true, true, false], false),
        (29, None, [true, true, true], false),
        (33, None, [true, true, true], false),
        (34, None, [true, true, true], false),
        (34, Some(WireGeneration::V1_34_2), [true, true, true], true),
        (35, None, [false, false, false], true),
        (36, None, [false, false, false], true),
    ] {
        let (instances, list) = workers(2);
        let fake = FakeProvider::with_group(1, 5, 2, instances);
        fake.edit(|s| s.options = Some(Ok(Some(flag_options()))));
        let nodes = StaticNodeSource::new(list);
        let mut cfg = config();
        cfg.release = release;
        cfg.wire = wire;
        let mut ca = start(&fake, &nodes, cfg).await;
        let l = ca.run_once().await;
        let what = format!("1.{release} {wire:?}");
        assert!(l.aborted.is_none(), "{what}: {l}");
        assert!(l.count(Rpc::NodeGroupGetOptions) > 0, "{what}: {l}");
        for r in fake.edit(|s| s.options_requests.clone()) {
            let d = r.defaults.expect("defaults");
            let sent = [
                d.scale_down_unneeded_time.is_some(),
                d.scale_down_unready_time.is_some(),
                d.max_node_provision_time.is_some(),
            ];
            assert_eq!(sent, meta, "{what}: {d:?}");
            for g in [
                &d.scale_down_unneeded_duration,
                &d.scale_down_unready_duration,
                &d.max_node_provision_duration,
            ] {
                assert_eq!(g.is_some(), google, "{what}: {d:?}");
            }
            if let Some(unneeded) = d.scale_down_unneeded_time {
                assert_eq!(
                    unneeded.duration,
                    Some(i64::try_from(config().scale_down_unneeded_time.as_nanos()).unwrap()),
                    "{what}: the flag, in nanoseconds"
                );
            }
        }
    }
}

/// Up to 1.34.1 `NodeGroup.GetOptions` reads `GetScaleDownUnneededTime().Duration` (fields
/// 3-5) without a nil check: an answer with only fields 8-10 crashes the process. The mock
/// ends the loop at that call and reports it aborted; 1.34.2 (falling back on 3-5 only when
/// 8-10 are missing) and 1.35 read the same answer fine, and 1.33 reads an answer in both.
#[tokio::test(start_paused = true)]
async fn up_to_1_34_1_options_without_fields_3_to_5_crash_the_loop() {
    let both = group_options(
        Some(Duration::from_millis(100)),
        Some(Duration::from_millis(400)),
        Some(Duration::from_secs(60)),
    );
    for (release, wire, answer, crashes) in [
        (33, None, new_fields_only(both), true),
        (29, None, new_fields_only(both), true),
        (28, None, new_fields_only(both), true),
        (33, None, both, false),
        (
            34,
            Some(WireGeneration::V1_34_2),
            new_fields_only(both),
            false,
        ),
        (36, None, new_fields_only(both), false),
    ] {
        let (instances, list) = workers(3);
        let fake = FakeProvider::with_group(1, 5, 3, instances);
        fake.edit(|s| s.options = Some(Ok(Some(answer))));
        let nodes = StaticNodeSource::new(list);
        let mut cfg = config();
        cfg.release = release;
        cfg.wire = wire;
        let mut ca = start(&fake, &nodes, cfg).await;
        // Scale-down eligibility asks for the options of every candidate.
        ca.set_needed_nodes(2);
        let what = format!("1.{release} {wire:?} crashes {crashes}");
        let l = ca.run_once().await;
        if !crashes {
            assert!(l.aborted.is_none(), "{what}: {l}");
            assert!(ca.errors().is_empty(), "{what}: {}", ca.timeline());
            continue;
        }
        let reason = l.aborted.as_deref().expect("aborted");
        assert!(
            reason.contains("crashed")
                && reason.contains("scaleDownUnneededTime (field 3)")
                && reason.contains("NodeGroup.GetOptions"),
            "{what}: {reason}"
        );
        // Nothing after the crash: the options call was the loop's last, and the only one.
        let calls = ca.timeline().calls_in_loop(l.loop_no);
        assert_eq!(
            calls.last().map(|c| c.rpc()),
            Some(Rpc::NodeGroupGetOptions),
            "{what}: {l}"
        );
        assert_eq!(l.count(Rpc::NodeGroupGetOptions), 1, "{what}: {l}");
        // Every loop crashes the same way for as long as the answer stays.
        let next = ca.run_once().await;
        assert!(
            next.aborted
                .as_deref()
                .is_some_and(|r| r.contains("crashed")),
            "{what}: {next}"
        );
    }
}

/// The crash can come from a scale-down deletion task (`scheduleDeletion` asks for the
/// group's options): no NodeGroupDeleteNodes is sent, and the next loop is reported aborted
/// before it calls anything.
#[tokio::test(start_paused = true)]
async fn a_crash_in_a_deletion_task_aborts_the_next_loop() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    let both = group_options(
        Some(Duration::from_millis(100)),
        Some(Duration::from_millis(400)),
        Some(Duration::from_secs(60)),
    );
    fake.edit(|s| s.options = Some(Ok(Some(both))));
    let nodes = StaticNodeSource::new(list);
    let mut cfg = config();
    cfg.release = 33;
    // Long enough that the loop starting the deletion ends before the task asks.
    cfg.node_delete_delay_after_taint = Duration::from_millis(100);
    let mut ca = start(&fake, &nodes, cfg).await;
    ca.set_needed_nodes(2);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    assert!(
        ca.timeline().aborted_loops().is_empty(),
        "{}",
        ca.timeline()
    );
    fake.edit(|s| s.options = Some(Ok(Some(new_fields_only(both)))));
    ca.settle_deletions().await;
    assert!(ca.calls(Rpc::NodeGroupDeleteNodes).is_empty());
    let l = ca.run_once().await;
    let reason = l.aborted.as_deref().expect("aborted");
    assert!(
        reason.contains("crashed") && reason.contains("field 3"),
        "{reason}"
    );
    assert!(l.calls.is_empty(), "{l}");
}

/// `NodeGroup.GetOptions` of 1.28 returns the gRPC error as it came, so Unimplemented is an
/// error for its core (`DelegatingNodeGroupConfigProcessor` falls back on the flags only for
/// `ErrNotImplemented`): scale-down eligibility fails for every candidate and nothing is
/// removed. From 1.29 Unimplemented means the flags.
#[tokio::test(start_paused = true)]
async fn only_1_28_takes_unimplemented_options_for_an_error() {
    for release in [28, 29] {
        let (instances, list) = workers(3);
        let fake = FakeProvider::with_group(1, 5, 3, instances);
        fake.edit(|s| s.options = None);
        let nodes = StaticNodeSource::new(list);
        let mut cfg = config();
        cfg.release = release;
        let mut ca = start(&fake, &nodes, cfg).await;
        ca.set_needed_nodes(2);
        // Three times the unneeded time.
        let loops = ca.run_loops(45).await;
        assert!(loops.iter().all(|l| l.aborted.is_none()), "1.{release}");
        let option_errors = ca
            .errors()
            .iter()
            .filter(|c| c.rpc() == Rpc::NodeGroupGetOptions)
            .count();
        if release == 28 {
            assert!(option_errors > 0, "{}", ca.timeline());
            assert!(ca.calls(Rpc::NodeGroupDeleteNodes).is_empty());
            assert_eq!(ca.deletions_in_progress(), 0);
        } else {
            assert_eq!(option_errors, 0, "{}", ca.timeline());
            ca.settle_deletions().await;
            assert_eq!(ca.calls(Rpc::NodeGroupDeleteNodes).len(), 1);
        }
    }
}

/// Up to 1.34.1 the template node comes from field 1 (`nodeInfo`); an answer without it is
/// (nil, nil) from `NodeGroup.TemplateNodeInfo`, which the template pass dereferences: the
/// process crashes. 1.35 reads field 2 and scales from zero.
#[tokio::test(start_paused = true)]
async fn up_to_1_34_1_a_template_without_field_1_crashes_the_loop() {
    for (release, field_2_only, crashes) in
        [(33, true, true), (33, false, false), (36, true, false)]
    {
        let fake = FakeProvider::with_group(0, 5, 0, Vec::new());
        fake.edit(|s| {
            s.template = Some(Ok(template_bytes(&[])));
            s.template_field_2_only = field_2_only;
        });
        let nodes = StaticNodeSource::new(Vec::new());
        let mut cfg = config();
        cfg.release = release;
        let mut ca = start(&fake, &nodes, cfg).await;
        ca.set_pending_pods(PodSpec::replicas("web", 1, 100, GI));
        let l = ca.run_once().await;
        let what = format!("1.{release}, field 2 only {field_2_only}");
        if crashes {
            let reason = l.aborted.as_deref().expect("aborted");
            assert!(
                reason.contains("crashed") && reason.contains("nodeInfo (field 1)"),
                "{what}: {reason}"
            );
            assert_eq!(
                ca.timeline()
                    .calls_in_loop(l.loop_no)
                    .last()
                    .map(|c| c.rpc()),
                Some(Rpc::NodeGroupTemplateNodeInfo),
                "{what}: {l}"
            );
        } else {
            assert!(l.aborted.is_none(), "{what}: {l}");
            assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 1, "{what}: {l}");
        }
    }
}
