//! Secrets never reach the output: a full scenario (refresh, scale up, a refused request,
//! CloudStack errors and garbage, scale down, a bad key) runs with every log at TRACE level
//! captured, and the API key, the secret key and any signature are searched for in it.

use cks_cloudstack::{Client, ClientConfig};
use cks_domain::status::InstanceState;
use cks_sim::SimConfig;
use cks_testkit::*;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECRET: &str = "S3cretKey-Zq9xWv7Lp2Mn8Bt4Rk6Jh1";
const API: &str = "ApiKey-Hy5Gt3Fr1De9Sw7Aq2Zx8Cv4";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// On a current-thread runtime, so every task of the scenario (simulator, provider, clients)
/// logs on this thread, to this test's own subscriber: the test binary's global one (shared by
/// other tests, not at TRACE) never sees these lines, nor does this one see theirs.
#[tokio::test(flavor = "current_thread")]
async fn no_secret_in_any_output_at_trace_level() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _scoped = tracing::subscriber::set_default(subscriber);

    let mut cfg = SimConfig::for_tests(API, SECRET);
    cfg.settings.job_duration = Duration::from_millis(100);
    let mut env = Stack::refreshed(cfg, "demo", |_| {}).await;
    env.increase(1).await.expect("scale up");
    wait_until("scale-up", || {
        let s = env.sim.cluster_json(&env.cluster_id);
        async move { s["size"] == 4 && s["state"] == "Running" }
    })
    .await;
    let _ = env.increase(100).await.unwrap_err();
    env.sim.configure(|s| s.error_rate = 1.0);
    let _ = env.refresh().await;
    env.sim.configure(|s| {
        s.error_rate = 0.0;
        s.malformed_rate = 1.0;
    });
    let _ = env.refresh().await;
    env.sim.configure(|s| s.malformed_rate = 0.0);
    wait_until("provider idle", || {
        let p = env.provider.clone();
        let id = env.cluster_id.clone();
        // Four instances, none still Creating: the follower has seen the job end.
        async move {
            p.all_groups()
                .nodes(&id)
                .is_ok_and(|n| n.len() == 4 && n.iter().all(|i| i.state == InstanceState::Running))
        }
    })
    .await;
    env.refresh().await.expect("refresh");
    let (wid, wname, _) = env.workers()[0].clone();
    env.delete(vec![node(&format!("external-cloudstack://{wid}"), &wname)])
        .await
        .expect("scale down");
    // A client with a wrong secret: CloudStack refuses it; the error must not echo keys.
    let mut bad = client_config(&env.sim);
    bad.secret_key = "WrongSecret-Qa1Ws2Ed3Rf4Tg5Yh6".into();
    let c = Client::new(bad.clone()).expect("client");
    let err = c.get_cluster(&env.cluster_id).await.unwrap_err();
    tracing::error!("refused: {err} / {err:?}");
    tracing::info!("client config: {:?}", bad);
    let good: ClientConfig = client_config(&env.sim);
    tracing::info!("client: {:?}", Client::new(good).expect("client"));
    env.shutdown().await;

    let out =
        String::from_utf8_lossy(&capture.0.lock().unwrap_or_else(|p| p.into_inner())).to_string();
    assert!(
        out.len() > 1000,
        "the scenario produced logs ({} bytes)",
        out.len()
    );
    assert!(
        out.contains("scaleKubernetesCluster") || out.contains("scale"),
        "logs cover the scale path"
    );
    for needle in [SECRET, API, "WrongSecret-Qa1Ws2Ed3Rf4Tg5Yh6", "signature="] {
        assert!(
            !out.contains(needle),
            "{needle:?} appears in the output:\n{}",
            out.lines()
                .filter(|l| l.contains(needle))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // URL-encoded forms too.
    let enc = SECRET.replace('-', "%2D");
    assert!(!out.contains(&enc));
}
