//! Scale-down as the real cluster-autoscaler sends it: one NodeGroupDeleteNodes per node, in
//! parallel (`core/scaledown/actuation/actuator.go` `deleteNodesAsync`, one
//! `group_deletion_scheduler.go` `ScheduleDeletion` per node), several in one loop and more
//! while a removal job runs. Every call that names a removable node is accepted; CloudStack
//! gets requests it can finish: at most one VM that needs a drain per `nodeids` request
//! (CloudStack removes them one by one and lowers `size` only at the end, so a failed drain
//! after another VM went would strand the cluster), down VMs together. Also: IncreaseSize
//! answers as soon as CloudStack's job is past validation.

use cks_proto as pb;
use cks_sim::VmState;
use cks_testkit::stack::*;
use cks_testkit::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;

/// DeleteNodes for each node in its own concurrent call, as the autoscaler sends them.
async fn delete_each(env: &Stack, nodes: &[pb::ExternalGrpcNode]) -> Vec<Result<(), Code>> {
    let tasks: Vec<_> = nodes
        .iter()
        .map(|n| {
            let mut c = env.client.clone();
            let req = with_deadline(
                pb::NodeGroupDeleteNodesRequest {
                    nodes: vec![n.clone()],
                    id: env.cluster_id.clone(),
                },
                Duration::from_secs(5),
            );
            tokio::spawn(async move {
                c.node_group_delete_nodes(req)
                    .await
                    .map(|_| ())
                    .map_err(|s| s.code())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// The VM ids of every `nodeids` request CloudStack got, one set per request.
fn removal_requests(env: &Stack) -> Vec<BTreeSet<String>> {
    env.scale_requests()
        .iter()
        .filter_map(|r| r.get("nodeids"))
        .map(|ids| ids.split(',').map(str::to_string).collect())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn per_node_deletions_are_all_accepted_and_drained_one_request_at_a_time() {
    let mut env = Stack::refreshed(pool(8), "pool", |s| s.groups[0].min = 1).await;
    let victims: Vec<_> = env.workers().into_iter().take(5).collect();
    let nodes: Vec<_> = victims.iter().map(worker_node).collect();
    let answers = delete_each(&env, &nodes).await;
    assert_eq!(answers, vec![Ok(()); 5], "every per-node call is accepted");
    assert_eq!(
        env.target().await,
        3,
        "the target drops at once for all five"
    );
    let want: BTreeSet<String> = victims.iter().map(|v| v.0.clone()).collect();
    wait_until("the five VMs to be gone", async || {
        assert!(
            env.sim.running_jobs(&env.cluster_id) <= 1,
            "two jobs at once"
        );
        let left: BTreeSet<String> = env.workers().into_iter().map(|w| w.0).collect();
        left.is_disjoint(&want) && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    env.wait_provider_settled().await;
    let sent = removal_requests(&env);
    assert!(
        sent.iter().all(|r| r.len() == 1),
        "one Running VM (drained) per request: {sent:?}"
    );
    let all: BTreeSet<String> = sent.iter().flatten().cloned().collect();
    assert_eq!(all, want);
    assert_eq!(sent.len(), 5, "nothing sent twice: {sent:?}");
    assert_eq!(env.target().await, 3);
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn down_vms_deleted_together_go_in_one_request() {
    let mut env = Stack::refreshed(pool(8), "pool", |s| s.groups[0].min = 1).await;
    let victims: Vec<_> = env.workers().into_iter().take(4).collect();
    for v in &victims {
        assert!(env.sim.stop_vm(&v.0));
    }
    env.refresh().await.expect("refresh");
    let nodes: Vec<_> = victims.iter().map(worker_node).collect();
    assert_eq!(delete_each(&env, &nodes).await, vec![Ok(()); 4]);
    let want: BTreeSet<String> = victims.iter().map(|v| v.0.clone()).collect();
    assert_eq!(
        removal_requests(&env),
        vec![want.clone()],
        "down VMs need no drain: one request"
    );
    wait_until("the four VMs to be gone", async || {
        let left: BTreeSet<String> = env.workers().into_iter().map(|w| w.0).collect();
        left.is_disjoint(&want) && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    env.wait_provider_settled().await;
    assert_eq!(removal_requests(&env).len(), 1);
    assert_eq!(env.target().await, 4);
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deletions_while_a_removal_runs_are_answered_at_once_and_sent_when_it_ends() {
    let mut cfg = pool(8);
    cfg.settings.job_duration = Duration::from_secs(3);
    let mut env = Stack::refreshed(cfg, "pool", |s| s.groups[0].min = 1).await;
    let ws = env.workers();
    env.delete(vec![worker_node(&ws[0])]).await.expect("first");
    assert_eq!(removal_requests(&env).len(), 1);
    assert_eq!(env.sim.running_jobs(&env.cluster_id), 1);
    // Three more, and the first one again, while its job runs: all accepted at once.
    let more: Vec<_> = [&ws[1], &ws[2], &ws[3], &ws[0]]
        .into_iter()
        .map(worker_node)
        .collect();
    let started = Instant::now();
    assert_eq!(delete_each(&env, &more).await, vec![Ok(()); 4]);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered without waiting for the job: {:?}",
        started.elapsed()
    );
    assert_eq!(env.target().await, 4);
    assert_eq!(
        removal_requests(&env).len(),
        1,
        "nothing sent while the job runs"
    );
    wait_until("the queued three to be sent and done", async || {
        assert!(
            env.sim.running_jobs(&env.cluster_id) <= 1,
            "two jobs at once"
        );
        removal_requests(&env).len() == 4
            && env.sim.running_jobs(&env.cluster_id) == 0
            && env.cluster_state() == "Running"
    })
    .await;
    let sent = removal_requests(&env);
    let want: BTreeSet<String> = [&ws[1], &ws[2], &ws[3]]
        .iter()
        .map(|w| w.0.clone())
        .collect();
    let later: BTreeSet<String> = sent[1..].iter().flatten().cloned().collect();
    assert_eq!(later, want, "the queued ones, the first not again");
    env.wait_provider_settled().await;
    assert_eq!(env.target().await, 4);
    assert_eq!(env.cluster_size(), 4);
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_minimum_and_the_last_worker_hold_against_everything_queued() {
    let mut env = Stack::refreshed(pool(5), "pool", |s| s.groups[0].min = 3).await;
    let nodes: Vec<_> = env.workers().iter().map(worker_node).collect();
    let answers = delete_each(&env, &nodes[..3]).await;
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(ok, 2, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| a.is_ok() || *a == Err(Code::FailedPrecondition)),
        "{answers:?}"
    );
    assert_eq!(env.target().await, 3);
    assert_eq!(removal_requests(&env).len(), 1);
    assert_eq!(removal_requests(&env)[0].len(), 1, "one drain per request");
    env.shutdown().await;

    // min 0: never the last worker, counting what is queued.
    let mut env = Stack::refreshed(pool(3), "pool", |s| s.groups[0].min = 0).await;
    let nodes: Vec<_> = env.workers().iter().map(worker_node).collect();
    let answers = delete_each(&env, &nodes).await;
    assert_eq!(
        answers.iter().filter(|a| a.is_ok()).count(),
        2,
        "{answers:?}"
    );
    assert_eq!(env.target().await, 1);
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_window_the_rules_refuse_when_it_closes_fails_every_caller_and_keeps_the_nodes() {
    let mut env = Stack::refreshed(pool(6), "pool", |s| {
        s.groups[0].min = 1;
        // A window long enough for the cluster to change before it closes.
        s.removal_window = Duration::from_millis(500);
    })
    .await;
    let nodes: Vec<_> = env.workers().iter().take(2).map(worker_node).collect();
    let (control_id, _) = env.control();
    let calls = {
        let env = &env;
        let nodes = nodes.clone();
        async move { delete_each(env, &nodes).await }
    };
    let stop_control = async {
        // While the window collects: the control VM goes down and the cluster to Alert
        // (CKS Alert rule 4 then refuses every request).
        tokio::time::sleep(Duration::from_millis(100)).await;
        env.sim.set_vm_state(&control_id, VmState::Stopped);
        env.sim.scan_now();
    };
    let (answers, ()) = tokio::join!(calls, stop_control);
    assert_eq!(answers, vec![Err(Code::FailedPrecondition); 2]);
    assert!(
        removal_requests(&env).is_empty(),
        "nothing reached CloudStack"
    );
    assert_eq!(env.target().await, 6, "the nodes stay in the target");
    env.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn increase_size_answers_once_the_job_is_past_validation() {
    let mut cfg = pool(3);
    cfg.settings.job_duration = Duration::from_secs(30);
    let mut env = Stack::refreshed(cfg, "pool", |s| {
        s.scale_watch = Duration::from_millis(1500);
    })
    .await;
    let started = Instant::now();
    env.increase(1).await.expect("increase");
    let took = started.elapsed();
    assert_eq!(env.cluster_state(), "Scaling");
    assert!(
        took < Duration::from_millis(500),
        "answered {took:?} after the request, not at the end of the 1.5 s watch"
    );
    assert_eq!(env.target().await, 4);
    env.shutdown().await;
}

/// Removals at CloudStack's own pace: each Running VM goes in a request of its own, and each
/// request waits for the job before it to be seen ending. The first job, of a length not known
/// yet, is polled every quarter of the poll interval (work waits behind it); from then on the
/// machine knows how long such a job runs and polls often from when the next is due, so each
/// next request leaves within an eighth of a poll interval of the job before it ending
/// (machine/pace.rs).
#[tokio::test(start_paused = true)]
async fn each_next_removal_leaves_soon_after_the_job_before_it_ends() {
    let mut cfg = pool(6);
    cfg.settings.job_duration = Duration::from_millis(3300);
    let env = Stack::refreshed(cfg, "pool", |s| {
        s.groups[0].min = 1;
        s.job_poll_interval = Duration::from_secs(2);
    })
    .await;
    let victims: Vec<_> = env.workers().into_iter().take(4).collect();
    let nodes: Vec<_> = victims.iter().map(worker_node).collect();
    assert_eq!(delete_each(&env, &nodes).await, vec![Ok(()); 4]);
    let want: BTreeSet<String> = victims.iter().map(|v| v.0.clone()).collect();
    wait_until("the four VMs to be gone", async || {
        let left: BTreeSet<String> = env.workers().into_iter().map(|w| w.0).collect();
        left.is_disjoint(&want) && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    let sent: Vec<u64> = env
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.command == "scaleKubernetesCluster")
        .map(|r| r.atms)
        .collect();
    assert_eq!(sent.len(), 4, "one request per Running VM");
    let gaps: Vec<u64> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    // A job runs 3.3 s; the first is seen at a quarter-interval poll (0.5 s), the others
    // within an eighth (0.25 s), plus the cluster read after each job.
    assert!(
        (3300..=3300 + 500 + 100).contains(&gaps[0]),
        "the first job is seen within a quarter of the poll interval: {gaps:?}"
    );
    for g in &gaps[1..] {
        assert!(
            (3300..=3300 + 250 + 100).contains(g),
            "a later job is seen within an eighth of the poll interval: {gaps:?}"
        );
    }
    env.shutdown().await;
}
