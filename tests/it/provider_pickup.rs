//! The provider against a CloudStack whose scale jobs are picked up late (the simulator's
//! `pickup_delay`): after the jobid comes back, listings still show the cluster Running with
//! its old size until a worker validates the job and moves it to Scaling
//! (`ScaleKubernetesClusterCmd.execute` -> `KubernetesClusterManagerImpl.scaleKubernetesCluster`).
//! The provider must not take its own queued job for absent, must not send a second request
//! in that window (CloudStack would queue it too and fail it at pick-up), and IncreaseSize
//! answers OK once the job is past validation.

use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{ClusterSpec, ClusterState, Scenario, VmState};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;

const PICKUP: Duration = Duration::from_millis(200);
/// The provider's default `--scale-watch`.
const SCALE_WATCH: Duration = Duration::from_millis(1500);
const DEADLINE: Duration = Duration::from_secs(5);

fn worker_node(w: &(String, String, VmState)) -> pb::ExternalGrpcNode {
    node(&format!("external-cloudstack://{}", w.0), &w.1)
}

async fn increase(mut c: CloudProviderClient<Channel>, group: String) -> Result<(), Code> {
    let req = with_deadline(
        pb::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: group,
        },
        DEADLINE,
    );
    c.node_group_increase_size(req)
        .await
        .map(|_| ())
        .map_err(|s| s.code())
}

async fn delete(
    mut c: CloudProviderClient<Channel>,
    group: String,
    n: pb::ExternalGrpcNode,
) -> Result<(), Code> {
    let req = with_deadline(
        pb::NodeGroupDeleteNodesRequest {
            nodes: vec![n],
            id: group,
        },
        DEADLINE,
    );
    c.node_group_delete_nodes(req)
        .await
        .map(|_| ())
        .map_err(|s| s.code())
}

async fn target(c: &mut CloudProviderClient<Channel>, group: &str) -> i32 {
    c.node_group_target_size(pb::NodeGroupTargetSizeRequest {
        id: group.to_string(),
    })
    .await
    .expect("NodeGroupTargetSize")
    .into_inner()
    .target_size
}

/// `(size, nodeids)` of every `scaleKubernetesCluster` CloudStack got, in order.
fn scale_requests(env: &Stack) -> Vec<(Option<String>, Option<BTreeSet<String>>)> {
    env.scale_requests()
        .iter()
        .map(|r| {
            (
                r.get("size").cloned(),
                r.get("nodeids")
                    .map(|ids| ids.split(',').map(str::to_string).collect()),
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn scales_up_and_down_without_a_second_request_while_a_job_waits_for_pick_up() {
    let mut cfg = sim_config();
    cfg.scenario = Scenario::with_cluster(ClusterSpec::new("pool", 1, 4));
    cfg.settings.pickup_delay = PICKUP;
    cfg.settings.job_duration = Duration::from_millis(600);
    let mut env = Stack::refreshed(cfg, "pool", |s| {
        s.groups[0].min = 1;
        s.scale_watch = SCALE_WATCH;
    })
    .await;
    let group = env.cluster_id.clone();
    let mut c = env.client.clone();
    let done = Cell::new(false);
    let most_jobs = Cell::new(0);

    // Samples every 2 ms of the test's clock how many scale jobs the cluster has, queued ones
    // included: two at once means a second request went out while the first waited.
    let sampler = async {
        while !done.get() {
            most_jobs.set(most_jobs.get().max(env.sim.running_jobs(&group)));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };

    let scenario = async {
        // Scale-up: IncreaseSize, and while its job waits to be picked up, Refreshes and a
        // second IncreaseSize (the next autoscaler loop).
        let sent = Instant::now();
        let first = tokio::spawn(increase(c.clone(), group.clone()));
        let mut refreshed_during_pickup = 0;
        while sent.elapsed() < PICKUP - Duration::from_millis(50) {
            tokio::time::sleep(Duration::from_millis(40)).await;
            c.refresh(pb::RefreshRequest {}).await.expect("Refresh");
            assert_eq!(
                env.sim.cluster_state(&group),
                Some(ClusterState::Running),
                "still waiting for pick-up"
            );
            refreshed_during_pickup += 1;
        }
        assert!(refreshed_during_pickup >= 2);
        assert_eq!(
            target(&mut c, &group).await,
            5,
            "the queued job counts in the target although CloudStack still shows size 4"
        );
        assert_eq!(
            increase(c.clone(), group.clone()).await,
            Ok(()),
            "second IncreaseSize"
        );
        assert_eq!(first.await.expect("task"), Ok(()), "first IncreaseSize");
        let took = sent.elapsed();
        assert!(
            took >= PICKUP && took < SCALE_WATCH,
            "IncreaseSize answered after {took:?}: once the job is past validation, not before it nor at the end of the watch"
        );
        assert_eq!(target(&mut c, &group).await, 6);
        assert_eq!(
            scale_requests(&env),
            vec![(Some("5".to_string()), None)],
            "the second scale-up waits for the first job"
        );
        wait_until("both scale-ups done", async || {
            env.cluster_size() == 6
                && env.sim.running_jobs(&group) == 0
                && env.cluster_state() == "Running"
        })
        .await;
        env.wait_provider_settled().await;

        // Scale-down: two per-node DeleteNodes together, and a third while their job waits
        // to be picked up.
        let ws = env.workers();
        let third_after = Duration::from_millis(150);
        let (a, b, third) = tokio::join!(
            delete(c.clone(), group.clone(), worker_node(&ws[0])),
            delete(c.clone(), group.clone(), worker_node(&ws[1])),
            async {
                tokio::time::sleep(third_after).await;
                let queued = env.sim.running_jobs(&group) == 1
                    && env.sim.cluster_state(&group) == Some(ClusterState::Running);
                (
                    queued,
                    delete(c.clone(), group.clone(), worker_node(&ws[2])).await,
                )
            },
        );
        assert_eq!((a, b), (Ok(()), Ok(())));
        assert_eq!(
            third,
            (true, Ok(())),
            "the third call came while the first removal job waited for pick-up, and was accepted"
        );
        assert_eq!(target(&mut c, &group).await, 3);
        wait_until("the removals to be done", async || {
            env.cluster_size() == 3
                && env.sim.running_jobs(&group) == 0
                && env.cluster_state() == "Running"
        })
        .await;
        env.wait_provider_settled().await;
        done.set(true);
        ws
    };
    let ((), ws) = tokio::join!(sampler, scenario);

    assert_eq!(
        most_jobs.get(),
        1,
        "never two scale jobs, queued or running"
    );
    let sent = scale_requests(&env);
    assert_eq!(sent.len(), 5, "{sent:?}");
    assert_eq!(sent[0], (Some("5".into()), None));
    assert_eq!(sent[1], (Some("6".into()), None));
    // One Running VM (drained) per request, one job after the other.
    let removed: BTreeSet<String> = sent[2..]
        .iter()
        .map(|(size, ids)| {
            assert_eq!(size, &None);
            let ids = ids.clone().expect("nodeids");
            assert_eq!(ids.len(), 1, "{sent:?}");
            ids.into_iter().next().expect("one")
        })
        .collect();
    let want: BTreeSet<String> = ws[..3].iter().map(|w| w.0.clone()).collect();
    assert_eq!(removed, want);
    // Every scale job CloudStack ran succeeded: none was refused at pick-up. (Ended jobs are
    // not in listAsyncJobs, which lists running jobs only, as a CloudStack 4.21.0.0 does:
    // `running_26`, `running_30`; the simulator's own record says which failed.)
    let failed = env.sim.failed_jobs();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(env.target().await, 3);
    env.shutdown().await;
}

/// A submission whose answer is lost (CloudStack slower than the RPC's deadline) while the
/// job waits to be picked up: long after the provider gave up on the answer, listings still
/// show the cluster Running at its old size. The job list shows a pending
/// `ScaleKubernetesClusterCmd` created since it was sent (which may be another cluster's: scale
/// jobs name none), so the lost answer stays unsettled and a second IncreaseSize is queued,
/// never sent as a second job while the first may still come.
#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_not_taken_for_no_job_while_the_job_waits_to_be_picked_up() {
    let mut cfg = sim_config();
    cfg.settings.latency = Duration::from_secs(1);
    cfg.settings.pickup_delay = Duration::from_secs(8);
    cfg.settings.job_duration = Duration::from_secs(2);
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    let mut c = env.client.clone();
    let lost = c
        .node_group_increase_size(with_deadline(
            pb::NodeGroupIncreaseSizeRequest {
                delta: 1,
                id: env.cluster_id.clone(),
            },
            Duration::from_millis(1500),
        ))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::Unavailable, "{}", lost.message());
    // Past the provider's settle time (client timeout 3 s + 1 s), before the pick-up (8 s).
    elapse(Duration::from_secs(5)).await;
    assert_eq!(
        env.scale_requests().len(),
        1,
        "the request reached CloudStack"
    );
    assert_eq!(env.cluster_state(), "Running", "not picked up yet");
    env.refresh().await.expect("refresh");
    env.increase(1).await.expect("queued behind the found job");
    assert_eq!(env.target().await, 5, "both scale-ups counted");
    assert_eq!(
        env.scale_requests().len(),
        1,
        "no second job while the first is queued"
    );
    // The autoscaler refreshes every loop; the lost answer is settled from what they show.
    wait_until("the scale-ups to be done", async || {
        assert!(
            env.sim.running_jobs(&env.cluster_id) <= 1,
            "two scale jobs at once"
        );
        let _ = env.refresh().await;
        env.cluster_size() == 5 && env.cluster_state() == "Running"
    })
    .await;
    let sizes: Vec<String> = env
        .scale_requests()
        .iter()
        .filter_map(|r| r.get("size").cloned())
        .collect();
    assert_eq!(sizes, ["4", "5"]);
    env.shutdown().await;
}
