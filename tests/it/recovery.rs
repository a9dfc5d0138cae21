//! The provider keeps its snapshots fresh on its own: after a CloudStack outage it recovers
//! without any RPC reaching it (in Kubernetes none would, were it unready), with backoff and
//! jitter while CloudStack is down; it stays ready throughout, the autoscaler hearing
//! UNAVAILABLE naming CloudStack; and under a rate limit a Refresh is answered at once from a
//! snapshot the provider keeps at the limit's pace. On paused tokio time.

use cks_autoscaler_provider::provider::{Caller, Provider, Settings};
use cks_cloudstack::Client;
use cks_sim::SimHandle;
use cks_testkit::{client_config, wait_until_for};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);
/// The autoscaler's deadline for each call (`--cloud-provider-grpc-timeout` default).
const DEADLINE: Duration = Duration::from_secs(5);
/// The autoscaler's loop (`--scan-interval` default).
const LOOP: Duration = Duration::from_secs(10);

/// `clusters` clusters, one group each bound to `autoscaler.cN`, a provider whose CloudStack
/// client sends at most `max_rps` requests a second, and its keeper running.
async fn keeper_fleet(
    clusters: usize,
    max_rps: Option<f64>,
    tweak: impl FnOnce(&mut Settings),
) -> (SimHandle, Provider, Vec<String>) {
    let (sim, ids, settings) = cks_testkit::fleet::fleet_sim(clusters, tweak).await;
    let client = Client::new(client_config(&sim).with_max_rps(max_rps)).expect("client");
    let provider = Provider::new(client, settings);
    let _keeper = provider.spawn_keeper();
    let p = provider.clone();
    wait_until_for("every first snapshot", 600 * S, async || {
        (0..clusters).all(|i| p.all_groups().snapshot_age(&group_id(&p, i)).is_some())
    })
    .await;
    (sim, provider, ids)
}

/// `listKubernetesClusters` calls per cluster id.
fn fetches(sim: &SimHandle) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for r in sim.requests() {
        if r.command == "listKubernetesClusters"
            && let Some(id) = r.params.get("id")
        {
            *by.entry(id.clone()).or_insert(0) += 1;
        }
    }
    by
}

fn group_id(p: &Provider, i: usize) -> String {
    p.all_groups().node_groups()[i].id.clone()
}

#[tokio::test(start_paused = true)]
async fn after_a_cloudstack_outage_the_provider_recovers_without_any_rpc() {
    let bound = 10 * S;
    let (sim, p, ids) = keeper_fleet(4, None, |s| s.staleness_bound = bound).await;
    let caller = Caller::with_identities(vec!["autoscaler.c0".into()]);
    p.seen_by(&caller)
        .refresh_within(Some(Instant::now() + DEADLINE))
        .await
        .expect("CloudStack answers");
    assert!(p.health().healthy() && p.health().ready_for_traffic());

    // CloudStack goes away (a proxy's 503 page for every call) for three staleness bounds.
    sim.configure(|c| c.error_rate = 1.0);
    sim.reset_requests();
    let outage = 3 * bound;
    tokio::time::sleep(outage).await;
    assert!(
        !p.health().healthy(),
        "every snapshot is past the bound, and the rounds fail"
    );
    assert!(
        p.health().ready_for_traffic(),
        "CloudStack down must not take the provider out of its Service's endpoints"
    );
    assert_eq!(
        p.health().stalled(),
        None,
        "CloudStack down is not the provider stuck"
    );
    for i in 0..ids.len() {
        assert!(
            p.all_groups().refresh_failures(&group_id(&p, i)) >= 3,
            "group {i} retried"
        );
    }
    // The autoscaler still reaches the provider and hears why: CloudStack.
    let t0 = Instant::now();
    let e = p
        .seen_by(&caller)
        .refresh_within(Some(t0 + DEADLINE))
        .await
        .expect_err("stale while CloudStack is down");
    let text = e.to_string();
    assert!(
        text.contains("last error"),
        "names CloudStack's error: {text}"
    );
    // Backoff with jitter: at most one call per group per backoff step (the first step 0.5 s,
    // doubling to the cap, 5 s with this bound), and spread across groups.
    let during = fetches(&sim);
    for id in &ids {
        let n = during.get(id).copied().unwrap_or(0);
        assert!(
            (3..=16).contains(&n),
            "cluster {id}: {n} reads in {outage:?} of outage"
        );
    }
    let at: Vec<_> = sim
        .requests()
        .iter()
        .filter(|r| r.command == "listKubernetesClusters")
        .map(|r| r.atms)
        .collect();
    let distinct: std::collections::BTreeSet<_> = at.iter().collect();
    assert!(
        distinct.len() * 2 > at.len(),
        "the retries are spread, not sent together: {} calls at {} instants",
        at.len(),
        distinct.len()
    );

    // CloudStack comes back. No RPC reaches the provider: it is fresh again within the
    // backoff's cap.
    sim.configure(|c| c.error_rate = 0.0);
    let back = Instant::now();
    let p2 = p.clone();
    wait_until_for("fresh snapshots with no RPC", 60 * S, async || {
        p2.health().healthy()
    })
    .await;
    assert!(
        back.elapsed() <= 5 * S + S,
        "recovered {:?} after CloudStack's return",
        back.elapsed()
    );
    for i in 0..ids.len() {
        assert_eq!(p.all_groups().refresh_failures(&group_id(&p, i)), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttled_refresh_answers_at_once_from_snapshots_kept_at_the_pace() {
    // 40 clusters and 4 calls a second: 3.2 rounds a second for refreshes, one read of each
    // cluster every 12.5 s, longer than the autoscalers' 10 s loop.
    let clusters = 40;
    let (sim, p, _ids) = keeper_fleet(clusters, Some(4.0), |_| {}).await;
    sim.reset_requests();
    let start = Instant::now();
    let loops = 8u32;
    let tasks: Vec<_> = (0..clusters)
        .map(|i| {
            let p = p.clone();
            let caller = Caller::with_identities(vec![format!("autoscaler.c{i}")]);
            tokio::spawn(async move {
                let mut took = Vec::new();
                for l in 0..loops {
                    tokio::time::sleep_until(start + LOOP * l).await;
                    let t0 = Instant::now();
                    let r = p.seen_by(&caller).refresh_within(Some(t0 + DEADLINE)).await;
                    took.push((t0.elapsed(), r.map_err(|e| e.to_string())));
                }
                took
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.expect("caller"));
    }
    let mut slow = 0;
    for (took, r) in &answers {
        assert!(r.is_ok(), "{r:?}");
        if *took > Duration::from_millis(100) {
            slow += 1;
        }
    }
    // The first loop comes right after the first snapshots: every later one finds its
    // snapshot kept fresh at the pace and answers at once.
    assert_eq!(
        slow,
        0,
        "{slow} of {} Refreshes waited: {:?}",
        answers.len(),
        answers.iter().map(|a| a.0).max()
    );
    // Kept at the pace, not past it, and no more reads than the rate allows.
    for i in 0..clusters {
        let age = p
            .all_groups()
            .snapshot_age(&group_id(&p, i))
            .expect("snapshot");
        assert!(age <= 25 * S, "cluster {i}'s snapshot is {age:?} old");
    }
    let reads: usize = fetches(&sim).values().sum();
    let secs = start.elapsed().as_secs_f64();
    assert!(
        reads as f64 <= 4.0 * secs + 16.0,
        "{reads} reads in {secs}s at 4 calls a second"
    );
    assert!(
        reads >= clusters * 2,
        "{reads} reads in {secs}s: the provider did not keep the snapshots fresh"
    );
}
