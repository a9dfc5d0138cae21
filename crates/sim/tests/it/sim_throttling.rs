//! CloudStack's API throttling (`api.throttling.*`, the rate-limit plugin): off by default; on,
//! an account's calls past `throttlingmax` in a window opened by its first call are answered
//! 429 before the command runs, until the window ends. Set by configuration (as the flags do)
//! and by `simConfigure`.

use std::time::Duration;

use cks_testkit::cs::*;
use cks_testkit::{elapse, sim_config, sim_config_with, start_sim};

const LIMIT_TEXT: &str =
    "The given user has reached his/her account api limit, please retry after [";

#[tokio::test(start_paused = true)]
async fn off_by_default_every_call_is_answered() {
    let sim = start_sim(sim_config()).await;
    assert!(!sim.settings().throttling);
    let c = Client::new(&sim);
    for _ in 0..40 {
        assert_eq!(c.get("listZones", &[]).await.status, 200);
    }
    assert!(sim.throttled().is_empty());
}

#[tokio::test(start_paused = true)]
async fn calls_past_the_limit_get_cloudstacks_429_and_run_nothing() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let echo = c
        .sim(
            "simConfigure",
            &[
                ("throttling", "on"),
                ("throttlingmax", "2"),
                ("throttlingintervalms", "1000"),
            ],
        )
        .await;
    assert_eq!(echo["throttling"], "on");
    assert_eq!(echo["throttlingmax"], 2);
    let id = sim.cluster_ids()[0].clone();
    assert_eq!(c.get("listZones", &[]).await.status, 200);
    elapse(Duration::from_millis(300)).await;
    assert_eq!(c.get("listKubernetesClusters", &[]).await.status, 200);

    // The third call of the window: refused before the command runs.
    let a = c
        .get("scaleKubernetesCluster", &[("id", &id), ("size", "5")])
        .await;
    assert_eq!(a.status, 429, "{}", a.text);
    let inner = &a.json()["scalekubernetesclusterresponse"];
    assert_eq!(inner["errorcode"], 429);
    assert_eq!(inner["cserrorcode"], 9999);
    assert_eq!(inner["uuidList"], serde_json::json!([]));
    // The window opened 300 ms ago (and a little more: the clock may move while requests
    // travel) and lasts 1 s: the text names what is left of it.
    let text = inner["errortext"].as_str().unwrap_or_default();
    let left: u64 = text
        .strip_prefix(LIMIT_TEXT)
        .and_then(|t| t.strip_suffix("] ms."))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not CloudStack's text: {text}"));
    assert!((1..=700).contains(&left), "{text}");
    assert_eq!(sim.running_jobs(&id), 0, "no job was queued");
    assert_eq!(sim.cluster_json(&id)["size"], 3);
    assert_eq!(sim.throttled(), vec!["scaleKubernetesCluster"]);
    // The request reached CloudStack, so it is in the request log.
    assert_eq!(sim.requests().len(), 3);

    // Simulator-only commands are not counted.
    assert_eq!(c.sim("simRequests", &[]).await["count"], 3);

    // Past the window the same request goes through.
    elapse(Duration::from_millis(701)).await;
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "5")])
        .await;
    // Polling it is more calls than the limit allows: off again to watch it end.
    assert_eq!(
        c.sim("simConfigure", &[("throttling", "off")]).await["throttling"],
        "off"
    );
    let job = c.wait_job(&job).await;
    assert_eq!(job["jobstatus"], 1, "{job}");
    assert_eq!(sim.cluster_json(&id)["size"], 5);
}

#[tokio::test(start_paused = true)]
async fn refused_calls_count_and_the_window_does_not_slide() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.throttling = true;
        c.settings.throttling_max = 1;
        c.settings.throttling_interval = Duration::from_secs(5);
    }))
    .await;
    let c = Client::new(&sim);
    assert_eq!(c.get("listZones", &[]).await.status, 200);
    // Refused calls all through the window: it still ends 5 s after its first call.
    for _ in 0..4 {
        elapse(Duration::from_secs(1)).await;
        assert_eq!(c.get("listZones", &[]).await.status, 429);
    }
    elapse(Duration::from_millis(1001)).await;
    assert_eq!(c.get("listZones", &[]).await.status, 200);
    assert_eq!(c.get("listZones", &[]).await.status, 429);
    assert_eq!(sim.throttled().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_key_is_refused_before_it_is_counted() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.throttling = true;
        c.settings.throttling_max = 1;
    }))
    .await;
    let stranger = Client::with_keys(&sim, "not-the-key", "not-the-secret");
    for _ in 0..3 {
        assert_eq!(stranger.get("listZones", &[]).await.status, 401);
    }
    // The account's one call of the window is still there.
    let c = Client::new(&sim);
    assert_eq!(c.get("listZones", &[]).await.status, 200);
    assert_eq!(c.get("listZones", &[]).await.status, 429);
}

#[tokio::test(start_paused = true)]
async fn a_bad_signature_is_counted_as_cloudstack_counts_it() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.throttling = true;
        c.settings.throttling_max = 1;
    }))
    .await;
    // The right key with a wrong secret: `verifyRequest` runs the checkers before it compares
    // the signature.
    let wrong_secret = Client::with_keys(&sim, &sim.api_key, "not-the-secret");
    assert_eq!(wrong_secret.get("listZones", &[]).await.status, 401);
    assert_eq!(wrong_secret.get("listZones", &[]).await.status, 429);
    let c = Client::new(&sim);
    assert_eq!(c.get("listZones", &[]).await.status, 429);
}
