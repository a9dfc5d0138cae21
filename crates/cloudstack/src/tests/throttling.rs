//! CloudStack's API throttling seen from the client (a 429 is its own error, sent again with
//! growing waits within the request timeout) and the client's own rate limit (`max_rps`:
//! requests spaced evenly, callers served in order). On paused time: the waits are the test
//! clock's.

use super::*;
use tokio::time::Instant;

const LIMIT_TEXT: &str =
    "The given user has reached his/her account api limit, please retry after [{}] ms.";

/// CloudStack's answer to a call over the account's limit (`ApiRateLimitServiceImpl`,
/// `ApiServer.getSerializedApiError`): HTTP 429, errorcode 429, cserrorcode 9999.
fn throttled(command: &str, retry_after_ms: u64) -> Reply {
    json(
        429,
        error_body(
            command,
            429,
            9999,
            &LIMIT_TEXT.replace("{}", &retry_after_ms.to_string()),
        ),
    )
}

fn one_cluster() -> Reply {
    json(
        200,
        clusters_body(&[realistic_cluster(CLUSTER_ID, "k")], Some(1)),
    )
}

/// When each request reached the server, on the test's clock.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<Instant>>>);

impl Arrivals {
    fn note(&self) -> usize {
        let mut a = self.0.lock().unwrap();
        a.push(Instant::now());
        a.len()
    }

    fn times(&self) -> Vec<Instant> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttled_request_is_sent_again_and_then_succeeds() {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    // The first two tries are over the limit; CloudStack names 100 ms left of its window.
    let cs = MockCs::start(move |p| match seen.note() {
        1 | 2 => throttled(&p["command"], 100),
        _ => one_cluster(),
    })
    .await;
    let cluster = cs.client().get_cluster(CLUSTER_ID).await.unwrap();
    assert_eq!(cluster.map(|c| c.id).as_deref(), Some(CLUSTER_ID));
    let times = arrivals.times();
    assert_eq!(times.len(), 3);
    // Growing waits, each at least what CloudStack named: 250 ms, then 500 ms.
    assert!(times[1] - times[0] >= Duration::from_millis(250));
    assert!(times[2] - times[1] >= Duration::from_millis(500));
    // Each try is signed as a request of its own, and every one was accepted.
    assert!(cs.requests().iter().all(|r| r.signature_ok));
}

#[tokio::test(start_paused = true)]
async fn the_wait_is_at_least_what_is_left_of_cloudstacks_window() {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let cs = MockCs::start(move |p| match seen.note() {
        1 => throttled(&p["command"], 900),
        _ => one_cluster(),
    })
    .await;
    cs.client().get_cluster(CLUSTER_ID).await.unwrap();
    let times = arrivals.times();
    assert!(times[1] - times[0] >= Duration::from_millis(900));
}

#[tokio::test(start_paused = true)]
async fn throttling_that_outlasts_the_timeout_is_throttled_never_unauthorized() {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let cs = MockCs::start(move |p| {
        seen.note();
        throttled(&p["command"], 300)
    })
    .await;
    let mut config = cs.config();
    config.request_timeout = Duration::from_secs(3);
    let client = Client::new(config).unwrap();
    let started = Instant::now();
    let err = client.scale_cluster_size(CLUSTER_ID, 5).await.unwrap_err();
    let took = started.elapsed();
    match &err {
        CsError::Throttled { command, detail } => {
            assert_eq!(command, "scaleKubernetesCluster");
            assert!(detail.contains("account api limit"), "{detail}");
            assert!(detail.contains("errorcode 429"), "{detail}");
        }
        other => panic!("expected Throttled, got {other:?}"),
    }
    assert!(!err.is_not_permitted());
    assert!(err.is_transient());
    assert!(err.to_string().contains("api.throttling"), "{err}");
    // Tried again with growing waits (310 ms, at least the window CloudStack names, then 500
    // and 1000 ms), then as each window ends (the grown 2 s wait would end past the timeout),
    // never past the timeout: at 0, 0.31, 0.81, 1.81, 2.12, 2.43 and 2.74 s.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(arrivals.times().len(), 7, "sent again while time allowed");
    assert_no_secrets(&err, &cs.signatures());
}

#[tokio::test(start_paused = true)]
async fn a_429_page_from_a_proxy_is_an_http_error_sent_once() {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let cs = MockCs::start(move |_| {
        seen.note();
        Reply {
            content_type: "text/html",
            ..json(429, "<html><body>Too Many Requests</body></html>")
        }
    })
    .await;
    let err = cs.client().get_cluster(CLUSTER_ID).await.unwrap_err();
    assert!(
        matches!(
            err,
            CsError::Http {
                http_status: 429,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(arrivals.times().len(), 1);
}

#[test]
fn throttled_tries_are_counted_in_the_request_metrics() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let calls = Arrivals::default();
                let seen = calls.clone();
                let cs = MockCs::start(move |p| match seen.note() {
                    1 | 2 => throttled(&p["command"], 10),
                    _ => one_cluster(),
                })
                .await;
                cs.client().get_cluster(CLUSTER_ID).await.unwrap();
            });
    });
    let page = handle.render();
    let series = |outcome: &str| {
        page.lines()
            .find(|l| {
                l.starts_with("cks_provider_cloudstack_requests_total{")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(series("throttled"), Some(2), "{page}");
    assert_eq!(series("ok"), Some(1), "{page}");
}

#[test]
fn max_rps_must_be_a_positive_rate() {
    for bad in [0.0, -2.0, f64::NAN, f64::INFINITY] {
        let config = test_config("https://cloud.example.com/client/api").with_max_rps(Some(bad));
        assert!(
            matches!(Client::new(config), Err(CsError::Config(m)) if m.contains("max_rps")),
            "{bad}"
        );
    }
    let config = test_config("https://cloud.example.com/client/api").with_max_rps(Some(2.5));
    assert_eq!(Client::new(config).unwrap().max_rps(), Some(2.5));
    assert_eq!(
        Client::new(test_config("https://cloud.example.com/client/api"))
            .unwrap()
            .max_rps(),
        None,
        "no limit unless asked"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_reach_cloudstack_at_most_max_rps_per_second() {
    const RPS: usize = 4;
    const N: usize = 14;
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let cs = MockCs::start(move |_| {
        seen.note();
        one_cluster()
    })
    .await;
    let client = Client::new(cs.config().with_max_rps(Some(RPS as f64))).unwrap();
    let started = Instant::now();
    let calls: Vec<_> = (0..N)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.get_cluster(CLUSTER_ID).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let times = arrivals.times();
    assert_eq!(times.len(), N);
    // However the second is cut, no second holds more than RPS arrivals.
    for (i, t) in times.iter().enumerate() {
        let in_second = times[i..]
            .iter()
            .take_while(|u| **u - *t < Duration::from_secs(1))
            .count();
        assert!(
            in_second <= RPS,
            "{in_second} requests within a second of #{i}"
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(250 * (N as u64 - 1)));
}

#[tokio::test(start_paused = true)]
async fn a_busy_caller_cannot_starve_another() {
    let cs = MockCs::start(|_| one_cluster()).await;
    let client = Client::new(cs.config().with_max_rps(Some(10.0))).unwrap();
    // One caller sends without pause, asking for its next turn as soon as it has sent.
    let busy = client.clone();
    let hog = tokio::spawn(async move {
        loop {
            busy.get_cluster(CLUSTER_ID).await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(550)).await;
    // Another caller asks now: it goes next, at most one turn (100 ms) behind the one
    // already waiting.
    let started = Instant::now();
    client.get_cluster(CLUSTER_ID).await.unwrap();
    assert!(
        started.elapsed() <= Duration::from_millis(200),
        "waited {:?}",
        started.elapsed()
    );
    hog.abort();
}
