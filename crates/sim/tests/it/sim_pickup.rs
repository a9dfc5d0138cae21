//! The simulator's pick-up delay (`SimSettings::pickup_delay`): CloudStack's order, where
//! `scaleKubernetesCluster` only parses its parameters and queues the job
//! (`ApiServer.queueCommand`), and the job, once a worker picks it up, validates against the
//! cluster as it is then (`ScaleKubernetesClusterCmd.execute` ->
//! `KubernetesClusterManagerImpl.scaleKubernetesCluster`) and only then moves it to Scaling.

use std::time::Duration;

use cks_sim::{ClusterState, SimConfig};
use cks_testkit::cs::*;
use cks_testkit::{elapse, sim_config_with, start_sim, wait_until};
use tokio::time::Instant;

const PICKUP: Duration = Duration::from_millis(200);

/// The demo cluster (1 control, 3 workers, Running, max size 50) with jobs picked up 200 ms
/// after their id is returned and a scanner that stays out of the way.
fn delayed() -> SimConfig {
    sim_config_with(|c| {
        c.settings.pickup_delay = PICKUP;
        c.settings.job_duration = Duration::from_millis(400);
        c.settings.scanner_interval = Duration::from_secs(60);
    })
}

async fn job_status(c: &Client, job: &str) -> serde_json::Value {
    c.ok("queryAsyncJobResult", &[("jobid", job)]).await
}

#[tokio::test(start_paused = true)]
async fn the_listing_shows_the_old_state_and_size_until_the_job_is_picked_up() {
    let sim = start_sim(delayed()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let sent = Instant::now();
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "5")])
        .await;

    let right_after = c.cluster(&id).await;
    assert_eq!(right_after["state"], "Running", "{right_after}");
    assert_eq!(right_after["size"], 3);
    assert_eq!(vm_ids(&right_after, "-node-").len(), 3, "no new VM yet");
    assert_eq!(job_status(&c, &job).await["jobstatus"], 0, "queued");
    assert_eq!(sim.running_jobs(&id), 1);

    elapse(PICKUP / 2).await;
    assert_eq!(
        c.cluster(&id).await["state"],
        "Running",
        "not picked up yet"
    );

    wait_until("the job to move the cluster to Scaling", async || {
        sim.cluster_state(&id) == Some(ClusterState::Scaling)
    })
    .await;
    assert!(
        sent.elapsed() >= PICKUP,
        "Scaling after {:?}, before the pick-up delay",
        sent.elapsed()
    );
    let during = c.cluster(&id).await;
    assert_eq!(during["size"], 3, "size changes only when the job succeeds");
    assert_eq!(vm_ids(&during, "-node-").len(), 5, "the new VMs exist");

    let done = c.wait_job(&job).await;
    assert_eq!(done["jobstatus"], 1, "{done}");
    let after = c.cluster(&id).await;
    assert_eq!(after["state"], "Running");
    assert_eq!(after["size"], 5);
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_request_gets_a_jobid_and_fails_inside_the_job() {
    let sim = start_sim(delayed()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();

    // Parameter parsing still answers in the call: an id naming nothing is a 431.
    let bad = c
        .get(
            "scaleKubernetesCluster",
            &[("id", &id), ("nodeids", "not-a-uuid")],
        )
        .await;
    assert_eq!(bad.status, 431, "{}", bad.text);

    // Above cloud.kubernetes.cluster.max.size: refused, but only once the job runs.
    let sent = Instant::now();
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "60")])
        .await;
    assert_eq!(
        job_status(&c, &job).await["jobstatus"],
        0,
        "queued, not refused yet"
    );
    let failed = c.wait_job(&job).await;
    assert!(
        sent.elapsed() >= PICKUP,
        "failed after {:?}",
        sent.elapsed()
    );
    assert_eq!(failed["jobresultcode"], 530, "{failed}");
    let text = failure_text(&failed);
    assert!(text.contains("Maximum cluster size"), "{text}");
    let cl = c.cluster(&id).await;
    assert_eq!(cl["state"], "Running", "a refusal changes nothing");
    assert_eq!(cl["size"], 3);
    assert_eq!(sim.running_jobs(&id), 0);
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_job_validates_against_the_cluster_as_it_is_when_picked_up() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.pickup_delay = PICKUP;
        c.settings.alert_scaling = false;
        c.settings.scanner_interval = Duration::from_secs(60);
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    // Accepted as the cluster is when sent (Running)...
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "4")])
        .await;
    // ...but the status scanner moves it to Alert before a worker picks the job up, and this
    // CloudStack cannot scale in Alert.
    assert!(sim.set_cluster_state(&id, ClusterState::Alert));
    let failed = c.wait_job(&job).await;
    let text = failure_text(&failed);
    assert!(
        text.contains("is in Alert state and can not be scaled"),
        "{text}"
    );
    assert_eq!(sim.cluster_state(&id), Some(ClusterState::Alert));
    assert_eq!(c.cluster(&id).await["size"], 3);
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn two_queued_jobs_on_one_cluster_are_both_accepted_and_the_later_fails() {
    let sim = start_sim(delayed()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let first = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "5")])
        .await;
    elapse(PICKUP / 4).await;
    let second = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "6")])
        .await;
    assert_ne!(first, second);
    // No sync object: both are queued side by side.
    assert_eq!(sim.running_jobs(&id), 2);
    assert_eq!(sim.cluster_state(&id), Some(ClusterState::Running));

    let later = c.wait_job(&second).await;
    let text = failure_text(&later);
    assert!(
        text.contains("is in Scaling state and can not be scaled"),
        "the later job finds the first one's Scaling: {text}"
    );
    assert_eq!(sim.running_jobs(&id), 1, "the first one runs on");
    let earlier = c.wait_job(&first).await;
    assert_eq!(earlier["jobstatus"], 1, "{earlier}");
    let cl = c.cluster(&id).await;
    assert_eq!(cl["size"], 5, "only the first job scaled");
    assert_eq!(cl["state"], "Running");
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_delay_is_configurable_and_zero_keeps_the_answer_after_validation() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.job_duration = Duration::from_millis(400);
        c.settings.scanner_interval = Duration::from_secs(60);
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    assert_eq!(
        sim.settings().pickup_delay,
        Duration::ZERO,
        "off by default"
    );
    // Without a delay the cluster is Scaling when the jobid comes back.
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "4")])
        .await;
    assert_eq!(c.cluster(&id).await["state"], "Scaling");
    assert_eq!(c.wait_job(&job).await["jobstatus"], 1);

    let echoed = c.sim("simConfigure", &[("pickupdelayms", "150")]).await;
    assert_eq!(echoed["pickupdelayms"], 150);
    assert_eq!(sim.settings().pickup_delay, Duration::from_millis(150));
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "5")])
        .await;
    assert_eq!(c.cluster(&id).await["state"], "Running");
    assert_eq!(c.wait_job(&job).await["jobstatus"], 1);
    assert_eq!(c.cluster(&id).await["size"], 5);
    sim.shutdown().await;
}
