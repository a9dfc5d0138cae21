//! Refresh under many concurrent autoscalers, as a central provider serves them: every caller
//! answered within its deadline, CloudStack asked at most once per cluster per round, no
//! cluster starved by another's callers, and the health of the snapshots saying when the provider cannot
//! refresh. On paused tokio time: the simulator's latency, the deadlines and the snapshot ages
//! all follow the test's clock, so the same interleavings run at any build speed.

use cks_autoscaler_provider::provider::{Caller, Provider, Settings};
use cks_cloudstack::Client;
use cks_sim::SimHandle;
use cks_testkit::client_config;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// The autoscaler's deadline for each call (`--cloud-provider-grpc-timeout` default).
const DEADLINE: Duration = Duration::from_secs(5);
/// The autoscaler's loop (`--scan-interval` default).
const LOOP: Duration = Duration::from_secs(10);

struct Fleet {
    sim: SimHandle,
    provider: Provider,
    /// Group index → cluster id.
    ids: Vec<String>,
    /// The commands the first refresh sent CloudStack (forgotten by the simulator after it).
    first: Vec<String>,
}

/// `clusters` CKS clusters in a simulator answering every call after `latency`, one group
/// each, bound to client `autoscaler.cN`, the provider's default refresh settings, and a first
/// snapshot of each, taken a loop ago.
async fn fleet(clusters: usize, latency: Duration, tweak: impl FnOnce(&mut Settings)) -> Fleet {
    let (sim, ids, settings) = cks_testkit::fleet::fleet_sim(clusters, tweak).await;
    // CloudStack slower than the deadline must not make the provider's own request fail.
    let client =
        Client::new(client_config(&sim).with_timeout(Duration::from_secs(300))).expect("client");
    let provider = Provider::new(client, settings);
    provider.refresh().await.expect("first refresh");
    sim.configure(|c| c.latency = latency);
    let first = sim.requests().into_iter().map(|r| r.command).collect();
    sim.reset_requests();
    // A loop later: the first loop's Refresh finds the snapshot older than the refresh interval.
    tokio::time::advance(LOOP).await;
    Fleet {
        sim,
        provider,
        ids,
        first,
    }
}

impl Fleet {
    /// `listKubernetesClusters` calls per cluster id since the fleet started.
    fn fetches(&self) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for r in self.sim.requests() {
            if r.command == "listKubernetesClusters"
                && let Some(id) = r.params.get("id")
            {
                *by.entry(id.clone()).or_insert(0) += 1;
            }
        }
        by
    }
}

/// One caller's answer: how long it took on the test's clock, and whether it was OK.
type Answer = (Duration, Result<(), String>);

/// `callers` autoscalers (caller `i` serves cluster `i % clusters`), each calling Refresh at
/// the start of every loop for `loops` loops, all at once.
async fn run_loops(f: &Fleet, callers: usize, loops: u32) -> Vec<Answer> {
    let clusters = f.ids.len();
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let p = f.provider.clone();
            let caller = Caller::with_identities(vec![format!("autoscaler.c{}", i % clusters)]);
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for l in 0..loops {
                    tokio::time::sleep_until(start + LOOP * l).await;
                    let t0 = Instant::now();
                    let r = p
                        .seen_by(&caller)
                        .refresh_within(Some(t0 + DEADLINE))
                        .await
                        .map_err(|e| e.to_string());
                    answers.push((t0.elapsed(), r));
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("caller task"));
    }
    all
}

/// Every caller answered OK before its deadline, every cluster asked at most once per loop
/// and refreshed in most loops (none starved, no stall), and the provider healthy at the end.
async fn check(callers: usize, clusters: usize, latency: Duration) {
    let loops = 20;
    let f = fleet(clusters, latency, |_| {}).await;
    let answers = run_loops(&f, callers, loops).await;
    let what = format!("{callers} callers, {clusters} clusters, CloudStack latency {latency:?}");
    assert_eq!(answers.len(), callers * loops as usize, "{what}");
    for (took, r) in &answers {
        assert!(*took < DEADLINE, "{what}: a Refresh took {took:?}");
        assert!(r.is_ok(), "{what}: {r:?}");
    }
    let fetches = f.fetches();
    // A round takes `latency`; the rounds of all clusters share the provider's permits, so a
    // round may outlast a loop when CloudStack is slow: then the next loop joins it.
    let rounds_per_loop = (clusters as f64 / f.provider.settings().refresh_concurrency as f64)
        .ceil()
        .max(1.0);
    // A snapshot counts from when it is installed: the next round starts at the first loop
    // at least the refresh interval after that.
    let round_span = latency.as_secs_f64() * rounds_per_loop;
    let min_interval = f.provider.settings().refresh_min_interval.as_secs_f64();
    let period = ((round_span + min_interval) / LOOP.as_secs_f64())
        .ceil()
        .max(1.0);
    let fewest = (f64::from(loops) / period) as usize - 1;
    for id in &f.ids {
        let n = fetches.get(id).copied().unwrap_or(0);
        assert!(
            n <= loops as usize,
            "{what}: cluster {id} fetched {n} times in {loops} loops"
        );
        assert!(
            n >= fewest,
            "{what}: cluster {id} fetched {n} times in {loops} loops, expected at least {fewest}"
        );
    }
    assert!(
        f.provider.health().healthy(),
        "{what}: not healthy at the end"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_refreshes_of_one_cluster_are_answered_in_time_from_one_round() {
    for callers in [2, 4, 10, 100] {
        for latency_ms in [0, 300, 2_000, 4_500, 8_000] {
            check(callers, 1, Duration::from_millis(latency_ms)).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_refreshes_of_many_clusters_are_answered_in_time_and_none_starves() {
    for (callers, clusters) in [(2, 2), (4, 4), (10, 10), (100, 50)] {
        for latency_ms in [0, 300, 2_000, 8_000] {
            check(callers, clusters, Duration::from_millis(latency_ms)).await;
        }
    }
}

/// The reported stall: four autoscalers calling Refresh at once while CloudStack answers in
/// 300 ms left the provider spinning, with no CloudStack call, for good.
#[tokio::test(start_paused = true)]
async fn four_callers_and_a_300ms_cloudstack_keep_every_snapshot_fresh() {
    let f = fleet(4, Duration::from_millis(300), |_| {}).await;
    run_loops(&f, 4, 30).await;
    for id in &f.ids {
        let age = f.provider.all_groups().snapshot_age(id).expect("snapshot");
        assert!(age < LOOP, "cluster {id}'s snapshot is {age:?} old");
    }
    assert_eq!(f.fetches().values().sum::<usize>(), 4 * 30);
}

#[tokio::test(start_paused = true)]
async fn clusters_are_served_in_the_order_they_asked() {
    // Two permits, six clusters, each round 1 s: a caller of the last cluster to ask waits for
    // the rounds before it, never for later ones.
    let f = fleet(6, Duration::from_secs(1), |s| s.refresh_concurrency = 2).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let p = f.provider.clone();
        tasks.push(tokio::spawn(async move {
            let caller = Caller::with_identities(vec![format!("autoscaler.c{i}")]);
            p.seen_by(&caller)
                .refresh_within(None)
                .await
                .expect("refresh");
            start.elapsed()
        }));
        // Each asks a moment after the one before.
        tokio::task::yield_now().await;
    }
    let mut took = Vec::new();
    for t in tasks {
        took.push(t.await.expect("task"));
    }
    for (i, t) in took.iter().enumerate() {
        let turn = (i / 2 + 1) as u64;
        assert_eq!(
            t.as_secs(),
            turn,
            "cluster {i} answered after {t:?}: {took:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_group_is_reported_stale_while_a_requested_refresh_does_not_come_and_recovers_after() {
    let f = fleet(2, Duration::ZERO, |s| {
        s.staleness_bound = Duration::from_secs(60);
    })
    .await;
    let caller = Caller::with_identities(vec!["autoscaler.c0".into()]);
    // Nobody asks: old snapshots are not a fault of the provider's.
    tokio::time::advance(Duration::from_secs(120)).await;
    assert!(f.provider.health().healthy(), "no autoscaler asked");
    assert!(!f.provider.all_groups().snapshot_stale(&f.ids[0]));

    // CloudStack stops answering in time (its answer takes over 3 minutes): the autoscaler's
    // Refresh cannot be served and the snapshot is past the bound.
    f.sim.configure(|c| c.latency = Duration::from_secs(200));
    let t0 = Instant::now();
    let e = f
        .provider
        .seen_by(&caller)
        .refresh_within(Some(t0 + DEADLINE))
        .await
        .expect_err("stale");
    assert!(t0.elapsed() < DEADLINE);
    assert!(e.to_string().contains("has not answered"), "{e}");
    assert!(
        !f.provider.health().healthy(),
        "a requested refresh did not come"
    );
    assert!(f.provider.all_groups().snapshot_stale(&f.ids[0]));
    assert!(
        !f.provider.all_groups().snapshot_stale(&f.ids[1]),
        "the other cluster was not asked for"
    );

    // CloudStack's answer arrives: healthy again, without another Refresh.
    wait_until_healthy(&f.provider).await;
    assert!(!f.provider.all_groups().snapshot_stale(&f.ids[0]));
}

async fn wait_until_healthy(p: &Provider) {
    let p = p.clone();
    wait_until_for_long("the provider to be healthy again", async || {
        p.health().healthy()
    })
    .await;
}

/// [`cks_testkit::wait_until`] over the minutes CloudStack takes in these tests.
async fn wait_until_for_long(what: &str, cond: impl AsyncFnMut() -> bool) {
    cks_testkit::wait_until_for(what, Duration::from_secs(900), cond).await
}

#[tokio::test(start_paused = true)]
async fn one_offering_is_read_once_for_every_cluster_of_it() {
    let f = fleet(20, Duration::ZERO, |_| {}).await;
    let offering_reads = |commands: Vec<String>| {
        commands
            .iter()
            .filter(|c| *c == "listServiceOfferings")
            .count()
    };
    assert_eq!(
        offering_reads(f.first.clone()),
        1,
        "the first refresh of 20 clusters"
    );
    run_loops(&f, 20, 3).await;
    let later = f.sim.requests().into_iter().map(|r| r.command).collect();
    assert_eq!(offering_reads(later), 0, "later rounds");
    for id in &f.ids {
        assert!(
            f.provider.all_groups().worker_offering(id).is_some(),
            "{id}"
        );
    }
}
