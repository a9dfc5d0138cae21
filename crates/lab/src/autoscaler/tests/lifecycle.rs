//! What the real cluster-autoscaler does with a provider's answers over several loops and
//! across a restart (issue 19): the ToBeDeleted taint an accepted deletion leaves, a node
//! counted Deleted and the upcoming nodes a target then makes, `fixNodeGroupSize` acting every
//! loop, the restart that cleans taints, the nil node group of 1.28 and 1.29 deletions, and
//! `removeOldUnregisteredNodes` with a group NodeGroups does not list. Each test drives the
//! scripted provider of `tests.rs` on paused time.

use super::upstream::flag_options;
use super::*;

fn workers(n: usize) -> (Vec<pb::Instance>, Vec<KubeNode>) {
    let names: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
    (
        names.iter().map(|n| running(&pid(n))).collect(),
        names.iter().map(|n| worker(n)).collect(),
    )
}

fn deleted_names(ca: &MockAutoscaler) -> Vec<String> {
    ca.calls(Rpc::NodeGroupDeleteNodes)
        .into_iter()
        .filter(|c| c.is_ok())
        .flat_map(|c| match &c.request {
            Request::NodeGroupDeleteNodes { nodes, .. } => {
                nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
            }
            _ => Vec::new(),
        })
        .collect()
}

/// Three Ready workers (min 1, target 3), a workload needing two: scale-down removes one,
/// and the provider accepts it. Returns the autoscaler once that deletion has ended, and the
/// removed node's name.
async fn one_node_removed(
    fake: &FakeProvider,
    nodes: &StaticNodeSource,
    cfg: AutoscalerConfig,
) -> (MockAutoscaler, String) {
    let mut ca = start(fake, nodes, cfg).await;
    ca.set_needed_nodes(2);
    ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
        .await
        .unwrap();
    ca.settle_deletions().await;
    let removed = deleted_names(&ca);
    assert_eq!(removed.len(), 1, "{}", ca.timeline());
    (ca, removed[0].clone())
}

fn group_seen(l: &LoopSummary) -> &GroupObservation {
    l.groups
        .iter()
        .find(|g| g.id == G)
        .unwrap_or_else(|| panic!("{l}"))
}

fn upcoming_in(ca: &MockAutoscaler, loop_no: u64) -> UpcomingNodes {
    ca.timeline()
        .upcoming_nodes(G)
        .into_iter()
        .find(|(n, _)| *n == loop_no)
        .map(|(_, u)| u.clone())
        .unwrap_or_else(|| panic!("no upcoming nodes in loop {loop_no}\n{}", ca.timeline()))
}

/// `delete_in_batch.go` `RegisterAndRecordSuccessfulScaleDownEvent`: an OK
/// NodeGroupDeleteNodes ends the deletion and keeps the ToBeDeleted taint. While the node is
/// still listed, clusterstate counts it Deleted (the client has no HasInstance), it is no
/// template and no pod goes there; a provider that lowered the target leaves no upcoming node.
#[tokio::test(start_paused = true)]
async fn an_accepted_deletion_keeps_the_taint_while_the_node_is_listed() {
    let (instances, list) = workers(3);
    // Max 2: once the removal is accepted the pending pods below can scale nothing up.
    let fake = FakeProvider::with_group(1, 2, 3, instances);
    // The provider still places a VM it is removing in the group.
    fake.edit(|s| {
        for n in &list {
            s.extra_members.insert(n.provider_id.clone(), G.into());
        }
    });
    let nodes = StaticNodeSource::new(list);
    let (mut ca, removed) = one_node_removed(&fake, &nodes, config()).await;
    assert_eq!(fake.target(), 2);

    // Pending pods that would fit anywhere: not on the tainted node.
    ca.set_pending_pods(PodSpec::replicas("p", 2, 100, GI));
    for l in ca.run_loops(4).await {
        let g = group_seen(&l);
        assert_eq!((g.ready, g.being_deleted), (2, 1), "{l}");
        let u = upcoming_in(&ca, l.loop_no);
        assert_eq!((u.upcoming, u.deleted, u.phantom()), (0, 1, 0), "{u}");
    }
    assert!(ca.timeline().phantom_upcoming_nodes().is_empty());
    let on_removed = ca
        .timeline()
        .observations()
        .into_iter()
        .any(|(_, o)| matches!(o, Observation::PodsScheduled { node, .. } if *node == removed));
    assert!(!on_removed, "{}", ca.timeline());
    assert_eq!(ca.pending_pods().len(), 2);
    assert!(ca.calls(Rpc::NodeGroupIncreaseSize).is_empty());
    assert!(ca.timeline().templates(G).iter().all(
        |(_, t)| !matches!(t, Ok(t) if t.source == TemplateSource::ReadyNode(removed.clone()))
    ),);

    // The VM is gone and its node with it.
    nodes.remove(&removed);
    let l = ca.run_once().await;
    assert_eq!(group_seen(&l).being_deleted, 0, "{l}");
}

/// `clusterstate.go` `GetUpcomingNodes`: target − (Ready + Unready + LongUnregistered). A
/// provider that accepts the removal but keeps the VM in the target makes one phantom
/// upcoming node. Up to 1.35 it is a template copy in the snapshot: the pending pods fit on it
/// and nothing scales up. From 1.36 a group without a scale-up request has no upcoming nodes.
#[tokio::test(start_paused = true)]
async fn a_target_that_keeps_a_removed_vm_makes_a_phantom_upcoming_node() {
    for release in [33, 35, 36] {
        let (instances, list) = workers(3);
        let fake = FakeProvider::with_group(1, 5, 3, instances);
        fake.edit(|s| s.delete_changes_nothing = true);
        let nodes = StaticNodeSource::new(list);
        let mut cfg = config();
        cfg.release = release;
        let (mut ca, removed) = one_node_removed(&fake, &nodes, cfg).await;
        assert_eq!(fake.target(), 3);

        let l = ca.run_once().await;
        let g = group_seen(&l);
        assert_eq!(
            (g.target, g.ready, g.being_deleted),
            (3, 2, 1),
            "1.{release}: {l}"
        );
        let u = upcoming_in(&ca, l.loop_no);
        assert_eq!((u.upcoming, u.requested, u.phantom()), (1, None, 1), "{u}");
        assert_eq!(u.counted, release < 36, "1.{release}: {u}");
        assert!(!ca.timeline().phantom_upcoming_nodes().is_empty());

        // One node's worth of pending pods.
        ca.set_demand(1);
        let loops = ca.run_loops(3).await;
        let increases = ca.calls(Rpc::NodeGroupIncreaseSize).len();
        if release < 36 {
            assert_eq!(increases, 0, "1.{release}: {}", ca.timeline());
            assert!(
                no_scale_up_reason(&loops[0]).contains("covered by 1 upcoming"),
                "{}",
                loops[0]
            );
            // Pods too fit on the template copy.
            ca.set_pending_pods(PodSpec::replicas("p", 1, 100, GI));
            for l in ca.run_loops(2).await {
                assert_eq!(l.count(Rpc::NodeGroupIncreaseSize), 0, "{l}");
                assert!(no_scale_up_reason(&l).contains("upcoming"), "{l}");
            }
        } else {
            assert_eq!(increases, 1, "1.{release}: {}", ca.timeline());
        }
        // Still tainted: no pod goes there, it is no scale-down candidate again yet.
        assert_eq!(deleted_names(&ca), vec![removed]);
    }
}

/// `ExitCleanUp` calls Cleanup (with the status configmap); the next process's first loop
/// (`cleanUpIfRequired`) removes the ToBeDeleted taint from every node NodeGroupForNode places
/// in a group, so a node whose removal was accepted but not carried out is schedulable again.
/// A node the provider answers "" for keeps it.
#[tokio::test(start_paused = true)]
async fn a_restart_calls_cleanup_and_the_new_process_cleans_taints_of_managed_nodes() {
    let (instances, list) = workers(3);
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    fake.edit(|s| s.delete_changes_nothing = true);
    let nodes = StaticNodeSource::new(list);
    let (mut ca, removed) = one_node_removed(&fake, &nodes, config()).await;
    let before = ca.run_once().await;
    assert_eq!(group_seen(&before).being_deleted, 1, "{before}");

    ca.restart().await;
    assert_eq!(ca.calls(Rpc::Cleanup).len(), 1);
    assert_eq!(ca.timeline().restarts(), vec![before.loop_no]);
    let first = ca.run_once().await;
    // The new process fills its NodeGroupNodes cache, cleans taints, then refreshes.
    let order: Vec<Rpc> = first.calls.iter().map(Call::rpc).collect();
    let refresh = order.iter().position(|r| *r == Rpc::Refresh).unwrap();
    assert_eq!(order[0], Rpc::NodeGroups, "{first}");
    assert!(order[..refresh].contains(&Rpc::NodeGroupNodes), "{first}");
    assert_eq!(
        order[..refresh]
            .iter()
            .filter(|r| **r == Rpc::NodeGroupForNode)
            .count(),
        3,
        "{first}"
    );
    assert!(
        first
            .decisions
            .contains(&Decision::ToBeDeletedTaintsCleaned {
                nodes: vec![removed.clone()]
            }),
        "{first}"
    );
    let g = group_seen(&first);
    assert_eq!((g.ready, g.being_deleted), (3, 0), "{first}");
    assert_eq!(upcoming_in(&ca, first.loop_no).upcoming, 0);

    // Tainted again; this time the restarted provider knows no VM when the new process asks.
    ca.run_until(WAIT, |ca| deleted_names(ca).len() >= 2)
        .await
        .unwrap();
    ca.settle_deletions().await;
    let again = deleted_names(&ca)[1].clone();
    ca.restart().await;
    fake.edit(|s| s.for_node_answer = Some(pb::NodeGroup::default()));
    let first = ca.run_once().await;
    assert!(
        !first
            .decisions
            .iter()
            .any(|d| matches!(d, Decision::ToBeDeletedTaintsCleaned { .. })),
        "{first}"
    );
    fake.edit(|s| s.for_node_answer = None);
    let l = ca.run_once().await;
    assert_eq!(
        group_seen(&l).being_deleted,
        1,
        "{again} keeps its taint: {l}"
    );
    assert_eq!(ca.calls(Rpc::Cleanup).len(), 2);
}

/// `static_autoscaler.go` `fixNodeGroupSize` / `RunOnce`: a fix skips the rest of the loop.
/// An OK NodeGroupDecreaseTargetSize that leaves the target where it was keeps the incorrect
/// size's first observation (`updateIncorrectNodeGroupSizes`), so it is due again in every
/// loop, and nothing else happens any more.
#[tokio::test(start_paused = true)]
async fn an_ok_decrease_that_changes_nothing_is_asked_again_every_loop() {
    // A third VM being deleted: not expected to register, yet still in the target, and the
    // provider never lowers its target below the instances it lists.
    let mut instances = workers(2).0;
    instances.push(instance(&pid("w3"), InstanceState::InstanceDeleting));
    let fake = FakeProvider::with_group(1, 5, 3, instances);
    let nodes = StaticNodeSource::new(workers(2).1);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.run_until(WAIT, |ca| !ca.timeline().size_fix_loops().is_empty())
        .await
        .unwrap();
    // Pending pods from now on: no loop gets as far as scale-up.
    ca.set_demand(1);
    ca.run_until(WAIT, |ca| ca.timeline().longest_size_fix_streak() >= 5)
        .await
        .unwrap();

    let fixes = ca.timeline().size_fix_loops();
    for pair in fixes.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "{}", ca.timeline());
    }
    for c in ca.calls(Rpc::NodeGroupDecreaseTargetSize) {
        assert!(c.is_ok(), "{c}");
        assert!(
            matches!(
                c.request,
                Request::NodeGroupDecreaseTargetSize { delta: -1, .. }
            ),
            "{c}"
        );
    }
    for l in ca
        .timeline()
        .loops()
        .iter()
        .filter(|l| l.fixed_node_group_size())
    {
        assert!(
            l.decisions
                .iter()
                .any(|d| matches!(d, Decision::SkipRestOfLoop { .. })),
            "{l}"
        );
    }
    assert_eq!(fake.target(), 3);
    assert!(ca.calls(Rpc::NodeGroupIncreaseSize).is_empty());
}

/// `delete_in_batch.go` `deleteNodesFromCloudProvider`: the deletion asks NodeGroupForNode
/// (the client's cache is empty after the next loop's Refresh). Up to 1.29 an answer with id
/// "" leaves a nil node group that `deleteNodesAndRegisterStatus` calls: the process dies and
/// the next loop reports it. From 1.30 (commit 476b52442b) it is a failed deletion, and the
/// node is untainted.
#[tokio::test(start_paused = true)]
async fn up_to_1_29_a_deletion_told_no_node_group_crashes_the_autoscaler() {
    for release in [28, 29, 30] {
        let (instances, list) = workers(3);
        let fake = FakeProvider::with_group(1, 5, 3, instances);
        // 1.28 takes Unimplemented options for an error.
        fake.edit(|s| s.options = Some(Ok(Some(flag_options()))));
        let nodes = StaticNodeSource::new(list);
        let mut cfg = config();
        cfg.release = release;
        // Several loops (and Refreshes) between the taint and the deletion.
        cfg.node_delete_delay_after_taint = Duration::from_millis(200);
        let mut ca = start(&fake, &nodes, cfg).await;
        ca.set_needed_nodes(2);
        ca.run_until(WAIT, |ca| ca.deletions_in_progress() > 0)
            .await
            .unwrap();
        // The provider restarts and knows no VM yet.
        fake.edit(|s| s.for_node_answer = Some(pb::NodeGroup::default()));
        let failed = |ca: &MockAutoscaler| {
            ca.timeline()
                .decisions()
                .into_iter()
                .any(|(_, d)| matches!(d, Decision::ScaleDownFailed { .. }))
        };
        ca.run_until(WAIT, |ca| {
            failed(ca) || !ca.timeline().aborted_loops().is_empty()
        })
        .await
        .unwrap();
        assert!(
            ca.calls(Rpc::NodeGroupDeleteNodes).is_empty(),
            "{}",
            ca.timeline()
        );
        let asked = ca.timeline().events().iter().any(
            |e| matches!(&e.kind, EventKind::BackgroundCall(c) if c.rpc() == Rpc::NodeGroupForNode),
        );
        assert!(asked, "1.{release}: {}", ca.timeline());
        let aborted = ca.timeline().aborted_loops();
        if release <= 29 {
            let (_, reason) = aborted.first().expect("a crash");
            assert!(
                reason.contains("crashed") && reason.contains("nil"),
                "1.{release}: {reason}"
            );
        } else {
            assert!(aborted.is_empty(), "1.30: {}", ca.timeline());
            let why = ca
                .timeline()
                .decisions()
                .into_iter()
                .find_map(|(_, d)| match d {
                    Decision::ScaleDownFailed { error, .. } => Some(error.clone()),
                    _ => None,
                })
                .unwrap();
            assert!(why.contains("doesn't belong to a node group"), "{why}");
            let l = ca.run_once().await;
            assert!(
                l.groups.iter().all(|g| g.being_deleted == 0),
                "untainted: {l}"
            );
        }
    }
}

/// `static_autoscaler.go` `removeOldUnregisteredNodes`: the group NodeGroupForNode names is
/// looked up among NodeGroups (`nodeGroupsById`); one NodeGroups does not list is a nil
/// NodeGroup whose TargetSize call kills the process.
#[tokio::test(start_paused = true)]
async fn removing_unregistered_nodes_of_a_group_node_groups_does_not_list_crashes() {
    let fake = FakeProvider::with_group(1, 5, 2, vec![running(&pid("w1")), running(&pid("w2"))]);
    fake.edit(|s| {
        s.for_node_answer = Some(pb::NodeGroup {
            id: "ghost".into(),
            min_size: 0,
            max_size: 5,
            debug: String::new(),
        })
    });
    let nodes = StaticNodeSource::new(vec![worker("w1")]);
    let mut ca = start(&fake, &nodes, config()).await;
    ca.run_until(WAIT, |ca| !ca.timeline().aborted_loops().is_empty())
        .await
        .unwrap();
    let (_, reason) = ca.timeline().aborted_loops()[0];
    assert!(
        reason.contains("crashed") && reason.contains("NodeGroups does not list"),
        "{reason}"
    );
    assert!(ca.calls(Rpc::NodeGroupDeleteNodes).is_empty());
}
