//! The shell against the in-process simulator on paused tokio time: the provider's deadlines,
//! poll intervals and snapshot ages follow the clock the test controls, so a CloudStack job of
//! many minutes is followed to its end in milliseconds of real time.

use super::{Error, Provider, Settings};
use crate::config::{ClusterRef, NodeGroupSpec};
use cks_cloudstack::Client;
use cks_domain::machine::{Phase, ScaleError};
use cks_sim::SimHandle;
use cks_testkit::{client_config, sim_config_with, start_sim};
use std::time::Duration;
use tokio::time::Instant;

/// A simulator whose scale jobs take `job_duration`, and a provider with default settings
/// (2 s job polls) for its demo cluster.
async fn stack(job_duration: Duration) -> (SimHandle, Provider, String) {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.job_duration = job_duration;
        c.settings.scale_timeout = Duration::from_secs(3600);
    }))
    .await;
    let id = sim.cluster_id("demo").expect("demo cluster");
    let client = Client::new(client_config(&sim)).expect("client");
    let settings = Settings::with_groups(vec![NodeGroupSpec {
        min: 1,
        max: 10,
        cluster: ClusterRef::Id(id.clone()),
    }]);
    let provider = Provider::new(client, settings);
    provider.refresh().await.expect("first refresh");
    (sim, provider, id)
}

fn phase(p: &Provider, id: &str) -> Phase {
    let (_, g) = p.group(id).expect("group");
    g.read().scale.phase().clone()
}

/// Advances tokio's paused clock a second at a time until `done`, at most `limit`.
async fn advance_until(
    limit: Duration,
    mut done: impl FnMut() -> bool,
    what: impl Fn() -> String,
) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "not done after {limit:?} of tokio time: {}",
            what()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_ten_minute_scale_job_is_followed_to_its_end_on_the_tests_clock() {
    let (sim, p, id) = stack(Duration::from_secs(600)).await;
    assert_eq!(p.all_groups().target_size(&id).expect("target"), 3);
    let deadline = Instant::now() + Duration::from_secs(5);
    p.all_groups()
        .increase_size(&id, 2, deadline)
        .await
        .expect("accepted");
    assert_eq!(p.all_groups().target_size(&id).expect("target"), 5);
    assert!(matches!(phase(&p, &id), Phase::Running { .. }));
    // A second request while the job runs is queued, not sent.
    p.all_groups()
        .increase_size(&id, 1, Instant::now() + Duration::from_secs(5))
        .await
        .expect("queued");
    assert_eq!(p.all_groups().target_size(&id).expect("target"), 6);
    let took = advance_until(
        Duration::from_secs(3600),
        || sim.cluster_json(&id)["size"] == 6 && phase(&p, &id) == Phase::Idle,
        || {
            format!(
                "cluster {} phase {:?}",
                sim.cluster_json(&id),
                phase(&p, &id)
            )
        },
    )
    .await;
    assert!(
        took >= Duration::from_secs(600),
        "the job took its ten minutes of the test's clock ({took:?})"
    );
    let scale_requests: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.command == "scaleKubernetesCluster")
        .map(|r| r.params.get("size").cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        scale_requests,
        ["5", "6"],
        "one job at a time, the queued one merged"
    );
    p.refresh().await.expect("refresh");
    assert_eq!(p.all_groups().target_size(&id).expect("target"), 6);
}

/// CloudStack answers a lookup by the id of a cluster that no longer exists with error 431
/// ("entity does not exist"), as the simulator does.
#[tokio::test(start_paused = true)]
async fn a_deleted_cluster_is_not_found_not_a_transient_failure() {
    let (sim, _, _) = stack(Duration::from_secs(1)).await;
    let client = Client::new(client_config(&sim)).expect("client");
    let gone = Provider::new(
        client,
        Settings::with_groups(vec![NodeGroupSpec {
            min: 1,
            max: 10,
            cluster: ClusterRef::Id("00000000-0000-0000-0000-000000000000".into()),
        }]),
    );
    let err = gone.fetch_and_act(0).await.expect_err("not listed");
    assert!(matches!(err, Error::ClusterNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("not listed"), "{err}");
    let err = gone.refresh().await.expect_err("no snapshot");
    assert!(err.to_string().contains("not listed"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_increase_changes_nothing() {
    let (sim, p, id) = stack(Duration::from_secs(1)).await;
    let err = p
        .all_groups()
        .increase_size(&id, 8, Instant::now() + Duration::from_secs(5))
        .await
        .expect_err("past the maximum");
    assert!(
        matches!(
            err,
            Error::Scale {
                source: ScaleError::OutOfRange { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(p.all_groups().target_size(&id).expect("target"), 3);
    assert_eq!(phase(&p, &id), Phase::Idle);
    assert!(
        sim.requests()
            .iter()
            .all(|r| r.command != "scaleKubernetesCluster")
    );
}

/// One cluster named by id in one `--nodes` entry and by name in another: the name resolves to
/// a cluster another group serves, and that group is refused (two groups would scale one
/// cluster, each taking the other's nodes for its own).
#[tokio::test(start_paused = true)]
async fn a_cluster_named_by_id_and_by_name_is_served_once() {
    let (sim, _, id) = stack(Duration::from_secs(1)).await;
    let client = Client::new(client_config(&sim)).expect("client");
    let twice = Provider::new(
        client,
        Settings::with_groups(vec![
            NodeGroupSpec {
                min: 1,
                max: 10,
                cluster: ClusterRef::Id(id.clone()),
            },
            NodeGroupSpec {
                min: 1,
                max: 10,
                cluster: ClusterRef::Name("demo".into()),
            },
        ]),
    );
    let err = twice.fetch_and_act(1).await.expect_err("refused");
    assert!(
        matches!(&err, Error::DuplicateCluster { id: dup, .. } if *dup == id),
        "{err}"
    );
    assert!(err.to_string().contains("serves already"), "{err}");
    twice
        .fetch_and_act(0)
        .await
        .expect("the group by id is served");
    assert_eq!(twice.all_groups().node_groups().len(), 1);
}
