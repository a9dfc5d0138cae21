//! The shell against the in-process simulator on paused tokio time: the provider's deadlines,
//! poll intervals and snapshot ages follow the clock the test controls, so a CloudStack job of
//! many minutes is followed to its end in milliseconds of real time.

use super::{Call, Caller};
use super::{Error, Provider, Settings};
use crate::config::BoundNodeGroup;
use crate::config::{ClusterRef, NodeGroupSpec};
use cks_cloudstack::Client;
use cks_domain::machine::{Phase, ScaleError};
use cks_sim::{ClusterSpec, Scenario, SimHandle};
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
    let (_, g) = p.all_groups().group(id).expect("group");
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
        .scale(&id, Call::Increase { delta: 2, deadline })
        .await
        .expect("accepted");
    assert_eq!(p.all_groups().target_size(&id).expect("target"), 5);
    assert!(matches!(phase(&p, &id), Phase::Running { .. }));
    // A second request while the job runs is queued, not sent.
    p.all_groups()
        .scale(
            &id,
            Call::Increase {
                delta: 1,
                deadline: Instant::now() + Duration::from_secs(5),
            },
        )
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
    let err = gone
        .cluster(0)
        .fetch_and_act()
        .await
        .expect_err("not listed");
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
        .scale(
            &id,
            Call::Increase {
                delta: 8,
                deadline: Instant::now() + Duration::from_secs(5),
            },
        )
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
    let err = twice.cluster(1).fetch_and_act().await.expect_err("refused");
    assert!(
        matches!(&err, Error::DuplicateCluster { id: dup, .. } if *dup == id),
        "{err}"
    );
    assert!(err.to_string().contains("serves already"), "{err}");
    twice
        .cluster(0)
        .fetch_and_act()
        .await
        .expect("the group by id is served");
    assert_eq!(twice.all_groups().node_groups().len(), 1);
}

/// How long a read may take, in real time, before it is taken for one waiting for the lock a
/// writer holds: a bound on a wait, reached only when the read never answers.
const NO_WAIT: Duration = Duration::from_secs(10);

/// No read takes a group's state lock: while a writer holds it (another thread), every read
/// RPC answers, and so does each of the operator's reads the metrics make. A write waits for
/// the lock, and the read after it sees what it wrote. On worker threads, as the provider
/// runs: the write NodeGroupForNode waits for is the group's loop's, and the loop's task
/// waits for the lock on a worker thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_answers_while_a_writer_holds_the_groups_state() {
    let (_sim, p, id) = stack(Duration::from_secs(1)).await;
    let (_, g) = p.all_groups().group(&id).expect("group");
    let snapshot = p.all_groups().snapshot(&id).expect("snapshot");
    let worker = snapshot.workers().next().expect("a worker").clone();
    let default_id = cks_domain::nodeid::default_provider_id(&worker.id);
    let own_id = format!("cloudstack://{}", worker.id);
    let runtime = tokio::runtime::Handle::current();
    let none = std::collections::HashMap::new();
    let (p, id, worker, none) = (&p, &id, &worker, &none);
    let (default_id, own_id, runtime) = (&default_id, &own_id, &runtime);
    std::thread::scope(|s| {
        let (held, is_held) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        s.spawn(move || {
            let _writer = g.lock();
            held.send(()).expect("test waits");
            let _ = released.recv();
        });
        is_held.recv().expect("the writer holds the lock");

        let (answered, answers) = std::sync::mpsc::channel();
        s.spawn(move || {
            // In the runtime, as the provider's own threads are: its clock, its tasks.
            let _time = runtime.enter();
            let all = p.all_groups();
            let deadline = Instant::now() + Duration::from_secs(5);
            let reads = (
                all.node_groups().len(),
                runtime
                    .block_on(all.node_group_for_node(
                        default_id,
                        &worker.name,
                        none,
                        none,
                        deadline,
                    ))
                    .map(|v| v.id),
                all.target_size(id).ok(),
                all.nodes(id).map(|n| n.len()).ok(),
                all.has_group(id).is_ok(),
                runtime.block_on(all.refresh_within(Some(deadline))).is_ok(),
                (
                    runtime.block_on(all.first_snapshots(deadline)),
                    p.health().healthy(),
                    p.all_groups().snapshot_age(id).is_some(),
                    p.all_groups().snapshot_stale(id),
                    p.all_groups().cluster_blocked(id).is_none(),
                    p.all_groups().worker_offering(id).is_some(),
                    p.all_groups().sample_labels(id).is_none(),
                ),
            );
            let _ = answered.send(reads);
        });
        let reads = answers.recv_timeout(NO_WAIT);

        // NodeGroupForNode of a node carrying its own providerID changes the state: it waits.
        let (learned, learning) = std::sync::mpsc::channel();
        s.spawn(move || {
            let _time = runtime.enter();
            let deadline = Instant::now() + NO_WAIT;
            let group = runtime.block_on(p.all_groups().node_group_for_node(
                own_id,
                &worker.name,
                none,
                none,
                deadline,
            ));
            let _ = learned.send(group.map(|v| v.id));
        });
        let waited = learning.try_recv().is_err();
        release.send(()).expect("the writer waits for it");
        assert_eq!(
            reads,
            Ok((
                1,
                Some(id.clone()),
                Some(3),
                Some(3),
                true,
                true,
                ((), true, true, false, true, true, true)
            )),
            "every read answers while the state is locked"
        );
        assert!(waited, "a write waits for the lock");
        assert_eq!(learning.recv_timeout(NO_WAIT), Ok(Some(id.clone())));
    });
    // The write returned: the next read sees it.
    let nodes = p.all_groups().nodes(id).expect("nodes");
    assert!(
        nodes.iter().any(|i| i.id == *own_id),
        "the learned providerID is the instance's id: {nodes:?}"
    );
}

/// What NodeGroupForNode teaches a group and Cleanup are made by the group's loop, beside what
/// it has under way: while the loop waits for a job poll CloudStack takes 30 s to answer, a
/// node carrying its own providerID is answered at once, and the instance is reported under
/// that id by the next NodeGroupNodes; Cleanup returns at once, with the job let go.
#[tokio::test(start_paused = true)]
async fn a_lesson_and_cleanup_do_not_wait_for_the_loops_slow_poll() {
    let (sim, p, id) = stack(Duration::from_secs(600)).await;
    p.all_groups()
        .scale(
            &id,
            Call::Increase {
                delta: 1,
                deadline: Instant::now() + Duration::from_secs(5),
            },
        )
        .await
        .expect("accepted");
    assert!(matches!(phase(&p, &id), Phase::Running { .. }));
    let polls = || {
        sim.requests()
            .iter()
            .filter(|r| r.command == "queryAsyncJobResult")
            .count()
    };
    let before = polls();
    sim.configure(|s| {
        s.command_latency = Some(("queryAsyncJobResult".into(), Duration::from_secs(30)));
    });
    advance_until(
        Duration::from_secs(120),
        || polls() > before,
        || "the loop never polled the job".into(),
    )
    .await;

    let worker = p
        .all_groups()
        .snapshot(&id)
        .expect("snapshot")
        .workers()
        .next()
        .expect("a worker")
        .clone();
    let own_id = format!("cloudstack://{}", worker.id);
    let none = std::collections::HashMap::new();
    let soon = Duration::from_secs(1);
    let group = tokio::time::timeout(
        soon,
        p.all_groups().node_group_for_node(
            &own_id,
            &worker.name,
            &none,
            &none,
            Instant::now() + Duration::from_secs(5),
        ),
    )
    .await;
    assert_eq!(group.map(|g| g.map(|v| v.id)), Ok(Some(id.clone())));
    let nodes = p.all_groups().nodes(&id).expect("nodes");
    assert!(
        nodes.iter().any(|i| i.id == own_id),
        "reported under the node's own providerID: {nodes:?}"
    );

    let cleaned = tokio::time::timeout(soon, p.all_groups().cleanup()).await;
    assert!(matches!(cleaned, Ok(Ok(()))), "{cleaned:?}");
    assert_eq!(phase(&p, &id), Phase::Idle, "the job let go");
    assert_eq!(polls(), before + 1, "the slow poll was still unanswered");
}

/// Recording where a caller runs (`caller::Whereabouts`) waits only for the same caller's
/// calls: while one autoscaler's sightings are held, another's NodeGroupForNode answers.
#[tokio::test(start_paused = true)]
async fn one_callers_sightings_never_hold_up_anothers_node_group_for_node() {
    let sim = start_sim(sim_config_with(|c| {
        c.scenario = Scenario {
            clusters: vec![
                ClusterSpec::new("alpha", 1, 2),
                ClusterSpec::new("beta", 1, 2),
            ],
            ..Scenario::empty()
        };
    }))
    .await;
    let cluster = |name: &str| sim.cluster_id(name).expect("cluster");
    let bound = |name: &str| BoundNodeGroup {
        group: NodeGroupSpec {
            min: 1,
            max: 10,
            cluster: ClusterRef::Id(cluster(name)),
        },
        client: Some(format!("autoscaler.{name}")),
    };
    let client = Client::new(client_config(&sim)).expect("client");
    let p = Provider::new(
        client,
        Settings::with_bound_groups(vec![bound("alpha"), bound("beta")]),
    );
    p.refresh().await.expect("first refresh");
    let caller = |name: &str| Caller::with_identities(vec![format!("autoscaler.{name}")]);
    let (alpha, beta) = (caller("alpha"), caller("beta"));
    let none = std::collections::HashMap::new();
    let group_of_its_node = async |c: &Caller, name: &str| {
        let snapshot = p.all_groups().snapshot(&cluster(name)).expect("snapshot");
        let vm = snapshot.workers().next().expect("a worker");
        p.seen_by(c)
            .node_group_for_node(
                &cks_domain::nodeid::default_provider_id(&vm.id),
                &vm.name,
                &none,
                &none,
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .map(|v| v.id)
    };
    // Each reported a node once, so each has its sightings.
    assert_eq!(
        group_of_its_node(&alpha, "alpha").await,
        Some(cluster("alpha"))
    );
    assert_eq!(
        group_of_its_node(&beta, "beta").await,
        Some(cluster("beta"))
    );
    let runtime = tokio::runtime::Handle::current();
    let (answered, answer) = std::sync::mpsc::channel();
    let (runtime, beta, group_of_its_node) = (&runtime, &beta, &group_of_its_node);
    std::thread::scope(|s| {
        let beta_answer = p
            .inner
            .whereabouts
            .holding(alpha.identities(), || {
                s.spawn(move || {
                    let _time = runtime.enter();
                    let _ = answered.send(runtime.block_on(group_of_its_node(beta, "beta")));
                });
                answer.recv_timeout(NO_WAIT)
            })
            .expect("alpha has sightings");
        assert_eq!(beta_answer, Ok(Some(cluster("beta"))));
    });
}
